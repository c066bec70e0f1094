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
    /// The target system's root (an Android NDK's `sysroot`), given to the compiler driver and
    /// `ld.lld` as `--sysroot=DIR`.
    pub sysroot: Option<PathBuf>,
}

/// What links a library for a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A compiler driver (`cc -shared ...`).
    Driver(PathBuf),
    /// `ld.lld` itself (`ld.lld -shared ...`), for a target no driver is installed for.
    Lld(PathBuf),
    /// LLVM's Mach-O linker, `ld64.lld -dylib`, for macOS and iOS: a `.dylib` as TVM's
    /// `clang -dynamiclib -undefined dynamic_lookup` links it (lld signs arm64 ad hoc, as
    /// Apple's linker does, so that dyld loads it).
    Ld64(PathBuf),
    /// LLVM's COFF linker, `lld-link /dll`, for Windows: a `.dll` exporting what the objects
    /// mark `dllexport` (TVM's blob symbol and host functions).
    LldLink(PathBuf),
}

/// An LLVM tool: on the PATH (also as `NAME-14` .. `NAME-19`, as Debian installs them), or in
/// an LLVM install directory.
pub fn find_llvm_tool(name: &str) -> Option<PathBuf> {
    let versions = ["14", "15", "16", "17", "18", "19"];
    let names = std::iter::once(name.to_owned()).chain(versions.iter().map(|v| format!("{name}-{v}")));
    names.into_iter().find_map(|n| on_path(&n)).or_else(|| {
        versions.iter().map(|v| PathBuf::from(format!("/usr/lib/llvm-{v}/bin/{name}"))).find(|p| p.is_file())
    })
}

/// The plan for a Mach-O or COFF target (`None` for the others).
fn apple_or_windows(target: &str) -> Option<Result<Plan>> {
    apple_or_windows_with(target, find_llvm_tool)
}

/// [`apple_or_windows`] with the tool found by `find`.
fn apple_or_windows_with(target: &str, find: impl Fn(&str) -> Option<PathBuf>) -> Option<Result<Plan>> {
    let (tool, plan): (&str, fn(PathBuf) -> Plan) = match crate::pack::host::format_of_triple(target) {
        object::BinaryFormat::MachO => ("ld64.lld", Plan::Ld64),
        object::BinaryFormat::Coff => ("lld-link", Plan::LldLink),
        _ => return None,
    };
    Some(find(tool).map(plan).ok_or_else(|| Error::MissingTool {
        target: target.to_owned(),
        tool: tool.to_owned(),
        hint: "install lld (apt-get install lld-14), or write the objects with `-o NAME.tar` or `-o NAME.a`".into(),
    }))
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
/// [`Error::MissingTool`] for a target that nothing installed can link for, naming the tools.
pub fn plan(opts: &LinkOptions) -> Result<Plan> {
    if let Some(d) = &opts.driver {
        return Ok(Plan::Driver(d.clone()));
    }
    let target = opts.target.as_deref().filter(|t| is_cross(Some(t)));
    let Some(target) = target else { return Ok(Plan::Driver(driver(opts))) };
    if let Some(plan) = apple_or_windows(target) {
        return plan;
    }
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
    Err(Error::MissingTool {
        target: target.to_owned(),
        tool: format!("a linker (`{}-gcc`, or ld.lld)", spellings(target).last().map_or(target, String::as_str)),
        hint: format!(
            "this machine's `cc` links only its own objects. Set {} (or TARGET_CC) to the target's C \
             compiler, install `{}-gcc`, or install lld (apt-get install lld-14), which links the objects \
             directly; or write the objects with `-o NAME.tar` or `-o NAME.a`",
            vars[1],
            spellings(target).last().map_or(target, String::as_str)
        ),
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
        Plan::Ld64(ld64) => return link_dylib(&ld64, objects, out, opts),
        Plan::LldLink(lld_link) => return link_dll(&lld_link, objects, out, opts),
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
    if let Some(root) = &opts.sysroot {
        let mut arg = std::ffi::OsString::from("--sysroot=");
        arg.push(root);
        cmd.arg(arg);
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
    cmd.arg("-shared").arg("-o").arg(out);
    if let Some(root) = &opts.sysroot {
        let mut arg = std::ffi::OsString::from("--sysroot=");
        arg.push(root);
        cmd.arg(arg);
    }
    cmd.args(objects);
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

/// The deployment target a `.dylib` is built for when the target triple names no version:
/// macOS 11 (the first with arm64) and iOS 14, what TVM's wheels and MLC's apps need.
fn apple_platform(target: &str) -> (&'static str, &'static str) {
    if target.contains("ios") {
        ("ios", "14.0")
    } else {
        ("macos", "11.0")
    }
}

/// `ld64.lld -dylib` of `objects` (see [`Plan::Ld64`]); extra arguments are the linker's own.
fn link_dylib(ld64: &Path, objects: &[PathBuf], out: &Path, opts: &LinkOptions) -> Result<()> {
    let target = opts.target.as_deref().unwrap_or_default();
    let arch = if target.starts_with("x86_64") { "x86_64" } else { "arm64" };
    let (platform, version) = apple_platform(target);
    tracing::debug!(ld64 = %ld64.display(), target, "linking a dylib with ld64.lld");
    let mut cmd = Command::new(ld64);
    cmd.args(["-dylib", "-arch", arch, "-platform_version", platform, version, version]);
    // As TVM links on macOS: the runtime's functions are found in the process at load time.
    cmd.args(["-undefined", "dynamic_lookup"]);
    if arch == "arm64" {
        // dyld kills unsigned arm64 code; lld signs ad hoc by default for macOS only.
        cmd.arg("-adhoc_codesign");
    }
    // The install name: the file's own name under the loading program's run paths (the path
    // the linker writes to is a temporary one).
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    cmd.arg("-install_name").arg(format!("@rpath/{name}"));
    cmd.arg("-o").arg(out).args(objects).args(&opts.args);
    run_tool("link", &mut cmd).map(|_| ())
}

/// `lld-link /dll` of `objects` (see [`Plan::LldLink`]): no entry point (TVM's libraries have
/// none), exporting what the objects mark `dllexport`. The TVM runtime functions host code
/// calls are found at load time by TVM on Windows (TVM's own link resolves them against
/// `tvm.lib`); left unresolved here (`/force:unresolved`), as a library that mblob's runtime
/// or TVM's fills in. Extra arguments are the linker's own (`/libpath:`, import libraries).
fn link_dll(lld_link: &Path, objects: &[PathBuf], out: &Path, opts: &LinkOptions) -> Result<()> {
    tracing::debug!(lld_link = %lld_link.display(), "linking a dll with lld-link");
    let mut cmd = Command::new(lld_link);
    let mut out_arg = std::ffi::OsString::from("/out:");
    out_arg.push(out);
    // `/Brepro`: the same inputs give the same bytes (a hash where the time stamp would be).
    cmd.args(["/dll", "/noentry", "/force:unresolved", "/nologo", "/Brepro"])
        .arg(out_arg)
        .args(objects)
        .args(&opts.args);
    run_tool("link", &mut cmd)?;
    // lld-link writes the import library beside the dll: not part of the output.
    let _ = std::fs::remove_file(out.with_extension("lib"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apple_and_windows_targets_link_with_lld_or_name_it() {
        let found = |name: &str| Some(PathBuf::from(format!("/x/{name}")));
        let plan = |t: &str| apple_or_windows_with(t, found).unwrap().unwrap();
        assert_eq!(plan("arm64-apple-ios"), Plan::Ld64("/x/ld64.lld".into()));
        assert_eq!(plan("x86_64-apple-macos"), Plan::Ld64("/x/ld64.lld".into()));
        assert_eq!(plan("x86_64-pc-windows-gnu"), Plan::LldLink("/x/lld-link".into()));
        assert!(apple_or_windows_with("aarch64-linux-android", found).is_none());
        for (t, tool) in [("arm64-apple-macos", "ld64.lld"), ("x86_64-pc-windows-msvc", "lld-link")] {
            let err = apple_or_windows_with(t, |_| None).unwrap().unwrap_err();
            assert!(
                matches!(&err, Error::MissingTool { target, tool: named, .. } if target == t && named == tool),
                "{err}"
            );
            assert!(err.to_string().contains("apt-get install lld-14"), "{err}");
        }
    }

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
