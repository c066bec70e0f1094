//! The Relax VM's FFI edge: 64-byte-aligned tensor memory, and calls of compiled kernels in
//! TVM's classic packed convention (TVM 0.8 to 0.20) and tvm-ffi's safe-call convention (0.21
//! and later).
//!
//! Kernels assume 64-byte-aligned data without checking it (`llvm.assume`), so every buffer
//! the VM hands them comes from [`Buffer`].
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::exec::tensor_bytes;
use crate::ffi::callconv::{invoke_classic, invoke_ffi, Abi, TVMFFIAny, TVMValue};
use crate::ffi::packed::{DLDataType, DLDevice, DLTensor};
use crate::format::stream::DataType;
use crate::module::Symbol;

/// Alignment of every buffer (TVM's `kAllocAlignment`).
pub(crate) const ALIGN: usize = 64;

/// A 64-byte-aligned block of host memory: zero-initialised when new, or a block of the same
/// size reused from a [`Pool`] (holding what its last user wrote).
pub(crate) struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Where the block goes when the buffer is dropped (freed when `None`).
    pool: Option<Arc<Pool>>,
}

/// Blocks of freed buffers, by size, for the next allocation of the same size (the VM's
/// storages have the same sizes on every run, as TVM's pooled allocator exploits).
#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<Vec<(usize, Vec<Block>)>>,
}

/// An owned, unused block of `Buffer::layout(len)`.
struct Block(NonNull<u8>);

// SAFETY: a `Block` is exclusively owned memory that nothing else references.
unsafe impl Send for Block {}

impl Pool {
    fn take(&self, len: usize) -> Option<NonNull<u8>> {
        let mut free = self.free.lock().ok()?;
        free.iter_mut().find(|(l, _)| *l == len)?.1.pop().map(|b| b.0)
    }

    fn put(&self, ptr: NonNull<u8>, len: usize) -> Result<(), NonNull<u8>> {
        match self.free.lock() {
            Ok(mut free) => {
                match free.iter_mut().find(|(l, _)| *l == len) {
                    Some((_, blocks)) => blocks.push(Block(ptr)),
                    None => free.push((len, vec![Block(ptr)])),
                }
                Ok(())
            }
            Err(_) => Err(ptr),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let free = match self.free.get_mut() {
            Ok(f) => std::mem::take(f),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        for (len, blocks) in free {
            if let Some(layout) = Buffer::layout(len) {
                for b in blocks {
                    // SAFETY: every block was allocated by `Buffer::zeroed` with this layout
                    // and is owned by the pool alone.
                    unsafe { alloc::dealloc(b.0.as_ptr(), layout) };
                }
            }
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

// SAFETY: a `Buffer` owns its block exclusively (like a `Box<[u8]>`); the VM writes to it only
// through kernels it calls from the thread that runs `VirtualMachine::invoke(&mut self)`, and
// reads it with `read` only between those calls.
unsafe impl Send for Buffer {}
// SAFETY: as above; shared references only copy bytes out or hand out the address.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes)", self.len)
    }
}

impl Buffer {
    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len.max(1), ALIGN).ok()
    }

    /// `len` zero bytes, or `None` when the allocation fails.
    pub(crate) fn zeroed(len: usize) -> Option<Buffer> {
        let layout = Buffer::layout(len)?;
        // SAFETY: `layout` has a non-zero size; the block is freed in `drop` with the same layout.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| Buffer { ptr, len, pool: None })
    }

    /// `len` bytes from `pool` (a block of that size freed earlier, with its old contents), or
    /// new zeroed memory; returned to `pool` when dropped.
    pub(crate) fn pooled(len: usize, pool: &Arc<Pool>) -> Option<Buffer> {
        let mut b = match pool.take(len) {
            Some(ptr) => Buffer { ptr, len, pool: None },
            None => Buffer::zeroed(len)?,
        };
        b.pool = Some(pool.clone());
        Some(b)
    }

    /// A copy of `bytes`.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Buffer> {
        let b = Buffer::zeroed(bytes.len())?;
        b.write(0, bytes).then_some(b)
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of byte `offset` (at most `len`).
    pub(crate) fn addr(&self, offset: usize) -> *mut u8 {
        // `wrapping_add` keeps this safe; callers only pass offsets within the block.
        self.ptr.as_ptr().wrapping_add(offset.min(self.len))
    }

    /// A copy of `len` bytes from `offset`, or `None` past the end.
    pub(crate) fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `offset..end` lies within the block, which is initialised (zeroed on
        // allocation) and not being written: no kernel runs while the VM reads.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }.to_vec())
    }

    /// Copies `bytes` to `offset`; false past the end.
    pub(crate) fn write(&self, offset: usize, bytes: &[u8]) -> bool {
        let Some(end) = offset.checked_add(bytes.len()) else { return false };
        if end > self.len {
            return false;
        }
        // SAFETY: the destination lies within the block and cannot overlap `bytes`, which is
        // borrowed from elsewhere (no `&[u8]` into a `Buffer` is ever handed out).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(offset), bytes.len()) };
        true
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let ptr = match self.pool.take() {
            Some(pool) => match pool.put(self.ptr, self.len) {
                Ok(()) => return,
                Err(ptr) => ptr,
            },
            None => self.ptr,
        };
        if let Some(layout) = Buffer::layout(self.len) {
            // SAFETY: allocated in `zeroed` with this very layout; freed once, here or (for
            // a pooled block) by the pool.
            unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
        }
    }
}

/// One argument of a kernel call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CallArg<'a> {
    /// A CPU tensor: a view of `buf` from byte `offset`.
    Tensor {
        /// The memory.
        buf: &'a Buffer,
        /// Byte offset of the first element in `buf`.
        offset: usize,
        /// The extents.
        shape: &'a [i64],
        /// Element type.
        dtype: DataType,
    },
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Null / None.
    Null,
}

/// Why a kernel call failed.
#[derive(Debug)]
pub(crate) enum CallFailure {
    /// Argument `index` is a tensor view that does not fit in its buffer.
    View(usize),
    /// The kernel returned `code` and reported `message`.
    Kernel(i32, String),
}

/// Calls a compiled kernel of a loaded library with `convention`'s signature.
///
/// Each tensor view is checked to lie within its buffer first, so the kernel is given only
/// live memory of the size the shape and dtype say. That the symbol is a kernel with this
/// signature is what the library's TVM version promises (the trust taken when the library was
/// opened with the `unsafe` [`crate::load_library`]).
pub(crate) fn call(f: &Symbol, convention: Abi, args: &[CallArg<'_>]) -> Result<(), CallFailure> {
    for (i, a) in args.iter().enumerate() {
        if let CallArg::Tensor { buf, offset, shape, dtype } = *a {
            let fits = tensor_bytes(dtype, shape)
                .and_then(|n| n.checked_add(offset as u64))
                .is_some_and(|end| end <= buf.len() as u64);
            if !fits || i32::try_from(shape.len()).is_err() {
                return Err(CallFailure::View(i));
            }
        }
    }
    // The DLTensors first, in a vector that is not resized afterwards, so that their addresses
    // stay valid for the call.
    let mut tensors: SmallVec<[DLTensor; 4]> = args
        .iter()
        .filter_map(|a| match *a {
            CallArg::Tensor { buf, offset, shape, dtype } => Some(DLTensor {
                data: buf.addr(offset).cast(),
                device: DLDevice { device_type: 1, device_id: 0 },
                ndim: shape.len() as i32,
                dtype: DLDataType::from(dtype),
                shape: shape.as_ptr().cast_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            }),
            _ => None,
        })
        .collect();
    let mut next_tensor = tensors.iter_mut().map(|t| (t as *mut DLTensor).cast::<c_void>());
    let called = match convention {
        Abi::Packed => {
            let mut values: SmallVec<[TVMValue; 4]> = SmallVec::with_capacity(args.len());
            let mut codes: SmallVec<[c_int; 4]> = SmallVec::with_capacity(args.len());
            for a in args {
                let (v, c) = match *a {
                    CallArg::Tensor { .. } => {
                        (TVMValue { v_handle: next_tensor.next().unwrap_or(std::ptr::null_mut()) }, 7)
                    }
                    CallArg::Int(v) => (TVMValue { v_int64: v }, 0),
                    CallArg::Float(v) => (TVMValue { v_float64: v }, 2),
                    CallArg::Null => (TVMValue { v_handle: std::ptr::null_mut() }, 4),
                };
                values.push(v);
                codes.push(c);
            }
            // SAFETY: the symbol has the packed signature (see above); the tensors were checked
            // to fit their buffers, which `args` borrows; the argument arrays and the DLTensors
            // they point to live until the call returns. Kernels never write the shapes.
            unsafe { invoke_classic(f.addr(), std::ptr::null_mut(), &mut values, &mut codes) }.map(|_| ())
        }
        Abi::Ffi => {
            let any = |type_index: i32, value: u64| TVMFFIAny {
                type_index,
                small_len: 0,
                value: TVMValue { v_int64: value as i64 },
            };
            let values: SmallVec<[TVMFFIAny; 4]> = args
                .iter()
                .map(|a| match *a {
                    CallArg::Tensor { .. } => any(7, next_tensor.next().map_or(0, |p| p as u64)),
                    CallArg::Int(v) => any(1, v as u64),
                    CallArg::Float(v) => any(3, v.to_bits()),
                    CallArg::Null => any(0, 0),
                })
                .collect();
            // SAFETY: as above, with tvm-ffi's safe-call signature; `self` is unused by
            // compiled kernels and passed as null (kernels in destination-passing style return
            // None).
            unsafe { invoke_ffi(f.addr(), std::ptr::null_mut(), &values) }.map(|_| ())
        }
    };
    drop(next_tensor);
    drop(tensors);
    called.map_err(|e| CallFailure::Kernel(e.code, e.message))
}
