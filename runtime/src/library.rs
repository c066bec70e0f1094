//! The FFI edge: opening a shared library, reading its blob symbol and looking up functions.
//!
//! Everything `unsafe` on the load side (apart from the CUDA driver) is in this file.
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::module::{Module, Symbol};
use crate::Bytes;

/// Type key of the library module after loading.
pub const LIBRARY_TYPE_KEY: &str = "library";

/// The library module: the shared object that held the blob (every DSO module merged), or a
/// stand-in with no symbols when a blob is loaded from memory.
#[derive(Debug)]
pub struct LibraryModule {
    lib: Option<Arc<libloading::Library>>,
    path: PathBuf,
}

impl LibraryModule {
    /// A library module with no shared object behind it (for blobs loaded from memory).
    pub fn detached() -> LibraryModule {
        LibraryModule { lib: None, path: PathBuf::from("<memory>") }
    }

    pub(crate) fn new(lib: Arc<libloading::Library>, path: PathBuf) -> LibraryModule {
        LibraryModule { lib: Some(lib), path }
    }

    /// The file it was opened from (`<memory>` when detached).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks up `name`, with an error naming the library when it is missing.
    pub fn symbol(&self, name: &str) -> Result<Symbol> {
        self.get_function(name).ok_or_else(|| Error::MissingSymbol { name: name.to_owned(), path: self.path.clone() })
    }
}

impl Module for LibraryModule {
    fn type_key(&self) -> &str {
        LIBRARY_TYPE_KEY
    }

    fn get_function(&self, name: &str) -> Option<Symbol> {
        let lib = self.lib.as_ref()?;
        // SAFETY: the symbol is read as a plain address (`*mut c_void`), which is what dlsym
        // returns for any symbol, so no type is asserted about what it points to. The address
        // is handed out inside a `Symbol` that holds the library, so it cannot dangle.
        let addr = unsafe { lib.get::<*mut c_void>(name.as_bytes()) }.ok().map(|s| *s)?;
        (!addr.is_null()).then(|| Symbol::new(addr, lib.clone() as Arc<dyn Any + Send + Sync>))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Opens a shared library.
///
/// # Safety
///
/// Opening a library runs its initialisers (static constructors), and dropping the last
/// handle runs its finalisers: this is as safe as calling an unknown foreign function. Only
/// open files you trust to run.
pub(crate) unsafe fn open(path: &Path) -> Result<Arc<libloading::Library>> {
    // SAFETY: the caller accepts that the library's initialisers run (see `# Safety`).
    let lib =
        unsafe { libloading::Library::new(path) }.map_err(|source| Error::Dlopen { path: path.to_owned(), source })?;
    Ok(Arc::new(lib))
}

/// The mapped bytes of a data symbol, kept alive by the library handle.
struct MappedSymbol {
    _lib: Arc<libloading::Library>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are read-only data of a loaded library and are never written through this
// pointer; the library handle that keeps them mapped is `Send + Sync`.
unsafe impl Send for MappedSymbol {}
// SAFETY: as above: shared read-only access from several threads is sound.
unsafe impl Sync for MappedSymbol {}

impl AsRef<[u8]> for MappedSymbol {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is the address dlsym returned for the blob symbol, and `len` is that
        // symbol's size as recorded in the file's symbol table, checked by `elf::find_blob` to
        // lie within its section (which the dynamic loader maps whole, read-only). The library
        // stays loaded while `self` holds `_lib`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The bytes of the data symbol `name`, which the file's symbol table says is `size` bytes
/// long. No byte is copied: the view keeps the library loaded.
pub(crate) fn symbol_bytes(lib: &Arc<libloading::Library>, path: &Path, name: &str, size: u64) -> Result<Bytes> {
    // SAFETY: read as a plain address, as in `get_function`.
    let ptr = unsafe { lib.get::<*const u8>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|source| Error::Dlopen { path: path.to_owned(), source })?;
    let len = usize::try_from(size).map_err(|_| Error::Elf {
        path: path.to_owned(),
        detail: format!("symbol `{name}` is larger than the address space"),
    })?;
    if ptr.is_null() {
        return Err(Error::MissingSymbol { name: name.to_owned(), path: path.to_owned() });
    }
    Ok(Bytes::from_owner(Arc::new(MappedSymbol { _lib: lib.clone(), ptr, len })))
}
