//! `TREE.json`, the description of a module tree that `mblob export` reads.
//!
//! ```json
//! {"type_key": "GraphExecutorFactory", "payload": "factory.bin", "imports": [
//!     {"type_key": "llvm", "objects": ["lib0.o"], "sources": ["extra.c"], "ir": ["kernels.ll"],
//!      "imports": [{"type_key": "cuda", "payload": "kernels.cuda.bin"}]}]}
//! ```
//! Payload modules name a file with the payload as it appears in a classic blob (TVM's
//! `SaveToBinary` bytes). A kind that mblob knows (the graph factory, the device kinds) is
//! decoded from it, so it is written again in the layout of the export (a device payload gains
//! TVM 0.21's extra argument tags in `classic-0.21` and `ffi`); other kinds are copied as they
//! are. A device module can also be made from its parts and a function table, the shape that
//! `mblob inspect --json` prints and `mblob extract` writes:
//!
//! ```json
//! {"type_key": "cuda", "format": "ptx", "data": "kernels.ptx", "functions": {
//!     "vector_add": {"name": "vector_add", "arg_types": ["handle", "handle", "handle", "int32"],
//!                    "launch_param_tags": ["blockIdx.x", "threadIdx.x"],
//!                    "arg_extra_tags": [0, 0, 0, 0]}}}
//! ```
//! `data` holds the code (PTX, cubin, fatbin, OpenCL C, ...). Modules that keep one source per
//! kernel name them in `smap` instead (`{"kernel": "kernel.metal"}`: WebGPU, and Metal in the
//! tvm-ffi era), Metal's `MetalModule` form adds `"version": "0.1.0"`, and Vulkan lists its
//! SPIR-V in `shaders` (`{"kernel": {"flag": 0, "data": "kernel.spv"}}`). A function's fields
//! are those of [`FunctionInfo`]; `name` defaults to empty (what TVM up to 0.21 writes) and
//! `arg_extra_tags` to one 0 per argument (none for WebGPU), as TVM 0.21 writes them.
//!
//! A `GraphExecutorFactory` can also be made from the files TVM's `relay.build` result
//! writes: the graph JSON (`get_graph_json()`) and the params file
//! (`relay.save_param_dict(get_params())`), with the model's name (default `default`):
//!
//! ```json
//! {"type_key": "GraphExecutorFactory", "graph": "model.json", "params": "model.params",
//!  "module_name": "default", "imports": [{"type_key": "llvm", "objects": ["lib0.o"]}]}
//! ```
//! The graph is parsed and every param it takes is checked against its input (dtype, shape).
//!
//! DSO parts (`llvm`, `c`, `static_library`) list object files, C sources and LLVM IR files.
//! Paths are relative to the JSON file. A node may carry an `"id"`: nodes with the same id are
//! one module (imported twice).
//!
//! The root may record how the tree was packed, as `mblob extract` writes it: `layout`
//! (`classic`, `classic-0.21`, `ffi`), `symbol` (the blob symbol, which names the layout and
//! the prefix too), `prefix` (TVM's `c_symbol_prefix`) and `system_lib`; see [`Packing`].
//!
//! Unknown fields are refused, and errors name the JSON path of the field
//! (`tree.json at $.imports[0].functions.add.arg_types[1]: ...`). Every file the tree names is
//! opened while it is read, so a missing file is reported before any work starts.

use std::fmt;
use std::path::{Path, PathBuf};

use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::device::{DeviceForm, DeviceModule, FunctionInfo, SpirvShader, DEVICE_TYPE_KEYS};
use mblob_runtime::tree::DSO_TYPE_KEYS;
use mblob_runtime::{Bytes, Layout, ModuleId, ModuleTree, RawPayload, Registry};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::export::Export;
use crate::{Detail, Error, Result};

/// Reads `TREE.json` into an [`Export`] (tree and host files). Every file it names is opened
/// here, so a missing one is found before the export does any work.
pub fn read_tree_json(path: &Path) -> Result<Export> {
    read_tree_json_with_packing(path).map(|(e, _)| e)
}

/// How the tree was packed, from the root of `TREE.json` (what `mblob extract` writes there):
/// the layout, the blob symbol, the `c_symbol_prefix`, and whether the blob registers with
/// TVM's system library. [`read_tree_json`] applies them to the [`Export`]; options given on
/// the command line override them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packing {
    /// `layout`: `classic`, `classic-0.21` or `ffi`.
    pub layout: Option<Layout>,
    /// `symbol`: the blob symbol (prefix and layout's symbol).
    pub symbol: Option<String>,
    /// `prefix`: TVM's `c_symbol_prefix`.
    pub prefix: Option<String>,
    /// `system_lib`: register the blob with the system library at start-up.
    pub system_lib: Option<bool>,
}

/// [`read_tree_json`], and the packing the root names.
pub fn read_tree_json_with_packing(path: &Path) -> Result<(Export, Packing)> {
    let text = std::fs::read(path).map_err(Error::io(path, "cannot read"))?;
    parse_tree_json_with_packing(&text, path, path.parent().unwrap_or(Path::new(".")))
}

/// Reads a tree description held in memory (`text`, JSON) into an [`Export`]: as
/// [`read_tree_json`], with the paths it names relative to `base`; `name` stands for the
/// description in messages (`<tree> at $.imports[0]: ...`).
pub fn parse_tree_json(text: &[u8], name: &Path, base: &Path) -> Result<Export> {
    parse_tree_json_with_packing(text, name, base).map(|(e, _)| e)
}

/// [`parse_tree_json`], and the packing the root names.
pub(crate) fn parse_tree_json_with_packing(text: &[u8], name: &Path, base: &Path) -> Result<(Export, Packing)> {
    let path = name;
    let bad =
        |at: &str, detail: String| Error::Input { what: format!("{} at {at}", path.display()), detail: detail.into() };
    let mut de = serde_json::Deserializer::from_slice(text);
    let mut root: Node = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = json_path(&e.path().to_string());
        let inner = e.into_inner();
        let detail =
            if inner.is_syntax() || inner.is_eof() { format!("not valid JSON: {inner}") } else { inner.to_string() };
        bad(&at, detail)
    })?;
    de.end().map_err(|e| Error::Input {
        what: path.display().to_string(),
        detail: format!("not valid JSON: {e}").into(),
    })?;
    let packing = take_packing(&mut root).map_err(|(at, detail)| bad(&at, detail))?;
    let mut b = Builder {
        json: path,
        base,
        tree: ModuleTree::new(),
        ids: Vec::new(),
        files: Files::default(),
        registry: Registry::default(),
    };
    b.node(&root, "$")?;
    let mut export = Export::from_tree(b.tree);
    export.objects(b.files.objects);
    b.files.sources.into_iter().for_each(|s| {
        export.c_source(s);
    });
    b.files.ir.into_iter().for_each(|s| {
        export.ir(s);
    });
    if let Some(l) = packing.layout {
        export.layout(l);
    }
    if let Some(p) = &packing.prefix {
        export.prefix(p.clone());
    }
    if let Some(s) = packing.system_lib {
        export.system_lib(s);
    }
    Ok((export, packing))
}

/// Takes the root's packing fields out of `root`: `layout`, `symbol`, `prefix`,
/// `system_lib`. A `symbol` names the layout and the prefix too; where both are given they must
/// agree.
fn take_packing(root: &mut Node) -> std::result::Result<Packing, (String, String)> {
    let mut packing = Packing::default();
    if let Some(name) = root.layout.take() {
        let layout = Layout::from_name(&name).ok_or_else(|| {
            let all = Layout::ALL.map(|l| l.name()).join(", ");
            ("$.layout".to_owned(), format!("unknown layout `{name}` (expected one of: {all})"))
        })?;
        packing.layout = Some(layout);
    }
    packing.prefix = root.prefix.take();
    packing.system_lib = root.system_lib.take();
    if let Some(symbol) = root.symbol.take() {
        let (layout, prefix) = Layout::from_symbol(&symbol)
            .ok_or_else(|| ("$.symbol".to_owned(), format!("`{symbol}` is no blob symbol of any layout")))?;
        if packing.layout.is_some_and(|l| l != layout) || packing.prefix.as_deref().is_some_and(|p| p != prefix) {
            return Err((
                "$.symbol".to_owned(),
                format!("`{symbol}` does not agree with the layout and prefix given beside it"),
            ));
        }
        packing.layout = Some(layout);
        packing.prefix = Some(prefix.to_owned());
        packing.symbol = Some(symbol);
    }
    Ok(packing)
}

/// A serde path (`imports[0].data`, `.` for the root) as the JSON path in messages (`$.imports[0].data`).
fn json_path(serde_path: &str) -> String {
    match serde_path {
        "." | "" => "$".to_owned(),
        p => format!("$.{p}"),
    }
}

/// One module of TREE.json, the one model of the format: `mblob export` reads it
/// ([`parse_tree_json`]) and `mblob extract` writes it. It has every field any kind may have;
/// which ones a kind allows (see the [module docs](self)) is checked after reading. A field
/// that is `None` is not written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a module (a JSON object with a `type_key`)")]
pub struct Node {
    /// Root only: the blob layout the tree was packed in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Root only: the blob symbol (which names the layout and the prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    /// Root only: TVM's `c_symbol_prefix`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Root only: whether the blob registers itself as a system library.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_lib: Option<bool>,
    /// Nodes with the same id are one module (imported more than once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<serde_json::Value>,
    /// The module's type key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_key: Option<String>,
    /// DSO parts: object files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<Vec<String>>,
    /// DSO parts: C sources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<String>>,
    /// DSO parts: LLVM IR files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ir: Option<Vec<String>>,
    /// Payload modules: the file with the payload as a classic blob holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// A graph executor factory from TVM's files: the graph JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
    /// A graph executor factory from TVM's files: the params file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<String>,
    /// A graph executor factory from TVM's files: the model's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_name: Option<String>,
    /// Device modules: Metal's `MetalModule` version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Device modules: the code's format (`ptx`, `cl`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Device modules: the file with the code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Device modules: the function table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub functions: Option<FunctionTable>,
    /// Device modules with one source per kernel: kernel to file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smap: Option<Ordered<String>>,
    /// Vulkan: kernel to shader.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shaders: Option<Ordered<ShaderJson>>,
    /// The modules it imports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imports: Option<Vec<Node>>,
}

/// Fields of a DSO part.
const DSO_FIELDS: [&str; 6] = ["type_key", "id", "imports", "objects", "sources", "ir"];
/// Fields of a payload module.
const PAYLOAD_FIELDS: [&str; 4] = ["type_key", "id", "imports", "payload"];
/// Fields of a graph executor factory made from a graph JSON and a params file.
const GRAPH_FIELDS: [&str; 6] = ["type_key", "id", "imports", "graph", "params", "module_name"];
/// Fields of a device module made from its parts.
const DEVICE_FIELDS: [&str; 9] =
    ["type_key", "id", "imports", "format", "data", "functions", "version", "smap", "shaders"];

impl Node {
    /// The fields present, by name.
    fn present(&self) -> Vec<&'static str> {
        let Node {
            layout,
            symbol,
            prefix,
            system_lib,
            type_key,
            id,
            imports,
            objects,
            sources,
            ir,
            payload,
            graph,
            params,
            module_name,
            format,
            data,
            functions,
            version,
            smap,
            shaders,
        } = self;
        let all = [
            // Taken out of the root before its fields are checked: anywhere else, misplaced.
            ("layout", layout.is_some()),
            ("symbol", symbol.is_some()),
            ("prefix", prefix.is_some()),
            ("system_lib", system_lib.is_some()),
            ("type_key", type_key.is_some()),
            ("id", id.is_some()),
            ("imports", imports.is_some()),
            ("objects", objects.is_some()),
            ("sources", sources.is_some()),
            ("ir", ir.is_some()),
            ("payload", payload.is_some()),
            ("graph", graph.is_some()),
            ("params", params.is_some()),
            ("module_name", module_name.is_some()),
            ("format", format.is_some()),
            ("data", data.is_some()),
            ("functions", functions.is_some()),
            ("version", version.is_some()),
            ("smap", smap.is_some()),
            ("shaders", shaders.is_some()),
        ];
        all.into_iter().filter(|(_, p)| *p).map(|(n, _)| n).collect()
    }
}

/// A Vulkan shader of `shaders`: TVM's flag word and a file of SPIR-V words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShaderJson {
    /// `SPIRVShader.flag`.
    pub flag: u32,
    /// The file holding the SPIR-V words (little-endian), relative to the JSON file.
    pub data: String,
}

/// A JSON object read and written with its keys in file order (TVM's maps keep the order they were
/// written in, and the blob must come out the same); a key given twice is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V_<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V_<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out: Vec<(String, V)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(de::Error::custom(format!("`{key}` appears twice")));
                    }
                    let value = map.next_value()?;
                    out.push((key, value));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V_(std::marker::PhantomData))
    }
}

impl<V: Serialize> Serialize for Ordered<V> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// A device module's function table as JSON: kernel name to [`FunctionJson`], in payload order
/// (TVM writes an unordered map; the order read is the order written back). `mblob inspect
/// --json` prints it, `mblob extract` writes it, and `TREE.json` takes it as `functions`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionTable(pub Vec<(String, FunctionJson)>);

impl FunctionTable {
    /// The table of a device module, as the module holds it.
    pub fn of(functions: &[(String, FunctionInfo)]) -> FunctionTable {
        FunctionTable(functions.iter().map(|(k, info)| (k.clone(), FunctionJson::from_info(info))).collect())
    }
}

impl Serialize for FunctionTable {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for FunctionTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ordered::<FunctionJson>::deserialize(d).map(|o| FunctionTable(o.0))
    }
}

/// One kernel of a function table: the fields of [`FunctionInfo`], under the same names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionJson {
    /// [`FunctionInfo::name`]: empty in what TVM up to 0.21 writes for most kinds, the kernel
    /// name in TVM 0.27 (default: empty).
    #[serde(default)]
    pub name: String,
    /// [`FunctionInfo::arg_types`], in TVM's spelling (`handle`, `int32`, `float32x4`, ...).
    #[serde(default)]
    pub arg_types: Vec<TypeName>,
    /// [`FunctionInfo::launch_param_tags`]: thread axes, then optional flags.
    #[serde(default)]
    pub launch_param_tags: Vec<String>,
    /// [`FunctionInfo::arg_extra_tags`] (TVM 0.21 and later). When absent: one 0 per argument
    /// (WebGPU: none), as TVM 0.21 writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arg_extra_tags: Option<Vec<i32>>,
}

impl FunctionJson {
    /// The JSON form of a function info (every field, `arg_extra_tags` included).
    pub(crate) fn from_info(info: &FunctionInfo) -> FunctionJson {
        FunctionJson {
            name: info.name.clone(),
            arg_types: info.arg_types.iter().map(|&t| TypeName(t)).collect(),
            launch_param_tags: info.launch_param_tags.clone(),
            arg_extra_tags: Some(info.arg_extra_tags.clone()),
        }
    }

    /// The function info of a `type_key` module (which decides the default extra tags).
    pub(crate) fn to_info(&self, type_key: &str) -> FunctionInfo {
        let arg_types: Vec<DataType> = self.arg_types.iter().map(|t| t.0).collect();
        let mut info = FunctionInfo::new(self.name.clone(), arg_types, self.launch_param_tags.clone());
        match &self.arg_extra_tags {
            Some(tags) => info.arg_extra_tags = tags.clone(),
            None if type_key == mblob_runtime::payload::device::WEBGPU => info.arg_extra_tags.clear(),
            None => {}
        }
        info
    }
}

/// A TVM data type written as TVM spells it (`float32`, `handle`, ...); reading refuses any
/// other spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeName(pub DataType);

impl Serialize for TypeName {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        DataType::parse(&s)
            .map(TypeName)
            .ok_or_else(|| de::Error::custom(format!("`{s}` is not a TVM type (float32, int8, handle...)")))
    }
}

#[derive(Default)]
struct Files {
    objects: Vec<PathBuf>,
    sources: Vec<PathBuf>,
    ir: Vec<PathBuf>,
}

struct Builder<'a> {
    json: &'a Path,
    base: &'a Path,
    tree: ModuleTree,
    ids: Vec<(String, ModuleId)>,
    files: Files,
    /// The built-in kinds, which payload files are decoded with.
    registry: Registry,
}

impl Builder<'_> {
    fn bad(&self, at: &str, detail: impl Into<Detail>) -> Error {
        Error::Input { what: format!("{} at {at}", self.json.display()), detail: detail.into() }
    }

    fn node(&mut self, n: &Node, at: &str) -> Result<ModuleId> {
        let id = n.id.as_ref().map(|i| i.to_string());
        if let Some((_, m)) = id.as_ref().and_then(|id| self.ids.iter().find(|(i, _)| i == id)) {
            return Ok(*m);
        }
        let key = n.type_key.as_deref().ok_or_else(|| self.bad(at, "`type_key` is missing"))?;
        let dso = DSO_TYPE_KEYS.contains(&key);
        let m = if dso {
            self.only(n, &DSO_FIELDS, at, &format!("a DSO module (`{key}`)"))?;
            let objects = self.paths(n.objects.as_deref(), &format!("{at}.objects"), "host object")?;
            let sources = self.paths(n.sources.as_deref(), &format!("{at}.sources"), "C source")?;
            let ir = self.paths(n.ir.as_deref(), &format!("{at}.ir"), "LLVM IR file")?;
            self.files.objects.extend(objects);
            self.files.sources.extend(sources);
            self.files.ir.extend(ir);
            self.tree.add_dso(key)
        } else {
            let dso_fields: Vec<&str> =
                n.present().into_iter().filter(|f| ["objects", "sources", "ir"].contains(f)).collect();
            if let Some(field) = dso_fields.first() {
                return Err(self.bad(at, self.not_dso(key, field)));
            }
            if n.payload.is_some() {
                self.only(n, &PAYLOAD_FIELDS, at, "a module read from a `payload` file")?;
                self.payload_file(key, n, at)?
            } else if n.graph.is_some() || n.params.is_some() || n.module_name.is_some() {
                self.only(n, &GRAPH_FIELDS, at, "a graph executor factory read from `graph` and `params` files")?;
                self.graph_factory(key, n, at)?
            } else if n.data.is_some() || n.smap.is_some() || n.shaders.is_some() {
                self.only(n, &DEVICE_FIELDS, at, "a device module")?;
                self.device_module(key, n, at)?
            } else {
                let mut detail = format!(
                    "`{key}` is not a DSO kind ({}), so it needs a `payload` file (or, for a device kind, `data`)",
                    DSO_TYPE_KEYS.join(", ")
                );
                if let Some(s) = self.suggest(key) {
                    detail.push_str(&format!("; did you mean `{s}`?"));
                }
                return Err(self.bad(at, detail));
            }
        };
        if let Some(id) = id {
            self.ids.push((id, m));
        }
        for (i, child) in n.imports.iter().flatten().enumerate() {
            let c = self.node(child, &format!("{at}.imports[{i}]"))?;
            self.tree.import(m, c);
        }
        Ok(m)
    }

    /// Why a non-DSO `key` cannot have the DSO field `field`.
    fn not_dso(&self, key: &str, field: &str) -> String {
        let kinds = DSO_TYPE_KEYS.join(", ");
        let known = self.registry.get(key).is_some() || DEVICE_TYPE_KEYS.contains(&key);
        let mut s = if known {
            format!("`{field}` belongs to DSO modules ({kinds}), and `{key}` is a payload kind")
        } else {
            format!("unknown type_key `{key}` for a module with `{field}`: DSO kinds are {kinds}")
        };
        if let Some(near) = nearest(key, DSO_TYPE_KEYS.iter().copied()) {
            s.push_str(&format!("; did you mean `{near}`?"));
        }
        s
    }

    /// A known type key that `key` is likely a typo of.
    fn suggest(&self, key: &str) -> Option<String> {
        let registered = self.registry.keys();
        let known = DSO_TYPE_KEYS.iter().chain(DEVICE_TYPE_KEYS).copied().chain(registered.iter().map(String::as_str));
        nearest(key, known).map(str::to_owned)
    }

    /// Refuses a field that `what` does not take.
    fn only(&self, n: &Node, allowed: &[&str], at: &str, what: &str) -> Result<()> {
        match n.present().into_iter().find(|f| !allowed.contains(f)) {
            Some(f) => {
                Err(self.bad(at, format!("`{f}` does not belong to {what} (its fields: {})", allowed.join(", "))))
            }
            None => Ok(()),
        }
    }

    /// Opens a file the JSON names (mapped, not copied); an error names the path as written in
    /// the JSON, and the path it resolved to when that differs.
    fn open(&self, name: &str, at: &str, what: &str) -> Result<Bytes> {
        let path = self.base.join(name);
        let shown =
            if Path::new(name) == path { format!("`{name}`") } else { format!("`{name}` ({})", path.display()) };
        // Opened first so that the error is the system's, with the path named once (here).
        if let Err(e) = std::fs::File::open(&path) {
            return Err(self.bad(at, format!("cannot read {what} {shown}: {e}")));
        }
        mblob_runtime::map_file(&path).map_err(|e| self.bad(at, format!("cannot read {what} {shown}: {e}")))
    }

    /// A payload file in classic bytes: decoded when the kind is known, else kept opaque.
    fn payload_file(&mut self, key: &str, n: &Node, at: &str) -> Result<ModuleId> {
        let at = format!("{at}.payload");
        let bytes = self.open(n.payload.as_deref().unwrap_or_default(), &at, "payload file")?;
        let Some(loader) = self.registry.get(key) else {
            return Ok(self.tree.add_payload(RawPayload::new(key, bytes)));
        };
        let module = loader
            .load(bytes, Layout::Classic)
            .map_err(|e| self.bad(&at, format!("not a `{key}` payload as a classic blob holds it: {e}")))?;
        self.tree.add_loaded(module).map_err(|k| self.bad(&at, format!("a `{k}` module cannot be saved again")))
    }

    /// A graph executor factory from what TVM's `relay.build` result gives: the graph JSON
    /// (`get_graph_json()`) in `graph`, the params file (`save_param_dict(get_params())`) in
    /// `params` (none: no params), and `module_name` (default `default`). The graph is parsed
    /// and each param it takes checked against its input (dtype and shape); the params keep
    /// the file's order.
    fn graph_factory(&mut self, key: &str, n: &Node, at: &str) -> Result<ModuleId> {
        use mblob_runtime::exec::graph::{read_params, Graph};
        use mblob_runtime::payload::graph::{GraphExecutorFactory, GRAPH_EXECUTOR_FACTORY, GRAPH_RUNTIME_FACTORY};
        if key != GRAPH_EXECUTOR_FACTORY && key != GRAPH_RUNTIME_FACTORY {
            return Err(self.bad(at, format!("`graph` and `params` make a `{GRAPH_EXECUTOR_FACTORY}`, not a `{key}`")));
        }
        let graph_at = format!("{at}.graph");
        let name = n.graph.as_deref().ok_or_else(|| self.bad(at, "`graph` (the graph JSON file) is missing"))?;
        let bytes = self.open(name, &graph_at, "graph JSON")?;
        let json = std::str::from_utf8(&bytes)
            .map_err(|_| self.bad(&graph_at, format!("`{name}` is not a graph JSON: not UTF-8 text")))?;
        let graph = Graph::parse(json).map_err(|e| self.bad(&graph_at, format!("`{name}`: {e}")))?;
        let params = match n.params.as_deref() {
            Some(p) => {
                let params_at = format!("{at}.params");
                let bytes = self.open(p, &params_at, "params file")?;
                let params = read_params(&bytes)
                    .map_err(|e| self.bad(&params_at, format!("`{p}` is not a params file (save_param_dict): {e}")))?;
                graph
                    .check_params(&params)
                    .map_err(|e| self.bad(&params_at, format!("`{p}` does not match `{name}`: {e}")))?;
                params
            }
            None => Vec::new(),
        };
        let mut factory = GraphExecutorFactory::new(json, params, n.module_name.as_deref().unwrap_or("default"));
        factory.type_key = key.to_owned();
        Ok(self.tree.add_payload(factory))
    }

    /// A device module from its parts: `format`, `functions`, and its code in `data`, `smap`
    /// or `shaders`. The field order of the payload follows from the kind and the fields.
    fn device_module(&mut self, key: &str, n: &Node, at: &str) -> Result<ModuleId> {
        if !DEVICE_TYPE_KEYS.contains(&key) {
            return Err(self.bad(
                at,
                format!("`data` makes a device module, and `{key}` is none of {}", DEVICE_TYPE_KEYS.join(", ")),
            ));
        }
        let webgpu = key == mblob_runtime::payload::device::WEBGPU;
        let vulkan = key == mblob_runtime::payload::device::VULKAN;
        let form = if let Some(version) = &n.version {
            DeviceForm::VersionSmapFmapFmt { version: version.clone() }
        } else if webgpu {
            DeviceForm::FmapSmap
        } else if vulkan {
            DeviceForm::FmtFmapShaders
        } else if n.smap.is_some() {
            DeviceForm::FmtFmapSmap
        } else {
            DeviceForm::FmtFmapData
        };
        let needs = |field: &str, present: bool| -> Result<()> {
            if present {
                Ok(())
            } else {
                Err(self.bad(at, format!("a `{key}` module of this form needs `{field}`")))
            }
        };
        let wants_smap =
            matches!(form, DeviceForm::VersionSmapFmapFmt { .. } | DeviceForm::FmapSmap | DeviceForm::FmtFmapSmap);
        needs("smap", !wants_smap || n.smap.is_some())?;
        needs("shaders", !vulkan || n.shaders.is_some())?;
        needs("data", form != DeviceForm::FmtFmapData || n.data.is_some())?;
        if form != DeviceForm::FmtFmapData && n.data.is_some() {
            return Err(self.bad(at, format!("`data` does not belong to a `{key}` module with `smap` or `shaders`")));
        }
        if !webgpu && n.format.is_none() {
            return Err(self.bad(at, "a device module needs `format` (`ptx`, `cubin`, `fatbin`, `cl`, ...)"));
        }
        let data = match &n.data {
            Some(name) => self.open(name, &format!("{at}.data"), "device code")?,
            None => Bytes::from_vec(Vec::new()),
        };
        let mut functions = Vec::new();
        for (name, f) in n.functions.iter().flat_map(|t| &t.0) {
            let info = f.to_info(key);
            info.launch_params()
                .map_err(|e| self.bad(&format!("{at}.functions.{name}.launch_param_tags"), e.to_string()))?;
            functions.push((name.clone(), info));
        }
        let mut m = DeviceModule::new(key, n.format.clone().unwrap_or_default(), functions, data);
        for (name, file) in n.smap.iter().flat_map(|s| &s.0) {
            m.sources.push((name.clone(), self.open(file, &format!("{at}.smap.{name}"), "kernel source")?));
        }
        for (name, s) in n.shaders.iter().flat_map(|s| &s.0) {
            let words = self.open(&s.data, &format!("{at}.shaders.{name}.data"), "SPIR-V file")?;
            if words.len() % 4 != 0 {
                return Err(self.bad(&format!("{at}.shaders.{name}.data"), "SPIR-V is a whole number of 4-byte words"));
            }
            m.shaders.push((name.clone(), SpirvShader { flag: s.flag, words }));
        }
        m.form = form;
        Ok(self.tree.add_payload(m))
    }

    /// Files of a DSO part, each opened to check it can be read.
    fn paths(&self, names: Option<&[String]>, at: &str, what: &str) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for (i, name) in names.unwrap_or_default().iter().enumerate() {
            self.open(name, &format!("{at}[{i}]"), what)?;
            out.push(self.base.join(name));
        }
        Ok(out)
    }
}

/// The candidate `key` most likely mistyped: equal but for case, or within two edits.
fn nearest<'k>(key: &str, candidates: impl Iterator<Item = &'k str>) -> Option<&'k str> {
    let lower = key.to_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == key {
            return None;
        }
        let d = if c.to_lowercase() == lower { 0 } else { strsim::levenshtein(&lower, &c.to_lowercase()) };
        if d <= 2 && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str, files: &[(&str, &[u8])]) -> (tempfile::TempDir, Result<Export>) {
        let dir = tempfile::tempdir().unwrap();
        for (name, data) in files {
            std::fs::write(dir.path().join(name), data).unwrap();
        }
        let path = dir.path().join("tree.json");
        std::fs::write(&path, json).unwrap();
        let e = read_tree_json(&path);
        (dir, e)
    }

    fn message(r: Result<Export>) -> String {
        r.map(|_| ()).unwrap_err().to_string()
    }

    #[test]
    fn a_shared_module_is_one_node() {
        let json = r#"{"type_key": "Factory", "payload": "f.bin", "imports": [
            {"type_key": "llvm", "objects": ["a.o"], "imports": [{"id": 7, "type_key": "example.Kernels", "payload": "k.bin"}]},
            {"id": 7}]}"#;
        let (_dir, e) = read(json, &[("f.bin", b"F"), ("k.bin", b"K"), ("a.o", b"")]);
        let mut e = e.unwrap();
        let tree = e.tree_mut();
        assert_eq!(tree.len(), 3);
        let root = tree.root().unwrap();
        assert_eq!(tree.kind(root).unwrap().type_key(), "Factory");
        let imports = tree.imports(root).unwrap().to_vec();
        assert_eq!(tree.imports(imports[0]), Some(&[imports[1]][..]));
        assert!(format!("{e:?}").contains("a.o"));
    }

    #[test]
    fn errors_name_the_file_and_the_node() {
        let ptx = r#""type_key": "cuda", "format": "ptx", "data": "k.ptx""#;
        let cases = [
            (
                r#"{"type_key": "llvm", "payload": "x.bin"}"#.to_owned(),
                "at $: `payload` does not belong to a DSO module",
            ),
            (r#"{"type_key": "llvm", "import": []}"#.into(), "at $.import: unknown field `import`, expected one of"),
            (
                r#"{"type_key": "llvm", "imports": [{"type_key": "cuda"}]}"#.into(),
                "at $.imports[0]: `cuda` is not a DSO kind",
            ),
            (
                r#"{"type_key": "llvm", "imports": [{"type_key": "cuda", "payload": "nope.bin"}]}"#.into(),
                "at $.imports[0].payload: cannot read payload file `nope.bin` (",
            ),
            (
                r#"{"type_key": "cuda", "payload": "k.ptx", "data": "k.ptx"}"#.into(),
                "at $: `data` does not belong to a module read from a `payload` file",
            ),
            (
                r#"{"type_key": "cuda", "payload": "k.ptx"}"#.into(),
                "at $.payload: not a `cuda` payload as a classic blob",
            ),
            (
                r#"{"type_key": "Factory", "format": "ptx", "data": "k.ptx"}"#.into(),
                "at $: `data` makes a device module",
            ),
            (r#"{"type_key": "cuda", "data": "k.ptx"}"#.into(), "at $: a device module needs `format`"),
            (
                r#"{"type_key": "cuda", "format": "ptx", "data": 1}"#.into(),
                "at $.data: invalid type: integer `1`, expected a string",
            ),
            (
                format!(r#"{{{ptx}, "functions": {{"f": {{"arg_types": ["f32"]}}}}}}"#),
                "at $.functions.f.arg_types[0]: `f32` is not a TVM type",
            ),
            (
                format!(
                    r#"{{"type_key": "llvm", "imports": [{{{ptx}, "functions": {{"f": {{}}, "g": {{"arg_types": ["handle", "f32"]}}}}}}]}}"#
                ),
                "at $.imports[0].functions.g.arg_types[1]: `f32` is not a TVM type",
            ),
            (
                format!(r#"{{{ptx}, "functions": {{"f": {{"tags": []}}}}}}"#),
                "at $.functions.f.tags: unknown field `tags`",
            ),
            (
                format!(r#"{{{ptx}, "functions": {{"f": {{"launch_param_tags": ["warp.x"]}}}}}}"#),
                "at $.functions.f.launch_param_tags",
            ),
            (format!(r#"{{{ptx}, "functions": {{"f": {{}}, "f": {{}}}}}}"#), "at $.functions: `f` appears twice"),
            (r#"{"type_key": "llvm", "objects": ["k.ptx", 3]}"#.into(), "at $.objects[1]: invalid type: integer `3`"),
            (r#"{"type_key": "llvm", "imports": {}}"#.into(), "at $.imports: invalid type: map, expected a sequence"),
            (
                r#""llvm""#.into(),
                "at $: invalid type: string \"llvm\", expected a module (a JSON object with a `type_key`)",
            ),
            (r#"{"type_key": 5}"#.into(), "at $.type_key: invalid type: integer `5`, expected a string"),
            (r#"{"id": 1}"#.into(), "at $: `type_key` is missing"),
            (r#"{"type_key": "llvm"} x"#.into(), "not valid JSON: trailing characters"),
            (r#"{"type_key": "llvm""#.into(), "not valid JSON: EOF while parsing"),
            (r#"{"type_key": "webgpu", "data": "k.ptx"}"#.into(), "a `webgpu` module of this form needs `smap`"),
        ];
        let mut wrong = Vec::new();
        for (json, want) in cases {
            let r = read(&json, &[("k.ptx", b".version 7.0")]).1;
            let m = if r.is_err() { message(r) } else { "accepted".into() };
            if !(m.contains("tree.json") && m.contains(want)) {
                wrong.push(format!("{json}: {m}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A mistyped DSO kind is named as such, with the kinds there are and the likely one,
    /// instead of "unknown field `sources` for a payload module".
    #[test]
    fn a_mistyped_kind_gets_a_suggestion() {
        let files: &[(&str, &[u8])] = &[("host.c", b"int f(void) { return 1; }\n")];
        let m = message(read(r#"{"type_key": "LLVM", "sources": ["host.c"]}"#, files).1);
        assert!(
            m.contains("at $: unknown type_key `LLVM` for a module with `sources`: DSO kinds are llvm, c, static_library; did you mean `llvm`?"),
            "{m}"
        );
        let m = message(read(r#"{"type_key": "static_libary", "objects": ["host.c"]}"#, files).1);
        assert!(m.contains("did you mean `static_library`?"), "{m}");
        let m = message(read(r#"{"type_key": "cuda", "objects": ["host.c"]}"#, files).1);
        assert!(
            m.contains("`objects` belongs to DSO modules (llvm, c, static_library), and `cuda` is a payload kind"),
            "{m}"
        );
        assert!(!m.contains("did you mean"), "{m}");
        let m = message(read(r#"{"type_key": "Cuda"}"#, files).1);
        assert!(m.contains("`Cuda` is not a DSO kind") && m.contains("did you mean `cuda`?"), "{m}");
        // A kind far from every known one is a user's own kind: no guess.
        let m = message(read(r#"{"type_key": "example.Kernels"}"#, files).1);
        assert!(!m.contains("did you mean"), "{m}");
    }

    /// A missing file is named once, as the JSON wrote it and as it resolved, before any work.
    #[test]
    fn a_missing_file_is_named_once_with_the_users_path() {
        let (dir, r) = read(
            r#"{"type_key": "llvm", "objects": ["sub/../lib0.o"], "imports": [{"type_key": "x.K", "payload": "k.bin"}]}"#,
            &[("k.bin", b"K")],
        );
        let m = message(r);
        let resolved = dir.path().join("sub/../lib0.o").display().to_string();
        assert!(m.contains(&format!("at $.objects[0]: cannot read host object `sub/../lib0.o` ({resolved}): ")), "{m}");
        assert!(m.contains("No such file"), "{m}");
        assert_eq!(m.matches("lib0.o").count(), 2, "{m}");
        for (field, what) in [("sources", "C source"), ("ir", "LLVM IR file")] {
            let m = message(read(&format!(r#"{{"type_key": "c", "{field}": ["gone"]}}"#), &[]).1);
            assert!(m.contains(&format!("at $.{field}[0]: cannot read {what} `gone` (")), "{m}");
        }
    }

    /// What `inspect --json` prints for a kernel reads back as the same function info.
    #[test]
    fn function_tables_read_back_what_they_print() {
        let info = FunctionInfo {
            name: "k".into(),
            arg_types: vec![DataType::HANDLE, DataType::parse("float32x4").unwrap()],
            launch_param_tags: vec!["blockIdx.x".into()],
            arg_extra_tags: vec![1, 0],
        };
        let table = FunctionTable::of(&[("z".into(), info.clone()), ("a".into(), FunctionInfo::default())]);
        let text = serde_json::to_string(&table).unwrap();
        assert!(text.starts_with(r#"{"z":{"name":"k","arg_types":["handle","float32x4"],"launch_param_tags":["blockIdx.x"],"arg_extra_tags":[1,0]},"a":"#), "{text}");
        let back: FunctionTable = serde_json::from_str(&text).unwrap();
        assert_eq!(back, table);
        assert_eq!(back.0[0].1.to_info("cuda"), info);
        // Without extra tags: one 0 per argument, none for WebGPU.
        let bare: FunctionJson = serde_json::from_str(r#"{"arg_types": ["handle", "int32"]}"#).unwrap();
        assert_eq!(bare.to_info("cuda").arg_extra_tags, vec![0, 0]);
        assert!(bare.to_info("webgpu").arg_extra_tags.is_empty());
    }
}
