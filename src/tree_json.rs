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
//! are. A device module can also be made from its code and a function table, the shape that
//! `mblob inspect --json` prints:
//!
//! ```json
//! {"type_key": "cuda", "format": "ptx", "data": "kernels.ptx", "functions": {
//!     "vector_add": {"arg_types": ["handle", "handle", "handle", "int32"],
//!                    "launch_param_tags": ["blockIdx.x", "threadIdx.x"]}}}
//! ```
//!
//! DSO parts (`llvm`, `c`, `static_library`) list object files, C sources and LLVM IR files.
//! Paths are relative to the JSON file. A node may carry an `"id"`: nodes with the same id are
//! one module (imported twice).

use std::path::{Path, PathBuf};

use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::device::{DeviceModule, FunctionInfo, DEVICE_TYPE_KEYS};
use mblob_runtime::tree::DSO_TYPE_KEYS;
use mblob_runtime::{Bytes, Layout, ModuleId, ModuleTree, Opaque, Registry};
use serde_json::{Map, Value};

use crate::export::Export;
use crate::{Error, Result};

/// Reads `TREE.json` into an [`Export`] (tree and host files).
pub fn read_tree_json(path: &Path) -> Result<Export> {
    let text = std::fs::read(path).map_err(Error::io(path, "cannot read"))?;
    let root: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::Invalid { what: path.display().to_string(), detail: format!("not valid JSON: {e}") })?;
    let base = path.parent().unwrap_or(Path::new("."));
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
    Ok(export)
}

/// Fields of a DSO part.
const DSO_FIELDS: [&str; 6] = ["type_key", "id", "imports", "objects", "sources", "ir"];
/// Fields of a payload module: `payload`, or (device kinds) `format`, `data` and `functions`.
const PAYLOAD_FIELDS: [&str; 7] = ["type_key", "id", "imports", "payload", "format", "data", "functions"];
/// Fields of one function in `functions`.
const FUNCTION_FIELDS: [&str; 3] = ["name", "arg_types", "launch_param_tags"];

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
    fn bad(&self, at: &str, detail: impl Into<String>) -> Error {
        Error::Invalid { what: format!("{} at {at}", self.json.display()), detail: detail.into() }
    }

    fn node(&mut self, v: &Value, at: &str) -> Result<ModuleId> {
        let obj = v.as_object().ok_or_else(|| self.bad(at, "a module must be a JSON object"))?;
        let id = obj.get("id").map(|i| i.to_string());
        if let Some((_, m)) = id.as_ref().and_then(|id| self.ids.iter().find(|(i, _)| i == id)) {
            return Ok(*m);
        }
        let key = obj
            .get("type_key")
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad(at, "`type_key` is missing or not a string"))?;
        let dso = DSO_TYPE_KEYS.contains(&key);
        let allowed: &[&str] = if dso { &DSO_FIELDS } else { &PAYLOAD_FIELDS };
        self.known_fields(obj, allowed, at, if dso { " for a DSO module" } else { " for a payload module" })?;
        let m = if dso {
            let objects = self.paths(obj.get("objects"), &format!("{at}.objects"))?;
            let sources = self.paths(obj.get("sources"), &format!("{at}.sources"))?;
            let ir = self.paths(obj.get("ir"), &format!("{at}.ir"))?;
            self.files.objects.extend(objects);
            self.files.sources.extend(sources);
            self.files.ir.extend(ir);
            self.tree.add_dso(key)
        } else if obj.contains_key("payload") {
            for field in ["format", "data", "functions"] {
                if obj.contains_key(field) {
                    return Err(self.bad(at, format!("`{field}` and `payload` exclude each other")));
                }
            }
            self.payload_file(key, obj, at)?
        } else if obj.contains_key("data") {
            self.device_module(key, obj, at)?
        } else {
            return Err(self.bad(
                at,
                format!(
                    "`{key}` is not a DSO part ({}), so it needs a `payload` file (or, for a device kind, `data`)",
                    DSO_TYPE_KEYS.join(", ")
                ),
            ));
        };
        if let Some(id) = id {
            self.ids.push((id, m));
        }
        if let Some(imports) = obj.get("imports") {
            let list = imports.as_array().ok_or_else(|| self.bad(at, "`imports` must be an array"))?;
            for (i, child) in list.iter().enumerate() {
                let c = self.node(child, &format!("{at}.imports[{i}]"))?;
                self.tree.import(m, c);
            }
        }
        Ok(m)
    }

    /// Reads the file a field names (mapped, not copied).
    fn file(&self, obj: &Map<String, Value>, field: &str, at: &str) -> Result<Bytes> {
        let at = format!("{at}.{field}");
        let name = obj.get(field).and_then(Value::as_str).ok_or_else(|| self.bad(&at, "must be a path string"))?;
        mblob_runtime::map_file(&self.base.join(name)).map_err(|e| self.bad(&at, format!("cannot read {name}: {e}")))
    }

    /// A payload file in classic bytes: decoded when the kind is known, else kept opaque.
    fn payload_file(&mut self, key: &str, obj: &Map<String, Value>, at: &str) -> Result<ModuleId> {
        let bytes = self.file(obj, "payload", at)?;
        let Some(loader) = self.registry.get(key) else {
            return Ok(self.tree.add_payload(Opaque::new(key, bytes)));
        };
        let module = loader.load(bytes, Layout::Classic).map_err(|e| {
            self.bad(&format!("{at}.payload"), format!("not a `{key}` payload as a classic blob holds it: {e}"))
        })?;
        self.tree
            .add_loaded(module)
            .map_err(|k| self.bad(&format!("{at}.payload"), format!("a `{k}` module cannot be saved again")))
    }

    /// A device module from its code (`data`), `format` and `functions`.
    fn device_module(&mut self, key: &str, obj: &Map<String, Value>, at: &str) -> Result<ModuleId> {
        if !DEVICE_TYPE_KEYS.contains(&key) {
            return Err(self.bad(
                at,
                format!("`data` makes a device module, and `{key}` is none of {}", DEVICE_TYPE_KEYS.join(", ")),
            ));
        }
        let format = obj
            .get("format")
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad(at, "a device module needs `format` (`ptx`, `cubin`, `fatbin`, `cl`, ...)"))?;
        let data = self.file(obj, "data", at)?;
        let functions = match obj.get("functions") {
            None => Vec::new(),
            Some(v) => {
                let at = format!("{at}.functions");
                let map = v.as_object().ok_or_else(|| self.bad(&at, "must be an object of kernel name to info"))?;
                map.iter()
                    .map(|(name, info)| self.function(name, info, &format!("{at}.{name}")))
                    .collect::<Result<_>>()?
            }
        };
        Ok(self.tree.add_payload(DeviceModule::new(key, format, functions, data)))
    }

    /// One kernel's info: `arg_types` (TVM's spelling), `launch_param_tags` and an optional
    /// `name` (empty by default, as TVM up to 0.21 writes it).
    fn function(&self, key: &str, v: &Value, at: &str) -> Result<(String, FunctionInfo)> {
        let obj = v.as_object().ok_or_else(|| self.bad(at, "must be an object"))?;
        self.known_fields(obj, &FUNCTION_FIELDS, at, "")?;
        let strings = |field: &str| self.strings(obj.get(field), &format!("{at}.{field}"), ("strings", "a string"));
        let arg_types = strings("arg_types")?
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                DataType::parse(t).ok_or_else(|| {
                    self.bad(
                        &format!("{at}.arg_types[{i}]"),
                        format!("`{t}` is not a TVM type (float32, int8, handle...)"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let tags = strings("launch_param_tags")?.into_iter().map(str::to_owned).collect();
        let name = match obj.get("name") {
            None => "",
            Some(n) => n.as_str().ok_or_else(|| self.bad(&format!("{at}.name"), "must be a string"))?,
        };
        let info = FunctionInfo::new(name, arg_types, tags);
        info.launch_params().map_err(|e| self.bad(&format!("{at}.launch_param_tags"), e.to_string()))?;
        Ok((key.to_owned(), info))
    }

    /// Refuses a field of `obj` that is not in `allowed` (`of` says what kind of object).
    fn known_fields(&self, obj: &Map<String, Value>, allowed: &[&str], at: &str, of: &str) -> Result<()> {
        match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(unknown) => {
                Err(self.bad(at, format!("unknown field `{unknown}`{of} (fields: {})", allowed.join(", "))))
            }
            None => Ok(()),
        }
    }

    /// An optional array of strings; `names` words the errors (`("paths", "a path string")`).
    fn strings<'v>(&self, v: Option<&'v Value>, at: &str, names: (&str, &str)) -> Result<Vec<&'v str>> {
        let Some(v) = v else { return Ok(Vec::new()) };
        let list = v.as_array().ok_or_else(|| self.bad(at, format!("must be an array of {}", names.0)))?;
        list.iter()
            .enumerate()
            .map(|(i, s)| s.as_str().ok_or_else(|| self.bad(&format!("{at}[{i}]"), format!("must be {}", names.1))))
            .collect()
    }

    fn paths(&self, v: Option<&Value>, at: &str) -> Result<Vec<PathBuf>> {
        Ok(self.strings(v, at, ("paths", "a path string"))?.into_iter().map(|p| self.base.join(p)).collect())
    }
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
        let (_dir, e) = read(json, &[("f.bin", b"F"), ("k.bin", b"K")]);
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
        let cases = [
            (r#"{"type_key": "llvm", "payload": "x.bin"}"#, "at $: unknown field `payload` for a DSO module"),
            (r#"{"type_key": "llvm", "import": []}"#, "at $: unknown field `import`"),
            (r#"{"type_key": "llvm", "imports": [{"type_key": "cuda"}]}"#, "at $.imports[0]: `cuda` is not a DSO part"),
            (
                r#"{"type_key": "llvm", "imports": [{"type_key": "cuda", "payload": "nope.bin"}]}"#,
                "at $.imports[0].payload: cannot read nope.bin",
            ),
            (r#"{"type_key": "cuda", "payload": "k.ptx", "data": "k.ptx"}"#, "at $: `data` and `payload` exclude"),
            (r#"{"type_key": "cuda", "payload": "k.ptx"}"#, "at $.payload: not a `cuda` payload as a classic blob"),
            (r#"{"type_key": "Factory", "format": "ptx", "data": "k.ptx"}"#, "at $: `data` makes a device module"),
            (r#"{"type_key": "cuda", "data": "k.ptx"}"#, "at $: a device module needs `format`"),
            (r#"{"type_key": "cuda", "format": "ptx", "data": 1}"#, "at $.data: must be a path string"),
            (
                r#"{"type_key": "cuda", "format": "ptx", "data": "k.ptx", "functions": {"f": {"arg_types": ["f32"]}}}"#,
                "at $.functions.f.arg_types[0]: `f32` is not a TVM type",
            ),
            (
                r#"{"type_key": "cuda", "format": "ptx", "data": "k.ptx", "functions": {"f": {"tags": []}}}"#,
                "at $.functions.f: unknown field `tags`",
            ),
            (
                r#"{"type_key": "cuda", "format": "ptx", "data": "k.ptx", "functions": {"f": {"launch_param_tags": ["warp.x"]}}}"#,
                "at $.functions.f.launch_param_tags",
            ),
            (r#"{"type_key": "llvm", "objects": ["a.o", 3]}"#, "at $.objects[1]: must be a path string"),
            (r#"{"type_key": "llvm", "imports": {}}"#, "at $: `imports` must be an array"),
            (r#"[]"#, "at $: a module must be a JSON object"),
            (r#"{"type_key": 5}"#, "at $: `type_key` is missing"),
        ];
        for (json, want) in cases {
            let r = read(json, &[("k.ptx", b".version 7.0")]).1;
            assert!(r.is_err(), "{json}: accepted");
            let m = message(r);
            assert!(m.contains("tree.json") && m.contains(want), "{json}: {m}");
        }
    }
}
