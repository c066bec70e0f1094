//! The constant-pool tags of TVM 0.21 and later (`relax.VMExecutable`): tvm-ffi type indices.
//!
//! From 0.21 on, each constant is tagged with the tvm-ffi type index of its value. The POD
//! indices are stable (`int` 1, `float` 3, `DLDataType` 5, `String` 65), but the static object
//! indices moved when tvm-ffi left TVM's tree:
//!
//! | version | blob layout | shape | tensor |
//! |---|---|---|---|
//! | 0.21 (`ffi/include/tvm/ffi/c_api.h` in TVM) | [`Classic021`](crate::Layout::Classic021) | 71 | 72 |
//! | 0.22+ (the tvm-ffi package) | [`Ffi`](crate::Layout::Ffi) | 69 | 70 |
//!
//! TVM 0.23 and later also write the magic `0xD225DE2F4214151E` and, after the function
//! table, a memory-scope section (`u64 count`, then `i64 constant index, str scope` each);
//! with the older magic `...151D` that section is absent.

use super::const_kind::ConstKind;

/// Which tvm-ffi numbering of the object type indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numbering {
    /// TVM 0.21's in-tree tvm-ffi.
    InTree,
    /// The tvm-ffi package (TVM 0.22 and later).
    Package,
}

const INT: i32 = 1;
const FLOAT: i32 = 3;
const DATA_TYPE: i32 = 5;
const STR: i32 = 65;

fn shape_tensor(n: Numbering) -> (i32, i32) {
    match n {
        Numbering::InTree => (71, 72),
        Numbering::Package => (69, 70),
    }
}

/// The kind a tag names.
pub(crate) fn kind(n: Numbering, tag: i32) -> Option<ConstKind> {
    let (shape, tensor) = shape_tensor(n);
    Some(match tag {
        INT => ConstKind::Int,
        FLOAT => ConstKind::Float,
        DATA_TYPE => ConstKind::DataType,
        STR => ConstKind::Str,
        t if t == shape => ConstKind::Shape,
        t if t == tensor => ConstKind::Tensor,
        _ => return None,
    })
}

/// The tag of a kind.
pub(crate) fn tag(n: Numbering, kind: ConstKind) -> i32 {
    let (shape, tensor) = shape_tensor(n);
    match kind {
        ConstKind::Int => INT,
        ConstKind::Float => FLOAT,
        ConstKind::DataType => DATA_TYPE,
        ConstKind::Str => STR,
        ConstKind::Shape => shape,
        ConstKind::Tensor => tensor,
    }
}
