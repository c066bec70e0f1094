//! `mblob inspect`: what a packed `.so` or `.blob` holds, read without running it.
//!
//! `--json` prints one JSON object per file, one per line (JSON Lines). Its keys, a wire
//! format that scripts may rely on:
//! - `file`: the path as given; `kind`: `"elf"` or `"blob"`.
//! - `symbol`: the blob symbol found (`null` for a raw blob or a library without one);
//!   `section`, `file_offset`: where it lies in the ELF file.
//! - `layout`: `"classic"`, `"classic-0.21"`, `"ffi"`, or `null` when there is no blob;
//!   `legacy`: true for a classic blob without an import tree.
//! - `blob_len`: bytes of the blob, 8-byte header included.
//! - `type_keys`, `payload_lens`, `payload_offsets`, `key_offsets`: one element per entry in
//!   blob order (for the classic layouts `_lib` and `_import_tree` included as they appear).
//!   Offsets count from the first byte of the blob (header included).
//! - `row_ptr`, `child_indices`: the CSR import tree (empty when there is none).
//! - `modules`: one object per entry in blob order: `type_key`, `index` (module index, `null`
//!   for `_import_tree`), `payload_len`, and for device kinds `format` and `functions` (name to
//!   `{arg_types, launch_param_tags}`), for graph factories `graph_json_len`, `params` and
//!   `module_name`.
//! - `tree`: the import tree as nested `{index, type_key, imports}`.
//! - with `--load`: `loaded`, the tree after loading, nested `{type_key, imports}`.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use mblob_runtime::format::{self, EntryKind, ParsedBlob, UnknownKeys};
use mblob_runtime::payload::device::DeviceModule;
use mblob_runtime::payload::graph::GraphExecutorFactory;
use mblob_runtime::{elf, Bytes, Layout, LoadOptions, LoadedTree, Registry, TreeShape};
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::{Error, Result};

/// Arguments of `mblob inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Packed `.so` files, or raw `.blob` files (the blob symbol's bytes, header included).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Print one JSON object per file instead of text (keys documented in the crate docs of
    /// `mblob::cli::inspect`).
    #[arg(long)]
    pub json: bool,
    /// Also load the file with the real loader (this dlopens it and so runs its initialisers)
    /// and print the tree after loading.
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

/// Parses a layout name for clap.
pub fn parse_layout(s: &str) -> std::result::Result<Layout, String> {
    Layout::from_name(s)
        .ok_or_else(|| format!("unknown layout `{s}` (expected one of: {})", Layout::ALL.map(|l| l.name()).join(", ")))
}

/// What `inspect` found in one file.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The path as given.
    pub file: String,
    /// `elf` or `blob`.
    pub kind: &'static str,
    /// The blob symbol.
    pub symbol: Option<String>,
    /// The ELF section holding it.
    pub section: Option<String>,
    /// Its offset in the file.
    pub file_offset: Option<u64>,
    /// The layout name.
    pub layout: Option<&'static str>,
    /// A classic blob without an import tree.
    pub legacy: bool,
    /// Bytes of the blob, header included.
    pub blob_len: Option<u64>,
    /// Entry keys in blob order.
    pub type_keys: Vec<String>,
    /// Payload lengths in blob order.
    pub payload_lens: Vec<u64>,
    /// Payload offsets in blob order.
    pub payload_offsets: Vec<u64>,
    /// Key offsets in blob order.
    pub key_offsets: Vec<u64>,
    /// CSR row pointers.
    pub row_ptr: Vec<u64>,
    /// CSR children.
    pub child_indices: Vec<u64>,
    /// One object per entry.
    pub modules: Vec<Value>,
    /// The import tree, nested.
    pub tree: Option<Value>,
    /// The tree after loading (with `--load`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<Value>,
}

/// Runs `mblob inspect`: reports each file, continuing past files that fail; the exit code is
/// 1 when any failed.
pub fn run(args: &InspectArgs) -> Result<ExitCode> {
    let mut failed = false;
    for path in &args.paths {
        match inspect_path(path, args) {
            Ok(report) => {
                let mut out = io::stdout().lock();
                let written = if args.json {
                    serde_json::to_writer(&mut out, &report).map_err(io::Error::from).and_then(|_| writeln!(out))
                } else {
                    out.write_all(render_text(&report).as_bytes())
                };
                written.map_err(Error::io("<stdout>", "cannot write"))?;
            }
            Err(e) => {
                failed = true;
                super::report(&e);
            }
        }
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Inspects one file.
pub fn inspect_path(path: &Path, args: &InspectArgs) -> Result<Report> {
    let data = mblob_runtime::map_file(path)?;
    let mut report = inspect_bytes(&data, path, args.layout, args.prefix.as_deref())?;
    if args.load {
        report.loaded = Some(load_shape(path, &data, &report, args)?);
    }
    Ok(report)
}

/// Inspects the bytes of a file: an ELF file is searched for a blob symbol, anything else is
/// read as a raw blob (of `layout`, or detected).
pub fn inspect_bytes(data: &Bytes, path: &Path, layout: Option<Layout>, prefix: Option<&str>) -> Result<Report> {
    let registry = Registry::default();
    let mut report = Report {
        file: path.display().to_string(),
        kind: "blob",
        symbol: None,
        section: None,
        file_offset: None,
        layout: None,
        legacy: false,
        blob_len: None,
        type_keys: vec![],
        payload_lens: vec![],
        payload_offsets: vec![],
        key_offsets: vec![],
        row_ptr: vec![],
        child_indices: vec![],
        modules: vec![],
        tree: None,
        loaded: None,
    };
    let blob_error = |source| Error::Runtime(mblob_runtime::Error::Blob { path: path.to_owned(), source });
    let (blob, layout) = if data.starts_with(b"\x7fELF") {
        report.kind = "elf";
        let found = elf::slice_blob(data, prefix)
            .map_err(|detail| mblob_runtime::Error::Elf { path: path.to_owned(), detail })?;
        let Some((found, blob)) = found else { return Ok(report) };
        report.symbol = Some(found.symbol.clone());
        report.section = Some(found.section.clone());
        report.file_offset = Some(found.file_offset);
        (blob, found.layout)
    } else {
        let layout = match layout {
            Some(l) => l,
            None => Layout::detect(data, &registry)
                .map_err(|source| mblob_runtime::Error::Detect { path: path.to_owned(), source })?,
        };
        (data.clone(), layout)
    };
    let parsed = format::parse_blob(&blob, layout, &registry, UnknownKeys::KeepOpaque).map_err(blob_error)?;
    fill(&mut report, &parsed, &blob, &registry);
    Ok(report)
}

fn fill(report: &mut Report, parsed: &ParsedBlob<'_>, blob: &Bytes, registry: &Registry) {
    report.layout = Some(parsed.layout.name());
    report.legacy = parsed.import_tree.is_none();
    report.blob_len = Some(parsed.nbytes + 8);
    if let Some(t) = &parsed.import_tree {
        report.row_ptr = t.row_ptr.clone();
        report.child_indices = t.child_indices.clone();
    }
    let mut index = 0usize;
    for e in &parsed.entries {
        report.type_keys.push(e.type_key.to_owned());
        report.payload_lens.push(e.payload.len() as u64);
        report.payload_offsets.push(e.payload_offset);
        report.key_offsets.push(e.key_offset);
        let mut m = Map::new();
        m.insert("type_key".into(), json!(e.type_key));
        m.insert("payload_len".into(), json!(e.payload.len()));
        if e.kind == EntryKind::ImportTree {
            m.insert("index".into(), Value::Null);
        } else {
            m.insert("index".into(), json!(index));
            index += 1;
        }
        if e.kind == EntryKind::Module {
            let payload = blob.slice_ref(e.payload).unwrap_or_else(|| Bytes::from_vec(e.payload.to_vec()));
            describe(&mut m, e.type_key, payload, parsed.layout, registry);
        }
        report.modules.push(Value::Object(m));
    }
    report.tree = Some(tree_value(parsed));
}

/// Adds what is known about a payload kind (decoded with its loader, which runs no code).
fn describe(m: &mut Map<String, Value>, key: &str, payload: Bytes, layout: Layout, registry: &Registry) {
    let Some(loader) = registry.get(key) else { return };
    let module = match loader.load(payload, layout) {
        Ok(module) => module,
        Err(e) => {
            m.insert("error".into(), json!(e.to_string()));
            return;
        }
    };
    let Some(any) = module.as_payload().map(|p| p.as_any()) else { return };
    if let Some(g) = any.downcast_ref::<GraphExecutorFactory>() {
        m.insert("graph_json_len".into(), json!(g.graph_json.len()));
        m.insert("module_name".into(), json!(g.module_name));
        let params: Vec<Value> = g
            .params
            .iter()
            .map(|(name, t)| json!({"name": name, "dtype": t.dtype.to_string(), "shape": t.shape, "bytes": t.data.len()}))
            .collect();
        m.insert("params".into(), Value::Array(params));
    }
    describe_device(m, any);
}

fn describe_device(m: &mut Map<String, Value>, any: &dyn std::any::Any) {
    let Some(d) = any.downcast_ref::<DeviceModule>() else { return };
    m.insert("format".into(), json!(d.format));
    let mut functions = Map::new();
    for (name, info) in &d.functions {
        let mut f = Map::new();
        f.insert("arg_types".into(), json!(info.arg_types.iter().map(|t| t.to_string()).collect::<Vec<_>>()));
        f.insert("launch_param_tags".into(), json!(info.launch_param_tags));
        if !info.arg_extra_tags.is_empty() {
            f.insert("arg_extra_tags".into(), json!(info.arg_extra_tags));
        }
        functions.insert(name.clone(), Value::Object(f));
    }
    m.insert("functions".into(), Value::Object(functions));
    if !d.data.is_empty() {
        m.insert("data_len".into(), json!(d.data.len()));
    }
}

/// The import tree as nested JSON. Bounded as [`mblob_runtime::LoadedTree::shape`] is: a
/// module imported by several parents appears under each, so the expansion stops (nodes keep
/// no imports) at as many nodes as there are modules and edges plus 4096, and below
/// `LoadedTree::MAX_SHAPE_DEPTH` levels; without that, a 4 KB blob of shared imports hung.
fn tree_value(parsed: &ParsedBlob<'_>) -> Value {
    fn walk(parsed: &ParsedBlob<'_>, modules: &[&str], index: usize, depth: usize, budget: &mut usize) -> Value {
        let key = modules.get(index).copied().unwrap_or("?");
        let imports: Vec<Value> = match &parsed.import_tree {
            Some(t) => {
                let children = t.children(index);
                if depth < LoadedTree::MAX_SHAPE_DEPTH && *budget >= children.len() {
                    *budget -= children.len();
                    children.iter().map(|&c| walk(parsed, modules, c as usize, depth + 1, budget)).collect()
                } else {
                    vec![]
                }
            }
            // Legacy: the library imports every module.
            None if depth == 0 => {
                return json!({"index": null, "type_key": "library", "imports":
                    modules.iter().enumerate().map(|(i, k)| json!({"index": i, "type_key": k, "imports": []})).collect::<Vec<_>>()});
            }
            None => vec![],
        };
        json!({"index": index, "type_key": key, "imports": imports})
    }
    let modules: Vec<&str> = parsed.modules().map(|e| e.type_key).collect();
    let edges = parsed.import_tree.as_ref().map_or(0, |t| t.child_indices.len());
    let mut budget = modules.len().saturating_add(edges).saturating_add(1 << 12);
    walk(parsed, &modules, 0, 0, &mut budget)
}

#[allow(unsafe_code)]
fn load_shape(path: &Path, data: &Bytes, report: &Report, args: &InspectArgs) -> Result<Value> {
    let registry = Registry::default();
    let unknown = if args.keep_unknown { UnknownKeys::KeepOpaque } else { UnknownKeys::Error };
    let options = LoadOptions { prefix: args.prefix.clone(), unknown };
    let loaded = if report.kind == "elf" {
        // SAFETY: `--load` is the user's explicit request to open the library with the real
        // loader, which runs its initialisers; its help says so.
        unsafe { mblob_runtime::load_library(path, &registry, &options) }?
    } else {
        let layout = report.layout.and_then(Layout::from_name).unwrap_or(Layout::Classic);
        mblob_runtime::load_blob(data, layout, &registry, &options)?
    };
    Ok(shape_value(&loaded.shape()))
}

fn shape_value(s: &TreeShape) -> Value {
    json!({"type_key": s.type_key, "imports": s.imports.iter().map(shape_value).collect::<Vec<_>>()})
}

/// The text form of a report.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "{}", r.file);
    match (&r.symbol, r.kind) {
        (Some(sym), _) => {
            let _ = writeln!(
                s,
                "  symbol   {sym} (section {}, file offset {})",
                r.section.as_deref().unwrap_or("?"),
                r.file_offset.unwrap_or(0)
            );
        }
        (None, "elf") => {
            let _ = writeln!(s, "  symbol   none: a plain library (loads as one `library` module)");
        }
        (None, _) => {
            let _ = writeln!(s, "  symbol   none: raw blob file");
        }
    }
    if let Some(layout) = r.layout {
        let legacy = if r.legacy { " (legacy: no import tree)" } else { "" };
        let _ = writeln!(s, "  layout   {layout}{legacy}");
        let _ = writeln!(s, "  blob     {} bytes", r.blob_len.unwrap_or(0));
        let _ = writeln!(s, "  entries  (offsets from the first byte of the blob)");
        let width = r.type_keys.iter().map(|k| k.len()).max().unwrap_or(8).max(8);
        let _ = writeln!(s, "    {:>5}  {:<width$}  {:>12}  {:>10}", "index", "type_key", "payload", "offset");
        for (i, m) in r.modules.iter().enumerate() {
            let index = m.get("index").and_then(Value::as_u64).map_or("-".to_owned(), |i| i.to_string());
            let _ = writeln!(
                s,
                "    {:>5}  {:<width$}  {:>12}  {:>10}",
                index, r.type_keys[i], r.payload_lens[i], r.payload_offsets[i]
            );
            if let Some(fmt) = m.get("format").and_then(Value::as_str) {
                let _ = writeln!(s, "           format {fmt}");
            }
            if let Some(Value::Object(funcs)) = m.get("functions") {
                for (name, info) in funcs {
                    let args: Vec<&str> =
                        info["arg_types"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                    let tags: Vec<&str> =
                        info["launch_param_tags"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                    let _ = writeln!(s, "           kernel {name}({}) launch [{}]", args.join(", "), tags.join(", "));
                }
            }
            if let Some(Value::Array(params)) = m.get("params") {
                for p in params {
                    let _ = writeln!(
                        s,
                        "           param {} {} {} ({} bytes)",
                        p["name"], p["dtype"], p["shape"], p["bytes"]
                    );
                }
            }
        }
        if let Some(tree) = &r.tree {
            let _ = writeln!(s, "  import tree");
            let shape = value_shape(tree, true);
            for line in shape.render().lines() {
                let _ = writeln!(s, "    {line}");
            }
        }
    }
    if let Some(loaded) = &r.loaded {
        let _ = writeln!(s, "  loaded tree");
        for line in value_shape(loaded, false).render().lines() {
            let _ = writeln!(s, "    {line}");
        }
    }
    s
}

fn value_shape(v: &Value, with_index: bool) -> TreeShape {
    let key = v["type_key"].as_str().unwrap_or("?");
    let type_key = match v.get("index").and_then(Value::as_u64) {
        Some(i) if with_index => format!("[{i}] {key}"),
        _ => key.to_owned(),
    };
    let imports =
        v["imports"].as_array().map(|a| a.iter().map(|c| value_shape(c, with_index)).collect()).unwrap_or_default();
    TreeShape { type_key, imports }
}
