//! What the VMs check of a program's pointers, sizes and offsets, as TVM does, so that a bad
//! executable gets TVM's error instead of a kernel reading or writing where it should not.
//!
//! - `vm.builtin.alloc_tensor` (Relax) and `AllocTensor` (Relay VM) at a non-zero byte offset
//!   of a storage: TVM makes the tensor as the storage's pointer plus a `DLTensor.byte_offset`
//!   (`StorageObj::AllocTensor`), and the kernels TVM compiles check that offset against their
//!   buffers' (0 unless a buffer says otherwise), failing with their own message (TVM 0.27:
//!   `ValueError: Invalid a.byte_offset on argument #0 when calling: ... expected 0`). mblob
//!   passes such tensors to kernels the same way ([`kernel_dl_tensor`]), so the kernel refuses
//!   them as under TVM; before, it got a pointer into the middle of the storage (not 64-byte
//!   aligned for most offsets, which TVM's kernels assume: a crash).

use super::vm::VmError;

/// A tensor of `needed` bytes (`None`: a size that overflows) at `offset` does not fit the
/// storage of `size` bytes the program planned: TVM's check (`StorageObj::AllocTensor`), which
/// inputs over the upper bounds the program was built for fail (a batch over its maximum, a
/// longer sequence), an input error.
pub(crate) fn alloc_tensor_overrun(needed: Option<u64>, offset: i64, size: usize) -> VmError {
    let needed = needed.map_or_else(|| "too many".to_owned(), |n| n.to_string());
    VmError::InputBound {
        kind: "InternalError",
        message: format!(
            "Check failed: (offset + needed_size <= this->buffer.size) is false: storage allocation failure, attempted \
             to allocate {needed} at offset {offset} in region that is {size}bytes"
        ),
    }
}
