//! Running external tools (compilers, linkers) and the working directories an export keeps
//! its files in.
//!
//! [`run_tool`] logs the command line (quoted as a shell would read it), runs the tool in its
//! own process group, and turns a failure into an error naming the step, the command, the
//! status and the end of stderr. While a [`ToolContext`] guard lives on the thread, tools get
//! its `TMPDIR`, and a set cancel flag kills the tool's whole process group and returns
//! [`Error::Cancelled`].
//!
//! A [`WorkDir`] is a directory that a live process marks as in use by holding an exclusive
//! lock on the file [`WorkDir::LOCK`] inside it. Whoever can take that lock knows that the
//! process which made the directory is gone (the kernel drops the lock with the process, in
//! any PID namespace), so [`sweep`] may remove it.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{Error, Result};

thread_local! {
    /// What tools started on this thread get, while a [`ToolContext`] guard lives.
    static CONTEXT: RefCell<Option<Context>> = const { RefCell::new(None) };
}

#[derive(Debug, Clone, Default)]
struct Context {
    tmpdir: Option<PathBuf>,
    cancel: Option<Arc<AtomicBool>>,
}

/// While it lives, every tool that [`run_tool`] starts on this thread gets `TMPDIR=dir`
/// (unless its command sets `TMPDIR` itself), and is killed, with its children, as soon as
/// the cancel flag is set.
///
/// An export points `TMPDIR` into its own intermediate directory: the compiler's and linker's
/// temporary files (`ccXXXX.s`, collect2's files) then go where the export cleans up.
#[derive(Debug)]
pub struct ToolContext {
    previous: Option<Context>,
}

impl ToolContext {
    /// Sets the tools' `TMPDIR` (when `Some`) and cancel flag on this thread until the guard
    /// drops.
    pub fn set(tmpdir: Option<&Path>, cancel: Option<Arc<AtomicBool>>) -> ToolContext {
        let ctx = Context { tmpdir: tmpdir.map(Path::to_owned), cancel };
        let previous = CONTEXT.with(|t| t.replace(Some(ctx)));
        ToolContext { previous }
    }

    /// The tools' `TMPDIR` of this thread's context.
    pub fn tmpdir() -> Option<PathBuf> {
        CONTEXT.with(|t| t.borrow().as_ref().and_then(|c| c.tmpdir.clone()))
    }

    /// Whether the cancel flag of this thread's context is set.
    pub fn cancelled() -> bool {
        CONTEXT.with(|t| t.borrow().as_ref().and_then(|c| c.cancel.clone())).is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

impl Drop for ToolContext {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CONTEXT.with(|t| t.replace(previous));
    }
}

/// How often a running tool is checked for the cancel flag.
const POLL: Duration = Duration::from_millis(10);

/// Runs `cmd`, logging it first; a failure names `step`, the command line, the status and the
/// end of stderr.
///
/// The tool runs in a process group of its own (so that it and the programs it starts can be
/// killed together). Every way out of this function but the tool's own end (a set cancel flag,
/// a failed wait, a panic unwinding through it) kills that group and reaps the tool first, so
/// no tool outlives the call that started it. Inside a [`ToolContext`], the tool's `TMPDIR` is
/// the context's, and a set cancel flag kills the group and returns [`Error::Cancelled`].
///
/// A process killed outright (SIGKILL) runs no code, so a tool it had started finishes on its
/// own, as the compilers TVM's `export_library` starts do: mblob sets no parent-death signal,
/// which would need code run between `fork` and `exec` (`unsafe` in Rust). The tools it runs
/// are short (the C route's `.incbin` object and the link take about a second whatever the
/// payload size), and the next export's [`sweep`] removes what they leave. SIGINT and SIGTERM
/// reach the tool through the cancel flag: the CLI sets it (`cli/output.rs`).
///
/// # Errors
/// [`Error::ToolNotFound`] when it cannot be started, [`Error::Tool`] when it fails,
/// [`Error::Cancelled`] when cancelled.
pub fn run_tool(step: &str, cmd: &mut Command) -> Result<Output> {
    let ctx = CONTEXT.with(|t| t.borrow().clone()).unwrap_or_default();
    if let Some(dir) = &ctx.tmpdir {
        if !cmd.get_envs().any(|(k, _)| k == "TMPDIR") {
            cmd.env("TMPDIR", dir);
        }
    }
    let line = command_line(cmd);
    tracing::debug!(step, command = %line, "running");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let child = cmd.spawn().map_err(|source| Error::ToolNotFound {
        step: step.to_owned(),
        program: cmd.get_program().to_string_lossy().into_owned(),
        source,
    })?;
    let mut running = Running { child, ended: false };
    let out = wait(&mut running, ctx.cancel.as_deref()).map_err(|e| match e {
        Waited::Cancelled => Error::Cancelled { step: step.to_owned() },
        Waited::Io(source) => Error::Io { path: PathBuf::from(cmd.get_program()), action: "cannot wait for", source },
    })?;
    if out.status.success() {
        return Ok(out);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    Err(Error::Tool { step: step.to_owned(), command: line, status: out.status.to_string(), stderr: tail })
}

enum Waited {
    Cancelled,
    Io(std::io::Error),
}

/// A started tool: until [`Running::ended`] says it ended by itself, dropping it (an early
/// return, a panic unwinding through [`run_tool`]) or [`Running::kill`] kills the tool's
/// process group and reaps the tool.
struct Running {
    child: Child,
    ended: bool,
}

impl Running {
    /// Kills the tool's group and reaps the tool, once.
    fn kill(&mut self) {
        if !std::mem::replace(&mut self.ended, true) {
            kill_group(&mut self.child);
            let _ = self.child.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Collects the tool's output while polling for its end and for the cancel flag; on any way
/// out but the tool's own end, the tool is killed and reaped (by `running`).
fn wait(running: &mut Running, cancel: Option<&AtomicBool>) -> std::result::Result<Output, Waited> {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = drain(running.child.stdout.take());
    let stderr = drain(running.child.stderr.take());
    let status = loop {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            // Killed now, so that the pipes close and the readers end.
            running.kill();
            let _ = (stdout.join(), stderr.join());
            return Err(Waited::Cancelled);
        }
        match running.child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => return Err(Waited::Io(e)),
        }
    };
    running.ended = true;
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(Output { status, stdout, stderr })
}

/// Kills the child's process group (the child leads it: see [`run_tool`]).
fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        if pid > 0 {
            kill_process_group(pid);
        }
    }
    let _ = child.kill();
}

fn kill_process_group(pgid: libc::pid_t) {
    // The group this process created for a child it has not reaped yet: the id names no one
    // else's group.
    if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// A command as a shell would read it back: each word quoted where needed (with `shlex`),
/// words that are not valid UTF-8 shown lossily.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(quote).collect::<Vec<_>>().join(" ")
}

/// One word of a command line, quoted for a POSIX shell.
pub fn quote(word: &OsStr) -> String {
    match shlex::bytes::try_quote(word.as_bytes()) {
        Ok(q) => String::from_utf8_lossy(&q).into_owned(),
        // A NUL cannot be in an argument that reached a command; show it anyway.
        Err(_) => format!("{:?}", word.to_string_lossy()),
    }
}

/// A directory marked as in use by the exclusive lock this value holds on [`WorkDir::LOCK`]
/// inside it; removed, with everything in it, when dropped (unless [`WorkDir::keep`]).
///
/// It is made under a name that [`sweep`] never matches, locked, then renamed to its name:
/// a sweep can never find it without its lock held.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    _lock: File,
    keep: bool,
}

impl WorkDir {
    /// The lock file inside every work directory.
    pub const LOCK: &'static str = ".mblob-lock";

    /// Creates `<parent>/<name>`, locked.
    ///
    /// # Errors
    /// [`Error::Io`] naming the directory that could not be made or locked.
    pub fn create(parent: &Path, name: &str) -> Result<WorkDir> {
        let path = parent.join(name);
        let building = tempfile::Builder::new()
            .prefix(".mblob-new-")
            .tempdir_in(parent)
            .map_err(Error::io(&path, "cannot create"))?;
        let lock_path = building.path().join(Self::LOCK);
        let lock = File::create(&lock_path).map_err(Error::io(&lock_path, "cannot create"))?;
        fs4::FileExt::try_lock(&lock).map_err(|e| Error::Io {
            path: lock_path.clone(),
            action: "cannot lock",
            source: std::io::Error::other(e.to_string()),
        })?;
        fs::rename(building.path(), &path).map_err(Error::io(&path, "cannot create"))?;
        // Renamed: the TempDir guard must not remove anything any more.
        let _ = building.keep();
        Ok(WorkDir { path, _lock: lock, keep: false })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks a kept directory, which [`sweep`] leaves alone.
    pub const KEPT: &'static str = ".mblob-kept";

    /// Keeps the directory (and its files) when dropped, also from later sweeps; returns its
    /// path.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        let _ = File::create(self.path.join(Self::KEPT));
        self.path.clone()
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes what exports killed before they could clean up left in `dir`: directories named
/// `<prefix>...` whose lock (see [`WorkDir`]) nobody holds. An export that fails or is
/// interrupted cleans up itself; one that is killed (SIGKILL, power loss) cannot, so the next
/// export does it.
pub fn sweep(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().as_bytes().starts_with(prefix.as_bytes()) {
            continue;
        }
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || held(&path) || path.join(WorkDir::KEPT).exists() {
            continue;
        }
        tracing::debug!(path = %path.display(), "removing what a killed export left");
        // A compiler or linker that outlived its killed export may still be writing there;
        // it cannot recreate the directory, but can race one pass of the removal.
        for _ in 0..3 {
            if fs::remove_dir_all(&path).is_ok() || !path.exists() {
                break;
            }
        }
    }
}

/// Whether a live process holds the lock of the work directory `dir`. A directory without a
/// lock file is one whose removal was interrupted (they are made with it), so it is not held.
fn held(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(WorkDir::LOCK)) else { return false };
    match fs4::FileExt::try_lock(&file) {
        // Taken: nobody held it. Released when `file` closes.
        Ok(()) => false,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_quoted_for_the_shell() {
        let mut cmd = Command::new("cc");
        cmd.args(["-c", "a b.c", "-DX=\"y\"", "it's"]);
        let line = command_line(&cmd);
        assert_eq!(shlex::split(&line).unwrap(), ["cc", "-c", "a b.c", "-DX=\"y\"", "it's"]);
    }

    #[test]
    fn a_tool_left_running_is_killed_with_its_group_when_its_guard_drops() {
        use std::io::{BufRead, BufReader};
        // A tool that started a program of its own (as `cc` starts `as` and `ld`).
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & echo $!; wait"]).stdout(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        let tool = child.id();
        drop(Running { child, ended: false });
        // The tool was reaped by the guard; the program it started is gone (or a zombie
        // waiting for whoever adopted it) within a second.
        let dead = |pid: u32| match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit(") ").next().is_some_and(|rest| rest.starts_with('Z')),
        };
        assert!(dead(tool), "the tool is reaped");
        let gone = (0..100).any(|_| {
            dead(grandchild) || {
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        });
        assert!(gone, "the tool's own child {grandchild} was killed with its group");
    }

    #[test]
    fn held_and_kept_work_dirs_survive_the_sweep_a_released_one_does_not() {
        let parent = tempfile::tempdir().unwrap();
        let live = WorkDir::create(parent.path(), "mblob-x-live").unwrap();
        let kept = WorkDir::create(parent.path(), "mblob-x-kept").unwrap().keep();
        let dead = parent.path().join("mblob-x-dead");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(WorkDir::LOCK), b"").unwrap();
        sweep(parent.path(), "mblob-x-");
        assert!(live.path().exists() && kept.exists());
        assert!(!dead.exists());
        let path = live.path().to_owned();
        drop(live);
        assert!(!path.exists());
    }
}
