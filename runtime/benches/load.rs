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
//! Prints one JSON line: every round's wall-clock seconds, their median and min, and the same
//! for the process's CPU time (user + system, `CLOCK_PROCESS_CPUTIME_ID`, as Python's
//! `time.process_time`), which other jobs on a shared machine disturb less.

use std::path::PathBuf;
use std::time::Instant;

use mblob_runtime::exec::Model;
use mblob_runtime::{load_library, Device, LoadOptions, Registry};

/// The CPU time the process has used, in seconds.
#[allow(unsafe_code)]
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one `timespec` through the valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// `"NAME_s": [...], "NAME_median_s": M, "NAME_min_s": m`.
fn summary(name: &str, times: &[f64]) -> String {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let list = times.iter().map(|t| format!("{t:.4}")).collect::<Vec<_>>().join(", ");
    format!(
        "\"{name}_s\": [{list}], \"{name}_median_s\": {:.4}, \"{name}_min_s\": {:.4}",
        sorted[sorted.len() / 2],
        sorted[0]
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let Some(path) = args.first().map(PathBuf::from) else {
        eprintln!("usage: cargo bench -p mblob-runtime --bench load -- MODEL.so [REPEAT]");
        std::process::exit(2);
    };
    let repeat: usize = args.get(1).map_or(5, |r| r.parse().expect("REPEAT is a number"));
    let (mut wall, mut cpu) = (Vec::with_capacity(repeat), Vec::with_capacity(repeat));
    for _ in 0..repeat {
        let (t, c) = (Instant::now(), cpu_seconds());
        // SAFETY: the benchmark's own models, made by benches/constants_model.py.
        let tree = unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }.unwrap();
        let model = Model::new(&tree, Device::cpu(0)).unwrap();
        wall.push(t.elapsed().as_secs_f64());
        cpu.push(cpu_seconds() - c);
        drop(model);
        drop(tree);
    }
    println!("{{\"file\": \"{}\", {}, {}}}", path.display(), summary("load", &wall), summary("cpu", &cpu));
}
