//! mblob and another provider of TVM's runtime names in one process (issue 22).
//!
//! TVM, tvm-ffi (which also ships inside other Python packages) or a program of one's own may
//! define `TVMFFIFunctionCall`, `TVMBackendAllocWorkspace`, ... globally. mblob binds the
//! imports of the libraries it loads privately (see `runtime/src/ffi/shim.rs`), so in either
//! order both keep working. A stand-in library that defines the same 13 names, each with its
//! own answer, plays the other provider; it is built here with the system C compiler.
//!
//! Each scenario runs in a child process (this test binary, run again with one test selected),
//! so that the stand-in, loaded `RTLD_GLOBAL`, never reaches the other tests.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::ffi::dlpack::DLTensor;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{load_library, Device, DeviceType, LibraryModule, LoadOptions, LoadedTree, Module, Registry};

#[path = "support/npyfile.rs"]
mod npyfile;
use npyfile::tensor as npy;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::HostCalls;

const CPU: Device = Device { device_type: DeviceType::Cpu, device_id: 0 };

/// The names mblob's shim provides (`shim::PROVIDED`), which the stand-in defines too.
const NAMES: [&str; 13] = [
    "TVMFFIErrorSetRaisedFromCStrParts",
    "TVMFFIErrorSetRaisedFromCStr",
    "TVMAPISetLastError",
    "TVMBackendAllocWorkspace",
    "TVMBackendFreeWorkspace",
    "TVMBackendParallelLaunch",
    "TVMBackendParallelBarrier",
    "TVMBackendGetFuncFromEnv",
    "TVMFuncCall",
    "TVMFFIFunctionCall",
    "TVMFFIEnvModLookupFromImports",
    "TVMFFIHandleInitOnce",
    "TVMBackendRegisterSystemLibSymbol",
];

/// The stand-in: every function counts its calls; those that return an `int` return 7000 + its
/// index, the allocator returns the address 0x57a4d0.
const STANDIN_C: &str = r#"
#include <stdint.h>
static int calls[13];
int standin_calls(int i) { return (i >= 0 && i < 13) ? calls[i] : -1; }
void TVMFFIErrorSetRaisedFromCStrParts(const char* k, const char** p, int32_t n) { calls[0]++; }
void TVMFFIErrorSetRaisedFromCStr(const char* k, const char* m) { calls[1]++; }
void TVMAPISetLastError(const char* m) { calls[2]++; }
void* TVMBackendAllocWorkspace(int t, int d, uint64_t n, int c, int b) { calls[3]++; return (void*)0x57a4d0; }
int TVMBackendFreeWorkspace(int t, int d, void* p) { calls[4]++; return 7004; }
int TVMBackendParallelLaunch(void* l, void* c, int n) { calls[5]++; return 7005; }
int TVMBackendParallelBarrier(int t, void* e) { calls[6]++; return 7006; }
int TVMBackendGetFuncFromEnv(void* m, const char* n, void** o) { calls[7]++; return 7007; }
int TVMFuncCall(void* h, void* v, int* c, int n, void* r, int* rc) { calls[8]++; return 7008; }
int TVMFFIFunctionCall(void* h, const void* a, int32_t n, void* r) { calls[9]++; return 7009; }
int TVMFFIEnvModLookupFromImports(void* c, const char* n, void** o) { calls[10]++; return 7010; }
int TVMFFIHandleInitOnce(void** h, int (*f)(void**)) { calls[11]++; return 7011; }
int TVMBackendRegisterSystemLibSymbol(const char* n, void* p) { calls[12]++; return 7012; }
"#;

/// A library that calls the 13 names through its PLT (no `DT_NEEDED`: they bind to whatever is
/// global), as TVM's own extension does; returns how many answers were the stand-in's.
const USER_C: &str = r#"
#include <stdint.h>
void TVMFFIErrorSetRaisedFromCStrParts(const char*, const char**, int32_t);
void TVMFFIErrorSetRaisedFromCStr(const char*, const char*);
void TVMAPISetLastError(const char*);
void* TVMBackendAllocWorkspace(int, int, uint64_t, int, int);
int TVMBackendFreeWorkspace(int, int, void*);
int TVMBackendParallelLaunch(void*, void*, int);
int TVMBackendParallelBarrier(int, void*);
int TVMBackendGetFuncFromEnv(void*, const char*, void**);
int TVMFuncCall(void*, void*, int*, int, void*, int*);
int TVMFFIFunctionCall(void*, const void*, int32_t, void*);
int TVMFFIEnvModLookupFromImports(void*, const char*, void**);
int TVMFFIHandleInitOnce(void**, int (*)(void**));
int TVMBackendRegisterSystemLibSymbol(const char*, void*);
int standin_calls(int);
int user_probe(void) {
  int ok = 0, before[3];
  for (int i = 0; i < 3; i++) before[i] = standin_calls(i);
  TVMFFIErrorSetRaisedFromCStrParts("E", 0, 0);
  TVMFFIErrorSetRaisedFromCStr("E", "m");
  TVMAPISetLastError("m");
  for (int i = 0; i < 3; i++) ok += standin_calls(i) == before[i] + 1;
  ok += TVMBackendAllocWorkspace(1, 0, 8, 2, 32) == (void*)0x57a4d0;
  ok += TVMBackendFreeWorkspace(1, 0, 0) == 7004;
  ok += TVMBackendParallelLaunch(0, 0, 1) == 7005;
  ok += TVMBackendParallelBarrier(0, 0) == 7006;
  ok += TVMBackendGetFuncFromEnv(0, "f", 0) == 7007;
  ok += TVMFuncCall(0, 0, 0, 0, 0, 0) == 7008;
  ok += TVMFFIFunctionCall(0, 0, 0, 0) == 7009;
  ok += TVMFFIEnvModLookupFromImports(0, "f", 0) == 7010;
  ok += TVMFFIHandleInitOnce(0, 0) == 7011;
  ok += TVMBackendRegisterSystemLibSymbol("f", 0) == 7012;
  return ok;
}
"#;

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// glibc's `Dl_info`.
#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

const RTLD_NOW: c_int = 2;
const RTLD_NOLOAD: c_int = 4;
const RTLD_GLOBAL: c_int = 0x100;
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

/// The environment variable that selects a scenario in the child.
const CHILD: &str = "MBLOB_PEACE_CHILD";

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens")
}

fn relax_027() -> PathBuf {
    goldens().join("relax/tvm-0.27")
}

/// Builds the stand-in and its user into a fresh directory, or `None` (with a message) when
/// there is no C compiler.
fn build_c_libraries(test: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::temp_dir().join(format!("mblob-peace-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let build = |name: &str, source: &str| -> Option<PathBuf> {
        let src = dir.join(format!("{name}.c"));
        let so = dir.join(format!("lib{name}.so"));
        std::fs::write(&src, source).unwrap();
        match Command::new(&cc).args(["-shared", "-fPIC", "-O1", "-o"]).arg(&so).arg(&src).status() {
            Ok(s) if s.success() => Some(so),
            Ok(s) => panic!("{cc} failed on {}: {s}", src.display()),
            Err(e) => {
                eprintln!("SKIPPED: no C compiler ({cc}: {e}), so no stand-in library can be built");
                None
            }
        }
    };
    Some((build("standin", STANDIN_C)?, build("standin_user", USER_C)?))
}

/// Runs `test` of this binary in a child process, with the stand-in's paths.
fn in_child(test: &str) {
    let Some((standin, user)) = build_c_libraries(test) else { return };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .env("MBLOB_PEACE_STANDIN", &standin)
        .env("MBLOB_PEACE_USER", &user)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(standin.parent().unwrap());
    assert!(out.status.success(), "child {test} failed ({}):\n{text}", out.status);
    assert!(text.contains(&format!("scenario {test} done")), "child {test} ran no scenario:\n{text}");
}

/// Whether this process is the child that runs `test`.
fn is_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message, copied at once.
    let p = unsafe { dlerror() };
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The stand-in as the other provider: opened `RTLD_GLOBAL`.
struct StandIn {
    handle: *mut c_void,
    user: *mut c_void,
}

impl StandIn {
    fn load() -> StandIn {
        let standin = c(&std::env::var("MBLOB_PEACE_STANDIN").unwrap());
        // SAFETY: the stand-in built above; it has no initialisers.
        let handle = unsafe { dlopen(standin.as_ptr(), RTLD_NOW | RTLD_GLOBAL) };
        assert!(!handle.is_null(), "stand-in: {}", dl_error());
        let user = c(&std::env::var("MBLOB_PEACE_USER").unwrap());
        // SAFETY: as above; its imports bind to what is global (the stand-in).
        let user = unsafe { dlopen(user.as_ptr(), RTLD_NOW) };
        assert!(!user.is_null(), "stand-in user: {}", dl_error());
        StandIn { handle, user }
    }

    fn calls(&self, i: c_int) -> c_int {
        let name = c("standin_calls");
        // SAFETY: `standin_calls` is the stand-in's `int standin_calls(int)`.
        let f: extern "C" fn(c_int) -> c_int = unsafe { std::mem::transmute(dlsym(self.handle, name.as_ptr())) };
        f(i)
    }

    /// The process-wide names are the stand-in's, and a library calling them through its PLT
    /// gets the stand-in's answers for all 13.
    fn check_it_owns_the_names(&self) {
        for name in NAMES {
            let n = c(name);
            // SAFETY: lookups of addresses only.
            let (global, own) = unsafe { (dlsym(RTLD_DEFAULT, n.as_ptr()), dlsym(self.handle, n.as_ptr())) };
            assert!(!own.is_null(), "{name}");
            assert_eq!(global, own, "dlsym(RTLD_DEFAULT, {name}) is not the stand-in's");
        }
        let probe = c("user_probe");
        // SAFETY: `user_probe` is `int user_probe(void)`, which calls only the stand-in.
        let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(dlsym(self.user, probe.as_ptr())) };
        assert_eq!(f(), 13, "the stand-in user did not reach the stand-in's 13 definitions");
    }
}

fn load(path: &Path) -> LoadedTree {
    // SAFETY: the goldens are libraries TVM built for these tests.
    unsafe { load_library(path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Loads TVM 0.27 model `name` (it imports `TVMFFIErrorSetRaisedFromCStrParts`), runs each of
/// TVM's runs with the Relax VM and compares with TVM's outputs bit for bit; returns the tree.
fn run_model(name: &str) -> LoadedTree {
    let dir = relax_027();
    let so = dir.join(format!("{name}.so"));
    let tree = load(&so);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let vm = VirtualMachine::new(&tree, CPU).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (k, run) in meta["runs"].as_array().unwrap().iter().enumerate() {
        let inputs: Vec<Tensor> =
            run["inputs"].as_array().unwrap().iter().map(|i| npy(&dir.join(i["file"].as_str().unwrap()))).collect();
        let outs = vm.call_tensors("main", &inputs).unwrap_or_else(|e| panic!("{name} run {k}: {e}"));
        let want = run["outputs"].as_array().unwrap();
        assert_eq!(outs.len(), want.len(), "{name} run {k}");
        for (o, w) in outs.iter().zip(want) {
            let w = npy(&dir.join(w["file"].as_str().unwrap()));
            assert_eq!((&o.shape, o.dtype), (&w.shape, w.dtype), "{name} run {k}");
            assert!(o.data[..] == w.data[..], "{name} run {k}: output differs from TVM's");
        }
    }
    tree
}

/// Calls `relax_fused`'s kernel `sum` (x: 2x3x4 -> 2x3) with x of shape 2x3x5: its own argument
/// check fails and calls `TVMFFIErrorSetRaisedFromCStrParts` through its PLT. The message must
/// come back through mblob.
fn kernel_shape_error(tree: &LoadedTree) -> String {
    let lib = tree.find::<LibraryModule>().expect("a library module");
    let sum = lib.get_function("sum").expect("relax_fused has the kernel `sum`");
    let mut x = vec![0f32; 30];
    let mut x_shape = [2i64, 3, 5];
    let mut out = vec![0f32; 6];
    let mut out_shape = [2i64, 3];
    let mut args = [DLTensor::f32(&mut x, &mut x_shape), DLTensor::f32(&mut out, &mut out_shape)];
    // SAFETY: valid CPU float32 tensors; the kernel refuses the shape before reading data.
    let err = unsafe { sum.call_tensors(&mut args) }.expect_err("the wrong shape must be refused");
    assert_ne!(err.code, 0);
    // TVM's message, as the kernel's check assembles it.
    assert!(
        err.message.starts_with("ValueError: Invalid x.shape[2] on argument #0") && err.message.contains("expected 4"),
        "not the kernel's message: {}",
        err.message
    );
    err.message
}

/// The file that holds `addr`.
fn owner_file(addr: *const c_void) -> String {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only looks the address up and fills `info`.
    if unsafe { dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated file name owned by the loader.
    unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
}

/// A classic TVM 0.19 library (no import; its `__TVMAPISetLastError` pointer slot) loaded by
/// mblob: the slot holds mblob's own function (in this test binary), never a global
/// `TVMAPISetLastError` such as the stand-in's.
fn check_classic_slot() {
    let tree = load(&goldens().join("other_versions/tvm-0.19.0/relax_add_mul.so"));
    let lib = tree.find::<LibraryModule>().unwrap();
    let slot = lib.get_function("__TVMAPISetLastError").expect("a TVM 0.19 library has the slot").addr();
    // SAFETY: the slot is a pointer-sized data symbol of the loaded library.
    let value = unsafe { *slot.cast::<*const c_void>() };
    assert!(!value.is_null(), "the slot was not filled");
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let owner = std::fs::canonicalize(owner_file(value)).unwrap_or_default();
    assert_eq!(owner, exe, "__TVMAPISetLastError points outside mblob");
    let name = c("TVMAPISetLastError");
    // SAFETY: an address lookup only.
    let global = unsafe { dlsym(RTLD_DEFAULT, name.as_ptr()) };
    assert_ne!(value.cast_mut(), global, "the slot was filled through the global name");
}

/// A library mblob opened privately is not in the main namespace.
fn check_not_in_main_namespace(path: &Path) {
    let p = c(path.to_str().unwrap());
    // SAFETY: RTLD_NOLOAD opens nothing; it only looks for an already loaded object.
    let h = unsafe { dlopen(p.as_ptr(), RTLD_NOW | RTLD_NOLOAD) };
    assert!(h.is_null(), "{} is in the main namespace", path.display());
}

/// mblob first: it loads and runs a TVM 0.27 model; then the stand-in, loaded `RTLD_GLOBAL`,
/// owns the names and its user reaches it; then mblob still runs models (loaded before and
/// after) with TVM's outputs, and a kernel's argument-check error still comes back through
/// mblob, never to the stand-in.
#[test]
fn mblob_then_other_provider() {
    const ME: &str = "mblob_then_other_provider";
    if !is_child(ME) {
        return in_child(ME);
    }
    let fused = run_model("relax_fused");
    let before = kernel_shape_error(&fused);
    check_not_in_main_namespace(&relax_027().join("relax_fused.so"));

    let standin = StandIn::load();
    standin.check_it_owns_the_names();
    let errors_before = standin.calls(0);

    run_model("relax_branch");
    drop(run_model("relax_fused"));
    let vm = VirtualMachine::new(&fused, CPU).unwrap();
    let dir = relax_027();
    let out = vm.call_tensors(
        "main",
        &[npy(&dir.join("relax_fused.run0.in.x.npy")), npy(&dir.join("relax_fused.run0.in.y.npy"))],
    );
    assert!(out.unwrap()[1].data == npy(&dir.join("relax_fused.run0.out.1.npy")).data);
    assert_eq!(kernel_shape_error(&fused), before);
    assert_eq!(standin.calls(0), errors_before, "the model's error went to the stand-in");
    check_classic_slot();
    standin.check_it_owns_the_names();
    println!("scenario {ME} done");
}

/// The other provider first (as when `import tvm` came before mblob): mblob loads and runs
/// the models with TVM's outputs and gets their errors, and the stand-in keeps its names.
#[test]
fn other_provider_then_mblob() {
    const ME: &str = "other_provider_then_mblob";
    if !is_child(ME) {
        return in_child(ME);
    }
    let standin = StandIn::load();
    standin.check_it_owns_the_names();
    let errors_before = standin.calls(0);
    let fused = run_model("relax_fused");
    run_model("relax_two_functions");
    kernel_shape_error(&fused);
    assert_eq!(standin.calls(0), errors_before, "the model's error went to the stand-in");
    check_not_in_main_namespace(&relax_027().join("relax_fused.so"));
    check_classic_slot();
    standin.check_it_owns_the_names();
    println!("scenario {ME} done");
}

/// With no other provider: after mblob has loaded and run models (one that imports the names,
/// one with pointer slots), none of the 13 names is visible process-wide.
#[test]
fn mblob_exports_no_tvm_names() {
    const ME: &str = "mblob_exports_no_tvm_names";
    if !is_child(ME) {
        return in_child(ME);
    }
    let fused = run_model("relax_fused");
    kernel_shape_error(&fused);
    check_classic_slot();
    for name in NAMES {
        let n = c(name);
        // SAFETY: an address lookup only.
        let global = unsafe { dlsym(RTLD_DEFAULT, n.as_ptr()) };
        assert!(global.is_null(), "{name} is global in the process ({})", owner_file(global));
    }
    println!("scenario {ME} done");
}
