//! TVM's AOT executor for the packed interface (`relay.build(..., executor=Executor("aot",
//! {"interface-api": "packed"}), runtime=Runtime("cpp"))`).
//!
//! The loaded tree is `AotExecutorFactory -> metadata_module -> library`. The factory payload
//! is `params count u64, names vec<str>, tensor{count}, module_name str` (weights are usually
//! linked into the code, so the count is 0); `metadata_module` has an empty payload. The
//! library exports `get_c_metadata`, a packed function returning (as a handle) a C
//! `TVMMetadata` struct: version, inputs, outputs, workspace pools, constant pools and the
//! model's name, each input and output a `TVMTensorInfo {name, shape, ndim, dtype}`. The
//! executor allocates one 64-byte aligned tensor per input and output and runs the entry
//! `<mod_name>___tvm_main__` (the name is `tvmgen_default`) with inputs then outputs as `DLTensor*`, as TVM's
//! `AotExecutor::Run` does. Intermediates come from `TVMBackendAllocWorkspace`.
//!
//! Models built with the unified static memory planner (`tir.usmp.enable`) list workspace
//! pools and constant pools in the metadata: after the outputs, the entry takes the constants
//! merged into one byte tensor, then one byte tensor per workspace pool, which the executor
//! allocates (zeroed, 64-byte aligned) and fills as TVM's does.

/// Why an AOT model's metadata cannot be read or is inconsistent
/// ([`ExecError::Metadata`]).
pub use crate::ffi::metadata::MetadataError;

use super::runner::{Param, Runner};
use super::value::Value as ExecValue;
use super::{check_devices, Device, ExecError, TensorInfo};
use crate::array::{tensor_bytes, NdArray};
use crate::ffi::kernel_call::KernelCall;
use crate::ffi::metadata::{read_c_metadata, RawConstant, RawMetadata, RawTensorInfo};
use crate::format::stream::Reader;
use crate::format::DataType;
use crate::module::LoadedTree;
use crate::payload::graph::Tensor as PayloadTensor;
use crate::payload::RawPayload;

/// Type key of the AOT executor factory.
pub const AOT_EXECUTOR_FACTORY: &str = "AotExecutorFactory";

/// The decoded `AotExecutorFactory` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AotFactoryPayload {
    /// Parameters (usually none: AOT links weights into the code).
    pub params: Vec<(String, PayloadTensor)>,
    /// The model's name (`default`).
    pub module_name: String,
}

impl AotFactoryPayload {
    /// Reads the payload (exactly its bytes).
    pub fn read(bytes: &crate::bytes::Bytes) -> Result<AotFactoryPayload, ExecError> {
        let fail = |source: crate::format::FormatError| ExecError::Payload { kind: AOT_EXECUTOR_FACTORY, source };
        let mut r = Reader::new(bytes, 0);
        let count = r.read_count("param count", 40).map_err(fail)?;
        let at = r.offset();
        let names = r.read_vec_str("param names").map_err(fail)?;
        if names.len() != count {
            return Err(fail(crate::format::FormatError::new(
                at,
                crate::format::FormatErrorKind::Invalid {
                    what: "param names",
                    detail: format!("{count} params but {} names", names.len()),
                },
            )));
        }
        let mut params = Vec::with_capacity(count);
        for name in names {
            params.push((name, PayloadTensor::read(&mut r, bytes).map_err(fail)?));
        }
        let module_name = r.read_str("module_name").map_err(fail)?.to_owned();
        r.finish("AotExecutorFactory payload").map_err(fail)?;
        Ok(AotFactoryPayload { params, module_name })
    }
}

/// An AOT factory of a loaded tree.
#[derive(Debug, Clone)]
pub struct AotFactory {
    tree: LoadedTree,
    index: usize,
    payload: AotFactoryPayload,
}

impl AotFactory {
    /// The first `AotExecutorFactory` of `tree` (kept as opaque bytes by the registry; decoded
    /// here).
    pub fn from_tree(tree: &LoadedTree) -> Result<AotFactory, ExecError> {
        let (index, m) =
            tree.modules().iter().enumerate().find(|(_, m)| m.module.type_key() == AOT_EXECUTOR_FACTORY).ok_or_else(
                || ExecError::NoFactory {
                    kind: AOT_EXECUTOR_FACTORY,
                    modules: tree.type_keys().into_iter().map(str::to_owned).collect(),
                },
            )?;
        let opaque = m
            .module
            .as_any()
            .downcast_ref::<RawPayload>()
            .ok_or(ExecError::PayloadKind { kind: AOT_EXECUTOR_FACTORY })?;
        let payload = AotFactoryPayload::read(&opaque.bytes)?;
        Ok(AotFactory { tree: tree.clone(), index, payload })
    }

    /// The decoded payload.
    pub fn payload(&self) -> &AotFactoryPayload {
        &self.payload
    }

    /// `factory["default"](dev)`: builds an executor (the CPU only).
    pub fn default(&self, devices: &[Device]) -> Result<AotExecutor, ExecError> {
        AotExecutor::new(self, devices)
    }
}

/// The model's signature, read from `get_c_metadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Inputs, in argument order.
    pub inputs: Vec<TensorInfo>,
    /// Outputs, in argument order.
    pub outputs: Vec<TensorInfo>,
    /// The workspace pools of a model built with the unified static memory planner (USMP),
    /// in argument order after the outputs: each a byte tensor the executor allocates, as
    /// TVM's `AotExecutor` does; empty otherwise.
    pub workspace_pools: Vec<TensorInfo>,
    /// A USMP model's pooled constants, merged into one byte blob (each at its offset); the
    /// entry takes it as a byte tensor between the outputs and the workspace pools. Empty
    /// when the model has no pooled constants.
    pub constant_pool: Vec<u8>,
    /// The model's name.
    pub mod_name: String,
}

/// The largest merged constant pool (TVM checks the same bound).
const MAX_CONSTANT_POOL: i64 = i32::MAX as i64;

/// The model's signature from the library's `TVMMetadata` (read by
/// [`crate::ffi::metadata::read_c_metadata`]): every shape checked, the constant pools merged.
fn metadata_of(raw: RawMetadata) -> Result<Metadata, MetadataError> {
    let infos = |infos: Vec<RawTensorInfo>, list: &'static str| -> Result<Vec<TensorInfo>, MetadataError> {
        infos
            .into_iter()
            .enumerate()
            .map(|(index, t)| {
                let dtype = DataType { code: t.dtype.code, bits: t.dtype.bits, lanes: t.dtype.lanes };
                if tensor_bytes(dtype, &t.shape).is_none() {
                    return Err(MetadataError::Shape { list, index, shape: t.shape });
                }
                Ok(TensorInfo { name: t.name, shape: t.shape, dtype })
            })
            .collect()
    };
    Ok(Metadata {
        constant_pool: merge_constants(&raw.constants)?,
        inputs: infos(raw.inputs, "inputs")?,
        outputs: infos(raw.outputs, "outputs")?,
        workspace_pools: infos(raw.workspace_pools, "workspace_pools")?,
        mod_name: raw.mod_name.ok_or(MetadataError::NoModName)?,
    })
}

/// Merges a USMP model's constant pools into one blob, each tensor's data at its byte offset,
/// as TVM's `AotExecutor` does.
fn merge_constants(constants: &[RawConstant]) -> Result<Vec<u8>, MetadataError> {
    let mut pieces = Vec::new();
    for (index, c) in constants.iter().enumerate() {
        let src = crate::bytes::Bytes::from(c.data.clone());
        let t = PayloadTensor::read(&mut Reader::new(&src, 0), &src)
            .map_err(|source| MetadataError::ConstantTensor { index, source })?;
        pieces.push((c.byte_offset as usize, t.data));
    }
    let len = pieces.iter().map(|(at, d)| at + d.len()).max().unwrap_or(0);
    if len as i64 >= MAX_CONSTANT_POOL {
        return Err(MetadataError::ConstantPool { bytes: len });
    }
    let mut blob = vec![0u8; len];
    for (at, d) in pieces {
        blob[at..at + d.len()].copy_from_slice(&d);
    }
    Ok(blob)
}

/// An AOT executor: one tensor per input and output, and the entry call.
pub struct AotExecutor {
    metadata: Metadata,
    /// Inputs, outputs, then (USMP) the constant pool and the workspace pools.
    arrays: Vec<NdArray>,
    entry: String,
    call: KernelCall,
    params: Vec<Param>,
    _tree: LoadedTree,
}

impl std::fmt::Debug for AotExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AotExecutor").field("metadata", &self.metadata).field("entry", &self.entry).finish()
    }
}

impl AotExecutor {
    fn new(factory: &AotFactory, devices: &[Device]) -> Result<AotExecutor, ExecError> {
        let _span = tracing::info_span!("aot_executor_init").entered();
        check_devices(devices, "AOT")?;
        let tree = &factory.tree;
        let get_md = tree.lookup(factory.index, "get_c_metadata").ok_or_else(|| ExecError::MissingFunction {
            node: "metadata_module".into(),
            function: "get_c_metadata".into(),
        })?;
        let raw = read_c_metadata(&get_md).map_err(|e| match e {
            MetadataError::Call { message } => {
                ExecError::Kernel { node: "metadata_module".into(), function: "get_c_metadata".into(), message }
            }
            other => ExecError::Metadata(other),
        })?;
        let metadata = metadata_of(raw).map_err(ExecError::Metadata)?;
        let entry = format!("{}___tvm_main__", metadata.mod_name);
        let main = tree
            .lookup(factory.index, &entry)
            .ok_or_else(|| ExecError::MissingFunction { node: "__tvm_main__".into(), function: entry.clone() })?;
        // A USMP model's entry takes, after the outputs, the merged constants and then each
        // workspace pool, all as byte tensors (TVM passes the constants even when there are
        // none, as an empty tensor).
        let u8_info = |name: String, bytes: u64| TensorInfo {
            name,
            shape: vec![i64::try_from(bytes).unwrap_or(i64::MAX)],
            dtype: DataType { code: 1, bits: 8, lanes: 1 },
        };
        let mut extra = Vec::new();
        if !metadata.workspace_pools.is_empty() {
            extra.push(u8_info("constant_pool".into(), metadata.constant_pool.len() as u64));
            for p in &metadata.workspace_pools {
                extra.push(u8_info(p.name.clone(), tensor_bytes(p.dtype, &p.shape).unwrap_or(u64::MAX)));
            }
        }
        let all: Vec<&TensorInfo> = metadata.inputs.iter().chain(&metadata.outputs).chain(&extra).collect();
        let device = devices[0];
        let arrays = all
            .iter()
            .map(|t| {
                NdArray::empty(&t.shape, t.dtype, device).map_err(|e| ExecError::Alloc {
                    bytes: tensor_bytes(t.dtype, &t.shape).unwrap_or(u64::MAX),
                    what: format!("tensor `{}`: {e}", t.name),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !metadata.workspace_pools.is_empty() {
            let k = metadata.inputs.len() + metadata.outputs.len();
            arrays[k].copy_from_bytes(&metadata.constant_pool)?;
        }
        let call = KernelCall::new(main, arrays.clone(), false).map_err(|e| ExecError::Kernel {
            node: "__tvm_main__".into(),
            function: entry.clone(),
            message: e.message,
        })?;
        let params = metadata.inputs.iter().cloned().map(Param::tensor).collect();
        let exec = AotExecutor { metadata, arrays, entry, call, params, _tree: tree.clone() };
        let mut params: Vec<&(String, PayloadTensor)> = factory.payload.params.iter().collect();
        params.sort_by_key(|(_, t)| std::cmp::Reverse(t.data.len()));
        for (name, t) in params {
            if let Some(index) = exec.metadata.input_index(name) {
                exec.check_input(index, t.dtype, &t.shape, t.data.len())
                    .and_then(|()| Ok(exec.arrays[index].copy_from_bytes(&t.data)?))
                    .map_err(|e| ExecError::Param { name: name.clone(), source: Box::new(e) })?;
            }
        }
        Ok(exec)
    }

    /// The model's signature.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn check_input(&self, index: usize, dtype: DataType, shape: &[i64], nbytes: usize) -> Result<(), ExecError> {
        let info = self.metadata.inputs.get(index).ok_or(ExecError::Index {
            what: "input",
            index,
            count: self.metadata.inputs.len(),
        })?;
        if dtype != info.dtype || shape != info.shape.as_slice() || nbytes != self.arrays[index].nbytes() {
            return Err(ExecError::InputMismatch {
                name: info.name.clone(),
                expected_dtype: info.dtype,
                expected_shape: info.shape.clone(),
                dtype,
                shape: shape.to_vec(),
            });
        }
        Ok(())
    }
}

impl Metadata {
    /// The index of the input called `name`, as written in the metadata or before TVM
    /// sanitized it (every character other than an ASCII letter or digit made `_`).
    pub(crate) fn input_index(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|i| i.name == name).or_else(|| {
            let sanitized: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
            self.inputs.iter().position(|i| i.name == sanitized)
        })
    }
}

impl Runner for AotExecutor {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn output_info(&self) -> Vec<TensorInfo> {
        self.metadata.outputs.clone()
    }

    /// The input named `name`: its name in the metadata, or the name the model was built with
    /// (`input.1`, `x:0`), which TVM's AOT codegen wrote sanitized (`input_1`, `x_0`) and which
    /// TVM's `AotExecutor` accepts by sanitizing it the same way.
    fn param_index(&self, name: &str) -> Option<usize> {
        self.metadata.input_index(name)
    }

    /// Copies a tensor (from any device) into input `index`, its shape and dtype checked.
    fn set_input(&mut self, index: usize, value: ExecValue) -> Result<(), ExecError> {
        let ExecValue::Tensor(array) = value else {
            let name = self.metadata.inputs.get(index).map_or_else(|| index.to_string(), |i| i.name.clone());
            return Err(ExecError::InputKind { name, expected: "tensor", got: value.kind() });
        };
        self.check_input(index, array.dtype(), array.shape(), array.nbytes())?;
        Ok(array.copy_to(&self.arrays[index])?)
    }

    fn run(&mut self) -> Result<(), ExecError> {
        let _span = tracing::debug_span!("aot_run").entered();
        // The entry takes the model's inputs then outputs, which the call's arrays are (shapes
        // and dtypes from the library's own metadata).
        self.call.invoke().map_err(|e| ExecError::Kernel {
            node: "__tvm_main__".into(),
            function: self.entry.clone(),
            message: e.message,
        })
    }

    fn outputs(&self) -> Result<Vec<ExecValue>, ExecError> {
        let k = self.metadata.inputs.len();
        Ok(self.arrays[k..k + self.metadata.outputs.len()].iter().cloned().map(ExecValue::Tensor).collect())
    }
}
