//! The `mblob` command line: clap types and one file per subcommand. The binary's `main`
//! calls [`main`]; everything here returns errors, which are printed once, at the top.

pub mod bundle;
pub mod demo;
pub mod export;
pub mod extract;
#[cfg(feature = "llm")]
pub mod generate;
pub mod inspect;
#[cfg(feature = "llm")]
pub mod model_settings;
pub mod output;
pub mod pack;
pub mod run;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit status of a command that failed: bad input, or an operation that did not succeed.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a usage error (clap's, for unknown options and missing arguments).
pub const EXIT_USAGE: u8 = 2;

/// The end of `mblob --help`: exit statuses and environment variables.
const AFTER_HELP: &str = "\
Exit status (every command):
  0  success
  1  failure: an input could not be read or is malformed, or the operation failed (a compile
     or link step, a check of the demo); the message names the file and what was wrong.
     `inspect` reports every file it can and exits 1 when any could not be read.
  2  usage error: unknown option, missing or malformed argument (`run`: also a malformed
     MBLOB_NUM_THREADS or TVM_NUM_THREADS, see `run --help`)

Environment:
  MBLOB_LOG          log filter for stderr (`debug` shows each stage and external command;
                     tracing-subscriber's syntax, e.g. `mblob=debug`); default `warn`
  RUST_LOG           the same, when MBLOB_LOG is unset
  CC                 C compiler for C sources and the C packer, and the link driver
                     (default `cc`; for a target another machine runs, the cc crate's
                     target-specific names such as CC_aarch64_unknown_linux_gnu and TARGET_CC,
                     then <target>-gcc, link; else ld.lld links the objects directly; else the
                     export is refused up front)
  CXX                C++ compiler for C++ sources (default `c++`)
  CFLAGS, CXXFLAGS   extra compiler flags, read by the cc crate (also CFLAGS_<target>,
                     TARGET_CFLAGS and the same for CXXFLAGS)
  PATH               where compilers and ld.lld are looked for (ld.lld also in
                     /usr/lib/llvm-14/bin)
  TMPDIR             where intermediate files go during an export (removed after)
  MBLOB_NUM_THREADS  threads for running models (`mblob run` without --threads): a number,
                     at least 1; else TVM_NUM_THREADS, the same; else one per core
  LD_LIBRARY_PATH    where the CUDA driver (libcuda.so), NVRTC (libnvrtc.so) and the OpenCL
                     ICD loader (libOpenCL.so.1) are found, for device modules
  OCL_ICD_VENDORS    where the OpenCL ICD loader looks for drivers (/etc/OpenCL/vendors)
  OPENCL_DYLIB_PATH  the OpenCL ICD loader to open, when not libOpenCL.so.1 on the library
                     path (read by opencl3)
  CUDA_PATH          CUDA headers for NVRTC ($CUDA_PATH/include), compiling TVM's CUDA
                     source; CUDA_HOME when unset
  MBLOB_REQUIRE_OPENCL, MBLOB_REQUIRE_CUDA, MBLOB_REQUIRE_NVRTC  (tests) fail, rather
                     than skip, the tests of that device when it cannot be opened";

/// Pack a tree of TVM runtime modules into one shared library, byte for byte as TVM does,
/// and load it back.
///
/// Logs go to stderr; set `MBLOB_LOG=debug` (or `RUST_LOG`) to see each stage and each
/// external command.
#[derive(Debug, Parser)]
#[command(name = "mblob", version, about, long_about, after_help = AFTER_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The main job, end to end: build a library with host code, a CUDA kernel and a graph
    /// factory, export it, inspect it, load it back and run it.
    Demo(demo::DemoArgs),
    /// Show what a packed `.so`, a raw `.blob` or an exported `.tar` holds: symbol, layout,
    /// entries, import tree, graph inputs and outputs, device kernels, and the host functions
    /// with their calling convention. Reads the file without running it (unless `--load`).
    Inspect(inspect::InspectArgs),
    /// Write the contents of a `.so`, `.blob` or `.tar` into a directory: each payload, the
    /// parts of the kinds mblob knows (graph JSON, params, kernel code, function tables), and
    /// a TREE.json that `mblob export` builds the same blob from.
    Extract(extract::ExtractArgs),
    /// Pack the module tree of a `.so` or `.blob` again, with new host objects and in any
    /// layout: converts a library between TVM versions.
    Pack(pack::PackArgs),
    /// Build one shared library from a module tree described in JSON (see `export --help`).
    Export(export::ExportArgs),
    /// Write one static archive of several system-lib models, each under its own prefix (as
    /// MLC's `package` step does for an app).
    Bundle(bundle::BundleArgs),
    /// Run a TVM-compiled model (graph, AOT, Relax or Relay VM) or one host function, with no TVM runtime:
    /// inputs and outputs as .npy files, optional timing (see `run --help`).
    Run(run::RunArgs),
    /// Generate token ids greedily with a language-model library as MLC-LLM exports them
    /// (embed, prefill, decode, a TIR paged KV cache), weights bound or from a tensor cache
    /// (see `generate --help`).
    #[cfg(feature = "llm")]
    Generate(generate::GenerateArgs),
}

/// Runs the command line; the binary's `main`.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to stderr with 2.
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    init_logging();
    let result = match &cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Extract(args) => extract::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Export(args) => export::run(args),
        Command::Bundle(args) => bundle::run(args),
        Command::Run(args) => run::run(args),
        #[cfg(feature = "llm")]
        Command::Generate(args) => generate::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            output::exit_code(&e)
        }
    }
}

/// Reports a usage error found after parsing (one that needs the model, or the environment)
/// as clap reports its own: `error: ...`, the subcommand's usage line, status 2.
pub(crate) fn usage_error(subcommand: &str, message: String) -> ExitCode {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    cli.build();
    let error = match cli.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(clap::error::ErrorKind::ValueValidation, message),
        None => cli.error(clap::error::ErrorKind::ValueValidation, message),
    };
    let _ = error.print();
    ExitCode::from(EXIT_USAGE)
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("MBLOB_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_target(false)
        .try_init();
}

/// Prints an error and its causes on one line: `mblob: a: b: c`.
pub fn report(e: &(dyn std::error::Error + 'static)) {
    let line = format!("mblob: {}", mblob::with_causes(e));
    let stdout = io::stdout().lock();
    let _ = writeln!(io::stderr().lock(), "{line}");
    drop(stdout);
}

fn is_broken_pipe(e: &crate::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::BrokenPipe {
                return true;
            }
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
