//! Linking objects into one shared library with the system compiler driver, and running
//! external tools with errors that say which step failed and what ran.
//!
//! The driver is `$CC` or `cc`; the linker is `ld.lld` when it is installed (4 to 7 times
//! faster than GNU ld on large blobs, see `toolchain-measurements.md`) and the driver's default
//! (GNU ld) otherwise, unless the caller chooses.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{Error, Result};

/// Which linker the driver uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Linker {
    /// `ld.lld` when installed, otherwise the driver's default.
    #[default]
    Auto,
    /// LLVM's `ld.lld` (an error when it is not installed).
    Lld,
    /// The driver's default linker (GNU ld on Debian).
    Default,
}

impl std::str::FromStr for Linker {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Linker, String> {
        match s {
            "auto" => Ok(Linker::Auto),
            "lld" => Ok(Linker::Lld),
            "default" | "bfd" | "ld" => Ok(Linker::Default),
            _ => Err(format!("unknown linker `{s}` (expected auto, lld or default)")),
        }
    }
}

/// How to link.
#[derive(Debug, Clone, Default)]
pub struct LinkOptions {
    /// The compiler driver (default: `$CC`, else `cc`).
    pub driver: Option<PathBuf>,
    /// The linker.
    pub linker: Linker,
    /// Extra arguments, after the objects (`-lm`, `-Wl,...`).
    pub args: Vec<String>,
}

/// The directory holding `ld.lld`: on the PATH, or LLVM 14's install directory.
pub fn find_lld() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|d| d.join("ld.lld").is_file());
    on_path.or_else(|| {
        ["/usr/lib/llvm-14/bin", "/usr/lib/llvm-15/bin", "/usr/lib/llvm-16/bin"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("ld.lld").is_file())
    })
}

/// The driver command.
pub fn driver(opts: &LinkOptions) -> PathBuf {
    opts.driver.clone().or_else(|| std::env::var_os("CC").map(PathBuf::from)).unwrap_or_else(|| PathBuf::from("cc"))
}

/// Links `objects` into the shared library `out` (`cc -shared -fPIC -o out objects...`).
pub fn link_shared(objects: &[PathBuf], out: &Path, opts: &LinkOptions) -> Result<()> {
    let _span = tracing::info_span!("link", objects = objects.len(), out = %out.display()).entered();
    let mut cmd = Command::new(driver(opts));
    cmd.arg("-shared").arg("-fPIC").arg("-o").arg(out);
    let lld = match opts.linker {
        Linker::Default => None,
        Linker::Auto => find_lld(),
        Linker::Lld => Some(find_lld().ok_or_else(|| Error::Invalid {
            what: "linker".into(),
            detail: "ld.lld is not installed (apt-get install lld-14), use `--linker default`".into(),
        })?),
    };
    if let Some(dir) = &lld {
        tracing::debug!(dir = %dir.display(), "linking with ld.lld");
        cmd.arg(format!("-B{}", dir.display())).arg("-fuse-ld=lld");
    }
    cmd.args(objects).args(&opts.args);
    // Objects written without `.note.GNU-stack` would make an executable-stack library.
    cmd.arg("-Wl,-z,noexecstack");
    run_tool("link", &mut cmd).map(|_| ())
}

thread_local! {
    /// The `TMPDIR` for tools this thread runs, while a [`ToolTempDir`] guard lives.
    static TOOL_TMPDIR: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
}

/// While it lives, every tool that [`run_tool`] starts on this thread gets `TMPDIR=dir`
/// (unless its command sets `TMPDIR` itself). An export points it into its own intermediate
/// directory: the compiler's and linker's temporary files (`ccXXXX.s`, collect2's files) then
/// go where the export cleans up, and when the export is killed, a tool that outlives it
/// writes there too, so the next export's sweep removes them with the directory.
#[derive(Debug)]
pub struct ToolTempDir {
    previous: Option<PathBuf>,
}

impl ToolTempDir {
    /// Sets `dir` as the tools' `TMPDIR` on this thread until the guard drops.
    pub fn set(dir: &Path) -> ToolTempDir {
        let previous = TOOL_TMPDIR.with(|t| t.replace(Some(dir.to_owned())));
        ToolTempDir { previous }
    }
}

impl Drop for ToolTempDir {
    fn drop(&mut self) {
        let previous = self.previous.take();
        TOOL_TMPDIR.with(|t| t.replace(previous));
    }
}

/// Runs `cmd`, logging it first; a failure names `step`, the command line, the status and the
/// end of stderr. Inside a [`ToolTempDir`], the tool's `TMPDIR` is that directory.
pub fn run_tool(step: &str, cmd: &mut Command) -> Result<Output> {
    if let Some(dir) = TOOL_TMPDIR.with(|t| t.borrow().clone()) {
        if !cmd.get_envs().any(|(k, _)| k == "TMPDIR") {
            cmd.env("TMPDIR", dir);
        }
    }
    let line = command_line(cmd);
    tracing::debug!(step, command = %line, "running");
    let out = cmd.output().map_err(|source| Error::ToolNotFound {
        step: step.to_owned(),
        program: cmd.get_program().to_string_lossy().into_owned(),
        source,
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

/// A command as a shell-like line.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let s = a.to_string_lossy();
            if s.contains(' ') {
                format!("'{s}'")
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
