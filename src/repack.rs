//! Reading the module tree of a packed library or a raw blob back into a [`ModuleTree`], to
//! pack it again (`mblob pack`, Python's `mblob.pack`): with new host objects, in any layout.

use std::path::Path;

use std::collections::HashMap;
use std::sync::Arc;

use mblob_runtime::payload::graph::{GraphExecutorFactory, Tensor};
use mblob_runtime::{elf, load_blob, Bytes, Layout, LoadOptions, ModuleKind, ModuleTree, Registry};

use crate::{Error, Result};

/// The blob of a `.so` (found by its symbol) or of a raw `.blob` file (of `layout`, detected
/// when `None`), with its layout.
///
/// # Errors
/// The file cannot be read, an ELF file without a blob symbol, or a raw blob that parses in
/// no layout.
pub fn read_blob(path: &Path, layout: Option<Layout>) -> Result<(Bytes, Layout)> {
    read_source(path, layout).map(|(b, l, _)| (b, l))
}

/// How a source library was packed besides its layout: its `c_symbol_prefix` and whether it
/// registers with TVM's system library (both empty for a raw blob).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePacking {
    /// The prefix in front of the blob symbol.
    pub prefix: String,
    /// Whether it registers the blob at start-up.
    pub system_lib: bool,
}

/// [`read_blob`], and the source's prefix and system-lib mode.
///
/// # Errors
/// As [`read_blob`].
pub fn read_source(path: &Path, layout: Option<Layout>) -> Result<(Bytes, Layout, SourcePacking)> {
    let data = mblob_runtime::map_file(path)?;
    if mblob_runtime::container::identify(&data).is_some() {
        let found = mblob_runtime::container::find_blob(&data, None)
            .map_err(|source| mblob_runtime::Error::Container { path: path.to_owned(), source })?
            .ok_or_else(|| Error::Input {
                what: path.display().to_string(),
                detail: "has no blob symbol: a plain library has no module tree to pack".into(),
            })?;
        let packing = SourcePacking { prefix: found.prefix.clone(), system_lib: found.system_lib };
        Ok((found.bytes, found.layout, packing))
    } else {
        let layout = match layout {
            Some(l) => l,
            None => Layout::detect(&data, &Registry::default())
                .map_err(|source| mblob_runtime::Error::Detect { path: path.to_owned(), source })?,
        };
        Ok((data, layout, SourcePacking::default()))
    }
}

/// The module tree of a `.so` or raw `.blob` (see [`read_blob`]), read without running
/// anything; payload kinds mblob does not know are kept as opaque bytes. The blob's `_lib`
/// becomes an `llvm` host module, which the new export's host objects stand for.
///
/// # Errors
/// As [`read_blob`], and a blob whose payloads or tree cannot be read.
pub fn read_module_tree(path: &Path, layout: Option<Layout>) -> Result<ModuleTree> {
    let (blob, layout) = read_blob(path, layout)?;
    module_tree_of(&blob, layout, path)
}

/// The module tree of `blob` (header included) in `layout`, as [`read_module_tree`] reads it;
/// `path` names the blob's file in errors.
///
/// # Errors
/// A blob whose payloads or tree cannot be read.
pub fn module_tree_of(blob: &Bytes, layout: Layout, path: &Path) -> Result<ModuleTree> {
    let registry = Registry::default();
    let loaded = load_blob(blob, layout, &registry, &LoadOptions::keep_unknown()).map_err(|e| match e {
        mblob_runtime::Error::Blob { source, .. } => {
            mblob_runtime::Error::Blob { path: path.to_owned(), source }.into()
        }
        other => Error::from(other),
    })?;
    ModuleTree::from_loaded(&loaded, "llvm")
        .map_err(|e| Error::Input { what: path.display().to_string(), detail: e.to_string().into() })
}

/// What a blob object (a `devc.o`, TVM's or mblob's) says about how it was packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobObject {
    /// The blob symbol's full name.
    pub symbol: String,
    /// The layout its name stands for.
    pub layout: Layout,
    /// The `c_symbol_prefix` in front of the blob name.
    pub prefix: String,
    /// Whether it registers the blob with TVM's system library at start-up (it calls the
    /// layout's registration function, `TVMBackendRegisterSystemLibSymbol` or
    /// `TVMFFIEnvModRegisterSystemLibSymbol`).
    pub system_lib: bool,
}

/// The blob symbol of a relocatable ELF object, `None` for any other file (a shared library,
/// a source file, an object without a blob symbol). Used to tell, among the files TVM's
/// `export_library` hands its `fcompile`, the blob object from the host code.
///
/// # Errors
/// The file cannot be read, or it is a relocatable ELF object whose blob symbol is malformed.
pub fn blob_object(path: &Path) -> Result<Option<BlobObject>> {
    use object::{Object, ObjectKind, ObjectSymbol};
    let data = mblob_runtime::map_file(path)?;
    if !data.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let file = match object::File::parse(&*data) {
        Ok(f) if f.kind() == ObjectKind::Relocatable => f,
        _ => return Ok(None),
    };
    let Some(found) =
        elf::find_blob(&data, None).map_err(|detail| mblob_runtime::Error::Elf { path: path.to_owned(), detail })?
    else {
        return Ok(None);
    };
    let register = crate::pack::PackOptions { layout: found.layout, ..Default::default() }.register_function();
    let system_lib = file.symbols().any(|s| s.is_undefined() && s.name() == Ok(register));
    Ok(Some(BlobObject { symbol: found.symbol, layout: found.layout, prefix: found.prefix, system_lib }))
}

/// `template` with the parameters of its graph executor factories replaced by `params`, by
/// name, in the template's order (the order TVM's factory writes them in); everything else
/// (the graph, the module name, the other modules and the imports) is kept.
///
/// This is how Python's `mblob.tvm.export_library` serializes a TVM graph model without
/// having TVM serialize its parameters: TVM serializes a copy of the factory whose parameters
/// are empty (which gives the order), and the real tensors come from the model's arrays.
///
/// # Errors
/// [`Error::Input`] when the template has no graph executor factory, or when the names of
/// `params` are not exactly those of the factory's parameters.
pub fn with_graph_params(template: &ModuleTree, mut params: HashMap<String, Tensor>) -> Result<ModuleTree> {
    let invalid = |detail: String| Error::Input { what: "the graph parameters".into(), detail: detail.into() };
    let mut tree = ModuleTree::new();
    let mut factories = 0;
    for id in template.ids() {
        let kind = template.kind(id).ok_or_else(|| invalid(format!("module {} missing from the template", id.0)))?;
        let factory = match kind {
            ModuleKind::Payload(p) => p.as_any().downcast_ref::<GraphExecutorFactory>(),
            ModuleKind::Dso { .. } => None,
        };
        let new_id = match factory {
            Some(f) => {
                factories += 1;
                let mut replaced = Vec::with_capacity(f.params.len());
                for (name, _) in &f.params {
                    let tensor = params
                        .remove(name)
                        .ok_or_else(|| invalid(format!("no array for the model's parameter `{name}`")))?;
                    replaced.push((name.clone(), tensor));
                }
                let g = GraphExecutorFactory { params: replaced, ..f.clone() };
                tree.add_payload_arc(Arc::new(g))
            }
            None => tree.add(kind.clone()),
        };
        debug_assert_eq!(new_id, id, "the ids are the template's");
    }
    if factories == 0 {
        return Err(invalid("the template holds no graph executor factory".into()));
    }
    if let Some(extra) = params.keys().min() {
        return Err(invalid(format!("`{extra}` is not a parameter of the model ({} more unused)", params.len() - 1)));
    }
    for id in template.ids() {
        for &child in template.imports(id).unwrap_or_default() {
            tree.import(id, child);
        }
    }
    if let Some(root) = template.root() {
        tree.set_root(root);
    }
    Ok(tree)
}
