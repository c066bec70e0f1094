//! The `mblob` command line (built with the `cli` feature, on by default): clap types and one
//! module per subcommand under `cli/`. It uses the library through its public API only.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod cli;

// `crate::` paths in the command modules name the library's items.
use mblob::{export, inspect, link, tree_json, Error, Result};

fn main() -> std::process::ExitCode {
    cli::main()
}
