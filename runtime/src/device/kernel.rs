//! One plan of a kernel's arguments, worked out from its `FunctionInfo`, for both GPU backends.
//!
//! TVM's host code launches a device kernel by looking it up through `GetFuncFromEnv` and
//! calling it with `TVMFuncCall`: first the kernel's arguments (buffers as device pointers or
//! handles, type code 3, or null (4); scalars as int or float), as many as the function table's
//! `arg_types`, then the launch extents as ints (the `launch_param_tags` order, then the
//! dynamic shared memory in bytes when tagged).
//!
//! How each argument is passed ([`ArgKind`]) and the launch configuration are worked out once
//! per kernel ([`KernelPlan::new`]); a launch then only encodes each value ([`KernelPlan::encode`])
//! into an [`Arg`]: a handle, or the bytes of a scalar of the parameter's type (`float16` and
//! `bfloat16` rounded to nearest even by the `half` crate), without allocating for the usual
//! argument counts. CUDA reads each parameter from an 8-byte slot ([`Arg::slot`]); OpenCL sets
//! it with its size ([`Arg::bytes`]). A backend may accept fewer kinds (CUDA takes the ones TVM's
//! CUDA module passes, [`ArgKind::tvm_cuda`]).

use half::{bf16, f16};
use smallvec::SmallVec;

use crate::ffi::value::Value;
use crate::format::DataType;
use crate::payload::device::{FunctionInfo, LaunchParams};

/// How a kernel parameter is passed, from its type in the function table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A buffer (`handle`): a device pointer or a memory handle.
    Handle,
    /// `bool` (one byte).
    Bool,
    /// A signed integer of this many bits (8, 16, 32, 64).
    Int(u8),
    /// An unsigned integer of this many bits (8, 16, 32, 64).
    UInt(u8),
    /// A float of this many bits (16, 32, 64).
    Float(u8),
    /// `bfloat16`.
    BFloat16,
}

impl ArgKind {
    /// How an argument of type `t` is passed; the error says why a kernel cannot take it
    /// (vectors, odd widths).
    pub fn of(t: DataType) -> Result<ArgKind, String> {
        if t.lanes != 1 {
            return Err(format!("has vector type {t}, which cannot be passed to a kernel"));
        }
        Ok(match (t.code, t.bits) {
            // TVM passes any opaque handle as a pointer, whatever bits it is typed with.
            (3, _) => ArgKind::Handle,
            (1, 1) => ArgKind::Bool,
            (0, 8 | 16 | 32 | 64) => ArgKind::Int(t.bits),
            (1, 8 | 16 | 32 | 64) => ArgKind::UInt(t.bits),
            (2, 16 | 32 | 64) => ArgKind::Float(t.bits),
            (4, 16) => ArgKind::BFloat16,
            _ => return Err(format!("has type {t}, which cannot be passed to a kernel")),
        })
    }

    /// Whether TVM's CUDA module passes it (`GetArgConvertCode`): handles, `int32`, `uint32`,
    /// `int64`, `float32` and `float64`.
    pub fn tvm_cuda(self) -> bool {
        matches!(
            self,
            ArgKind::Handle | ArgKind::Int(32) | ArgKind::UInt(32) | ArgKind::Int(64) | ArgKind::Float(32 | 64)
        )
    }

    /// Any kind (what OpenCL takes).
    pub fn any(self) -> bool {
        true
    }

    /// TVM's spelling of the type.
    pub fn name(self) -> String {
        match self {
            ArgKind::Handle => "handle".into(),
            ArgKind::Bool => "bool".into(),
            ArgKind::Int(b) => format!("int{b}"),
            ArgKind::UInt(b) => format!("uint{b}"),
            ArgKind::Float(b) => format!("float{b}"),
            ArgKind::BFloat16 => "bfloat16".into(),
        }
    }

    /// Bytes the kernel parameter takes (a handle: a pointer's).
    pub fn size(self) -> usize {
        match self {
            ArgKind::Handle => std::mem::size_of::<usize>(),
            ArgKind::Bool => 1,
            ArgKind::Int(b) | ArgKind::UInt(b) | ArgKind::Float(b) => usize::from(b) / 8,
            ArgKind::BFloat16 => 2,
        }
    }

    /// Argument `i`, the packed value `v`, as a kernel argument of this kind. A `uint64`
    /// arrives as the `int64` of the same bits.
    #[inline]
    pub fn arg(self, i: usize, v: &Value) -> Result<Arg, String> {
        let range = |x: i64| {
            let name = self.name();
            let article = if name.starts_with("int") { "an" } else { "a" };
            format!("argument {i}: {x} is not {article} {name}")
        };
        Ok(match (self, v) {
            (ArgKind::Handle, Value::None) => Arg::Handle(0),
            (ArgKind::Handle, Value::Handle(p)) => Arg::Handle(*p as usize),
            (ArgKind::Bool, Value::Int(x)) => Arg::scalar(&[u8::from(*x != 0)]),
            (ArgKind::Int(8), Value::Int(x)) => Arg::scalar(&i8::try_from(*x).map_err(|_| range(*x))?.to_ne_bytes()),
            (ArgKind::Int(16), Value::Int(x)) => Arg::scalar(&i16::try_from(*x).map_err(|_| range(*x))?.to_ne_bytes()),
            (ArgKind::Int(32), Value::Int(x)) => Arg::scalar(&i32::try_from(*x).map_err(|_| range(*x))?.to_ne_bytes()),
            (ArgKind::Int(_), Value::Int(x)) | (ArgKind::UInt(64), Value::Int(x)) => Arg::scalar(&x.to_ne_bytes()),
            (ArgKind::UInt(8), Value::Int(x)) => Arg::scalar(&u8::try_from(*x).map_err(|_| range(*x))?.to_ne_bytes()),
            (ArgKind::UInt(16), Value::Int(x)) => Arg::scalar(&u16::try_from(*x).map_err(|_| range(*x))?.to_ne_bytes()),
            (ArgKind::UInt(_), Value::Int(x)) => Arg::scalar(&u32::try_from(*x).map_err(|_| range(*x))?.to_ne_bytes()),
            (ArgKind::Float(16), Value::Float(x)) => Arg::scalar(&f16::from_f64(*x).to_bits().to_ne_bytes()),
            (ArgKind::Float(32), Value::Float(x)) => Arg::scalar(&(*x as f32).to_ne_bytes()),
            (ArgKind::Float(_), Value::Float(x)) => Arg::scalar(&x.to_ne_bytes()),
            (ArgKind::BFloat16, Value::Float(x)) => Arg::scalar(&bf16::from_f64(*x).to_bits().to_ne_bytes()),
            (kind, a) => return Err(format!("argument {i}: a {} parameter cannot take {a:?}", kind.name())),
        })
    }
}

/// One encoded kernel argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// A buffer: a device pointer (CUDA) or a memory handle (OpenCL `cl_mem`); 0 for null.
    Handle(usize),
    /// A scalar: its first `len` bytes, in the host's byte order.
    Scalar {
        /// The bytes, zero beyond `len`.
        bytes: [u8; 8],
        /// How many are the value's.
        len: usize,
    },
}

impl Arg {
    fn scalar(bytes: &[u8]) -> Arg {
        let mut b = [0u8; 8];
        let len = bytes.len().min(8);
        b[..len].copy_from_slice(&bytes[..len]);
        Arg::Scalar { bytes: b, len }
    }

    /// The 8-byte parameter slot the value is read from (CUDA reads each parameter from the
    /// start of its slot).
    #[inline]
    pub fn slot(&self) -> u64 {
        match self {
            Arg::Handle(p) => *p as u64,
            Arg::Scalar { bytes, .. } => u64::from_ne_bytes(*bytes),
        }
    }

    /// A scalar's bytes (`None` for a handle).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Arg::Handle(_) => None,
            Arg::Scalar { bytes, len } => Some(&bytes[..*len]),
        }
    }
}

/// The kernel arguments of one launch.
pub type Args = SmallVec<[Arg; 16]>;

/// The launch extents that follow the kernel arguments.
pub type Extents = SmallVec<[u64; 8]>;

/// What a kernel's function info says, worked out once: how each argument is passed and the
/// launch configuration, or why it cannot be launched.
#[derive(Debug, Clone)]
pub struct KernelPlan {
    /// The kernel's name.
    pub name: String,
    /// The function info's argument types.
    pub types: Vec<DataType>,
    /// How each argument is passed, or why one cannot be.
    pub kinds: Result<Vec<ArgKind>, String>,
    /// The launch parameters, or why they cannot make a launch.
    pub launch: Result<LaunchParams, String>,
    /// The launch tags (for messages).
    tags: Vec<String>,
}

impl KernelPlan {
    /// The plan of kernel `name` from its function info; `accepts` says which kinds the
    /// backend passes ([`ArgKind::tvm_cuda`], [`ArgKind::any`]).
    pub fn new(name: &str, info: &FunctionInfo, accepts: fn(ArgKind) -> bool) -> KernelPlan {
        let launch = info.launch_params().map_err(|e| e.to_string()).and_then(|p| {
            if p.cooperative || p.programmatic_dependent_launch {
                Err("cooperative and programmatic dependent launches are not supported".to_owned())
            } else {
                Ok(p)
            }
        });
        let kinds = info
            .arg_types
            .iter()
            .enumerate()
            .map(|(i, t)| match ArgKind::of(*t) {
                Ok(kind) if accepts(kind) => Ok(kind),
                Ok(_) => Err(format!("argument {i} has type {t}, which cannot be passed to a kernel")),
                Err(e) => Err(format!("argument {i} {e}")),
            })
            .collect();
        KernelPlan {
            name: name.to_owned(),
            types: info.arg_types.clone(),
            kinds,
            launch,
            tags: info.launch_param_tags.clone(),
        }
    }

    /// Encodes packed `args` (the kernel's arguments, then the launch extents) for a launch:
    /// the count, each argument's type and each extent checked.
    #[inline]
    pub fn encode(&self, args: &[Value]) -> Result<(Args, Extents), String> {
        let kinds = self.kinds.as_ref().map_err(Clone::clone)?;
        let params = self.launch.as_ref().map_err(Clone::clone)?;
        let nargs = kinds.len();
        if args.len() != nargs + params.extent_count() {
            let types: Vec<String> = self.types.iter().map(|t| t.to_string()).collect();
            return Err(format!(
                "takes {nargs} arguments ({}) and {} launch values ({}), {} given",
                types.join(", "),
                params.extent_count(),
                self.tags.join(", "),
                args.len()
            ));
        }
        let (kernel, rest) = args.split_at(nargs);
        let encoded = kinds.iter().zip(kernel).enumerate().map(|(i, (k, v))| k.arg(i, v)).collect::<Result<_, _>>()?;
        let extents = rest
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Value::Int(v) if *v >= 0 => Ok(*v as u64),
                other => Err(format!("launch value {i}: {other:?} is not a non-negative int")),
            })
            .collect::<Result<_, _>>()?;
        Ok((encoded, extents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DataType {
        DataType::parse(s).unwrap()
    }

    #[test]
    fn kinds_follow_the_types_and_cuda_takes_tvms() {
        let kind = |s: &str| ArgKind::of(t(s));
        assert_eq!(kind("handle"), Ok(ArgKind::Handle));
        assert_eq!(ArgKind::of(DataType { code: 3, bits: 32, lanes: 1 }), Ok(ArgKind::Handle));
        assert_eq!(kind("int8"), Ok(ArgKind::Int(8)));
        assert_eq!(kind("bool"), Ok(ArgKind::Bool));
        assert_eq!(kind("bfloat16"), Ok(ArgKind::BFloat16));
        assert!(kind("float32x4").unwrap_err().contains("vector type"));
        for cuda in ["handle", "int32", "uint32", "int64", "float32", "float64"] {
            assert!(kind(cuda).unwrap().tvm_cuda(), "{cuda}");
        }
        for not_cuda in ["float16", "bool", "int8", "uint64", "bfloat16"] {
            assert!(!kind(not_cuda).unwrap().tvm_cuda(), "{not_cuda}");
        }
    }

    #[test]
    fn scalars_are_encoded_by_type() {
        let arg = |s: &str, v: Value| ArgKind::of(t(s)).unwrap().arg(0, &v);
        assert_eq!(arg("int32", Value::Int(-2)), Ok(Arg::scalar(&(-2i32).to_ne_bytes())));
        assert_eq!(arg("int8", Value::Int(-2)), Ok(Arg::scalar(&[0xfe])));
        assert_eq!(arg("uint16", Value::Int(513)), Ok(Arg::scalar(&513u16.to_ne_bytes())));
        assert_eq!(arg("bool", Value::Int(1)), Ok(Arg::scalar(&[1])));
        assert_eq!(arg("float64", Value::Float(0.5)), Ok(Arg::scalar(&0.5f64.to_ne_bytes())));
        assert_eq!(arg("float16", Value::Float(1.0)), Ok(Arg::scalar(&0x3c00u16.to_ne_bytes())));
        assert_eq!(arg("float16", Value::Float(65520.0)), Ok(Arg::scalar(&0x7c00u16.to_ne_bytes())));
        assert_eq!(arg("float16", Value::Float(1.0 + 3.0 * 2f64.powi(-11))), Ok(Arg::scalar(&0x3c02u16.to_ne_bytes())));
        assert_eq!(arg("bfloat16", Value::Float(-3.5)), Ok(Arg::scalar(&0xc060u16.to_ne_bytes())));
        assert_eq!(arg("handle", Value::None), Ok(Arg::Handle(0)));
        assert!(arg("int8", Value::Int(300)).unwrap_err().contains("300 is not an int8"));
        assert!(arg("uint32", Value::Int(-1)).unwrap_err().contains("-1 is not a uint32"));
        assert!(arg("int32", Value::Float(1.0)).unwrap_err().contains("a int32 parameter cannot take"));
        assert_eq!(Arg::scalar(&(-2i32).to_ne_bytes()).slot().to_ne_bytes()[4..], [0; 4]);
        assert_eq!(Arg::scalar(&1.5f64.to_ne_bytes()).slot(), 1.5f64.to_bits());
    }

    #[test]
    fn a_plan_checks_counts_types_and_extents() {
        let h = DataType::HANDLE;
        let info = FunctionInfo::new("k", vec![h, h, DataType::I32], vec!["blockIdx.x".into(), "threadIdx.x".into()]);
        let plan = KernelPlan::new("k", &info, ArgKind::tvm_cuda);
        let args = [Value::Handle(0x1000 as *mut _), Value::None, Value::Int(7), Value::Int(4), Value::Int(256)];
        let (k, e) = plan.encode(&args).unwrap();
        assert_eq!(k[..], [Arg::Handle(0x1000), Arg::Handle(0), Arg::scalar(&7i32.to_ne_bytes())]);
        assert_eq!(e[..], [4, 256]);
        assert!(!k.spilled() && !e.spilled());
        let err = plan.encode(&args[..2]).unwrap_err();
        assert!(err.contains("takes 3 arguments (handle, handle, int32) and 2 launch values"), "{err}");
        let bad = [Value::Float(1.0), Value::None, Value::Int(7), Value::Int(1), Value::Int(1)];
        assert!(plan.encode(&bad).unwrap_err().contains("argument 0"));
        let neg = [Value::None, Value::None, Value::Int(1), Value::Int(-1), Value::Int(1)];
        assert!(plan.encode(&neg).unwrap_err().contains("launch value 0"));
        let f16 = FunctionInfo::new("h", vec![t("float16")], vec![]);
        assert!(KernelPlan::new("h", &f16, ArgKind::tvm_cuda).encode(&[]).unwrap_err().contains("argument 0 has type"));
        assert!(KernelPlan::new("h", &f16, ArgKind::any).kinds.is_ok());
    }
}
