//! `mblob pack`: re-pack the module tree of a `.so` or `.blob` with new host objects, in any
//! layout (this converts a library between TVM versions).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use mblob_runtime::{elf, load_blob, Layout, LoadOptions, ModuleTree, Registry};

use super::inspect::parse_layout;
use crate::export::{Backend, Export, ExportReport, Progress};
use crate::link::Linker;
use crate::{Error, Result};

/// Options shared by `pack` and `export`.
#[derive(Debug, Clone, clap::Args)]
pub struct PackOptionsArgs {
    /// The shared library to write (it appears only when the export succeeds). A name ending
    /// in `.tar` gets the objects unlinked in a tar archive instead, as TVM's
    /// `export_library("x.tar")` (for cross builds and static archives).
    #[arg(short, long, value_name = "OUT.so")]
    pub output: PathBuf,
    /// How the blob becomes an object: `llvm` (LLVM 14, the default when built in), `c` (fast
    /// generated C), or `c-tvm` (TVM's own C text, slow past a few MiB).
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<Backend>,
    /// Blob layout: `classic` (TVM 0.8-0.20), `classic-0.21` (TVM 0.21) or `ffi` (TVM 0.22+).
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout, default_value = "classic")]
    pub layout: Layout,
    /// Target triple of the blob object (default: this machine).
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
    /// Register the blob at start-up with TVM's system library.
    #[arg(long)]
    pub system_lib: bool,
    /// TVM's `c_symbol_prefix`: put in front of the blob symbol, so that several models can
    /// share one static archive.
    #[arg(long, value_name = "PREFIX", default_value = "")]
    pub prefix: String,
    /// Also write the generated devc file(s) into this directory.
    #[arg(long, value_name = "DIR")]
    pub emit_devc: Option<PathBuf>,
    /// Linker: `auto` (ld.lld when installed), `lld`, or `default` (the compiler's, GNU ld).
    #[arg(long, value_name = "LINKER", default_value = "auto")]
    pub linker: Linker,
    /// An extra argument for the link command (repeatable).
    #[arg(long = "link-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub link_args: Vec<String>,
    /// Keep the intermediate directory and print its path.
    #[arg(long)]
    pub keep_temp: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

impl PackOptionsArgs {
    /// Applies the options to an export.
    pub fn apply(&self, e: &mut Export) {
        if let Some(b) = self.backend {
            e.backend(b);
        }
        e.layout(self.layout).system_lib(self.system_lib).prefix(self.prefix.clone()).linker(self.linker.clone());
        if let Some(t) = &self.target {
            e.target(t.clone());
        }
        if let Some(d) = &self.emit_devc {
            e.emit_devc(d.clone());
        }
        for a in &self.link_args {
            e.link_arg(a.clone());
        }
        e.keep_temp(self.keep_temp);
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
    pub fn write(&self, e: &Export) -> Result<ExitCode> {
        let report = e.write(&self.output)?;
        if !self.quiet {
            print_report(&report, self.layout);
        }
        Ok(ExitCode::SUCCESS)
    }
}

fn print_report(r: &ExportReport, layout: Layout) {
    match &r.symbol {
        Some(sym) => println!("wrote {} ({sym}, {} layout, blob {} bytes)", r.output.display(), layout, r.blob_len),
        None => println!("wrote {} (no imports: a plain library without a blob)", r.output.display()),
    }
    if let Some(dir) = &r.kept_temp_dir {
        println!("kept intermediate files in {}", dir.display());
    }
}

/// Arguments of `mblob pack`.
#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// The `.so` or raw `.blob` whose module tree is packed again. It is read, never run;
    /// payload kinds mblob does not know are carried over as opaque bytes.
    #[arg(long, value_name = "IN")]
    pub from: PathBuf,
    /// Layout of a raw `.blob` input (default: detected).
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout)]
    pub from_layout: Option<Layout>,
    /// Host object files to link (the new library's code; the blob's `_lib` stands for them).
    #[arg(long = "host", value_name = "OBJ", num_args = 1..)]
    pub host: Vec<PathBuf>,
    /// Output and packing options.
    #[command(flatten)]
    pub options: PackOptionsArgs,
}

/// Runs `mblob pack`.
pub fn run(args: &PackArgs) -> Result<ExitCode> {
    let path = &args.from;
    let data = mblob_runtime::map_file(path)?;
    let registry = Registry::default();
    let (blob, layout) = if data.starts_with(b"\x7fELF") {
        let (found, bytes) = elf::slice_blob(&data, None)
            .map_err(|detail| mblob_runtime::Error::Elf { path: path.clone(), detail })?
            .ok_or_else(|| Error::Invalid {
                what: path.display().to_string(),
                detail: "has no blob symbol: a plain library has no module tree to pack".into(),
            })?;
        (bytes, found.layout)
    } else {
        let layout = match args.from_layout {
            Some(l) => l,
            None => Layout::detect(&data, &registry)
                .map_err(|source| mblob_runtime::Error::Detect { path: path.clone(), source })?,
        };
        (data.clone(), layout)
    };
    let loaded = load_blob(&blob, layout, &registry, &LoadOptions::keep_unknown()).map_err(|e| match e {
        mblob_runtime::Error::Blob { source, .. } => mblob_runtime::Error::Blob { path: path.clone(), source }.into(),
        other => Error::from(other),
    })?;
    let tree = ModuleTree::from_loaded(&loaded, "llvm")
        .map_err(|e| Error::Invalid { what: path.display().to_string(), detail: e.to_string() })?;
    let mut e = Export::from_tree(tree);
    e.objects(args.host.iter().cloned());
    args.options.apply(&mut e);
    args.options.write(&e)
}
