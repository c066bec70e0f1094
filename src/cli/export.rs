//! `mblob export`: build a shared library from a module tree described in JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use super::pack::PackOptionsArgs;
use crate::tree_json::read_tree_json_with_packing;
use crate::Result;

/// Arguments of `mblob export`.
#[derive(Debug, clap::Args)]
#[command(after_help = concat!("TREE.json describes one module per JSON object:
  payload modules:  {\"type_key\": \"GraphExecutorFactory\", \"payload\": \"factory.bin\", \"imports\": [...]}
  device modules:   {\"type_key\": \"cuda\", \"format\": \"ptx\", \"data\": \"kernels.ptx\",
                     \"functions\": {\"add\": {\"arg_types\": [\"handle\", \"int32\"],
                                          \"launch_param_tags\": [\"blockIdx.x\", \"threadIdx.x\"]}}}
  DSO parts:        {\"type_key\": \"llvm\" | \"c\" | \"static_library\",
                     \"objects\": [\"lib0.o\"], \"sources\": [\"host.c\"], \"ir\": [\"host.ll\"], \"imports\": [...]}
The root may also say how the tree was packed (`mblob extract` writes it):
  {\"layout\": \"ffi\", \"symbol\": \"p___tvm_ffi__library_bin\", \"prefix\": \"p_\", \"system_lib\": true, ...}
which are the defaults of --layout, --prefix and --system-lib (so extract-then-export rebuilds
the same library).
Paths are relative to TREE.json. A payload file holds the module's bytes as TVM writes them in a
classic blob; kinds mblob knows (graph factory, device kinds) are decoded and written again in
the chosen --layout, others are copied as they are. Nodes with the same \"id\" are one module
imported twice.
Sources ending in .cc, .cpp, .cxx or .C are C++ (the library then links libstdc++).

", super::pack::export_environment_help!()))]
pub struct ExportArgs {
    /// The tree description.
    #[arg(value_name = "TREE.json")]
    pub tree: PathBuf,
    /// Output and packing options.
    #[command(flatten)]
    pub options: PackOptionsArgs,
}

/// Runs `mblob export`.
pub fn run(args: &ExportArgs) -> Result<ExitCode> {
    // TREE.json's root may say how the tree was packed (`mblob extract` writes it): its layout,
    // prefix and system-lib mode are the defaults, so that extract-then-export rebuilds the
    // same library.
    let (mut e, packing) = read_tree_json_with_packing(&args.tree)?;
    args.options.apply(&mut e, packing.layout.unwrap_or(mblob_runtime::Layout::Classic));
    args.options.write(&mut e)
}
