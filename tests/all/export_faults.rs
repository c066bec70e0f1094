//! `mblob export` where things go wrong: paths that are not UTF-8, work directories of exports
//! in other PID namespaces, signals, and mistakes in the paths a user gives.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mblob::export::Export;
use mblob_runtime::Layout;

use crate::goldens::goldens;

fn mblob(args: &[&OsStr], tmpdir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).env("TMPDIR", tmpdir).output().expect("run mblob")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A tree of one opaque payload of `len` bytes below the host library, with the given host
/// fields (`sources`, `objects`, `ir`).
fn tree(dir: &Path, len: usize, host: serde_json::Value) -> PathBuf {
    std::fs::write(dir.join("payload.bin"), vec![0x5a; len]).unwrap();
    let mut root =
        serde_json::json!({"type_key": "llvm", "imports": [{"type_key": "x.Opaque", "payload": "payload.bin"}]});
    if let serde_json::Value::Object(fields) = host {
        root.as_object_mut().unwrap().extend(fields);
    }
    let json = dir.join("tree.json");
    std::fs::write(&json, root.to_string()).unwrap();
    json
}

fn backends() -> Vec<&'static str> {
    if cfg!(feature = "llvm") {
        vec!["llvm", "c", "c-tvm"]
    } else {
        vec!["c", "c-tvm"]
    }
}

#[test]
fn a_temporary_directory_that_is_not_utf8_works() {
    // LLVM takes UTF-8 file names only; inkwell panicked (exit 101) on such a TMPDIR.
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join(OsStr::from_bytes(b"tmp-\xff\xfe"));
    std::fs::create_dir(&tmp).unwrap();
    std::fs::write(dir.path().join("host.c"), "int host_value(void) { return 7; }\n").unwrap();
    let json = tree(dir.path(), 1000, serde_json::json!({"sources": ["host.c"]}));
    for backend in backends() {
        let so = dir.path().join(format!("out-{backend}.so"));
        let out =
            mblob(&[os("export"), json.as_os_str(), os("-o"), so.as_os_str(), os("--backend"), os(backend)], &tmp);
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", stderr(&out));
        let loaded = crate::export_options::load(&so);
        assert_eq!(loaded.type_keys(), ["library", "x.Opaque"], "{backend}");
        assert_eq!(crate::export_options::Lib::open(&so).function("host_value")(), 7);
        assert!(entries(&tmp).is_empty(), "{backend}: {:?}", entries(&tmp));
    }
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_ir_at_a_path_that_is_not_utf8_is_host_code() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join(OsStr::from_bytes(b"ir-\xff"));
    std::fs::create_dir(&sub).unwrap();
    let ll = sub.join(OsStr::from_bytes(b"k\xfe.ll"));
    std::fs::write(&ll, "define i32 @from_odd_path() {\n  ret i32 44\n}\n").unwrap();
    let so = sub.join(OsStr::from_bytes(b"out-\xfd.so"));
    let mut e = Export::new();
    e.ir(&ll);
    e.write(&so).unwrap();
    assert_eq!(crate::export_options::Lib::open(&so).function("from_odd_path")(), 44);
}

/// The id of a process that has exited (and been reaped).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A work directory as a live export in another PID namespace holds it: named with a process
/// id that is not alive here, its lock file locked by this process.
fn held_work_dir(path: &Path) -> std::fs::File {
    std::fs::create_dir(path).unwrap();
    std::fs::write(path.join("devc.c"), b"work in progress").unwrap();
    let lock = std::fs::File::create(path.join(".mblob-lock")).unwrap();
    fs4::FileExt::try_lock(&lock).unwrap();
    lock
}

#[test]
fn the_sweep_leaves_work_that_a_live_export_holds() {
    // The sweep took "no /proc/<pid>" as "dead", which is false across PID namespaces that
    // share /tmp: it deleted a live export's files. A held lock is the liveness test now.
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let json = tree(dir.path(), 100, serde_json::json!({}));
    let pid = dead_pid();
    let live_tmp = tmp.path().join(format!("mblob-export-{pid}-0"));
    let live_partial = dir.path().join(format!(".out.so.partial-{pid}-0"));
    let _locks = (held_work_dir(&live_tmp), held_work_dir(&live_partial));
    // Left by a killed export: the same names, nobody holds the lock.
    let dead_tmp = tmp.path().join(format!("mblob-export-{pid}-1"));
    let dead_partial = dir.path().join(format!(".out.so.partial-{pid}-1"));
    for d in [&dead_tmp, &dead_partial] {
        drop(held_work_dir(d));
    }
    let so = dir.path().join("out.so");
    let out = mblob(&[os("export"), json.as_os_str(), os("-o"), so.as_os_str(), os("--backend"), os("c")], tmp.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(live_tmp.join("devc.c").exists() && live_partial.join("devc.c").exists(), "live work was removed");
    assert!(!dead_tmp.exists() && !dead_partial.exists(), "dead work was kept");
}

/// Processes whose command line mentions `needle` (compilers working in a directory).
fn processes_mentioning(needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if cmdline.windows(needle.len()).any(|w| w == needle) {
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

/// `mblob export JSON -o SO --backend BACKEND` with its own `TMPDIR` and debug logs, running;
/// its stderr as lines.
fn spawn_export(
    json: &Path,
    so: &Path,
    backend: &str,
    tmpdir: &Path,
) -> (std::process::Child, std::io::Lines<std::io::BufReader<std::process::ChildStderr>>) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_mblob"))
        .args([os("export"), json.as_os_str(), os("-o"), so.as_os_str(), os("--backend"), os(backend)])
        .env("TMPDIR", tmpdir)
        .env("MBLOB_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    (child, lines)
}

#[test]
fn sigint_and_sigterm_remove_what_the_export_wrote_and_kill_the_compiler() {
    let dir = tempfile::tempdir().unwrap();
    // 16 MiB as TVM's C text: the compiler takes many seconds on it.
    let json = tree(dir.path(), 16 << 20, serde_json::json!({}));
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let tmp = tempfile::tempdir().unwrap();
        let so = dir.path().join("big.so");
        let (mut child, mut lines) = spawn_export(&json, &so, "c-tvm", tmp.path());
        let compiling = lines.by_ref().map_while(Result::ok).any(|l| l.contains("running step=\"compile"));
        assert!(compiling, "{signal}: the compile stage never began");
        // The compiler is running, with the export's C source.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!processes_mentioning(tmp.path().as_os_str().as_bytes()).is_empty(), "no compiler seen running");
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: signals our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "{signal}: still running 20 s after the signal");
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        assert_eq!(status.code(), Some(code), "{signal}: {rest:?}");
        assert!(rest.iter().any(|l| l.contains("cancelled")), "{signal}: {rest:?}");
        assert!(!so.exists());
        assert_eq!(entries(dir.path()), ["payload.bin", "tree.json"], "{signal}: partial files left");
        assert!(entries(tmp.path()).is_empty(), "{signal}: left in TMPDIR: {:?}", entries(tmp.path()));
        // Killed with the export: at most a moment for the kernel to finish them off.
        let start = Instant::now();
        while !processes_mentioning(tmp.path().as_os_str().as_bytes()).is_empty() && start.elapsed().as_secs() < 1 {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(processes_mentioning(tmp.path().as_os_str().as_bytes()), Vec::<String>::new(), "{signal}: orphans");
    }
}

#[test]
fn sigint_while_the_blob_is_written_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let json = tree(dir.path(), 192 << 20, serde_json::json!({}));
    for backend in backends().into_iter().filter(|b| *b != "c-tvm") {
        let tmp = tempfile::tempdir().unwrap();
        let so = dir.path().join("big.so");
        let (mut child, mut lines) = spawn_export(&json, &so, backend, tmp.path());
        let packing = lines.by_ref().map_while(Result::ok).any(|l| l.contains("stage{stage=\"pack\"}: started"));
        assert!(packing, "{backend}: the pack stage never began");
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: signals our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let status = child.wait().unwrap();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        assert_eq!(status.code(), Some(130), "{backend}: {rest:?}");
        // Stopped while writing the blob (192 MiB take far longer than the signal to arrive).
        assert!(rest.iter().any(|l| l.contains("cancelled during pack")), "{backend}: {rest:?}");
        assert!(!so.exists(), "{backend}");
        assert_eq!(entries(dir.path()), ["payload.bin", "tree.json"], "{backend}: partial files left");
        assert!(entries(tmp.path()).is_empty(), "{backend}: left in TMPDIR: {:?}", entries(tmp.path()));
    }
}

#[test]
fn output_paths_are_checked_before_any_work_and_named_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // A source that would fail to compile: an error about the output shows the check came first.
    std::fs::write(dir.path().join("host.c"), "int broken( {").unwrap();
    let json = tree(dir.path(), 100, serde_json::json!({"sources": ["host.c"]}));

    // An existing directory.
    let out_dir = dir.path().join("models");
    std::fs::create_dir(&out_dir).unwrap();
    let out = mblob(&[os("export"), json.as_os_str(), os("-o"), out_dir.as_os_str()], tmp.path());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&*out_dir.to_string_lossy()) && err.contains("is a directory"), "{err}");
    assert!(!err.contains("compile"), "{err}");
    assert!(entries(&out_dir).is_empty() && entries(tmp.path()).is_empty());

    // A directory that does not exist: the user's path, not the hidden partial one.
    let missing = dir.path().join("missing/dir/out.so");
    let out = mblob(&[os("export"), json.as_os_str(), os("-o"), missing.as_os_str()], tmp.path());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&*missing.to_string_lossy()) && err.contains("No such file"), "{err}");
    assert!(!err.contains("partial") && !err.contains("compile"), "{err}");
    assert!(entries(tmp.path()).is_empty());
}

#[test]
fn missing_host_files_are_named_before_the_compiler_runs() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.c"), "int ok(void) { return 1; }").unwrap();
    for (field, name, says) in [
        ("sources", "nope.c", "cannot read"),
        ("sources", "nope.cc", "cannot read"),
        ("objects", "nope.o", "cannot read"),
    ] {
        let json = tree(dir.path(), 100, serde_json::json!({ field: ["ok.c", name] }));
        let json = if field == "objects" {
            tree(dir.path(), 100, serde_json::json!({"sources": ["ok.c"], "objects": [name]}))
        } else {
            json
        };
        let so = dir.path().join("out.so");
        let out = mblob(&[os("export"), json.as_os_str(), os("-o"), so.as_os_str(), os("-q")], tmp.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(&*dir.path().join(name).to_string_lossy()) && err.contains(says), "{name}: {err}");
        // Found by mblob: no compiler ran (its command line would be in the message).
        assert!(!err.contains(" -c "), "{name}: {err}");
        assert!(!so.exists() && entries(tmp.path()).is_empty(), "{name}");
    }
}

/// Exports in one layout refuse host code of another TVM (see `pack::abi`), in the library as
/// in the command line.
#[test]
fn the_library_refuses_host_objects_the_layout_cannot_call() {
    let dir = tempfile::tempdir().unwrap();
    let v27 = goldens().join("other_versions/tvm-0.27.0.post1/relax_add_mul.lib0.o");
    let mut e = Export::new();
    e.object(&v27);
    e.import(mblob_runtime::RawPayload::new("x.Opaque", vec![1u8, 2, 3]));
    let so = dir.path().join("x.so");
    let err = e.layout(Layout::Classic).write(&so).unwrap_err().to_string();
    assert!(err.contains("0.22+") && err.contains("`ffi`"), "{err}");
    assert!(!so.exists());
    e.layout(Layout::Ffi).write(&so).unwrap();
}

#[test]
fn an_empty_tree_is_a_new_export() {
    // `from_tree` of an empty tree once gave a host id that named nothing: imports vanished.
    let dir = tempfile::tempdir().unwrap();
    let mut e = Export::from_tree(mblob_runtime::ModuleTree::new());
    e.import(mblob_runtime::RawPayload::new("x.Opaque", vec![9u8; 10]));
    let so = dir.path().join("x.so");
    let report = e.write(&so).unwrap();
    assert!(report.symbol.is_some());
    assert_eq!(crate::export_options::load(&so).type_keys(), ["library", "x.Opaque"]);
}
