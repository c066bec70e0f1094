//! Linking objects into one shared library with the system compiler driver (run through
//! [`crate::tool::run_tool`]).
//!
//! The driver is `$CC` or `cc`; the linker is `ld.lld` when it is installed (4 to 7 times
//! faster than GNU ld on large blobs, see `toolchain-measurements.md`) and the driver's default
//! (GNU ld) otherwise, unless the caller chooses.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tool::run_tool;
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
    /// A linker script fragment (`-T <script>`), as [`crate::pack::direct`] writes.
    pub script: Option<PathBuf>,
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
    if let Some(script) = &opts.script {
        // Not `-Wl,-T,PATH`: `-Wl` splits at commas, which a path may hold.
        cmd.args(["-Xlinker", "-T", "-Xlinker"]).arg(script);
    }
    // Objects written without `.note.GNU-stack` would make an executable-stack library.
    cmd.arg("-Wl,-z,noexecstack");
    run_tool("link", &mut cmd).map(|_| ())
}
