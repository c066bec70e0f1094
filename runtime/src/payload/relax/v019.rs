//! The constant-pool tags of TVM 0.19 and 0.20 (`relax.Executable`, and `relax.VMExecutable`
//! in 0.20), blob layout [`Classic`](crate::Layout::Classic).
//!
//! TVM numbered its own constant kinds in these versions (`ConstantType` in
//! `src/runtime/relax_vm/executable.cc`):
//!
//! ```text
//! 0 tensor   1 data type   2 shape tuple   3 string   4 int64   5 float64
//! ```

use super::const_kind::ConstKind;

/// The kind a tag names.
pub(crate) fn kind(tag: i32) -> Option<ConstKind> {
    Some(match tag {
        0 => ConstKind::Tensor,
        1 => ConstKind::DataType,
        2 => ConstKind::Shape,
        3 => ConstKind::Str,
        4 => ConstKind::Int,
        5 => ConstKind::Float,
        _ => return None,
    })
}

/// The tag of a kind.
pub(crate) fn tag(kind: ConstKind) -> i32 {
    match kind {
        ConstKind::Tensor => 0,
        ConstKind::DataType => 1,
        ConstKind::Shape => 2,
        ConstKind::Str => 3,
        ConstKind::Int => 4,
        ConstKind::Float => 5,
    }
}
