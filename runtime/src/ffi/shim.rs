//! Runtime functions that compiled code imports by name, and the checks made before a library
//! is opened.
//!
//! TVM 0.22+ argument checks call `TVMFFIErrorSetRaisedFromCStrParts` through the PLT, with no
//! `DT_NEEDED` entry saying where it lives; TVM's C host target and system-lib builds import
//! `TVMBackendAllocWorkspace`, `TVMFuncCall`, ... the same way. Such a symbol must be found when
//! the library is bound: with immediate binding the open fails, with lazy binding the first
//! failing check kills the process.
//!
//! mblob makes none of these names visible to the process. TVM, tvm-ffi (which also ships
//! inside other Python packages) or a program of one's own may define them in the same process,
//! loaded before or after mblob, and each must keep reaching its own definitions: two global
//! providers of one name is a crash for whichever loses (a segfault in the other one's
//! `TVMFFIFunctionCall`). So the binding is private, by glibc's link-map namespaces:
//!
//! - `build.rs` compiles a tiny C shared library (`shim/mblob_shim.c`, built with `-nostdlib`: it
//!   imports nothing) whose functions forward to a table of function pointers; its bytes are
//!   embedded here.
//! - The first time a library imports such names, the shim is written to a private temporary
//!   file and opened with `dlmopen(LM_ID_NEWLM, ...)` (after which the file is removed): it is
//!   the first object of a new namespace, and its table is filled with the context functions of
//!   [`super::context`].
//! - Such libraries are opened into that namespace (`dlmopen(lmid, path, RTLD_NOW | RTLD_LOCAL)`).
//!   glibc puts the searchlist of a namespace's first object at the front of every later
//!   object's lookup scope there, so their imports bind to the shim, with no `RTLD_GLOBAL`
//!   anywhere and nothing added to the main namespace's global scope.
//! - Libraries that import no runtime function (every classic LLVM library: its `__TVM*`
//!   pointer slots are written per library by [`super::context::install`]) are opened in the
//!   main namespace as before.
//!
//! What it costs: glibc has 16 namespaces per process and mblob uses one. The shim needs no
//! libc and TVM's LLVM-built libraries need nothing, so the namespace usually holds no C
//! library; a library there that needs one (`DT_NEEDED libc.so.6`, e.g. a C-host build) gets
//! glibc's own second copy, which glibc supports (separate `malloc` arenas: mblob never frees
//! what such a library allocates, nor the reverse; its workspace goes through the context
//! functions). Thread-local storage of objects in a namespace is per thread as anywhere, so
//! kernels run on mblob's thread pool (threads of the main namespace) as they do in the main
//! namespace: the calls cross only code addresses.
//!
//! Libraries are opened with `RTLD_NOW`, so any other unresolved symbol is an error at load,
//! never a crash later. A library that imports a TVM function the shim does not provide (e.g.
//! `TVMArrayAlloc`) is refused before it is opened, with an error that lists them; so is every
//! library that imports runtime functions where the platform has no private namespaces
//! (anything but glibc) or the crate was built without a C compiler (cfg `mblob_no_shim`).
#![allow(unsafe_code)]

use std::path::Path;
use std::sync::OnceLock;

use object::{Object, ObjectSection, ObjectSymbol};

use crate::error::{Error, Result};
use crate::format::Layout;

/// The TVM runtime functions the shim provides, in the order of its table.
pub(crate) const PROVIDED: [&str; 13] = [
    "TVMFFIErrorSetRaisedFromCStrParts",
    "TVMFFIErrorSetRaisedFromCStr",
    "TVMAPISetLastError",
    "TVMBackendAllocWorkspace",
    "TVMBackendFreeWorkspace",
    "TVMBackendParallelLaunch",
    "TVMBackendParallelBarrier",
    "TVMBackendGetFuncFromEnv",
    "TVMFuncCall",
    "TVMFFIFunctionCall",
    "TVMFFIEnvModLookupFromImports",
    "TVMFFIHandleInitOnce",
    "TVMBackendRegisterSystemLibSymbol",
];

#[cfg(not(mblob_no_shim))]
static SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mblob_shim.so"));

/// What the file's dynamic symbols say, read before it is opened.
#[derive(Debug, Clone)]
pub(crate) struct Preflight {
    /// The TVM generation of its code (the one classifier's answer), whose calling
    /// convention its functions use.
    pub abi: Layout,
    /// The entry function `__tvm_main__` names (classic libraries).
    pub main_entry: Option<String>,
    /// Whether it imports runtime functions by name, so that it must be opened in mblob's
    /// private namespace ([`open_private`]).
    pub private: bool,
}

/// Whether a symbol name is one of TVM's runtime functions.
pub(crate) fn is_tvm_runtime(name: &str) -> bool {
    name.starts_with("TVM") || name.starts_with("tvm_")
}

/// Reads the dynamic symbols of `file` (an ELF shared library), sets up the private namespace
/// when the library imports runtime functions, and refuses one that imports runtime functions
/// nobody provides.
pub(crate) fn preflight(file: &[u8], path: &Path) -> Result<Preflight> {
    let Ok(obj) = object::File::parse(file) else {
        // Not an ELF file we can read: let dlopen say what is wrong with it.
        return Ok(Preflight { abi: Layout::Classic, main_entry: None, private: false });
    };
    let mut imports = Vec::new();
    let mut main_entry = None;
    for sym in obj.dynamic_symbols() {
        let Ok(name) = sym.name() else { continue };
        let name = name.split('@').next().unwrap_or(name);
        if sym.is_undefined() {
            if is_tvm_runtime(name) {
                imports.push(name.to_owned());
            }
            continue;
        }
        if name == "__tvm_main__" {
            main_entry = c_string_at(&obj, &sym);
        }
    }
    // The one classifier of host code (also pack's and inspect's).
    // Plain C code (no TVM mark) is called as classic code.
    let abi = crate::format::convention::classify_file(file).unwrap_or(Layout::Classic);
    imports.sort();
    imports.dedup();
    let missing: Vec<String> = imports.iter().filter(|n| !PROVIDED.contains(&n.as_str())).cloned().collect();
    if !missing.is_empty() {
        return Err(Error::MissingRuntimeSymbols {
            path: path.to_owned(),
            symbols: missing,
            reason: "mblob-runtime does not provide them".into(),
        });
    }
    if !imports.is_empty() {
        namespace::get().map_err(|reason| Error::MissingRuntimeSymbols {
            path: path.to_owned(),
            symbols: imports.clone(),
            reason,
        })?;
    }
    Ok(Preflight { abi, main_entry, private: !imports.is_empty() })
}

/// The NUL-terminated string a defined data symbol holds, read from the file.
fn c_string_at(obj: &object::File<'_>, sym: &object::Symbol<'_, '_>) -> Option<String> {
    let section = obj.section_by_index(sym.section_index()?).ok()?;
    let data = section.data().ok()?;
    let start = usize::try_from(sym.address().checked_sub(section.address())?).ok()?;
    let bytes = data.get(start..)?;
    let len = usize::try_from(sym.size()).ok().filter(|&n| n > 0).unwrap_or(bytes.len()).min(bytes.len());
    let bytes = &bytes[..len];
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8(bytes[..end].to_vec()).ok().filter(|s| !s.is_empty())
}

/// Opens `target` in mblob's private namespace, with immediate binding and local scope: its
/// imports of [`PROVIDED`] names bind to the shim, and nothing it defines becomes visible to
/// the rest of the process. `Err` holds what the loader said.
///
/// # Safety
///
/// Opening a library runs its initialisers: as safe as calling an unknown foreign function.
pub(crate) unsafe fn open_private(target: &Path) -> std::result::Result<libloading::os::unix::Library, String> {
    let ns = namespace::get()?;
    // SAFETY: forwarded from the caller.
    unsafe { namespace::open(ns, target) }
}

#[cfg(mblob_no_shim)]
mod namespace {
    use std::path::Path;

    /// No namespace on this build (see `build.rs`).
    #[derive(Debug, Clone, Copy)]
    pub(super) enum Namespace {}

    pub(super) fn get() -> Result<Namespace, String> {
        Err(env!("MBLOB_NO_SHIM_REASON").into())
    }

    pub(super) unsafe fn open(ns: Namespace, _target: &Path) -> Result<libloading::os::unix::Library, String> {
        match ns {}
    }
}

#[cfg(not(mblob_no_shim))]
mod namespace {
    use std::ffi::{c_char, c_int, c_void, CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use super::{OnceLock, PROVIDED, SHIM};

    /// mblob's link-map namespace: its id, and the shim (its first object) as a `dlmopen`
    /// handle, kept open for the life of the process (a namespace whose objects are all closed
    /// cannot be loaded into again, and libraries bound to the shim may be open).
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Namespace {
        lmid: libc::Lmid_t,
        shim: usize,
    }

    /// The namespace, made once per process.
    pub(super) fn get() -> Result<Namespace, String> {
        static NAMESPACE: OnceLock<Result<Namespace, String>> = OnceLock::new();
        NAMESPACE.get_or_init(create).clone()
    }

    /// What the loader said about the last failure on this thread.
    fn dl_error() -> String {
        // SAFETY: dlerror returns null or a NUL-terminated message owned by the loader, valid
        // until the next dl call on this thread; it is copied at once.
        let p = unsafe { libc::dlerror() };
        if p.is_null() {
            return "the dynamic loader gave no reason".into();
        }
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn create() -> Result<Namespace, String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;

        let _span = tracing::debug_span!("load_runtime_shim").entered();
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let path = std::env::temp_dir().join(format!("mblob-shim-{}-{nanos}.so", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&path)
            .and_then(|mut f| f.write_all(SHIM).and_then(|()| f.sync_all()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            return Err(format!("cannot write the runtime shim to {}: {e}", path.display()));
        }
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| "the temporary path holds a NUL byte")?;
        // SAFETY: the shim is mblob's own library (built by build.rs from shim/mblob_shim.c with
        // -nostdlib); it has no initialisers and no dependencies. LM_ID_NEWLM makes it the
        // first object of a new namespace; nothing is added to the main namespace.
        let handle = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        let opened = if handle.is_null() { Err(dl_error()) } else { Ok(handle) };
        let _ = std::fs::remove_file(&path);
        let handle = opened.map_err(|e| format!("cannot open the runtime shim in a private namespace: {e}"))?;
        let mut lmid: libc::Lmid_t = 0;
        // SAFETY: `handle` is a live handle from dlmopen; RTLD_DI_LMID writes one `Lmid_t`
        // through the valid out-pointer.
        if unsafe { libc::dlinfo(handle, libc::RTLD_DI_LMID, (&mut lmid as *mut libc::Lmid_t).cast()) } != 0 {
            return Err(format!("cannot tell the runtime shim's namespace: {}", dl_error()));
        }
        // SAFETY: `handle` is live and the name NUL-terminated; the result is an address only.
        let table = unsafe { libc::dlsym(handle, c"mblob_shim_table".as_ptr()) }.cast::<*const c_void>();
        if table.is_null() {
            return Err(format!("the runtime shim has no table: {}", dl_error()));
        }
        let functions = crate::ffi::context::context_functions();
        for (i, name) in PROVIDED.iter().enumerate() {
            let f = if *name == "TVMBackendRegisterSystemLibSymbol" {
                register_system_lib_symbol as *const c_void
            } else {
                functions.iter().find(|(n, _)| n == name).map(|(_, f)| *f).unwrap_or(std::ptr::null())
            };
            // SAFETY: the table has `PROVIDED.len()` slots; no library calls through it yet (the
            // namespace holds only the shim until this returns).
            unsafe { table.add(i).write(f) };
        }
        tracing::debug!(lmid, "runtime shim loaded in a private namespace");
        Ok(Namespace { lmid, shim: handle as usize })
    }

    /// Opens `target` in the namespace (see [`super::open_private`]).
    ///
    /// # Safety
    ///
    /// As [`super::open_private`].
    pub(super) unsafe fn open(ns: Namespace, target: &Path) -> Result<libloading::os::unix::Library, String> {
        let c_path = CString::new(target.as_os_str().as_bytes()).map_err(|_| "the path holds a NUL byte".to_owned())?;
        // SAFETY: the caller accepts that the library's initialisers run. `ns.lmid` is a live
        // namespace (its shim is never closed).
        let handle = unsafe { libc::dlmopen(ns.lmid, c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dl_error());
        }
        pin_libc(ns);
        // SAFETY: `handle` is a live handle from dlmopen, owned from here by the `Library`
        // (which closes it once, on drop).
        Ok(unsafe { libloading::os::unix::Library::from_raw(handle) })
    }

    /// Keeps the namespace's own C library loaded for the rest of the process once a library
    /// brought it in (a library that needs `libc.so.6` or `libm.so.6`; the shim needs neither).
    /// Without this, closing the last such library unloads that libc and the namespace's copy
    /// of the dynamic loader's state with it, and glibc 2.39 crashes inside the next `dlmopen`
    /// into the namespace (seen on Ubuntu 24.04; 2.36 survives it).
    fn pin_libc(ns: Namespace) {
        static PINNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if PINNED.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        // SAFETY: RTLD_NOLOAD only looks `libc.so.6` up among the namespace's loaded objects
        // (nothing is opened or initialised); a non-null handle holds one more reference,
        // which is never released on purpose.
        let libc = unsafe { libc::dlmopen(ns.lmid, c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !libc.is_null() {
            PINNED.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    type Register = unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int;

    /// `TVMBackendRegisterSystemLibSymbol` as the shim forwards it, with the caller's address:
    /// a library that defines its own (a program's own registry) gets its own, since the shim,
    /// first in the namespace's lookup scope, would otherwise take its calls; a TVM system-lib
    /// build gets mblob-runtime's.
    extern "C" fn register_system_lib_symbol(name: *const c_char, ptr: *mut c_void, caller: *mut c_void) -> c_int {
        let run = || -> c_int {
            let Ok(ns) = get() else { return -1 };
            let own = own_registration(ns, caller);
            let mblob = crate::ffi::context::context_functions()
                .iter()
                .find(|(n, _)| *n == "TVMBackendRegisterSystemLibSymbol")
                .map(|(_, f)| *f)
                .unwrap_or(std::ptr::null());
            let f = if own.is_null() { mblob } else { own };
            if f.is_null() {
                return -1;
            }
            // SAFETY: `f` is either the caller library's own `TVMBackendRegisterSystemLibSymbol`
            // (whose signature the name fixes) or mblob's function of that signature, and the
            // arguments are the caller's own.
            unsafe { std::mem::transmute::<*const c_void, Register>(f)(name, ptr) }
        };
        std::panic::catch_unwind(run).unwrap_or(-1)
    }

    /// The caller library's own definition of `TVMBackendRegisterSystemLibSymbol`, or null.
    fn own_registration(ns: Namespace, caller: *mut c_void) -> *const c_void {
        const NAME: &CStr = c"TVMBackendRegisterSystemLibSymbol";
        // SAFETY: `Dl_info` is plain data that dladdr1 fills; zeroed is a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let mut link_map: *mut c_void = std::ptr::null_mut();
        // SAFETY: dladdr1 only looks `caller` up in the loader's tables, and writes `info` and
        // one pointer through `link_map`, both valid.
        let found = unsafe {
            libc::dladdr1(caller, &mut info, &mut link_map, 2 /* RTLD_DL_LINKMAP */)
        };
        if found == 0 || link_map.is_null() {
            return std::ptr::null();
        }
        // SAFETY: in glibc a link map is the handle dlopen gives for its object, and the caller's
        // object is loaded (it is running). dlsym on a handle searches that object and its
        // dependencies only, never the shim in front of them.
        let own = unsafe { libc::dlsym(link_map, NAME.as_ptr()) };
        // SAFETY: the shim's handle is live for the life of the process.
        let shim = unsafe { libc::dlsym(ns.shim as *mut c_void, NAME.as_ptr()) };
        if own.is_null() || own == shim {
            std::ptr::null()
        } else {
            own.cast_const()
        }
    }

    #[cfg(test)]
    mod tests {
        use object::{Object, ObjectSymbol};

        /// The shim as embedded: it imports nothing (no libc, so its namespace holds nothing
        /// else) and defines exactly the provided names and its table.
        #[test]
        fn embedded_shim_imports_nothing_and_defines_the_provided_names() {
            let obj = object::File::parse(super::SHIM).expect("the embedded shim is an ELF file");
            let undefined: Vec<String> = obj
                .dynamic_symbols()
                .filter(|s| s.is_undefined() && !s.is_weak())
                .filter_map(|s| s.name().ok().map(str::to_owned))
                .filter(|n| !n.is_empty())
                .collect();
            assert!(undefined.is_empty(), "the shim imports {undefined:?}");
            let mut defined: Vec<String> = obj
                .dynamic_symbols()
                .filter(|s| s.is_definition() && s.is_global())
                .filter_map(|s| s.name().ok().map(str::to_owned))
                .collect();
            defined.sort();
            let mut want: Vec<String> = super::PROVIDED.iter().map(|s| s.to_string()).collect();
            want.push("mblob_shim_table".into());
            want.sort();
            assert_eq!(defined, want);
            use object::read::elf::{Dyn, FileHeader};
            let header =
                object::elf::FileHeader64::<object::Endianness>::parse(super::SHIM).expect("a 64-bit ELF file");
            let endian = header.endian().expect("a known byte order");
            let sections = header.sections(endian, super::SHIM).expect("a section table");
            let (dynamic, _) = sections.dynamic(endian, super::SHIM).expect("readable").expect("a dynamic section");
            let needed = dynamic.iter().filter(|d| d.tag(endian) == object::elf::DT_NEEDED).count();
            assert_eq!(needed, 0, "the shim needs no library (DT_NEEDED)");
        }
    }
}
