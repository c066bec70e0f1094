//! The `mblob` command line: clap types and one file per subcommand. The binary's `main`
//! calls [`main`]; everything here returns errors, which are printed once, at the top.

pub mod demo;
pub mod export;
pub mod inspect;
pub mod pack;
pub mod run;
mod run_relax;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Pack a tree of TVM runtime modules into one shared library, byte for byte as TVM does,
/// and load it back.
///
/// Logs go to stderr; set `MBLOB_LOG=debug` (or `RUST_LOG`) to see each stage and each
/// external command.
#[derive(Debug, Parser)]
#[command(name = "mblob", version, about, long_about)]
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
    /// Show the blob of a packed `.so` or a raw `.blob` file: symbol, layout, entries, import
    /// tree and device modules. Reads the ELF file without running it (unless `--load`).
    Inspect(inspect::InspectArgs),
    /// Pack the module tree of a `.so` or `.blob` again, with new host objects and in any
    /// layout: converts a library between TVM versions.
    Pack(pack::PackArgs),
    /// Build one shared library from a module tree described in JSON (see `export --help`).
    Export(export::ExportArgs),
    /// Run a TVM-compiled model (graph, AOT or Relax) or one host function, with no TVM runtime:
    /// inputs and outputs as .npy files, optional timing (see `run --help`).
    Run(run::RunArgs),
}

/// Runs the command line; the binary's `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match &cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Export(args) => export::run(args),
        Command::Run(args) => run::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::from(2)
        }
    }
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
    let mut line = format!("mblob: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
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
