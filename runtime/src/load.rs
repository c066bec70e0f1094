//! Loading: from a packed `.so` (dlopen) or from a blob in memory, into a [`LoadedTree`].
//!
//! The blob is parsed once: in the classic layouts, where payloads carry no length, each
//! payload is decoded by its loader while the parser walks the blob ([`Loader::read`]) and the
//! module is kept; in the tvm-ffi layout each framed payload is decoded once after the parse.
//! Payloads are views of the blob ([`Bytes`] sub-ranges taken by offset), never copies.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::bytes::Bytes;
use crate::error::{Error, Result};
use crate::ffi::library::{self, LibraryModule};
use crate::format::{self, EntryKind, FormatError, FormatErrorKind, Layout, Measure, ParsedBlob, PayloadSizer};
use crate::format::{UnknownKeys, SYMBOL_CLASSIC, SYMBOL_CLASSIC_021, SYMBOL_FFI};
use crate::module::{LoadedModule, LoadedTree, Module, Origin};
use crate::payload::RawPayload;
use crate::registry::{Decoded, LoaderError, Registry};

/// Options of a load.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// What to do with type keys that have no loader: fail (the default), or keep their
    /// payloads as [`RawPayload`] modules.
    pub unknown: UnknownKeys,
    /// Only consider blob symbols with this `c_symbol_prefix` (default: prefer none).
    pub prefix: Option<String>,
}

impl LoadOptions {
    /// Options that keep unknown kinds as raw bytes (for tools that inspect or re-pack).
    pub fn keep_unknown() -> LoadOptions {
        LoadOptions { unknown: UnknownKeys::KeepRaw, ..LoadOptions::default() }
    }
}

/// Reads a file into memory-mapped bytes (a read-only map: [`Bytes::release`] gives
/// back the pages of a part once it was copied).
pub fn map_file(path: &Path) -> Result<Bytes> {
    let io = |action: &'static str| move |source| Error::Io { path: path.to_owned(), action, source };
    let file = std::fs::File::open(path).map_err(io("cannot open"))?;
    let meta = file.metadata().map_err(io("cannot read the size of"))?;
    // A directory opens (read-only) but cannot be mapped: say what it is, not `mmap`'s ENODEV.
    if meta.is_dir() {
        return Err(io("cannot read")(std::io::Error::from(std::io::ErrorKind::IsADirectory)));
    }
    let len = meta.len();
    // An empty file cannot be mapped.
    if len == 0 {
        return Ok(Bytes::from_vec(Vec::new()));
    }
    let map = map_readonly(&file).map_err(io("cannot map"))?;
    // A read-only map of the file: its pages may be given back once copied.
    Ok(Bytes::from_mapping(Arc::new(map), library::release_file_pages))
}

#[allow(unsafe_code)]
fn map_readonly(file: &std::fs::File) -> std::io::Result<Mmap> {
    // SAFETY: a private read-only mapping. If another process truncates the file while it is
    // mapped, reads may fault (SIGBUS); mblob only maps files it was asked to read, as every
    // ELF tool does, and never writes through the mapping.
    unsafe { Mmap::map(file) }
}

/// Loads a blob held in memory (8-byte header included). The `_lib` entry becomes a
/// [`LibraryModule`] with no symbols (its path `<memory>`). Payloads borrow from `blob`.
pub fn load_blob(blob: &Bytes, layout: Layout, registry: &Registry, options: &LoadOptions) -> Result<LoadedTree> {
    let library: Arc<dyn Module> = Arc::new(LibraryModule::detached());
    load_with_library(blob, layout, registry, options, library, Path::new("<memory>"), None)
}

/// Opens a packed shared library and loads its module tree.
///
/// `path` is a path, never a name to search for: a bare file name (`deploy.so`) is the file in
/// the current directory. The file is first read (not run) to check it is an ELF file and to
/// learn the blob symbol's name; the blob itself (address and size) is then taken from the
/// image `dlopen` returned, which is the image already loaded if the path was loaded before
/// and is still in use. A library without a blob symbol (any layout, see
/// [`Layout::from_symbol`]) loads as a single library module, as TVM does. The `_lib` entry
/// becomes the library module, every other entry goes to the loader registered for its type
/// key. Payloads are not copied: they borrow the loaded image.
///
/// # Safety
///
/// Opening a library runs its initialisers, and the last drop of the tree runs its
/// finalisers: as safe as calling an unknown foreign function. Only load files you trust.
#[allow(unsafe_code)]
pub unsafe fn load_library(path: &Path, registry: &Registry, options: &LoadOptions) -> Result<LoadedTree> {
    let _span = tracing::info_span!("load", path = %path.display()).entered();
    // SAFETY: the caller accepts that the library's initialisers run.
    unsafe { load_opened(path, None, registry, options) }
}

/// Loads a packed shared library held in memory (`data`, the bytes of the `.so` file), as
/// [`load_library`] loads one from a file, with no file written: the bytes go to an anonymous
/// memory file (`memfd_create`) that `dlopen` (or the private namespace's `dlmopen`) opens
/// through `/proc/self/fd`, kept open while the library is loaded. `name` names the memory
/// file (it shows in `/proc/self/maps`); the loaded tree's paths are the `/proc/self/fd/..`
/// path. Bytes that are not an ELF file fail as a file would ([`Error::Elf`]).
///
/// # Safety
///
/// As [`load_library`]: loading runs the library's initialisers. Only load bytes you trust.
#[allow(unsafe_code)]
pub unsafe fn load_library_bytes(
    data: &[u8],
    name: &str,
    registry: &Registry,
    options: &LoadOptions,
) -> Result<LoadedTree> {
    let _span = tracing::info_span!("load_memory", name, bytes = data.len()).entered();
    let (fd, path) = library::memory_file(data, name).map_err(|source| Error::Io {
        path: format!("<memory: {name}>").into(),
        action: "cannot make a memory file (memfd_create) for",
        source,
    })?;
    // SAFETY: the caller accepts that the library's initialisers run.
    unsafe { load_opened(&path, Some(fd), registry, options) }
}

/// Loads the model linked into this program under `prefix` (a TVM `system-lib` build, whose
/// start-up code registered its symbols; see [`crate::ffi::system_lib`]), as
/// [`load_library`] loads a file: the same tree, with the library module's functions found in
/// the registry (`PREFIX + name` first, as TVM's `runtime.SystemLib(prefix)` does). Nothing is
/// opened and no code runs. `system://PREFIX` in the tree's paths names it.
///
/// Refused, with a typed error ([`Error::SystemLib`]), when nothing registered itself under
/// `prefix` (naming the prefixes that did), or when a name of it was registered twice at two
/// addresses.
#[cfg(feature = "system-lib")]
pub fn load_system_lib(prefix: &str, registry: &Registry, options: &LoadOptions) -> Result<LoadedTree> {
    let _span = tracing::info_span!("load_system_lib", prefix).entered();
    let (image, abi, found) = library::open_system(prefix)?;
    crate::ffi::context::install(image.context(), |name| image.address(name));
    let path = std::path::PathBuf::from(format!("system://{prefix}"));
    let library_module = Arc::new(LibraryModule::new(image, path.clone(), abi, None));
    tree_of_image(library_module, found, registry, options, &path)
}

/// [`load_library`] of `path`; `memfd` is the memory file `path` opens, kept with the image.
///
/// # Safety
///
/// As [`load_library`].
#[allow(unsafe_code)]
unsafe fn load_opened(
    path: &Path,
    memfd: Option<std::os::fd::OwnedFd>,
    registry: &Registry,
    options: &LoadOptions,
) -> Result<LoadedTree> {
    let (on_disk, pre) = {
        let file = map_file(path)?;
        if let Some(identity) = crate::container::identify_header(&file).filter(|i| !i.runs_here()) {
            return Err(Error::ForeignLibrary { path: path.to_owned(), identity });
        }
        let found = crate::elf::find_blob(&file, options.prefix.as_deref())
            .map_err(|detail| Error::Elf { path: path.to_owned(), detail })?;
        // (run) the runtime functions it imports by name, its ABI, its `__tvm_main__`.
        (found, crate::ffi::shim::preflight(&file, path)?)
    };
    // SAFETY: the caller accepts that the library's initialisers run.
    let image = unsafe { library::open(path, pre.private, memfd) }?;
    crate::ffi::context::install(image.context(), |name| image.address(name));
    // The names to look for in the image: the one the file names first, then every layout's
    // symbol with the requested prefix (or none).
    let prefix = options.prefix.as_deref().unwrap_or("");
    let mut names: Vec<String> = on_disk.iter().map(|f| f.symbol.clone()).collect();
    for symbol in [SYMBOL_CLASSIC, SYMBOL_CLASSIC_021, SYMBOL_FFI] {
        let name = format!("{prefix}{symbol}");
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let found = library::image_blob(&image, path, &names)?;
    let library_module = Arc::new(LibraryModule::new(image, path.to_owned(), pre.abi, pre.main_entry));
    tree_of_image(library_module, found, registry, options, path)
}

/// The tree of a library module whose image holds `found` (its blob; without one, the library
/// module alone, as TVM loads it), with each library's imports recorded for its code.
fn tree_of_image(
    library_module: Arc<LibraryModule>,
    found: Option<crate::ffi::library::FoundBlob>,
    registry: &Registry,
    options: &LoadOptions,
    path: &Path,
) -> Result<LoadedTree> {
    let Some((symbol, layout, blob)) = found else {
        tracing::debug!("no blob symbol: a single library module");
        return Ok(LoadedTree {
            modules: vec![LoadedModule { module: library_module, imports: vec![] }],
            origin: Origin::default(),
        });
    };
    tracing::debug!(%symbol, layout = layout.name(), size = blob.len(), "blob found in the loaded image");
    let tree = load_with_library(&blob, layout, registry, options, library_module, path, Some(symbol))?;
    crate::ffi::library::link_imports(&tree);
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
    let reader = DecodingReader { registry, blob, decoded: RefCell::new(HashMap::new()) };
    let parsed = format::parse_blob(blob, layout, &reader, options.unknown)
        .map_err(|source| Error::Blob { path: path.to_owned(), source })?;
    let mut tree = build(&parsed, blob, &reader, options, library)?;
    tree.origin.symbol = symbol;
    Ok(tree)
}

/// The classic reader's [`PayloadSizer`] during a load: measuring a payload decodes it with
/// its loader, and the module is kept for [`build`] (keyed by the payload's offset and type
/// key; an entry the parser tried and dropped while searching for the end of an unmeasured
/// payload is simply not used).
struct DecodingReader<'a> {
    registry: &'a Registry,
    blob: &'a Bytes,
    decoded: RefCell<HashMap<(u64, String), Decoded>>,
}

impl PayloadSizer for DecodingReader<'_> {
    fn measure(&self, key: &str, bytes: &[u8], base: u64, layout: Layout) -> Option<Result<Measure, FormatError>> {
        let loader = self.registry.get(key)?;
        // `base` is the offset of `bytes[0]` in the blob, and `bytes` runs to the end of the
        // body: the same range of the shared blob, taken by offset.
        let src = usize::try_from(base).ok().and_then(|start| self.blob.slice(start..start.checked_add(bytes.len())?));
        let Some(src) = src else {
            let kind = FormatErrorKind::Invalid { what: "payload", detail: "lies outside the blob".into() };
            return Some(Err(FormatError::new(base, kind)));
        };
        Some(match loader.read(&src, base, layout) {
            Ok(Some((module, len))) => {
                self.decoded.borrow_mut().insert((base, key.to_owned()), (module, len));
                Ok(Measure::Len(len))
            }
            Ok(None) => Ok(Measure::Unmeasured),
            // A payload that measures but does not decode: the parse must split the blob as
            // `parse_blob` does (a stricter measure here would send the classic reader's end
            // search to another reading of an ambiguous blob, found by the `blob_classic`
            // fuzzer), so the length stands and `build` reports the loader's error.
            Err(e) => match loader.measure(bytes, base, layout) {
                Ok(m) => Ok(m),
                Err(_) => Err(format_error(e, base)),
            },
        })
    }

    fn known_keys(&self) -> Vec<String> {
        self.registry.keys()
    }

    fn is_known(&self, key: &str) -> bool {
        self.registry.get(key).is_some()
    }
}

/// A loader's error while the classic parser measures: its own [`FormatError`] when it is one
/// (the built-in kinds'), else the message at the payload's offset.
fn format_error(e: LoaderError, base: u64) -> FormatError {
    match e.downcast::<FormatError>() {
        Ok(f) => *f,
        Err(e) => FormatError::new(base, FormatErrorKind::Invalid { what: "payload", detail: e.to_string() }),
    }
}

/// Builds the loaded tree from a parsed blob: takes each entry's module (decoded during the
/// parse, or now for framed and unmeasured payloads) and links the imports.
fn build(
    parsed: &ParsedBlob<'_>,
    blob: &Bytes,
    reader: &DecodingReader<'_>,
    options: &LoadOptions,
    library: Arc<dyn Module>,
) -> Result<LoadedTree> {
    let registry = reader.registry;
    let mut decoded = reader.decoded.take();
    let mut modules: Vec<LoadedModule> = Vec::new();
    for (index, entry) in parsed.modules().enumerate() {
        let module: Arc<dyn Module> = match entry.kind {
            EntryKind::Lib => library.clone(),
            _ => {
                let _span = tracing::debug_span!("load_module", type_key = entry.type_key, index).entered();
                let len = entry.payload.len();
                let kept = decoded
                    .remove(&(entry.payload_offset, entry.type_key.to_owned()))
                    .filter(|(_, used)| *used == len as u64);
                if let Some((module, _)) = kept {
                    module
                } else {
                    let start = usize::try_from(entry.payload_offset).ok();
                    let payload = start.and_then(|s| blob.slice(s..s.checked_add(len)?)).ok_or_else(|| {
                        let kind = FormatErrorKind::Invalid { what: "payload", detail: "lies outside the blob".into() };
                        Error::Blob { path: "<memory>".into(), source: FormatError::new(entry.payload_offset, kind) }
                    })?;
                    match registry.get(entry.type_key) {
                        Some(loader) => loader.load(payload, parsed.layout).map_err(|source| Error::Loader {
                            index,
                            key: entry.type_key.to_owned(),
                            source,
                        })?,
                        None if options.unknown == UnknownKeys::KeepRaw => {
                            Arc::new(RawPayload::new(entry.type_key, payload))
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
