//! `mblob inspect`: the command-line face of [`mblob::inspect`]: prints each file's report as
//! text, or with `--json` as one JSON object per file, one per line (JSON Lines).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use mblob_runtime::Layout;

use crate::inspect::{inspect_path, render_text, Options};
use crate::{Error, Result};

/// Arguments of `mblob inspect`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = JSON_HELP)]
pub struct InspectArgs {
    /// Packed `.so` files, raw `.blob` files (the blob symbol's bytes, header included), or
    /// `.tar` files: TVM's `export_library("x.tar")` (gzip-compressed) or `mblob export -o X.tar`.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Print one JSON object per file instead of text (keys below, with `--help`).
    #[arg(long, conflicts_with = "metadata")]
    pub json: bool,
    /// Print only the model's metadata: what MLC's `_metadata` function returns (a JSON text),
    /// read from the Relax executable's constants without running code. A file whose
    /// `_metadata` does not return a constant is an error.
    #[arg(long)]
    pub metadata: bool,
    /// Also load the file with the real loader (this dlopens it and so runs its initialisers)
    /// and print the tree after loading, and an AOT model's inputs and outputs.
    #[arg(long)]
    pub load: bool,
    /// Read raw `.blob` files as this layout instead of detecting it.
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout)]
    pub layout: Option<Layout>,
    /// Only consider blob symbols with this `c_symbol_prefix`.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// With `--load`: keep payloads whose type key has no loader as opaque bytes instead of
    /// failing, as TVM does.
    #[arg(long, requires = "load")]
    pub keep_unknown: bool,
}

const JSON_HELP: &str = "\
With --json, each file gives one line holding one JSON object:
  file, kind (elf, macho, pe, coff, wasm, archive, blob, tar), container (format, machine,
  member, runs_here), symbol, prefix, system_lib, section, file_offset, layout (classic, classic-0.21,
  ffi or null), legacy, blob_len (header included), type_keys, payload_lens, payload_offsets,
  key_offsets (one element per blob entry; offsets from the blob's first byte), row_ptr,
  child_indices (the CSR import tree), modules (per entry: type_key, index, payload_len, and
  for graph factories graph_json_len, module_name, params, inputs, outputs; for device kinds
  format, functions {name: {name, arg_types, launch_param_tags, arg_extra_tags}}, data_len,
  smap, shaders, version; for Relax executables relax {version, functions [{name, kind,
  params}], externs, constant_pool_len, constants [{index, dtype, shape, bytes}],
  constants_bytes, unsupported_calls (the packed functions neither mblob nor the library
  provides; null without the library), strings [{index, text}] (whole), calls [{function,
  callee, args}] (each builtin call that passes constants, args as values), metadata (what
  MLC's `_metadata` returns when it is a constant, else null)}; for AOT factories aot {module_name, params, inputs,
  outputs (null without --load: they are in the library's code), io_error}), tree (nested {index, type_key, imports}), host (for a shared
  library: convention, context_symbols, functions (TVM's entry points: {name, symbol}),
  other_functions (exported code that is not an entry point, e.g. C++ helpers),
  unsupported_imports), tar (members, blob_member, unread [{name, reason}]), and with
  --load, loaded (nested {type_key, imports}).
The function tables are what `mblob export` takes in TREE.json.

Exit status: 0 when every file was read, 1 when any could not be or holds a payload that
could not be decoded (each error is printed and the other files are still reported), 2 for a
usage error.";

/// Parses a layout name for clap.
pub fn parse_layout(s: &str) -> std::result::Result<Layout, String> {
    Layout::from_name(s)
        .ok_or_else(|| format!("unknown layout `{s}` (expected one of: {})", Layout::ALL.map(|l| l.name()).join(", ")))
}

impl InspectArgs {
    /// The library's options for these arguments.
    pub fn options(&self) -> Options {
        Options { layout: self.layout, prefix: self.prefix.clone(), load: self.load, keep_unknown: self.keep_unknown }
    }
}

/// Runs `mblob inspect`: reports each file, continuing past files that fail; the exit code is
/// 1 when any failed.
pub fn run(args: &InspectArgs) -> Result<ExitCode> {
    let mut failed = false;
    for path in &args.paths {
        match inspect_path(path, &args.options()) {
            Ok(report) if args.metadata => {
                let found = report.modules.iter().find_map(|m| m.relax.as_ref().and_then(|r| r.metadata.as_ref()));
                match found {
                    Some(text) => {
                        let mut out = io::stdout().lock();
                        writeln!(out, "{text}").map_err(Error::io("<stdout>", "cannot write"))?;
                    }
                    None => {
                        failed = true;
                        let _ = writeln!(
                            io::stderr().lock(),
                            "mblob: {}: no metadata: no Relax executable whose `_metadata` function returns a string \
                             constant",
                            path.display()
                        );
                    }
                }
            }
            Ok(report) => {
                let mut out = io::stdout().lock();
                let written = if args.json {
                    serde_json::to_writer(&mut out, &report).map_err(io::Error::from).and_then(|_| writeln!(out))
                } else {
                    out.write_all(render_text(&report).as_bytes())
                };
                written.map_err(Error::io("<stdout>", "cannot write"))?;
                // A payload that could not be decoded is printed as an error: the file was not
                // read whole.
                if let Some(e) = report.modules.iter().find_map(|m| m.error.as_ref()) {
                    failed = true;
                    let _ =
                        writeln!(io::stderr().lock(), "mblob: {}: a payload could not be decoded: {e}", path.display());
                }
            }
            Err(e) => {
                failed = true;
                super::report(&e);
            }
        }
    }
    Ok(if failed { ExitCode::from(super::EXIT_FAILURE) } else { ExitCode::SUCCESS })
}
