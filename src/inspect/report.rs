//! The report's types: [`Report`] and what it holds. Each field's doc comment gives its JSON
//! key and meaning (the keys are a wire format that scripts may rely on).

use mblob_runtime::container::ContainerFormat;
use mblob_runtime::Bytes;
use serde::Serialize;

use crate::tree_json::FunctionTable;

/// What kind of file was read (JSON `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// An ELF file: a shared library or an object.
    Elf,
    /// A raw blob.
    Blob,
    /// A tar archive of objects, as `export -o X.tar` writes it; the rest of the report is
    /// about the member that holds the blob.
    Tar,
    /// A Mach-O file (macOS, iOS), thin or fat.
    Macho,
    /// A PE file (a Windows `.dll`).
    Pe,
    /// A COFF object (a Windows `.obj`).
    Coff,
    /// A WebAssembly module.
    Wasm,
    /// An `ar` archive of objects (`.a`); the rest of the report is about the member that holds
    /// the blob (`container.member`).
    Archive,
}

impl FileKind {
    pub(super) fn of(format: ContainerFormat) -> FileKind {
        match format {
            ContainerFormat::Elf => FileKind::Elf,
            ContainerFormat::MachO | ContainerFormat::MachOFat => FileKind::Macho,
            ContainerFormat::Pe => FileKind::Pe,
            ContainerFormat::Coff => FileKind::Coff,
            ContainerFormat::Wasm => FileKind::Wasm,
            ContainerFormat::Archive => FileKind::Archive,
        }
    }
}

/// The container that holds the blob (JSON `container`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerReport {
    /// `format`: `elf`, `macho`, `pe`, `coff`, `wasm` (of the file, or of the archive member
    /// or fat slice that holds the blob).
    pub format: &'static str,
    /// `machine`: the machine its code is for (`x86_64`, `aarch64`, `wasm32`, ...).
    pub machine: String,
    /// `member`: the archive member or fat slice that holds the blob, when the file has several.
    pub member: Option<String>,
    /// `runs_here`: whether `--load` and `run` can open it on this machine.
    pub runs_here: bool,
}

/// What `inspect` found in one file.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `file`: the path as given.
    pub file: String,
    /// `kind`: `elf`, `blob` or `tar`.
    pub kind: FileKind,
    /// `tar` (tar archives only): the members and which one holds the blob.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tar: Option<TarReport>,
    /// `container` (object files, libraries, archives): what holds the blob and the machine
    /// it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerReport>,
    /// `bundle` (a static archive of several models, as MLC's `package` step makes): each
    /// model's prefix, symbol, member and layout; the blob fields are then `null` (inspect one
    /// model with `--prefix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<Vec<BundleEntry>>,
    /// `symbol`: the blob symbol found; `null` for a raw blob or a library without one.
    pub symbol: Option<String>,
    /// `prefix`: the `c_symbol_prefix` in front of the blob symbol (`""` for none; `null`
    /// without a symbol). TVM writes one for system-lib builds (`--system-lib-prefix`).
    pub prefix: Option<String>,
    /// `system_lib`: whether the file registers the blob with TVM's system library at start-up
    /// (a `--system-lib` build; `null` without a symbol).
    pub system_lib: Option<bool>,
    /// `section`: the section (or WebAssembly data segment, or `linear memory`) holding the
    /// blob symbol.
    pub section: Option<String>,
    /// `file_offset`: where the blob starts in the file (`null` when its bytes are not in one
    /// piece there: a linked WebAssembly module's are rebuilt from its data segments).
    pub file_offset: Option<u64>,
    /// `layout`: `classic`, `classic-0.21`, `ffi`, or `null` when there is no blob.
    pub layout: Option<&'static str>,
    /// `legacy`: a classic blob without an import tree.
    pub legacy: bool,
    /// `blob_len`: bytes of the blob, 8-byte header included.
    pub blob_len: Option<u64>,
    /// `type_keys`: the entries' keys in blob order (for the classic layouts `_lib` and
    /// `_import_tree` included as they appear).
    pub type_keys: Vec<String>,
    /// `payload_lens`: the entries' payload lengths, in blob order.
    pub payload_lens: Vec<u64>,
    /// `payload_offsets`: where each payload starts, from the blob's first byte (header
    /// included).
    pub payload_offsets: Vec<u64>,
    /// `key_offsets`: where each type key starts, from the blob's first byte.
    pub key_offsets: Vec<u64>,
    /// `row_ptr`: the CSR import tree's row pointers (empty without a tree).
    pub row_ptr: Vec<u64>,
    /// `child_indices`: the CSR import tree's children (empty without a tree).
    pub child_indices: Vec<u64>,
    /// `modules`: one object per entry, in blob order.
    pub modules: Vec<ModuleReport>,
    /// `tree`: the import tree, nested (`null` without a blob).
    pub tree: Option<TreeNode>,
    /// `host` (shared libraries): the functions the library exports and how TVM calls them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostReport>,
    /// `loaded` (with `--load`): the tree after loading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<LoadedNode>,
    /// The blob's bytes (not in the JSON), for `extract`.
    #[serde(skip)]
    pub blob: Option<Bytes>,
}

/// One entry of the blob (JSON `modules[i]`).
#[derive(Debug, Clone, Serialize)]
pub struct ModuleReport {
    /// `type_key`.
    pub type_key: String,
    /// `index`: the module index (`null` for `_import_tree`).
    pub index: Option<usize>,
    /// `payload_len`: bytes of the payload.
    pub payload_len: u64,
    /// `error`: why a payload of a known kind could not be decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `note`: what inspect does not decode about this kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Graph factories: their keys, flattened into this object.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphReport>,
    /// Device modules: their keys, flattened into this object.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceReport>,
    /// `relax`: a Relax VM executable's function table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relax: Option<RelaxReport>,
    /// `aot`: an AOT executor factory's model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aot: Option<AotReport>,
}

/// What an `AotExecutorFactory` holds (JSON `modules[i].aot`). Its inputs and outputs are in
/// the library's code (the `TVMMetadata` that `get_c_metadata` returns), so they are read only
/// when the library is loaded (`--load`).
#[derive(Debug, Clone, Serialize)]
pub struct AotReport {
    /// `module_name`: the model's name (`default`).
    pub module_name: String,
    /// `params`: the parameters stored in the payload (usually none: AOT links the weights
    /// into the code).
    pub params: Vec<ParamReport>,
    /// `inputs`: the model's inputs, in argument order, as TVM's metadata gives them; `null`
    /// when the library was not loaded.
    pub inputs: Option<Vec<GraphTensor>>,
    /// `outputs`: the model's outputs, in order (named as the metadata names them); `null`
    /// when the library was not loaded.
    pub outputs: Option<Vec<GraphTensor>>,
    /// `io_error`: why the loaded library's metadata could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_error: Option<String>,
}

/// A tensor of a Relax executable's constant pool (JSON `relax.constants[i]`). The pool's
/// constants have no names: `index` is the position TVM's VM text prints as `c[index]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelaxConstant {
    /// `index`: the position in the constant pool.
    pub index: usize,
    /// `dtype`, as TVM spells it.
    pub dtype: String,
    /// `shape`.
    pub shape: Vec<i64>,
    /// `bytes`: the size of its data.
    pub bytes: usize,
}

/// The function table (global section) of a Relax VM executable; the constants and the code
/// are not decoded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelaxReport {
    /// `version`: the executable format's version string (`0.14`).
    pub version: String,
    /// `functions`: the functions the VM runs (Relax and TIR), in table order.
    pub functions: Vec<RelaxFunction>,
    /// `externs`: the packed functions the table names (VM builtins and kernels), in order.
    pub externs: Vec<String>,
    /// `constant_pool_len`: how many constants the pool holds (tensors, shapes, strings, ...).
    pub constant_pool_len: usize,
    /// `constants`: the pool's tensors (the model's weights), in pool order; `mblob extract`
    /// writes them as a params file.
    pub constants: Vec<RelaxConstant>,
    /// `constants_bytes`: the total size of the tensors' data.
    pub constants_bytes: usize,
    /// `unsupported_calls`: the packed functions of `externs` that neither mblob's VM (its
    /// builtins and global functions) nor the library's exported functions provide: a run
    /// that reaches one fails. `null` when the library is not at hand (a raw blob or a tar
    /// archive), so its functions are unknown.
    pub unsupported_calls: Option<Vec<String>>,
    /// `strings`: the pool's string constants (MLC's `_metadata` JSON is one), whole.
    pub strings: Vec<RelaxString>,
    /// `calls`: each call of a builtin (a packed function with a dotted name, such as
    /// `vm.builtin.attention_kv_cache_create`) that passes constants, in code order, with its
    /// arguments.
    pub calls: Vec<RelaxCall>,
    /// `metadata`: what MLC's `_metadata` function returns when it returns a string constant
    /// (the model's metadata JSON, read without running code); `null` otherwise.
    pub metadata: Option<String>,
}

/// A string constant (JSON `relax.strings[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelaxString {
    /// `index`: the position in the constant pool (`c[index]`).
    pub index: usize,
    /// `text`: the string (bytes that are not UTF-8 replaced).
    pub text: String,
}

/// A builtin call with constant arguments (JSON `relax.calls[i]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelaxCall {
    /// `function`: the VM function the call is in.
    pub function: String,
    /// `callee`: the builtin called.
    pub callee: String,
    /// `args`: the arguments in order: constants as their values (strings, integers, floats,
    /// shapes as arrays, dtypes as strings, tensors as `"tensor DTYPE[SHAPE]"`), immediates as
    /// integers, registers as `"%N"`, functions as `"@name"`.
    pub args: Vec<serde_json::Value>,
}

/// One VM function (JSON `relax.functions[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelaxFunction {
    /// `name`.
    pub name: String,
    /// `kind`: `vm` (a Relax function) or `vm-tir`.
    pub kind: &'static str,
    /// `params`: the parameter names.
    pub params: Vec<String>,
}

/// What a graph executor factory holds.
#[derive(Debug, Clone, Serialize)]
pub struct GraphReport {
    /// `graph_json_len`: bytes of the graph JSON.
    pub graph_json_len: usize,
    /// `module_name`: the model's name (`default`).
    pub module_name: String,
    /// `params`: the stored parameters, in payload order.
    pub params: Vec<ParamReport>,
    /// `inputs`: the graph's inputs (its argument nodes that are not parameters), in order.
    pub inputs: Vec<GraphTensor>,
    /// `outputs`: the graph's outputs (its heads), in order; `name` is the producing node's.
    pub outputs: Vec<GraphTensor>,
    /// `graph_error`: why the graph JSON could not be read for inputs and outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_error: Option<String>,
}

/// One stored parameter (JSON `params[i]`).
#[derive(Debug, Clone, Serialize)]
pub struct ParamReport {
    /// `name`.
    pub name: String,
    /// `dtype`, as TVM spells it.
    pub dtype: String,
    /// `shape`.
    pub shape: Vec<i64>,
    /// `bytes`: the size of its data.
    pub bytes: usize,
}

/// A graph input or output (JSON `inputs[i]`, `outputs[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraphTensor {
    /// `name`: the input's name; for an output, the name of the node that produces it.
    pub name: String,
    /// `shape`.
    pub shape: Vec<i64>,
    /// `dtype`, as TVM spells it.
    pub dtype: String,
}

/// What a device module holds.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// `format`: `ptx`, `cubin`, `cl`, `metal`, ... (empty for WebGPU).
    pub format: String,
    /// `functions`: kernel name to `{name, arg_types, launch_param_tags, arg_extra_tags}`, in
    /// payload order: the shape `mblob export` reads.
    pub functions: FunctionTable,
    /// `data_len`: bytes of the code (modules with one code blob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_len: Option<usize>,
    /// `smap`: per-kernel sources (Metal, WebGPU), name and bytes, in payload order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub smap: Vec<NamedLen>,
    /// `shaders`: per-kernel SPIR-V (Vulkan), name and bytes, in payload order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shaders: Vec<NamedLen>,
    /// `version`: the `MetalModule` form's version string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A name and a length in bytes.
#[derive(Debug, Clone, Serialize)]
pub struct NamedLen {
    /// `name`.
    pub name: String,
    /// `bytes`.
    pub bytes: usize,
}

/// A node of the import tree (JSON `tree`).
#[derive(Debug, Clone, Serialize)]
pub struct TreeNode {
    /// `index`: the module index (`null` for the implicit library of a legacy blob).
    pub index: Option<usize>,
    /// `type_key`.
    pub type_key: String,
    /// `imports`.
    pub imports: Vec<TreeNode>,
}

/// A node of the tree after loading (JSON `loaded`).
#[derive(Debug, Clone, Serialize)]
pub struct LoadedNode {
    /// `type_key`.
    pub type_key: String,
    /// `imports`.
    pub imports: Vec<LoadedNode>,
}

/// A tar archive's members (JSON `tar`).
#[derive(Debug, Clone, Serialize)]
pub struct TarReport {
    /// `members`: name and size of each member, in archive order.
    pub members: Vec<NamedLen>,
    /// `blob_member`: the member holding the blob symbol (`null` when none does).
    pub blob_member: Option<String>,
    /// `unread`: the members that are no object, library or archive mblob reads (macOS's
    /// `._*` AppleDouble files, text), or whose container is malformed, with why.
    pub unread: Vec<UnreadMember>,
}

/// A tar member that could not be searched for a blob (JSON `tar.unread[i]`).
#[derive(Debug, Clone, Serialize)]
pub struct UnreadMember {
    /// `name`.
    pub name: String,
    /// `reason`.
    pub reason: String,
}

/// The host code of a shared library (JSON `host`), from its dynamic symbol table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostReport {
    /// `convention`: how TVM calls the exported functions: `classic-packed` (TVM 0.8-0.20),
    /// `tvm-ffi-0.21`, `tvm-ffi` (0.22 and later), or `c` (no TVM context symbols: plain C
    /// functions).
    pub convention: &'static str,
    /// The TVM generation whose convention it is (`None` for plain C), which `convention`
    /// names.
    #[serde(skip)]
    pub generation: Option<mblob_runtime::Layout>,
    /// `context_symbols`: the TVM context symbols the library defines (`__tvm_module_ctx`,
    /// `__TVMAPISetLastError`, `__tvm_ffi__library_ctx`, ...), which the runtime fills.
    pub context_symbols: Vec<String>,
    /// `functions`: the exported functions TVM can call (its entry points), in symbol-table
    /// order: global, defined code symbols with C names (TVM declares its entry points
    /// `extern "C"`), and in the 0.22+ convention only the `__tvm_ffi_<name>` ones.
    pub functions: Vec<HostFunction>,
    /// `other_functions`: the other exported code symbols, which are not TVM entry points
    /// (C++-mangled helpers of BYOC code, plain C helpers next to `__tvm_ffi_` functions).
    pub other_functions: Vec<String>,
    /// `unsupported_imports`: the TVM runtime functions the library imports (undefined
    /// `TVM*`/`tvm_*` symbols) that mblob does not provide: mblob refuses to load it.
    pub unsupported_imports: Vec<String>,
}

/// One model of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BundleEntry {
    /// `prefix`: its `c_symbol_prefix`.
    pub prefix: String,
    /// `symbol`: its blob symbol.
    pub symbol: String,
    /// `member`: the archive member holding its blob.
    pub member: Option<String>,
    /// `layout`: its blob layout.
    pub layout: &'static str,
    /// `system_lib`: whether it registers itself at start-up.
    pub system_lib: bool,
}

/// One exported host function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostFunction {
    /// `name`: the function's name as TVM looks it up (`add` for `__tvm_ffi_add`).
    pub name: String,
    /// `symbol`: the ELF symbol.
    pub symbol: String,
}
