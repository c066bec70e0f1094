//! `mblob._native`: the Rust side of the Python package `mblob` (PyO3, abi3).
//!
//! Each function here is a thin layer over the `mblob` library: arguments are checked and
//! converted, the work runs with the GIL released, and every error becomes a Python exception
//! of the `mblob.Error` family carrying mblob's message with its causes. A Rust panic never
//! reaches Python as one: it is caught and raised as `mblob.Error`.
//!
//! The Python-facing API (docstrings, argument defaults, dicts) lives in `mblob/__init__.py`;
//! these functions take plain arguments.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use mblob::export::{Backend, Export, ExportReport, SerializedBlob};
use mblob::pack::{CStyle, PackOptions};
use mblob::Error as MError;
use mblob_runtime::Layout;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod dlpack;
mod llm_settings;
mod run;
mod tensor;

create_exception!(mblob, Error, PyException, "Base class of every error mblob raises.");

/// Declares an exception class of the `mblob.Error` family that also subclasses a builtin
/// exception (`except ValueError` catches a bad argument as it would in TVM or numpy). The class
/// is made once per interpreter with `type(name, (mblob.Error, builtin), ...)`: pyo3's
/// `create_exception!` takes a single base.
macro_rules! family_exception {
    ($name:ident, $builtin:ty, $doc:literal) => {
        #[doc = $doc]
        pub struct $name;

        impl $name {
            /// The class, made on first use.
            pub fn type_object(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyType>> {
                static CELL: pyo3::sync::PyOnceLock<Py<pyo3::types::PyType>> = pyo3::sync::PyOnceLock::new();
                CELL.get_or_try_init(py, || $crate::family_type(py, stringify!($name), py.get_type::<$builtin>(), $doc))
                    .map(|t| t.bind(py).clone())
            }

            /// An exception of this class carrying `msg`.
            pub fn new_err(msg: impl Into<String>) -> PyErr {
                let msg = msg.into();
                Python::attach(|py| match Self::type_object(py) {
                    Ok(t) => PyErr::from_type(t, (msg,)),
                    Err(e) => e,
                })
            }
        }
    };
}
pub(crate) use family_exception;

/// `type(name, (mblob.Error, builtin), {"__doc__": doc, "__module__": "mblob"})`.
fn family_type(
    py: Python<'_>,
    name: &str,
    builtin: Bound<'_, pyo3::types::PyType>,
    doc: &str,
) -> PyResult<Py<pyo3::types::PyType>> {
    let dict = PyDict::new(py);
    dict.set_item("__doc__", doc)?;
    dict.set_item("__module__", "mblob")?;
    let bases = (py.get_type::<Error>(), builtin);
    let made = py.get_type::<pyo3::types::PyType>().call1((name, bases, dict))?;
    Ok(made.cast_into::<pyo3::types::PyType>()?.unbind())
}

family_exception!(
    FormatError,
    pyo3::exceptions::PyValueError,
    "A file is not what it claims: a malformed blob, payload or ELF file (also a ValueError)."
);
family_exception!(
    LoadError,
    pyo3::exceptions::PyOSError,
    "A library or module could not be loaded: dlopen, a missing loader or symbol (also an OSError)."
);
create_exception!(
    mblob,
    ExportError,
    Error,
    "An export or pack failed: the compiler, linker or LLVM refused, or a size limit was passed."
);
family_exception!(
    InputError,
    pyo3::exceptions::PyValueError,
    "An argument or a tree description makes no sense: bad layout, unknown field, missing host code, an array of the wrong kind (also a ValueError)."
);
family_exception!(FileError, pyo3::exceptions::PyOSError, "A file could not be read or written (also an OSError).");

/// The message of an error with its causes, as the command line prints it.
fn message(e: &(dyn std::error::Error + 'static)) -> String {
    mblob::with_causes(e)
}

/// The exception class for a runtime (load side) error.
fn runtime_class(e: &mblob_runtime::Error, msg: String) -> PyErr {
    use mblob_runtime::Error as R;
    match e {
        R::Blob { .. } | R::Elf { .. } | R::Payload { .. } | R::Detect { .. } => FormatError::new_err(msg),
        R::Io { .. } => FileError::new_err(msg),
        R::Dlopen { .. }
        | R::PrivateDlopen { .. }
        | R::NoLoader { .. }
        | R::Loader { .. }
        | R::MissingSymbol { .. }
        | R::Cuda(_) => LoadError::new_err(msg),
        _ => Error::new_err(msg),
    }
}

/// An mblob error as a Python exception of the matching class.
fn to_py(e: MError) -> PyErr {
    let msg = message(&e);
    match &e {
        MError::Runtime(r) => runtime_class(r, msg),
        MError::Io { .. } => FileError::new_err(msg),
        MError::Input { .. }
        | MError::Target { .. }
        | MError::Layout { .. }
        | MError::HostCode { .. }
        | MError::Options { .. }
        | MError::OutputPath { .. }
        | MError::Tree { .. }
        | MError::Linked { .. }
        | MError::Run { .. }
        | MError::Internal { .. }
        | MError::FeatureDisabled { .. } => InputError::new_err(msg),
        MError::Step { source, .. } if matches!(**source, MError::Io { .. }) => FileError::new_err(msg),
        _ => ExportError::new_err(msg),
    }
}

/// Runs `f` without the GIL, turning its errors into exceptions and a panic into
/// `mblob.Error` (never a crash, never a `PanicException`).
fn run<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, PyErrLater> + Send) -> PyResult<T> {
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match result {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.into_py_err()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown cause".into());
            Err(Error::new_err(format!("internal error in mblob (please report it): {what}")))
        }
    }
}

/// An error made without the GIL, turned into an exception once it is held again.
enum PyErrLater {
    Mblob(MError),
    Input(String),
    Run(String),
}

impl PyErrLater {
    fn into_py_err(self) -> PyErr {
        match self {
            PyErrLater::Mblob(e) => to_py(e),
            PyErrLater::Input(msg) => InputError::new_err(msg),
            PyErrLater::Run(msg) => run::RunError::new_err(msg),
        }
    }
}

impl From<MError> for PyErrLater {
    fn from(e: MError) -> Self {
        PyErrLater::Mblob(e)
    }
}

impl From<mblob_runtime::Error> for PyErrLater {
    fn from(e: mblob_runtime::Error) -> Self {
        PyErrLater::Mblob(e.into())
    }
}

fn layout(name: &str) -> PyResult<Layout> {
    Layout::from_name(name).ok_or_else(|| {
        InputError::new_err(format!(
            "unknown layout `{name}` (expected one of: {})",
            Layout::ALL.map(|l| l.name()).join(", ")
        ))
    })
}

fn backend(name: &str) -> PyResult<Backend> {
    name.parse::<Backend>().map_err(InputError::new_err)
}

/// The options `export` and `pack` share.
struct PackArgs {
    backend: Backend,
    layout: Layout,
    system_lib: bool,
    prefix: String,
    target: Option<String>,
    force_layout: bool,
}

impl PackArgs {
    /// The arguments, with the backend and layout names checked.
    fn parse(
        backend_name: &str,
        layout_name: &str,
        system_lib: bool,
        prefix: String,
        target: Option<String>,
        force_layout: bool,
    ) -> PyResult<PackArgs> {
        Ok(PackArgs {
            backend: backend(backend_name)?,
            layout: layout(layout_name)?,
            system_lib,
            prefix,
            target,
            force_layout,
        })
    }

    fn apply(&self, e: &mut Export) {
        e.backend(self.backend)
            .layout(self.layout)
            .system_lib(self.system_lib)
            .prefix(self.prefix.clone())
            .force_layout(self.force_layout);
        if let Some(t) = &self.target {
            e.target(t.clone());
        }
    }
}

/// What an export wrote, as a dict: `output`, `symbol` (None without imports), `blob_len`.
fn report_dict<'py>(py: Python<'py>, r: &ExportReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("output", r.output.display().to_string())?;
    d.set_item("symbol", r.symbol.clone())?;
    d.set_item("blob_len", r.blob_len)?;
    Ok(d)
}

/// `inspect --json` for one file, as a JSON string.
#[pyfunction]
#[pyo3(signature = (path, layout_name=None, prefix=None, load=false, keep_unknown=false))]
fn inspect_json(
    py: Python<'_>,
    path: PathBuf,
    layout_name: Option<&str>,
    prefix: Option<String>,
    load: bool,
    keep_unknown: bool,
) -> PyResult<String> {
    let options = mblob::inspect::Options { layout: layout_name.map(layout).transpose()?, prefix, load, keep_unknown };
    run(py, move || {
        let report = mblob::inspect::inspect_path(&path, &options)?;
        serde_json::to_string(&report).map_err(|e| PyErrLater::Input(format!("cannot write the report as JSON: {e}")))
    })
}

/// Builds a library from a tree description: `tree_json` (its text) with paths relative to
/// `base`, or the file `tree_path`.
#[pyfunction]
#[pyo3(signature = (output, tree_json, tree_path, base, backend_name, layout_name, system_lib, prefix, target, force_layout, allow_missing_functions=false))]
#[allow(clippy::too_many_arguments)]
fn export<'py>(
    py: Python<'py>,
    output: PathBuf,
    tree_json: Option<Vec<u8>>,
    tree_path: Option<PathBuf>,
    base: PathBuf,
    backend_name: &str,
    layout_name: &str,
    system_lib: bool,
    prefix: String,
    target: Option<String>,
    force_layout: bool,
    allow_missing_functions: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let args = PackArgs::parse(backend_name, layout_name, system_lib, prefix, target, force_layout)?;
    let report = run(py, move || {
        let mut e = match (tree_json, tree_path) {
            (Some(text), _) => mblob::tree_json::parse_tree_json(&text, Path::new("<tree>"), &base)?,
            (None, Some(path)) => mblob::tree_json::read_tree_json(&path)?,
            (None, None) => return Err(PyErrLater::Input("export: no tree given".into())),
        };
        args.apply(&mut e);
        e.allow_missing_functions(allow_missing_functions);
        Ok(e.write(&output)?)
    })?;
    report_dict(py, &report)
}

/// Packs the module tree of `source` (a `.so` or raw `.blob`) again with the host objects or
/// sources `host`.
#[pyfunction]
#[pyo3(signature = (source, output, host, blob_only, source_layout, backend_name, layout_name, system_lib, prefix, target, force_layout, flags=Vec::new(), link_args=Vec::new(), cc=None))]
#[allow(clippy::too_many_arguments)]
fn pack<'py>(
    py: Python<'py>,
    source: PathBuf,
    output: PathBuf,
    host: Vec<PathBuf>,
    blob_only: bool,
    source_layout: Option<&str>,
    backend_name: &str,
    layout_name: Option<&str>,
    system_lib: bool,
    prefix: String,
    target: Option<String>,
    force_layout: bool,
    flags: Vec<String>,
    link_args: Vec<String>,
    cc: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    if host.is_empty() && !blob_only {
        return Err(InputError::new_err(format!(
            "host: missing: the new library needs the host code of {} (its model functions), which the blob \
             does not hold; give the object files or sources it was built from (e.g. TVM's lib0.o), or pass \
             blob_only=True",
            source.display()
        )));
    }
    let from = source_layout.map(layout).transpose()?;
    // Without a layout the library keeps its own (checked below, once it is read).
    let keep_layout = layout_name.is_none();
    let args =
        PackArgs::parse(backend_name, layout_name.unwrap_or("classic"), system_lib, prefix, target, force_layout)?;
    let tools = HostTools { host, flags, link_args, cc };
    let report = run(py, move || {
        let (blob, found) = mblob::repack::read_blob(&source, from)?;
        let tree = mblob::repack::module_tree_of(&blob, found, &source)?;
        drop(blob);
        let mut e = Export::from_tree(tree);
        tools.apply(&mut e);
        args.apply(&mut e);
        if keep_layout {
            e.layout(found);
        }
        // A library of the blob alone has no host functions, by request.
        e.allow_missing_functions(blob_only);
        Ok(e.write(&output)?)
    })?;
    report_dict(py, &report)
}

/// The host code of an export and the tools that build it.
struct HostTools {
    host: Vec<PathBuf>,
    flags: Vec<String>,
    link_args: Vec<String>,
    cc: Option<PathBuf>,
}

impl HostTools {
    fn apply(self, e: &mut Export) {
        for h in self.host {
            let is_source = h.extension().is_some_and(|x| x == "c") || mblob::export::is_cxx(&h);
            if is_source {
                e.c_source(h);
            } else {
                e.object(h);
            }
        }
        for f in self.flags {
            e.flag(f);
        }
        for a in self.link_args {
            e.link_arg(a);
        }
        if let Some(cc) = self.cc {
            e.compiler(cc.clone()).driver(cc);
        }
    }
}

/// Writes a graph model's library: the module tree of the raw blob `template` (TVM's
/// serialization of the model's factory with empty parameters), with the parameters given as
/// `(name, dtype, shape, bytes)` in its factory, linked with `host` by the direct route.
#[pyfunction]
#[pyo3(signature = (template, output, host, params, layout_name, target=None, flags=Vec::new(), link_args=Vec::new(), cc=None))]
#[allow(clippy::too_many_arguments)]
fn pack_graph_params<'py>(
    py: Python<'py>,
    template: PathBuf,
    output: PathBuf,
    host: Vec<PathBuf>,
    params: Vec<(String, String, Vec<i64>, Bound<'py, PyAny>)>,
    layout_name: &str,
    target: Option<String>,
    flags: Vec<String>,
    link_args: Vec<String>,
    cc: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let layout = layout(layout_name)?;
    let mut tensors = std::collections::HashMap::with_capacity(params.len());
    for (name, dtype, shape, array) in params {
        let bytes = dlpack::ArrayBytes::new(&array, &format!("parameter `{name}`"))?;
        let dt = mblob_runtime::format::DataType::parse(&dtype)
            .ok_or_else(|| InputError::new_err(format!("parameter `{name}`: unknown dtype `{dtype}`")))?;
        let n = bytes.as_ref().len();
        let data = mblob_runtime::Bytes::from_owner(std::sync::Arc::new(bytes));
        let tensor = mblob_runtime::payload::graph::Tensor::new(dt, shape.clone(), data).ok_or_else(|| {
            InputError::new_err(format!(
                "parameter `{name}`: {n} bytes do not make a {dtype} tensor of shape {shape:?}"
            ))
        })?;
        tensors.insert(name, tensor);
    }
    let tools = HostTools { host, flags, link_args, cc };
    let report = run(py, move || {
        let data = mblob_runtime::map_file(&template)?;
        check_blob_header(&data, &template)?;
        let shape = mblob::repack::module_tree_of(&data, layout, &template)?;
        let tree = mblob::repack::with_graph_params(&shape, tensors)?;
        let mut e = Export::from_tree(tree);
        tools.apply(&mut e);
        e.layout(layout).backend(Backend::Direct);
        if let Some(t) = target {
            e.target(t);
        }
        Ok(e.write(&output)?)
    })?;
    report_dict(py, &report)
}

/// The blob symbol of a relocatable object (a `devc.o`, TVM's or mblob's) as a dict
/// (`symbol`, `layout`, `prefix`, `system_lib`), or None for any other file.
#[pyfunction]
fn blob_object<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Option<Bound<'py, PyDict>>> {
    let found = run(py, move || Ok(mblob::repack::blob_object(&path)?))?;
    let Some(found) = found else { return Ok(None) };
    let d = PyDict::new(py);
    d.set_item("symbol", found.symbol)?;
    d.set_item("layout", found.layout.name())?;
    d.set_item("prefix", found.prefix)?;
    d.set_item("system_lib", found.system_lib)?;
    Ok(Some(d))
}

/// The blob of a `.so` or raw `.blob` file, header included, and its layout's name.
#[pyfunction]
#[pyo3(signature = (path, layout_name=None))]
fn read_blob(py: Python<'_>, path: PathBuf, layout_name: Option<&str>) -> PyResult<(Py<pyo3::types::PyBytes>, String)> {
    let from = layout_name.map(layout).transpose()?;
    let (blob, layout) = run(py, move || Ok(mblob::repack::read_blob(&path, from)?))?;
    Ok((pyo3::types::PyBytes::new(py, &blob).unbind(), layout.name().to_owned()))
}

/// Writes the object that holds the blob in `blob_path` (header included, in the layout
/// `layout_name`) under the layout's symbol, into `out_dir`; returns its path
/// (`<prefix>devc.o`). The blob is decoded into its module tree and written again by mblob's
/// serializer (payload kinds mblob does not know are carried over as their bytes).
#[pyfunction]
#[pyo3(signature = (blob_path, out_dir, layout_name, system_lib, prefix, target, backend_name))]
#[allow(clippy::too_many_arguments)]
fn pack_blob_file(
    py: Python<'_>,
    blob_path: PathBuf,
    out_dir: PathBuf,
    layout_name: &str,
    system_lib: bool,
    prefix: String,
    target: Option<String>,
    backend_name: &str,
) -> PyResult<String> {
    let opts = PackOptions { layout: layout(layout_name)?, prefix, system_lib, target };
    let backend = backend(backend_name)?;
    let path = run(py, move || {
        let data = mblob_runtime::map_file(&blob_path)?;
        check_blob_header(&data, &blob_path)?;
        let tree = mblob::repack::module_tree_of(&data, opts.layout, &blob_path)?;
        let serialized = mblob_runtime::serialize(&tree).map_err(MError::from)?;
        let blob = SerializedBlob::new(&serialized, &tree, opts.layout)
            .map_err(|e| MError::input(blob_path.display().to_string(), e.to_string()))?;
        // TVM links the returned object itself, so the direct route (which writes the blob
        // into a library after linking) falls back to the LLVM object, as `Export` does where
        // it needs an object.
        let object = match backend {
            #[cfg(feature = "llvm")]
            Backend::Llvm | Backend::Direct => mblob::pack::llvm::write_object(&blob, &opts, &out_dir)?,
            #[cfg(not(feature = "llvm"))]
            Backend::Llvm | Backend::Direct => {
                return Err(MError::FeatureDisabled { what: "the LLVM backend".into(), feature: "llvm" }.into())
            }
            Backend::C(style) => {
                let src = mblob::pack::c::write_source_in_place(&blob, &opts, style, &out_dir)?;
                mblob::pack::c::compile_with(&src, &opts, &out_dir, style == CStyle::Tvm && opts.system_lib)?
            }
        };
        Ok(object.display().to_string())
    })?;
    Ok(path)
}

/// A blob's first 8 bytes give the length of the rest.
fn check_blob_header(data: &[u8], path: &Path) -> Result<(), PyErrLater> {
    let claimed = data.get(..8).map(|h| u64::from_le_bytes(h.try_into().unwrap_or_default()));
    if claimed.is_none() || claimed != (data.len() as u64).checked_sub(8) {
        return Err(PyErrLater::Mblob(MError::input(
            path.display().to_string(),
            format!("not a blob: {} bytes, whose first 8 do not give the length of the rest ({claimed:?})", data.len()),
        )));
    }
    Ok(())
}

/// The blob layout (mblob's one TVM-generation axis, `Layout::of_version`) a TVM version
/// string reads: `classic` up to 0.20, `classic-0.21` for 0.21, `ffi` from 0.22 on.
#[pyfunction]
fn layout_of_version(version: &str) -> PyResult<&'static str> {
    Layout::of_version(version)
        .map(Layout::name)
        .ok_or_else(|| InputError::new_err(format!("cannot read the TVM version `{version}`")))
}

/// Whether this build has the LLVM packer.
#[pyfunction]
fn has_llvm() -> bool {
    cfg!(feature = "llvm")
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("FormatError", FormatError::type_object(py)?)?;
    m.add("LoadError", LoadError::type_object(py)?)?;
    m.add("ExportError", py.get_type::<ExportError>())?;
    m.add("InputError", InputError::type_object(py)?)?;
    m.add("FileError", FileError::type_object(py)?)?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(export, m)?)?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(read_blob, m)?)?;
    m.add_function(wrap_pyfunction!(pack_blob_file, m)?)?;
    m.add_function(wrap_pyfunction!(blob_object, m)?)?;
    m.add_function(wrap_pyfunction!(pack_graph_params, m)?)?;
    m.add_function(wrap_pyfunction!(has_llvm, m)?)?;
    m.add_function(wrap_pyfunction!(layout_of_version, m)?)?;
    run::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
