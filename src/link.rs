//! Linking objects into one shared library with the system compiler driver (run through
//! [`crate::tool::run_tool`]).
//!
//! The driver is `$CC` or `cc`; the linker is `ld.lld` when it is installed (4 to 7 times
//! faster than GNU ld on large blobs, see `toolchain-measurements.md`) and the driver's default
//! (GNU ld) otherwise, unless the caller chooses.
//!
//! For a target another machine runs ([`LinkOptions::target`]), the host's `cc` cannot link:
//! the target's compiler is used (`CC_<target>` as the `cc` crate spells it, `TARGET_CC`, or
//! `<target>-gcc` on the PATH), else `ld.lld` links the objects directly (it reads their
//! machine from them), else the export is refused before any work, naming what to install
//! ([`plan`]).

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
    /// The target triple of the objects (`None`: this machine).
    pub target: Option<String>,
}

/// What links a library for a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A compiler driver (`cc -shared ...`).
    Driver(PathBuf),
    /// `ld.lld` itself (`ld.lld -shared ...`), for a target no driver is installed for.
    Lld(PathBuf),
}

/// Whether `target` names a machine other than this one (another architecture, or not Linux).
pub fn is_cross(target: Option<&str>) -> bool {
    let Some(t) = target else { return false };
    let arch = t.split('-').next().unwrap_or("");
    let same_arch = arch == std::env::consts::ARCH || (arch == "arm64" && std::env::consts::ARCH == "aarch64");
    !(same_arch && t.contains("linux") && !t.contains("android"))
}

/// The spellings of a triple: as given, and with or without the `unknown` vendor
/// (`aarch64-linux-gnu`, `aarch64-unknown-linux-gnu`).
fn spellings(target: &str) -> Vec<String> {
    let mut out = vec![target.to_owned()];
    let parts: Vec<&str> = target.split('-').collect();
    if parts.get(1) == Some(&"unknown") {
        let mut p = parts.clone();
        p.remove(1);
        out.push(p.join("-"));
    } else if parts.len() == 3 {
        out.push(format!("{}-unknown-{}-{}", parts[0], parts[1], parts[2]));
    }
    out
}

/// The environment names of a target's C compiler, in the `cc` crate's order (each spelling of
/// the triple), then `TARGET_CC`.
fn target_cc_vars(target: &str) -> Vec<String> {
    let mut vars = Vec::new();
    for t in spellings(target) {
        vars.push(format!("CC_{t}"));
        vars.push(format!("CC_{}", t.replace('-', "_")));
    }
    vars.push("TARGET_CC".to_owned());
    vars
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// How `opts` links: the given driver; for this machine `$CC` or `cc`; for another, the
/// target's compiler, else `ld.lld`.
///
/// # Errors
/// [`Error::Target`] for a target that nothing installed can link for, naming the tools.
pub fn plan(opts: &LinkOptions) -> Result<Plan> {
    if let Some(d) = &opts.driver {
        return Ok(Plan::Driver(d.clone()));
    }
    let target = opts.target.as_deref().filter(|t| is_cross(Some(t)));
    let Some(target) = target else { return Ok(Plan::Driver(driver(opts))) };
    let vars = target_cc_vars(target);
    if let Some(cc) = vars.iter().find_map(std::env::var_os) {
        return Ok(Plan::Driver(PathBuf::from(cc)));
    }
    if let Some(gcc) = spellings(target).iter().find_map(|t| on_path(&format!("{t}-gcc"))) {
        return Ok(Plan::Driver(gcc));
    }
    if opts.linker != Linker::Default {
        if let Some(dir) = find_lld() {
            return Ok(Plan::Lld(dir.join("ld.lld")));
        }
    }
    Err(Error::Target {
        what: format!("target {target}"),
        detail: format!(
            "no linker for it is installed: this machine's `cc` links only its own objects. Set {} (or \
             TARGET_CC) to the target's C compiler, install `{}-gcc`, or install lld (apt-get install lld-14), \
             which links the objects directly; or write the objects with `-o NAME.tar`",
            vars[1],
            spellings(target).last().map_or(target, String::as_str)
        )
        .into(),
    })
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

/// Links `objects` into the shared library `out` (`cc -shared -fPIC -o out objects...`, or
/// for a target no compiler is installed for, `ld.lld -shared -o out objects...`).
pub fn link_shared(objects: &[PathBuf], out: &Path, opts: &LinkOptions) -> Result<()> {
    let _span = tracing::info_span!("link", objects = objects.len(), out = %out.display()).entered();
    let driver = match plan(opts)? {
        Plan::Driver(d) => d,
        Plan::Lld(lld) => return link_with_lld(&lld, objects, out, opts),
    };
    let mut cmd = Command::new(driver);
    cmd.arg("-shared").arg("-fPIC").arg("-o").arg(out);
    let lld = match opts.linker {
        Linker::Default => None,
        Linker::Auto => find_lld(),
        Linker::Lld => Some(find_lld().ok_or_else(|| Error::Options {
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

/// `ld.lld -shared` of `objects`: the arguments meant for a driver (`-Wl,a,b`) are passed as
/// the linker's own.
fn link_with_lld(lld: &Path, objects: &[PathBuf], out: &Path, opts: &LinkOptions) -> Result<()> {
    tracing::debug!(lld = %lld.display(), target = ?opts.target, "linking with ld.lld directly");
    let mut cmd = Command::new(lld);
    cmd.arg("-shared").arg("-o").arg(out).args(objects);
    for a in &opts.args {
        match a.strip_prefix("-Wl,") {
            Some(rest) => {
                cmd.args(rest.split(','));
            }
            None => {
                cmd.arg(a);
            }
        }
    }
    if let Some(script) = &opts.script {
        cmd.arg("-T").arg(script);
    }
    cmd.args(["-z", "noexecstack"]);
    run_tool("link", &mut cmd).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_other_machines_are_cross_targets() {
        let host = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
        assert!(!is_cross(None));
        assert!(!is_cross(Some(&host)));
        let other = if std::env::consts::ARCH == "aarch64" { "x86_64-linux-gnu" } else { "aarch64-linux-gnu" };
        assert!(is_cross(Some(other)));
        assert!(is_cross(Some("arm64-apple-macos")));
        assert!(is_cross(Some("wasm32-unknown-unknown-wasm")));
    }
}
