//! Outputs appear whole or not at all (`run -o DIR`, `generate --logits`, `extract -o`): a
//! write that fails (a full disk, simulated with RLIMIT_FSIZE in the child, which then gets
//! EFBIG) or a signal leaves the earlier outputs as they were and nothing new, not even an
//! empty directory; files get the mode the umask gives.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn goldens_run() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens/run")
}

/// `mblob ARGS` with at most `fsize` bytes per written file (RLIMIT_FSIZE; SIGXFSZ ignored,
/// so a write past it fails with EFBIG as on a full disk) and the umask `umask`.
fn mblob_limited(args: &[&OsStr], fsize: Option<u64>, umask: u32) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mblob"));
    cmd.args(args);
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions
    // (setrlimit, signal, umask) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(limit) = fsize {
                let r = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            }
            libc::umask(umask as libc::mode_t);
            Ok(())
        });
    }
    cmd.output().expect("run mblob")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// The data of a `.npy` file (after its header; the header's spelling differs between numpy
/// and mblob's writer).
fn npy_data(path: &Path) -> Vec<u8> {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY", "{}", path.display());
    let (len, at) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    b[at + len..].to_vec()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn two_outputs_args(out: &Path) -> Vec<std::ffi::OsString> {
    let run = goldens_run();
    vec![
        "run".into(),
        run.join("graph_two_outputs.so").into(),
        "-i".into(),
        format!("x={}", run.join("graph_two_outputs.in.x.npy").display()).into(),
        "-o".into(),
        out.into(),
    ]
}

fn os(v: &[std::ffi::OsString]) -> Vec<&OsStr> {
    v.iter().map(|a| a.as_os_str()).collect()
}

/// graph_two_outputs writes out.0.npy (176 bytes) and out.1.npy (224 bytes): with 200 bytes
/// per file the second write fails. An earlier run's outputs stay as they were (not mixed with
/// a new out.0.npy); a new directory is not left behind, nor anything beside it.
#[test]
fn run_outputs_are_whole_or_absent_on_a_full_disk() {
    let run = goldens_run();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("out.0.npy"), b"an earlier run's out.0").unwrap();
    std::fs::write(out.join("out.1.npy"), b"an earlier run's out.1").unwrap();
    let o = mblob_limited(&os(&two_outputs_args(&out)), Some(200), 0o022);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("out.1.npy") && err.contains("cannot write"), "{err}");
    assert_eq!(names(tmp.path()), ["out"], "left beside the output directory");
    assert_eq!(names(&out), ["out.0.npy", "out.1.npy"]);
    assert_eq!(std::fs::read(out.join("out.0.npy")).unwrap(), b"an earlier run's out.0", "mixed with the new run");
    assert_eq!(std::fs::read(out.join("out.1.npy")).unwrap(), b"an earlier run's out.1");

    // A failed first write into a new directory (a/b/c, none of which exists) leaves none.
    let nested = tmp.path().join("a/b/c");
    let o = mblob_limited(&os(&two_outputs_args(&nested)), Some(100), 0o022);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(names(tmp.path()), ["out"], "an empty directory was left");

    // Without the limit the new set replaces the earlier one as a whole, with the umask's modes.
    let o = mblob_limited(&os(&two_outputs_args(&out)), None, 0o022);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(names(tmp.path()), ["out"]);
    assert_eq!(names(&out), ["out.0.npy", "out.1.npy"]);
    for i in 0..2 {
        let want = npy_data(&run.join(format!("graph_two_outputs.out.{i}.npy")));
        assert_eq!(npy_data(&out.join(format!("out.{i}.npy"))), want, "out.{i}.npy is TVM's");
        assert_eq!(mode(&out.join(format!("out.{i}.npy"))), 0o644, "out.{i}.npy under umask 022");
    }
    let o = mblob_limited(&os(&two_outputs_args(&nested)), None, 0o027);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mode(&nested.join("out.0.npy")), 0o640, "under umask 027");
    assert_eq!(mode(&nested), 0o750, "the directory under umask 027");
}

/// SIGINT and SIGTERM at any moment of a run leave the output directory either as it was or
/// holding the whole new set, and nothing beside it; status 130/143 when the signal came while
/// the outputs were written (handled), else the signal's default.
#[test]
fn run_outputs_survive_signals_at_any_moment() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let run = goldens_run();
    let want: Vec<Vec<u8>> = (0..2).map(|i| npy_data(&run.join(format!("graph_two_outputs.out.{i}.npy")))).collect();
    for (k, delay_us) in [0u64, 2_000, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000].into_iter().enumerate() {
        let signal = if k % 2 == 0 { libc::SIGINT } else { libc::SIGTERM };
        let mut child = Command::new(env!("CARGO_BIN_EXE_mblob")).args(two_outputs_args(&out)).spawn().unwrap();
        std::thread::sleep(Duration::from_micros(delay_us));
        // SAFETY: signals our own child, which has not been waited for.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        assert_eq!(
            names(tmp.path()).iter().filter(|n| *n != "out").count(),
            0,
            "{delay_us} us: {:?}",
            names(tmp.path())
        );
        if out.exists() {
            assert_eq!(names(&out), ["out.0.npy", "out.1.npy"], "{delay_us} us: a partial set");
            for (i, w) in want.iter().enumerate() {
                assert_eq!(&npy_data(&out.join(format!("out.{i}.npy"))), w, "{delay_us} us");
            }
            std::fs::remove_dir_all(&out).unwrap();
        }
        if let Some(code) = status.code() {
            assert!([0, 130, 143].contains(&code), "{delay_us} us: {status}");
        }
    }
}

/// A directory holding other files than an earlier run's outputs is refused before the model
/// runs (the outputs replace it as a whole), and left as it was.
#[test]
fn run_refuses_an_output_directory_with_other_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    let o = mblob_limited(&os(&two_outputs_args(&out)), None, 0o022);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("notes.txt") && err.contains("earlier run"), "{err}");
    assert_eq!(names(&out), ["notes.txt"]);
    assert_eq!(names(tmp.path()), ["out"]);
}

/// `extract -o a/b` that fails writing leaves no `a/`; one that succeeds gives the umask's modes.
#[test]
fn extract_leaves_nothing_when_a_write_fails() {
    let so = goldens_run().parent().unwrap().join("graph_dense_relu.so");
    let tmp = tempfile::tempdir().unwrap();
    let nested = tmp.path().join("a/b");
    let args: Vec<&OsStr> = vec!["extract".as_ref(), so.as_os_str(), "-o".as_ref(), nested.as_os_str(), "-q".as_ref()];
    let o = mblob_limited(&args, Some(64), 0o022);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(names(tmp.path()).is_empty(), "left behind: {:?}", names(tmp.path()));
    let o = mblob_limited(&args, None, 0o022);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mode(&nested.join("tree.json")), 0o644);
    assert_eq!(mode(&nested), 0o755);
}

/// `generate --logits FILE` that fails writing leaves no file (nor a temporary one); one that
/// succeeds gives the umask's mode.
#[cfg(feature = "llm")]
#[test]
fn generate_logits_are_whole_or_absent() {
    let llm = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm");
    let tmp = tempfile::tempdir().unwrap();
    let logits = tmp.path().join("logits.npy");
    let so = llm.join("llm_consts.so");
    let args: Vec<&OsStr> = vec![
        "generate".as_ref(),
        so.as_os_str(),
        "--prompt-ids".as_ref(),
        "1,2".as_ref(),
        "--max-new-tokens".as_ref(),
        "3".as_ref(),
        "--logits".as_ref(),
        logits.as_os_str(),
    ];
    let o = mblob_limited(&args, Some(1000), 0o022);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(names(tmp.path()).is_empty(), "left behind: {:?}", names(tmp.path()));
    let o = mblob_limited(&args, None, 0o022);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mode(&logits), 0o644);
    assert_eq!(names(tmp.path()), ["logits.npy"]);
}
