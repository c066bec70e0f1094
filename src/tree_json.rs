//! `TREE.json`, the description of a module tree that `mblob export` reads.
//!
//! ```json
//! {"type_key": "GraphExecutorFactory", "payload": "factory.bin", "imports": [
//!     {"type_key": "llvm", "objects": ["lib0.o"], "sources": ["extra.c"], "ir": ["kernels.ll"],
//!      "imports": [{"type_key": "cuda", "payload": "kernels.cuda.bin"}]}]}
//! ```
//! Payload modules name a file with the payload as it appears in a classic blob (TVM's
//! `SaveToBinary` bytes); DSO parts (`llvm`, `c`, `static_library`) list object files, C
//! sources and LLVM IR files. Paths are relative to the JSON file. A node may carry an `"id"`:
//! nodes with the same id are one module (imported twice).

use std::path::{Path, PathBuf};

use mblob_runtime::tree::DSO_TYPE_KEYS;
use mblob_runtime::{Bytes, ModuleId, ModuleTree, Opaque};
use serde_json::Value;

use crate::export::Export;
use crate::{Error, Result};

/// Reads `TREE.json` into an [`Export`] (tree and host files).
pub fn read_tree_json(path: &Path) -> Result<Export> {
    let text = std::fs::read(path).map_err(Error::io(path, "cannot read"))?;
    let root: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::Invalid { what: path.display().to_string(), detail: format!("not valid JSON: {e}") })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut b = Builder { json: path, base, tree: ModuleTree::new(), ids: Vec::new(), files: Files::default() };
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
/// Fields of a payload module.
const PAYLOAD_FIELDS: [&str; 4] = ["type_key", "id", "imports", "payload"];

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
        if let Some(unknown) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(self.bad(
                at,
                format!(
                    "unknown field `{unknown}` for a {} module (fields: {})",
                    if dso { "DSO" } else { "payload" },
                    allowed.join(", ")
                ),
            ));
        }
        let m = if dso {
            let objects = self.paths(obj.get("objects"), &format!("{at}.objects"))?;
            let sources = self.paths(obj.get("sources"), &format!("{at}.sources"))?;
            let ir = self.paths(obj.get("ir"), &format!("{at}.ir"))?;
            self.files.objects.extend(objects);
            self.files.sources.extend(sources);
            self.files.ir.extend(ir);
            self.tree.add_dso(key)
        } else {
            let file = obj.get("payload").and_then(Value::as_str).ok_or_else(|| {
                self.bad(
                    at,
                    format!("`{key}` is not a DSO part ({}), so it needs a `payload` file", DSO_TYPE_KEYS.join(", ")),
                )
            })?;
            let path = self.base.join(file);
            let bytes = mblob_runtime::map_file(&path)
                .map_err(|e| self.bad(&format!("{at}.payload"), format!("cannot read the payload file: {e}")))?;
            self.tree.add_payload(Opaque::new(key, Bytes::clone(&bytes)))
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

    fn paths(&self, v: Option<&Value>, at: &str) -> Result<Vec<PathBuf>> {
        let Some(v) = v else { return Ok(Vec::new()) };
        let list = v.as_array().ok_or_else(|| self.bad(at, "must be an array of paths"))?;
        list.iter()
            .enumerate()
            .map(|(i, p)| {
                p.as_str()
                    .map(|p| self.base.join(p))
                    .ok_or_else(|| self.bad(&format!("{at}[{i}]"), "must be a path string"))
            })
            .collect()
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
            {"type_key": "llvm", "objects": ["a.o"], "imports": [{"id": 7, "type_key": "cuda", "payload": "k.bin"}]},
            {"id": 7}]}"#;
        let (_dir, e) = read(json, &[("f.bin", b"F"), ("k.bin", b"K")]);
        let mut e = e.unwrap();
        let tree = e.tree_mut();
        assert_eq!(tree.len(), 3);
        let root = tree.root().unwrap();
        assert_eq!(tree.kind(root).type_key(), "Factory");
        let imports = tree.imports(root).to_vec();
        assert_eq!(tree.imports(imports[0]), &[imports[1]]);
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
                "at $.imports[0].payload: cannot read the payload file",
            ),
            (r#"{"type_key": "llvm", "objects": ["a.o", 3]}"#, "at $.objects[1]: must be a path string"),
            (r#"{"type_key": "llvm", "imports": {}}"#, "at $: `imports` must be an array"),
            (r#"[]"#, "at $: a module must be a JSON object"),
            (r#"{"type_key": 5}"#, "at $: `type_key` is missing"),
        ];
        for (json, want) in cases {
            let m = message(read(json, &[]).1);
            assert!(m.contains("tree.json") && m.contains(want), "{json}: {m}");
        }
    }
}
