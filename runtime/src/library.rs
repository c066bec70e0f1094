//! The FFI edge: opening a shared library, reading its blob symbol and looking up functions.
//!
//! Everything `unsafe` on the load side (apart from the CUDA driver) is in this file.
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi::callconv::{Abi, PackedFunction};
use crate::ffi::context::LibraryContext;
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
    // (run) the context compiled code calls back with, and what `__tvm_main__` names.
    ctx: Option<Arc<LibraryContext>>,
    main_entry: Option<String>,
}

impl LibraryModule {
    /// A library module with no shared object behind it (for blobs loaded from memory).
    pub fn detached() -> LibraryModule {
        LibraryModule { lib: None, path: PathBuf::from("<memory>"), ctx: None, main_entry: None }
    }

    pub(crate) fn new(
        lib: Arc<libloading::Library>,
        path: PathBuf,
        ctx: Arc<LibraryContext>,
        main_entry: Option<String>,
    ) -> LibraryModule {
        LibraryModule { lib: Some(lib), path, ctx: Some(ctx), main_entry }
    }

    /// The context compiled code of this library calls back with (`None` when detached).
    pub fn context(&self) -> Option<&Arc<LibraryContext>> {
        self.ctx.as_ref()
    }

    /// The calling convention of the library's functions (classic when detached).
    pub fn abi(&self) -> Abi {
        self.ctx.as_ref().map_or(Abi::Packed, |c| c.abi())
    }

    /// The address of exactly the symbol `name`, with no naming rule applied.
    fn raw_symbol(&self, name: &str) -> Option<Symbol> {
        let lib = self.lib.as_ref()?;
        // SAFETY: the symbol is read as a plain address (`*mut c_void`), which is what dlsym
        // returns for any symbol, so no type is asserted about what it points to. The address
        // is handed out inside a `Symbol` that holds the library (and its context), so it
        // cannot dangle.
        let addr = unsafe { lib.get::<*mut c_void>(name.as_bytes()) }.ok().map(|s| *s)?;
        let owner: Arc<dyn Any + Send + Sync> = match &self.ctx {
            Some(ctx) => Arc::new((lib.clone(), ctx.clone())),
            None => lib.clone(),
        };
        (!addr.is_null()).then(|| Symbol::new(addr, owner))
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

    /// Each ABI's naming: on a tvm-ffi library (TVM 0.22+) `name` is exported as
    /// `__tvm_ffi_<name>` (tried first), and `__tvm_main__` on a classic library is a string
    /// naming the entry function, which is what it finds.
    fn get_function(&self, name: &str) -> Option<Symbol> {
        if self.abi() == Abi::Ffi && !name.starts_with("__tvm_ffi_") {
            if let Some(s) = self.raw_symbol(&format!("__tvm_ffi_{name}")) {
                return Some(s);
            }
        }
        if name == "__tvm_main__" {
            if let Some(entry) = &self.main_entry {
                return self.raw_symbol(entry);
            }
        }
        self.raw_symbol(name)
    }

    fn packed_function(&self, name: &str) -> Option<PackedFunction> {
        self.get_function(name).map(|s| PackedFunction::native(s, self.abi()))
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
    let lib = unsafe { open_now(path) }.map_err(|source| Error::Dlopen { path: path.to_owned(), source })?;
    Ok(Arc::new(lib))
}

/// `dlopen` with immediate binding where the platform has it: an unresolved symbol fails the
/// open instead of killing the process at its first call.
///
/// # Safety
///
/// As [`open`].
unsafe fn open_now(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: forwarded from the caller.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: forwarded from the caller.
        unsafe { libloading::Library::new(path) }
    }
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
