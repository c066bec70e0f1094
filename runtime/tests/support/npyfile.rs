//! `.npy` files (TVM's inputs and outputs of the fixtures) as tensors.

#![allow(dead_code)]

use std::path::Path;

use mblob_runtime::format::DataType;
use mblob_runtime::payload::graph::Tensor;

/// tvm-ffi's `kDLBool` (TVM 0.22+): one byte per element.
pub const KDL_BOOL: DataType = DataType { code: 6, bits: 8, lanes: 1 };

/// TVM 0.19's name for bool, `uint1` (one byte per element too).
pub const UINT1: DataType = DataType { code: 1, bits: 1, lanes: 1 };

/// A C-order, little-endian (or byte-order-free) `.npy` file as a tensor, its bytes as they
/// are: the header through npyz, the dtype from its `i`/`u`/`f` code and size, bool (`|b1`)
/// as tvm-ffi's `kDLBool`.
pub fn tensor(path: &Path) -> Tensor {
    tensor_bool_as(path, KDL_BOOL)
}

/// [`tensor`], with bool elements as `bool_dtype`.
pub fn tensor_bool_as(path: &Path, bool_dtype: DataType) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(f.order(), npyz::Order::C, "{}", path.display());
    let shape: Vec<i64> = f.shape().iter().map(|&d| d as i64).collect();
    let npyz::DType::Plain(ts) = f.dtype() else { panic!("{}: structured", path.display()) };
    let ts = ts.to_string();
    assert!(ts.starts_with('<') || ts.starts_with('|'), "{}: byte order of {ts}", path.display());
    let dtype = match &ts[1..] {
        "b1" => bool_dtype,
        t => {
            let code = match &t[..1] {
                "i" => 0,
                "u" => 1,
                "f" => 2,
                _ => panic!("{}: dtype {ts}", path.display()),
            };
            DataType { code, bits: t[1..].parse::<u8>().unwrap() * 8, lanes: 1 }
        }
    };
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut f.into_inner(), &mut data).unwrap();
    Tensor::new(dtype, shape, data).unwrap_or_else(|| panic!("{}", path.display()))
}
