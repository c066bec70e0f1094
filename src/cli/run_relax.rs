//! `mblob run` on a Relax model (TVM 0.19 to 0.27): the VM function `main` (or `--function
//! NAME`) called with the inputs by parameter name (`--input x=x.npy`) or in parameter order
//! (`--input x.npy`), its outputs (a tuple flattened) written as `out.0.npy`, `out.1.npy`, ...

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use mblob_runtime::exec::relax::{
    Dialect, RelaxExecutable, VirtualMachine, VmOutput, RELAX_EXECUTABLE, RELAX_VM_EXECUTABLE,
};
use mblob_runtime::exec::Tensor;
use mblob_runtime::ffi::threadpool;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::format::{parse_blob, UnknownKeys};
use mblob_runtime::packed::DLDevice;
use mblob_runtime::{elf, load_library, map_file, LoadOptions, Registry};

use super::run::{read_npy, RunArgs};
use crate::{Error, Result};

/// numpy's bool as TVM 0.19 names it (`uint1`) and as tvm-ffi does (`kDLBool`, 8 bits).
const BOOL_UINT1: DataType = DataType { code: 1, bits: 1, lanes: 1 };
const BOOL_FFI: DataType = DataType { code: 6, bits: 8, lanes: 1 };

fn invalid(what: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::Invalid { what: what.into(), detail: detail.into() }
}

/// Whether the library's blob (read from the file, nothing run) holds a Relax executable.
pub fn is_relax_model(path: &Path) -> Result<bool> {
    let data = map_file(path)?;
    let Ok(Some(blob)) = elf::find_blob(&data, None) else { return Ok(false) };
    let Some(bytes) = blob.bytes(&data) else { return Ok(false) };
    let Ok(parsed) = parse_blob(bytes, blob.layout, &Registry::default(), UnknownKeys::KeepOpaque) else {
        return Ok(false);
    };
    let relax = parsed.modules().any(|e| e.type_key == RELAX_EXECUTABLE || e.type_key == RELAX_VM_EXECUTABLE);
    Ok(relax)
}

/// Runs `mblob run` on a Relax model.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let model = args.model.display().to_string();
    if !args.outputs.is_empty() {
        return Err(invalid("--output", "a Relax model's functions know their outputs"));
    }
    if let Some(n) = args.threads {
        if n == 0 {
            return Err(invalid("--threads", "must be at least 1"));
        }
        threadpool::set_num_threads(n);
    }
    // SAFETY: running a model means running its code: the user asked for this file.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library(&args.model, &Registry::default(), &LoadOptions::keep_unknown()) }?;
    let fail = |e: mblob_runtime::exec::relax::VmError| invalid(&model, e.to_string());
    let mut vm = VirtualMachine::new(&tree, DLDevice { device_type: 1, device_id: 0 }).map_err(fail)?;
    let function = args.function.as_deref().unwrap_or("main");
    let Some(sig) = vm.functions().into_iter().find(|f| f.name == function) else {
        let names: Vec<String> = vm.functions().into_iter().map(|f| f.name).collect();
        return Err(invalid(&model, format!("no VM function `{function}` (functions: {})", names.join(", "))));
    };
    let ffi_bool = tree.find::<RelaxExecutable>().is_some_and(|e| e.dialect == Dialect::Tvm022);

    // Inputs by name (NAME=FILE.npy) or in parameter order (FILE.npy); every parameter once.
    let mut slots: Vec<Option<Tensor>> = vec![None; sig.params.len()];
    let mut next = 0;
    for spec in &args.inputs {
        let (index, file) = match spec.split_once('=') {
            Some((name, file)) => {
                let i = sig.params.iter().position(|p| p == name).ok_or_else(|| {
                    invalid(format!("--input {spec}"), format!("`{function}` has parameters {}", sig.params.join(", ")))
                })?;
                (i, file)
            }
            None => {
                while slots.get(next).is_some_and(Option::is_some) {
                    next += 1;
                }
                (next, spec.as_str())
            }
        };
        let slot = slots.get_mut(index).ok_or_else(|| {
            invalid(format!("--input {spec}"), format!("`{function}` takes {} inputs", sig.params.len()))
        })?;
        if slot.is_some() {
            return Err(invalid(format!("--input {spec}"), format!("`{}` is given twice", sig.params[index])));
        }
        let mut t = read_npy(Path::new(file))?;
        if ffi_bool && t.dtype == BOOL_UINT1 {
            t.dtype = BOOL_FFI;
        }
        *slot = Some(t);
    }
    let missing: Vec<&str> =
        sig.params.iter().zip(&slots).filter(|(_, s)| s.is_none()).map(|(p, _)| p.as_str()).collect();
    if !missing.is_empty() {
        return Err(invalid(
            &model,
            format!("missing inputs of `{function}`: {} (give them with --input NAME=FILE.npy)", missing.join(", ")),
        ));
    }
    let inputs: Vec<Tensor> = slots.into_iter().flatten().collect();

    let mut results = vm.invoke_outputs(function, &inputs).map_err(fail)?;
    let mut times = Vec::new();
    for _ in 0..args.repeat.unwrap_or(0) {
        let start = Instant::now();
        results = vm.invoke_outputs(function, &inputs).map_err(fail)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let mut outputs = Vec::with_capacity(results.len());
    for (i, r) in results.into_iter().enumerate() {
        match r {
            VmOutput::Tensor(mut t) => {
                if t.dtype == BOOL_FFI {
                    t.dtype = BOOL_UINT1;
                }
                println!("out.{i}: {} {:?}", t.dtype, t.shape);
                outputs.push(t);
            }
            // A shape is written as a 1-d int64 array, as numpy sees a TVM shape.
            VmOutput::Shape(s) => {
                println!("out.{i}: shape {s:?}");
                let data: Vec<u8> = s.iter().flat_map(|d| d.to_le_bytes()).collect();
                let t = Tensor::new(DataType { code: 0, bits: 64, lanes: 1 }, vec![s.len() as i64], data)
                    .ok_or_else(|| invalid(&model, format!("output {i}: shape {s:?} too long")))?;
                outputs.push(t);
            }
        }
    }
    super::run::write_outputs(args.output_dir.as_deref(), &outputs)?;
    super::run::print_times(&times);
    Ok(ExitCode::SUCCESS)
}
