//! Load time of a model: opening the library (`load_library`) and creating its executor
//! (`Model::new`: the Relax VM with its constants, or the graph executor with its params), as
//! `benches/constants_rss.sh` compares it with TVM's `load_module` + `VirtualMachine` /
//! `GraphModule` (`benches/constants_tvm.py`) on the same file:
//!
//! ```text
//! cargo bench -p mblob-runtime --bench load -- MODEL.so [REPEAT]
//! ```
//!
//! Each round loads the library afresh (the last round's tree dropped: `dlclose`), on the CPU.
//! Prints one JSON line: every round's seconds, their median and min.

use std::path::PathBuf;
use std::time::Instant;

use mblob_runtime::exec::Model;
use mblob_runtime::{load_library, Device, LoadOptions, Registry};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let Some(path) = args.first().map(PathBuf::from) else {
        eprintln!("usage: cargo bench -p mblob-runtime --bench load -- MODEL.so [REPEAT]");
        std::process::exit(2);
    };
    let repeat: usize = args.get(1).map_or(5, |r| r.parse().expect("REPEAT is a number"));
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let t = Instant::now();
        // SAFETY: the benchmark's own models, made by benches/constants_model.py.
        let tree = unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }.unwrap();
        let model = Model::new(&tree, Device::cpu(0)).unwrap();
        times.push(t.elapsed().as_secs_f64());
        drop(model);
        drop(tree);
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let list = times.iter().map(|t| format!("{t:.4}")).collect::<Vec<_>>().join(", ");
    println!(
        "{{\"file\": \"{}\", \"load_s\": [{list}], \"median_s\": {:.4}, \"min_s\": {:.4}}}",
        path.display(),
        sorted[sorted.len() / 2],
        sorted[0]
    );
}
