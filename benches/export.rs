//! Export time and peak memory by blob size, backend and linker, as ratios to a floor measured
//! in the same run; and load time by payload size.
//!
//! `cargo bench --bench export` (sizes 1 MiB, 64 MiB, 512 MiB; add 2.5 GiB with
//! `MBLOB_BENCH_HUGE=1`; pick sizes with `MBLOB_BENCH_SIZES=1,64` in MiB). Each export runs in
//! a child process so that its peak RSS (VmHWM) is its own.
//!
//! Floor = writing the blob once (a file copy of the payload) + the fastest link of that size
//! seen in this run. Ratio = export time / floor.
//!
//! This VM's times for the same command vary by 2 to 3x from run to run (first-touch page
//! faults, `toolchain-measurements.md` section 7), so every route, and the copy, runs
//! `MBLOB_BENCH_REPS` times (default 3; once for 2.5 GiB) and the best time of each is used, the
//! floor's parts included. Peak RSS is the largest seen over the repetitions.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mblob::export::{Backend, Export};
use mblob::link::{find_lld, Linker};
use mblob::pack::CStyle;
use mblob_runtime::{load_library, map_file, LoadOptions, Opaque, Registry};

const MIB: u64 = 1 << 20;

/// Largest blob (MiB) the `c-tvm` route runs for.
const TVM_TEXT_ROUTE_MIB: u64 = 4;

/// A `kB` field of `/proc/self/status` (`VmHWM`, `VmRSS`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn vm_hwm_kib() -> u64 {
    status_kib("VmHWM")
}

fn vm_rss_kib() -> u64 {
    status_kib("VmRSS")
}

/// Child: export the payload file through `backend` with `linker`; print
/// `total_s pack_s link_s hwm_kib`.
fn child(payload: &Path, backend: &str, linker: &str, out: &Path) {
    let bytes = map_file(payload).expect("payload");
    let mut e = Export::new();
    e.import(Opaque::new("bench.Payload", bytes));
    e.backend(backend.parse::<Backend>().expect("backend")).linker(linker.parse::<Linker>().expect("linker"));
    let t = Instant::now();
    let report = e.write(out).expect("export");
    let total = t.elapsed().as_secs_f64();
    let stage = |name: &str| report.stages.iter().find(|(s, _)| *s == name).map_or(0.0, |(_, s)| *s);
    println!("{total} {} {} {}", stage("pack"), stage("link"), vm_hwm_kib());
}

fn payload_file(dir: &Path, mib: u64) -> PathBuf {
    let path = dir.join(format!("payload-{mib}.bin"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut chunk = vec![0u8; MIB as usize];
    for _ in 0..mib {
        for w in chunk.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            w.copy_from_slice(&state.to_le_bytes());
        }
        f.write_all(&chunk).unwrap();
    }
    f.flush().unwrap();
    path
}

/// One child run's numbers.
#[derive(Clone, Copy)]
struct Run {
    total: f64,
    pack: f64,
    link: f64,
    hwm_kib: u64,
}

impl Run {
    /// Best times of two runs (each field on its own), the larger peak RSS.
    fn best(self, other: Run) -> Run {
        Run {
            total: self.total.min(other.total),
            pack: self.pack.min(other.pack),
            link: self.link.min(other.link),
            hwm_kib: self.hwm_kib.max(other.hwm_kib),
        }
    }
}

fn run_child(payload: &Path, backend: &str, linker: &str, out: &Path) -> Option<Run> {
    let exe = std::env::current_exe().unwrap();
    let o = Command::new(exe)
        .args(["--child", payload.to_str().unwrap(), backend, linker, out.to_str().unwrap()])
        .output()
        .unwrap();
    if !o.status.success() {
        eprintln!("{backend}/{linker}: {}", String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or(""));
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut it = text.split_whitespace();
    Some(Run {
        total: it.next()?.parse().ok()?,
        pack: it.next()?.parse().ok()?,
        link: it.next()?.parse().ok()?,
        hwm_kib: it.next()?.parse().ok()?,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(Path::new(&args[2]), &args[3], &args[4], Path::new(&args[5]));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let mut sizes: Vec<u64> = std::env::var("MBLOB_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 64, 512]);
    if std::env::var_os("MBLOB_BENCH_HUGE").is_some() {
        sizes.push(2560);
    }
    let dir =
        tempfile::tempdir_in(std::env::var_os("MBLOB_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir))
            .unwrap();
    // TVM's C text is a route too, but only for small blobs: gcc needs minutes and GiBs for it
    // past a few MiB (the `tvm_text_compile` table compares it at a chosen size).
    let mut routes: Vec<(&str, &str)> = vec![("c", "default"), ("c-tvm", "default")];
    if find_lld().is_some() {
        routes.insert(0, ("c", "lld"));
    }
    if cfg!(feature = "llvm") {
        routes.insert(0, ("llvm", "default"));
        if find_lld().is_some() {
            routes.insert(0, ("llvm", "lld"));
        }
    }
    println!("machine: {} cores, {}", std::thread::available_parallelism().map_or(0, |n| n.get()), cpu_name());
    let reps: usize = std::env::var("MBLOB_BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    println!("| blob | backend | linker | export s | pack s | link s | floor s | ratio | peak RSS MiB | RSS / blob |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &mib in &sizes {
        let reps = if mib > 1024 { 1 } else { reps };
        let payload = payload_file(dir.path(), mib);
        let mut write_once = f64::INFINITY;
        for _ in 0..reps {
            let t = Instant::now();
            std::fs::copy(&payload, dir.path().join("copy.bin")).unwrap();
            write_once = write_once.min(t.elapsed().as_secs_f64());
            let _ = std::fs::remove_file(dir.path().join("copy.bin"));
        }
        // Routes take turns, so that a slow stretch of the VM spreads over all of them.
        let routes: Vec<(&str, &str)> =
            routes.iter().copied().filter(|&(backend, _)| backend != "c-tvm" || mib <= TVM_TEXT_ROUTE_MIB).collect();
        let mut results: Vec<Option<Run>> = vec![None; routes.len()];
        for _ in 0..reps {
            for (slot, &(backend, linker)) in results.iter_mut().zip(&routes) {
                let out = dir.path().join(format!("out-{backend}-{linker}.so"));
                if let Some(r) = run_child(&payload, backend, linker, &out) {
                    *slot = Some(slot.map_or(r, |b| b.best(r)));
                }
                let _ = std::fs::remove_file(&out);
            }
        }
        let fastest_link = results.iter().flatten().map(|r| r.link).fold(f64::INFINITY, f64::min);
        let floor = write_once + fastest_link;
        for (&(backend, linker), r) in routes.iter().zip(results) {
            let Some(r) = r else { continue };
            let rss_mib = r.hwm_kib as f64 / 1024.0;
            println!(
                "| {mib} MiB | {backend} | {linker} | {:.3} | {:.3} | {:.3} | {floor:.3} | {:.2} | {rss_mib:.0} | {:.2} |",
                r.total,
                r.pack,
                r.link,
                r.total / floor,
                rss_mib / mib as f64
            );
        }
        let _ = std::fs::remove_file(&payload);
    }
    load_scaling(dir.path());
    tvm_text_compile(dir.path());
}

/// Load time and memory growth by payload size: dlopen + parse + loaders.
fn load_scaling(dir: &Path) {
    println!("\n| payload | load ms (median of 9) | RSS growth MiB |");
    println!("|---|---|---|");
    for (label, len) in [("1 KiB", 1u64 << 10), ("1 MiB", MIB), ("1 GiB", 1 << 30)] {
        let payload = dir.join("load-payload.bin");
        let f = std::fs::File::create(&payload).unwrap();
        f.set_len(len).unwrap();
        drop(f);
        let so = dir.join(format!("load-{len}.so"));
        let mut e = Export::new();
        e.import(Opaque::new("bench.Payload", map_file(&payload).unwrap()));
        e.backend(Backend::C(CStyle::Fast));
        e.write(&so).unwrap();
        let _ = std::fs::remove_file(&payload);
        let registry = Registry::empty();
        let opts = LoadOptions::keep_unknown();
        let mut times = Vec::new();
        let mut growth = 0;
        for _ in 0..9 {
            let before = vm_rss_kib();
            let t = Instant::now();
            // SAFETY: a library this benchmark just linked from its own blob object.
            #[allow(unsafe_code)]
            let loaded = unsafe { load_library(&so, &registry, &opts) }.unwrap();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            growth = growth.max(vm_rss_kib().saturating_sub(before));
            drop(loaded);
        }
        times.sort_by(f64::total_cmp);
        println!("| {label} | {:.3} | {:.1} |", times[4], growth as f64 / 1024.0);
        let _ = std::fs::remove_file(&so);
    }
}

/// TVM's hex text against the fast C form, compiled with the same compiler.
fn tvm_text_compile(dir: &Path) {
    let mib: u64 = std::env::var("MBLOB_BENCH_TVM_TEXT_MIB").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let payload = payload_file(dir, mib);
    let blob = std::fs::read(&payload).unwrap();
    let opts = mblob::pack::PackOptions::default();
    println!("\n| C style ({mib} MiB) | write s | compile s |");
    println!("|---|---|---|");
    for (name, style) in [("tvm hex text", CStyle::Tvm), ("fast (.incbin)", CStyle::Fast)] {
        let sub = dir.join(name.split(' ').next().unwrap());
        std::fs::create_dir_all(&sub).unwrap();
        let t = Instant::now();
        let src = mblob::pack::c::write_source(&blob, &opts, style, &sub).unwrap();
        let write = t.elapsed().as_secs_f64();
        let t = Instant::now();
        mblob::pack::c::compile(&src, &opts, &sub).unwrap();
        println!("| {name} | {write:.3} | {:.3} |", t.elapsed().as_secs_f64());
    }
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        })
        .unwrap_or_default()
}
