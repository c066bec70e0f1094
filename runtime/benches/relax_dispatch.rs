//! The Relax VM's own cost per call, against TVM's VM on the same library: `cargo bench -p
//! mblob-runtime --bench relax_dispatch [-- RUNS]`.
//!
//! `benches/fixtures/relax-dispatch/relax_dispatch.so` (made by TVM 0.27, see its README) holds
//! a function of 32 instructions whose eight kernels each add one to four floats, so that a call
//! costs what the VM itself does: its instructions, builtins, storage and kernel calls. The
//! bench first checks mblob's output against TVM's (`relax_dispatch.out.0.npy`), then times
//! RUNS calls (default 20000, after 1000 warm-up calls), one by one:
//!
//! - `invoke`: the input already on the device, the output left there, as TVM's
//!   `vm["main"](x)` takes and returns them (the like-for-like row);
//! - `invoke` with copies: a host tensor copied into a new array, the output copied out.
//!
//! With `TVM_PYTHON` set to a Python that has TVM 0.27 (`apache-tvm`), it then runs
//! `make.py --time RUNS` with it, which times TVM's VM on the same `.so` (`time_evaluator` and
//! a Python loop), and prints mblob's median over TVM's `time_evaluator` median.

#[path = "../tests/support/npyfile.rs"]
mod npyfile;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::exec::Value;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};

/// Mean, median and min in microseconds of `runs` timed calls of `f`.
fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..1000 {
        f();
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    (times.iter().sum::<f64>() / runs as f64, times[runs / 2], times[0])
}

fn main() {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/fixtures/relax-dispatch");
    let runs: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(20000);
    // SAFETY: TVM's library, built by make.py beside it for this bench.
    let tree =
        unsafe { load_library(&dir.join("relax_dispatch.so"), &Registry::default(), &LoadOptions::default()) }.unwrap();
    let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
    let x = npyfile::tensor(&dir.join("relax_dispatch.in.x.npy"));
    let expected = npyfile::tensor(&dir.join("relax_dispatch.out.0.npy"));
    // A host tensor copied in, the output copied out.
    let copied = |x: &Tensor| -> Tensor {
        let input = Value::Tensor(NdArray::from_tensor(x, Device::cpu(0)).unwrap());
        vm.invoke("main", &[input]).unwrap().as_tensor().expect("a tensor").to_tensor().unwrap()
    };
    let out = copied(&x);
    assert_eq!((out.dtype, &out.shape, &out.data[..]), (expected.dtype, &expected.shape, &expected.data[..]));
    let xa = [Value::Tensor(NdArray::from_bytes(&x.data, &x.shape, x.dtype, Device::cpu(0)).unwrap())];
    let got = vm.invoke("main", &xa).unwrap();
    assert_eq!(got.as_tensor().expect("a tensor").to_tensor().unwrap().data[..], expected.data[..]);

    println!("| who | runs | mean us | median us | min us |");
    println!("|---|---|---|---|---|");
    let arrays = time(runs, || {
        std::hint::black_box(vm.invoke("main", &xa).unwrap());
    });
    println!("| mblob invoke | {runs} | {:.3} | {:.3} | {:.3} |", arrays.0, arrays.1, arrays.2);
    let copies = time(runs, || {
        std::hint::black_box(copied(&x));
    });
    println!("| mblob invoke (copies in and out) | {runs} | {:.3} | {:.3} | {:.3} |", copies.0, copies.1, copies.2);

    let Some(python) = std::env::var_os("TVM_PYTHON") else {
        println!("(TVM_PYTHON unset: TVM's VM not timed)");
        return;
    };
    let out = Command::new(python).arg(dir.join("make.py")).args(["--time", &runs.to_string()]).output().unwrap();
    assert!(out.status.success(), "make.py --time failed: {}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or("")).unwrap();
    for (key, label) in [("time_evaluator", "time_evaluator"), ("python_loop", "vm[\"main\"](x) from Python")] {
        let r = &report[key];
        println!(
            "| TVM {} {label} | {runs} | {:.3} | {:.3} | {:.3} |",
            report["tvm"].as_str().unwrap_or("?"),
            r["mean_us"].as_f64().unwrap(),
            r["median_us"].as_f64().unwrap(),
            r["min_us"].as_f64().unwrap()
        );
    }
    let tvm = report["time_evaluator"]["median_us"].as_f64().unwrap();
    println!(
        "median ratio mblob/TVM (time_evaluator): invoke {:.2}, with copies {:.2}",
        arrays.1 / tvm,
        copies.1 / tvm
    );
}
