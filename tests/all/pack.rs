//! The packers on their own: TVM's C text and LLVM object against TVM's `devc.c` and `devc.o`,
//! the fast C form, system-lib registration through every route, and cross objects.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use mblob::pack::{c, BlobSource, CStyle, PackOptions};
use mblob_runtime::Layout;
use object::{Object, ObjectSection, ObjectSymbol};

use crate::goldens::{goldens, read};

/// Every golden blob with its layout (from the directory: 0.21 and 0.27 have their own).
fn golden_blobs() -> Vec<(PathBuf, Layout)> {
    let mut v = Vec::new();
    for (sub, layout) in [
        ("", Layout::Classic),
        ("device", Layout::Classic),
        ("device/tvm-0.21.0", Layout::Classic021),
        ("device/tvm-0.27.0.post1", Layout::Ffi),
        ("other_versions/tvm-0.19.0", Layout::Classic),
        ("other_versions/tvm-0.21.0", Layout::Classic021),
        ("other_versions/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        let mut blobs: Vec<PathBuf> = std::fs::read_dir(goldens().join(sub))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "blob"))
            .collect();
        blobs.sort();
        v.extend(blobs.into_iter().map(|p| (p, layout)));
    }
    assert!(v.len() >= 20, "only {} golden blobs", v.len());
    v
}

/// `NAME.blob` -> `NAME.<suffix>`.
fn sibling(blob: &Path, suffix: &str) -> PathBuf {
    let name = blob.file_name().unwrap().to_string_lossy();
    blob.with_file_name(format!("{}.{suffix}", name.trim_end_matches(".blob")))
}

/// A blob of `len` bytes that is not all one value (an 8-byte header, then a pattern).
fn pattern(len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    if len >= 8 {
        v[..8].copy_from_slice(&(len as u64 - 8).to_le_bytes());
    }
    v
}

/// The defined symbol `name` of an object: (section name, section alignment, size, kind, global,
/// bytes).
fn symbol_of(obj: &[u8], name: &str) -> (String, u64, u64, object::SymbolKind, bool, Vec<u8>) {
    let f = object::File::parse(obj).unwrap();
    let s = f.symbols().find(|s| s.name() == Ok(name) && !s.is_undefined()).unwrap_or_else(|| panic!("no {name}"));
    let sec = f.section_by_index(s.section_index().unwrap()).unwrap();
    let at = usize::try_from(s.address() - sec.address()).unwrap();
    let data = sec.data().unwrap()[at..][..usize::try_from(s.size()).unwrap()].to_vec();
    (sec.name().unwrap().to_owned(), sec.align(), s.size(), s.kind(), s.is_global(), data)
}

fn has_gnu_stack_note(obj: &[u8]) -> bool {
    object::File::parse(obj).unwrap().section_by_name(".note.GNU-stack").is_some_and(|s| s.size() == 0)
}

/// `cc -shared -o out objects...`.
fn link(objects: &[PathBuf], out: &Path) {
    let o = Command::new("cc").arg("-shared").arg("-o").arg(out).args(objects).output().unwrap();
    assert!(o.status.success(), "link {}: {}", out.display(), String::from_utf8_lossy(&o.stderr));
}

/// A dlopened test library.
struct Lib(*mut c_void);

#[allow(unsafe_code)]
impl Lib {
    fn open(path: &Path) -> Lib {
        let p = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: the libraries opened here are built by these tests from the objects under test
        // and `REGISTRY_C`; their only initializer is the blob registration being tested.
        let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", path.display());
        Lib(h)
    }

    fn sym(&self, name: &str) -> *mut c_void {
        let n = CString::new(name).unwrap();
        // SAFETY: `self.0` is a live handle from dlopen; dlsym only looks the name up.
        let p = unsafe { libc::dlsym(self.0, n.as_ptr()) };
        assert!(!p.is_null(), "no symbol {name}");
        p
    }

    /// The `len` bytes at symbol `name`.
    fn bytes(&self, name: &str, len: usize) -> Vec<u8> {
        let p = self.sym(name);
        // SAFETY: the symbol is the blob, whose object symbol is `len` bytes long (checked by the
        // callers with the object crate); the library stays loaded while the slice is copied.
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec()
    }

    /// Calls `name`, one of REGISTRY_C's `T name(void)` functions.
    fn call<T>(&self, name: &str) -> T {
        let p = self.sym(name);
        // SAFETY: only called for REGISTRY_C's functions, with their return types.
        unsafe {
            let f: extern "C" fn() -> T = std::mem::transmute(p);
            f()
        }
    }
}

#[allow(unsafe_code)]
impl Drop for Lib {
    fn drop(&mut self) {
        // SAFETY: nothing taken from the library outlives it (bytes are copied out).
        unsafe { libc::dlclose(self.0) };
    }
}

#[test]
fn tvm_text_equals_every_golden_devc_c() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (blob_path, layout) in golden_blobs() {
        let blob = read(&blob_path);
        for (suffix, system_lib, prefix) in
            [("devc.c", false, ""), ("syslib.devc.c", true, ""), ("syslib_prefix_demo_.devc.c", true, "demo_")]
        {
            let golden = sibling(&blob_path, suffix);
            if !golden.exists() {
                continue;
            }
            let golden = read(&golden);
            let opts = PackOptions { layout, prefix: prefix.into(), system_lib, target: None };
            let mut text = Vec::new();
            c::write_tvm_text(&blob[..], &opts, &mut text).unwrap();
            assert!(text == golden, "{}: {suffix} differs", blob_path.display());
            let src = c::write_source(&blob, &opts, CStyle::Tvm, dir.path()).unwrap();
            assert_eq!(src, dir.path().join(format!("{prefix}devc.c")));
            assert!(read(&src) == golden, "{}: {suffix} file differs", blob_path.display());
            checked += 1;
        }
    }
    // 3 top-level goldens, 3 versions and 4 device goldens have all three texts.
    assert!(checked >= 30, "only {checked} devc.c goldens");
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_objects_are_tvms_devc_o_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (blob_path, layout) in golden_blobs() {
        let golden = sibling(&blob_path, "devc.o");
        if !golden.exists() {
            continue;
        }
        let (blob, golden) = (read(&blob_path), read(&golden));
        let opts = PackOptions { layout, ..PackOptions::default() };
        let ours = read(&mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap());
        // The parts that matter, so that a difference says what it is...
        let sym = symbol_of(&ours, layout.symbol());
        assert_eq!(sym, symbol_of(&golden, layout.symbol()), "{}", blob_path.display());
        assert_eq!((sym.0.as_str(), sym.1, sym.3, sym.4), (".rodata", 1, object::SymbolKind::Data, true));
        assert!(sym.5 == blob, "{}: symbol bytes", blob_path.display());
        assert!(has_gnu_stack_note(&ours));
        // ...and then the whole file.
        assert!(ours == golden, "{}: object differs from TVM's", blob_path.display());
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} devc.o goldens");
}

/// System-lib objects (with and without a symbol prefix) against what TVM 0.19's own LLVM
/// packer wrote (`tvm-goldens/syslib/`, made by its `make.py`): the blob taken out of TVM's
/// object and packed again by mblob gives TVM's object byte for byte (the registration
/// constructor, its `.init_array` entry and the relaxable GOT relocation included).
#[cfg(feature = "llvm")]
#[test]
fn llvm_system_lib_objects_are_tvm_019s_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for prefix in ["", "demo_"] {
        let golden = read(&goldens().join("syslib").join(format!("{prefix}devc.o")));
        let found = mblob_runtime::elf::find_blob(&golden, Some(prefix)).unwrap().unwrap();
        assert_eq!(found.symbol, format!("{prefix}__tvm_dev_mblob"));
        let blob = found.bytes(&golden).unwrap().to_vec();
        let opts = PackOptions { layout: Layout::Classic, prefix: prefix.into(), system_lib: true, target: None };
        let ours = read(&mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap());
        assert!(ours == golden, "prefix `{prefix}`: object differs from TVM 0.19's");
    }
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_objects_hold_any_blob_under_any_prefix_and_link() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (layout, prefix, len)) in
        [(Layout::Classic, "", 8), (Layout::Classic021, "m1_", 3 << 20), (Layout::Ffi, "demo_", 100_003)]
            .into_iter()
            .enumerate()
    {
        let blob = pattern(len);
        let opts = PackOptions { layout, prefix: prefix.into(), ..PackOptions::default() };
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir(&sub).unwrap();
        let o = mblob::pack::llvm::write_object(&blob, &opts, &sub).unwrap();
        assert_eq!(o, sub.join(format!("{prefix}devc.o")));
        let data = read(&o);
        let sym = symbol_of(&data, &opts.symbol());
        assert_eq!(
            (sym.0.as_str(), sym.1, sym.2, sym.3, sym.4),
            (".rodata", 1, len as u64, object::SymbolKind::Data, true)
        );
        assert!(sym.5 == blob);
        let so = sub.join("x.so");
        link(&[o], &so);
        let lib = Lib::open(&so);
        assert!(lib.bytes(&opts.symbol(), len) == blob, "{layout}");
        let file = read(&so);
        let found = mblob_runtime::elf::find_blob(&file, Some(prefix)).unwrap().unwrap();
        assert_eq!((found.layout, found.size), (layout, len as u64));
    }
}

#[test]
fn fast_c_compiles_to_the_symbol_tvm_writes() {
    let dir = tempfile::tempdir().unwrap();
    let blob_path = goldens().join("graph_dense_relu.blob");
    let blob = read(&blob_path);
    let golden_o = read(&sibling(&blob_path, "devc.o"));
    let opts = PackOptions::default();
    let src = c::write_source(&blob, &opts, CStyle::Fast, dir.path()).unwrap();
    assert_eq!(src, dir.path().join("devc.c"));
    assert!(read(&dir.path().join("devc.bin")) == blob);
    let text = String::from_utf8(read(&src)).unwrap();
    assert!(!text.contains("0x"), "the fast form must not spell out bytes:\n{text}");
    let o = c::compile(&src, &opts, dir.path()).unwrap();
    let data = read(&o);
    let (section, _, size, kind, global, bytes) = symbol_of(&data, "__tvm_dev_mblob");
    let tvm = symbol_of(&golden_o, "__tvm_dev_mblob");
    assert_eq!((section.as_str(), size, kind, global), (tvm.0.as_str(), tvm.2, tvm.3, tvm.4));
    assert!(bytes == blob);
    assert!(has_gnu_stack_note(&data));
    let so = dir.path().join("x.so");
    link(&[o], &so);
    assert!(Lib::open(&so).bytes("__tvm_dev_mblob", blob.len()) == blob);
}

#[test]
fn fast_c_survives_odd_directory_names() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("we\"ird \\ ??= dir");
    std::fs::create_dir(&dir).unwrap();
    let blob = pattern(70_001);
    let opts = PackOptions { prefix: "odd_".into(), ..PackOptions::default() };
    let src = c::write_source(&blob, &opts, CStyle::Fast, &dir).unwrap();
    let o = c::compile(&src, &opts, &dir).unwrap();
    assert!(symbol_of(&read(&o), "odd___tvm_dev_mblob").5 == blob);
}

#[test]
fn tvm_c_text_compiles_to_the_blob() {
    let dir = tempfile::tempdir().unwrap();
    let blob = read(&goldens().join("relax_add_mul.blob"));
    let opts = PackOptions::default();
    let src = c::write_source(&blob, &opts, CStyle::Tvm, dir.path()).unwrap();
    let o = c::compile(&src, &opts, dir.path()).unwrap();
    let (section, _, size, kind, global, bytes) = symbol_of(&read(&o), "__tvm_dev_mblob");
    // `.rodata.__tvm_dev_mblob`: the cc crate compiles with `-fdata-sections`.
    assert!(section.starts_with(".rodata"), "{section}");
    assert_eq!((size, kind, global), (blob.len() as u64, object::SymbolKind::Data, true));
    assert!(bytes == blob);
}

/// A C file that defines both register functions and records what was registered.
const REGISTRY_C: &str = r#"
static const char* g_name; static void* g_ptr; static int g_calls; static int g_ffi;
int TVMBackendRegisterSystemLibSymbol(const char* name, void* ptr) { g_name = name; g_ptr = ptr; g_calls++; return 0; }
int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr) { g_ffi++; return TVMBackendRegisterSystemLibSymbol(name, ptr); }
const char* registered_name(void) { return g_name; }
void* registered_ptr(void) { return g_ptr; }
int registered_calls(void) { return g_calls; }
int registered_ffi(void) { return g_ffi; }
"#;

/// The routes that turn a blob into an object.
#[derive(Debug, Clone, Copy)]
enum Route {
    #[cfg(feature = "llvm")]
    Llvm,
    /// The fast form, compiled as C and as C++.
    Fast { cpp: bool },
    /// TVM's text, which in system-lib mode is C++ only (as in TVM).
    TvmCpp,
}

const ROUTES: &[Route] = &[
    #[cfg(feature = "llvm")]
    Route::Llvm,
    Route::Fast { cpp: false },
    Route::Fast { cpp: true },
    Route::TvmCpp,
];

fn pack(route: Route, blob: &dyn BlobSource, opts: &PackOptions, dir: &Path) -> PathBuf {
    match route {
        #[cfg(feature = "llvm")]
        Route::Llvm => mblob::pack::llvm::write_object(blob, opts, dir).unwrap(),
        Route::Fast { cpp } => {
            let src = c::write_source(blob, opts, CStyle::Fast, dir).unwrap();
            c::compile_with(&src, opts, dir, cpp).unwrap()
        }
        Route::TvmCpp => {
            let src = c::write_source(blob, opts, CStyle::Tvm, dir).unwrap();
            c::compile_with(&src, opts, dir, true).unwrap()
        }
    }
}

#[test]
fn system_lib_registers_the_blob_through_every_route() {
    let root = tempfile::tempdir().unwrap();
    let reg_c = root.path().join("registry.c");
    std::fs::write(&reg_c, REGISTRY_C).unwrap();
    let reg_o = c::compile(&reg_c, &PackOptions::default(), root.path()).unwrap();
    let mut n = 0;
    for &route in ROUTES {
        for (layout, prefix) in [(Layout::Classic, ""), (Layout::Classic021, "demo_"), (Layout::Ffi, "demo_")] {
            let dir = root.path().join(n.to_string());
            n += 1;
            std::fs::create_dir(&dir).unwrap();
            let blob = pattern(5000 + n);
            let opts = PackOptions { layout, prefix: prefix.into(), system_lib: true, target: None };
            let o = pack(route, &blob, &opts, &dir);
            let so = dir.join("sys.so");
            link(&[o, reg_o.clone()], &so);
            let lib = Lib::open(&so);
            let what = format!("{route:?} {layout} {prefix:?}");
            let name: *const c_char = lib.call("registered_name");
            assert!(!name.is_null(), "{what}: the constructor did not run");
            // SAFETY: the name is the NUL-terminated string constant the constructor passed.
            #[allow(unsafe_code)]
            let name = unsafe { CStr::from_ptr(name) }.to_str().unwrap().to_owned();
            assert_eq!(name, opts.symbol(), "{what}");
            assert_eq!(lib.call::<*mut c_void>("registered_ptr"), lib.sym(&opts.symbol()), "{what}");
            assert_eq!(lib.call::<i32>("registered_calls"), 1, "{what}");
            assert_eq!(lib.call::<i32>("registered_ffi"), i32::from(layout == Layout::Ffi), "{what}");
            assert!(lib.bytes(&opts.symbol(), blob.len()) == blob, "{what}");
        }
    }
}

#[test]
fn compiler_failures_are_tool_errors_with_the_command() {
    let dir = tempfile::tempdir().unwrap();
    // TVM's system-lib text is C++ only: as C, gcc refuses the static initializer.
    let opts = PackOptions { system_lib: true, ..PackOptions::default() };
    let src = c::write_source(&pattern(64), &opts, CStyle::Tvm, dir.path()).unwrap();
    match c::compile(&src, &opts, dir.path()).unwrap_err() {
        mblob::Error::Tool { step, command, stderr, .. } => {
            assert_eq!(step, format!("compile {}", src.display()));
            assert!(command.contains("-c") && command.contains(&*src.to_string_lossy()), "{command}");
            assert!(stderr.contains("error"), "{stderr}");
        }
        e => panic!("{e}"),
    }
    assert!(!dir.path().join("devc.o").exists());
}

#[cfg(feature = "llvm")]
#[test]
fn aarch64_objects_from_this_machine() {
    use object::{Architecture, RelocationTarget};
    let dir = tempfile::tempdir().unwrap();
    let blob = read(&goldens().join("graph_dense_relu.blob"));
    let opts = PackOptions {
        target: Some("aarch64-unknown-linux-gnu".into()),
        system_lib: true,
        prefix: "arm_".into(),
        ..PackOptions::default()
    };
    let o = mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap();
    let data = read(&o);
    let f = object::File::parse(&*data).unwrap();
    assert_eq!((f.architecture(), f.format(), f.is_64()), (Architecture::Aarch64, object::BinaryFormat::Elf, true));
    let sym = symbol_of(&data, "arm___tvm_dev_mblob");
    assert_eq!(
        (sym.0.as_str(), sym.1, sym.2, sym.3, sym.4),
        (".rodata", 1, blob.len() as u64, object::SymbolKind::Data, true)
    );
    assert!(sym.5 == blob);
    assert!(has_gnu_stack_note(&data));
    // The constructor calls the register function.
    let calls_register = f.sections().flat_map(|s| s.relocations().collect::<Vec<_>>()).any(|(_, r)| {
        matches!(r.target(), RelocationTarget::Symbol(i)
            if f.symbol_by_index(i).unwrap().name() == Ok("TVMBackendRegisterSystemLibSymbol"))
    });
    assert!(calls_register);
    if let Ok(out) = Command::new("readelf").arg("-h").arg("-s").arg(&o).output() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("AArch64") && text.contains("arm___tvm_dev_mblob"), "{text}");
    }
}

/// The assembly inside a fast C source, with the C string escapes undone.
#[cfg(feature = "llvm")]
fn asm_of_fast_source(src: &str) -> String {
    let block = src.split("__asm__(\n").nth(1).unwrap().split("\n);").next().unwrap();
    let mut asm = String::new();
    for line in block.lines() {
        let inner = line.trim().strip_prefix('"').unwrap().strip_suffix("\\n\"").unwrap();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            asm.push(if c == '\\' { chars.next().unwrap() } else { c });
        }
        asm.push('\n');
    }
    asm
}

/// The fast form's assembly assembles for AArch64 too (with LLVM's assembler, since no aarch64
/// GCC is installed here).
#[cfg(feature = "llvm")]
#[test]
fn fast_c_assembly_assembles_for_aarch64() {
    let bindir = Command::new("llvm-config")
        .arg("--bindir")
        .output()
        .expect("llvm-config (LLVM 14 is needed for the llvm feature)");
    let mc = PathBuf::from(String::from_utf8(bindir.stdout).unwrap().trim()).join("llvm-mc");
    let dir = tempfile::tempdir().unwrap();
    let blob = pattern(12_345);
    let opts =
        PackOptions { target: Some("aarch64-unknown-linux-gnu".into()), system_lib: true, ..PackOptions::default() };
    let src = c::write_source(&blob, &opts, CStyle::Fast, dir.path()).unwrap();
    let asm = asm_of_fast_source(&String::from_utf8(read(&src)).unwrap());
    assert!(asm.contains(".pushsection .rodata,\"a\",%progbits"), "{asm}");
    let s = dir.path().join("blob.s");
    std::fs::write(&s, &asm).unwrap();
    let o = dir.path().join("blob.o");
    let out = Command::new(&mc)
        .args(["-triple=aarch64-unknown-linux-gnu", "-filetype=obj", "-o"])
        .arg(&o)
        .arg(&s)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{asm}", String::from_utf8_lossy(&out.stderr));
    let data = read(&o);
    assert_eq!(object::File::parse(&*data).unwrap().architecture(), object::Architecture::Aarch64);
    let sym = symbol_of(&data, "__tvm_dev_mblob");
    assert_eq!((sym.0.as_str(), sym.2, sym.3, sym.4), (".rodata", blob.len() as u64, object::SymbolKind::Data, true));
    assert!(sym.5 == blob);
}

/// `mblob pack`, run as a user would, with a private TMPDIR.
fn mblob_pack(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mblob")).arg("pack").args(args).env("TMPDIR", tmp.path()).output();
    let out = out.expect("run mblob");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "files left in TMPDIR");
    out
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

#[test]
fn pack_without_host_code_refuses_unless_asked_for_a_blob_only_library() {
    let dir = tempfile::tempdir().unwrap();
    let from = goldens().join("graph_dense_relu.so");
    let so = dir.path().join("out.so");
    // No --host: refused, saying what --host must be.
    let out = mblob_pack(&[os("--from"), os(&from), os("-o"), os(&so)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--host") && err.contains("lib0.o") && err.contains("--blob-only"), "{err}");
    assert!(!so.exists());
    // A shared library as host code: refused, it cannot be linked into another library.
    let out = mblob_pack(&[os("--from"), os(&from), os("--host"), os(&from), os("-o"), os(&so)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("graph_dense_relu.so") && err.contains("is a shared library"), "{err}");
    assert!(!so.exists());
    // --blob-only: TVM's blob and no model function.
    let out = mblob_pack(&[os("--from"), os(&from), os("--blob-only"), os("-o"), os(&so), os("-q")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = read(&so);
    let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
    assert!(found.bytes(&data).unwrap() == read(&goldens().join("graph_dense_relu.blob")));
    let file = object::File::parse(&*data).unwrap();
    assert!(!file.symbols().any(|s| s.name() == Ok("tvmgen_default_fused_nn_contrib_dense_pack_add_nn_relu")));
    // With --host, the model functions are there.
    let lib0 = goldens().join("graph_dense_relu.lib0.o");
    let out = mblob_pack(&[os("--from"), os(&from), os("--host"), os(&lib0), os("-o"), os(&so), os("-q")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = read(&so);
    let file = object::File::parse(&*data).unwrap();
    assert!(file.symbols().any(|s| s.name() == Ok("tvmgen_default_fused_nn_contrib_dense_pack_add_nn_relu")));
}

#[test]
fn host_objects_tell_their_tvm_calling_convention() {
    use mblob::pack::abi::detect;
    use mblob::runtime::Layout;
    let v = goldens().join("other_versions");
    let cases = [
        (goldens().join("graph_dense_relu.lib0.o"), Some(Layout::Classic)),
        (goldens().join("dso_add_one.lib0.o"), Some(Layout::Classic)),
        (v.join("tvm-0.19.0/relax_add_mul.lib0.o"), Some(Layout::Classic)),
        (v.join("tvm-0.21.0/relax_add_mul.lib0.o"), Some(Layout::Classic021)),
        (v.join("tvm-0.27.0.post1/relax_add_mul.lib0.o"), Some(Layout::Ffi)),
        (goldens().join("device/tvm-0.21.0/opencl_vector_add.lib0.o"), Some(Layout::Classic021)),
        (goldens().join("device/tvm-0.27.0.post1/nvptx_vector_add.lib0.o"), Some(Layout::Ffi)),
        // The blob object has no host functions.
        (goldens().join("graph_dense_relu.devc.o"), None),
    ];
    for (path, want) in cases {
        assert_eq!(detect(&path).unwrap(), want, "{}", path.display());
    }
    // What TVM itself says it links: 0.27's library exports `__tvm_ffi_*` functions and needs
    // TVMFFIErrorSetRaisedFromCStrParts; 0.19's exports plain names and fills context slots.
    let run = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&read(&goldens().join(format!("run/{name}.json")))).unwrap()
    };
    let syms = run("relax_mlp_tvm027")["dynamic_symbols"].clone();
    assert!(syms["exported_functions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f.as_str().unwrap().starts_with("__tvm_ffi_")));
    assert!(syms["undefined_tvm"].as_array().unwrap().iter().any(|f| f == "TVMFFIErrorSetRaisedFromCStrParts"));
    let syms = run("relax_mlp_tvm019")["dynamic_symbols"].clone();
    assert!(syms["tvm_context_slots"].as_array().unwrap().iter().any(|f| f == "__TVMAPISetLastError"));
    assert!(syms["exported_functions"].as_array().unwrap().iter().all(|f| !f.as_str().unwrap().starts_with("__tvm")));
}

#[test]
fn pack_refuses_a_layout_whose_tvm_cannot_call_the_host_code() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("out.so");
    let layouts = ["classic", "classic-0.21", "ffi"];
    for (version, fits) in [("tvm-0.19.0", "classic"), ("tvm-0.21.0", "classic-0.21"), ("tvm-0.27.0.post1", "ffi")] {
        let v = goldens().join("other_versions").join(version);
        let (from, lib0) = (v.join("relax_add_mul.so"), v.join("relax_add_mul.lib0.o"));
        for layout in layouts {
            let args =
                [os("--from"), os(&from), os("--host"), os(&lib0), os("-o"), os(&so), os("--layout"), os(layout)];
            let out = mblob_pack(&[&args[..], &[os("-q")]].concat());
            let err = String::from_utf8_lossy(&out.stderr);
            if layout == fits {
                assert!(out.status.success(), "{version} {layout}: {err}");
                // The same blob TVM wrote.
                let data = read(&so);
                let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
                assert!(found.bytes(&data).unwrap() == read(&v.join("relax_add_mul.blob")), "{version}");
                std::fs::remove_file(&so).unwrap();
                continue;
            }
            assert_eq!(out.status.code(), Some(1), "{version} {layout}: {err}");
            assert!(
                err.contains("calling convention") && err.contains(&format!("`{fits}`")),
                "{version} {layout}: {err}"
            );
            assert!(err.contains("--force-layout"), "{err}");
            assert!(!so.exists(), "{version} {layout}");
        }
    }
}

#[test]
fn relax_executables_go_only_where_their_type_key_is_read() {
    // TVM 0.19's `relax.Executable` has no loader in TVM 0.21+: its layouts are refused, even
    // without host code (--blob-only). TVM 0.20 wrote `relax.VMExecutable` in the classic
    // layout (`__tvm_dev_mblob`), so a `relax.VMExecutable` may go to classic.
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("out.so");
    let v = goldens().join("other_versions");
    let from = v.join("tvm-0.19.0").join("relax_add_mul.so");
    for layout in ["classic-0.21", "ffi"] {
        let out =
            mblob_pack(&[os("--from"), os(&from), os("--blob-only"), os("-o"), os(&so), os("--layout"), os(layout)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{layout}: {err}");
        assert!(err.contains("relax.Executable") && err.contains("no loader for"), "{layout}: {err}");
        assert!(!err.contains("magic"), "{layout}: {err}");
        assert!(!so.exists());
    }
    let from = v.join("tvm-0.27.0.post1").join("relax_add_mul.so");
    let out =
        mblob_pack(&[os("--from"), os(&from), os("--blob-only"), os("-o"), os(&so), os("--layout"), os("classic")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = std::fs::read(&so).unwrap();
    let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
    assert_eq!(found.symbol, "__tvm_dev_mblob");
    std::fs::remove_file(&so).unwrap();
    // 0.21 to 0.27's layout keeps the key both read: allowed (blob only, the host code differs).
    let out = mblob_pack(&[
        os("--from"),
        os(&v.join("tvm-0.21.0/relax_add_mul.so")),
        os("--blob-only"),
        os("-o"),
        os(&so),
        os("--layout"),
        os("ffi"),
        os("-q"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `repack::with_graph_params`: TVM's `graph_dense_relu` blob as the template, its parameters
/// from TVM's own `.params` file; the library written holds TVM's blob byte for byte, in the
/// template's parameter order whatever order the arrays come in. Names that do not match
/// the model's are refused.
#[test]
fn graph_params_replaced_by_name_give_tvms_blob() {
    use std::collections::HashMap;

    use mblob::export::Export;
    use mblob::repack::{module_tree_of, with_graph_params};

    let blob_path = goldens().join("graph_dense_relu.blob");
    let blob = mblob_runtime::map_file(&blob_path).unwrap();
    let template = module_tree_of(&blob, Layout::Classic, &blob_path).unwrap();
    let params_file = mblob_runtime::map_file(&goldens().join("graph_dense_relu.params")).unwrap();
    let mut params: Vec<_> = mblob_runtime::exec::graph::read_params(&params_file).unwrap();
    assert!(params.len() >= 2, "the model has parameters");
    params.reverse();
    let by_name: HashMap<_, _> = params.iter().cloned().collect();
    let tree = with_graph_params(&template, by_name.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("graph.so");
    let mut e = Export::from_tree(tree);
    e.object(goldens().join("graph_dense_relu.lib0.o"));
    e.write(&so).unwrap();
    let data = read(&so);
    let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
    assert!(found.bytes(&data).unwrap() == &blob[..], "not TVM's blob");

    let mut missing = by_name.clone();
    let gone = params[0].0.clone();
    missing.remove(&gone);
    let err = with_graph_params(&template, missing).unwrap_err().to_string();
    assert!(err.contains(&format!("no array for the model's parameter `{gone}`")), "{err}");
    let mut extra = by_name;
    extra.insert("not_a_param".into(), params[0].1.clone());
    let err = with_graph_params(&template, extra).unwrap_err().to_string();
    assert!(err.contains("`not_a_param` is not a parameter of the model"), "{err}");
}
