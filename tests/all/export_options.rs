//! Host sources as a build system compiles them: compiler options (`Export::compiler`, `flag`,
//! `include`, `define`, the CLI's `--cc`, `--cflag`, `-I`, `-D`, `CFLAGS`), C++ sources that
//! load in a process that is not mblob's, and exports on several threads at once.

use std::ffi::{CString, OsStr};
use std::os::raw::c_void;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use mblob::export::Export;
use mblob_runtime::RawPayload;

/// A library opened with `dlopen`, for calling the plain C functions of host sources.
pub struct Lib(*mut c_void);

#[allow(unsafe_code)]
impl Lib {
    /// Opens `path` (any bytes), now and locally.
    pub fn open(path: &Path) -> Lib {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: the libraries opened here are built by these tests from their own sources,
        // whose initializers only register C++ runtime state.
        let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", path.display());
        Lib(h)
    }

    /// The function `name`, which the tests define as `int name(void)`.
    pub fn function(&self, name: &str) -> extern "C" fn() -> i32 {
        let n = CString::new(name).unwrap();
        // SAFETY: `self.0` is a live handle from dlopen; dlsym only looks the name up.
        let p = unsafe { libc::dlsym(self.0, n.as_ptr()) };
        assert!(!p.is_null(), "no symbol {name}");
        // SAFETY: every function looked up here is defined by these tests as `int name(void)`;
        // the library stays open while the test holds `self`.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> i32>(p) }
    }
}

#[allow(unsafe_code)]
impl Drop for Lib {
    fn drop(&mut self) {
        // SAFETY: no function pointer taken from the library is used after the test drops it.
        unsafe { libc::dlclose(self.0) };
    }
}

/// Loads a library these tests exported, with the payload kinds mblob does not know kept.
#[allow(unsafe_code)]
pub fn load(so: &Path) -> mblob_runtime::LoadedTree {
    let (registry, options) = (mblob_runtime::Registry::default(), mblob_runtime::LoadOptions::keep_unknown());
    // SAFETY: libraries exported by these tests from their own C sources.
    unsafe { mblob_runtime::load_library(so, &registry, &options) }.unwrap_or_else(|e| panic!("{}: {e}", so.display()))
}

const HOST_C: &str = r#"
#include "config.h"
int value(void) { return VALUE; }
int from_header(void) { return HEADER_VALUE; }
int optimised(void) {
#ifdef __OPTIMIZE__
    return 1;
#else
    return 0;
#endif
}
int extra(void) {
#ifdef EXTRA
    return EXTRA;
#else
    return -1;
#endif
}
"#;

/// `host.c` and its header in `include/config.h`.
fn host_source(dir: &Path) -> (PathBuf, PathBuf) {
    let include = dir.join("include");
    std::fs::create_dir_all(&include).unwrap();
    std::fs::write(include.join("config.h"), "#define HEADER_VALUE 17\n").unwrap();
    let src = dir.join("host.c");
    std::fs::write(&src, HOST_C).unwrap();
    (src, include)
}

fn export_with_payload() -> Export {
    let mut e = Export::new();
    e.import(RawPayload::new("x.Opaque", vec![1u8, 2, 3]));
    e
}

#[test]
fn compiler_options_reach_the_compiler() {
    let dir = tempfile::tempdir().unwrap();
    let (src, include) = host_source(dir.path());
    // Without the include directory the header is not found: the compile step fails.
    let so = dir.path().join("no-include.so");
    let err = export_with_payload().c_source(&src).define("VALUE", Some("1")).write(&so).unwrap_err().to_string();
    assert!(err.contains("config.h"), "{err}");

    for (value, extra) in [("42", None), ("-3", Some("5"))] {
        let so = dir.path().join(format!("v{value}.so"));
        let mut e = export_with_payload();
        e.c_source(&src).include(&include).define("VALUE", Some(value));
        if let Some(x) = extra {
            e.flag(format!("-DEXTRA={x}"));
        }
        e.write(&so).unwrap();
        let lib = Lib::open(&so);
        assert_eq!(lib.function("value")(), value.parse::<i32>().unwrap());
        assert_eq!(lib.function("from_header")(), 17);
        assert_eq!(lib.function("optimised")(), 1, "the default build is optimised");
        assert_eq!(lib.function("extra")(), extra.map_or(-1, |x| x.parse().unwrap()));
    }
    // A flag given last wins over the default optimisation.
    let so = dir.path().join("o0.so");
    export_with_payload().c_source(&src).include(&include).define("VALUE", Some("0")).flag("-O0").write(&so).unwrap();
    assert_eq!(Lib::open(&so).function("optimised")(), 0);
}

#[test]
fn the_command_line_passes_compiler_options_and_cflags() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    host_source(dir.path());
    std::fs::write(dir.path().join("payload.bin"), b"opaque").unwrap();
    let tree = serde_json::json!({"type_key": "llvm", "sources": ["host.c"],
                                  "imports": [{"type_key": "x.Opaque", "payload": "payload.bin"}]});
    let json = dir.path().join("tree.json");
    std::fs::write(&json, tree.to_string()).unwrap();
    // A compiler wrapper that notes each run, to show that --cc is the compiler used.
    let log = dir.path().join("cc.log");
    let wrapper = dir.path().join("my-cc");
    std::fs::write(&wrapper, format!("#!/bin/sh\necho \"$@\" >> '{}'\nexec cc \"$@\"\n", log.display())).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let so = dir.path().join("out.so");
    let include = dir.path().join("include");
    let out = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .args([OsStr::new("export"), json.as_os_str(), OsStr::new("-o"), so.as_os_str(), OsStr::new("-q")])
        .args([OsStr::new("--cc"), wrapper.as_os_str(), OsStr::new("-I"), include.as_os_str()])
        .args(["-D", "VALUE=42", "--cflag", "-DEXTRA=8", "--define", "UNUSED"])
        .env("TMPDIR", tmp.path())
        .env("CFLAGS", "-O0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lib = Lib::open(&so);
    assert_eq!((lib.function("value")(), lib.function("from_header")(), lib.function("extra")()), (42, 17, 8));
    // CFLAGS come last: its -O0 wins over mblob's -O2.
    assert_eq!(lib.function("optimised")(), 0);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("host.c") && logged.contains("-DVALUE=42") && logged.contains("-DUNUSED"), "{logged}");
}

const HOST_CC: &str = r#"
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

static int parse(const std::string& s) {
    if (s.empty()) throw std::invalid_argument("empty");
    return std::stoi(s);
}

extern "C" int cxx_value(void) {
    std::ostringstream out;
    out << 40 + 2;
    try {
        parse("");
        return -1;
    } catch (const std::invalid_argument&) {
        return parse(out.str());
    }
}

extern "C" int cxx_print(void) {
    std::cout << "hello from C++" << std::endl;
    return 0;
}
"#;

#[test]
fn cpp_sources_load_in_a_process_that_is_not_mblobs() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("host.cc");
    std::fs::write(&src, HOST_CC).unwrap();
    let so = dir.path().join("cxx.so");
    export_with_payload().c_source(&src).write(&so).unwrap();
    // Python has no libstdc++ loaded: the library must bring it.
    let script = "import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nprint(lib.cxx_value())\nlib.cxx_print()\n";
    let out = Command::new("python3").arg("-c").arg(script).arg(&so).output().expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["42", "hello from C++"], "{stdout}");
}

#[test]
fn exports_run_on_several_threads_at_once() {
    fn assert_send<T: Send>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let (src, include) = host_source(dir.path());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let mut e = export_with_payload();
            e.c_source(&src).include(&include).define("VALUE", Some(&(100 + t).to_string()));
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = seen.clone();
            e.progress(move |p| log.lock().unwrap().push(p.to_string()));
            assert_send(&e);
            let so = dir.path().join(format!("t{t}.so"));
            // The export itself moves to the worker.
            std::thread::spawn(move || {
                e.write(&so).unwrap();
                (so, seen)
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let (so, seen) = h.join().unwrap();
        assert_eq!(Lib::open(&so).function("value")(), 100 + t as i32);
        let seen = seen.lock().unwrap();
        assert!(seen.iter().any(|l| l.starts_with("link: ")), "{seen:?}");
        let loaded = load(&so);
        assert_eq!(loaded.type_keys(), ["library", "x.Opaque"]);
    }
}
