//! [`GraphError`]: what is wrong with a graph JSON that the graph executor refuses (a leaf of
//! `exec`: `error.rs` wraps it in [`super::ExecError::Graph`], `graph.rs` makes it).

/// A graph JSON that is malformed or inconsistent, by cause; each names where in the JSON.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The text is no JSON of a graph's form (syntax, a missing field, a wrong type).
    #[error("at `{path}`: {source}")]
    Json {
        /// The JSON path of the problem (`nodes[2].inputs`).
        path: String,
        /// What serde found.
        #[source]
        source: serde_json::Error,
    },
    /// A number that does not fit an index on this machine.
    #[error("{what} {value} is out of range")]
    OutOfRange {
        /// What it is (`node_row_ptr entry`, `heads[0]`).
        what: String,
        /// The number.
        value: u64,
    },
    /// An op attribute that is not the integer it must be.
    #[error("node `{node}`: attrs.{key} = {value} is not {expected}")]
    Attr {
        /// The node.
        node: String,
        /// The attribute (`num_outputs`, `flatten_data`).
        key: String,
        /// Its value as the JSON holds it.
        value: String,
        /// What it must be (`a non-negative integer`, `an integer`).
        expected: &'static str,
    },
    /// `node_row_ptr` has not one entry more than there are nodes.
    #[error("node_row_ptr has {entries} entries for {nodes} nodes (expected nodes + 1)")]
    RowPtrLen {
        /// Its entries.
        entries: usize,
        /// The nodes.
        nodes: usize,
    },
    /// `node_row_ptr` does not start at 0 or decreases.
    #[error("node_row_ptr must start at 0 and never decrease")]
    RowPtrOrder,
    /// A table of `attrs` with another type tag than TVM writes for it.
    #[error("attrs.{key} has type tag {found:?}, expected {expected:?}")]
    TypeTag {
        /// The table (`dltype`, `storage_id`, `shape`).
        key: &'static str,
        /// The tag found.
        found: String,
        /// TVM's (`list_str`, `list_int`, `list_shape`).
        expected: &'static str,
    },
    /// A table of `attrs` with another number of entries than the graph has node entries.
    #[error("attrs.{key} has {len} entries, the graph has {entries} node entries")]
    TableLen {
        /// The table.
        key: &'static str,
        /// Its entries.
        len: usize,
        /// The node entries.
        entries: usize,
    },
    /// A `dltype` entry that names no data type.
    #[error("attrs.dltype[{index}] = {text:?} is not a data type")]
    DataType {
        /// The entry.
        index: usize,
        /// Its text.
        text: String,
    },
    /// A `storage_id` that is negative (runtime-shaped storage) or past the entry count.
    #[error("attrs.storage_id[{index}] = {id}: runtime-shaped storage (negative ids) and ids past the entry count are not supported")]
    StorageId {
        /// The entry.
        index: usize,
        /// The id.
        id: i64,
    },
    /// A shape with a negative extent, or whose tensor's size overflows.
    #[error("attrs.shape[{index}] = {shape:?} is negative or too large")]
    Shape {
        /// The entry.
        index: usize,
        /// The shape.
        shape: Vec<i64>,
    },
    /// `attrs.device_index` that is not a `list_int` with one entry per node entry.
    #[error("attrs.device_index must be a list_int of {entries} entries")]
    DeviceIndex {
        /// The node entries.
        entries: usize,
    },
    /// A node entry that is not `[node, index]` or `[node, index, version]`.
    #[error("{at}: {entry:?} is not [node, index] or [node, index, version]")]
    EntryForm {
        /// Where it is (`nodes[3].inputs[1]`, `heads[0]`).
        at: String,
        /// The entry.
        entry: Vec<u64>,
    },
    /// A node entry that names no output of a node.
    #[error("{at}: {entry:?} names no output of a node (the graph has {nodes} nodes)")]
    EntryTarget {
        /// Where it is.
        at: String,
        /// The entry.
        entry: Vec<u64>,
        /// The graph's nodes.
        nodes: usize,
    },
    /// A node whose input comes from a node that runs after it (or itself).
    #[error("nodes[{id}] (`{node}`) takes an input from node {input}, which does not run before it")]
    InputOrder {
        /// The node's index.
        id: usize,
        /// Its name.
        node: String,
        /// The node the input comes from.
        input: usize,
    },
    /// An input node (`op: "null"`) with other than one entry.
    #[error("input node `{node}` has {outputs} entries, expected 1")]
    InputEntries {
        /// The node.
        node: String,
        /// Its entries.
        outputs: usize,
    },
    /// An op node without the string `attrs.func_name`.
    #[error("op node `{node}` has no attrs.func_name string")]
    NoFuncName {
        /// The node.
        node: String,
    },
    /// An op node whose `num_outputs` differs from its entries in `node_row_ptr`.
    #[error("op node `{node}` says num_outputs {says} but node_row_ptr gives it {has}")]
    NumOutputs {
        /// The node.
        node: String,
        /// `attrs.num_outputs`.
        says: u64,
        /// Its entries.
        has: usize,
    },
    /// An op node whose `num_inputs` differs from the inputs it lists.
    #[error("op node `{node}` says num_inputs {says} but lists {has}")]
    NumInputs {
        /// The node.
        node: String,
        /// `attrs.num_inputs`.
        says: u64,
        /// The inputs listed.
        has: usize,
    },
    /// A node whose op is neither `null` nor `tvm_op`.
    #[error("node `{node}` has op {op:?}: only \"null\" and \"tvm_op\" exist")]
    Op {
        /// The node.
        node: String,
        /// Its op.
        op: String,
    },
    /// An `arg_nodes` entry that is not an input node.
    #[error("arg_nodes names node {node}, which is not an input node")]
    ArgNode {
        /// The node's index.
        node: usize,
    },
    /// A storage shared by entries on two devices.
    #[error("storage {storage} is shared by entries on two devices")]
    SharedStorage {
        /// The storage id.
        storage: usize,
    },
    /// A `__copy` node without one input and one output, or between entries of two sizes.
    #[error("`__copy` node `{node}` {problem}")]
    Copy {
        /// The node.
        node: String,
        /// What is wrong (`must have one input and one output`, `copies between entries of
        /// different sizes`).
        problem: &'static str,
    },
}
