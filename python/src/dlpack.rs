//! DLPack's export to Python: a capsule over a tensor's own memory (no copy), which keeps the
//! [`NdArray`] alive until the consumer is done with it.
//!
//! The protocol (DLPack's `dlpack.h` and the Python array API's `__dlpack__`): the producer
//! hands out a `PyCapsule` named `"dltensor"` holding a `DLManagedTensor*` (or, to a consumer
//! that asks for DLPack 1.0 or later with `max_version`, one named `"dltensor_versioned"`
//! holding a `DLManagedTensorVersioned*`, which also carries flags such as read-only). A
//! consumer that takes the tensor renames the capsule to `"used_dltensor"`
//! (`"used_dltensor_versioned"`) and calls the tensor's `deleter` when it no longer needs the
//! memory; a capsule no consumer took frees the tensor when it is itself freed. Here the
//! tensor and the [`NdArray`] it describes live in one allocation ([`Holder`]), which the
//! deleter drops: the array's storage and shape stay where the `DLTensor` points as long as
//! the consumer holds them.
//!
//! The other direction, for `export`'s parameters: [`ArrayBytes`] reads a numpy `uint8`
//! array's bytes in place, through numpy's array interface (a raw address).
//!
//! This file is the package's FFI edge with memory that Python owns or is handed (CPython's
//! capsule API, numpy's array interface): every `unsafe` of the Python crate is here
//! (ci/checks.py allows it by name).
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use mblob_runtime::ffi::dlpack::DLTensor;
use mblob_runtime::NdArray;
use pyo3::ffi;
use pyo3::prelude::*;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the memory.
pub(crate) const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the memory is a copy made for this export.
pub(crate) const FLAG_IS_COPIED: u64 = 1 << 1;

/// The DLPack version a versioned capsule declares (`DLPackVersion` 1.0: the layout of
/// `DLManagedTensorVersioned` below).
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `DLPackVersion`.
#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensor` (DLPack before 1.0, the capsule `"dltensor"`).
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack 1.0 and later, the capsule `"dltensor_versioned"`).
#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// The two managed-tensor structs: what differs between the capsules.
trait Managed: Sized {
    /// The capsule's name while no consumer has taken it.
    const NAME: &'static CStr;
    /// The struct over `tensor`, its context and deleter not yet set.
    fn new(tensor: DLTensor, flags: u64) -> Self;
    /// Sets the context and the deleter.
    fn set_owner(&mut self, ctx: *mut c_void, deleter: unsafe extern "C" fn(*mut Self));
}

impl Managed for DLManagedTensor {
    const NAME: &'static CStr = c"dltensor";
    fn new(dl_tensor: DLTensor, _flags: u64) -> Self {
        DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: None }
    }
    fn set_owner(&mut self, ctx: *mut c_void, deleter: unsafe extern "C" fn(*mut Self)) {
        self.manager_ctx = ctx;
        self.deleter = Some(deleter);
    }
}

impl Managed for DLManagedTensorVersioned {
    const NAME: &'static CStr = c"dltensor_versioned";
    fn new(dl_tensor: DLTensor, flags: u64) -> Self {
        DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: None,
            flags,
            dl_tensor,
        }
    }
    fn set_owner(&mut self, ctx: *mut c_void, deleter: unsafe extern "C" fn(*mut Self)) {
        self.manager_ctx = ctx;
        self.deleter = Some(deleter);
    }
}

/// The managed tensor and the array it describes, in one allocation. The managed struct comes
/// first (`repr(C)`), so a pointer to it is a pointer to the holder.
#[repr(C)]
struct Holder<M> {
    managed: M,
    /// What the `DLTensor`'s data and shape point into.
    _array: NdArray,
}

/// The deleter DLPack's consumer (or the capsule, when none took it) calls: frees the holder
/// and with it this reference to the array.
///
/// # Safety
/// `managed` is null or a pointer [`capsule`] made (the first field of a boxed `Holder<M>`),
/// not deleted before.
unsafe extern "C" fn delete<M>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    // SAFETY: per the contract `managed` is the start of a `Holder<M>` that `capsule` leaked
    // from a `Box` and that nothing freed yet; `Holder` is `repr(C)` with `managed` first.
    let holder = unsafe { Box::from_raw(managed.cast::<Holder<M>>()) };
    // Dropping an array does not panic; should a storage's release do so, no unwinding
    // crosses into the consumer's C code.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(holder)));
}

/// The capsule's destructor: frees the tensor unless a consumer took it (renamed the capsule,
/// taking over the call of the deleter).
///
/// # Safety
/// Called by CPython, with the GIL, on a capsule [`capsule`] made with this destructor.
unsafe extern "C" fn capsule_destructor<M: Managed>(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule object (CPython calls its destructor while freeing
    // it, holding the GIL); `PyCapsule_IsValid` only compares its name and sets no error.
    if unsafe { ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) } != 1 {
        return;
    }
    // SAFETY: as above; the name was just checked, so this succeeds and sets no error.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()) }.cast::<M>();
    // SAFETY: the capsule still has its first name, so no consumer took the tensor: this is
    // the pointer `capsule` stored, not deleted.
    unsafe { delete::<M>(managed) }
}

/// A DLPack capsule over `array`'s memory: `"dltensor_versioned"` with `flags` when
/// `versioned`, else `"dltensor"` (which cannot carry the flags: the caller does not give it a
/// read-only array). The capsule (or its consumer) holds `array` until the deleter runs.
pub(crate) fn capsule(py: Python<'_>, array: NdArray, versioned: bool, flags: u64) -> PyResult<Bound<'_, PyAny>> {
    if versioned {
        make::<DLManagedTensorVersioned>(py, array, flags)
    } else {
        make::<DLManagedTensor>(py, array, flags)
    }
}

fn make<M: Managed>(py: Python<'_>, array: NdArray, flags: u64) -> PyResult<Bound<'_, PyAny>> {
    // The DLTensor points into the array's storage and its shape (an `Arc`, which stays put
    // when the array moves into the holder).
    let tensor = array.dl_tensor();
    let holder = Box::into_raw(Box::new(Holder { managed: M::new(tensor, flags), _array: array }));
    // SAFETY: `holder` comes from `Box::into_raw` just above: valid, aligned and not shared.
    let managed = unsafe { &mut (*holder).managed };
    managed.set_owner(holder.cast(), delete::<M>);
    let pointer: *mut M = managed;
    // SAFETY: `pointer` is non-null and stays valid until the deleter runs; the name is a
    // static C string (CPython keeps the pointer, not a copy); the destructor matches what
    // the capsule holds. The GIL is held (`py`).
    let object = unsafe { ffi::PyCapsule_New(pointer.cast(), M::NAME.as_ptr(), Some(capsule_destructor::<M>)) };
    if object.is_null() {
        // SAFETY: no capsule was made, so nothing else holds `pointer`: it is deleted once.
        unsafe { delete::<M>(pointer) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `PyCapsule_New` returned a new, non-null reference, which the `Bound` owns.
    Ok(unsafe { Bound::from_owned_ptr(py, object) })
}

/// The bytes of a one-dimensional, C-contiguous numpy `uint8` array, read in place and kept
/// alive with it: the data of a parameter tensor. (PyO3's buffer protocol support needs the
/// stable ABI of Python 3.11; this package targets 3.9, so numpy's array interface is used.)
pub(crate) struct ArrayBytes {
    _owner: Py<PyAny>,
    addr: usize,
    len: usize,
}

impl ArrayBytes {
    /// Reads the array interface of `array` and checks it describes `len` contiguous bytes.
    pub(crate) fn new(array: &Bound<'_, PyAny>, what: &str) -> PyResult<ArrayBytes> {
        let bad = |why: &str| {
            crate::InputError::new_err(format!("{what}: {why} (expected a 1-d contiguous uint8 numpy array)"))
        };
        let iface = array.getattr("__array_interface__").map_err(|_| bad("no __array_interface__"))?;
        let typestr: String = iface.get_item("typestr")?.extract()?;
        let shape: Vec<usize> = iface.get_item("shape")?.extract()?;
        let strides = iface.get_item("strides").ok().filter(|s| !s.is_none());
        let (addr, _readonly): (usize, bool) = iface.get_item("data")?.extract()?;
        if typestr != "|u1" || shape.len() != 1 || strides.is_some() {
            return Err(bad(&format!("typestr {typestr}, shape {shape:?}")));
        }
        if addr == 0 && shape[0] != 0 {
            return Err(bad("null data"));
        }
        Ok(ArrayBytes { _owner: array.clone().unbind(), addr, len: shape[0] })
    }
}

impl AsRef<[u8]> for ArrayBytes {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ArrayBytes::new` took `addr` and `len` from the array interface of a
        // C-contiguous one-dimensional `uint8` numpy array (strides None), which numpy keeps
        // valid and in place while the array lives, and `_owner` holds a reference to it for as
        // long as this view exists. The arrays are the model's parameters, which nothing
        // writes to during `export_library`.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}
