//! Packed arguments of a CUDA kernel launched by host code.
//!
//! TVM's host code launches a device kernel by looking it up through `GetFuncFromEnv` and
//! calling it with `TVMFuncCall`: first the kernel's arguments (buffers as device pointers,
//! type code 3, or null (4); scalars as int or float), as many as the function table's
//! `arg_types`, then the launch extents as ints (the `launch_param_tags` order, then the
//! dynamic shared memory).
//!
//! How each argument is passed ([`ArgKind`]) is worked out once per kernel from its
//! `arg_types` (as TVM's `GetArgConvertCode` does); a launch then only writes each value into
//! its 8-byte parameter slot ([`pack`]), without allocating for the usual argument counts.
//! [`kernel_args`] turns the same list into the [`KernelArg`]s and extents that
//! [`crate::ffi::cuda::CudaModule::launch`] takes.

use smallvec::SmallVec;

use crate::ffi::cuda::KernelArg;
use crate::ffi::Value;
use crate::format::stream::DataType;

/// How a kernel parameter is passed (TVM's `ArgConvertCode`): a device pointer, or a scalar
/// of 4 or 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A device pointer (`handle`): 8 bytes.
    Handle,
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

impl ArgKind {
    /// How an argument of type `t` is passed, or `None` when a kernel cannot take it (vectors,
    /// `bool`, 8- and 16-bit types, `uint64`, ...), as in TVM.
    pub fn of(t: DataType) -> Option<ArgKind> {
        if t.lanes != 1 {
            return None;
        }
        Some(match (t.code, t.bits) {
            // TVM passes any opaque handle as a pointer, whatever bits it is typed with.
            (3, _) => ArgKind::Handle,
            (0, 32) => ArgKind::I32,
            (1, 32) => ArgKind::U32,
            (0, 64) => ArgKind::I64,
            (2, 32) => ArgKind::F32,
            (2, 64) => ArgKind::F64,
            _ => return None,
        })
    }

    /// TVM's spelling of the type.
    pub fn name(self) -> &'static str {
        match self {
            ArgKind::Handle => "handle",
            ArgKind::I32 => "int32",
            ArgKind::U32 => "uint32",
            ArgKind::I64 => "int64",
            ArgKind::F32 => "float32",
            ArgKind::F64 => "float64",
        }
    }

    /// Bytes the kernel parameter takes.
    pub fn size(self) -> usize {
        match self {
            ArgKind::I32 | ArgKind::U32 | ArgKind::F32 => 4,
            ArgKind::Handle | ArgKind::I64 | ArgKind::F64 => 8,
        }
    }

    /// Argument `i`, the packed value `v`, as a kernel argument of this kind.
    #[inline]
    pub fn arg(self, i: usize, v: &Value) -> Result<KernelArg<'static>, String> {
        Ok(match (self, v) {
            (ArgKind::Handle, Value::Handle(p)) => KernelArg::DevicePtr(*p as u64),
            (ArgKind::Handle, Value::None) => KernelArg::DevicePtr(0),
            (ArgKind::I32, Value::Int(v)) => {
                KernelArg::I32(i32::try_from(*v).map_err(|_| format!("argument {i}: {v} is not an int32"))?)
            }
            (ArgKind::U32, Value::Int(v)) => {
                KernelArg::U32(u32::try_from(*v).map_err(|_| format!("argument {i}: {v} is not a uint32"))?)
            }
            (ArgKind::I64, Value::Int(v)) => KernelArg::I64(*v),
            (ArgKind::F32, Value::Float(v)) => KernelArg::F32(*v as f32),
            (ArgKind::F64, Value::Float(v)) => KernelArg::F64(*v),
            (kind, a) => return Err(format!("argument {i}: a {} parameter cannot take {a:?}", kind.name())),
        })
    }
}

/// One 8-byte slot per kernel parameter, the value in its first 4 or 8 bytes (the driver
/// reads each parameter from the start of its slot).
pub type Slots = SmallVec<[u64; 16]>;

/// The launch extents that follow the kernel arguments.
pub type Extents = SmallVec<[u64; 8]>;

/// An 8-byte slot whose first 4 bytes are `bytes`.
#[inline]
pub(crate) fn slot4(bytes: [u8; 4]) -> u64 {
    let [a, b, c, d] = bytes;
    u64::from_ne_bytes([a, b, c, d, 0, 0, 0, 0])
}

/// The slot of a value argument (`None` for [`KernelArg::Buffer`], whose pointer the module
/// takes from the buffer).
#[inline]
pub(crate) fn value_slot(arg: &KernelArg<'_>) -> Option<u64> {
    Some(match arg {
        KernelArg::Buffer(_) => return None,
        KernelArg::DevicePtr(p) => *p,
        KernelArg::I32(v) => slot4(v.to_ne_bytes()),
        KernelArg::U32(v) => slot4(v.to_ne_bytes()),
        KernelArg::F32(v) => slot4(v.to_ne_bytes()),
        KernelArg::I64(v) => u64::from_ne_bytes(v.to_ne_bytes()),
        KernelArg::F64(v) => u64::from_ne_bytes(v.to_ne_bytes()),
    })
}

fn too_few(kernel_args: usize, given: usize) -> String {
    format!("the kernel takes {kernel_args} arguments and its launch extents, {given} values given")
}

fn extents_of(rest: &[Value]) -> Result<Extents, String> {
    rest.iter()
        .enumerate()
        .map(|(i, a)| match a {
            Value::Int(v) if *v >= 0 => Ok(*v as u64),
            other => Err(format!("launch extent {i}: {other:?} is not a non-negative int")),
        })
        .collect()
}

/// Splits packed arguments into the parameter slots of a kernel whose parameters are `kinds`,
/// and the launch extents after them.
#[inline]
pub fn pack(kinds: &[ArgKind], args: &[Value]) -> Result<(Slots, Extents), String> {
    if args.len() < kinds.len() {
        return Err(too_few(kinds.len(), args.len()));
    }
    let (kernel, rest) = args.split_at(kinds.len());
    let mut slots = Slots::with_capacity(kinds.len());
    for (i, (kind, a)) in kinds.iter().zip(kernel).enumerate() {
        let arg = kind.arg(i, a)?;
        // Every kind makes a value argument, never a buffer.
        slots.push(value_slot(&arg).unwrap_or_default());
    }
    Ok((slots, extents_of(rest)?))
}

/// Splits packed arguments into kernel arguments (typed by `types`) and launch extents.
pub fn kernel_args(types: &[DataType], args: &[Value]) -> Result<(Vec<KernelArg<'static>>, Vec<u64>), String> {
    if args.len() < types.len() {
        return Err(too_few(types.len(), args.len()));
    }
    let (kernel, rest) = args.split_at(types.len());
    let mut out = Vec::with_capacity(kernel.len());
    for (i, (t, a)) in types.iter().zip(kernel).enumerate() {
        let kind = ArgKind::of(*t).ok_or_else(|| format!("argument {i}: a {t} parameter cannot take {a:?}"))?;
        out.push(kind.arg(i, a)?);
    }
    Ok((out, extents_of(rest)?.into_vec()))
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
        let f16 = DataType::parse("float16").unwrap();
        assert!(kernel_args(&[f16], &[Value::Float(1.0)]).unwrap_err().contains("a float16 parameter"));
    }

    #[test]
    fn kinds_follow_tvm_and_pack_into_slots() {
        let kind = |s: &str| ArgKind::of(DataType::parse(s).unwrap());
        assert_eq!(kind("handle"), Some(ArgKind::Handle));
        assert_eq!(kind("int32"), Some(ArgKind::I32));
        assert_eq!(kind("uint32"), Some(ArgKind::U32));
        assert_eq!(kind("int64"), Some(ArgKind::I64));
        assert_eq!(kind("float32"), Some(ArgKind::F32));
        assert_eq!(kind("float64"), Some(ArgKind::F64));
        for unsupported in ["float16", "bool", "int8", "uint64", "float32x4", "bfloat16"] {
            assert_eq!(kind(unsupported), None, "{unsupported}");
        }
        assert_eq!(ArgKind::of(DataType { code: 3, bits: 32, lanes: 1 }), Some(ArgKind::Handle));

        let kinds = [ArgKind::Handle, ArgKind::I32, ArgKind::U32, ArgKind::I64, ArgKind::F32, ArgKind::F64];
        let args = [
            Value::Handle(0xdead_beef as *mut _),
            Value::Int(-2),
            Value::Int(3),
            Value::Int(-4),
            Value::Float(1.5),
            Value::Float(-2.25),
            Value::Int(16),
            Value::Int(64),
        ];
        let (slots, extents) = pack(&kinds, &args).unwrap();
        assert_eq!(slots[0], 0xdead_beef);
        assert_eq!(slots[1].to_ne_bytes()[..4], (-2i32).to_ne_bytes());
        assert_eq!(slots[1].to_ne_bytes()[4..], [0; 4]);
        assert_eq!(slots[2].to_ne_bytes()[..4], 3u32.to_ne_bytes());
        assert_eq!(slots[3], u64::from_ne_bytes((-4i64).to_ne_bytes()));
        assert_eq!(slots[4].to_ne_bytes()[..4], 1.5f32.to_ne_bytes());
        assert_eq!(slots[5], (-2.25f64).to_bits());
        assert_eq!(extents[..], [16, 64]);
        assert!(!slots.spilled() && !extents.spilled());

        assert!(pack(&kinds, &args[..3]).unwrap_err().contains("takes 6 arguments"));
        let mut wide = args.clone();
        wide[1] = Value::Int(1 << 40);
        assert!(pack(&kinds, &wide).unwrap_err().contains("argument 1: 1099511627776 is not an int32"));
        wide[1] = Value::Int(1);
        wide[2] = Value::Int(-1);
        assert!(pack(&kinds, &wide).unwrap_err().contains("is not a uint32"));
        wide[2] = Value::Int(1);
        wide[4] = Value::Int(1);
        assert!(pack(&kinds, &wide).unwrap_err().contains("argument 4: a float32 parameter"));
        wide[4] = Value::Float(0.0);
        wide[7] = Value::Float(2.0);
        assert!(pack(&kinds, &wide).unwrap_err().contains("launch extent 1"));
    }
}
