//! TVM's graph executor: the graph JSON of a `GraphExecutorFactory`, its storage plan and its
//! ops, run with the library's kernels.
//!
//! Semantics follow TVM's `graph_executor.cc` exactly:
//! - entry id = `node_row_ptr[nid] + index`; `attrs` give each entry's `dltype`, `shape` and
//!   `storage_id` (and optionally `device_index`);
//! - one pool per storage id, sized by the largest entry that uses it
//!   (`prod(shape) * ((bits * lanes + 7) / 8)`, rounded up to 4 bytes), 64-byte aligned and
//!   zeroed; every entry is a view at offset 0 of its pool;
//! - every `tvm_op` node calls its `func_name` with its inputs then its outputs, all as
//!   `DLTensor*`; `flatten_data` presents each as 1-D; `__nop` does nothing; `__copy` copies
//!   its input to its output; ops run in node order;
//! - the factory sets every param that is a graph input, largest first.
//!
//! Where TVM is silent on a mistake, this is an error: an unknown input name, a tensor whose
//! shape or dtype differs from the graph's, a kernel that fails (with the node, the function
//! and the kernel's own message).

use std::collections::HashMap;

use serde::Deserialize;

use std::sync::Arc;

use super::graph_error::GraphError;
use super::runner::{Param, Runner};
use super::value::Value as ExecValue;
use super::{ExecError, TensorInfo};
use crate::array::{tensor_bytes, NdArray};
use crate::bytes::Bytes;
use crate::device::api::DeviceApi;
use crate::device::storage::Storage;
use crate::device::Device;
use crate::ffi::kernel_call::KernelCall;
use crate::format::stream::Reader;
use crate::format::DataType;
use crate::module::{LoadedModule, LoadedTree};
use crate::payload::graph::{GraphExecutorFactory, Tensor as PayloadTensor};

/// An input of an op: `[node id, output index, version?]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeEntry {
    /// The node.
    pub node: usize,
    /// Which of its outputs.
    pub index: usize,
}

/// One node of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `null` (an input or param) or `tvm_op`.
    pub op: String,
    /// The node's name.
    pub name: String,
    /// Its inputs.
    pub inputs: Vec<NodeEntry>,
    /// For ops: the function to call (`__nop`, `__copy`, or a kernel).
    pub func_name: String,
    /// For ops: the number of outputs.
    pub num_outputs: usize,
    /// For ops: whether tensors are passed as 1-D.
    pub flatten_data: bool,
}

/// A parsed and checked graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    /// The nodes, in execution order.
    pub nodes: Vec<Node>,
    /// The input nodes (real inputs and params).
    pub arg_nodes: Vec<usize>,
    /// The outputs.
    pub heads: Vec<NodeEntry>,
    /// First entry id of each node, plus the total.
    pub node_row_ptr: Vec<usize>,
    /// Per entry: element type.
    pub dltype: Vec<DataType>,
    /// Per entry: shape.
    pub shape: Vec<Vec<i64>>,
    /// Per entry: storage id.
    pub storage_id: Vec<usize>,
    /// Per entry: device type, when the graph says.
    pub device_index: Option<Vec<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonGraph {
    nodes: Vec<JsonNode>,
    arg_nodes: Vec<u64>,
    heads: Vec<Vec<u64>>,
    attrs: JsonAttrs,
    node_row_ptr: Vec<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct JsonNode {
    op: String,
    name: String,
    #[serde(default)]
    inputs: Vec<Vec<u64>>,
    #[serde(default, alias = "attr", alias = "param")]
    attrs: Option<HashMap<String, serde_json::Value>>,
    #[serde(default)]
    #[allow(dead_code)]
    control_deps: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct JsonAttrs {
    dltype: (String, Vec<String>),
    storage_id: (String, Vec<i64>),
    shape: (String, Vec<Vec<i64>>),
    #[serde(default)]
    device_index: Option<(String, Vec<i64>)>,
    #[serde(default)]
    #[allow(dead_code)]
    storage_scope: Option<(String, Vec<String>)>,
}

fn bad(e: GraphError) -> ExecError {
    ExecError::Graph(e)
}

fn to_usize(v: u64, what: &str) -> Result<usize, ExecError> {
    usize::try_from(v).map_err(|_| bad(GraphError::OutOfRange { what: what.to_owned(), value: v }))
}

fn attr_error(node: &str, key: &str, value: String, expected: &'static str) -> ExecError {
    bad(GraphError::Attr { node: node.to_owned(), key: key.to_owned(), value, expected })
}

/// An op attribute TVM writes as a string (`"1"`), also accepted as a number.
fn attr_uint(attrs: &HashMap<String, serde_json::Value>, key: &str, node: &str) -> Result<Option<u64>, ExecError> {
    match attrs.get(key) {
        None => Ok(None),
        Some(serde_json::Value::String(s)) => s
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| attr_error(node, key, format!("{s:?}"), "a non-negative integer")),
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(Some).ok_or_else(|| attr_error(node, key, n.to_string(), "a non-negative integer"))
        }
        Some(other) => Err(attr_error(node, key, other.to_string(), "an integer")),
    }
}

impl Graph {
    /// Parses and checks a graph JSON. Every index is checked against what it indexes; errors
    /// name the JSON path or the node.
    pub fn parse(json: &str) -> Result<Graph, ExecError> {
        let de = &mut serde_json::Deserializer::from_str(json);
        let g: JsonGraph = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            bad(GraphError::Json { path, source: e.into_inner() })
        })?;
        let n_nodes = g.nodes.len();
        let row_ptr: Vec<usize> =
            g.node_row_ptr.iter().map(|&v| to_usize(v, "node_row_ptr entry")).collect::<Result<_, _>>()?;
        if row_ptr.len() != n_nodes + 1 {
            return Err(bad(GraphError::RowPtrLen { entries: row_ptr.len(), nodes: n_nodes }));
        }
        if row_ptr.first() != Some(&0) || row_ptr.windows(2).any(|w| w[0] > w[1]) {
            return Err(bad(GraphError::RowPtrOrder));
        }
        let n_entries = row_ptr[n_nodes];
        let (dkind, dltype) = g.attrs.dltype;
        let (skind, storage_id) = g.attrs.storage_id;
        let (hkind, shape) = g.attrs.shape;
        for (k, want, key) in
            [(&dkind, "list_str", "dltype"), (&skind, "list_int", "storage_id"), (&hkind, "list_shape", "shape")]
        {
            if k != want {
                return Err(bad(GraphError::TypeTag { key, found: k.clone(), expected: want }));
            }
        }
        for (len, key) in [(dltype.len(), "dltype"), (storage_id.len(), "storage_id"), (shape.len(), "shape")] {
            if len != n_entries {
                return Err(bad(GraphError::TableLen { key, len, entries: n_entries }));
            }
        }
        let dltype = dltype
            .iter()
            .enumerate()
            .map(|(i, s)| DataType::parse(s).ok_or_else(|| bad(GraphError::DataType { index: i, text: s.clone() })))
            .collect::<Result<Vec<_>, _>>()?;
        let storage_id = storage_id
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                usize::try_from(s)
                    .ok()
                    .filter(|&s| s < n_entries.max(1))
                    .ok_or_else(|| bad(GraphError::StorageId { index: i, id: s }))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (i, (s, t)) in shape.iter().zip(&dltype).enumerate() {
            if s.iter().any(|&d| d < 0) || tensor_bytes(*t, s).is_none() {
                return Err(bad(GraphError::Shape { index: i, shape: s.clone() }));
            }
        }
        let device_index = match g.attrs.device_index {
            None => None,
            Some((k, v)) => {
                if k != "list_int" || v.len() != n_entries {
                    return Err(bad(GraphError::DeviceIndex { entries: n_entries }));
                }
                Some(v)
            }
        };
        let entry = |e: &[u64], what: &str| -> Result<NodeEntry, ExecError> {
            if e.len() < 2 || e.len() > 3 {
                return Err(bad(GraphError::EntryForm { at: what.to_owned(), entry: e.to_vec() }));
            }
            let node = to_usize(e[0], what)?;
            let index = to_usize(e[1], what)?;
            if node >= n_nodes || row_ptr[node] + index >= row_ptr[node + 1] {
                return Err(bad(GraphError::EntryTarget { at: what.to_owned(), entry: e.to_vec(), nodes: n_nodes }));
            }
            Ok(NodeEntry { node, index })
        };
        let mut nodes = Vec::with_capacity(n_nodes);
        for (nid, n) in g.nodes.iter().enumerate() {
            let inputs = n
                .inputs
                .iter()
                .enumerate()
                .map(|(k, e)| {
                    let ne = entry(e, &format!("nodes[{nid}].inputs[{k}]"))?;
                    if ne.node >= nid {
                        return Err(bad(GraphError::InputOrder { id: nid, node: n.name.clone(), input: ne.node }));
                    }
                    Ok(ne)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let outputs = row_ptr[nid + 1] - row_ptr[nid];
            let node = match n.op.as_str() {
                "null" => {
                    if outputs != 1 {
                        return Err(bad(GraphError::InputEntries { node: n.name.clone(), outputs }));
                    }
                    Node {
                        op: n.op.clone(),
                        name: n.name.clone(),
                        inputs,
                        func_name: String::new(),
                        num_outputs: 1,
                        flatten_data: false,
                    }
                }
                "tvm_op" => {
                    let empty = HashMap::new();
                    let attrs = n.attrs.as_ref().unwrap_or(&empty);
                    let func_name = match attrs.get("func_name") {
                        Some(serde_json::Value::String(s)) => s.clone(),
                        _ => return Err(bad(GraphError::NoFuncName { node: n.name.clone() })),
                    };
                    let num_outputs = attr_uint(attrs, "num_outputs", &n.name)?.unwrap_or(1);
                    if num_outputs != outputs as u64 {
                        return Err(bad(GraphError::NumOutputs {
                            node: n.name.clone(),
                            says: num_outputs,
                            has: outputs,
                        }));
                    }
                    if let Some(ni) = attr_uint(attrs, "num_inputs", &n.name)? {
                        if ni != inputs.len() as u64 {
                            return Err(bad(GraphError::NumInputs {
                                node: n.name.clone(),
                                says: ni,
                                has: inputs.len(),
                            }));
                        }
                    }
                    let flatten_data = attr_uint(attrs, "flatten_data", &n.name)?.unwrap_or(0) != 0;
                    Node {
                        op: n.op.clone(),
                        name: n.name.clone(),
                        inputs,
                        func_name,
                        num_outputs: outputs,
                        flatten_data,
                    }
                }
                other => return Err(bad(GraphError::Op { node: n.name.clone(), op: other.to_owned() })),
            };
            nodes.push(node);
        }
        let arg_nodes = g
            .arg_nodes
            .iter()
            .map(|&a| {
                let a = to_usize(a, "arg_nodes entry")?;
                if nodes.get(a).is_none_or(|n| n.op != "null") {
                    return Err(bad(GraphError::ArgNode { node: a }));
                }
                Ok(a)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let heads =
            g.heads.iter().enumerate().map(|(i, h)| entry(h, &format!("heads[{i}]"))).collect::<Result<_, _>>()?;
        Ok(Graph { nodes, arg_nodes, heads, node_row_ptr: row_ptr, dltype, shape, storage_id, device_index })
    }

    /// Checks that every param that is an input of the graph has that input's dtype and
    /// shape (params the graph does not take are not looked at, as `load_params` skips them).
    pub fn check_params(&self, params: &[(String, PayloadTensor)]) -> Result<(), ExecError> {
        for (name, t) in params {
            let Some(&nid) = self.arg_nodes.iter().find(|&&nid| self.nodes[nid].name == *name) else { continue };
            let e = self.entry_id(NodeEntry { node: nid, index: 0 });
            if self.dltype[e] != t.dtype || self.shape[e] != t.shape {
                return Err(ExecError::ParamMismatch {
                    name: name.clone(),
                    expected_dtype: self.dltype[e],
                    expected_shape: self.shape[e].clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                });
            }
        }
        Ok(())
    }

    /// The entry id of output `index` of node `node`.
    pub fn entry_id(&self, e: NodeEntry) -> usize {
        self.node_row_ptr[e.node] + e.index
    }
}

/// Magic of a params file (`save_param_dict`).
pub(crate) const PARAMS_MAGIC: u64 = 0xF7E5_8D4F_0504_9CB7;

/// Reads a params file as `relay.save_param_dict` writes it (and `extract` exports):
/// `magic u64, reserved u64, names vec<str>, count u64, tensor{count}`.
pub fn read_params(bytes: &Bytes) -> Result<Vec<(String, PayloadTensor)>, ExecError> {
    let fail = ExecError::Params;
    let mut r = Reader::new(bytes, 0);
    let magic = r.read_u64("params magic").map_err(fail)?;
    if magic != PARAMS_MAGIC {
        return Err(ExecError::ParamsMagic { found: magic, expected: PARAMS_MAGIC });
    }
    r.read_u64("reserved").map_err(fail)?;
    let names = r.read_vec_str("param names").map_err(fail)?;
    let count = r.read_count("param count", 40).map_err(fail)?;
    if count != names.len() {
        return Err(ExecError::ParamsCount { names: names.len(), tensors: count });
    }
    let mut out = Vec::with_capacity(count);
    for name in names {
        let t = PayloadTensor::read(&mut r, bytes).map_err(fail)?;
        out.push((name, t));
    }
    r.finish("params").map_err(fail)?;
    Ok(out)
}

/// Writes a params file as `relay.save_param_dict` does (what [`read_params`] reads back and
/// `tvm.runtime.load_param_dict` loads).
pub fn write_params(params: &[(String, PayloadTensor)], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    use crate::format::stream;
    stream::write_u64(out, PARAMS_MAGIC)?;
    stream::write_u64(out, 0)?;
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    stream::write_vec_str(out, &names)?;
    stream::write_u64(out, params.len() as u64)?;
    for (_, t) in params {
        t.write_to(out)?;
    }
    Ok(())
}

/// How many bytes [`write_params`] writes for `params`.
pub fn params_len(params: &[(String, PayloadTensor)]) -> u64 {
    let names: u64 = params.iter().map(|(n, _)| 8 + n.len() as u64).sum();
    let tensors: u64 = params.iter().map(|(_, t)| t.encoded_len()).sum();
    8 + 8 + 8 + names + 8 + tensors
}

/// A graph factory of a loaded tree: the `GraphExecutorFactory` and the modules its kernels
/// come from.
#[derive(Debug, Clone)]
pub struct GraphFactory {
    tree: LoadedTree,
    index: usize,
}

impl GraphFactory {
    /// The first `GraphExecutorFactory` of `tree`.
    pub fn from_tree(tree: &LoadedTree) -> Result<GraphFactory, ExecError> {
        let index = tree
            .modules()
            .iter()
            .position(|m| m.module.as_any().downcast_ref::<GraphExecutorFactory>().is_some())
            .ok_or_else(|| ExecError::NoFactory {
                kind: "GraphExecutorFactory",
                modules: tree.type_keys().into_iter().map(str::to_owned).collect(),
            })?;
        Ok(GraphFactory { tree: tree.clone(), index })
    }

    /// A factory made of TVM's "classic trio": a graph JSON (`get_graph_json`), the library
    /// whose functions its ops call (`get_lib`, loaded from its own file) and params
    /// (`save_param_dict`, read with [`read_params`]). What TVM's
    /// `graph_executor.create(graph_json, lib, dev)` followed by `load_params` runs: the
    /// executor [`GraphFactory::default`] builds looks the kernels up in `lib` (its root, then
    /// its imports) and sets every param that is a graph input. The graph is parsed and
    /// checked here, and so is each kernel it calls (in `lib`) and each param it takes (dtype
    /// and shape); params the graph does not take are kept and skipped, as `load_params` does.
    pub fn from_parts(
        graph_json: &str,
        lib: &LoadedTree,
        params: Vec<(String, PayloadTensor)>,
    ) -> Result<GraphFactory, ExecError> {
        let graph = Graph::parse(graph_json)?;
        // Every kernel the graph calls must be in the library, and every param that is a graph
        // input must have the input's dtype and shape: checked now, before any memory is
        // allocated, so that a graph or params file of another model is refused by name.
        for node in graph.nodes.iter().filter(|n| n.op == "tvm_op") {
            if !matches!(node.func_name.as_str(), "__nop" | "__copy") && lib.lookup(0, &node.func_name).is_none() {
                return Err(ExecError::MissingFunction { node: node.name.clone(), function: node.func_name.clone() });
            }
        }
        graph.check_params(&params)?;
        let factory = GraphExecutorFactory::new(graph_json, params, "default");
        let mut modules = Vec::with_capacity(lib.modules.len() + 1);
        modules.push(LoadedModule { module: Arc::new(factory), imports: vec![1] });
        modules.extend(
            lib.modules
                .iter()
                .map(|m| LoadedModule { module: m.module.clone(), imports: m.imports.iter().map(|i| i + 1).collect() }),
        );
        let tree = LoadedTree { modules, origin: lib.origin.clone() };
        Ok(GraphFactory { tree, index: 0 })
    }

    /// The tree the factory lives in (for [`GraphFactory::from_parts`]: the factory, then the
    /// library's modules).
    pub fn tree(&self) -> &LoadedTree {
        &self.tree
    }

    /// The factory payload.
    pub fn factory(&self) -> &GraphExecutorFactory {
        self.tree.modules()[self.index].module.as_any().downcast_ref().expect("checked in from_tree")
    }

    /// The model's name (`default`).
    pub fn module_name(&self) -> &str {
        &self.factory().module_name
    }

    /// `factory["default"](dev)`: builds an executor on `devices` (the first holds
    /// every entry the graph does not place elsewhere), with the params copied there.
    pub fn default(&self, devices: &[Device]) -> Result<GraphExecutor, ExecError> {
        GraphExecutor::new(&self.tree, self.index, devices)
    }
}

enum OpKind {
    Nop,
    Copy { from: usize, to: usize },
    Call(KernelCall),
}

struct Op {
    node: String,
    function: String,
    kind: OpKind,
}

/// A graph executor: the storage of every entry on its device, and the ops.
pub struct GraphExecutor {
    graph: Graph,
    /// Per storage id: its memory, on the device the graph places it.
    pools: Vec<Arc<Storage>>,
    /// Per entry: its tensor (a view at offset 0 of its pool).
    entries: Vec<NdArray>,
    ops: Vec<Op>,
    /// Input node ids by name.
    input_index: HashMap<String, usize>,
    params: std::collections::HashSet<String>,
    /// The inputs a caller sets (params excluded), in order, and their node ids.
    runner_params: Vec<Param>,
    runner_nids: Vec<usize>,
    /// The devices it runs on: the first one holds every entry unless the graph places it.
    devices: Vec<Device>,
    /// A device off the CPU that the kernels are queued on, waited for after each run.
    queued: Option<Arc<dyn DeviceApi>>,
    _tree: LoadedTree,
}

impl std::fmt::Debug for GraphExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExecutor")
            .field("nodes", &self.graph.nodes.len())
            .field("pools", &self.pools.len())
            .field("devices", &self.devices)
            .finish()
    }
}

impl GraphExecutor {
    fn new(tree: &LoadedTree, index: usize, devices: &[Device]) -> Result<GraphExecutor, ExecError> {
        let _span = tracing::info_span!("graph_executor_init").entered();
        let first = *devices
            .first()
            .ok_or(ExecError::UnsupportedDevice { device: Device::cpu(0), detail: "no device given".into() })?;
        let factory: &GraphExecutorFactory = tree.modules()[index]
            .module
            .as_any()
            .downcast_ref()
            .ok_or(ExecError::PayloadKind { kind: "GraphExecutorFactory" })?;
        let graph = Graph::parse(&factory.graph_json)?;
        super::check_device_code(tree, index, first)?;
        // The device of each entry: the first device, or the one of the type the graph's
        // `device_index` names (TVM's heterogeneous execution).
        let n_entries = graph.dltype.len();
        let entry_device = |e: usize| -> Result<Device, ExecError> {
            match &graph.device_index {
                None => Ok(first),
                Some(types) => {
                    let code = types.get(e).copied().unwrap_or(1) as i32;
                    devices.iter().copied().find(|d| d.device_type.code() == code).ok_or_else(|| {
                        ExecError::UnsupportedDevice {
                            device: Device::from_dlpack(code, 0),
                            detail: format!(
                                "the graph places entry {e} on it (attrs.device_index), but the executor was made for {}",
                                devices.iter().map(Device::to_string).collect::<Vec<_>>().join(", ")
                            ),
                        }
                    })
                }
            }
        };
        // Storage: one pool per storage id, sized by its largest entry, on that entry's device.
        let mut pool_size: Vec<(u64, Option<Device>)> = Vec::new();
        for e in 0..n_entries {
            let bytes = tensor_bytes(graph.dltype[e], &graph.shape[e]).expect("checked in parse");
            let sid = graph.storage_id[e];
            if pool_size.len() <= sid {
                pool_size.resize(sid + 1, (0, None));
            }
            let dev = entry_device(e)?;
            let slot = &mut pool_size[sid];
            if slot.1.is_some_and(|d| d != dev) {
                return Err(bad(GraphError::SharedStorage { storage: sid }));
            }
            *slot = (slot.0.max(bytes), Some(dev));
        }
        let pools = pool_size
            .iter()
            .enumerate()
            .map(|(sid, &(b, dev))| {
                let rounded = b.div_ceil(4) * 4;
                let n = usize::try_from(rounded)
                    .map_err(|_| ExecError::Alloc { bytes: rounded, what: format!("storage pool {sid}") })?;
                Storage::new(dev.unwrap_or(first), n).map_err(ExecError::Device)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let entries = (0..n_entries)
            .map(|e| NdArray::in_storage(&pools[graph.storage_id[e]], 0, &graph.shape[e], graph.dltype[e]))
            .collect::<Result<Vec<_>, _>>()?;
        // Ops: the kernels are looked up now, in the factory's imports.
        let mut ops = Vec::new();
        for (nid, node) in graph.nodes.iter().enumerate() {
            if node.op != "tvm_op" {
                continue;
            }
            let mut ids: Vec<usize> = node.inputs.iter().map(|&e| graph.entry_id(e)).collect();
            ids.extend((0..node.num_outputs).map(|i| graph.entry_id(NodeEntry { node: nid, index: i })));
            let kind = match node.func_name.as_str() {
                "__nop" => OpKind::Nop,
                "__copy" => {
                    if ids.len() != 2 {
                        let problem = "must have one input and one output";
                        return Err(bad(GraphError::Copy { node: node.name.clone(), problem }));
                    }
                    if entries[ids[0]].nbytes() != entries[ids[1]].nbytes() {
                        let problem = "copies between entries of different sizes";
                        return Err(bad(GraphError::Copy { node: node.name.clone(), problem }));
                    }
                    OpKind::Copy { from: ids[0], to: ids[1] }
                }
                name => {
                    let f = tree.lookup(index, name).ok_or_else(|| ExecError::MissingFunction {
                        node: node.name.clone(),
                        function: name.to_owned(),
                    })?;
                    let arrays = ids.iter().map(|&e| entries[e].clone()).collect();
                    OpKind::Call(KernelCall::new(f, arrays, node.flatten_data).map_err(|e| ExecError::Kernel {
                        node: node.name.clone(),
                        function: name.to_owned(),
                        message: e.message,
                    })?)
                }
            };
            ops.push(Op { node: node.name.clone(), function: node.func_name.clone(), kind });
        }
        let input_index = graph.arg_nodes.iter().map(|&nid| (graph.nodes[nid].name.clone(), nid)).collect();
        let queued = pools.iter().find(|p| !p.device().is_cpu()).map(|p| p.api().clone());
        let mut exec = GraphExecutor {
            graph,
            pools,
            entries,
            ops,
            input_index,
            params: Default::default(),
            runner_params: Vec::new(),
            runner_nids: Vec::new(),
            devices: devices.to_vec(),
            queued,
            _tree: tree.clone(),
        };
        // Params that are graph inputs, largest first (as TVM's factory does), copied to the
        // device once.
        let mut params: Vec<&(String, PayloadTensor)> = factory.params.iter().collect();
        params.sort_by_key(|(_, t)| std::cmp::Reverse(t.data.len()));
        for (name, t) in params {
            if let Some(&nid) = exec.input_index.get(name) {
                exec.set_node_input(nid, t)
                    .map_err(|e| ExecError::Param { name: name.clone(), source: Box::new(e) })?;
                exec.params.insert(name.clone());
            }
        }
        exec.runner_nids = exec
            .graph
            .arg_nodes
            .iter()
            .copied()
            .filter(|&nid| !exec.params.contains(&exec.graph.nodes[nid].name))
            .collect();
        exec.runner_params = exec.runner_nids.iter().map(|&nid| Param::tensor(exec.input_info(nid))).collect();
        tracing::debug!(ops = exec.ops.len(), pools = exec.pools.len(), device = %first, "graph executor ready");
        Ok(exec)
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The devices it runs on.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn input_info(&self, nid: usize) -> TensorInfo {
        let e = self.graph.entry_id(NodeEntry { node: nid, index: 0 });
        TensorInfo {
            name: self.graph.nodes[nid].name.clone(),
            shape: self.graph.shape[e].clone(),
            dtype: self.graph.dltype[e],
        }
    }

    fn check_input(&self, nid: usize, dtype: DataType, shape: &[i64], nbytes: usize) -> Result<usize, ExecError> {
        let info = self.input_info(nid);
        let e = self.graph.entry_id(NodeEntry { node: nid, index: 0 });
        if dtype != info.dtype || shape != info.shape || nbytes != self.entries[e].nbytes() {
            return Err(ExecError::InputMismatch {
                name: info.name,
                expected_dtype: info.dtype,
                expected_shape: info.shape,
                dtype,
                shape: shape.to_vec(),
            });
        }
        Ok(e)
    }

    fn set_node_input(&mut self, nid: usize, tensor: &PayloadTensor) -> Result<(), ExecError> {
        let e = self.check_input(nid, tensor.dtype, &tensor.shape, tensor.data.len())?;
        // A param in the library (or a mapped params file) is then held once, in its entry.
        Ok(self.entries[e].copy_from_mapped(&tensor.data)?)
    }

    /// Output `index` as the executor holds it, on its device (shared: the next run
    /// overwrites it, as TVM's `get_output` without a destination).
    pub fn output_array(&self, index: usize) -> Result<&NdArray, ExecError> {
        let h = *self.graph.heads.get(index).ok_or(ExecError::Index {
            what: "output",
            index,
            count: self.graph.heads.len(),
        })?;
        Ok(&self.entries[self.graph.entry_id(h)])
    }
}

impl Runner for GraphExecutor {
    fn params(&self) -> &[Param] {
        &self.runner_params
    }

    fn output_info(&self) -> Vec<TensorInfo> {
        self.graph
            .heads
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                let e = self.graph.entry_id(h);
                TensorInfo {
                    name: format!("output_{i}"),
                    shape: self.graph.shape[e].clone(),
                    dtype: self.graph.dltype[e],
                }
            })
            .collect()
    }

    /// Copies a tensor (on any device: within the device when it is already there) into
    /// input `index`, its shape and dtype checked.
    fn set_input(&mut self, index: usize, value: ExecValue) -> Result<(), ExecError> {
        let nid = *self.runner_nids.get(index).ok_or(ExecError::Index {
            what: "input",
            index,
            count: self.runner_nids.len(),
        })?;
        let ExecValue::Tensor(array) = value else {
            return Err(ExecError::InputKind {
                name: self.graph.nodes[nid].name.clone(),
                expected: "tensor",
                got: value.kind(),
            });
        };
        let e = self.check_input(nid, array.dtype(), array.shape(), array.nbytes())?;
        Ok(array.copy_to(&self.entries[e])?)
    }

    fn run(&mut self) -> Result<(), ExecError> {
        let _span = tracing::debug_span!("graph_run").entered();
        for op in &mut self.ops {
            match &mut op.kind {
                OpKind::Nop => {}
                OpKind::Copy { from, to } => {
                    let (from, to) = (*from, *to);
                    if self.graph.storage_id[from] != self.graph.storage_id[to] {
                        self.entries[from].copy_to(&self.entries[to])?;
                    }
                }
                OpKind::Call(call) => {
                    call.invoke().map_err(|e| ExecError::Kernel {
                        node: op.node.clone(),
                        function: op.function.clone(),
                        message: e.message,
                    })?;
                }
            }
        }
        // Kernels on a device are queued: wait for them, so that a run's errors and time are
        // its own.
        if let Some(api) = &self.queued {
            api.synchronize()?;
        }
        Ok(())
    }

    fn outputs(&self) -> Result<Vec<ExecValue>, ExecError> {
        (0..self.graph.heads.len()).map(|i| Ok(ExecValue::Tensor(self.output_array(i)?.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: &str = r#"{"nodes":[{"op":"null","name":"x","inputs":[]},
        {"op":"tvm_op","name":"f","attrs":{"func_name":"__copy","num_inputs":"1","num_outputs":"1","flatten_data":"0"},"inputs":[[0,0,0]]}],
        "arg_nodes":[0],"heads":[[1,0,0]],"node_row_ptr":[0,1,2],
        "attrs":{"dltype":["list_str",["float32","float32"]],"storage_id":["list_int",[0,1]],"shape":["list_shape",[[2],[2]]]}}"#;

    /// TVM's params file (`graph_dense_relu.params`, `relay.save_param_dict` of TVM 0.19):
    /// read and written back, the same bytes, and `params_len` its length.
    #[test]
    fn params_files_are_written_as_tvm_wrote_them() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tvm-goldens/graph_dense_relu.params");
        let bytes = std::fs::read(path).unwrap();
        let params = read_params(&Bytes::from_vec(bytes.clone())).unwrap();
        let mut out = Vec::new();
        write_params(&params, &mut out).unwrap();
        assert!(out == bytes, "not TVM's bytes");
        assert_eq!(params_len(&params), bytes.len() as u64);
    }

    #[test]
    fn parses_and_refuses_bad_graphs_with_paths() {
        let g = Graph::parse(G).unwrap();
        assert_eq!(g.nodes[1].func_name, "__copy");
        assert_eq!(g.heads, [NodeEntry { node: 1, index: 0 }]);
        type Is = fn(&GraphError) -> bool;
        let cases: [(String, &str, Is); 8] = [
            (
                G.replace("\"arg_nodes\":[0]", "\"arg_nodes\":[\"a\"]"),
                "arg_nodes[0]",
                |e| matches!(e, GraphError::Json { path, .. } if path == "arg_nodes[0]"),
            ),
            (
                G.replace("[[1,0,0]]", "[[1,1,0]]"),
                "heads[0]",
                |e| matches!(e, GraphError::EntryTarget { at, nodes: 2, .. } if at == "heads[0]"),
            ),
            (G.replace("[0,1,2]", "[0,1]"), "node_row_ptr", |e| {
                matches!(e, GraphError::RowPtrLen { entries: 2, nodes: 2 })
            }),
            (
                G.replace("\"float32\",\"float32\"", "\"float32\",\"floaty\""),
                "dltype[1]",
                |e| matches!(e, GraphError::DataType { index: 1, text } if text == "floaty"),
            ),
            (G.replace("[[2],[2]]", "[[2],[-2]]"), "shape[1]", |e| matches!(e, GraphError::Shape { index: 1, .. })),
            (
                G.replace("\"num_outputs\":\"1\"", "\"num_outputs\":\"x\""),
                "num_outputs",
                |e| matches!(e, GraphError::Attr { key, expected: "a non-negative integer", .. } if key == "num_outputs"),
            ),
            (G.replace("[[0,0,0]]", "[[1,0,0]]"), "does not run before", |e| {
                matches!(e, GraphError::InputOrder { id: 1, input: 1, .. })
            }),
            (
                G.replace("\"storage_id\":[\"list_int\",[0,1]]", "\"storage_id\":[\"list_int\",[0,-1]]"),
                "storage_id[1]",
                |e| matches!(e, GraphError::StorageId { index: 1, id: -1 }),
            ),
        ];
        for (bad, want, is) in cases {
            let err = Graph::parse(&bad).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with("graph JSON: ") && text.contains(want), "{want}: {text}");
            assert!(matches!(&err, ExecError::Graph(e) if is(e)), "{want}: {err:?}");
        }
    }

    #[test]
    fn params_file_reads_and_rejects_truncation() {
        let t = PayloadTensor::new(DataType::F32, vec![2], vec![0u8; 8]).unwrap();
        let mut buf = Vec::new();
        write_params(&[("p0".to_owned(), t.clone())], &mut buf).unwrap();
        let got = read_params(&Bytes::from_vec(buf.clone())).unwrap();
        assert_eq!(got, vec![("p0".to_owned(), t)]);
        for cut in [0, 8, 20, buf.len() - 1] {
            assert!(read_params(&Bytes::from_vec(buf[..cut].to_vec())).is_err());
        }
    }
}
