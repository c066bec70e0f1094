//! `mblob run`: run a TVM-compiled model (graph or AOT factory, a Relax or Relay VM executable) or
//! one host function of a plain library with `mblob-runtime` alone, on the CPU or the device
//! the library was built for, inputs and outputs as `.npy` files.

use std::ffi::OsString;
use std::num::NonZeroUsize;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use mblob_runtime::exec::{self, Device, Model, ModelKind, Value};
use mblob_runtime::ffi::threadpool;
use mblob_runtime::format::DataType;
use mblob_runtime::{load_library, LoadOptions, LoadedTree, NdArray, Registry};

use crate::{Error, Result};

/// Arguments of `mblob run`.
///
/// Examples:
///
/// ```text
/// mblob run model.so --input x=x.npy --output-dir out/          (graph, AOT, Relax or Relay VM model)
/// mblob run model.so --input x=x.npy --device opencl            (on an OpenCL device)
/// mblob run model.so --input x=x.npy --threads 1 --repeat 100   (timing)
/// mblob run lib.so --function add_one --input A=a.npy --output B=float32[4] --output-dir out/
/// ```
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct RunArgs {
    /// The shared library TVM exported (`export_library`) or mblob wrote.
    #[arg(value_name = "MODEL.so")]
    pub model: PathBuf,
    /// An input, as NAME=FILE.npy (repeatable). A graph or AOT model takes its inputs by
    /// name; a Relax model also takes FILE.npy for its next parameter in order. The names,
    /// shapes and dtypes are checked against the model's before anything runs. With
    /// `--function` on a plain library, the inputs are the function's first arguments, in the
    /// order given.
    #[arg(short, long = "input", value_name = "[NAME=]FILE.npy")]
    pub inputs: Vec<OsString>,
    /// Write the outputs here as out.0.npy, out.1.npy, ... in output order, all or none: they
    /// are written into a new directory beside DIR and moved into place when all are written.
    /// DIR must be new, empty or hold only an earlier run's out.K.npy files, which it then
    /// replaces as a set (checked before the model runs). SIGINT or SIGTERM while writing
    /// leaves nothing (status 130 or 143).
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// The device to run on: cpu, opencl or cuda, with :N for another ordinal (cuda:1).
    /// Default: the kind of device code the library holds when it holds exactly one kind
    /// (said on stderr), else the CPU.
    #[arg(short, long, value_name = "DEVICE")]
    pub device: Option<Device>,
    /// Threads for the kernels' parallel loops, this thread included: a number, at least 1
    /// (default: MBLOB_NUM_THREADS, then TVM_NUM_THREADS, then the number of cores).
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub threads: Option<NonZeroUsize>,
    /// Run N more times after the first and print the time per run (mean, median, min), as
    /// TVM's `time_evaluator` reports it. On a device, each run waits for its kernels.
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// For a Relax or Relay VM model: the VM function to call (default `main`, or a Relax
    /// library's only function). A parameter the function checks as a shape takes a 1-d integer .npy (as
    /// `run` writes returned shapes), an `R.Prim` one a 0-d .npy; a returned prim value is
    /// written as a 0-d int64 or float64 .npy, a string as its UTF-8 bytes. For a plain library
    /// (such as TVM's `tvm.build` output): the host function to call; its arguments are the
    /// inputs, then the outputs given with `--output`.
    #[arg(long, value_name = "NAME")]
    pub function: Option<String>,
    /// With `--function` on a plain library: an output argument, as `NAME=DTYPE[SHAPE]`, e.g.
    /// `B=float32[4]` or `y=int8[2,16]` (repeatable, in argument order).
    #[arg(long = "output", value_name = "NAME=DTYPE[SHAPE]", requires = "function", value_parser = output_spec)]
    pub outputs: Vec<String>,
    /// Run the library as TVM's graph executor does with this graph JSON (what `relay.build`'s
    /// `get_graph_json()` returns): the "classic trio" of a host library (`get_lib()`), its
    /// graph JSON and a params file, as `graph_executor.create(graph_json, lib, dev)` runs it.
    #[arg(long, value_name = "GRAPH.json")]
    pub graph: Option<PathBuf>,
    /// With `--graph`: the params file (`relay.save_param_dict(get_params())`), loaded as the
    /// graph executor's `load_params` does (params the graph does not take are skipped).
    #[arg(long, value_name = "FILE.params", requires = "graph")]
    pub params: Option<PathBuf>,
}

/// The end of `mblob run --help`.
const AFTER_HELP: &str = "\
Exit status: 0 done (outputs written), 1 failure (a file that cannot be read or is not what
it should be, an input the model does not take, a kernel that fails; nothing is written), 2
usage error (unknown option, malformed argument such as --output B=f32, --output without
--function, --input FILE without NAME= for a graph or AOT model, a malformed
MBLOB_NUM_THREADS or TVM_NUM_THREADS).

Environment:
  MBLOB_NUM_THREADS  threads when --threads is not given (a number, at least 1); else
                     TVM_NUM_THREADS, the same; else one per core
  MBLOB_LOG          log filter for stderr (e.g. `debug`); RUST_LOG when unset
  LD_LIBRARY_PATH    where libcuda.so, libnvrtc.so and libOpenCL.so.1 are found
  OCL_ICD_VENDORS, OPENCL_DYLIB_PATH, CUDA_PATH  the OpenCL and CUDA set-up (see mblob --help)";

/// Parses `--threads`: a number of at least 1.
pub(crate) fn thread_count(s: &str) -> std::result::Result<NonZeroUsize, String> {
    s.trim().parse().map_err(|_| "expected a number of threads, at least 1".to_owned())
}

/// Sizes the thread pool: `--threads` when given, else MBLOB_NUM_THREADS / TVM_NUM_THREADS
/// (checked here). `Err` is a usage error's message.
pub(crate) fn set_threads(threads: Option<NonZeroUsize>) -> std::result::Result<(), String> {
    match threads {
        Some(n) => threadpool::set_num_threads(n.get()),
        None => threadpool::env_num_threads().map(|_| ()).map_err(|e| e.to_string())?,
    }
    Ok(())
}

/// Checks the form of an `--output` value at parse time (a malformed one is a usage error).
fn output_spec(spec: &str) -> std::result::Result<String, String> {
    parse_output(spec).map(|_| spec.to_owned()).map_err(|_| "expected NAME=DTYPE[SHAPE], e.g. B=float32[4]".to_owned())
}

/// Splits `--input` values into an optional name and a path; the path may be any bytes, the
/// name must be text. `Err` is a usage error's message.
fn input_specs(inputs: &[OsString]) -> std::result::Result<Vec<(Option<String>, PathBuf)>, String> {
    inputs
        .iter()
        .map(|spec| {
            let bytes = spec.as_bytes();
            let Some(at) = bytes.iter().position(|&b| b == b'=') else {
                return Ok((None, PathBuf::from(spec)));
            };
            let (name, file) = (&bytes[..at], &bytes[at + 1..]);
            match std::str::from_utf8(name) {
                Ok(n) if !n.is_empty() && !file.is_empty() => {
                    Ok((Some(n.to_owned()), PathBuf::from(std::ffi::OsStr::from_bytes(file))))
                }
                _ => Err(format!("invalid value '{}' for '--input': expected NAME=FILE.npy", spec.to_string_lossy())),
            }
        })
        .collect()
}

/// Checks `-o DIR` before anything runs: DIR, or the nearest of its parents that exists (DIR
/// is created only when the outputs are written), must be a directory one can write in.
fn check_output_dir(dir: &Path) -> Result<()> {
    let existing = dir.ancestors().find(|a| !a.as_os_str().is_empty() && a.exists()).unwrap_or(Path::new("."));
    let io = |action: &'static str| move |source| Error::Io { path: existing.to_owned(), action, source };
    if !existing.is_dir() {
        return Err(io("cannot write outputs in")(std::io::Error::from(std::io::ErrorKind::NotADirectory)));
    }
    tempfile::NamedTempFile::new_in(existing).map_err(io("cannot write outputs in"))?;
    Ok(())
}

fn invalid(what: impl Into<String>, detail: impl Into<mblob::Detail>) -> Error {
    Error::Input { what: what.into(), detail: detail.into() }
}

/// Running `what` failed as `e` says.
fn run_failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Run { what: what.to_owned(), detail: e.to_string().into() }
}

/// The device to run on: the one asked for, else the one kind of device code the library
/// holds (said on stderr), else the CPU.
fn pick_device(tree: &LoadedTree, asked: Option<Device>) -> Device {
    if let Some(d) = asked {
        return d;
    }
    match exec::device_kinds(tree, 0)[..] {
        [kind] => {
            let d = Device { device_type: kind, device_id: 0 };
            eprintln!("mblob: running on {d}: the library holds {kind} device code (--device to choose)");
            d
        }
        _ => Device::cpu(0),
    }
}

/// Runs `mblob run`.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let usage = |message: String| Ok(super::usage_error("run", message));
    let specs = match input_specs(&args.inputs) {
        Ok(specs) => specs,
        Err(message) => return usage(message),
    };
    if let Err(message) = set_threads(args.threads) {
        return usage(message);
    }
    // SAFETY: running a model means running its code: the user asked for this file.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library(&args.model, &Registry::default(), &LoadOptions::keep_unknown()) }?;
    let model = args.model.display().to_string();
    let tree = match &args.graph {
        Some(graph) => graph_tree(&tree, &model, graph, args.params.as_deref())?,
        None => tree,
    };
    let kind = Model::kind_of(&tree);
    if let (Some(k @ (ModelKind::Graph | ModelKind::Aot)), Some((_, file))) =
        (kind, specs.iter().find(|(name, _)| name.is_none()))
    {
        return usage(format!(
            "invalid value '{}' for '--input': a {k:?} model takes its inputs by name, as NAME=FILE.npy",
            file.display()
        ));
    }
    if let Some(dir) = &args.output_dir {
        check_output_dir(dir)?;
        super::output::check_run_dir(dir)?;
    }
    let inputs: Vec<(Option<String>, NdArray)> =
        specs.into_iter().map(|(name, file)| Ok((name, read_npy(&file)?))).collect::<Result<_>>()?;
    let device = pick_device(&tree, args.device);
    let (outputs, times) = match (&args.function, kind) {
        (Some(name), None) => run_function(&tree, &model, name, device, &inputs, &args.outputs, args.repeat)?,
        (_, None) => {
            return Err(invalid(
                &model,
                format!(
                    "the library holds no model (modules: {}): call one of its functions with --function NAME",
                    tree.type_keys().join(", ")
                ),
            ))
        }
        (function, Some(_)) => {
            if !args.outputs.is_empty() {
                return usage(
                    "'--output' is only for --function on a plain library (a model knows its outputs)".into(),
                );
            }
            run_model(&tree, &model, device, function.as_deref(), &inputs, args.repeat)?
        }
    };
    write_outputs(args.output_dir.as_deref(), &outputs)?;
    super::output::print_times(&times);
    Ok(ExitCode::SUCCESS)
}

/// The classic trio: a tree whose root is a `GraphExecutorFactory` made of the graph JSON at
/// `graph` and the params file at `params`, importing the library `lib` (loaded from `model`).
/// Errors name the file at fault: the graph JSON when it does not parse or calls a function
/// the library lacks, the params file when it is not one.
fn graph_tree(lib: &LoadedTree, model: &str, graph: &Path, params_path: Option<&Path>) -> Result<LoadedTree> {
    if Model::kind_of(lib).is_some() {
        return Err(invalid(
            "--graph",
            format!(
                "{model} already holds a model ({:?}); --graph is for a host library (`get_lib()`)",
                Model::kind_of(lib)
            ),
        ));
    }
    let graph_name = graph.display().to_string();
    let json =
        std::fs::read(graph).map_err(|source| Error::Io { path: graph.to_owned(), action: "cannot read", source })?;
    let json = String::from_utf8(json).map_err(|_| invalid(&graph_name, "not a graph JSON: not UTF-8 text"))?;
    let params = match params_path {
        Some(p) => {
            // Mapped, not read: the executor copies each param once and gives the file's pages
            // back as it goes.
            let bytes = mblob_runtime::map_file(p)?;
            exec::graph::read_params(&bytes)
                .map_err(|e| invalid(p.display().to_string(), format!("not a params file (save_param_dict): {e}")))?
        }
        None => Vec::new(),
    };
    let factory = exec::graph::GraphFactory::from_parts(&json, lib, params).map_err(|e| {
        let what = match (&e, params_path) {
            (exec::ExecError::MissingFunction { .. }, _) => format!("{graph_name} does not match {model}"),
            (
                exec::ExecError::Params(_)
                | exec::ExecError::ParamsMagic { .. }
                | exec::ExecError::ParamsCount { .. }
                | exec::ExecError::ParamMismatch { .. },
                Some(p),
            ) => {
                format!("{} does not match {graph_name}", p.display())
            }
            _ => graph_name.clone(),
        };
        invalid(what, e.to_string())
    })?;
    Ok(factory.tree().clone())
}

/// Writes `DIR/out.0.npy`, `out.1.npy`, ... in output order, whole or not at all (nothing
/// without a directory; see [`super::output`]).
pub(crate) fn write_outputs(dir: Option<&Path>, outputs: &[NdArray]) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    let files = outputs.iter().enumerate().map(|(i, t)| npy_bytes(&dir.join(format!("out.{i}.npy")), t));
    super::output::write_run_outputs(dir, &files.collect::<Result<Vec<_>>>()?)
}

type Outcome = (Vec<NdArray>, Vec<f64>);

fn run_model(
    tree: &LoadedTree,
    model: &str,
    device: Device,
    function: Option<&str>,
    inputs: &[(Option<String>, NdArray)],
    repeat: Option<usize>,
) -> Result<Outcome> {
    let fail = |e: exec::ExecError| run_failed(model, e);
    let mut m = Model::new(tree, device).map_err(fail)?;
    let kind = m.kind();
    // A Relax or Relay VM model runs `--function`, else what `Model::new` chose (`main`, or a
    // Relax library's only function); without either, selecting `main` says what there is.
    if matches!(kind, ModelKind::Relax | ModelKind::RelayVm) {
        match function {
            Some(f) => m.select_function(f).map_err(fail)?,
            None if m.function().is_none() => m.select_function("main").map_err(fail)?,
            None => {}
        }
    } else if function.is_some() {
        return Err(invalid("--function", format!("a {kind:?} model has no functions to choose from")));
    }
    // The model checks every input (names, shapes and dtypes of graph and AOT models) as it
    // is set, and that every one it needs was given, before anything runs.
    for (name, a) in inputs {
        let index = match name {
            Some(n) => m.input_position(n),
            None => (0..m.params().len()).find(|&i| !m.is_set(i)),
        };
        if let (Some(n), Some(i)) = (name, index) {
            if m.is_set(i) {
                return Err(invalid(format!("--input {n}"), format!("`{n}` is given twice")));
            }
        }
        // A parameter a Relax function checks as a shape or a prim value takes a .npy that
        // says one (a 1-d integer array, a 0-d number).
        let param = index.and_then(|i| m.params().get(i)).map(|p| p.kind);
        let value = match param {
            Some(kind) => Value::for_param(a.clone(), kind).map_err(|e| invalid(model, e.to_string()))?,
            None => Value::Tensor(a.clone()),
        };
        m.set_input(name.as_deref(), value).map_err(fail)?;
    }
    m.run().map_err(|e| match e {
        exec::ExecError::MissingInputs { .. } => invalid(model, format!("{e} (give them with --input NAME=FILE.npy)")),
        e => fail(e),
    })?;
    let mut times = Vec::new();
    for _ in 0..repeat.unwrap_or(0) {
        let start = Instant::now();
        m.run().map_err(fail)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let mut outputs = Vec::new();
    for (i, o) in m.outputs().map_err(fail)?.into_iter().enumerate() {
        match &o {
            Value::Tensor(t) => println!("out.{i}: {} {:?}", t.dtype(), t.shape()),
            Value::Shape(s) => println!("out.{i}: shape {s:?}"),
            Value::Int(v) => println!("out.{i}: int {v}"),
            Value::Float(v) => println!("out.{i}: float {v}"),
            Value::Str(v) => println!("out.{i}: str {v:?}"),
            _ => {}
        }
        // A shape is written as a 1-d int64 array, as numpy sees a TVM shape, a prim value as
        // a 0-d int64 / float64 array, a string as its UTF-8 bytes (1-d uint8).
        let array = match &o {
            Value::Str(v) => {
                let dtype = DataType { code: 1, bits: 8, lanes: 1 };
                NdArray::from_bytes(v.as_bytes(), &[v.len() as i64], dtype, Device::cpu(0)).map(Some)
            }
            o => o.to_array(),
        }
        .map_err(|e| run_failed(model, format!("output {i}: {e}")))?;
        outputs.extend(array);
    }
    Ok((outputs, times))
}

/// Parses `NAME=DTYPE[d0,d1,...]`.
fn parse_output(spec: &str) -> Result<(String, DataType, Vec<i64>)> {
    let bad = || invalid(format!("--output {spec}"), "expected NAME=DTYPE[SHAPE], e.g. B=float32[4]");
    let (name, rest) = spec.split_once('=').ok_or_else(bad)?;
    let (dtype, shape) = rest.strip_suffix(']').and_then(|r| r.split_once('[')).ok_or_else(bad)?;
    let dtype = DataType::parse(dtype).ok_or_else(bad)?;
    let shape = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<i64>().ok().filter(|&d| d >= 0).ok_or_else(bad))
        .collect::<Result<Vec<_>>>()?;
    Ok((name.to_owned(), dtype, shape))
}

fn run_function(
    tree: &LoadedTree,
    model: &str,
    name: &str,
    device: Device,
    inputs: &[(Option<String>, NdArray)],
    outputs: &[String],
    repeat: Option<usize>,
) -> Result<Outcome> {
    let fail = |e: exec::ExecError| run_failed(model, e);
    let mut args: Vec<Value> = Vec::new();
    for (_, a) in inputs {
        args.push(Value::Tensor(a.to_device(device).map_err(|e| run_failed(model, e))?));
    }
    for spec in outputs {
        let (_, dtype, shape) = parse_output(spec)?;
        args.push(Value::Tensor(
            NdArray::empty(&shape, dtype, device).map_err(|e| invalid(format!("--output {spec}"), e.to_string()))?,
        ));
    }
    exec::call(tree, name, &mut args).map_err(fail)?;
    let mut times = Vec::new();
    for _ in 0..repeat.unwrap_or(0) {
        let start = Instant::now();
        exec::call(tree, name, &mut args).map_err(fail)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let outs: Vec<NdArray> = args[inputs.len()..].iter().filter_map(Value::as_tensor).cloned().collect();
    for (i, t) in outs.iter().enumerate() {
        println!("out.{i}: {} {:?}", t.dtype(), t.shape());
    }
    Ok((outs, times))
}

macro_rules! npy_types {
    ($m:ident) => {
        $m! {
            ("f", 2, half::f16, 2, 16), ("f", 4, f32, 2, 32), ("f", 8, f64, 2, 64),
            ("i", 1, i8, 0, 8), ("i", 2, i16, 0, 16), ("i", 4, i32, 0, 32), ("i", 8, i64, 0, 64),
            ("u", 1, u8, 1, 8), ("u", 2, u16, 1, 16), ("u", 4, u32, 1, 32), ("u", 8, u64, 1, 64)
        }
    };
}

/// Reads a `.npy` file (C order; float (16, 32, 64 bits), signed and unsigned integers and
/// bools, of any byte order) into a tensor on the CPU.
pub fn read_npy(path: &Path) -> Result<NdArray> {
    let bytes =
        std::fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), action: "cannot read", source })?;
    let what = path.display().to_string();
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| invalid(&what, format!("not a .npy file: {e}")))?;
    if npy.order() != npyz::Order::C {
        return Err(invalid(&what, "Fortran-order arrays are not supported (save with np.ascontiguousarray)"));
    }
    let shape: Vec<i64> = npy.shape().iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect();
    let npyz::DType::Plain(ts) = npy.dtype() else {
        return Err(invalid(&what, "structured arrays are not supported"));
    };
    let ts = ts.to_string();
    let (kind, size) = (ts.get(1..2).unwrap_or(""), ts.get(2..).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0));
    macro_rules! read {
        ($(($k:expr, $s:expr, $t:ty, $code:expr, $bits:expr)),*) => {
            match (kind, size) {
                $(($k, $s) => {
                    let v: Vec<$t> = npy.into_vec().map_err(|e| invalid(&what, e.to_string()))?;
                    (DataType { code: $code, bits: $bits, lanes: 1 }, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
                })*
                ("b", 1) => {
                    let v: Vec<bool> = npy.into_vec().map_err(|e| invalid(&what, e.to_string()))?;
                    (DataType::BOOL, v.iter().map(|&b| u8::from(b)).collect())
                }
                _ => return Err(invalid(&what, format!("dtype {ts} is not supported"))),
            }
        };
    }
    let (dtype, data) = npy_types!(read);
    NdArray::from_bytes(&data, &shape, dtype, Device::cpu(0)).map_err(|e| invalid(&what, e.to_string()))
}

/// Writes `t` (copied from its device) as a `.npy` file, atomically (a temporary file renamed
/// into place).
// Used by `generate` (feature `llm`).
#[cfg_attr(not(feature = "llm"), allow(dead_code))]
pub fn write_npy(path: &Path, t: &NdArray) -> Result<()> {
    super::output::write_file(path, &npy_bytes(path, t)?)
}

/// `t` as the bytes of a `.npy` file (`path` names it in errors).
fn npy_bytes(path: &Path, t: &NdArray) -> Result<Vec<u8>> {
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    let io = |action: &'static str| move |source| Error::Io { path: path.to_owned(), action, source };
    let data = t.to_bytes().map_err(|e| invalid(path.display().to_string(), e.to_string()))?;
    let dtype = t.dtype();
    let mut buf: Vec<u8> = Vec::new();
    macro_rules! write {
        ($(($k:expr, $s:expr, $ty:ty, $code:expr, $bits:expr)),*) => {
            match (dtype.code, dtype.bits, dtype.lanes) {
                $(($code, $bits, 1) => {
                    use npyz::WriterBuilder;
                    let mut w = npyz::WriteOptions::<$ty>::new().default_dtype().shape(&shape).writer(&mut buf).begin_nd().map_err(io("cannot encode"))?;
                    w.extend(data.chunks_exact($bits / 8).map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk size")))).map_err(io("cannot encode"))?;
                    w.finish().map_err(io("cannot encode"))?;
                })*
                (1, 1, 1) => {
                    use npyz::WriterBuilder;
                    let mut w = npyz::WriteOptions::<bool>::new().default_dtype().shape(&shape).writer(&mut buf).begin_nd().map_err(io("cannot encode"))?;
                    w.extend(data.iter().map(|&b| b != 0)).map_err(io("cannot encode"))?;
                    w.finish().map_err(io("cannot encode"))?;
                }
                _ => return Err(invalid(path.display().to_string(), format!("dtype {dtype} cannot be written as .npy"))),
            }
        };
    }
    npy_types!(write);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// float16 `.npy` files: what `write_npy` writes reads back unchanged, and a big-endian
    /// file (numpy `>f2`, header written here by hand) reads as the same little-endian values.
    #[test]
    fn float16_npy_round_trips_in_either_byte_order() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> =
            [0x3c00u16, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = NdArray::from_bytes(&data, &[2, 3], DataType { code: 2, bits: 16, lanes: 1 }, Device::cpu(0)).unwrap();
        let le = dir.path().join("le.npy");
        write_npy(&le, &t).unwrap();
        let back = read_npy(&le).unwrap();
        assert_eq!((back.dtype(), back.shape(), back.to_bytes().unwrap()), (t.dtype(), t.shape(), data.clone()));
        assert!(std::fs::read(&le).unwrap().windows(5).any(|w| w == b"'<f2'"), "float16 type string");
        let written = std::fs::read(&le).unwrap();
        assert_eq!((written.len() - data.len()) % 64, 0, "header padded to 64 bytes");

        let mut header = "{'descr': '>f2', 'fortran_order': False, 'shape': (2, 3), }".to_owned();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut be = b"\x93NUMPY\x01\x00".to_vec();
        be.extend_from_slice(&(header.len() as u16).to_le_bytes());
        be.extend_from_slice(header.as_bytes());
        be.extend(data.chunks_exact(2).flat_map(|c| [c[1], c[0]]));
        let path = dir.path().join("be.npy");
        std::fs::write(&path, &be).unwrap();
        assert_eq!(read_npy(&path).unwrap().to_bytes().unwrap(), data);

        // Fewer data bytes than the shape needs: an error, not a panic.
        std::fs::write(&path, &be[..be.len() - 3]).unwrap();
        assert!(read_npy(&path).is_err());
    }
}
