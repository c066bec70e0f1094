//! Running what is loaded: both calling conventions on every TVM version's library, the
//! context functions, the thread pool, and the graph and AOT executors against TVM's outputs.
#![allow(unsafe_code)]

use std::path::Path;

use mblob_runtime::ffi::workspace::AlignedBuffer;
use mblob_runtime::ffi::{Abi, Value};
use mblob_runtime::packed::{DLDataType, DLDevice, DLTensor};
use mblob_runtime::{load_library, LoadOptions, LoadedTree, Registry};

use crate::goldens::{f32_file, goldens};

fn load(path: &Path) -> LoadedTree {
    // SAFETY: TVM's own exports of tiny models (the goldens), trusted to run.
    unsafe { load_library(path, &Registry::default(), &LoadOptions::keep_unknown()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A 64-byte aligned f32 tensor for kernels.
struct Buf {
    data: AlignedBuffer,
    shape: Vec<i64>,
}

impl Buf {
    fn f32(values: &[f32], shape: &[i64]) -> Buf {
        let mut data = AlignedBuffer::zeroed(values.len() * 4).unwrap();
        for (c, v) in data.as_mut_slice().chunks_exact_mut(4).zip(values) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        Buf { data, shape: shape.to_vec() }
    }
    fn dl(&mut self, code: u8) -> DLTensor {
        DLTensor {
            data: self.data.as_ptr().cast(),
            device: DLDevice { device_type: 1, device_id: 0 },
            ndim: self.shape.len() as i32,
            dtype: DLDataType { code, bits: 32, lanes: 1 },
            shape: self.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
    fn to_f32(&self) -> Vec<f32> {
        self.data.as_slice().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

/// `add` of relax_add_mul on every TVM version's library: found by its plain name (0.22+ has
/// only `__tvm_ffi_add`), called in the library's own convention, and `2 * (x + y)` is TVM's
/// output for the whole program (`multiply` by 2 is exact).
#[test]
fn add_is_found_and_called_on_every_version() {
    let root = goldens();
    for (dir, abi) in [
        ("", Abi::Packed),
        ("other_versions/tvm-0.19.0", Abi::Packed),
        ("other_versions/tvm-0.21.0", Abi::Ffi),
        ("other_versions/tvm-0.27.0.post1", Abi::Ffi),
    ] {
        let dir = root.join(dir);
        let tree = load(&dir.join("relax_add_mul.so"));
        assert!(tree.get_function("add").is_some(), "{}: get_function(add)", dir.display());
        let f = tree.packed_function("add").unwrap();
        assert_eq!(f.abi(), Some(abi), "{}", dir.display());
        let mut x = Buf::f32(&f32_file(&dir.join("relax_add_mul.in.x.f32")), &[2, 3]);
        let mut y = Buf::f32(&f32_file(&dir.join("relax_add_mul.in.y.f32")), &[2, 3]);
        let mut out = Buf::f32(&[0.0; 6], &[2, 3]);
        let mut args = [x.dl(2), y.dl(2), out.dl(2)];
        // SAFETY: `add` takes three float32 [2, 3] tensors; the buffers are aligned and live.
        unsafe { f.call_tensors(&mut args) }.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let want: Vec<f32> = f32_file(&dir.join("relax_add_mul.out.0.f32")).iter().map(|v| v / 2.0).collect();
        assert_eq!(out.to_f32(), want, "{}", dir.display());

        // Argument errors come back as errors, in every convention (on 0.27 through
        // TVMFFIErrorSetRaisedFromCStrParts, which the shim provides).
        // SAFETY: the function checks the argument count before touching any argument.
        let err = unsafe { f.call_tensors(&mut args[..1]) }.unwrap_err();
        assert!(err.message.contains("num_args") || err.message.contains("argument"), "{}: {err}", dir.display());
        let mut bad = [x.dl(0), y.dl(2), out.dl(2)];
        // SAFETY: a wrong dtype is checked before the data is read.
        let err = unsafe { f.call_tensors(&mut bad) }.unwrap_err();
        assert!(err.message.contains("dtype") || err.message.contains("float32"), "{}: {err}", dir.display());
        // Scalars where a tensor is expected are refused too, not read as pointers.
        // SAFETY: the type code/index is checked before the value is used.
        let err = unsafe { f.call(&[Value::Int(1), Value::Float(2.0), Value::None]) }.unwrap_err();
        assert!(!err.message.is_empty(), "{}", dir.display());
    }
}
