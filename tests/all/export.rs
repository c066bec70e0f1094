//! Export end to end: TVM's kernel objects and payloads packed through every backend and
//! layout, linked, dlopened and run; the blob inside compared with TVM's.

use std::path::{Path, PathBuf};

use mblob::export::{Backend, Export};
use mblob::pack::{CStyle, PackOptions};
use mblob_runtime::format::{self, UnknownKeys};
use mblob_runtime::{elf, load_library, Bytes, Layout, LoadOptions, Registry, TreeShape};
use serde_json::Value;

use crate::goldens::{goldens, json, read, run_dense_relu, tree_from_manifest};

pub fn backends() -> Vec<Backend> {
    let mut b = vec![Backend::C(CStyle::Fast), Backend::C(CStyle::Tvm)];
    if cfg!(feature = "llvm") {
        b.insert(0, Backend::Llvm);
    }
    b.insert(0, Backend::Direct);
    b
}

fn shape_of(v: &Value) -> TreeShape {
    TreeShape {
        type_key: v["type_key"].as_str().unwrap().to_owned(),
        imports: v["imports"].as_array().unwrap().iter().map(shape_of).collect(),
    }
}

/// An export of a golden: the manifest's in-memory tree, payloads from the golden blob (as
/// opaque bytes), and TVM's kernel objects.
pub fn golden_export(dir: &Path, g: &Value, blob_layout: Layout) -> Export {
    let blob = g.get("blob").map(|b| read(&dir.join(b["file"].as_str().unwrap())));
    let mut device_index = 0;
    let tree = tree_from_manifest(&g["module_tree_in_memory"], &mut |key| {
        // Device goldens say which payload file belongs to the k-th device module.
        let device = mblob_runtime::payload::device::DEVICE_TYPE_KEYS.contains(&key);
        if let Some(payloads) = g.get("device_payloads").and_then(Value::as_array).filter(|_| device) {
            let p = payloads.iter().find(|p| p["in_memory_device_module"] == device_index).unwrap();
            device_index += 1;
            return Bytes::from_vec(read(&dir.join(p["payload_file"]["file"].as_str().unwrap())));
        }
        let blob = blob.as_ref().expect("payload module without a blob");
        let parsed = format::parse_blob(blob, blob_layout, &Registry::default(), UnknownKeys::Error).unwrap();
        Bytes::from_vec(parsed.entries.iter().find(|e| e.type_key == key).unwrap().payload.to_vec())
    });
    let mut e = Export::from_tree(tree);
    // These exports check the container in every layout; the kernels are TVM 0.19's, which
    // only `classic` can call (refused by default, see `abi.rs`).
    e.force_layout(true);
    for k in g["kernel_objects"].as_array().unwrap() {
        let file = k.get("file").and_then(Value::as_str).or(k.as_str()).unwrap();
        e.object(dir.join(file));
    }
    e
}

fn blob_of(so: &Path) -> Option<(String, Vec<u8>)> {
    let data = read(so);
    elf::find_blob(&data, None).unwrap().map(|b| (b.symbol.clone(), b.bytes(&data).unwrap().to_vec()))
}

#[allow(unsafe_code)]
pub fn load(so: &Path) -> mblob_runtime::LoadedTree {
    // SAFETY: libraries linked in this test from TVM's kernel objects and our blob objects.
    unsafe { load_library(so, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", so.display()))
}

#[test]
fn goldens_export_through_every_backend_and_layout() {
    let out = tempfile::tempdir().unwrap();
    let m = json(&goldens().join("manifest.json"));
    for g in m["goldens"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap();
        let golden_blob = g.get("blob").map(|b| read(&goldens().join(b["file"].as_str().unwrap())));
        for backend in backends() {
            for layout in Layout::ALL {
                let so = out.path().join(format!("{name}-{backend:?}-{layout}.so").replace(['(', ')'], "_"));
                let mut e = golden_export(&goldens(), g, Layout::Classic);
                let report = e.backend(backend).layout(layout).write(&so).unwrap_or_else(|e| panic!("{name}: {e}"));
                let what = format!("{name} {backend:?} {layout}");
                match (&golden_blob, blob_of(&so)) {
                    (Some(golden), Some((symbol, blob))) => {
                        assert_eq!(symbol, layout.symbol(), "{what}");
                        assert_eq!(report.blob_len, blob.len() as u64);
                        if layout != Layout::Ffi {
                            // Classic and 0.21 share their bytes: TVM's blob exactly.
                            assert!(blob == *golden, "{what}: blob differs from TVM's");
                        }
                    }
                    (None, None) => assert!(report.symbol.is_none(), "{what}"),
                    (g, b) => panic!("{what}: golden blob {} but ours {}", g.is_some(), b.is_some()),
                }
                let loaded = load(&so);
                assert_eq!(loaded.shape(), shape_of(&g["module_tree_loaded"]), "{what}");
                assert_eq!(loaded.origin().layout, golden_blob.as_ref().map(|_| layout), "{what}");
                for f in g["functions_loaded"].as_array().unwrap().iter().filter(|f| f["type_key"] == "library") {
                    for (func, present) in f["functions"].as_object().unwrap() {
                        assert_eq!(loaded.get_function(func).is_some(), present.as_bool().unwrap(), "{what}: {func}");
                    }
                }
                if name.starts_with("graph_") {
                    let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
                    assert_eq!(run_dense_relu(&loaded), want, "{what}");
                }
            }
        }
    }
}

#[test]
fn ffi_export_equals_tvm_027_blob() {
    // TVM 0.27's relax golden: our ffi-layout export carries its blob byte for byte.
    let dir = goldens().join("other_versions/tvm-0.27.0.post1");
    let probe = json(&dir.join("probe.json"));
    let payload = Bytes::from_vec(read(&dir.join("relax_add_mul.relax.VMExecutable.bin")));
    let tree = tree_from_manifest(&probe["module_tree_in_memory"], &mut |_| payload.clone());
    let out = tempfile::tempdir().unwrap();
    for backend in backends() {
        let so = out.path().join("relax.so");
        let mut e = Export::from_tree(tree.clone());
        e.object(dir.join("relax_add_mul.lib0.o")).layout(Layout::Ffi).backend(backend);
        e.write(&so).unwrap();
        let (symbol, blob) = blob_of(&so).unwrap();
        assert_eq!(symbol, "__tvm_ffi__library_bin");
        assert!(blob == read(&dir.join("relax_add_mul.blob")), "{backend:?}");
        let loaded = load(&so);
        assert!(loaded.get_function("__tvm_ffi_add").is_some());
    }
}

#[test]
fn device_goldens_export_with_their_blobs() {
    let out = tempfile::tempdir().unwrap();
    for (sub, layout) in [
        ("device", Layout::Classic),
        ("device/tvm-0.21.0", Layout::Classic021),
        ("device/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        let dir = goldens().join(sub);
        let m = json(&dir.join("manifest.json"));
        for g in m["goldens"].as_array().unwrap() {
            let name = g["name"].as_str().unwrap();
            let so = out.path().join(format!("{name}.so"));
            let mut e = golden_export(&dir, g, layout);
            e.layout(layout).write(&so).unwrap_or_else(|e| panic!("{sub}/{name}: {e}"));
            let (_, blob) = blob_of(&so).unwrap();
            assert!(blob == read(&dir.join(g["blob"]["file"].as_str().unwrap())), "{sub}/{name}");
            let loaded = load(&so);
            assert_eq!(loaded.origin().layout, Some(layout));
        }
    }
}

fn devc_goldens() -> Vec<(PathBuf, Layout)> {
    let mut v = Vec::new();
    for (sub, layout) in [
        ("", Layout::Classic),
        ("other_versions/tvm-0.19.0", Layout::Classic),
        ("other_versions/tvm-0.21.0", Layout::Classic021),
        ("other_versions/tvm-0.27.0.post1", Layout::Ffi),
        ("device", Layout::Classic),
        ("device/tvm-0.21.0", Layout::Classic021),
        ("device/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        for e in std::fs::read_dir(goldens().join(sub)).unwrap() {
            let p = e.unwrap().path();
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            if n.ends_with(".blob") && !n.contains("cfallback") {
                v.push((p, layout));
            }
        }
    }
    v
}

#[test]
fn tvm_c_text_equals_tvms_devc_files() {
    let mut checked = 0;
    for (blob_path, layout) in devc_goldens() {
        let blob = read(&blob_path);
        let stem = blob_path.to_string_lossy().trim_end_matches(".blob").to_owned();
        for (suffix, system_lib, prefix) in
            [("devc.c", false, ""), ("syslib.devc.c", true, ""), ("syslib_prefix_demo_.devc.c", true, "demo_")]
        {
            let golden = PathBuf::from(format!("{stem}.{suffix}"));
            if !golden.exists() {
                continue;
            }
            let opts = PackOptions { layout, prefix: prefix.into(), system_lib, target: None };
            let mut text = Vec::new();
            mblob::pack::c::write_tvm_text(&blob, &opts, &mut text).unwrap();
            assert!(text == read(&golden), "{} differs", golden.display());
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} devc.c goldens found");
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_object_matches_tvms_devc_object() {
    use object::{Object, ObjectSection, ObjectSymbol};
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (blob_path, layout) in devc_goldens() {
        let golden_o = PathBuf::from(blob_path.to_string_lossy().replace(".blob", ".devc.o"));
        if !golden_o.exists() {
            continue;
        }
        let blob = read(&blob_path);
        let opts = PackOptions { layout, ..PackOptions::default() };
        let ours = mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap();
        let (a, b) = (read(&ours), read(&golden_o));
        let (fa, fb) = (object::File::parse(&*a).unwrap(), object::File::parse(&*b).unwrap());
        let sym = |f: &object::File<'_>| {
            let s = f.symbols().find(|s| s.name() == Ok(layout.symbol())).unwrap();
            let sec = f.section_by_index(s.section_index().unwrap()).unwrap();
            let data = sec.data().unwrap()[s.address() as usize..][..s.size() as usize].to_vec();
            (sec.name().unwrap().to_owned(), sec.align(), s.size(), s.kind(), s.is_global(), data)
        };
        let (ours_sym, tvm_sym) = (sym(&fa), sym(&fb));
        assert_eq!(ours_sym, tvm_sym, "{}", golden_o.display());
        assert_eq!(ours_sym.5, blob);
        assert!(fa.section_by_name(".note.GNU-stack").is_some());
        checked += 1;
    }
    assert!(checked >= 10);
}

/// A C file that defines the register function and records what was registered.
const REGISTRY_C: &str = r#"
#include <string.h>
static const char* g_name; static void* g_ptr; static int g_calls;
int TVMBackendRegisterSystemLibSymbol(const char* name, void* ptr) { g_name = name; g_ptr = ptr; g_calls++; return 0; }
int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr) { return TVMBackendRegisterSystemLibSymbol(name, ptr); }
const char* registered_name(void) { return g_name; }
void* registered_ptr(void) { return g_ptr; }
int registered_calls(void) { return g_calls; }
"#;

#[test]
fn system_lib_registers_the_blob_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("registry.c");
    std::fs::write(&reg, REGISTRY_C).unwrap();
    let blob_path = goldens().join("graph_dense_relu.blob");
    let golden = read(&blob_path);
    for backend in backends() {
        for layout in [Layout::Classic, Layout::Ffi] {
            let g = &json(&goldens().join("manifest.json"))["goldens"][0];
            let mut e = golden_export(&goldens(), g, Layout::Classic);
            let so =
                dir.path().join(format!("sys-{layout}-{}.so", backends().iter().position(|b| *b == backend).unwrap()));
            e.c_source(&reg).system_lib(true).prefix("demo_").layout(layout).backend(backend);
            e.write(&so).unwrap_or_else(|err| panic!("{backend:?}: {err}"));
            let loaded = load(&so);
            let name_fn = loaded.get_function("registered_name").unwrap();
            let ptr_fn = loaded.get_function("registered_ptr").unwrap();
            let calls_fn = loaded.get_function("registered_calls").unwrap();
            let sym = format!("demo_{}", layout.symbol());
            let blob = loaded.get_function(&sym).unwrap();
            // SAFETY: the three functions are defined in REGISTRY_C with these signatures.
            #[allow(unsafe_code)]
            let (name, ptr, calls) = unsafe {
                let f: extern "C" fn() -> *const std::ffi::c_char = std::mem::transmute(name_fn.addr());
                let p: extern "C" fn() -> *mut std::ffi::c_void = std::mem::transmute(ptr_fn.addr());
                let c: extern "C" fn() -> i32 = std::mem::transmute(calls_fn.addr());
                let name = f();
                assert!(!name.is_null(), "{backend:?} {layout}: the constructor did not run");
                (std::ffi::CStr::from_ptr(name).to_str().unwrap().to_owned(), p(), c())
            };
            assert_eq!(name, sym, "{backend:?} {layout}");
            assert_eq!(ptr, blob.addr(), "{backend:?} {layout}");
            assert_eq!(calls, 1);
            if layout == Layout::Classic {
                assert!(blob_of(&so).unwrap().1 == golden);
            }
        }
    }
}

#[cfg(feature = "llvm")]
#[test]
fn aarch64_object_from_this_machine() {
    use object::{Architecture, Object, ObjectSymbol};
    let dir = tempfile::tempdir().unwrap();
    let blob = read(&goldens().join("graph_dense_relu.blob"));
    let opts =
        PackOptions { target: Some("aarch64-unknown-linux-gnu".into()), system_lib: true, ..PackOptions::default() };
    let o = mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap();
    let data = read(&o);
    let f = object::File::parse(&*data).unwrap();
    assert_eq!(f.architecture(), Architecture::Aarch64);
    assert_eq!(f.format(), object::BinaryFormat::Elf);
    let s = f.symbols().find(|s| s.name() == Ok("__tvm_dev_mblob")).unwrap();
    assert_eq!(s.size(), blob.len() as u64);
    let found = elf::find_blob(&data, None).unwrap().unwrap();
    assert!(found.bytes(&data).unwrap() == blob);
}

#[test]
fn same_inputs_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let g = &json(&goldens().join("manifest.json"))["goldens"][0];
    for backend in backends() {
        let (a, b) = (dir.path().join("a.so"), dir.path().join("b.so"));
        golden_export(&goldens(), g, Layout::Classic).backend(backend).write(&a).unwrap();
        golden_export(&goldens(), g, Layout::Classic).backend(backend).write(&b).unwrap();
        assert!(read(&a) == read(&b), "{backend:?}: two exports differ");
    }
}

/// Calls `name`, a C function `int name(void)` of a library loaded in these tests.
#[allow(unsafe_code)]
fn call_int(loaded: &mblob_runtime::LoadedTree, name: &str) -> i32 {
    let f = loaded.get_function(name).unwrap_or_else(|| panic!("{name} is missing"));
    // SAFETY: every function called this way is defined in this file as `int name(void)`.
    unsafe {
        let f: extern "C" fn() -> i32 = std::mem::transmute(f.addr());
        f()
    }
}

/// An export of `graph_dense_relu` (golden payload, golden kernel object).
pub fn dense_relu_export() -> Export {
    let g = &json(&goldens().join("manifest.json"))["goldens"][0];
    assert_eq!(g["name"], "graph_dense_relu");
    golden_export(&goldens(), g, Layout::Classic)
}

/// Names in a tar archive, listed by the system's `tar`.
fn tar_list(tar: &Path) -> Vec<String> {
    let out = std::process::Command::new("tar").arg("-tf").arg(tar).output().unwrap();
    assert!(out.status.success(), "tar -tf: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn tar_output_holds_the_objects_that_link_into_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let golden = read(&goldens().join("graph_dense_relu.blob"));
    for (i, backend) in backends().into_iter().enumerate() {
        for (layout, prefix) in [(Layout::Classic, ""), (Layout::Ffi, "m1_")] {
            let what = format!("{backend:?} {layout}");
            let tar = dir.path().join(format!("model{i}-{layout}.tar"));
            let report = dense_relu_export().backend(backend).layout(layout).prefix(prefix).write(&tar).unwrap();
            assert_eq!(report.symbol.as_deref(), Some(format!("{prefix}{}", layout.symbol()).as_str()));
            let devc = format!("{prefix}devc.o");
            assert_eq!(tar_list(&tar), ["lib0.o", devc.as_str()], "{what}");
            // The members are the very objects: TVM's kernel object unchanged, and a blob
            // object that links (as TVM's load_module does with a tar) into a loadable library.
            let x = dir.path().join(format!("x{i}-{layout}"));
            std::fs::create_dir(&x).unwrap();
            let st = std::process::Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&x).status().unwrap();
            assert!(st.success());
            assert!(read(&x.join("lib0.o")) == read(&goldens().join("graph_dense_relu.lib0.o")), "{what}");
            let so = x.join("model.so");
            let st = std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(&so)
                .arg(x.join("lib0.o"))
                .arg(x.join(&devc))
                .status()
                .unwrap();
            assert!(st.success(), "{what}");
            let data = read(&so);
            let found = elf::find_blob(&data, Some(prefix)).unwrap().unwrap();
            assert_eq!(found.layout, layout);
            if layout == Layout::Classic {
                assert!(found.bytes(&data).unwrap() == golden, "{what}");
            }
            if prefix.is_empty() {
                let loaded = load(&so);
                let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
                assert_eq!(run_dense_relu(&loaded), want, "{what}");
            }
            // Deterministic: a second export is the same archive.
            let again = dir.path().join("again.tar");
            dense_relu_export().backend(backend).layout(layout).prefix(prefix).write(&again).unwrap();
            assert!(read(&again) == read(&tar), "{what}: two tar exports differ");
        }
    }
    // No imports, no blob: only the host objects.
    let g = json(&goldens().join("manifest.json"))["goldens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "dso_add_one")
        .cloned()
        .unwrap();
    let tar = dir.path().join("plain.tar");
    golden_export(&goldens(), &g, Layout::Classic).write(&tar).unwrap();
    assert_eq!(tar_list(&tar), ["lib0.o"]);
}

#[test]
fn c_sources_with_the_same_name_do_not_collide() {
    // Two `host.c` in two directories, and a user's own `devc.c` beside the packer's.
    let dir = tempfile::tempdir().unwrap();
    let mut e = dense_relu_export();
    for (sub, text) in [
        ("a/host.c", "int host_a(void) { return 11; }"),
        ("b/host.c", "int host_b(void) { return 22; }"),
        ("c/devc.c", "int user_devc(void) { return 33; }"),
    ] {
        let p = dir.path().join(sub);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        e.c_source(p);
    }
    for backend in backends() {
        let so = dir.path().join("out.so");
        e.backend(backend).write(&so).unwrap_or_else(|err| panic!("{backend:?}: {err}"));
        let loaded = load(&so);
        assert_eq!(
            [call_int(&loaded, "host_a"), call_int(&loaded, "host_b"), call_int(&loaded, "user_devc")],
            [11, 22, 33],
            "{backend:?}"
        );
        assert!(blob_of(&so).unwrap().1 == read(&goldens().join("graph_dense_relu.blob")));
    }
}

#[cfg(feature = "llvm")]
#[test]
fn host_code_from_llvm_ir_files_and_inkwell_modules() {
    use inkwell::context::Context;
    let dir = tempfile::tempdir().unwrap();
    let ll = dir.path().join("text.ll");
    std::fs::write(&ll, "define i32 @from_ll() {\n  ret i32 101\n}\n").unwrap();
    let ctx = Context::create();
    let function = |name: &str, value: u64| {
        let m = ctx.create_module(name);
        let f = m.add_function(name, ctx.i32_type().fn_type(&[], false), None);
        let b = ctx.create_builder();
        b.position_at_end(ctx.append_basic_block(f, "entry"));
        b.build_return(Some(&ctx.i32_type().const_int(value, false))).unwrap();
        m
    };
    let bc = dir.path().join("bits.bc");
    assert!(function("from_bc", 202).write_bitcode_to_path(&bc));
    let handed_over = function("from_inkwell", 303);

    for layout in Layout::ALL {
        let so = dir.path().join(format!("ir-{layout}.so"));
        let mut e = dense_relu_export();
        e.ir(&ll).ir(&bc).inkwell_module(&handed_over).unwrap().layout(layout);
        e.write(&so).unwrap();
        let loaded = load(&so);
        assert_eq!(
            [call_int(&loaded, "from_ll"), call_int(&loaded, "from_bc"), call_int(&loaded, "from_inkwell")],
            [101, 202, 303],
            "{layout}"
        );
        assert!(loaded.get_function("tvmgen_default_fused_nn_contrib_dense_pack_add_nn_relu").is_some());
    }

    // Bad IR: an error that names the file, and nothing at the output.
    let bad = dir.path().join("bad.ll");
    std::fs::write(&bad, "define i32 @f( {").unwrap();
    let so = dir.path().join("bad.so");
    let err = dense_relu_export().ir(&bad).write(&so).unwrap_err();
    assert!(matches!(&err, mblob::Error::Input { what, .. } if what.contains("bad.ll")), "{err}");
    assert!(err.to_string().contains("not valid LLVM IR"), "{err}");
    assert!(!so.exists());
}

#[test]
fn tool_failures_are_typed_errors_with_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("out.so");
    let no_partials = || {
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains("partial") && n != "out.so"), "{names:?}");
    };

    // A C source that does not compile: the compile step, the exact command, the compiler's words.
    let bad = dir.path().join("broken.c");
    std::fs::write(&bad, "int broken( {\n").unwrap();
    let err = dense_relu_export().c_source(&bad).write(&so).unwrap_err();
    match &err {
        mblob::Error::Tool { step, command, stderr, status } => {
            assert!(step.starts_with("compile") && step.contains("broken.c"), "{step}");
            assert!(command.contains(" -c ") && command.contains("broken.c") && command.contains("-fPIC"), "{command}");
            assert!(stderr.contains("broken.c") && stderr.contains("error"), "{stderr}");
            assert!(status.contains('1'), "{status}");
        }
        other => panic!("not a tool error: {other}"),
    }
    no_partials();

    // A link that fails: the link step and its command line.
    let err = dense_relu_export().link_arg("-Wl,--no-such-option").write(&so).unwrap_err();
    match &err {
        mblob::Error::Tool { step, command, .. } => {
            assert_eq!(step, "link");
            assert!(command.contains("-shared") && command.contains("--no-such-option"), "{command}");
            assert!(command.contains("graph_dense_relu.lib0.o"), "{command}");
        }
        other => panic!("not a tool error: {other}"),
    }
    no_partials();

    // A driver that does not exist: ToolNotFound, naming it.
    let err = dense_relu_export().driver(dir.path().join("no-such-cc")).write(&so).unwrap_err();
    match &err {
        mblob::Error::ToolNotFound { step, program, .. } => {
            assert_eq!(step, "link");
            assert!(program.ends_with("no-such-cc"), "{program}");
        }
        other => panic!("not ToolNotFound: {other}"),
    }
    no_partials();
}

#[test]
fn both_linkers_give_the_same_blob() {
    let dir = tempfile::tempdir().unwrap();
    let golden = read(&goldens().join("graph_dense_relu.blob"));
    let mut linkers = vec![mblob::link::Linker::Default];
    if mblob::link::find_lld().is_some() {
        linkers.push(mblob::link::Linker::Lld);
    }
    for linker in linkers {
        let so = dir.path().join(format!("{linker:?}.so"));
        dense_relu_export().linker(linker.clone()).write(&so).unwrap();
        assert!(blob_of(&so).unwrap().1 == golden, "{linker:?}");
        let loaded = load(&so);
        let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
        assert_eq!(run_dense_relu(&loaded), want, "{linker:?}");
    }
}

#[test]
fn the_automatic_linker_is_lld_when_installed() {
    use object::{Object, ObjectSection};
    use std::process::Command;
    // lld signs its output in `.comment` (`Linker: Debian LLD 14.0.6`); GNU ld does not.
    let linked_by_lld = |so: &Path| {
        let data = read(so);
        let file = object::File::parse(&*data).unwrap();
        let comment = file.section_by_name(".comment").and_then(|s| s.data().ok().map(<[u8]>::to_vec));
        comment.is_some_and(|c| String::from_utf8_lossy(&c).contains(" LLD "))
    };
    let dir = tempfile::tempdir().unwrap();
    let lld = mblob::link::find_lld().is_some();
    let ld_bfd = Command::new("ld.bfd").arg("--version").output().is_ok_and(|o| o.status.success());
    let mut cases = vec![(mblob::link::Linker::Auto, lld)];
    if ld_bfd {
        cases.push((mblob::link::Linker::Default, false));
    }
    if lld {
        cases.push((mblob::link::Linker::Lld, true));
    }
    for (linker, want_lld) in cases {
        let so = dir.path().join(format!("{linker:?}.so"));
        dense_relu_export().linker(linker.clone()).write(&so).unwrap();
        assert_eq!(linked_by_lld(&so), want_lld, "{linker:?}");
    }
}

#[test]
fn kept_temp_dir_and_emitted_devc_files() {
    let dir = tempfile::tempdir().unwrap();
    let golden = read(&goldens().join("graph_dense_relu.blob"));
    for (i, backend) in backends().into_iter().enumerate() {
        let devc_dir = dir.path().join(format!("devc{i}"));
        let so = dir.path().join("out.so");
        let report = dense_relu_export().backend(backend).keep_temp(true).emit_devc(&devc_dir).write(&so).unwrap();
        let kept = report.kept_temp_dir.clone().expect("kept temp dir reported");
        // The direct route writes no blob object: asked for one, it takes the linked route.
        let backend = backend.resolve(&PackOptions::default(), true);
        let found = |root: &Path, name: &str| {
            let mut stack = vec![root.to_path_buf()];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.file_name().unwrap() == name {
                        return true;
                    }
                }
            }
            false
        };
        assert!(found(&kept, "devc.o"), "{backend:?}: {}", kept.display());
        std::fs::remove_dir_all(&kept).unwrap();
        // The emitted devc object is the one that was linked: the golden blob under its symbol.
        let o = read(&devc_dir.join("devc.o"));
        let b = elf::find_blob(&o, None).unwrap().unwrap();
        assert!(b.bytes(&o).unwrap() == golden, "{backend:?}");
        if backend == Backend::C(CStyle::Tvm) {
            // TVM's own text, byte for byte.
            assert!(read(&devc_dir.join("devc.c")) == read(&goldens().join("graph_dense_relu.devc.c")));
        }
        assert_eq!(devc_dir.join("devc.c").exists(), backend != Backend::Llvm, "{backend:?}");
        if backend != Backend::Llvm {
            // The emitted source compiles by itself, after the export's files are gone.
            let o = devc_dir.join("again.o");
            let cc = std::process::Command::new("cc")
                .args(["-c", "-fPIC", "-o"])
                .arg(&o)
                .arg(devc_dir.join("devc.c"))
                .output()
                .unwrap();
            assert!(cc.status.success(), "{backend:?}: {}", String::from_utf8_lossy(&cc.stderr));
            let o = read(&o);
            assert!(elf::find_blob(&o, None).unwrap().unwrap().bytes(&o).unwrap() == golden, "{backend:?}");
        }
        // Without keep_temp nothing is reported.
        assert!(dense_relu_export().backend(backend).write(&so).unwrap().kept_temp_dir.is_none());
    }
}

#[cfg(not(feature = "llvm"))]
#[test]
fn without_llvm_ir_input_and_llvm_backend_are_feature_errors() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("x.so");
    for e in [
        dense_relu_export().ir(dir.path().join("k.ll")).backend(Backend::C(CStyle::Fast)).write(&so),
        dense_relu_export().backend(Backend::Llvm).write(&so),
    ] {
        let err = e.unwrap_err();
        assert!(matches!(err, mblob::Error::FeatureDisabled { feature: "llvm", .. }), "{err}");
        assert!(err.to_string().contains("--features llvm"), "{err}");
    }
    assert!(!so.exists());
}

/// Host code as LLVM IR text: `int32_t mblob_ir_twice(int32_t x)` returns `2 * x`.
#[cfg(feature = "llvm")]
const TWICE_LL: &str = r#"
define i32 @mblob_ir_twice(i32 %x) {
entry:
  %y = mul i32 %x, 2
  ret i32 %y
}
"#;

#[cfg(feature = "llvm")]
#[test]
fn llvm_ir_text_and_bitcode_are_host_code() {
    let dir = tempfile::tempdir().unwrap();
    let ll = dir.path().join("twice.ll");
    std::fs::write(&ll, TWICE_LL).unwrap();
    // The same module as bitcode, written by LLVM.
    let bc = dir.path().join("thrice.bc");
    {
        let ctx = inkwell::context::Context::create();
        let buf = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(
            TWICE_LL.replace("mblob_ir_twice", "mblob_ir_thrice").replace("mul i32 %x, 2", "mul i32 %x, 3").as_bytes(),
            "thrice",
        );
        let m = ctx.create_module_from_ir(buf).unwrap();
        assert!(m.write_bitcode_to_path(&bc));
    }
    let mut e = Export::new();
    e.ir(&ll).ir(&bc).import(mblob_runtime::RawPayload::new("metadata", vec![1u8, 2, 3]));
    let so = dir.path().join("ir.so");
    e.write(&so).unwrap();
    let loaded = load(&so);
    for (name, factor) in [("mblob_ir_twice", 2), ("mblob_ir_thrice", 3)] {
        let f = loaded.get_function(name).unwrap();
        // SAFETY: defined above as `i32 (i32)`.
        #[allow(unsafe_code)]
        let got = unsafe { std::mem::transmute::<*mut std::ffi::c_void, extern "C" fn(i32) -> i32>(f.addr())(21) };
        assert_eq!(got, 21 * factor);
    }
    // Bad IR is an error that names the file.
    std::fs::write(&ll, "this is not IR").unwrap();
    let err = Export::new().ir(&ll).write(dir.path().join("bad.so")).unwrap_err().to_string();
    assert!(err.contains("twice.ll") && err.contains("not valid LLVM IR"), "{err}");
    assert!(!dir.path().join("bad.so").exists());
}

#[test]
fn tools_keep_their_temporary_files_in_the_export_directory() {
    // A driver that records the TMPDIR it was given, then links as `cc` would.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tmpdir.log");
    let driver = dir.path().join("cc-wrapper");
    std::fs::write(&driver, format!("#!/bin/sh\necho \"$TMPDIR\" >> '{}'\nexec cc \"$@\"\n", log.display())).unwrap();
    std::fs::set_permissions(&driver, std::fs::Permissions::from_mode(0o755)).unwrap();
    let so = dir.path().join("out.so");
    dense_relu_export().driver(&driver).write(&so).unwrap();
    let seen = std::fs::read_to_string(&log).unwrap();
    let seen = Path::new(seen.trim_end());
    let parent = seen.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    assert!(parent.starts_with(&format!("mblob-export-{}-", std::process::id())), "{}", seen.display());
    assert_eq!(seen.file_name().unwrap(), "tools");
    assert!(!seen.exists(), "removed with the intermediate directory");
    assert!(blob_of(&so).unwrap().1 == read(&goldens().join("graph_dense_relu.blob")));
}

/// The scenario of TVM's RFC "Standardize NN Module Exports into a Single DLL": a graph
/// factory root importing the host library, which imports a CUDA module, all in one `.so`.
#[test]
fn rfc_factory_host_and_cuda_in_one_library() {
    use mblob_runtime::format::stream::DataType;
    use mblob_runtime::payload::device::{DeviceModule, FunctionInfo};
    use mblob_runtime::payload::graph::{GraphExecutorFactory, GRAPH_EXECUTOR_FACTORY};

    let dir = tempfile::tempdir().unwrap();
    // TVM's factory (graph JSON and params of graph_dense_relu) and kernels, and TVM 0.27's PTX.
    let golden = read(&goldens().join("graph_dense_relu.blob"));
    let parsed = format::parse_blob(&golden, Layout::Classic, &Registry::default(), UnknownKeys::Error).unwrap();
    let payload = Bytes::from_vec(parsed.entries[0].payload.to_vec());
    let (factory, _) = GraphExecutorFactory::read(&payload, 0, GRAPH_EXECUTOR_FACTORY).unwrap();
    let dev27 = goldens().join("device/tvm-0.27.0.post1");
    let ptx = read(&dev27.join("nvptx_vector_add.dev0.source.txt"));
    let info = FunctionInfo::new(
        "vector_add_kernel",
        vec![DataType::HANDLE; 3],
        vec!["blockIdx.x".into(), "threadIdx.x".into()],
    );
    let expected = TreeShape {
        type_key: GRAPH_EXECUTOR_FACTORY.into(),
        imports: vec![TreeShape {
            type_key: "library".into(),
            imports: vec![TreeShape { type_key: "cuda".into(), imports: vec![] }],
        }],
    };
    let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
    for backend in backends() {
        for layout in [Layout::Classic, Layout::Classic021, Layout::Ffi] {
            let mut e = Export::new();
            e.object(goldens().join("graph_dense_relu.lib0.o")).force_layout(true);
            let host = e.host();
            let root = e.tree_mut().add_payload(factory.clone());
            e.tree_mut().set_root(root).import(root, host);
            e.import(DeviceModule::cuda_from_ptx(ptx.clone(), vec![("vector_add_kernel".into(), info.clone())]));
            let so = dir.path().join(format!("deploy-{backend:?}-{layout:?}.so"));
            e.layout(layout).backend(backend).write(&so).unwrap();

            let loaded = load(&so);
            let what = format!("{backend:?} {layout:?}");
            assert_eq!(loaded.shape(), expected, "{what}");
            let root = loaded.root().as_any().downcast_ref::<GraphExecutorFactory>();
            assert!(root == Some(&factory), "{what}: the root is not the factory that was exported");
            // The CUDA module came back with its PTX and kernel table, whatever loaded it.
            let cuda = &loaded.modules()[2].module;
            let device = cuda.as_any().downcast_ref::<DeviceModule>().cloned().or_else(|| cuda_device(cuda));
            let device = device.unwrap_or_else(|| panic!("{what}: the cuda module is no device module"));
            assert!(device.data.as_ref() == ptx.as_slice(), "{what}");
            assert_eq!(device.function("vector_add_kernel").map(|f| &f.arg_types), Some(&info.arg_types), "{what}");
            // And the host code under the factory computes what TVM's did.
            assert_eq!(run_dense_relu(&loaded), want, "{what}");
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(m: &std::sync::Arc<dyn mblob_runtime::Module>) -> Option<mblob_runtime::payload::device::DeviceModule> {
    m.as_any().downcast_ref::<mblob_runtime::device::cuda::CudaModule>().map(|c| c.device_module().clone())
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_: &std::sync::Arc<dyn mblob_runtime::Module>) -> Option<mblob_runtime::payload::device::DeviceModule> {
    None
}

#[test]
fn modules_that_would_be_left_out_are_refused() {
    use mblob_runtime::RawPayload;
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("out.so");
    let lib0 = goldens().join("graph_dense_relu.lib0.o");

    // Added to the tree, imported by nothing.
    let mut e = Export::new();
    e.object(&lib0);
    e.import(RawPayload::new("example.Used", b"used".to_vec()));
    e.tree_mut().add_payload(RawPayload::new("example.Orphan", b"lost".to_vec()));
    let err = e.write(&so).unwrap_err().to_string();
    assert!(err.contains("module 2 (`example.Orphan`) is not imported"), "{err}");

    // A payload root that imports nothing: TVM writes no blob for it.
    let mut tree = mblob_runtime::ModuleTree::new();
    tree.add_payload(RawPayload::new("example.Alone", b"alone".to_vec()));
    let mut e = Export::from_tree(tree);
    e.object(&lib0);
    let err = e.write(&so).unwrap_err().to_string();
    assert!(err.contains("the root `example.Alone` imports nothing"), "{err}");

    // Neither left anything behind.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn progress_reports_each_stage_and_the_bytes_packed() {
    use mblob::export::Progress;
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let payload = vec![5u8; Progress::REPORTED_BLOB as usize];
    // (TVM's C text writes through the same reporting blob source, but takes gcc half a minute
    // to compile at this size.)
    for backend in backends().into_iter().filter(|b| *b != Backend::C(CStyle::Tvm)) {
        let events: Arc<Mutex<Vec<String>>> = Arc::default();
        let packed: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let mut e = Export::new();
        e.object(goldens().join("graph_dense_relu.lib0.o"));
        e.import(mblob_runtime::RawPayload::new("example.Big", payload.clone()));
        let (ev, pk) = (events.clone(), packed.clone());
        e.backend(backend).progress(move |p| match p {
            Progress::Packed { done, total } => pk.lock().unwrap().push((done, total)),
            Progress::Started { stage } => ev.lock().unwrap().push(format!("start {stage}")),
            Progress::Finished { stage, .. } => ev.lock().unwrap().push(format!("end {stage}")),
            _ => {}
        });
        let report = e.write(dir.path().join("big.so")).unwrap();
        let events = events.lock().unwrap().clone();
        // The direct route writes the blob into the linked library: after the link.
        let order =
            if backend == Backend::Direct { ["serialize", "link", "pack"] } else { ["serialize", "pack", "link"] };
        let want = order.iter().flat_map(|s| [format!("start {s}"), format!("end {s}")]);
        assert_eq!(events, want.collect::<Vec<_>>(), "{backend:?}");
        // About once per 1 %, rising, ending at the whole blob.
        let packed = packed.lock().unwrap().clone();
        assert!((90..=110).contains(&packed.len()), "{backend:?}: {} reports", packed.len());
        assert!(packed.windows(2).all(|w| w[0].0 < w[1].0), "{backend:?}");
        assert!(packed.iter().all(|&(_, total)| total == report.blob_len), "{backend:?}");
        assert_eq!(packed.last().map(|p| p.0), Some(report.blob_len), "{backend:?}");
        // Shown as one line each.
        let line = Progress::Packed { done: report.blob_len / 2, total: report.blob_len }.to_string();
        assert_eq!(line, "pack: 8.0 MiB of 16.0 MiB (49 %)", "{backend:?}");
    }
}
