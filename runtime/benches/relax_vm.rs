//! Per-inference time of the Relax VM on TVM's relax goldens: `cargo bench -p mblob-runtime
//! --bench relax_vm [-- NAME...]`. Prints mean, median and min over repeated `invoke` calls
//! (inputs copied in from host tensors, outputs copied out). `relax_vm_tvm.py` measures
//! TVM's own VM on the same files for comparison.

#[path = "../tests/support/npyfile.rs"]
mod npyfile;

use std::path::{Path, PathBuf};
use std::time::Instant;

use mblob_runtime::exec::relax::VirtualMachine;
use mblob_runtime::exec::Value;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};

fn main() {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/run");
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let names: Vec<String> =
        if args.is_empty() { vec!["relax_mlp_tvm019".into(), "relax_mlp_tvm027".into()] } else { args };
    println!("| model | runs | mean us | median us | min us |");
    println!("|---|---|---|---|---|");
    for name in names {
        // SAFETY: TVM's golden libraries, built for these benchmarks' inputs.
        let tree =
            unsafe { load_library(&dir.join(format!("{name}.so")), &Registry::default(), &LoadOptions::default()) }
                .unwrap();
        let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
        let x = npyfile::tensor(&dir.join(format!("{name}.in.x.npy")));
        let run = || {
            let input = Value::Tensor(NdArray::from_tensor(&x, Device::cpu(0)).unwrap());
            let out = vm.invoke("main", &[input]).unwrap();
            out.flatten().iter().filter_map(|v| v.as_tensor()).map(|t| t.to_tensor().unwrap()).collect::<Vec<_>>()
        };
        for _ in 0..200 {
            run();
        }
        let runs = 5000;
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let out = run();
            times.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(out);
        }
        times.sort_by(f64::total_cmp);
        let mean = times.iter().sum::<f64>() / runs as f64;
        println!("| {name} | {runs} | {mean:.2} | {:.2} | {:.2} |", times[runs / 2], times[0]);
    }
}
