//! Loading: from a packed `.so` (dlopen) or from a blob in memory, into a [`LoadedTree`].

use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::format::{self, EntryKind, Layout, ParsedBlob, UnknownKeys};
use crate::library::{self, LibraryModule};
use crate::module::{LoadedModule, LoadedTree, Module, Origin};
use crate::payload::Opaque;
use crate::registry::Registry;
use crate::Bytes;

/// Options of a load.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// What to do with type keys that have no loader: fail (the default), or keep their
    /// payloads as [`Opaque`] modules.
    pub unknown: UnknownKeys,
    /// Only consider blob symbols with this `c_symbol_prefix` (default: prefer none).
    pub prefix: Option<String>,
}

impl LoadOptions {
    /// Options that keep unknown kinds as opaque bytes (for tools that inspect or re-pack).
    pub fn keep_unknown() -> LoadOptions {
        LoadOptions { unknown: UnknownKeys::KeepOpaque, ..LoadOptions::default() }
    }
}

/// Reads a file into memory-mapped bytes.
pub fn map_file(path: &Path) -> Result<Bytes> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        action: "cannot open",
        source,
    })?;
    // SAFETY-free alternative: an empty file cannot be mapped, so read it instead.
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Ok(Bytes::from_vec(Vec::new()));
    }
    let map =
        map_readonly(&file).map_err(|source| Error::Io { path: path.to_owned(), action: "cannot map", source })?;
    Ok(Bytes::from_owner(Arc::new(map)))
}

#[allow(unsafe_code)]
fn map_readonly(file: &std::fs::File) -> std::io::Result<Mmap> {
    // SAFETY: a private read-only mapping. If another process truncates the file while it is
    // mapped, reads may fault (SIGBUS); mblob only maps files it was asked to read, as every
    // ELF tool does, and never writes through the mapping.
    unsafe { Mmap::map(file) }
}

/// Loads a blob held in memory (8-byte header included). The `_lib` entry becomes a
/// [`LibraryModule::detached`] with no symbols. Payloads borrow from `blob`.
pub fn load_blob(blob: &Bytes, layout: Layout, registry: &Registry, options: &LoadOptions) -> Result<LoadedTree> {
    let library: Arc<dyn Module> = Arc::new(LibraryModule::detached());
    load_with_library(blob, layout, registry, options, library, Path::new("<memory>"), None)
}

/// Opens a packed shared library and loads its module tree.
///
/// The blob symbol is found in the file's symbol table first (any layout, see
/// [`Layout::from_symbol`]); a library without one loads as a single library module, as TVM
/// does. The `_lib` entry becomes the library module, every other entry goes to the loader
/// registered for its type key. Payloads are not copied: they borrow the library's mapping.
///
/// # Safety
///
/// Opening a library runs its initialisers, and the last drop of the tree runs its
/// finalisers: as safe as calling an unknown foreign function. Only load files you trust.
#[allow(unsafe_code)]
pub unsafe fn load_library(path: &Path, registry: &Registry, options: &LoadOptions) -> Result<LoadedTree> {
    let _span = tracing::info_span!("load", path = %path.display()).entered();
    let (found, pre) = {
        let file = map_file(path)?;
        let found = crate::elf::find_blob(&file, options.prefix.as_deref())
            .map_err(|detail| Error::Elf { path: path.to_owned(), detail })?;
        (found, crate::ffi::shim::preflight(&file, path)?)
    };
    // SAFETY: the caller accepts that the library's initialisers run.
    let lib = unsafe { library::open(path) }?;
    let ctx = crate::ffi::context::LibraryContext::new(path.to_owned(), pre.abi);
    crate::ffi::context::install(&lib, &ctx);
    let library_module = Arc::new(LibraryModule::new(lib.clone(), path.to_owned(), ctx, pre.main_entry));
    let Some(found) = found else {
        tracing::debug!("no blob symbol: a single library module");
        return Ok(LoadedTree {
            modules: vec![LoadedModule { module: library_module, imports: vec![] }],
            origin: Origin::default(),
        });
    };
    tracing::debug!(symbol = %found.symbol, layout = found.layout.name(), size = found.size, "blob found");
    let blob = library::symbol_bytes(&lib, path, &found.symbol, found.size)?;
    let tree = load_with_library(&blob, found.layout, registry, options, library_module, path, Some(found.symbol))?;
    crate::ffi::context::link_imports(&tree);
    Ok(tree)
}

fn load_with_library(
    blob: &Bytes,
    layout: Layout,
    registry: &Registry,
    options: &LoadOptions,
    library: Arc<dyn Module>,
    path: &Path,
    symbol: Option<String>,
) -> Result<LoadedTree> {
    let parsed = format::parse_blob(blob, layout, registry, options.unknown)
        .map_err(|source| Error::Blob { path: path.to_owned(), source })?;
    let mut tree = build(&parsed, blob, registry, options, library)?;
    tree.origin.symbol = symbol;
    Ok(tree)
}

/// Builds the loaded tree from a parsed blob: runs each entry's loader and links the imports.
fn build(
    parsed: &ParsedBlob<'_>,
    blob: &Bytes,
    registry: &Registry,
    options: &LoadOptions,
    library: Arc<dyn Module>,
) -> Result<LoadedTree> {
    let mut modules: Vec<LoadedModule> = Vec::new();
    for (index, entry) in parsed.modules().enumerate() {
        let module: Arc<dyn Module> = match entry.kind {
            EntryKind::Lib => library.clone(),
            _ => {
                let _span = tracing::debug_span!("load_module", type_key = entry.type_key, index).entered();
                let payload = blob.slice_ref(entry.payload).unwrap_or_else(|| Bytes::from_vec(entry.payload.to_vec()));
                match registry.get(entry.type_key) {
                    Some(loader) => loader.load(payload, parsed.layout).map_err(|source| Error::Loader {
                        index,
                        key: entry.type_key.to_owned(),
                        source,
                    })?,
                    None if options.unknown == UnknownKeys::KeepOpaque => {
                        Arc::new(Opaque::new(entry.type_key, payload))
                    }
                    None => {
                        return Err(Error::NoLoader {
                            index,
                            key: entry.type_key.to_owned(),
                            registered: registry.keys(),
                        })
                    }
                }
            }
        };
        modules.push(LoadedModule { module, imports: Vec::new() });
    }
    let legacy = parsed.import_tree.is_none();
    match &parsed.import_tree {
        Some(tree) => {
            for (i, m) in modules.iter_mut().enumerate() {
                m.imports = tree.children(i).iter().map(|&c| c as usize).collect();
            }
        }
        None => {
            // Legacy blob: a fresh library root imports every module in blob order.
            let imports = (1..=modules.len()).collect();
            modules.insert(0, LoadedModule { module: library.clone(), imports });
        }
    }
    if modules.is_empty() {
        modules.push(LoadedModule { module: library, imports: vec![] });
    }
    Ok(LoadedTree { modules, origin: Origin { symbol: None, layout: Some(parsed.layout), legacy } })
}
