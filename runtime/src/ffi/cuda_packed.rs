//! Packed arguments of a CUDA kernel launched by host code.
//!
//! TVM's host code launches a device kernel by looking it up through `GetFuncFromEnv` and
//! calling it with `TVMFuncCall`: first the kernel's arguments (buffers as device pointers,
//! type code 3, or null (4); scalars as int or float), as many as the function table's
//! `arg_types`, then the launch extents as ints (the `launch_param_tags` order, then the
//! dynamic shared memory). [`kernel_args`] turns that list into a [`KernelArg`] list and the
//! extents that [`crate::ffi::cuda::CudaModule::launch`] takes.

use crate::ffi::cuda::KernelArg;
use crate::ffi::Value;
use crate::format::stream::DataType;

/// Splits packed arguments into kernel arguments (typed by `types`) and launch extents.
pub fn kernel_args(types: &[DataType], args: &[Value]) -> Result<(Vec<KernelArg<'static>>, Vec<u64>), String> {
    if args.len() < types.len() {
        return Err(format!(
            "the kernel takes {} arguments and its launch extents, {} values given",
            types.len(),
            args.len()
        ));
    }
    let (kernel, rest) = args.split_at(types.len());
    let mut out = Vec::with_capacity(kernel.len());
    for (i, (t, a)) in types.iter().zip(kernel).enumerate() {
        let arg = match (t.to_string().as_str(), a) {
            ("handle", Value::Handle(p)) => KernelArg::DevicePtr(*p as u64),
            ("handle", Value::None) => KernelArg::DevicePtr(0),
            ("int32", Value::Int(v)) => {
                KernelArg::I32(i32::try_from(*v).map_err(|_| format!("argument {i}: {v} is not an int32"))?)
            }
            ("uint32", Value::Int(v)) => {
                KernelArg::U32(u32::try_from(*v).map_err(|_| format!("argument {i}: {v} is not a uint32"))?)
            }
            ("int64", Value::Int(v)) => KernelArg::I64(*v),
            ("float32", Value::Float(v)) => KernelArg::F32(*v as f32),
            ("float64", Value::Float(v)) => KernelArg::F64(*v),
            (t, a) => return Err(format!("argument {i}: a {t} parameter cannot take {a:?}")),
        };
        out.push(arg);
    }
    let extents = rest
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Value::Int(v) if *v >= 0 => Ok(*v as u64),
            other => Err(format!("launch extent {i}: {other:?} is not a non-negative int")),
        })
        .collect::<Result<_, _>>()?;
    Ok((out, extents))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_scalars_then_extents() {
        let h = DataType::HANDLE;
        let types = [h, h, DataType::I32];
        let args = [Value::Handle(0x1000 as *mut _), Value::None, Value::Int(7), Value::Int(4), Value::Int(256)];
        let (k, e) = kernel_args(&types, &args).unwrap();
        assert!(matches!(k[..], [KernelArg::DevicePtr(0x1000), KernelArg::DevicePtr(0), KernelArg::I32(7)]));
        assert_eq!(e, [4, 256]);
        assert!(kernel_args(&types, &args[..2]).unwrap_err().contains("takes 3 arguments"));
        let bad = [Value::Float(1.0), Value::None, Value::Int(7)];
        assert!(kernel_args(&types, &bad).unwrap_err().contains("argument 0"));
        let neg = [Value::None, Value::None, Value::Int(1), Value::Int(-1)];
        assert!(kernel_args(&types, &neg).unwrap_err().contains("launch extent 0"));
    }
}
