//! TVM's `tvm.contrib.sort.*` as global functions on `DLTensor`s (feature `ops`):
//! [`crate::ops::sort`] on the arguments compiled code passes.

use std::collections::HashMap;

use crate::ffi::call::PackedFunction;
use crate::ffi::dlpack::DLTensor;
use crate::ffi::value::Value;
use crate::format::DataType;
use crate::ops::{self, elem_bytes, numel, sort::TopkOut, View, ViewMut};

/// Adds the functions to the global table `m`.
pub(super) fn register(m: &mut HashMap<String, PackedFunction>) {
    m.insert("tvm.contrib.sort.sort".to_owned(), PackedFunction::from_fn(sort));
    m.insert("tvm.contrib.sort.argsort".to_owned(), PackedFunction::from_fn(argsort));
    m.insert("tvm.contrib.sort.argsort_nms".to_owned(), PackedFunction::from_fn(argsort_nms));
    m.insert("tvm.contrib.sort.topk".to_owned(), PackedFunction::from_fn(topk));
}

/// A tensor argument: its dtype, shape and the byte range of its elements.
struct Arg {
    dtype: DataType,
    shape: Vec<i64>,
    data: *mut u8,
    len: usize,
}

/// Reads tensor argument `i` of `function`.
fn tensor(function: &str, args: &[Value], i: usize) -> Result<Arg, String> {
    let t = match args.get(i) {
        Some(Value::Tensor(t)) if !t.is_null() => *t,
        Some(v) => return Err(format!("{function}: argument {i} must be a tensor, got {v:?}")),
        None => return Err(format!("{function}: argument {i} is missing ({} given)", args.len())),
    };
    // SAFETY: compiled code (or the VM) passes a `DLTensor*` that is valid for the call, with
    // `ndim` extents (and strides, when not null) behind its pointers: TVM's own runtime reads
    // the same fields the same way.
    let t: &DLTensor = unsafe { &*t };
    if t.device.device_type != 1 {
        return Err(format!(
            "{function}: argument {i} is on device type {}; mblob runs this function on the CPU only",
            t.device.device_type
        ));
    }
    let ndim = usize::try_from(t.ndim).map_err(|_| format!("{function}: argument {i} has ndim {}", t.ndim))?;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else if t.shape.is_null() {
        return Err(format!("{function}: argument {i} has no shape"));
    } else {
        // SAFETY: as above, `ndim` extents.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: as above, `ndim` strides.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expect = 1i64;
        for d in (0..ndim).rev() {
            if shape[d] != 1 && strides[d] != expect {
                return Err(format!("{function}: argument {i} is not compact (strides {strides:?}, shape {shape:?})"));
            }
            expect = expect.saturating_mul(shape[d]);
        }
    }
    let dtype = DataType { code: t.dtype.code, bits: t.dtype.bits, lanes: t.dtype.lanes };
    let n = numel(&shape).ok_or_else(|| format!("{function}: argument {i} has shape {shape:?}"))?;
    let size =
        elem_bytes(dtype).ok_or_else(|| format!("{function}: Unsupported input dtype: {}", ops::dtype_name(dtype)))?;
    let len = n
        .checked_mul(size)
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or_else(|| format!("{function}: argument {i} is too large"))?;
    if t.data.is_null() && len > 0 {
        return Err(format!("{function}: argument {i} has no data"));
    }
    let data = if len == 0 {
        std::ptr::NonNull::<u8>::dangling().as_ptr()
    } else {
        // SAFETY: `byte_offset` is within the allocation `data` starts, per DLPack.
        unsafe { t.data.cast::<u8>().add(t.byte_offset as usize) }
    };
    Ok(Arg { dtype, shape, data, len })
}

impl Arg {
    /// A copy of the elements (inputs are read from a copy, so that they cannot alias an
    /// output).
    fn bytes(&self) -> Vec<u8> {
        // SAFETY: `tensor` checked the pointer and computed `len` from the tensor's shape and
        // dtype: the caller's tensor holds that many bytes, alive during the call.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }.to_vec()
    }

    /// The elements, to write.
    ///
    /// # Safety
    ///
    /// No other live slice may cover the same bytes.
    unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; exclusivity per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }

    fn overlaps(&self, other: &Arg) -> bool {
        let (a, b) = (self.data as usize, other.data as usize);
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }
}

fn int(function: &str, args: &[Value], i: usize) -> Result<i64, String> {
    match args.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        Some(v) => Err(format!("{function}: argument {i} must be an integer, got {v:?}")),
        None => Err(format!("{function}: argument {i} is missing ({} given)", args.len())),
    }
}

fn count(function: &str, args: &[Value], n: usize) -> Result<(), String> {
    if args.len() != n {
        return Err(format!("{function}: takes {n} arguments, got {}", args.len()));
    }
    Ok(())
}

fn sort(args: &[Value]) -> Result<Value, String> {
    sort_into("tvm.contrib.sort.sort", args, ops::sort::sort)
}

fn argsort(args: &[Value]) -> Result<Value, String> {
    sort_into("tvm.contrib.sort.argsort", args, ops::sort::argsort)
}

/// `sort` and `argsort`: `(input, output, axis, is_ascend)`, the result written into `output`.
fn sort_into(
    f: &str,
    args: &[Value],
    op: fn(View<'_>, ViewMut<'_>, i64, bool) -> Result<(), ops::OpError>,
) -> Result<Value, String> {
    count(f, args, 4)?;
    let input = tensor(f, args, 0)?;
    let mut output = tensor(f, args, 1)?;
    let (axis, asc) = (int(f, args, 2)?, int(f, args, 3)? != 0);
    let data = input.bytes();
    let view = View { dtype: input.dtype, shape: &input.shape, data: &data };
    // SAFETY: the only slice of the output's bytes (the input was copied).
    let out = ViewMut { dtype: output.dtype, shape: &output.shape.clone(), data: unsafe { output.bytes_mut() } };
    op(view, out, axis, asc).map_err(|e| e.to_string())?;
    Ok(Value::None)
}

fn argsort_nms(args: &[Value]) -> Result<Value, String> {
    const F: &str = "tvm.contrib.sort.argsort_nms";
    count(F, args, 5)?;
    let input = tensor(F, args, 0)?;
    let sort_num = tensor(F, args, 1)?;
    let mut output = tensor(F, args, 2)?;
    let (axis, asc) = (int(F, args, 3)?, int(F, args, 4)? != 0);
    let (data, nums) = (input.bytes(), sort_num.bytes());
    let view = View { dtype: input.dtype, shape: &input.shape, data: &data };
    let nums = View { dtype: sort_num.dtype, shape: &sort_num.shape, data: &nums };
    // SAFETY: as in `sort`.
    let out = ViewMut { dtype: output.dtype, shape: &output.shape.clone(), data: unsafe { output.bytes_mut() } };
    ops::sort::argsort_nms(view, nums, out, axis, asc).map_err(|e| e.to_string())?;
    Ok(Value::None)
}

fn topk(args: &[Value]) -> Result<Value, String> {
    const F: &str = "tvm.contrib.sort.topk";
    if args.len() < 6 {
        return Err(format!("{F}: takes 6 or 7 arguments, got {}", args.len()));
    }
    let n = args.len();
    let k = int(F, args, n - 4)?;
    let axis = int(F, args, n - 3)?;
    let ret_type = match &args[n - 2] {
        Value::Str(s) => s.clone(),
        v => return Err(format!("{F}: argument {} (ret_type) must be a string, got {v:?}", n - 2)),
    };
    let asc = int(F, args, n - 1)? != 0;
    let want = if ret_type == "both" { 7 } else { 6 };
    if !matches!(ret_type.as_str(), "both" | "values" | "indices") {
        return Err(ops::OpError::RetType { ret_type }.to_string());
    }
    count(F, args, want)?;
    let input = tensor(F, args, 0)?;
    let data = input.bytes();
    let view = View { dtype: input.dtype, shape: &input.shape, data: &data };
    let mut first = tensor(F, args, 1)?;
    let first_shape = first.shape.clone();
    let result = if ret_type == "both" {
        let mut second = tensor(F, args, 2)?;
        if first.overlaps(&second) {
            return Err(format!("{F}: the values and indices outputs overlap"));
        }
        let second_shape = second.shape.clone();
        let (first_dtype, second_dtype) = (first.dtype, second.dtype);
        // SAFETY: two disjoint outputs (checked above), each the only slice of its bytes.
        let (v, i) = unsafe { (first.bytes_mut(), second.bytes_mut()) };
        ops::sort::topk(
            view,
            TopkOut::Both(
                ViewMut { dtype: first_dtype, shape: &first_shape, data: v },
                ViewMut { dtype: second_dtype, shape: &second_shape, data: i },
            ),
            k,
            axis,
            asc,
        )
    } else {
        let first_dtype = first.dtype;
        // SAFETY: as in `sort`.
        let out = ViewMut { dtype: first_dtype, shape: &first_shape, data: unsafe { first.bytes_mut() } };
        let out = if ret_type == "values" { TopkOut::Values(out) } else { TopkOut::Indices(out) };
        ops::sort::topk(view, out, k, axis, asc)
    };
    result.map_err(|e| e.to_string())?;
    Ok(Value::None)
}
