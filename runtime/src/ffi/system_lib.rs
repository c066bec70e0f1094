//! System libraries: models linked into the program (TVM's `system-lib` builds), found by the
//! symbols their start-up code registers, with no `dlopen`.
//!
//! A `system-lib` object compiled by TVM registers, from a static constructor, each of its
//! functions, its context slot (`PREFIX__tvm_module_ctx`, `PREFIX__tvm_ffi__library_ctx`) and
//! its blob (`PREFIX__tvm_dev_mblob`, `PREFIX__tvm_ffi__library_bin`) by name and address:
//! through `TVMBackendRegisterSystemLibSymbol` (TVM up to 0.21, classic calling convention) or
//! `TVMFFIEnvModRegisterSystemLibSymbol` (tvm-ffi, TVM 0.22+). The table is one per process, as
//! TVM's `SystemLibSymbolRegistry` is; [`SystemLibrary`] looks names up in it as TVM's
//! `SystemLibrary::GetSymbol` does: `PREFIX + name` first, then `name` (and a tvm-ffi function
//! `__tvm_ffi_` + `PREFIX` + name first, as `GetSymbolWithSymbolPrefix` does).
//!
//! Unlike TVM, a name registered twice at two addresses is not silently overridden: the first
//! stays, the registration call returns -1, and opening a prefix that holds
//! such a name is refused ([`SystemLibError::Conflict`]).
//!
//! With the crate feature `system-lib`, the program also gets TVM's runtime names themselves
//! (`exports`): the registration functions and the functions `system-lib` code calls directly
//! (`TVMBackendAllocWorkspace`, `TVMFFIFunctionCall`, ...). A program links this instead of
//! TVM's runtime; a shared library built with the feature would export them to every other
//! library of the process, which is why the C library's `.so` and the Python package never
//! turn it on.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::format::{Layout, SYMBOL_CLASSIC, SYMBOL_CLASSIC_021, SYMBOL_FFI};

pub(crate) use crate::error::SystemLibError;

/// One registered symbol.
#[derive(Debug, Clone, Copy)]
struct Entry {
    addr: usize,
    /// The calling convention of the function that registered it.
    abi: Layout,
}

/// The symbols registered so far, and the names registered again at another address.
struct Table {
    symbols: BTreeMap<String, Entry>,
    conflicts: Vec<(String, usize, usize)>,
}

/// The process's table (const-initialised: registrations run before `main`).
static TABLE: Mutex<Table> = Mutex::new(Table { symbols: BTreeMap::new(), conflicts: Vec::new() });

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that `name` is at `addr`, registered through the function of convention `abi`
/// (what TVM's registration functions do). Registering a name again at the same address does
/// nothing; at another address it is refused with [`SystemLibError::Conflict`] (the first
/// address stays), and the prefix that holds it will not open.
///
/// # Safety
///
/// `addr` must be what a TVM `system-lib` build registers under `name`: a function of its
/// convention, a pointer-sized writable context slot, or a blob (8-byte length, then that
/// many bytes), valid for the rest of the process. Opening a prefix trusts these addresses.
pub(crate) unsafe fn register_symbol(name: &str, addr: *mut c_void, abi: Layout) -> Result<(), SystemLibError> {
    let addr = addr as usize;
    let mut t = table();
    match t.symbols.get(name) {
        Some(e) if e.addr == addr => Ok(()),
        Some(e) => {
            let first = e.addr;
            t.conflicts.push((name.to_owned(), first, addr));
            Err(SystemLibError::Conflict { prefix: String::new(), symbol: name.to_owned(), first, second: addr })
        }
        None => {
            t.symbols.insert(name.to_owned(), Entry { addr, abi });
            Ok(())
        }
    }
}

/// The blob and context symbols a prefix's model registers (every TVM version's).
const BLOB_SYMBOLS: [&str; 3] = [SYMBOL_FFI, SYMBOL_CLASSIC_021, SYMBOL_CLASSIC];
const CONTEXT_SYMBOLS: [&str; 3] = ["__tvm_ffi__library_ctx", "__tvm_ffi_library_ctx", "__tvm_module_ctx"];

/// The prefixes of the models registered so far (those whose blob or context slot is in the
/// table), sorted.
pub(crate) fn registered_prefixes() -> Vec<String> {
    let t = table();
    let mut held: Vec<String> = t
        .symbols
        .keys()
        .filter_map(|n| BLOB_SYMBOLS.iter().chain(&CONTEXT_SYMBOLS).find_map(|s| n.strip_suffix(s)))
        .map(str::to_owned)
        .collect();
    held.sort();
    held.dedup();
    held
}

/// A system library: the symbols registered under one prefix (TVM's `SystemLibrary`).
#[derive(Debug, Clone)]
pub(crate) struct SystemLibrary {
    prefix: String,
    abi: Layout,
}

/// What a prefix holds: its library, its blob (symbol, layout, bytes) when it has one.
pub(crate) type Opened = (SystemLibrary, Option<(String, Layout, &'static [u8])>);

/// The largest blob believed (a length header past it is refused, not mapped).
const MAX_BLOB: u64 = 1 << 40;

impl SystemLibrary {
    /// Opens the model registered under `prefix`: refused when nothing was registered under it
    /// ([`SystemLibError::NotLinked`]) or when one of its names was registered twice at two
    /// addresses ([`SystemLibError::Conflict`]).
    pub(crate) fn open(prefix: &str) -> Result<Opened, SystemLibError> {
        let t = table();
        if let Some((symbol, first, second)) = t.conflicts.iter().find(|(n, ..)| n.starts_with(prefix)) {
            return Err(SystemLibError::Conflict {
                prefix: prefix.to_owned(),
                symbol: symbol.clone(),
                first: *first,
                second: *second,
            });
        }
        let find = |names: &[&'static str]| -> Option<(&'static str, Entry)> {
            names.iter().find_map(|s| t.symbols.get(&format!("{prefix}{s}")).map(|e| (*s, *e)))
        };
        let blob = find(&BLOB_SYMBOLS);
        let ctx = find(&CONTEXT_SYMBOLS);
        let Some((_, first)) = blob.or(ctx) else {
            drop(t);
            return Err(SystemLibError::NotLinked { prefix: prefix.to_owned(), held: registered_prefixes() });
        };
        let lib = SystemLibrary { prefix: prefix.to_owned(), abi: first.abi };
        let Some((symbol, entry)) = blob else { return Ok((lib, None)) };
        let symbol = format!("{prefix}{symbol}");
        let Some((layout, _)) = Layout::from_symbol(&symbol) else { return Ok((lib, None)) };
        let header = entry.addr as *const [u8; 8];
        // SAFETY: the address was registered as this blob (see `register_symbol`): it starts
        // with its 8-byte little-endian length, readable for the life of the process.
        let len = u64::from_le_bytes(unsafe { header.read_unaligned() });
        let total = len
            .checked_add(8)
            .filter(|&n| n <= MAX_BLOB)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| SystemLibError::BlobSize { prefix: prefix.to_owned(), symbol: symbol.clone(), len })?;
        // SAFETY: as above: the header and the `len` bytes after it are the blob, static data
        // of the program that nothing writes.
        let bytes = unsafe { std::slice::from_raw_parts(entry.addr as *const u8, total) };
        Ok((lib, Some((symbol, layout, bytes))))
    }

    /// Its prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The calling convention of its functions (that of the function that registered it).
    pub(crate) fn abi(&self) -> Layout {
        self.abi
    }

    /// The address of `name` as TVM's system library finds it: a tvm-ffi function name
    /// (`__tvm_ffi_NAME`) as `__tvm_ffi_PREFIXNAME` first, then `PREFIX + name`, then `name`.
    pub(crate) fn address(&self, name: &str) -> Option<*mut c_void> {
        let t = table();
        let prefixed_ffi = name
            .strip_prefix("__tvm_ffi_")
            .filter(|rest| !rest.starts_with('_'))
            .map(|rest| format!("__tvm_ffi_{}{rest}", self.prefix));
        let candidates = prefixed_ffi.into_iter().chain([format!("{}{name}", self.prefix), name.to_owned()]);
        candidates.filter_map(|n| t.symbols.get(&n)).map(|e| e.addr as *mut c_void).find(|a| !a.is_null())
    }
}

/// TVM's runtime names, defined in the program (crate feature `system-lib`): the registration
/// functions, and the runtime functions `system-lib` code calls directly, each forwarding to
/// mblob's context functions ([`crate::ffi::context`]).
#[cfg(feature = "system-lib")]
#[allow(non_snake_case)]
mod exports {
    use std::ffi::{c_char, c_int, c_void, CStr};

    use super::SystemLibError;
    use crate::ffi::context as ctx;
    use crate::ffi::last_error::set_last_error;
    use crate::ffi::threadpool::{ParallelGroupEnv, ParallelLambda};
    use crate::ffi::value::{TVMFFIAny, TVMValue};
    use crate::format::Layout;

    /// Both registration functions: records the symbol, -1 (with the last error) when the name
    /// was registered before at another address or is not a string.
    fn register(name: *const c_char, ptr: *mut c_void, abi: Layout) -> c_int {
        std::panic::catch_unwind(|| {
            if name.is_null() {
                return -1;
            }
            // SAFETY: TVM's start-up code passes a NUL-terminated name.
            let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else { return -1 };
            // SAFETY: the caller is a TVM system-lib build registering its own symbol.
            match unsafe { super::register_symbol(name, ptr, abi) } {
                Ok(()) => 0,
                Err(SystemLibError::Conflict { symbol, first, second, .. }) => {
                    set_last_error(&format!(
                        "system-lib symbol `{symbol}` is registered already at {first:#x}: {second:#x} refused"
                    ));
                    -1
                }
                Err(e) => {
                    set_last_error(&e.to_string());
                    -1
                }
            }
        })
        .unwrap_or(-1)
    }

    /// `TVMBackendRegisterSystemLibSymbol` (TVM up to 0.21).
    #[no_mangle]
    pub extern "C" fn TVMBackendRegisterSystemLibSymbol(name: *const c_char, ptr: *mut c_void) -> c_int {
        register(name, ptr, Layout::Classic)
    }

    /// `TVMFFIEnvModRegisterSystemLibSymbol` (tvm-ffi, TVM 0.22+).
    #[no_mangle]
    pub extern "C" fn TVMFFIEnvModRegisterSystemLibSymbol(name: *const c_char, ptr: *mut c_void) -> c_int {
        register(name, ptr, Layout::Ffi)
    }

    /// `TVMAPISetLastError`.
    #[no_mangle]
    pub extern "C" fn TVMAPISetLastError(msg: *const c_char) {
        ctx::api_set_last_error(msg)
    }

    /// `TVMFFIErrorSetRaisedFromCStr`.
    #[no_mangle]
    pub extern "C" fn TVMFFIErrorSetRaisedFromCStr(kind: *const c_char, msg: *const c_char) {
        ctx::ffi_error_set_raised(kind, msg)
    }

    /// `TVMFFIErrorSetRaisedFromCStrParts`.
    #[no_mangle]
    pub extern "C" fn TVMFFIErrorSetRaisedFromCStrParts(kind: *const c_char, parts: *const *const c_char, n: i32) {
        ctx::ffi_error_set_raised_parts(kind, parts, n)
    }

    /// `TVMBackendAllocWorkspace`.
    #[no_mangle]
    pub extern "C" fn TVMBackendAllocWorkspace(
        dev_type: c_int,
        dev_id: c_int,
        nbytes: u64,
        code: c_int,
        bits: c_int,
    ) -> *mut c_void {
        ctx::backend_alloc_workspace(dev_type, dev_id, nbytes, code, bits)
    }

    /// `TVMBackendFreeWorkspace`.
    #[no_mangle]
    pub extern "C" fn TVMBackendFreeWorkspace(dev_type: c_int, dev_id: c_int, ptr: *mut c_void) -> c_int {
        ctx::backend_free_workspace(dev_type, dev_id, ptr)
    }

    /// `TVMBackendParallelLaunch`.
    #[no_mangle]
    pub extern "C" fn TVMBackendParallelLaunch(
        f: Option<ParallelLambda>,
        cdata: *mut c_void,
        num_task: c_int,
    ) -> c_int {
        ctx::backend_parallel_launch(f, cdata, num_task)
    }

    /// `TVMBackendParallelBarrier`.
    #[no_mangle]
    pub extern "C" fn TVMBackendParallelBarrier(task_id: c_int, env: *mut ParallelGroupEnv) -> c_int {
        ctx::backend_parallel_barrier(task_id, env)
    }

    /// `TVMBackendGetFuncFromEnv`.
    #[no_mangle]
    pub extern "C" fn TVMBackendGetFuncFromEnv(mctx: *mut c_void, name: *const c_char, out: *mut *mut c_void) -> c_int {
        ctx::backend_get_func_from_env(mctx, name, out)
    }

    /// `TVMFFIEnvModLookupFromImports`.
    #[no_mangle]
    pub extern "C" fn TVMFFIEnvModLookupFromImports(
        mctx: *mut c_void,
        name: *const c_char,
        out: *mut *mut c_void,
    ) -> c_int {
        ctx::env_mod_lookup_from_imports(mctx, name, out)
    }

    /// `TVMFuncCall`.
    #[no_mangle]
    pub extern "C" fn TVMFuncCall(
        handle: *mut c_void,
        values: *mut TVMValue,
        codes: *mut c_int,
        n: c_int,
        ret: *mut TVMValue,
        ret_code: *mut c_int,
    ) -> c_int {
        ctx::func_call(handle, values, codes, n, ret, ret_code)
    }

    /// `TVMFFIFunctionCall`.
    #[no_mangle]
    pub extern "C" fn TVMFFIFunctionCall(
        handle: *mut c_void,
        args: *const TVMFFIAny,
        n: i32,
        result: *mut TVMFFIAny,
    ) -> c_int {
        ctx::ffi_function_call(handle, args, n, result)
    }

    /// `TVMFFIHandleInitOnce`.
    #[no_mangle]
    pub extern "C" fn TVMFFIHandleInitOnce(handle: *mut *mut c_void, init: Option<ctx::InitFn>) -> c_int {
        ctx::handle_init_once(handle, init)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers `name` at `addr` (a fake address: these tests never dereference it).
    fn reg(name: &str, addr: usize, abi: Layout) -> Result<(), SystemLibError> {
        // SAFETY: nothing opens these prefixes' blobs or calls their functions; only their
        // names and addresses are compared.
        unsafe { register_symbol(name, addr as *mut c_void, abi) }
    }

    #[test]
    fn names_are_found_as_tvm_system_library_finds_them() {
        reg("unitffi___tvm_ffi__library_ctx", 0x10, Layout::Ffi).unwrap();
        reg("__tvm_ffi_unitffi_add", 0x20, Layout::Ffi).unwrap();
        reg("__tvm_ffi_add_unprefixed", 0x30, Layout::Ffi).unwrap();
        reg("unitffi_plain", 0x40, Layout::Ffi).unwrap();
        let (lib, blob) = SystemLibrary::open("unitffi_").unwrap();
        assert!(blob.is_none(), "no blob registered: a single library module");
        assert_eq!(lib.abi(), Layout::Ffi, "the convention of the function that registered it");
        // tvm-ffi's GetSymbolWithSymbolPrefix: `__tvm_ffi_` + prefix + name first.
        assert_eq!(lib.address("__tvm_ffi_add"), Some(0x20 as *mut c_void));
        // Then the name as it is.
        assert_eq!(lib.address("__tvm_ffi_add_unprefixed"), Some(0x30 as *mut c_void));
        // TVM's GetSymbol: prefix + name.
        assert_eq!(lib.address("plain"), Some(0x40 as *mut c_void));
        assert_eq!(lib.address("__tvm_ffi__library_ctx"), Some(0x10 as *mut c_void));
        assert_eq!(lib.address("missing"), None);
    }

    #[test]
    fn a_prefix_nobody_registered_is_refused_naming_those_that_did() {
        reg("unitheld___tvm_module_ctx", 0x50, Layout::Classic).unwrap();
        match SystemLibrary::open("unitnobody_") {
            Err(SystemLibError::NotLinked { prefix, held }) => {
                assert_eq!(prefix, "unitnobody_");
                assert!(held.contains(&"unitheld_".to_owned()), "{held:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_second_address_for_a_name_is_refused_and_the_prefix_does_not_open() {
        reg("unitdup___tvm_module_ctx", 0x60, Layout::Classic).unwrap();
        reg("unitdup___tvm_module_ctx", 0x60, Layout::Classic).expect("the same address again is no conflict");
        assert!(SystemLibrary::open("unitdup_").is_ok());
        let e = reg("unitdup___tvm_module_ctx", 0x70, Layout::Classic).unwrap_err();
        assert!(matches!(e, SystemLibError::Conflict { first: 0x60, second: 0x70, .. }), "{e:?}");
        match SystemLibrary::open("unitdup_") {
            Err(SystemLibError::Conflict { prefix, symbol, first, second }) => {
                assert_eq!(
                    (prefix.as_str(), symbol.as_str(), first, second),
                    ("unitdup_", "unitdup___tvm_module_ctx", 0x60, 0x70)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_blob_length_past_the_limit_is_refused() {
        static HUGE: [u8; 8] = u64::MAX.to_le_bytes();
        reg("unithuge___tvm_dev_mblob", HUGE.as_ptr() as usize, Layout::Classic).unwrap();
        match SystemLibrary::open("unithuge_") {
            Err(SystemLibError::BlobSize { len, .. }) => assert_eq!(len, u64::MAX),
            other => panic!("{other:?}"),
        }
    }
}
