//! `mblob pack`: re-pack the module tree of a `.so` or `.blob` with new host objects, in any
//! layout (this converts a library between TVM versions).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mblob_runtime::Layout;

use super::inspect::parse_layout;
use crate::export::{Backend, Export, ExportReport, Progress};
use crate::link::Linker;
use crate::{Error, Result};

/// The environment variables `pack` and `export` read, for their `--help`.
macro_rules! export_environment_help {
    () => {
        "Environment:
  CC, CXX           C and C++ compilers for host sources (after --cc); CC also links
  CFLAGS, CXXFLAGS  flags added last to every C / C++ host compile (they override -O2, --cflag)
  TMPDIR            where the intermediate directory is made (removed afterwards)
  MBLOB_LOG         log filter (e.g. debug: each stage and every external command), else RUST_LOG
Exit status: 0 done, 1 error (nothing written at the output), 2 usage error, 130 / 143 interrupted by
SIGINT / SIGTERM (temporary and partial files removed)."
    };
}
pub(crate) use export_environment_help;

/// Options shared by `pack` and `export`.
#[derive(Debug, Clone, clap::Args)]
pub struct PackOptionsArgs {
    /// The shared library to write (it appears only when the export succeeds). A name ending
    /// in `.tar` gets the objects unlinked in a tar archive instead, as TVM's
    /// `export_library("x.tar")` (for cross builds and static archives). A name ending in
    /// `.a` gets a static archive of the host objects and the blob object (what MLC links into
    /// phone apps; BSD format for Apple targets, GNU otherwise), with no linker needed.
    #[arg(short, long, value_name = "OUT.so")]
    pub output: PathBuf,
    /// How the blob gets into the library: `direct` (the default: the linker lays out a
    /// placeholder and mblob writes the blob into the linked library, once; a `.tar` output,
    /// `--emit-devc` and `--system-lib` take the `llvm` route instead, `c` without LLVM),
    /// `llvm` (LLVM 14: TVM's `devc.o`, linked in), `c` (fast generated C), or `c-tvm` (TVM's
    /// own C text, slow past a few MiB).
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<Backend>,
    /// Blob layout: `classic` (TVM 0.8-0.20), `classic-0.21` (TVM 0.21) or `ffi` (TVM 0.22+).
    /// Default: `pack` keeps the layout of the library it reads, `export` writes `classic`.
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout)]
    pub layout: Option<Layout>,
    /// Target triple of the blob object (default: the machine of the host objects, read from
    /// their ELF headers; this machine without them): e.g. arm64-apple-macos,
    /// x86_64-apple-macos, arm64-apple-ios, x86_64-pc-windows-msvc, x86_64-pc-windows-gnu,
    /// aarch64-linux-android, aarch64-linux-gnu; the blob object is TVM's for the triple.
    /// Host objects of two machines, or of another machine or object format than the
    /// target's, are refused; Mach-O and COFF host objects need it.
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
    /// Register the blob at start-up with TVM's system library (default: as the source does,
    /// for `pack --from` and a TREE.json that `extract` wrote).
    #[arg(long)]
    pub system_lib: bool,
    /// TVM's `c_symbol_prefix`: put in front of the blob symbol, so that several models can
    /// share one static archive (default: the source's prefix, for `pack --from` and a
    /// TREE.json that `extract` wrote; else none).
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Also write the generated devc file(s) into this directory.
    #[arg(long, value_name = "DIR")]
    pub emit_devc: Option<PathBuf>,
    /// Linker: `auto` (ld.lld when installed), `lld`, or `default` (the compiler's, GNU ld).
    #[arg(long, value_name = "LINKER", default_value = "auto")]
    pub linker: Linker,
    /// The target system's root for linking (an Android NDK's
    /// `toolchains/llvm/prebuilt/*/sysroot`), passed as `--sysroot=DIR` to the target's
    /// compiler (`CC_<target>`) or `ld.lld`.
    #[arg(long, value_name = "DIR")]
    pub sysroot: Option<PathBuf>,
    /// An extra argument for the link command (repeatable).
    #[arg(long = "link-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub link_args: Vec<String>,
    /// Keep the intermediate directory and print its path.
    #[arg(long)]
    pub keep_temp: bool,
    /// Write the layout even when the host objects' calling convention is not the one the
    /// layout's TVM calls (detected from their symbols: TVM 0.8-0.20 packed functions fit
    /// `classic`, TVM 0.21's fit `classic-0.21`, TVM 0.22+'s `__tvm_ffi_*` functions fit
    /// `ffi`), or a Relax executable under a type key the layout's TVM does not read
    /// (`relax.Executable`, TVM 0.19 and earlier, in `classic-0.21` or `ffi`).
    #[arg(long)]
    pub force_layout: bool,
    /// Write the library even when the host code does not define every function the model
    /// calls by name (a graph's `func_name`s, the AOT entry, a Relax executable's kernels);
    /// such a library loads, then fails when the model runs. Without it the export is refused,
    /// naming the missing functions.
    #[arg(long)]
    pub allow_missing_functions: bool,
    /// The C compiler for host sources (default: $CC, then `cc`; C++ sources use $CXX, then
    /// `c++`).
    #[arg(long, value_name = "CC")]
    pub cc: Option<PathBuf>,
    /// An extra flag for the compiler of host sources (repeatable; after mblob's `-O2 -fPIC`,
    /// before $CFLAGS / $CXXFLAGS, which come last).
    #[arg(long = "cflag", value_name = "FLAG", allow_hyphen_values = true)]
    pub cflags: Vec<String>,
    /// An include directory for host sources (repeatable).
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    pub includes: Vec<PathBuf>,
    /// A preprocessor definition for host sources, `NAME` or `NAME=VALUE` (repeatable).
    #[arg(short = 'D', long = "define", value_name = "NAME[=VALUE]")]
    pub defines: Vec<String>,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

impl PackOptionsArgs {
    /// Applies the options to an export; `default_layout` is the layout written without
    /// `--layout`.
    pub fn apply(&self, e: &mut Export, default_layout: Layout) {
        if let Some(b) = self.backend {
            e.backend(b);
        }
        e.layout(self.layout.unwrap_or(default_layout))
            .allow_missing_functions(self.allow_missing_functions)
            .linker(self.linker.clone());
        if self.system_lib {
            e.system_lib(true);
        }
        if let Some(p) = &self.prefix {
            e.prefix(p.clone());
        }
        if let Some(t) = &self.target {
            e.target(t.clone());
        }
        if let Some(d) = &self.emit_devc {
            e.emit_devc(d.clone());
        }
        for a in &self.link_args {
            e.link_arg(a.clone());
        }
        if let Some(root) = &self.sysroot {
            e.sysroot(root.clone());
        }
        e.keep_temp(self.keep_temp).force_layout(self.force_layout);
        if let Some(cc) = &self.cc {
            e.compiler(cc.clone());
        }
        for f in &self.cflags {
            e.flag(f.clone());
        }
        for dir in &self.includes {
            e.include(dir.clone());
        }
        for d in &self.defines {
            match d.split_once('=') {
                Some((name, value)) => e.define(name, Some(value)),
                None => e.define(d.clone(), None),
            };
        }
        if !self.quiet && std::io::stderr().is_terminal() {
            // One line per stage, redrawn while it runs: `\r` and erase-line go back over
            // what the stage's start (or the last count of bytes packed) wrote.
            e.progress(|p| match p {
                Progress::Finished { .. } => eprintln!("\r\x1b[Kmblob: {p}"),
                _ => eprint!("\r\x1b[Kmblob: {p}"),
            });
        }
    }

    /// Writes the export and prints what came out.
    ///
    /// SIGINT and SIGTERM cancel the export: the running compiler or linker is killed with its
    /// children, the temporary and partial files are removed, and the exit status is 130 (INT)
    /// or 143 (TERM). A second signal ends the process at once.
    pub fn write(&self, e: &mut Export) -> Result<ExitCode> {
        let signals = Signals::install().map_err(Error::io("<signal handlers>", "cannot install"))?;
        e.cancel_flag(signals.cancel.clone());
        let written = e.write(&self.output);
        match written {
            Ok(report) => {
                if !self.quiet {
                    print_report(&report);
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(err @ Error::Cancelled { .. }) => {
                let (name, code) =
                    if signals.term.load(Ordering::Relaxed) { ("SIGTERM", 143) } else { ("SIGINT", 130) };
                if std::io::stderr().is_terminal() {
                    eprintln!();
                }
                eprintln!("mblob: {err} by {name}: removed the temporary and partial files");
                Ok(ExitCode::from(code))
            }
            Err(err) => Err(err),
        }
    }
}

/// The handlers of SIGINT and SIGTERM during an export: the first sets `cancel` (and `term`
/// for SIGTERM), a second one exits at once.
struct Signals {
    cancel: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let cancel = Arc::new(AtomicBool::new(false));
        let term = Arc::new(AtomicBool::new(false));
        // They stay for the life of the process, which ends soon after the export.
        for sig in [SIGINT, SIGTERM] {
            // First: it exits only when the flag was set by an earlier signal.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, cancel.clone())?;
            signal_hook::flag::register(sig, cancel.clone())?;
        }
        signal_hook::flag::register(SIGTERM, term.clone())?;
        Ok(Signals { cancel, term })
    }
}

fn print_report(r: &ExportReport) {
    match &r.symbol {
        Some(sym) => println!("wrote {} ({sym}, {} layout, blob {} bytes)", r.output.display(), r.layout, r.blob_len),
        None => println!("wrote {} (no imports: a plain library without a blob)", r.output.display()),
    }
    if let Some(dir) = &r.kept_temp_dir {
        println!("kept intermediate files in {}", dir.display());
    }
}

/// Arguments of `mblob pack`.
#[derive(Debug, clap::Args)]
#[command(after_help = export_environment_help!())]
pub struct PackArgs {
    /// The `.so`, raw `.blob`, blob object (`devc.o`, TVM's or mblob's) or `.tar` (TVM's
    /// `export_library("x.tar")`, gzip-compressed, or mblob's) whose module tree is packed
    /// again. It is read, never run; payload kinds mblob does not know are carried over as
    /// opaque bytes. From a `.tar`, the host objects are the archive's own (`lib0.o`, ...,
    /// and C/C++ sources such as BYOC's `lib0.c`, compiled with `-I`: give TVM's include
    /// directories) unless `--host` gives others.
    #[arg(long, value_name = "IN")]
    pub from: PathBuf,
    /// Layout of a raw `.blob` input (default: detected).
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout)]
    pub from_layout: Option<Layout>,
    /// The host code of the library: the object files (or C/C++ sources) it was built from,
    /// linked into the new library (the blob's `_lib` stands for them). For a TVM library,
    /// the `lib0.o` (`lib1.o`, ...) that `export_library` compiled; `export_library("x.tar")`
    /// gives them. A shared library cannot be linked again, so a `.so` is refused. Required
    /// unless `--blob-only` or `--from` is a `.tar` (which holds them).
    #[arg(long = "host", value_name = "OBJ", num_args = 1..)]
    pub host: Vec<PathBuf>,
    /// Write a library that holds only the blob, without host code (no model functions: for
    /// tools that read the blob, or to link the host code later; implies
    /// `--allow-missing-functions`).
    #[arg(long, conflicts_with = "host")]
    pub blob_only: bool,
    /// Output and packing options.
    #[command(flatten)]
    pub options: PackOptionsArgs,
}

/// Runs `mblob pack`.
pub fn run(args: &PackArgs) -> Result<ExitCode> {
    if let Some(tar) = mblob::tvm_tar::TvmTar::open(&args.from)? {
        return run_from_tar(args, &tar);
    }
    check_host(args)?;
    let (blob, layout, source) = mblob::repack::read_source(&args.from, args.from_layout)?;
    let tree = mblob::repack::module_tree_of(&blob, layout, &args.from)?;
    drop(blob);
    let mut e = Export::from_tree(tree);
    add_host(&mut e, &args.host);
    // The source's prefix and system-lib registration are kept unless the options say otherwise.
    e.prefix(source.prefix).system_lib(source.system_lib);
    // Without --layout the library keeps its layout (and so stays loadable by its TVM).
    args.options.apply(&mut e, layout);
    if args.blob_only {
        e.allow_missing_functions(true);
    }
    args.options.write(&mut e)
}

/// `pack --from X.tar`: the module tree of the archive's blob member (TVM's `devc.o`), linked
/// with the archive's own host objects (`lib0.o`, ...) unless `--host` or `--blob-only` says
/// otherwise.
fn run_from_tar(args: &PackArgs, tar: &mblob::tvm_tar::TvmTar) -> Result<ExitCode> {
    // Without --layout the library keeps the layout of the archive's blob.
    let (tree, layout) = tar.module_tree(None)?;
    let source = tar.blob_member(None)?.map(|m| (m.found.prefix, m.found.system_lib)).unwrap_or_default();
    let dir = tempfile::Builder::new()
        .prefix(".mblob-tar-")
        .tempdir()
        .map_err(Error::io(std::env::temp_dir(), "cannot create a directory in"))?;
    let hosts = if args.blob_only {
        Vec::new()
    } else if !args.host.is_empty() {
        check_host(args)?;
        args.host.clone()
    } else {
        let objects = tar.write_host_objects(dir.path())?;
        if objects.is_empty() {
            return Err(Error::HostCode {
                what: args.from.display().to_string(),
                detail: "holds no host objects (TVM's lib0.o, ...): give them with --host, or pass --blob-only".into(),
            });
        }
        objects
    };
    let mut e = Export::from_tree(tree);
    add_host(&mut e, &hosts);
    // The archive's prefix and system-lib registration are kept unless the options say otherwise.
    e.prefix(source.0).system_lib(source.1);
    args.options.apply(&mut e, layout);
    if args.blob_only {
        e.allow_missing_functions(true);
    }
    args.options.write(&mut e)
}

/// Adds host code to an export: C/C++ sources to compile, objects to link.
fn add_host(e: &mut Export, files: &[std::path::PathBuf]) {
    for h in files {
        if is_source(h) {
            e.c_source(h.clone());
        } else {
            e.object(h.clone());
        }
    }
}

/// Whether a `--host` file is a source to compile (C, or C++ by its extension).
fn is_source(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|e| e == "c") || crate::export::is_cxx(path)
}

/// Refuses a `pack` that would lose the host code: no `--host` without `--blob-only`. (A
/// shared library given as host code is refused by the export itself, as in every route.)
fn check_host(args: &PackArgs) -> Result<()> {
    if args.host.is_empty() && !args.blob_only {
        return Err(Error::HostCode {
            what: "--host".into(),
            detail: format!(
                "missing: the new library needs the host code of {} (its model functions), which the \
                 blob does not hold. Give the object files or sources it was built from, e.g. TVM's \
                 `lib0.o` (export_library(\"x.tar\") writes them), or pass --blob-only for a library \
                 with the blob alone",
                args.from.display()
            )
            .into(),
        });
    }
    Ok(())
}
