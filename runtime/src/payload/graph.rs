//! `GraphExecutorFactory`: the root of a relay model exported as one library (the RFC
//! "Standardize NN Module Exports into a Single DLL"), and TVM's tensor format.
//!
//! ```text
//! payload    := graph_json:str  n:u64  names:vec<str>  tensor{n}  module_name:str
//! tensor     := magic:u64 (0xDD5E40F096B4A13F)  reserved:u64  device_type:i32  device_id:i32
//!               ndim:i32  dtype:(u8 code, u8 bits, u16 lanes)  shape:i64{ndim}
//!               data_byte_size:i64 (= ceil(bits/8) * prod(shape))  data:u8{data_byte_size}
//! ```
//!
//! The legacy key `GraphRuntimeFactory` is read too. Tensor data stays borrowed from the blob.

use std::any::Any;
use std::io::{self, Write};

use std::ops::Range;

use super::Payload;
use crate::bytes::Bytes;
use crate::format::stream::{self, Reader};
use crate::format::{DataType, FormatError, FormatErrorKind, Layout};

/// Type key of the graph executor factory.
pub const GRAPH_EXECUTOR_FACTORY: &str = "GraphExecutorFactory";
/// The key TVM used before it was renamed; still accepted by TVM's loader.
pub const GRAPH_RUNTIME_FACTORY: &str = "GraphRuntimeFactory";

/// Magic number that starts every tensor (`kTVMNDArrayMagic`).
pub(crate) const TENSOR_MAGIC: u64 = 0xDD5E_40F0_96B4_A13F;

/// A tensor in TVM's `SaveDLTensor` format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DataType,
    /// Shape; every extent is non-negative.
    pub shape: Vec<i64>,
    /// `(device_type, device_id)`; TVM always writes CPU, `(1, 0)`.
    pub device: (i32, i32),
    /// The elements, little-endian, `ceil(bits/8) * prod(shape)` bytes.
    pub data: Bytes,
}

impl Tensor {
    /// A CPU tensor of `dtype` and `shape` over `data`; `None` when the sizes disagree.
    pub fn new(dtype: DataType, shape: Vec<i64>, data: impl Into<Bytes>) -> Option<Tensor> {
        let data = data.into();
        (data_size(dtype, &shape)? == data.len() as u64).then_some(Tensor { dtype, shape, device: (1, 0), data })
    }

    /// The elements as `f32`, when the dtype is `float32`.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == DataType::F32)
            .then(|| self.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// Reads one tensor from `r`, borrowing its data from `src` (the bytes `r` reads: `r`'s
    /// positions are positions in `src`).
    pub fn read(r: &mut Reader<'_>, src: &Bytes) -> Result<Tensor, FormatError> {
        Tensor::read_with(r, &|range| src.slice(range))
    }

    /// Reads one tensor, taking its data's range of the reader's input with `data` (a view of
    /// the source, or an empty buffer when only measuring).
    fn read_with(r: &mut Reader<'_>, data: &dyn Fn(Range<usize>) -> Option<Bytes>) -> Result<Tensor, FormatError> {
        let at = r.offset();
        let magic = r.read_u64("tensor magic")?;
        if magic != TENSOR_MAGIC {
            return Err(FormatError::new(
                at,
                FormatErrorKind::BadMagic { what: "tensor", expected: TENSOR_MAGIC, found: magic },
            ));
        }
        r.read_u64("tensor reserved")?;
        let device_at = r.offset();
        let device = (r.read_i32("device_type")?, r.read_i32("device_id")?);
        if device.0 != 1 {
            return Err(FormatError::new(
                device_at,
                FormatErrorKind::Invalid { what: "device_type", detail: format!("{} is not kDLCPU (1)", device.0) },
            ));
        }
        let ndim_at = r.offset();
        let ndim = r.read_i32("ndim")?;
        let Ok(ndim) = u64::try_from(ndim) else {
            return Err(FormatError::new(
                ndim_at,
                FormatErrorKind::Invalid { what: "ndim", detail: format!("{ndim} is negative") },
            ));
        };
        if ndim * 8 > r.remaining() as u64 {
            return Err(FormatError::new(
                ndim_at,
                FormatErrorKind::LengthTooLarge { what: "ndim", len: ndim, remaining: r.remaining() as u64 },
            ));
        }
        let dtype = r.read_dtype("dtype")?;
        let mut shape = Vec::with_capacity(ndim as usize);
        for _ in 0..ndim {
            let at = r.offset();
            let d = r.read_i64("shape")?;
            if d < 0 {
                return Err(FormatError::new(
                    at,
                    FormatErrorKind::Invalid { what: "shape", detail: format!("negative extent {d}") },
                ));
            }
            shape.push(d);
        }
        let size_at = r.offset();
        let size = r.read_i64("data_byte_size")?;
        let expected = data_size(dtype, &shape);
        if u64::try_from(size).ok() != expected {
            return Err(FormatError::new(
                size_at,
                FormatErrorKind::Invalid {
                    what: "data_byte_size",
                    detail: format!("{size} does not match dtype {dtype} and shape {shape:?}"),
                },
            ));
        }
        let data_at = r.offset();
        let range = r.read_range(size as u64, "tensor data")?;
        let data = data(range).ok_or_else(|| {
            FormatError::new(
                data_at,
                FormatErrorKind::Invalid { what: "tensor data", detail: "lies outside the source buffer".into() },
            )
        })?;
        Ok(Tensor { dtype, shape, device, data })
    }

    /// Writes the tensor.
    pub(crate) fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        stream::write_u64(out, TENSOR_MAGIC)?;
        stream::write_u64(out, 0)?;
        out.write_all(&self.device.0.to_le_bytes())?;
        out.write_all(&self.device.1.to_le_bytes())?;
        out.write_all(&(self.shape.len() as i32).to_le_bytes())?;
        stream::write_dtype(out, self.dtype)?;
        for d in &self.shape {
            out.write_all(&d.to_le_bytes())?;
        }
        out.write_all(&(self.data.len() as i64).to_le_bytes())?;
        self.data.write_to(out)
    }

    /// How many bytes [`Tensor::write_to`] writes.
    pub(crate) fn encoded_len(&self) -> u64 {
        8 + 8 + 8 + 4 + 4 + 8 * self.shape.len() as u64 + 8 + self.data.len() as u64
    }
}

fn data_size(dtype: DataType, shape: &[i64]) -> Option<u64> {
    shape.iter().try_fold(dtype.element_bytes(), |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

/// The graph executor factory: graph JSON, named parameters and the module name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphExecutorFactory {
    /// The graph, as TVM's graph executor JSON.
    pub graph_json: String,
    /// Parameters in the order they are stored.
    pub params: Vec<(String, Tensor)>,
    /// The model's name, usually `default`.
    pub module_name: String,
    /// `GraphExecutorFactory`, or the legacy `GraphRuntimeFactory` when read so.
    pub type_key: String,
}

impl GraphExecutorFactory {
    /// A factory with the current type key.
    pub fn new(graph_json: impl Into<String>, params: Vec<(String, Tensor)>, module_name: impl Into<String>) -> Self {
        GraphExecutorFactory {
            graph_json: graph_json.into(),
            params,
            module_name: module_name.into(),
            type_key: GRAPH_EXECUTOR_FACTORY.to_owned(),
        }
    }

    /// Reads a payload from the start of `src`, whose first byte lies at `base`. Returns the
    /// factory and the bytes it took.
    pub fn read(src: &Bytes, base: u64, type_key: &str) -> Result<(GraphExecutorFactory, u64), FormatError> {
        Self::read_from(src, base, type_key, &|range| src.slice(range))
    }

    /// The length of the payload at the start of `bytes`, checked as [`GraphExecutorFactory::read`]
    /// checks it, without copying any tensor data.
    pub fn measure(bytes: &[u8], base: u64) -> Result<u64, FormatError> {
        let empty = Bytes::from_vec(Vec::new());
        Self::read_from(bytes, base, GRAPH_EXECUTOR_FACTORY, &|_| Some(empty.clone())).map(|(_, n)| n)
    }

    fn read_from(
        src: &[u8],
        base: u64,
        type_key: &str,
        data: &dyn Fn(Range<usize>) -> Option<Bytes>,
    ) -> Result<(GraphExecutorFactory, u64), FormatError> {
        let mut r = Reader::new(src, base);
        let graph_json = r.read_str("graph_json")?.to_owned();
        let n_at = r.offset();
        let n = r.read_count("param count", 8)?;
        let names = r.read_vec_str("param names")?;
        if names.len() != n {
            return Err(FormatError::new(
                n_at,
                FormatErrorKind::Invalid {
                    what: "param count",
                    detail: format!("{n} params but {} names", names.len()),
                },
            ));
        }
        // A tensor takes at least 40 bytes (magic, reserved, device, ndim, dtype, data size):
        // reserve no more than the rest of the input could hold.
        let mut params = Vec::with_capacity(n.min(r.remaining() / 40));
        for name in names {
            params.push((name, Tensor::read_with(&mut r, data)?));
        }
        let module_name = r.read_str("module_name")?.to_owned();
        let used = r.offset() - base;
        Ok((GraphExecutorFactory { graph_json, params, module_name, type_key: type_key.to_owned() }, used))
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&Tensor> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

impl Payload for GraphExecutorFactory {
    fn type_key(&self) -> &str {
        &self.type_key
    }

    fn write_payload(&self, _layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        let GraphExecutorFactory { graph_json, params, module_name, type_key: _ } = self;
        stream::write_str(out, graph_json)?;
        stream::write_u64(out, params.len() as u64)?;
        stream::write_u64(out, params.len() as u64)?;
        for (name, _) in params {
            stream::write_str(out, name)?;
        }
        for (_, t) in params {
            t.write_to(out)?;
        }
        stream::write_str(out, module_name)
    }

    fn payload_len(&self, _layout: Layout) -> io::Result<u64> {
        let names: u64 = self.params.iter().map(|(n, _)| stream::str_len(n.len() as u64)).sum();
        let tensors: u64 = self.params.iter().map(|(_, t)| t.encoded_len()).sum();
        Ok(stream::str_len(self.graph_json.len() as u64)
            + 16
            + names
            + tensors
            + stream::str_len(self.module_name.len() as u64))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GraphExecutorFactory {
        let data: Vec<u8> = (0..6u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let t = Tensor::new(DataType::F32, vec![2, 3], data).unwrap();
        GraphExecutorFactory::new("{}", vec![("p0".into(), t)], "default")
    }

    #[test]
    fn round_trip_and_length() {
        let g = sample();
        let mut buf = Vec::new();
        g.write_payload(Layout::Classic, &mut buf).unwrap();
        assert_eq!(buf.len() as u64, g.payload_len(Layout::Classic).unwrap());
        let (back, used) =
            GraphExecutorFactory::read(&Bytes::from_vec(buf.clone()), 0, GRAPH_EXECUTOR_FACTORY).unwrap();
        assert_eq!(used, buf.len() as u64);
        assert_eq!(back, g);
        assert_eq!(back.param("p0").unwrap().to_f32().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn forged_sizes_are_refused() {
        let g = sample();
        let mut buf = Vec::new();
        g.write_payload(Layout::Classic, &mut buf).unwrap();
        // graph_json "{}" is 10 bytes; the param count follows.
        let mut forged = buf.clone();
        forged[10..18].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = GraphExecutorFactory::read(&Bytes::from_vec(forged), 0, GRAPH_EXECUTOR_FACTORY).unwrap_err();
        assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { what: "param count", .. }), "{err}");
        // data_byte_size sits 8 bytes before the 24 data bytes and the module name (15 bytes).
        let at = buf.len() - 15 - 24 - 8;
        let mut forged = buf.clone();
        forged[at..at + 8].copy_from_slice(&1000i64.to_le_bytes());
        let err = GraphExecutorFactory::read(&Bytes::from_vec(forged), 0, GRAPH_EXECUTOR_FACTORY).unwrap_err();
        assert_eq!(err.offset, at as u64);
        assert!(matches!(err.kind, FormatErrorKind::Invalid { what: "data_byte_size", .. }));
        let mut forged = buf;
        let magic_at = 10 + 8 + 8 + 10;
        forged[magic_at] ^= 1;
        let err = GraphExecutorFactory::read(&Bytes::from_vec(forged.clone()), 0, GRAPH_EXECUTOR_FACTORY).unwrap_err();
        assert!(matches!(err.kind, FormatErrorKind::BadMagic { .. }));
        forged[magic_at] ^= 1;
        // ndim follows magic, reserved and the device (8 + 8 + 8 bytes).
        let ndim_at = magic_at + 24;
        forged[ndim_at..ndim_at + 4].copy_from_slice(&(-1i32).to_le_bytes());
        let err = GraphExecutorFactory::read(&Bytes::from_vec(forged), 0, GRAPH_EXECUTOR_FACTORY).unwrap_err();
        assert_eq!(err.offset, ndim_at as u64);
        assert!(err.to_string().contains("ndim: -1 is negative"), "{err}");
    }
}
