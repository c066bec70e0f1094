//! Loading a tensor cache (`vm.builtin.tensor_cache.load`): `cargo bench -p mblob-runtime
//! --features llm --bench tensor_cache [-- MIB]`.
//!
//! Writes a cache of `MIB` MiB (default 256) of float32 weights as
//! `tvm.contrib.tvmjs.dump_tensor_cache` lays it out (`tensor-cache.json`, 32 MiB raw shards,
//! records back to back), then times, in the same run and on the same files:
//! - mblob's [`TensorCache::load`] (shards mapped, aligned weights kept as views), alone and
//!   followed by one read of every weight (what a first inference does to them);
//! - the baseline: TVM's algorithm in Rust (each shard read whole into a buffer, each weight
//!   copied into a new tensor), as `TensorCacheMetadata::FileRecord::Load` does;
//! - TVM 0.27 itself, when `MBLOB_TVM_PYTHON` names a Python with TVM
//!   (`vm.builtin.tensor_cache.load(dir, 1, 0)`, timed in Python around the call).
//!
//! Prints the median of 5 runs of each (after one warm-up, files in the page cache) and the
//! ratios to the baseline and to TVM. A mapped load reads no weight: the pages come in when
//! first read, which the second row counts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use mblob_runtime::exec::llm::lm::tensor_cache::TensorCacheMetadata;
use mblob_runtime::exec::llm::lm::TensorCache;
use mblob_runtime::format::DataType;
use mblob_runtime::{Device, NdArray};

const SHARD: usize = 32 << 20;

/// A cache of `mib` MiB: weights of 4 MiB, 1 MiB and 64 KiB in turn.
fn write_cache(dir: &Path, mib: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let sizes = [4usize << 20, 1 << 20, 64 << 10];
    let (mut shards, mut records, mut current) = (Vec::new(), Vec::new(), Vec::<u8>::new());
    let mut total = 0usize;
    let flush = |current: &mut Vec<u8>, records: &mut Vec<serde_json::Value>, shards: &mut Vec<serde_json::Value>| {
        let name = format!("params_shard_{}.bin", shards.len());
        std::fs::write(dir.join(&name), &current).unwrap();
        shards.push(serde_json::json!({
            "dataPath": name, "format": "raw-shard", "nbytes": current.len(), "records": std::mem::take(records)
        }));
        current.clear();
    };
    let mut i = 0;
    while total < mib << 20 {
        let n = sizes[i % sizes.len()];
        if current.len() + n > SHARD && !current.is_empty() {
            flush(&mut current, &mut records, &mut shards);
        }
        records.push(serde_json::json!({
            "name": format!("param_{i}"), "shape": [n / 4 / 64, 64], "dtype": "float32", "format": "raw",
            "nbytes": n, "byteOffset": current.len()
        }));
        current.extend((0..n).map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8)));
        total += n;
        i += 1;
    }
    flush(&mut current, &mut records, &mut shards);
    let meta = serde_json::json!({ "metadata": { "ParamSize": i, "ParamBytes": total }, "records": shards });
    std::fs::write(dir.join("tensor-cache.json"), serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
}

/// TVM's algorithm: each shard read into one buffer (reused, as TVM reuses its string), each
/// weight copied into a new tensor.
fn load_by_copy(dir: &Path) -> Vec<NdArray> {
    use std::io::Read;
    let meta = TensorCacheMetadata::load(dir).unwrap();
    let mut out = Vec::new();
    let mut bytes = Vec::new();
    for shard in &meta.records {
        bytes.clear();
        std::fs::File::open(dir.join(&shard.data_path)).unwrap().read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as i64, shard.nbytes);
        for r in &shard.records {
            let at = r.byte_offset as usize;
            let data = &bytes[at..at + r.nbytes as usize];
            out.push(NdArray::from_bytes(data, &r.shape, DataType::F32, Device::cpu(0)).unwrap());
        }
    }
    out
}

fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

/// One read of every weight: the sum of one byte per 4 KiB page.
fn touch(cache: &TensorCache) -> u64 {
    let mut sum = 0u64;
    for name in cache.names() {
        let a = cache.get(name).unwrap();
        let mut page = [0u8; 1];
        let s = a.storage();
        for off in (0..s.nbytes()).step_by(4096) {
            s.read(off, &mut page).unwrap();
            sum += u64::from(page[0]);
        }
    }
    sum
}

fn main() {
    let mib: usize = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(256);
    let dir: PathBuf = std::env::temp_dir().join(format!("mblob-bench-tensor-cache-{mib}"));
    if !dir.join("tensor-cache.json").exists() {
        write_cache(&dir, mib);
    }
    let baseline = median(|| {
        std::hint::black_box(load_by_copy(&dir));
    });
    let mapped = median(|| {
        let mut c = TensorCache::new();
        c.load(&dir, Device::cpu(0)).unwrap();
        std::hint::black_box(c);
    });
    let mapped_touched = median(|| {
        let mut c = TensorCache::new();
        c.load(&dir, Device::cpu(0)).unwrap();
        std::hint::black_box(touch(&c));
    });
    let mut tvm = None;
    if let Ok(py) = std::env::var("MBLOB_TVM_PYTHON") {
        let script = r#"
import sys, time, tvm
load = tvm.get_global_func("vm.builtin.tensor_cache.load")
clear = tvm.get_global_func("vm.builtin.tensor_cache.clear")
ts = []
for i in range(6):
    clear()
    t = time.perf_counter()
    load(sys.argv[1], 1, 0)
    ts.append((time.perf_counter() - t) * 1e3)
clear()
print(sorted(ts[1:])[2])
"#;
        let out = std::process::Command::new(py).arg("-c").arg(script).arg(&dir).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        match text.trim().parse::<f64>() {
            Ok(t) => tvm = Some(t),
            Err(_) => eprintln!("TVM run failed: {}", String::from_utf8_lossy(&out.stderr)),
        }
    }
    println!("tensor cache of {mib} MiB ({}):", dir.display());
    println!("| load | median ms | vs baseline | vs TVM |");
    println!("|---|---|---|---|");
    let row = |what: &str, ms: f64| {
        let vs_tvm = tvm.map_or_else(|| "-".to_owned(), |t| format!("{:.3}", ms / t));
        println!("| {what} | {ms:.2} | {:.3} | {vs_tvm} |", ms / baseline);
    };
    if let Some(t) = tvm {
        row("TVM 0.27 vm.builtin.tensor_cache.load", t);
    }
    row("baseline: read shards, copy weights (TVM's algorithm in Rust)", baseline);
    row("mblob TensorCache::load (mapped)", mapped);
    row("mblob load + one read of every page", mapped_touched);
}
