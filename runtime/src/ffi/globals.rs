//! The global functions mblob provides, as TVM's global registry does: compiled code that
//! asks `GetFuncFromEnv` (`TVMBackendGetFuncFromEnv`, `TVMFFIEnvModLookupFromImports`) for a
//! name none of its library's imports has gets one of these, and the Relax VM falls back to
//! them for a name that is neither a builtin nor a function of the tree.
//!
//! | name | what |
//! |---|---|
//! | `tvm.contrib.sort.sort` | [`crate::ops::sort::sort`] |
//! | `tvm.contrib.sort.argsort` | [`crate::ops::sort::argsort`] |
//! | `tvm.contrib.sort.argsort_nms` | [`crate::ops::sort::argsort_nms`] |
//! | `tvm.contrib.sort.topk` | [`crate::ops::sort::topk`] |
//! | `__tvm_set_device` | selects the current device of a kind (host code of device kernels) |
//!
//! The functions take `DLTensor`s on the CPU (compact, as compiled code passes them) and
//! TVM's scalar arguments; a wrong argument is an error naming the function, never a crash.
//! [`register_global`] adds or replaces one.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::ffi::call::PackedFunction;
use crate::ffi::value::Value;

/// `tvm.contrib.sort.*` (feature `ops`).
#[cfg(feature = "ops")]
mod sort;

fn globals() -> &'static Mutex<HashMap<String, PackedFunction>> {
    static GLOBALS: OnceLock<Mutex<HashMap<String, PackedFunction>>> = OnceLock::new();
    GLOBALS.get_or_init(|| {
        let mut m = HashMap::new();
        // Host code of device kernels selects the device first: the device modules launch on
        // the current device of their kind.
        m.insert(
            "__tvm_set_device".to_owned(),
            PackedFunction::from_fn(|args| match args {
                [Value::Int(t), Value::Int(i)] => {
                    let device = crate::device::Device::from_dlpack(*t as i32, *i as i32);
                    crate::device::api::set_current_device(device);
                    Ok(Value::None)
                }
                _ => Err(format!("__tvm_set_device takes (device_type, device_id), got {args:?}")),
            }),
        );
        #[cfg(feature = "ops")]
        sort::register(&mut m);
        Mutex::new(m)
    })
}

/// Registers a global function that compiled code finds through `GetFuncFromEnv` when no
/// import has it, and the Relax VM when no module has it (TVM's global registry). Replaces
/// one of the same name.
pub fn register_global(name: impl Into<String>, f: PackedFunction) {
    globals().lock().unwrap_or_else(|e| e.into_inner()).insert(name.into(), f);
}

/// The global function `name`, if mblob provides one (or one was registered).
pub fn global_function(name: &str) -> Option<PackedFunction> {
    globals().lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
}

/// The names of the global functions, sorted.
pub fn global_names() -> Vec<String> {
    let mut names: Vec<String> = globals().lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
    names.sort();
    names
}
