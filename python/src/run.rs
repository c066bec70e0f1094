//! Loading and running: `mblob.load_module`, the graph/AOT executors, the Relax VM and the
//! Relay VM.
//!
//! Tensors cross as `mblob._native.Tensor`s ([`crate::tensor`]): results are `Tensor`s where
//! the model left them, and arguments are `Tensor`s (by reference) or numpy arrays (copied into
//! a CPU array); a host function (`Library.call`) writes into its `Tensor` arguments in place.
//! Params files still take and give bytes.

use std::path::PathBuf;
use std::sync::Mutex;

use mblob_runtime::exec::graph::{read_params, GraphFactory};
use mblob_runtime::exec::llm::generate as llm;
use mblob_runtime::exec::llm::generate::Sampling;
use mblob_runtime::exec::relax::{ObjectRef, ParamKind, VirtualMachine};
use mblob_runtime::exec::relay_vm::RelayVm as RelayVirtualMachine;
use mblob_runtime::exec::{Device, ExecError, Model, ModelKind, Value};
use mblob_runtime::{LoadOptions, LoadedTree, NdArray, Registry};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::tensor::{tensor_in, Tensor as PyTensorObj};
use crate::{run, PyErrLater};

crate::family_exception!(
    RunError,
    pyo3::exceptions::PyRuntimeError,
    "A model or function failed to run: a kernel error, a wrong input, an unsupported device (also a RuntimeError, as TVM's TVMError)."
);

fn run_error(e: impl std::error::Error + 'static) -> PyErrLater {
    PyErrLater::Run(crate::message(&e))
}

/// A loaded library: its module tree (shared by the modules, executors and VMs made from it).
#[pyclass(frozen, module = "mblob._native")]
pub struct Library {
    tree: LoadedTree,
}

#[pymethods]
impl Library {
    /// Type keys of the loaded modules, in tree order (0 is the root).
    fn type_keys(&self) -> Vec<String> {
        self.tree.modules().iter().map(|m| m.module.type_key().to_owned()).collect()
    }

    /// The indices that module `index` imports.
    fn imports(&self, index: usize) -> PyResult<Vec<usize>> {
        self.tree
            .modules()
            .get(index)
            .map(|m| m.imports.clone())
            .ok_or_else(|| crate::InputError::new_err(format!("no module {index}")))
    }

    /// Whether the tree holds a graph or AOT executor factory named `name`.
    fn has_factory(&self, name: &str) -> bool {
        use mblob_runtime::payload::graph::GraphExecutorFactory;
        let graph = self.tree.find::<GraphExecutorFactory>().is_some_and(|g| g.module_name == name);
        let aot = name == "default"
            && self
                .tree
                .modules()
                .iter()
                .any(|m| m.module.type_key() == mblob_runtime::exec::aot::AOT_EXECUTOR_FACTORY);
        graph || aot
    }

    /// The graph factory `name`: its graph JSON and its params as `(name, bytes, dtype, shape)`
    /// (what TVM's `get_graph_json` and `get_params` give), or None (an AOT model, no factory).
    #[allow(clippy::type_complexity)]
    fn graph_factory<'py>(
        &self,
        py: Python<'py>,
        name: &str,
    ) -> Option<(String, Vec<(String, Bound<'py, PyBytes>, String, Vec<i64>)>)> {
        use mblob_runtime::payload::graph::GraphExecutorFactory;
        let g = self.tree.find::<GraphExecutorFactory>().filter(|g| g.module_name == name)?;
        let params = g
            .params
            .iter()
            .map(|(n, t)| (n.clone(), PyBytes::new(py, &t.data), t.dtype.to_string(), t.shape.clone()))
            .collect();
        Some((g.graph_json.clone(), params))
    }

    /// Whether a host function `name` is found from the root (through the imports).
    fn has_function(&self, name: &str) -> bool {
        self.tree.packed_function(name).is_some()
    }

    /// Calls host function `name`. Arguments are ints, floats, strings, bytes, None, or
    /// `Tensor`s, passed by reference as `DLTensor`s: what the function writes into one
    /// (compiled functions write their outputs into their arguments) is in that `Tensor` after
    /// the call.
    /// Returns the function's return value (int, float, str, bytes or None).
    fn call(&self, py: Python<'_>, name: &str, args: &Bound<'_, PyList>) -> PyResult<Py<PyAny>> {
        if self.tree.packed_function(name).is_none() {
            return Err(crate::InputError::new_err(format!("no function `{name}` in the module or its imports")));
        }
        let mut plain: Vec<Arg> = Vec::with_capacity(args.len());
        for a in args.iter() {
            plain.push(Arg::from_py(&a)?);
        }
        let tree = self.tree.clone();
        let name = name.to_owned();
        let ret = run(py, move || call_host(&tree, &name, plain))?;
        Ok(match ret {
            Value::Int(v) => v.into_pyobject(py)?.into_any().unbind(),
            Value::Float(v) => v.into_pyobject(py)?.into_any().unbind(),
            Value::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
            Value::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
            _ => py.None(),
        })
    }
}

/// An argument of a host call, owned (made with the GIL, used without it).
enum Arg {
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    None,
    /// Shared with the caller's `Tensor`.
    Tensor(NdArray),
}

impl Arg {
    fn from_py(a: &Bound<'_, PyAny>) -> PyResult<Arg> {
        if a.is_none() {
            return Ok(Arg::None);
        }
        if let Ok(t) = a.cast::<PyTensorObj>() {
            let t = &t.get().inner;
            // Memory nothing may write (a library's constant) is passed as a copy.
            if t.storage().is_read_only() {
                return Ok(Arg::Tensor(t.copy(t.device()).map_err(|e| crate::InputError::new_err(e.to_string()))?));
            }
            return Ok(Arg::Tensor(t.clone()));
        }
        if a.is_instance_of::<pyo3::types::PyBool>() || a.is_instance_of::<pyo3::types::PyInt>() {
            return Ok(Arg::Int(a.extract()?));
        }
        if a.is_instance_of::<pyo3::types::PyFloat>() {
            return Ok(Arg::Float(a.extract()?));
        }
        if a.is_instance_of::<pyo3::types::PyString>() {
            return Ok(Arg::Str(a.extract()?));
        }
        if let Ok(b) = a.cast::<PyBytes>() {
            return Ok(Arg::Bytes(b.as_bytes().to_vec()));
        }
        Err(crate::InputError::new_err(format!(
            "cannot pass a {} to a compiled function (ints, floats, strings, bytes, None and Tensors only)",
            a.get_type().name()?
        )))
    }
}

/// Calls host function `name` (`exec::call`) with the tensors as they are (shared with the
/// caller's `Tensor`s, which see what the function wrote); returns its value.
fn call_host(tree: &LoadedTree, name: &str, args: Vec<Arg>) -> Result<Value, PyErrLater> {
    let mut values = Vec::with_capacity(args.len());
    for a in args {
        values.push(match a {
            Arg::Int(v) => Value::Int(v),
            Arg::Float(v) => Value::Float(v),
            Arg::Str(s) => Value::Str(s),
            Arg::Bytes(b) => Value::Bytes(b),
            Arg::None => Value::Null,
            Arg::Tensor(t) => Value::Tensor(t),
        });
    }
    mblob_runtime::exec::call(tree, name, &mut values).map_err(run_error)
}

/// Loads a shared library (running its initialisers, as TVM's `load_module` does) or a raw
/// blob file.
#[pyfunction]
pub fn load_library(py: Python<'_>, path: PathBuf) -> PyResult<Library> {
    let tree = run(py, move || {
        let registry = Registry::default();
        let options = LoadOptions::keep_unknown();
        let data = mblob_runtime::map_file(&path)?;
        if data.starts_with(b"\x7fELF") {
            drop(data);
            // SAFETY: loading a library runs its code (initialisers); the caller asked for
            // exactly that with `mblob.load_module`, as with TVM's `load_module`.
            #[allow(unsafe_code)]
            let tree = unsafe { mblob_runtime::load_library(&path, &registry, &options) }?;
            Ok(tree)
        } else {
            let layout = mblob_runtime::Layout::detect(&data, &registry)
                .map_err(|source| mblob_runtime::Error::Detect { path: path.clone(), source })?;
            Ok(mblob_runtime::load_blob(&data, layout, &registry, &options)?)
        }
    })?;
    Ok(Library { tree })
}

fn devices(devs: Vec<(i32, i32)>) -> Vec<Device> {
    devs.into_iter().map(|(device_type, device_id)| Device::from_dlpack(device_type, device_id)).collect()
}

/// Takes `m` for one call. A model is used by one call at a time: a call while another
/// thread's call uses it fails at once (RunError, as the C API's MBLOB_ERR_STATE) instead of
/// waiting for it; one that panicked earlier left it unusable.
fn take<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<std::sync::MutexGuard<'a, T>, PyErrLater> {
    match m.try_lock() {
        Ok(guard) => Ok(guard),
        Err(std::sync::TryLockError::WouldBlock) => Err(PyErrLater::Run(format!(
            "the {what} is in use by a call on another thread: a model belongs to one thread at a time (give each \
             thread its own; they may share one loaded library)"
        ))),
        Err(std::sync::TryLockError::Poisoned(_)) => Err(PyErrLater::Run(format!("the {what} failed earlier"))),
    }
}

/// A graph or AOT executor (`factory["default"](dev)`), as a [`Model`].
#[pyclass(frozen, module = "mblob._native")]
pub struct GraphExecutor {
    inner: Mutex<Model>,
}

impl GraphExecutor {
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Model) -> Result<T, PyErrLater> + Send) -> PyResult<T> {
        run(py, || {
            let mut guard = take(&self.inner, "executor")?;
            f(&mut guard)
        })
    }
}

#[pymethods]
impl GraphExecutor {
    /// Builds the executor of the library's factory on `devs` (`(device_type, id)` pairs):
    /// its storage on the first, parameters copied there once.
    #[new]
    fn new(py: Python<'_>, library: &Library, devs: Vec<(i32, i32)>) -> PyResult<GraphExecutor> {
        let tree = library.tree.clone();
        let devs = devices(devs);
        let inner = run(py, move || {
            let first = devs.first().copied().unwrap_or(Device::cpu(0));
            let runner: Box<dyn mblob_runtime::exec::Runner + Send> = match Model::kind_of(&tree) {
                Some(ModelKind::Graph) => {
                    Box::new(GraphFactory::from_tree(&tree).map_err(run_error)?.default(&devs).map_err(run_error)?)
                }
                Some(ModelKind::Aot) => Box::new(
                    mblob_runtime::exec::aot::AotFactory::from_tree(&tree)
                        .map_err(run_error)?
                        .default(&devs)
                        .map_err(run_error)?,
                ),
                _ => {
                    let modules = tree.type_keys().into_iter().map(str::to_owned).collect();
                    return Err(run_error(ExecError::NoFactory {
                        kind: "GraphExecutorFactory or AotExecutorFactory",
                        modules,
                    }));
                }
            };
            let kind = Model::kind_of(&tree).expect("matched");
            Ok(Model::with_runner(runner, kind, first))
        })?;
        Ok(GraphExecutor { inner: Mutex::new(inner) })
    }

    /// TVM's `graph_executor.create(graph_json, lib, dev)`: an executor of the graph JSON
    /// (`get_graph_json()`) whose ops call the functions of `library` (`get_lib()`, loaded on
    /// its own), on `devs`, without params (see `load_params`). The graph is checked against
    /// the library: an input error names the first kernel it lacks.
    #[staticmethod]
    fn create(py: Python<'_>, library: &Library, graph_json: String, devs: Vec<(i32, i32)>) -> PyResult<GraphExecutor> {
        let tree = library.tree.clone();
        let devs = devices(devs);
        let inner = run(py, move || {
            let factory = GraphFactory::from_parts(&graph_json, &tree, Vec::new())
                .map_err(|e| PyErrLater::Input(crate::message(&e)))?;
            let exec = factory.default(&devs).map_err(run_error)?;
            Ok(Model::with_runner(Box::new(exec), ModelKind::Graph, devs.first().copied().unwrap_or(Device::cpu(0))))
        })?;
        Ok(GraphExecutor { inner: Mutex::new(inner) })
    }

    /// TVM's `load_params(bytes)`: reads a params file (`save_param_dict`) and copies each
    /// param into the graph input of its name (params the graph does not take are skipped, as
    /// TVM does). Nothing is set unless every param the graph takes fits its input.
    fn load_params(&self, py: Python<'_>, data: Vec<u8>) -> PyResult<()> {
        self.with(py, move |e| {
            let params = read_params(&mblob_runtime::Bytes::from_vec(data)).map_err(|err| {
                PyErrLater::Input(format!("not a params file (save_param_dict): {}", crate::message(&err)))
            })?;
            let taken: Vec<_> = params.iter().filter_map(|(n, t)| Some((e.input_position(n)?, n, t))).collect();
            for &(i, name, t) in &taken {
                if let Some(info) = &e.params()[i].tensor {
                    if info.dtype != t.dtype || info.shape != t.shape {
                        return Err(PyErrLater::Input(format!(
                            "param `{name}` is {} {:?}, the graph's input `{name}` is {} {:?}",
                            t.dtype, t.shape, info.dtype, info.shape
                        )));
                    }
                }
            }
            for (i, _, t) in taken {
                let a = NdArray::from_tensor(t, Device::cpu(0)).map_err(run_error)?;
                e.set_input_at(i, Value::Tensor(a)).map_err(run_error)?;
            }
            Ok(())
        })
    }

    /// Copies a tensor (a `Tensor` or a numpy array) into the input `name`.
    fn set_input(&self, py: Python<'_>, name: String, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = Value::Tensor(tensor_in(array, &format!("input `{name}`"))?);
        self.with(py, move |e| e.set_input(Some(&name), v).map_err(run_error))
    }

    /// Runs the model once.
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |e| e.run().map_err(run_error))
    }

    /// Output `index`, a `Tensor` on the host (a copy: the next run writes the executor's own).
    fn get_output(&self, py: Python<'_>, index: usize) -> PyResult<Py<PyAny>> {
        let t = self.with(py, move |e| {
            let outputs = e.outputs().map_err(run_error)?;
            let count = outputs.len();
            let v = outputs.get(index).ok_or_else(|| run_error(ExecError::Index { what: "output", index, count }))?;
            let out = v.as_tensor().ok_or_else(|| PyErrLater::Run(format!("output {index} is a {}", v.kind())))?;
            // A copy, made while the executor is held: its own output storage is written again
            // by the next run.
            out.copy(Device::cpu(0)).map_err(run_error)
        })?;
        PyTensorObj::py(py, t)
    }

    /// The number of outputs.
    fn get_num_outputs(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |e| Ok(e.output_info().len()))
    }

    /// The inputs a caller sets: `(name, shape, dtype)`.
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<(String, Vec<i64>, String)>> {
        self.with(py, |e| {
            Ok(e.params()
                .iter()
                .filter_map(|p| p.tensor.as_ref())
                .map(|i| (i.name.clone(), i.shape.clone(), i.dtype.to_string()))
                .collect())
        })
    }
}

/// A Relax virtual machine.
#[pyclass(frozen, module = "mblob._native")]
pub struct RelaxVm {
    inner: Mutex<VirtualMachine>,
}

#[pymethods]
impl RelaxVm {
    /// The VM of the library's Relax executable, on device `(device_type, id)`.
    #[new]
    fn new(py: Python<'_>, library: &Library, dev: (i32, i32)) -> PyResult<RelaxVm> {
        let tree = library.tree.clone();
        let device = Device::from_dlpack(dev.0, dev.1);
        let vm = run(py, move || VirtualMachine::new(&tree, device).map_err(run_error))?;
        Ok(RelaxVm { inner: Mutex::new(vm) })
    }

    /// The VM functions' names.
    fn functions(&self) -> PyResult<Vec<String>> {
        let vm = take(&self.inner, "VM").map_err(PyErrLater::into_py_err)?;
        Ok(vm.functions().into_iter().map(|f| f.name).collect())
    }

    /// The parameter names of VM function `name` (TVM's `get_function_param_name`), or None.
    fn function_params(&self, name: &str) -> PyResult<Option<Vec<String>>> {
        let vm = take(&self.inner, "VM").map_err(PyErrLater::into_py_err)?;
        Ok(vm.functions().into_iter().find(|f| f.name == name).map(|f| f.params))
    }

    /// What each parameter of `name` takes, as the function checks it: "tensor", "shape",
    /// "prim", "tuple", "func" or "any".
    fn param_kinds(&self, name: &str) -> PyResult<Vec<&'static str>> {
        let vm = take(&self.inner, "VM").map_err(PyErrLater::into_py_err)?;
        let f = vm.functions().into_iter().find(|f| f.name == name);
        Ok(f.map(|f| f.kinds)
            .unwrap_or_default()
            .into_iter()
            .map(|k| match k {
                ParamKind::Tensor => "tensor",
                ParamKind::Shape => "shape",
                ParamKind::Prim(_) => "prim",
                ParamKind::Tuple(_) => "tuple",
                ParamKind::Func => "func",
                ParamKind::Str => "str",
                _ => "any",
            })
            .collect())
    }

    /// Calls `name` with values in their Python form (see `vm_value`); returns the result
    /// with its structure.
    fn invoke_values(&self, py: Python<'_>, name: String, args: &Bound<'_, PyList>) -> PyResult<Py<PyAny>> {
        let values = args.iter().map(|a| vm_value(&a, &mut Vec::new())).collect::<PyResult<Vec<_>>>()?;
        let result = run(py, || {
            let vm = take(&self.inner, "VM")?;
            vm.invoke(&name, &values).map_err(run_error)
        })?;
        py_value(py, &result)
    }

    /// Calls the packed function `name` (a VM builtin such as `vm.builtin.kv_state_popn`, a VM
    /// function or one of mblob's global functions), as TVM's
    /// `tvm.get_global_func(name)(*args)`. Tensors are passed by reference, as TVM passes its
    /// arrays: the result comes with the contents of every tensor argument after the call, in
    /// order, so that what a builtin wrote into one (`debug_get_kv`, the in-place sampling
    /// builtins) reaches the caller's arrays.
    fn call_function<'py>(
        &self,
        py: Python<'py>,
        name: String,
        args: &Bound<'py, PyList>,
    ) -> PyResult<(Py<PyAny>, Vec<Py<PyAny>>)> {
        let mut arrays = Vec::new();
        let values = args.iter().map(|a| vm_value(&a, &mut arrays)).collect::<PyResult<Vec<_>>>()?;
        let result = run(py, || {
            let vm = take(&self.inner, "VM")?;
            vm.invoke(&name, &values).map_err(run_error)
        })?;
        let after = arrays.into_iter().map(|a| PyTensorObj::py(py, a)).collect::<PyResult<Vec<_>>>()?;
        Ok((py_value(py, &result)?, after))
    }

    /// Calls VM function `name` with tensors (`Tensor`s or numpy arrays); returns its
    /// `Tensor`s (a bool in numpy's spelling either way: the VM passes it as the executable's
    /// TVM spells it).
    fn invoke(&self, py: Python<'_>, name: String, args: &Bound<'_, PyList>) -> PyResult<Vec<Py<PyAny>>> {
        let inputs = tensors_in(args)?;
        let outs = run(py, || {
            let vm = take(&self.inner, "VM")?;
            let result = vm.invoke(&name, &inputs).map_err(run_error)?;
            result
                .flatten()
                .into_iter()
                .map(|leaf| match leaf {
                    Value::Tensor(a) => Ok(a.clone()),
                    v => Err(PyErrLater::Run(format!("`{name}` returned a {} where tensors were expected", v.kind()))),
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        outs.into_iter().map(|a| PyTensorObj::py(py, a)).collect()
    }
}

/// A language-model library as MLC-LLM exports them, ready to generate greedily
/// ([`mblob_runtime::exec::llm::generate::LanguageModel`]).
#[pyclass(frozen, module = "mblob._native")]
pub struct LanguageModel {
    inner: Mutex<mblob_runtime::exec::llm::generate::LanguageModel>,
    metadata: String,
}

#[pymethods]
impl LanguageModel {
    /// The model of `library` on device `(device_type, id)`, its weights from the tensor cache
    /// in `weights` (None for weights bound into the library), pages of `page_size` tokens;
    /// `settings` by name: what `_metadata` gives, for a library without it, and the cache's
    /// sizes (`crate::llm_settings::options`); on OpenCL the kernels' programs loaded from
    /// `opencl_program_cache` (written there first when the file does not exist).
    #[new]
    #[pyo3(signature = (library, dev, weights, page_size, settings=None, opencl_program_cache=None))]
    fn new(
        py: Python<'_>,
        library: &Library,
        dev: (i32, i32),
        weights: Option<PathBuf>,
        page_size: i64,
        settings: Option<std::collections::BTreeMap<String, i64>>,
        opencl_program_cache: Option<PathBuf>,
    ) -> PyResult<LanguageModel> {
        use mblob_runtime::exec::llm::generate::LanguageModel as Lm;
        let tree = library.tree.clone();
        let device = Device::from_dlpack(dev.0, dev.1);
        let mut options = crate::llm_settings::options(page_size, &settings.unwrap_or_default())?;
        options.opencl_program_cache = opencl_program_cache;
        let lm = run(py, move || Lm::new(&tree, device, weights.as_deref(), &options).map_err(run_error))?;
        let metadata = match lm.vm().invoke("_metadata", &[]) {
            Ok(Value::Str(s)) => s,
            _ => "{}".into(),
        };
        Ok(LanguageModel { inner: Mutex::new(lm), metadata })
    }

    /// The model's `_metadata` JSON.
    #[getter]
    fn metadata(&self) -> &str {
        &self.metadata
    }

    /// Generates up to `max_new_tokens` tokens after `prompt` in a new KV cache, greedily at
    /// temperature 0, else with TVM's sampling and MLC-LLM's draws seeded `seed`:
    /// `(tokens, logits as float32 bytes, vocab, decode seconds per step)`.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (prompt, max_new_tokens, temperature = 0.0, top_p = 1.0, seed = 0))]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: Vec<i32>,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        seed: u32,
    ) -> PyResult<(Vec<i32>, Bound<'py, PyBytes>, usize, Vec<f64>)> {
        let sampling = Sampling { temperature, top_p, seed };
        self.turn(py, |lm| lm.generate_sampled(&prompt, max_new_tokens, &sampling, |_| {}))
    }

    /// Continues the sequence of the last generation in the same KV cache (its last new token,
    /// then `prompt`, through `extend` when the library has it), greedily: as `generate`.
    #[allow(clippy::type_complexity)]
    fn continue_generation<'py>(
        &self,
        py: Python<'py>,
        prompt: Vec<i32>,
        max_new_tokens: usize,
    ) -> PyResult<(Vec<i32>, Bound<'py, PyBytes>, usize, Vec<f64>)> {
        self.turn(py, |lm| lm.continue_sampled(&prompt, max_new_tokens, &Sampling::default(), |_| {}))
    }

    /// Generates `max_new_tokens` tokens after each of `prompts` in one batch, in a new KV
    /// cache (`batch_prefill`, `batch_decode`; sequence `i` seeded `seed + i`): `(tokens per
    /// sequence, logits of all as float32 bytes, vocab, decode seconds per step)`.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (prompts, max_new_tokens, temperature = 0.0, top_p = 1.0, seed = 0))]
    fn generate_batch<'py>(
        &self,
        py: Python<'py>,
        prompts: Vec<Vec<i32>>,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        seed: u32,
    ) -> PyResult<(Vec<Vec<i32>>, Bound<'py, PyBytes>, usize, Vec<f64>)> {
        let sampling = Sampling { temperature, top_p, seed };
        self.batch_turn(py, |lm| lm.generate_batch(&prompts, max_new_tokens, &sampling))
    }

    /// Continues the sequences of the last batch in the same KV cache, one prompt each (each
    /// sequence's last new token, then its prompt, through `batch_extend` when the library has
    /// `extend`), then decodes the batch: as `generate_batch`.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (prompts, max_new_tokens, temperature = 0.0, top_p = 1.0, seed = 0))]
    fn continue_batch<'py>(
        &self,
        py: Python<'py>,
        prompts: Vec<Vec<i32>>,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        seed: u32,
    ) -> PyResult<(Vec<Vec<i32>>, Bound<'py, PyBytes>, usize, Vec<f64>)> {
        let sampling = Sampling { temperature, top_p, seed };
        self.batch_turn(py, |lm| lm.continue_batch(&prompts, max_new_tokens, &sampling))
    }
}

impl LanguageModel {
    /// Runs `f` on the model without the GIL: its generation as Python gets it.
    #[allow(clippy::type_complexity)]
    fn turn<'py>(
        &self,
        py: Python<'py>,
        f: impl FnOnce(&mut llm::LanguageModel) -> Result<llm::Generation, llm::GenerateError> + Send,
    ) -> PyResult<(Vec<i32>, Bound<'py, PyBytes>, usize, Vec<f64>)> {
        let out = run(py, || {
            let mut lm = take(&self.inner, "model")?;
            f(&mut lm).map_err(run_error)
        })?;
        Ok(crate::llm_settings::generation_out(py, out))
    }

    /// Runs `f`, a turn of a batch, on the model without the GIL: `(tokens per sequence,
    /// logits of all as float32 bytes, vocab, decode seconds per step)`.
    #[allow(clippy::type_complexity)]
    fn batch_turn<'py>(
        &self,
        py: Python<'py>,
        f: impl FnOnce(&mut llm::LanguageModel) -> Result<Vec<llm::Generation>, llm::GenerateError> + Send,
    ) -> PyResult<(Vec<Vec<i32>>, Bound<'py, PyBytes>, usize, Vec<f64>)> {
        let outs = run(py, || {
            let mut lm = take(&self.inner, "model")?;
            f(&mut lm).map_err(run_error)
        })?;
        let vocab = outs.iter().find_map(|g| g.logits.first()).map_or(0, Vec::len);
        let bytes: Vec<u8> =
            outs.iter().flat_map(|g| g.logits.iter().flatten()).flat_map(|x| x.to_le_bytes()).collect();
        let times = outs.first().map(|g| g.decode_times.iter().map(|d| d.as_secs_f64()).collect()).unwrap_or_default();
        Ok((outs.into_iter().map(|g| g.tokens).collect(), PyBytes::new(py, &bytes), vocab, times))
    }
}

/// The params of a params file (`save_param_dict`) as `(name, bytes, dtype, shape)`, in the
/// file's order.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn read_params_file<'py>(
    py: Python<'py>,
    data: Vec<u8>,
) -> PyResult<Vec<(String, Bound<'py, PyBytes>, String, Vec<i64>)>> {
    let params = run(py, move || {
        read_params(&mblob_runtime::Bytes::from_vec(data))
            .map_err(|err| PyErrLater::Input(format!("not a params file (save_param_dict): {}", crate::message(&err))))
    })?;
    Ok(params
        .iter()
        .map(|(n, t)| (n.clone(), PyBytes::new(py, &t.data), t.dtype.to_string(), t.shape.clone()))
        .collect())
}

/// A Relay virtual machine (TVM 0.8 to 0.19's `VMExecutable`).
#[pyclass(frozen, module = "mblob._native")]
pub struct RelayVm {
    inner: RelayVirtualMachine,
}

#[pymethods]
impl RelayVm {
    /// The VM of the library's Relay VM executable, on device `(device_type, id)` (the CPU).
    #[new]
    fn new(py: Python<'_>, library: &Library, dev: (i32, i32)) -> PyResult<RelayVm> {
        let tree = library.tree.clone();
        let device = Device::from_dlpack(dev.0, dev.1);
        let inner = run(py, move || RelayVirtualMachine::new(&tree, device).map_err(run_error))?;
        Ok(RelayVm { inner })
    }

    /// The VM functions: `(name, parameter names)`.
    fn functions(&self) -> Vec<(String, Vec<String>)> {
        self.inner.functions().into_iter().map(|f| (f.name, f.params)).collect()
    }

    /// Calls VM function `name` with tensors (`Tensor`s or numpy arrays); returns its
    /// `Tensor`s (a returned tuple flattened).
    fn invoke(&self, py: Python<'_>, name: String, args: &Bound<'_, PyList>) -> PyResult<Vec<Py<PyAny>>> {
        let inputs = tensors_in(args)?;
        let outs = run(py, || {
            let out = self.inner.invoke(&name, &inputs).map_err(run_error)?;
            out.flatten()
                .into_iter()
                .map(|v| {
                    v.as_tensor()
                        .cloned()
                        .ok_or_else(|| PyErrLater::Run(format!("a Relay VM result of kind {}", v.kind())))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        outs.into_iter().map(|a| PyTensorObj::py(py, a)).collect()
    }

    /// Calls VM function `name` as `invoke` does; returns its result with TVM's structure: a
    /// `Tensor`, or a list of fields for an ADT (a tuple), nested.
    fn invoke_nested(&self, py: Python<'_>, name: String, args: &Bound<'_, PyList>) -> PyResult<Py<PyAny>> {
        let inputs = tensors_in(args)?;
        let out = run(py, || {
            let out = self.inner.invoke(&name, &inputs).map_err(run_error)?;
            relay_host(&out)
        })?;
        relay_vm_value(py, &out)
    }
}

/// A Relay VM result: a tensor, or an ADT's fields.
enum RelayHost {
    Tensor(NdArray),
    Adt(Vec<RelayHost>),
}

fn relay_host(v: &Value) -> Result<RelayHost, PyErrLater> {
    Ok(match v {
        Value::Tensor(t) => RelayHost::Tensor(t.clone()),
        Value::Tuple(fields) => RelayHost::Adt(fields.iter().map(relay_host).collect::<Result<_, _>>()?),
        Value::Object(o) => match o.downcast_ref::<mblob_runtime::exec::relay_vm::Adt>() {
            Some(adt) => RelayHost::Adt(adt.fields.iter().map(relay_host).collect::<Result<_, _>>()?),
            None => return Err(PyErrLater::Run(format!("a Relay VM result of type {}", o.type_key()))),
        },
        v => return Err(PyErrLater::Run(format!("a Relay VM result of kind {}", v.kind()))),
    })
}

/// A Relay VM result in Python: a `Tensor`, or a list of its fields for an ADT.
fn relay_vm_value(py: Python<'_>, v: &RelayHost) -> PyResult<Py<PyAny>> {
    Ok(match v {
        RelayHost::Tensor(t) => PyTensorObj::py(py, t.clone())?,
        RelayHost::Adt(fields) => {
            let items = fields.iter().map(|f| relay_vm_value(py, f)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
    })
}

/// A runtime object a VM function or builtin returned (TVM's `tvm.runtime.Object`), such as
/// the paged KV cache: held by Python and passed back as it is.
#[pyclass(frozen, module = "mblob._native", name = "Object")]
pub struct PyObjectRef {
    inner: ObjectRef,
}

#[pymethods]
impl PyObjectRef {
    /// TVM's type key of the object (e.g. `relax.vm.PagedAttentionKVCache`).
    #[getter]
    fn type_key(&self) -> &'static str {
        self.inner.type_key()
    }

    /// Whether both name the same object (TVM's `same_as`).
    fn same_as(&self, other: &PyObjectRef) -> bool {
        self.inner.ptr_eq(&other.inner)
    }

    /// The weights of a module that `vm.builtin.param_module_from_cache*` made (what its
    /// function `get_params` returns), as `Tensor`s.
    fn get_params(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        use mblob_runtime::exec::llm::lm::builtins::ParamModule;
        let module = self
            .inner
            .downcast_ref::<ParamModule>()
            .ok_or_else(|| RunError::new_err(format!("a {} has no function `get_params`", self.inner.type_key())))?;
        module.get_params().iter().map(|a| PyTensorObj::py(py, a.clone())).collect()
    }
}

/// A value from its Python form (made by `mblob.runtime`): a `Tensor` or a numpy array a tensor
/// (passed by reference: each is also pushed to `arrays`; a numpy array is first copied to a CPU
/// array), `("s", [ints])` a shape, a list a tuple, an int, a float, a str, None or an
/// [`PyObjectRef`].
fn vm_value(a: &Bound<'_, PyAny>, arrays: &mut Vec<NdArray>) -> PyResult<Value> {
    if a.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(o) = a.cast::<PyObjectRef>() {
        return Ok(Value::Object(o.get().inner.clone()));
    }
    if let Ok(items) = a.cast::<PyList>() {
        return Ok(Value::Tuple(items.iter().map(|i| vm_value(&i, arrays)).collect::<PyResult<_>>()?));
    }
    if a.is_instance_of::<PyTensorObj>() || a.hasattr("__array_interface__")? {
        let array = tensor_in(a, "a Relax function's argument")?;
        arrays.push(array.clone());
        return Ok(Value::Tensor(array));
    }
    if let Ok(t) = a.cast::<PyTuple>() {
        let tag: String = t.get_item(0)?.extract()?;
        return match tag.as_str() {
            "s" => Ok(Value::Shape(t.get_item(1)?.extract::<Vec<i64>>()?.into())),
            _ => Err(crate::InputError::new_err(format!("unknown value tag `{tag}`"))),
        };
    }
    if a.is_instance_of::<pyo3::types::PyBool>() || a.is_instance_of::<pyo3::types::PyInt>() {
        return Ok(Value::Int(a.extract()?));
    }
    if a.is_instance_of::<pyo3::types::PyFloat>() {
        return Ok(Value::Float(a.extract()?));
    }
    if a.is_instance_of::<pyo3::types::PyString>() {
        return Ok(Value::Str(a.extract()?));
    }
    Err(crate::InputError::new_err(format!(
        "cannot pass a {} to a Relax function (arrays, shapes, ints, floats, strings, None and tuples of them)",
        a.get_type().name()?
    )))
}

/// A result in its Python form (the inverse of [`vm_value`]): tensors as `Tensor`s, where the
/// VM left them.
fn py_value(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Tensor(t) => PyTensorObj::py(py, t.clone())?,
        Value::Tuple(items) => {
            let items = items.iter().map(|i| py_value(py, i)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
        Value::Shape(s) => ("s", s.to_vec()).into_pyobject(py)?.into_any().unbind(),
        Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::Float(f) => f.into_pyobject(py)?.into_any().unbind(),
        Value::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any().unbind(),
        Value::Object(o) => Py::new(py, PyObjectRef { inner: o.clone() })?.into_any(),
        Value::Null => py.None(),
    })
}

/// The tensors of a list of arguments ([`tensor_in`]).
fn tensors_in(args: &Bound<'_, PyList>) -> PyResult<Vec<Value>> {
    args.iter().enumerate().map(|(i, a)| Ok(Value::Tensor(tensor_in(&a, &format!("argument {i}"))?))).collect()
}

/// Registers the classes and functions of this file.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RunError", RunError::type_object(m.py())?)?;
    m.add_class::<Library>()?;
    m.add_class::<GraphExecutor>()?;
    m.add_class::<RelaxVm>()?;
    m.add_class::<PyObjectRef>()?;
    m.add_class::<PyTensorObj>()?;
    m.add_class::<LanguageModel>()?;
    m.add_class::<RelayVm>()?;
    m.add_function(wrap_pyfunction!(load_library, m)?)?;
    m.add_function(wrap_pyfunction!(read_params_file, m)?)?;
    Ok(())
}
