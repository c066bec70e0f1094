//! `mblob extract`: the contents of a packed `.so`, a raw `.blob` or an exported `.tar`, as
//! files.
//!
//! For each module (blob index `I`, type key `K`) it writes `I.K.bin`, the payload as the blob
//! holds it, and for the kinds it knows their parts:
//! - graph factories: `I.graph.json` (the graph JSON as stored) and `I.params`, the
//!   parameters in the format of TVM's `save_param_dict` (what `load_param_dict` reads);
//! - Relax executables: `I.constants.params`, the constant pool's tensors (the weights) in
//!   that format, each named `c[K]` by its pool index as TVM's VM text prints it;
//! - device modules: the code (`I.K.ptx`, `.cubin`, `.fatbin`, `.cl`, `.metal`, `.cu`, ...),
//!   per-kernel sources (`I.<kernel>.metal`, `.wgsl`) or SPIR-V (`I.<kernel>.spv`), and the
//!   function table `I.functions.json` (the shape `inspect --json` prints).
//!
//! It also writes `tree.json`, a TREE.json from which `mblob export` builds the same blob:
//! device modules from their parts, other modules from their payload files, and each `_lib`
//! as an `llvm` part. From a `.tar` (TVM's `export_library("x.tar")`), the archive's host
//! objects (`lib0.o`, ...) are written too and listed as that part's objects, so `mblob export
//! tree.json` links a working library; from a `.so` or `.blob` the part has no objects (add
//! the host objects to link). The directory appears only when everything was written.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use mblob::tree_json::{FunctionTable, Node, Ordered, ShaderJson};
use mblob_runtime::format::{self, EntryKind, ParsedBlob, UnknownKeys};
use mblob_runtime::payload::device::{DeviceForm, DeviceModule};
use mblob_runtime::payload::graph::{GraphExecutorFactory, Tensor as PayloadTensor};
use mblob_runtime::payload::relax::{Constant, RelaxExecutable};
use mblob_runtime::{Bytes, ImportTree, Layout, LoadedTree, Registry};

use super::inspect::parse_layout;
use crate::inspect::inspect_bytes;
use crate::{Error, Result};

/// Arguments of `mblob extract`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Files written, for the module at blob index I with type key K:
  I.K.bin             the payload as the blob holds it
  I.graph.json        graph factories: the graph JSON
  I.params            graph factories: the params, as TVM's save_param_dict writes them
  I.constants.params  Relax executables: the tensor constants, in that format, named c[K]
                      by their index in the constant pool
  I.K.ptx|cubin|...   device modules: the code, named by its format
  I.<kernel>.metal|wgsl|spv   device modules with per-kernel sources or shaders
  I.functions.json    device modules: the function table
  tree.json           a TREE.json for `mblob export` that gives back the same blob")]
pub struct ExtractArgs {
    /// A packed `.so`, a raw `.blob`, or a `.tar`: TVM's `export_library("x.tar")`
    /// (gzip-compressed) or `mblob export -o X.tar`.
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// The directory to write (created, with its missing parents; it must not exist, or be
    /// empty).
    #[arg(short, long, value_name = "DIR")]
    pub output: PathBuf,
    /// Read a raw `.blob` as this layout instead of detecting it.
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout)]
    pub layout: Option<Layout>,
    /// Only consider blob symbols with this `c_symbol_prefix`.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Runs `mblob extract`.
pub fn run(args: &ExtractArgs) -> Result<ExitCode> {
    let path = &args.path;
    let out = &args.output;
    check_output_dir(out)?;
    let data = mblob_runtime::map_file(path)?;
    let report = inspect_bytes(&data, path, args.layout, args.prefix.as_deref())?;
    if let Some(models) = &report.bundle {
        return Err(Error::Bundle {
            path: path.clone(),
            models: models.iter().map(|m| format!("{} ({})", m.prefix, m.symbol)).collect(),
        });
    }
    let (Some(blob), Some(layout)) = (report.blob.clone(), report.layout.and_then(Layout::from_name)) else {
        return Err(Error::Input {
            what: path.display().to_string(),
            detail: "holds no blob: a plain library has no modules to extract".into(),
        });
    };
    let registry = Registry::default();
    let parsed = format::parse_blob(&blob, layout, &registry, UnknownKeys::KeepRaw)
        .map_err(|source| mblob_runtime::Error::Blob { path: path.clone(), source })?;
    // A TVM `.tar` holds the host code beside the blob: its objects go with the extracted parts.
    let host: Vec<(String, Bytes)> = match mblob::tvm_tar::TvmTar::from_bytes(&data, path)? {
        Some(tar) => tar
            .host_objects()
            .into_iter()
            .map(|m| {
                let base =
                    Path::new(&m.name).file_name().map_or_else(|| m.name.clone(), |n| n.to_string_lossy().into());
                (safe(&base), m.data.clone())
            })
            .collect(),
        None => Vec::new(),
    };
    let packing = Packing {
        layout: layout.name().to_owned(),
        symbol: report.symbol.clone(),
        prefix: report.prefix.clone(),
        system_lib: report.system_lib,
    };
    let files = plan(&parsed, &blob, &registry, &host, &packing)
        .map_err(|detail| Error::Input { what: path.display().to_string(), detail: detail.into() })?;

    // Written into a fresh directory beside the output, moved into place when complete (`-o
    // a/b` creates `a` too, and removes it again on failure).
    let staged = super::output::StagedDir::new(out)?;
    for (name, content) in &files {
        match content {
            FileData::Bytes(bytes) => staged.write(name, bytes)?,
            FileData::Params(tensors) => {
                staged.write_with(name, &mut |w| mblob_runtime::exec::graph::write_params(tensors, w))?
            }
        }
    }
    staged.commit(check_output_dir)?;
    if !args.quiet {
        println!("wrote {} files to {} ({} layout)", files.len(), out.display(), layout.name());
        for (name, content) in &files {
            println!("  {name:<32} {:>10} bytes", content.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The output directory must not exist, or be an empty directory, and its parent must exist.
fn check_output_dir(out: &Path) -> Result<()> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::OutputPath {
                    what: out.display().to_string(),
                    detail: "exists and is not empty: extract writes into a new or empty directory".into(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(out, "cannot use as the output directory")(e)),
    }
}

/// How the source library was packed, for the root of `tree.json`.
struct Packing {
    layout: String,
    symbol: Option<String>,
    prefix: Option<String>,
    system_lib: Option<bool>,
}

/// What a file extract writes holds: bytes (views of the mapped input, or text made here), or
/// tensors written as a params file straight into the file.
enum FileData {
    Bytes(Bytes),
    Params(Vec<(String, PayloadTensor)>),
}

impl FileData {
    /// The file's length.
    fn len(&self) -> u64 {
        match self {
            FileData::Bytes(b) => b.len() as u64,
            FileData::Params(tensors) => mblob_runtime::exec::graph::params_len(tensors),
        }
    }
}

impl From<Vec<u8>> for FileData {
    fn from(v: Vec<u8>) -> FileData {
        FileData::Bytes(Bytes::from_vec(v))
    }
}

/// Every file to write, name and what it holds, with `tree.json` last. Nothing is copied:
/// payloads, code and parameters are views of the input, written out as they are read.
fn plan(
    parsed: &ParsedBlob<'_>,
    blob: &Bytes,
    registry: &Registry,
    host: &[(String, Bytes)],
    packing: &Packing,
) -> std::result::Result<Vec<(String, FileData)>, String> {
    let mut files: Vec<(String, FileData)> = Vec::new();
    let mut used = HashSet::new();
    let mut name = |wanted: String| -> String {
        let mut n = wanted.clone();
        let mut k = 1;
        while !used.insert(n.clone()) {
            k += 1;
            n = format!("{k}.{wanted}");
        }
        n
    };
    let modules: Vec<_> = parsed.modules().collect();
    let mut nodes: Vec<Node> = Vec::with_capacity(modules.len());
    for (i, e) in modules.iter().enumerate() {
        if e.kind == EntryKind::Lib {
            nodes.push(Node { type_key: Some("llvm".into()), objects: Some(vec![]), ..Node::default() });
            continue;
        }
        let mut node = Node { type_key: Some(e.type_key.to_owned()), ..Node::default() };
        let payload_file = name(format!("{i}.{}.bin", safe(e.type_key)));
        let payload = blob.slice_ref(e.payload).unwrap_or_else(|| Bytes::from_vec(e.payload.to_vec()));
        files.push((payload_file.clone(), FileData::Bytes(payload.clone())));
        let module = registry.get(e.type_key).and_then(|l| l.load(payload, parsed.layout).ok());
        let any = module.as_ref().and_then(|m| m.as_payload()).map(|p| p.as_any());
        if let Some(g) = any.and_then(|a| a.downcast_ref::<GraphExecutorFactory>()) {
            files.push((name(format!("{i}.graph.json")), g.graph_json.as_bytes().to_vec().into()));
            files.push((name(format!("{i}.params")), FileData::Params(g.params.clone())));
        }
        if let Some(x) = any.and_then(|a| a.downcast_ref::<RelaxExecutable>()) {
            if let Some(tensors) = relax_constants(x) {
                files.push((name(format!("{i}.constants.params")), FileData::Params(tensors)));
            }
        }
        match any.and_then(|a| a.downcast_ref::<DeviceModule>()) {
            Some(d) => device_parts(i, d, &mut node, &mut files, &mut name)?,
            None => node.payload = Some(payload_file),
        }
        nodes.push(node);
    }
    let mut tree = tree_json(parsed, nodes);
    tree.layout = Some(packing.layout.clone());
    tree.symbol.clone_from(&packing.symbol);
    tree.prefix = packing.prefix.clone().filter(|p| !p.is_empty());
    tree.system_lib = packing.system_lib.filter(|s| *s);
    if !host.is_empty() {
        let mut objects = Vec::with_capacity(host.len());
        for (n, bytes) in host {
            let n = name(n.clone());
            files.push((n.clone(), FileData::Bytes(bytes.clone())));
            objects.push(n);
        }
        give_objects(&mut tree, &objects);
    }
    let mut text = serde_json::to_vec_pretty(&tree).map_err(|e| e.to_string())?;
    text.push(b'\n');
    files.push((name("tree.json".into()), text.into()));
    Ok(files)
}

/// Lists `objects` as the host code of every `llvm` part of `node`'s tree (a blob has one
/// `_lib`; the host objects of a TVM `.tar` are its code).
fn give_objects(node: &mut Node, objects: &[String]) {
    if node.type_key.as_deref() == Some("llvm") && node.objects.as_ref().is_some_and(Vec::is_empty) {
        node.objects = Some(objects.to_vec());
    }
    for child in node.imports.iter_mut().flatten() {
        give_objects(child, objects);
    }
}

/// A device module's parts as files, and its TREE.json fields.
fn device_parts(
    i: usize,
    d: &DeviceModule,
    node: &mut Node,
    files: &mut Vec<(String, FileData)>,
    name: &mut dyn FnMut(String) -> String,
) -> std::result::Result<(), String> {
    if d.type_key != mblob_runtime::payload::device::WEBGPU {
        node.format = Some(d.format.clone());
    }
    if let DeviceForm::VersionSmapFmapFmt { version } = &d.form {
        node.version = Some(version.clone());
    }
    let table = FunctionTable::of(&d.functions);
    let mut text = serde_json::to_vec_pretty(&table).map_err(|e| e.to_string())?;
    text.push(b'\n');
    files.push((name(format!("{i}.functions.json")), text.into()));
    node.functions = Some(table);
    match &d.form {
        DeviceForm::FmtFmapData => {
            let f = name(format!("{i}.{}.{}", safe(&d.type_key), code_extension(&d.format)));
            files.push((f.clone(), FileData::Bytes(d.data.clone())));
            node.data = Some(f);
        }
        DeviceForm::FmtFmapShaders => {
            let mut shaders = Vec::new();
            for (kernel, s) in &d.shaders {
                let f = name(format!("{i}.{}.spv", safe(kernel)));
                files.push((f.clone(), FileData::Bytes(s.words.clone())));
                shaders.push((kernel.clone(), ShaderJson { flag: s.flag, data: f }));
            }
            node.shaders = Some(Ordered(shaders));
        }
        _ => {
            let ext = source_extension(&d.type_key);
            let mut smap = Vec::new();
            for (kernel, src) in &d.sources {
                let f = name(format!("{i}.{}.{ext}", safe(kernel)));
                files.push((f.clone(), FileData::Bytes(src.clone())));
                smap.push((kernel.clone(), f));
            }
            node.smap = Some(Ordered(smap));
        }
    }
    Ok(())
}

/// The nested TREE.json of the blob's import tree; a module imported more than once is
/// written once with an `id` and referred to by it after.
fn tree_json(parsed: &ParsedBlob<'_>, nodes: Vec<Node>) -> Node {
    let Some(tree) = &parsed.import_tree else {
        // Legacy: the library imports every module (in descending order, as below).
        let imports: Vec<Node> = nodes.into_iter().rev().collect();
        let imports = (!imports.is_empty()).then_some(imports);
        return Node { type_key: Some("llvm".into()), objects: Some(vec![]), imports, ..Node::default() };
    };
    let mut count = vec![0usize; nodes.len()];
    for &c in &tree.child_indices {
        if let Some(n) = count.get_mut(c as usize) {
            *n += 1;
        }
    }
    struct Walk<'a> {
        tree: &'a ImportTree,
        nodes: &'a [Node],
        count: &'a [usize],
        seen: Vec<bool>,
    }
    impl Walk<'_> {
        fn node(&mut self, i: usize, depth: usize) -> Node {
            let mut node = self.nodes.get(i).cloned().unwrap_or_default();
            if self.count.get(i).copied().unwrap_or(0) > 1 {
                if self.seen[i] {
                    return Node { id: Some(i.into()), ..Node::default() };
                }
                self.seen[i] = true;
                node.id = Some(i.into());
            }
            // The blob lists children in ascending index order, and the serializer numbers the
            // last import first: imports in descending order number as in the blob. (The blob
            // parser checked the tree; the depth bound only keeps a forged one from recursing
            // without end.)
            if depth < LoadedTree::MAX_SHAPE_DEPTH {
                let imports: Vec<Node> =
                    self.tree.children(i).iter().rev().map(|&c| self.node(c as usize, depth + 1)).collect();
                node.imports = (!imports.is_empty()).then_some(imports);
            }
            node
        }
    }
    let mut walk = Walk { tree, nodes: &nodes, count: &count, seen: vec![false; nodes.len()] };
    walk.node(0, 0)
}

/// A Relax executable's tensor constants in TVM's params format, named `c[K]` by their
/// index in the constant pool (as TVM's VM text names them); `None` when it has none.
fn relax_constants(x: &RelaxExecutable) -> Option<Vec<(String, PayloadTensor)>> {
    let tensors: Vec<(String, _)> = x
        .constants
        .iter()
        .enumerate()
        .filter_map(|(k, c)| match c {
            Constant::Tensor(t) => Some((format!("c[{k}]"), (**t).clone())),
            _ => None,
        })
        .collect();
    (!tensors.is_empty()).then_some(tensors)
}

/// The file extension of a device module's code, by its format.
fn code_extension(format: &str) -> String {
    match format {
        "ptx" | "cubin" | "fatbin" | "cl" | "metal" | "hsaco" | "spv" | "wgsl" => format.to_owned(),
        "cuda" => "cu".into(),
        "" => "bin".into(),
        other => safe(other),
    }
}

/// The file extension of per-kernel sources, by the module's kind.
fn source_extension(type_key: &str) -> &'static str {
    match type_key {
        "metal" => "metal",
        "webgpu" => "wgsl",
        _ => "txt",
    }
}

/// A name safe as part of a file name: letters, digits, `.`, `_` and `-` kept, the rest `_`.
fn safe(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with('.') {
        format!("_{s}")
    } else {
        s
    }
}
