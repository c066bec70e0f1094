//! The library module: opening a shared library, reading its blob from the loaded image, and
//! looking up functions.
//!
//! The blob is read from the image `dlopen` returned, never from the file on disk: if the path
//! was written again while an earlier load is alive, `dlopen` hands back the earlier image, and
//! the blob's address and size must both come from it. The address comes from `dlsym`, the size
//! from the image's own dynamic symbol table (`dladdr1` with `RTLD_DL_SYMENT`), checked against
//! the loaded segment that holds it.
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::bytes::Bytes;
use crate::error::{Error, Result};
use crate::ffi::call::{PackedFunction, Symbol};
use crate::ffi::context::{ContextHandle, LibraryContext};
use crate::format::Layout;
use crate::module::{LoadedTree, Module};

/// Type key of the library module after loading.
pub const LIBRARY_TYPE_KEY: &str = "library";

/// `RTLD_DL_SYMENT` of glibc's `dladdr1`: return the symbol table entry.
const RTLD_DL_SYMENT: libc::c_int = 1;
/// `RTLD_DL_LINKMAP` of glibc's `dladdr1`: return the object's link map.
const RTLD_DL_LINKMAP: libc::c_int = 2;

/// What a library's context symbols (`__tvm_module_ctx`, ...) lead to. There is one per loaded
/// image, shared by every load of it (each load's imports kept apart in it, and forgotten when
/// that load's [`LibraryModule`] is dropped), and it lives as long as any handle on the image does
/// (a loaded tree, or a [`Symbol`] taken from it); the handle compiled code holds refers to it
/// weakly, so it never dangles (see [`crate::ffi::context`]).
pub(crate) type ModuleContext = LibraryContext;

/// One load of a shared object, or of a system library linked into the program. Dropping the
/// last one runs a shared object's finalisers (`dlclose`), then frees the context its context
/// symbols point to.
pub(crate) struct Image {
    source: Source,
    ctx: Arc<ModuleContext>,
    /// This load's number, unique in the process: its imports' key in the context.
    id: u64,
}

/// Where an image's symbols come from.
enum Source {
    /// A shared object `dlopen` (or the private namespace's `dlmopen`) opened.
    Dl {
        // Dropped first (fields drop in order): `dlclose` before the memory file below closes.
        lib: libloading::os::unix::Library,
        link_map: usize,
        /// The memory file a library loaded from memory was opened through, kept open while
        /// the image is loaded so that no later memory file gets its number (and its path).
        _memfd: Option<OwnedFd>,
    },
    /// The symbols a system library registered at start-up, under its prefix.
    #[cfg(feature = "system-lib")]
    System(crate::ffi::system_lib::SystemLibrary),
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::Dl { link_map, .. } => {
                f.debug_struct("Image").field("link_map", &format_args!("{link_map:#x}")).finish()
            }
            #[cfg(feature = "system-lib")]
            Source::System(lib) => f.debug_struct("Image").field("system_lib", &lib.prefix()).finish(),
        }
    }
}

impl Image {
    /// An image of the system library `lib`, with its context and a new load number.
    #[cfg(feature = "system-lib")]
    pub(crate) fn system(lib: crate::ffi::system_lib::SystemLibrary, ctx: Arc<ModuleContext>) -> Arc<Image> {
        let id = LOADS.fetch_add(1, Ordering::Relaxed);
        Arc::new(Image { source: Source::System(lib), ctx, id })
    }

    /// The loader's record of a shared object (`None` for a system library).
    fn link_map(&self) -> Option<usize> {
        match &self.source {
            Source::Dl { link_map, .. } => Some(*link_map),
            #[cfg(feature = "system-lib")]
            Source::System(_) => None,
        }
    }

    /// The context its context symbols lead to.
    pub(crate) fn context(&self) -> &Arc<LibraryContext> {
        &self.ctx
    }

    /// The address of symbol `name`, when the image has it (a system library: under its
    /// prefix first, as TVM's `SystemLibrary::GetSymbol` looks).
    pub(crate) fn address(&self, name: &str) -> Option<*mut c_void> {
        match &self.source {
            Source::Dl { lib, .. } => {
                // SAFETY: the symbol is read as a plain address (`*mut c_void`), which is what
                // dlsym returns for any symbol, so no type is asserted about what it points to.
                let addr = unsafe { lib.get::<*mut c_void>(name.as_bytes()) }.ok().map(|s| *s)?;
                (!addr.is_null()).then_some(addr)
            }
            #[cfg(feature = "system-lib")]
            Source::System(lib) => lib.address(name),
        }
    }
}

/// The library module: the shared object that held the blob (every DSO module merged), or a
/// stand-in with no symbols when a blob is loaded from memory.
#[derive(Debug)]
pub struct LibraryModule {
    image: Option<Arc<Image>>,
    path: PathBuf,
    // (run) the functions' calling convention, and what `__tvm_main__` names.
    abi: Layout,
    main_entry: Option<String>,
}

impl LibraryModule {
    /// A library module with no shared object behind it (for blobs loaded from memory).
    pub(crate) fn detached() -> LibraryModule {
        LibraryModule { image: None, path: PathBuf::from("<memory>"), abi: Layout::Classic, main_entry: None }
    }

    pub(crate) fn new(image: Arc<Image>, path: PathBuf, abi: Layout, main_entry: Option<String>) -> LibraryModule {
        LibraryModule { image: Some(image), path, abi, main_entry }
    }

    /// The context compiled code of this library calls back with (`None` when detached).
    pub(crate) fn context(&self) -> Option<&Arc<LibraryContext>> {
        self.image.as_ref().map(|i| i.context())
    }

    /// The number of this load of the library, its key in [`LibraryModule::context`] (`None`
    /// when detached).
    pub(crate) fn load_id(&self) -> Option<u64> {
        self.image.as_ref().map(|i| i.id)
    }

    /// The TVM generation of the library's code, whose calling convention its functions use
    /// (classic when detached).
    pub fn abi(&self) -> Layout {
        self.abi
    }

    /// The address of exactly the symbol `name`, with no naming rule applied.
    fn raw_symbol(&self, name: &str) -> Option<Symbol> {
        let image = self.image.as_ref()?;
        // The address is handed out inside a `Symbol` that holds the image (library handle
        // and context), so neither can go away while it is used.
        let addr = image.address(name)?;
        Some(Symbol::new(addr, image.clone() as Arc<dyn Any + Send + Sync>))
    }

    /// The file it was opened from (`<memory>` when detached).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks up `name`, with an error naming the library when it is missing.
    pub fn symbol(&self, name: &str) -> Result<Symbol> {
        self.named_symbol(name).ok_or_else(|| Error::MissingSymbol { name: name.to_owned(), path: self.path.clone() })
    }

    /// The symbol of function `name` with each ABI's naming: on a tvm-ffi library (TVM 0.22+)
    /// `name` is exported as `__tvm_ffi_<name>` (tried first), and `__tvm_main__` on a classic
    /// library is a string naming the entry function, which is what it finds.
    fn named_symbol(&self, name: &str) -> Option<Symbol> {
        if self.abi.prefixes_functions() && !name.starts_with("__tvm_ffi_") {
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
}

impl Drop for LibraryModule {
    /// Takes this load out of the image's context: the functions found among its imports are
    /// let go here, not with the image, as they may hold the image themselves (a device
    /// module's code is a view of the blob in the image).
    fn drop(&mut self) {
        if let Some(image) = &self.image {
            image.ctx.forget(image.id);
        }
    }
}

impl Module for LibraryModule {
    fn type_key(&self) -> &str {
        LIBRARY_TYPE_KEY
    }

    /// The function `name` (each ABI's naming, see `named_symbol`), called in the library's
    /// convention.
    fn get_function(&self, name: &str) -> Option<PackedFunction> {
        self.named_symbol(name).map(|s| PackedFunction::native(s, self.abi))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Records, for every library module of `tree`, the modules it imports (depth first), which
/// `GetFuncFromEnv` searches.
pub(crate) fn link_imports(tree: &LoadedTree) {
    for (i, m) in tree.modules().iter().enumerate() {
        let Some(lib) = m.module.as_any().downcast_ref::<LibraryModule>() else { continue };
        let (Some(ctx), Some(id)) = (lib.context(), lib.load_id()) else { continue };
        // The library's imports in lookup order, the library itself left out.
        let order: Vec<Weak<dyn Module>> =
            tree.depth_first(i).skip(1).map(|j| Arc::downgrade(&tree.modules()[j].module)).collect();
        // Only direct imports are searched first by TVM, each with its own imports: the depth
        // first order above is the same sequence.
        ctx.set_imports(id, order);
    }
}

/// The path `dlopen` is given for `path`: a bare file name (`deploy.so`) means the file in the
/// current directory, as it does for every other tool, not a search of the library path.
fn dlopen_path(path: &Path) -> PathBuf {
    let bare = path.parent().is_some_and(|p| p.as_os_str().is_empty()) && !path.as_os_str().is_empty();
    if bare {
        Path::new(".").join(path)
    } else {
        path.to_owned()
    }
}

/// How many images were opened so far: each one's number.
static LOADS: AtomicU64 = AtomicU64::new(1);

/// The context handle of each image loaded so far, by link map (see [`ContextHandle`]: an
/// image that stays mapped keeps its handle, and its next load's context goes behind it).
static CONTEXTS: Mutex<Vec<(usize, &'static ContextHandle)>> = Mutex::new(Vec::new());

/// Opens a shared library (a bare file name means the current directory's file).
///
/// `private`: the library imports TVM runtime functions by name (see [`crate::ffi::shim`]), so
/// it is opened in mblob's private namespace, where they bind to mblob's shim; otherwise in the
/// main namespace. Either way with local scope: nothing it defines becomes global.
///
/// # Safety
///
/// Opening a library runs its initialisers (static constructors), and dropping the last
/// handle runs its finalisers: this is as safe as calling an unknown foreign function. Only
/// open files you trust to run.
pub(crate) unsafe fn open(path: &Path, private: bool, memfd: Option<OwnedFd>) -> Result<Arc<Image>> {
    let target = dlopen_path(path);
    // Immediate binding: an unresolved symbol fails the open instead of killing the process at
    // its first call.
    let lib = if private {
        // SAFETY: the caller accepts that the library's initialisers run (see `# Safety`).
        unsafe { crate::ffi::shim::open_private(&target) }
            .map_err(|detail| Error::PrivateDlopen { path: path.to_owned(), detail })?
    } else {
        // SAFETY: as above.
        unsafe {
            use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
            Library::open(Some(&target), RTLD_NOW | RTLD_LOCAL)
        }
        .map_err(|source| Error::Dlopen { path: path.to_owned(), source })?
    };
    let raw = lib.into_raw();
    let mut link_map: *mut c_void = std::ptr::null_mut();
    // SAFETY: `raw` is a live handle from dlopen; RTLD_DI_LINKMAP writes one pointer through
    // the valid out-pointer.
    let info = unsafe { libc::dlinfo(raw, libc::RTLD_DI_LINKMAP, (&mut link_map as *mut *mut c_void).cast()) };
    // SAFETY: `raw` came from `into_raw` just above and is turned back into its owner once.
    let lib = unsafe { libloading::os::unix::Library::from_raw(raw) };
    if info != 0 || link_map.is_null() {
        return Err(Error::Elf { path: path.to_owned(), detail: "dlinfo cannot tell the loaded image".into() });
    }
    let link_map = link_map as usize;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // A link map is the loader's record of one image while it is loaded; one of an image that
    // was unloaded may be reused for another image, which then takes over its handle (whatever
    // the unloaded image's code cached went with its memory).
    let handle = match contexts.iter().find(|(lm, _)| *lm == link_map) {
        Some((_, handle)) => *handle,
        None => {
            let handle = ContextHandle::leak();
            contexts.push((link_map, handle));
            handle
        }
    };
    let ctx = handle.context().unwrap_or_else(|| LibraryContext::new(path.to_owned(), handle));
    drop(contexts);
    let id = LOADS.fetch_add(1, Ordering::Relaxed);
    Ok(Arc::new(Image { source: Source::Dl { lib, link_map, _memfd: memfd }, ctx, id }))
}

/// The context handle of each system library opened so far, by prefix: TVM keeps one module
/// per prefix for the life of the process, and its code caches the handles it was given.
#[cfg(feature = "system-lib")]
static SYSTEM_CONTEXTS: Mutex<Vec<(String, &'static ContextHandle)>> = Mutex::new(Vec::new());

/// Opens the system library of `prefix` (see [`crate::ffi::system_lib`]): its image (symbols
/// from the registry, a context behind the prefix's handle), and its blob when it has one.
#[cfg(feature = "system-lib")]
pub(crate) fn open_system(prefix: &str) -> Result<(Arc<Image>, Layout, Option<FoundBlob>)> {
    let (lib, blob) = crate::ffi::system_lib::SystemLibrary::open(prefix)?;
    let path = PathBuf::from(format!("system://{prefix}"));
    let mut contexts = SYSTEM_CONTEXTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let handle = match contexts.iter().find(|(p, _)| p == prefix) {
        Some((_, handle)) => *handle,
        None => {
            let handle = ContextHandle::leak();
            contexts.push((prefix.to_owned(), handle));
            handle
        }
    };
    let ctx = handle.context().unwrap_or_else(|| LibraryContext::new(path, handle));
    drop(contexts);
    let abi = lib.abi();
    let blob = blob.map(|(symbol, layout, bytes)| {
        struct Static(&'static [u8]);
        impl AsRef<[u8]> for Static {
            fn as_ref(&self) -> &[u8] {
                self.0
            }
        }
        (symbol, layout, Bytes::from_owner(Arc::new(Static(bytes))))
    });
    Ok((Image::system(lib, ctx), abi, blob))
}

/// How many libraries were loaded from memory so far, to make each one's path unique.
static MEMORY_LOADS: AtomicU64 = AtomicU64::new(1);

/// An anonymous memory file (`memfd_create`) holding `data`, and a path that opens it
/// (`/proc/self/fd/N`), for loading a library from memory with `dlopen` and no file on disk.
///
/// `dlopen` hands back an already loaded object whose name equals the path it is given, and a
/// library that cannot be unloaded (`RTLD_NODELETE`, `STB_GNU_UNIQUE` symbols) stays loaded
/// under its name after its memory file closed and the number went to a new one: so each path
/// is made unique with a count spelled in `.` and `..` steps that resolve to the same
/// directory (`/proc/self/fd/./../fd/N`; one step per bit of the count).
pub(crate) fn memory_file(data: &[u8], name: &str) -> std::io::Result<(OwnedFd, PathBuf)> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let c_name = std::ffi::CString::new(name.replace('\0', "_")).unwrap_or_default();
    // SAFETY: `c_name` is a NUL-terminated string that outlives the call; memfd_create reads it
    // and returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new, valid descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(data)?;
    let fd = OwnedFd::from(file);
    let count = MEMORY_LOADS.fetch_add(1, Ordering::Relaxed);
    let mut path = String::from("/proc/self/fd/");
    for bit in (0..64 - count.leading_zeros()).rev() {
        path.push_str(if count >> bit & 1 == 1 { "./" } else { "../fd/" });
    }
    path.push_str(&fd.as_raw_fd().to_string());
    Ok((fd, PathBuf::from(path)))
}

/// The mapped bytes of a data symbol, kept alive by the image.
struct MappedSymbol {
    _image: Arc<Image>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are read-only data of a loaded library and are never written through this
// pointer; the image that keeps them mapped is `Send + Sync`.
unsafe impl Send for MappedSymbol {}
// SAFETY: as above: shared read-only access from several threads is sound.
unsafe impl Sync for MappedSymbol {}

impl AsRef<[u8]> for MappedSymbol {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is the address dlsym returned for the blob symbol in this image, and
        // `len` that symbol's size in the image's own symbol table, checked by `image_blob` to
        // lie within a loaded segment of the image. The image stays loaded while `self` holds
        // `_image`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A blob found in an image: its symbol, layout and bytes.
pub(crate) type FoundBlob = (String, Layout, Bytes);

/// The first of `names` that the image itself defines, with its layout and bytes (no byte is
/// copied: the view keeps the image loaded). `Ok(None)` when it defines none.
pub(crate) fn image_blob(image: &Arc<Image>, path: &Path, names: &[String]) -> Result<Option<FoundBlob>> {
    let elf = |detail: String| Error::Elf { path: path.to_owned(), detail };
    let Some(link_map) = image.link_map() else { return Ok(None) };
    for name in names {
        let Some((layout, _)) = Layout::from_symbol(name) else { continue };
        let Some(addr) = image.address(name) else { continue };
        let Some(size) = symbol_size(addr, link_map) else { continue };
        let segment = segment_of(addr as usize)
            .ok_or_else(|| elf(format!("symbol `{name}` lies in no loaded segment of the image")))?;
        let room = segment.end - addr as usize;
        let len = match size {
            0 => room,
            n => usize::try_from(n).ok().filter(|&n| n <= room).ok_or_else(|| {
                elf(format!("symbol `{name}` claims {n} bytes but its loaded segment holds {room} after it"))
            })?,
        };
        let bytes = Arc::new(MappedSymbol { _image: image.clone(), ptr: addr.cast_const().cast(), len });
        // The blob's pages may be given back once copied when they are pages of the file that
        // nothing writes: a read-only segment, and within the part of it read from the file
        // (not the zero-filled rest, whose first page the loader writes).
        let from_file = !segment.writable && addr as usize + len <= segment.file_end;
        let bytes = if from_file { Bytes::from_mapping(bytes, release_file_pages) } else { Bytes::from_owner(bytes) };
        return Ok(Some((name.clone(), layout, bytes)));
    }
    Ok(None)
}

/// A dynamic symbol table entry (`ElfW(Sym)`).
#[cfg(target_pointer_width = "64")]
type ElfSym = libc::Elf64_Sym;
#[cfg(target_pointer_width = "32")]
type ElfSym = libc::Elf32_Sym;

/// The size (`st_size`) of the symbol at `addr` in the image's symbol table, or `None` when the
/// symbol at `addr` belongs to another object (a dependency) or is not a symbol's start.
fn symbol_size(addr: *mut c_void, link_map: usize) -> Option<u64> {
    // SAFETY: `Dl_info` is plain data that dladdr1 fills; zeroed is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut owner: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 reads no memory at `addr` (it looks it up in the loader's tables) and
    // writes `info` and one pointer through `owner`, both valid.
    let found = unsafe { libc::dladdr1(addr, &mut info, &mut owner, RTLD_DL_LINKMAP) };
    if found == 0 || owner as usize != link_map {
        return None;
    }
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: as above; with RTLD_DL_SYMENT the extra pointer is the symbol table entry.
    let found = unsafe { libc::dladdr1(addr, &mut info, &mut sym, RTLD_DL_SYMENT) };
    if found == 0 || sym.is_null() || info.dli_saddr != addr {
        return None;
    }
    // SAFETY: dladdr1 returned a pointer to an `ElfW(Sym)` entry of the object's dynamic symbol
    // table, which stays mapped while the object is loaded (the caller holds it).
    let st_size = unsafe { (*sym.cast::<ElfSym>()).st_size };
    #[allow(clippy::useless_conversion)] // `u32` on 32-bit targets
    Some(u64::from(st_size))
}

/// Gives back the memory pages that lie wholly inside `bytes`, a range of a read-only mapping
/// of a file that nothing writes (`madvise(MADV_DONTNEED)`): the process stops holding them,
/// and a later read maps them in again from the file, with the same contents.
pub(crate) fn release_file_pages(bytes: &[u8]) {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf only reads a configuration value.
    let page = *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096));
    let at = bytes.as_ptr() as usize;
    let Some(start) = at.checked_next_multiple_of(page.max(1)) else { return };
    let end = (at + bytes.len()) / page * page;
    if end <= start {
        return;
    }
    // SAFETY: `start..end` is whole pages inside `bytes`, part of a read-only file mapping
    // (callers only hand in the views `Bytes::from_mapping` made: a `PROT_READ` map of a file,
    // or a blob in a read-only segment of a loaded library, within its file-backed part, which
    // no relocation writes into: it is data nothing points into) that nothing has written, so
    // no page holds anything but the file's bytes: dropping them changes no byte that anyone
    // reads, it only makes the next read fault them in again.
    let rc = unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_DONTNEED) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "madvise(MADV_DONTNEED) failed; pages kept");
    }
}

/// The loaded segment (`PT_LOAD`) that holds an address, in memory.
struct Segment {
    /// Its end.
    end: usize,
    /// The end of the part read from the file (`p_filesz`; the rest is zero-filled).
    file_end: usize,
    /// Whether it is mapped writable (`PF_W`).
    writable: bool,
}

impl Segment {
    fn new(start: usize, memsz: u64, filesz: u64, flags: u32) -> Option<Segment> {
        let end = start.checked_add(usize::try_from(memsz).ok()?)?;
        let file_end = start.checked_add(usize::try_from(filesz).ok()?)?.min(end);
        Some(Segment { end, file_end, writable: flags & object::elf::PF_W.0 != 0 })
    }
}

/// The loaded segment that holds `addr`.
///
/// `dl_iterate_phdr` reports the objects of the caller's namespace only; an image in mblob's
/// private namespace (see [`crate::ffi::shim`]) is found through its own program headers.
fn segment_of(addr: usize) -> Option<Segment> {
    segment_in_namespace(addr).or_else(|| segment_of_owner(addr))
}

/// An ELF file header as mapped (`ElfW(Ehdr)`), and a program header (`ElfW(Phdr)`).
#[cfg(target_pointer_width = "64")]
type MappedEhdr = object::elf::FileHeader64<object::NativeEndian>;
#[cfg(target_pointer_width = "64")]
type MappedPhdr = object::elf::ProgramHeader64<object::NativeEndian>;
#[cfg(target_pointer_width = "32")]
type MappedEhdr = object::elf::FileHeader32<object::NativeEndian>;
#[cfg(target_pointer_width = "32")]
type MappedPhdr = object::elf::ProgramHeader32<object::NativeEndian>;

/// [`segment_of`] from the program headers of the object that holds `addr`, read where the
/// loader mapped its ELF header (the start of its first segment, `dli_fbase`).
fn segment_of_owner(addr: usize) -> Option<Segment> {
    use object::read::elf::{FileHeader, ProgramHeader};
    const PAGE: usize = 4096;
    // SAFETY: `Dl_info` is plain data that dladdr1 fills; zeroed is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut link_map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 reads no memory at `addr` and writes `info` and one pointer through
    // `link_map`, both valid.
    let found = unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut link_map, RTLD_DL_LINKMAP) };
    if found == 0 || link_map.is_null() || info.dli_fbase.is_null() {
        return None;
    }
    // SAFETY: `l_addr` (the load bias) is the first member of glibc's public `struct link_map`
    // (<link.h>), pointer-sized; the object is loaded (the caller holds it).
    let bias = unsafe { *link_map.cast::<usize>() };
    let base = info.dli_fbase as usize;
    // SAFETY: `dli_fbase` is the start of the object's first mapping, at least one readable
    // page (a loaded object's first segment holds its ELF header, checked below); only its
    // first page is read.
    let page = unsafe { std::slice::from_raw_parts(base as *const u8, PAGE) };
    let header: &MappedEhdr = object::pod::from_bytes(page).ok()?.0;
    let e = object::NativeEndian;
    if !header.is_supported() {
        return None;
    }
    let phoff = usize::try_from(Into::<u64>::into(header.e_phoff(e))).ok()?;
    let count = usize::from(header.e_phnum(e));
    if usize::from(header.e_phentsize(e)) != std::mem::size_of::<MappedPhdr>() {
        return None;
    }
    // Only headers within the first page are read (every linker puts them right after the
    // ELF header).
    let bytes = page.get(phoff..)?;
    let headers: &[MappedPhdr] = object::pod::slice_from_bytes(bytes, count).ok()?.0;
    headers.iter().filter(|h| h.p_type(e) == object::elf::PT_LOAD).find_map(|h| {
        let start = bias.wrapping_add(usize::try_from(Into::<u64>::into(h.p_vaddr(e))).ok()?);
        let (memsz, filesz) = (Into::<u64>::into(h.p_memsz(e)), Into::<u64>::into(h.p_filesz(e)));
        let segment = Segment::new(start, memsz, filesz, h.p_flags(e).0)?;
        (start..segment.end).contains(&addr).then_some(segment)
    })
}

/// [`segment_of`] among the objects `dl_iterate_phdr` reports (the main namespace).
fn segment_in_namespace(addr: usize) -> Option<Segment> {
    struct Search {
        addr: usize,
        found: Option<Segment>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid `info` for the call and our `Search` as `data`.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers of a loaded object.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        for h in headers.iter().filter(|h| h.p_type == libc::PT_LOAD) {
            let start = (info.dlpi_addr as usize).wrapping_add(h.p_vaddr as usize);
            let (memsz, filesz) = (Into::<u64>::into(h.p_memsz), Into::<u64>::into(h.p_filesz));
            let Some(segment) = Segment::new(start, memsz, filesz, h.p_flags) else { continue };
            if (start..segment.end).contains(&search.addr) {
                search.found = Some(segment);
                return 1;
            }
        }
        0
    }
    let mut search = Search { addr, found: None };
    // SAFETY: `visit` only reads the headers it is given and writes `search`, which outlives the
    // call; it cannot unwind (no panicking operation).
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_mean_the_current_directory() {
        assert_eq!(dlopen_path(Path::new("deploy.so")), Path::new("./deploy.so"));
        assert_eq!(dlopen_path(Path::new("lib/deploy.so")), Path::new("lib/deploy.so"));
        assert_eq!(dlopen_path(Path::new("/tmp/deploy.so")), Path::new("/tmp/deploy.so"));
        assert_eq!(dlopen_path(Path::new("./deploy.so")), Path::new("./deploy.so"));
    }
}
