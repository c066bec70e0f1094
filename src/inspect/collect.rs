//! Filling a [`Report`] from a parsed blob: what each payload kind holds, decoded with its
//! loader (which runs no code), the host code of a shared library, the import tree.

use super::relax::{describe_relax, describe_relax_more};
use super::report::{
    AotReport, DeviceReport, GraphReport, GraphTensor, HostFunction, HostReport, LoadedNode, ModuleReport, NamedLen,
    ParamReport, Report, TreeNode,
};
use crate::tree_json::FunctionTable;
use mblob_runtime::exec::aot::{AotFactory, AotFactoryPayload, AOT_EXECUTOR_FACTORY};
use mblob_runtime::format::{EntryKind, ParsedBlob};
use mblob_runtime::payload::device::DeviceModule;
use mblob_runtime::payload::graph::GraphExecutorFactory;
use mblob_runtime::payload::relax::RelaxExecutable;
use mblob_runtime::{Bytes, Layout, LoadedTree, Registry, TreeShape};

pub(super) fn fill(report: &mut Report, parsed: &ParsedBlob<'_>, blob: &Bytes, registry: &Registry) {
    report.layout = Some(parsed.layout.name());
    report.legacy = parsed.import_tree.is_none();
    report.blob_len = Some(parsed.nbytes + 8);
    if let Some(t) = &parsed.import_tree {
        report.row_ptr = t.row_ptr.clone();
        report.child_indices = t.child_indices.clone();
    }
    // The library's functions, as the VM finds kernels (shared libraries only).
    let exports: Option<Vec<String>> =
        report.host.as_ref().map(|h| h.functions.iter().map(|f| f.name.clone()).collect());
    let mut index = 0usize;
    for e in &parsed.entries {
        report.type_keys.push(e.type_key.to_owned());
        report.payload_lens.push(e.payload.len() as u64);
        report.payload_offsets.push(e.payload_offset);
        report.key_offsets.push(e.key_offset);
        let mut m = ModuleReport {
            type_key: e.type_key.to_owned(),
            index: None,
            payload_len: e.payload.len() as u64,
            error: None,
            note: None,
            graph: None,
            device: None,
            relax: None,
            aot: None,
        };
        if e.kind != EntryKind::ImportTree {
            m.index = Some(index);
            index += 1;
        }
        if e.kind == EntryKind::Module {
            // A view of the blob by offset: the parser checked that the payload lies inside it.
            let start = usize::try_from(e.payload_offset).ok();
            match start.and_then(|s| blob.slice(s..s.checked_add(e.payload.len())?)) {
                Some(payload) => describe(&mut m, payload, parsed.layout, registry, exports.as_deref()),
                None => m.error = Some("the payload lies outside the blob".into()),
            }
        }
        report.modules.push(m);
    }
    report.tree = Some(tree_value(parsed));
}

/// Adds what is known about a payload kind (decoded with its loader, which runs no code).
/// `exports`: the functions of the library that holds the blob, when known.
pub(super) fn describe(
    m: &mut ModuleReport,
    payload: Bytes,
    layout: Layout,
    registry: &Registry,
    exports: Option<&[String]>,
) {
    if m.type_key == AOT_EXECUTOR_FACTORY {
        describe_aot(m, &payload);
        return;
    }
    let Some(loader) = registry.get(&m.type_key) else { return };
    let module = match loader.load(payload, layout) {
        Ok(module) => module,
        Err(e) => {
            m.error = Some(e.to_string());
            return;
        }
    };
    let Some(any) = module.as_payload().map(|p| p.as_any()) else { return };
    if let Some(g) = any.downcast_ref::<GraphExecutorFactory>() {
        m.graph = Some(describe_graph(g));
    }
    if let Some(d) = any.downcast_ref::<DeviceModule>() {
        m.device = Some(describe_device(d));
    }
    if let Some(x) = any.downcast_ref::<RelaxExecutable>() {
        let mut r = describe_relax(x);
        describe_relax_more(&mut r, x, exports);
        m.relax = Some(r);
    }
}

/// An `AotExecutorFactory` payload: its name and stored params (inputs and outputs need the
/// loaded library: [`aot_io`]).
fn describe_aot(m: &mut ModuleReport, payload: &Bytes) {
    match AotFactoryPayload::read(payload) {
        Ok(p) => {
            m.aot = Some(AotReport {
                module_name: p.module_name.clone(),
                params: param_reports(&p.params),
                inputs: None,
                outputs: None,
                io_error: None,
            });
            m.note = Some(
                "AOT inputs and outputs are in the library's code (get_c_metadata): pass --load to read them".into(),
            );
        }
        Err(e) => m.error = Some(e.to_string()),
    }
}

/// Fills the AOT factories' inputs and outputs from the loaded tree's metadata, read as the
/// AOT executor reads it.
pub(super) fn aot_io(report: &mut Report, tree: &LoadedTree) {
    let Some(m) = report.modules.iter_mut().find(|m| m.aot.is_some()) else { return };
    m.note = None;
    let Some(aot) = m.aot.as_mut() else { return };
    let metadata = AotFactory::from_tree(tree)
        .and_then(|f| f.default(&[mblob_runtime::device::Device::cpu(0)]))
        .map(|e| e.metadata().clone());
    let infos = |v: &[mblob_runtime::exec::TensorInfo]| -> Vec<GraphTensor> {
        v.iter()
            .map(|t| GraphTensor { name: t.name.clone(), shape: t.shape.clone(), dtype: t.dtype.to_string() })
            .collect()
    };
    match metadata {
        Ok(md) => {
            aot.inputs = Some(infos(&md.inputs));
            aot.outputs = Some(infos(&md.outputs));
        }
        Err(e) => aot.io_error = Some(e.to_string()),
    }
}

fn param_reports(params: &[(String, mblob_runtime::payload::graph::Tensor)]) -> Vec<ParamReport> {
    params
        .iter()
        .map(|(name, t)| ParamReport {
            name: name.clone(),
            dtype: t.dtype.to_string(),
            shape: t.shape.clone(),
            bytes: t.data.len(),
        })
        .collect()
}

fn describe_graph(g: &GraphExecutorFactory) -> GraphReport {
    let params = param_reports(&g.params);
    let (inputs, outputs, graph_error) = match graph_io(&g.graph_json, &g.params) {
        Ok((i, o)) => (i, o, None),
        Err(e) => (vec![], vec![], Some(e)),
    };
    GraphReport {
        graph_json_len: g.graph_json.len(),
        module_name: g.module_name.clone(),
        params,
        inputs,
        outputs,
        graph_error,
    }
}

/// The graph's inputs (argument nodes that are not stored parameters) and outputs (heads),
/// with the shape and type of their entries, read by the graph executor's own parser (which
/// refuses what TVM's `GraphExecutor::Load` refuses, with the JSON path).
pub(super) fn graph_io(
    json: &str,
    params: &[(String, mblob_runtime::payload::graph::Tensor)],
) -> std::result::Result<(Vec<GraphTensor>, Vec<GraphTensor>), String> {
    use mblob_runtime::exec::graph::{Graph, NodeEntry};
    let g = Graph::parse(json).map_err(|e| e.to_string())?;
    let tensor = |e: NodeEntry| -> std::result::Result<GraphTensor, String> {
        let name =
            g.nodes.get(e.node).map(|n| n.name.clone()).ok_or_else(|| format!("node {} does not exist", e.node))?;
        let entry =
            g.node_row_ptr.get(e.node).map(|r| r + e.index).ok_or_else(|| format!("node {} has no entry", e.node))?;
        let shape = g.shape.get(entry).ok_or_else(|| format!("entry {entry} has no shape"))?;
        let dtype = g.dltype.get(entry).ok_or_else(|| format!("entry {entry} has no dltype"))?;
        Ok(GraphTensor { name, shape: shape.clone(), dtype: dtype.to_string() })
    };
    let mut inputs = Vec::new();
    for &node in &g.arg_nodes {
        let t = tensor(NodeEntry { node, index: 0 })?;
        if !params.iter().any(|(p, _)| *p == t.name) {
            inputs.push(t);
        }
    }
    let outputs = g.heads.iter().map(|&h| tensor(h)).collect::<std::result::Result<_, _>>()?;
    Ok((inputs, outputs))
}

fn describe_device(d: &DeviceModule) -> DeviceReport {
    let named = |v: &[(String, Bytes)]| v.iter().map(|(n, b)| NamedLen { name: n.clone(), bytes: b.len() }).collect();
    DeviceReport {
        format: d.format.clone(),
        functions: FunctionTable::of(&d.functions),
        data_len: (!d.data.is_empty()).then_some(d.data.len()),
        smap: named(&d.sources),
        shaders: d.shaders.iter().map(|(n, s)| NamedLen { name: n.clone(), bytes: s.words.len() }).collect(),
        version: match &d.form {
            mblob_runtime::payload::device::DeviceForm::VersionSmapFmapFmt { version } => Some(version.clone()),
            _ => None,
        },
    }
}

/// The exported functions of a shared library and the calling convention its TVM context
/// symbols stand for (`tvm-abi.md`: the slots of 0.8-0.20, `__tvm_ffi_library_ctx` of 0.21,
/// `__tvm_ffi_<name>` functions and `__tvm_ffi__library_ctx` of 0.22+). `None` for an ELF
/// file without a dynamic symbol table (an object file).
pub(super) fn host_report(data: &[u8]) -> Option<HostReport> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let file = object::File::parse(data).ok()?;
    let mut functions = Vec::new();
    let mut context = Vec::new();
    let mut any = false;
    let mut undefined = Vec::new();
    for sym in file.dynamic_symbols() {
        any = true;
        let Ok(name) = sym.name() else { continue };
        if sym.is_undefined() && !sym.is_weak() {
            undefined.push(name);
        }
        if sym.is_undefined() || name.is_empty() {
            continue;
        }
        if sym.kind() == SymbolKind::Text {
            if sym.is_global() && !sym.is_weak() && !["_init", "_fini"].contains(&name) {
                functions.push(name.to_owned());
            }
        } else if is_context_symbol(name) {
            context.push(name.to_owned());
        }
    }
    if !any {
        return None;
    }
    // The one classifier of host code (the loader's and pack's too), over the library's
    // exported and imported symbols.
    let generation = mblob_runtime::format::convention::classify(file.dynamic_symbols().filter_map(|s| {
        Some(mblob_runtime::format::convention::SymbolFact {
            name: s.name().ok()?,
            undefined: s.is_undefined(),
            global_code: s.kind() == SymbolKind::Text && s.is_global(),
        })
    }));
    let convention = generation.map_or("c", |g| g.convention_name());
    let (functions, other_functions): (Vec<String>, Vec<String>) =
        functions.into_iter().partition(|symbol| is_entry_point(symbol, generation));
    let functions = functions
        .into_iter()
        .map(|symbol| {
            let name = match symbol.strip_prefix("__tvm_ffi_") {
                Some(n) if generation.is_some_and(Layout::prefixes_functions) => n.to_owned(),
                _ => symbol.clone(),
            };
            HostFunction { name, symbol }
        })
        .collect();
    let unsupported_imports = mblob_runtime::exec::relax::unprovided_runtime_imports(undefined);
    Some(HostReport {
        convention,
        generation,
        context_symbols: context,
        functions,
        other_functions,
        unsupported_imports,
    })
}

/// Whether an exported code symbol is one TVM calls as a function of the library: TVM's
/// entry points have C names (`extern "C"`, as its codegens and `TVM_DLL_EXPORT_TYPED_FUNC`
/// declare them), so an Itanium C++-mangled name (`_Z...`) is a helper; from TVM 0.22 on,
/// the library exports `__tvm_ffi_<name>` for each entry point and nothing else is one.
fn is_entry_point(symbol: &str, generation: Option<Layout>) -> bool {
    if symbol.starts_with("_Z") {
        return false;
    }
    !generation.is_some_and(Layout::prefixes_functions) || symbol.starts_with("__tvm_ffi_")
}

/// The data symbols TVM's runtime fills in a library: `__TVM*` function-pointer slots and the
/// module context of each era.
fn is_context_symbol(name: &str) -> bool {
    name.starts_with("__TVM") || matches!(name, "__tvm_module_ctx" | "__tvm_ffi_library_ctx" | "__tvm_ffi__library_ctx")
}

/// The import tree, nested. Bounded as [`mblob_runtime::LoadedTree::shape`] is: a module
/// imported by several parents appears under each, so the expansion stops (nodes keep no
/// imports) at as many nodes as there are modules and edges plus 4096, and below
/// `LoadedTree::MAX_SHAPE_DEPTH` levels; without that, a 4 KB blob of shared imports hung.
pub(super) fn tree_value(parsed: &ParsedBlob<'_>) -> TreeNode {
    fn walk(parsed: &ParsedBlob<'_>, modules: &[&str], index: usize, depth: usize, budget: &mut usize) -> TreeNode {
        let key = modules.get(index).copied().unwrap_or("?");
        let imports: Vec<TreeNode> = match &parsed.import_tree {
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
                let imports = modules
                    .iter()
                    .enumerate()
                    .map(|(i, k)| TreeNode { index: Some(i), type_key: (*k).to_owned(), imports: vec![] })
                    .collect();
                return TreeNode { index: None, type_key: "library".into(), imports };
            }
            None => vec![],
        };
        TreeNode { index: Some(index), type_key: key.to_owned(), imports }
    }
    let modules: Vec<&str> = parsed.modules().map(|e| e.type_key).collect();
    let edges = parsed.import_tree.as_ref().map_or(0, |t| t.child_indices.len());
    let mut budget = modules.len().saturating_add(edges).saturating_add(1 << 12);
    walk(parsed, &modules, 0, 0, &mut budget)
}

pub(super) fn shape_value(s: &TreeShape) -> LoadedNode {
    LoadedNode { type_key: s.type_key.clone(), imports: s.imports.iter().map(shape_value).collect() }
}
