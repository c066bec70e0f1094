//! What a packed `.so`, a raw `.blob` or a `.tar` that mblob wrote holds, read without
//! running it: the report behind `mblob inspect` and Python's `mblob.inspect`.
//!
//! The report is typed ([`Report`] and the structs below it); [`render_text`] gives the text
//! form, and its serde form is the JSON that `mblob inspect --json` prints (one object per
//! file). The doc comment of each field gives its JSON key and meaning: the keys are a wire
//! format that scripts may rely on (README's "Command line" section lists them too).
//!
//! ```no_run
//! let report = mblob::inspect::inspect_path("model.so".as_ref(), &Default::default())?;
//! println!("{}", serde_json::to_string(&report).unwrap());
//! # Ok::<(), mblob::Error>(())
//! ```

use std::io::{self, Read};
use std::path::{Path, PathBuf};

mod collect;
mod relax;
mod render;

pub use render::render_text;

use collect::{aot_io, fill, host_report, shape_value};
use mblob_runtime::container::{self, ContainerFormat};
use mblob_runtime::format::{self, UnknownKeys};
use mblob_runtime::{Bytes, FormatError, FormatErrorKind, Layout, LoadOptions, LoadedTree, Registry};
use serde::Serialize;

use crate::tree_json::FunctionTable;
use crate::{Error, Result};

/// What to read besides the blob, and how.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Read raw `.blob` files as this layout instead of detecting it.
    pub layout: Option<Layout>,
    /// Only consider blob symbols with this `c_symbol_prefix`.
    pub prefix: Option<String>,
    /// Also load the file with the real loader (this dlopens a shared library and so runs its
    /// initialisers) and report the tree after loading ([`Report::loaded`]).
    pub load: bool,
    /// With `load`: keep payloads whose type key has no loader as opaque bytes instead of
    /// failing, as TVM does.
    pub keep_unknown: bool,
}

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
    fn of(format: ContainerFormat) -> FileKind {
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

/// One exported host function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostFunction {
    /// `name`: the function's name as TVM looks it up (`add` for `__tvm_ffi_add`).
    pub name: String,
    /// `symbol`: the ELF symbol.
    pub symbol: String,
}

/// Inspects one file.
pub fn inspect_path(path: &Path, options: &Options) -> Result<Report> {
    let data = mblob_runtime::map_file(path)?;
    let mut report = inspect_bytes(&data, path, options.layout, options.prefix.as_deref())?;
    if options.load {
        let tree = load_tree(path, &data, &report, options)?;
        report.loaded = Some(shape_value(&tree.shape()));
        aot_io(&mut report, &tree);
    }
    Ok(report)
}

/// Inspects the bytes of a file: an ELF file is searched for a blob symbol, a tar archive for
/// the member that holds one, and anything else is read as a raw blob (of `layout`, or
/// detected).
pub fn inspect_bytes(data: &Bytes, path: &Path, layout: Option<Layout>, prefix: Option<&str>) -> Result<Report> {
    let registry = Registry::default();
    let mut report = empty_report(path, FileKind::Blob);
    // TVM's export_library("x.tar") compresses the archive (`tar -czf`).
    if crate::tvm_tar::is_gzip(data) {
        let plain = crate::tvm_tar::gunzip(data, path)?;
        if !is_tar(&plain) {
            return Err(Error::Input {
                what: path.display().to_string(),
                detail: "a gzip stream that holds no tar archive".into(),
            });
        }
        return inspect_tar(&plain, path, prefix);
    }
    if is_tar(data) {
        return inspect_tar(data, path, prefix);
    }
    let identity = container::identify(data);
    if let Some(identity) = &identity {
        report.kind = FileKind::of(identity.format);
        report.container = Some(ContainerReport {
            format: identity.format.name(),
            machine: identity.machine.clone(),
            member: None,
            runs_here: identity.runs_here(),
        });
        if identity.format == ContainerFormat::Elf {
            report.host = host_report(data);
        }
    } else {
        check_raw_blob(data, path)?;
    }
    let blob_error = |source| Error::Runtime(mblob_runtime::Error::Blob { path: path.to_owned(), source });
    let (blob, layout) = if identity.is_some() {
        let found = container::find_blob(data, prefix)
            .map_err(|source| mblob_runtime::Error::Container { path: path.to_owned(), source })?;
        let Some(found) = found else { return Ok(report) };
        report.container = Some(ContainerReport {
            format: found.identity.format.name(),
            machine: found.identity.machine.clone(),
            member: found.member.clone(),
            runs_here: found.identity.runs_here() && found.member.is_none(),
        });
        report.symbol = Some(found.symbol.clone());
        report.prefix = Some(found.prefix.clone());
        report.system_lib = Some(found.system_lib);
        report.section = Some(found.section.clone());
        report.file_offset = found.file_offset;
        (found.bytes, found.layout)
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
    report.blob = Some(blob.clone());
    Ok(report)
}

/// Whether `data` is a tar archive: `ustar` (POSIX or GNU) at byte 257, and not a raw blob
/// (whose first 8 bytes give the length of the rest; a tar file starts with a member name).
fn is_tar(data: &[u8]) -> bool {
    let blob_len = data.get(..8).map(|h| u64::from_le_bytes(h.try_into().unwrap_or_default()));
    data.get(257..262) == Some(b"ustar") && blob_len != Some(data.len() as u64 - 8)
}

/// A file that is neither ELF nor tar must be a raw blob: its first 8 bytes, the length of
/// what follows, must fit the file. Anything else (a text file, a truncated download) gets a
/// message saying what the file is not, not a blob length of 8031924123371070824.
fn check_raw_blob(data: &[u8], path: &Path) -> Result<()> {
    let not = |detail: String| Error::Input {
        what: path.display().to_string(),
        detail: format!("not an ELF file, a tar archive or a raw blob: {detail}").into(),
    };
    let Some(header) = data.get(..8) else {
        return Err(not(format!("{} bytes, fewer than a blob's 8-byte header", data.len())));
    };
    let claimed = u64::from_le_bytes(header.try_into().unwrap_or_default());
    let follow = data.len() as u64 - 8;
    if claimed > follow {
        return Err(not(format!(
            "{} bytes, and a raw blob starts with the length of what follows, which its first 8 bytes do not give",
            data.len()
        )));
    }
    Ok(())
}

/// Inspects a tar archive: lists its members and reports on the one that holds a blob symbol.
/// Every regular member is read as a container (ELF, Mach-O, COFF, WebAssembly, an archive);
/// those that are none, or are malformed, are listed in `tar.unread` with why.
fn inspect_tar(data: &Bytes, path: &Path, prefix: Option<&str>) -> Result<Report> {
    let bad = |e: io::Error| Error::Input {
        what: path.display().to_string(),
        detail: format!("not a readable tar archive: {e}").into(),
    };
    let mut archive = tar::Archive::new(&data[..]);
    let mut members = Vec::new();
    let mut unread = Vec::new();
    let mut found: Option<(String, Report)> = None;
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let name = entry.path().map_err(bad)?.display().to_string();
        let size = entry.size();
        members.push(NamedLen { name: name.clone(), bytes: usize::try_from(size).unwrap_or(usize::MAX) });
        if !entry.header().entry_type().is_file() {
            continue;
        }
        // The member's bytes, bounded by the archive's own size.
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(data.len()));
        entry.read_to_end(&mut bytes).map_err(bad)?;
        let bytes = Bytes::from_vec(bytes);
        if container::identify(&bytes).is_none() {
            if !crate::tvm_tar::is_source_name(&name) {
                let reason = "not an object file, library, archive or WebAssembly module".to_owned();
                unread.push(UnreadMember { name, reason });
            }
            continue;
        }
        match container::find_blob(&bytes, prefix) {
            Ok(Some(_)) => {
                if let Some((first, _)) = &found {
                    return Err(Error::Input {
                        what: path.display().to_string(),
                        detail: format!("two members hold a blob: {first} and {name}").into(),
                    });
                }
                let member_path = PathBuf::from(format!("{}({name})", path.display()));
                let report = inspect_bytes(&bytes, &member_path, None, prefix)?;
                found = Some((name, report));
            }
            Ok(None) => {}
            Err(e) => unread.push(UnreadMember { name, reason: e.to_string() }),
        }
    }
    let (blob_member, mut report) = match found {
        Some((name, report)) => (Some(name), report),
        None => (None, empty_report(path, FileKind::Tar)),
    };
    report.file = path.display().to_string();
    report.kind = FileKind::Tar;
    report.host = None;
    report.tar = Some(TarReport { members, blob_member, unread });
    Ok(report)
}

fn empty_report(path: &Path, kind: FileKind) -> Report {
    Report {
        file: path.display().to_string(),
        kind,
        tar: None,
        container: None,
        symbol: None,
        prefix: None,
        system_lib: None,
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
        host: None,
        loaded: None,
        blob: None,
    }
}

#[allow(unsafe_code)]
fn load_tree(path: &Path, data: &Bytes, report: &Report, args: &Options) -> Result<LoadedTree> {
    let registry = Registry::default();
    let unknown = if args.keep_unknown { UnknownKeys::KeepOpaque } else { UnknownKeys::Error };
    let options = LoadOptions { prefix: args.prefix.clone(), unknown };
    let loaded = match report.kind {
        FileKind::Elf => {
            // SAFETY: `--load` is the user's explicit request to open the library with the real
            // loader, which runs its initialisers; its help says so.
            unsafe { mblob_runtime::load_library(path, &registry, &options) }
        }
        FileKind::Blob => {
            let layout = report.layout.and_then(Layout::from_name).unwrap_or(Layout::Classic);
            mblob_runtime::load_blob(data, layout, &registry, &options)
        }
        FileKind::Macho | FileKind::Pe | FileKind::Coff | FileKind::Wasm | FileKind::Archive => {
            let identity = container::identify(data).ok_or_else(|| Error::Input {
                what: path.display().to_string(),
                detail: "not a library this machine can load".into(),
            })?;
            return Err(mblob_runtime::Error::ForeignLibrary { path: path.to_owned(), identity }.into());
        }
        FileKind::Tar => {
            return Err(Error::Input {
                what: path.display().to_string(),
                detail: "a tar archive holds objects, which cannot be loaded: link them into a shared library first"
                    .into(),
            })
        }
    };
    let loaded = loaded.map_err(|e| match unknown_key(&e) {
        Some(key) => Error::Input {
            what: path.display().to_string(),
            detail: format!(
                "{e}: no loader knows `{key}`; pass --keep-unknown to keep such payloads as opaque bytes, as TVM does"
            )
            .into(),
        },
        None => e.into(),
    })?;
    Ok(loaded)
}

/// The type key of an "unknown type key" error in `e` or its causes.
fn unknown_key(e: &mblob_runtime::Error) -> Option<String> {
    if let mblob_runtime::Error::NoLoader { key, .. } = e {
        return Some(key.clone());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(FormatError { kind: FormatErrorKind::UnknownTypeKey { key, .. }, .. }) = s.downcast_ref() {
            return Some(key.clone());
        }
        source = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::collect::{describe, graph_io};
    use super::*;
    use mblob_runtime::payload::relax::executable::VM_VERSION;

    const GRAPH: &str = r#"{"nodes": [{"op": "null", "name": "x", "inputs": []}, {"op": "null", "name": "w", "inputs": []},
        {"op": "tvm_op", "name": "f", "attrs": {"num_outputs": "2"}, "inputs": [[0, 0, 0], [1, 0, 0]]}],
        "arg_nodes": [0, 1], "heads": [[2, 1, 0]],
        "attrs": {"dltype": ["list_str", ["float32", "int8", "float32", "float16"]],
                  "shape": ["list_shape", [[2], [3, 4], [5], [6, 7]]]}}"#;

    #[test]
    fn graph_io_without_node_row_ptr_counts_each_nodes_outputs() {
        let w = mblob_runtime::payload::graph::Tensor::new(
            mblob_runtime::format::stream::DataType::parse("int8").unwrap(),
            vec![3, 4],
            vec![0u8; 12],
        )
        .unwrap();
        let (inputs, outputs) = graph_io(GRAPH, &[("w".into(), w)]).unwrap();
        assert_eq!(inputs, vec![GraphTensor { name: "x".into(), shape: vec![2], dtype: "float32".into() }]);
        // Node 2's entries are 2 and 3: its second output is entry 3.
        assert_eq!(outputs, vec![GraphTensor { name: "f".into(), shape: vec![6, 7], dtype: "float16".into() }]);
    }

    #[test]
    fn graph_io_refuses_what_does_not_add_up() {
        for (from, to, why) in [
            (r#""heads": [[2, 1, 0]]"#, r#""heads": [[9, 0, 0]]"#, "node 9 does not exist"),
            (r#""heads": [[2, 1, 0]]"#, r#""heads": [[2, 5, 0]]"#, "entry 7 has no shape"),
            (r#""heads": [[2, 1, 0]]"#, r#""heads": [[2]]"#, "a head is not"),
            (r#""arg_nodes": [0, 1]"#, r#""arg_nodes": "x""#, "graph JSON: invalid type"),
        ] {
            let err = graph_io(&GRAPH.replace(from, to), &[]).unwrap_err();
            assert!(err.contains(why), "{to}: {err}");
        }
    }

    /// A Relax executable whose function table runs past its end: the Relax reader's error,
    /// no table.
    #[test]
    fn a_truncated_relax_table_is_an_error() {
        let mut exe = 0xD225_DE2F_4214_151Eu64.to_le_bytes().to_vec();
        exe.extend_from_slice(&4u64.to_le_bytes());
        exe.extend_from_slice(VM_VERSION.as_bytes());
        exe.extend_from_slice(&u64::MAX.to_le_bytes());
        exe.extend_from_slice(&1i32.to_le_bytes());
        let mut m = ModuleReport {
            type_key: "relax.VMExecutable".to_owned(),
            index: None,
            payload_len: exe.len() as u64,
            error: None,
            note: None,
            graph: None,
            device: None,
            relax: None,
            aot: None,
        };
        describe(&mut m, Bytes::from_vec(exe), Layout::Ffi, &Registry::default(), None);
        assert!(m.relax.is_none());
        let err = m.error.expect("an error");
        assert!(err.contains("function table length 18446744073709551615 is larger than"), "{err}");
    }

    #[test]
    fn a_raw_blob_needs_a_fitting_header() {
        let p = Path::new("f");
        assert!(check_raw_blob(&[1, 0, 0, 0, 0, 0, 0, 0, 7], p).is_ok());
        for bad in [&b"short"[..], b"hello world", &[2, 0, 0, 0, 0, 0, 0, 0, 7]] {
            let e = check_raw_blob(bad, p).unwrap_err().to_string();
            assert!(e.starts_with("f: not an ELF file, a tar archive or a raw blob"), "{e}");
        }
    }
}
