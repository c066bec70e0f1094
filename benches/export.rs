//! Export time and peak memory by blob size and route, as ratios to a floor measured in the
//! same run; load time by payload size; TVM's C text against the fast C form. Writes the
//! numbers to `benches/results/export.json` and a plot to `benches/results/export.svg`.
//!
//! `cargo bench --bench export` (sizes 1, 64 and 512 MiB; pick sizes with
//! `MBLOB_BENCH_SIZES=1,64` in MiB, add 2.5 GiB with `MBLOB_BENCH_HUGE=1`). Each export runs in
//! a child process (the bench binary again), which reports its own peak RSS (`VmHWM`) and the
//! largest of its children's (compiler, linker: `getrusage(RUSAGE_CHILDREN)`). The payload is
//! a file of random bytes, mapped, as `mblob export` reads payload files.
//!
//! Routes: `direct` (the default), `llvm` and `c` with ld.lld and with GNU ld, `c-tvm` up to
//! 4 MiB. Floor = the same blob (written to a file beforehand) as one `.incbin` object
//! (`cc -c` of a one-line assembly file) + the fastest link (ld.lld when installed), timed in
//! the same way, in the same run. Ratio = route time / floor time.
//!
//! This VM's times for the same command vary by 2 to 3x from run to run (first-touch page
//! faults, `toolchain-measurements.md` section 7, and other jobs on its 2 cores), so every
//! route and the floor run `MBLOB_BENCH_REPS` times (default 3; once for 2.5 GiB), routes
//! taking turns, and the best time of each is used. Peak RSS is the largest seen. Before
//! each run, `sync` writes back what the previous one left dirty (untimed).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mblob::export::{Backend, Export};
use mblob::link::{find_lld, Linker};
use mblob::pack::CStyle;
use mblob_runtime::{load_library, map_file, serialize, Layout, LoadOptions, ModuleTree, RawPayload, Registry};
use serde_json::json;

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

/// Peak RSS (KiB) of the largest child process waited for so far.
fn children_max_rss_kib() -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given; nothing else is touched.
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    u64::try_from(usage.ru_maxrss).unwrap_or(0)
}

/// Child: export the payload file through `backend` with `linker`; print
/// `total_s pack_s link_s hwm_kib children_kib`.
fn child(payload: &Path, backend: &str, linker: &str, out: &Path) {
    let bytes = map_file(payload).expect("payload");
    let mut e = Export::new();
    e.import(RawPayload::new("bench.Payload", bytes));
    e.backend(backend.parse::<Backend>().expect("backend")).linker(linker.parse::<Linker>().expect("linker"));
    let t = Instant::now();
    let report = e.write(out).expect("export");
    let total = t.elapsed().as_secs_f64();
    let stage = |name: &str| report.stages.iter().find(|(s, _)| *s == name).map_or(0.0, |(_, s)| *s);
    println!("{total} {} {} {} {}", stage("pack"), stage("link"), vm_hwm_kib(), children_max_rss_kib());
}

/// Child: the floor. Assemble `blob` with `.incbin` and link it with the fastest linker; print
/// the same fields as [`child`] (pack = the assembler).
fn floor_child(blob: &Path, out: &Path) {
    let dir = out.parent().unwrap();
    let asm = dir.join("floor.s");
    let obj = dir.join("floor.o");
    let len = std::fs::metadata(blob).unwrap().len();
    std::fs::write(
        &asm,
        format!(
            ".section .lrodata,\"al\",@progbits\n.globl __tvm_dev_mblob\n.type __tvm_dev_mblob,@object\n\
             .size __tvm_dev_mblob,{len}\n__tvm_dev_mblob:\n.incbin \"{}\"\n.section .note.GNU-stack,\"\",@progbits\n",
            blob.display()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let ok = Command::new("cc").arg("-c").arg(&asm).arg("-o").arg(&obj).status().unwrap();
    assert!(ok.success());
    let assemble = t.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let mut link = Command::new("cc");
    link.args(["-shared", "-Wl,-z,noexecstack", "-o"]).arg(out).arg(&obj);
    if let Some(dir) = find_lld() {
        link.arg(format!("-B{}", dir.display())).arg("-fuse-ld=lld");
    }
    assert!(link.status().unwrap().success());
    let link_s = t2.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&obj);
    println!("{} {assemble} {link_s} {} {}", t.elapsed().as_secs_f64(), vm_hwm_kib(), children_max_rss_kib());
}

/// Writes back the dirty pages the previous run left (untimed), so that no run pays for the
/// writeback of another's gigabyte of output: without it, a route's time depended on which
/// route ran before it (the C route's link took 0.33 to 1.0 s for the same object).
fn settle() {
    let _ = Command::new("sync").status();
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

/// The blob the exports write for `payload`, in a file (for the floor).
fn blob_file(dir: &Path, payload: &Path) -> PathBuf {
    let mut tree = ModuleTree::new();
    let root = tree.add_dso("llvm");
    let p = tree.add_payload(RawPayload::new("bench.Payload", map_file(payload).unwrap()));
    tree.import(root, p);
    let s = serialize(&tree).unwrap();
    let path = dir.join("blob.bin");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    s.write_blob(&tree, Layout::Classic, &mut f).unwrap();
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
    child_kib: u64,
}

impl Run {
    /// Best times of two runs (each field on its own), the larger peak RSS.
    fn best(self, other: Run) -> Run {
        Run {
            total: self.total.min(other.total),
            pack: self.pack.min(other.pack),
            link: self.link.min(other.link),
            hwm_kib: self.hwm_kib.max(other.hwm_kib),
            child_kib: self.child_kib.max(other.child_kib),
        }
    }
}

fn run_child(args: &[&str]) -> Option<Run> {
    let exe = std::env::current_exe().unwrap();
    let o = Command::new(exe).args(args).output().unwrap();
    if !o.status.success() {
        eprintln!("{args:?}: {}", String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or(""));
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut it = text.split_whitespace();
    Some(Run {
        total: it.next()?.parse().ok()?,
        pack: it.next()?.parse().ok()?,
        link: it.next()?.parse().ok()?,
        hwm_kib: it.next()?.parse().ok()?,
        child_kib: it.next()?.parse().ok()?,
    })
}

/// A route's label: backend and linker (`direct` links with the default choice).
fn label(backend: &str, linker: &str) -> String {
    match linker {
        "auto" => backend.to_owned(),
        "default" => format!("{backend} + ld.bfd"),
        l => format!("{backend} + {l}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--child") => return child(Path::new(&args[2]), &args[3], &args[4], Path::new(&args[5])),
        Some("--floor") => return floor_child(Path::new(&args[2]), Path::new(&args[3])),
        _ => {}
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
    let lld = find_lld().is_some();
    let mut routes: Vec<(&str, &str)> = vec![("direct", "auto")];
    if cfg!(feature = "llvm") {
        if lld {
            routes.push(("llvm", "lld"));
        }
        routes.push(("llvm", "default"));
    }
    if lld {
        routes.push(("c", "lld"));
    }
    routes.extend([("c", "default"), ("c-tvm", "default")]);
    let machine = format!("{} cores, {}", std::thread::available_parallelism().map_or(0, |n| n.get()), cpu_name());
    println!("machine: {machine}; load average before: {}", loadavg());
    let reps: usize = std::env::var("MBLOB_BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    println!("| blob | route | export s | pack s | link s | floor s | ratio | mblob peak RSS MiB | largest child MiB | worst RSS / blob |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &mib in &sizes {
        let reps = if mib > 1024 { 1 } else { reps };
        let payload = payload_file(dir.path(), mib);
        let blob = blob_file(dir.path(), &payload);
        let floor_out = dir.path().join("floor.so");
        // Routes take turns with the floor, so that a slow stretch of the VM spreads over all.
        let routes: Vec<(&str, &str)> =
            routes.iter().copied().filter(|&(backend, _)| backend != "c-tvm" || mib <= TVM_TEXT_ROUTE_MIB).collect();
        let mut results: Vec<Option<Run>> = vec![None; routes.len()];
        let mut floor: Option<Run> = None;
        for _ in 0..reps {
            settle();
            if let Some(r) = run_child(&["--floor", blob.to_str().unwrap(), floor_out.to_str().unwrap()]) {
                floor = Some(floor.map_or(r, |b| b.best(r)));
            }
            let _ = std::fs::remove_file(&floor_out);
            for (slot, &(backend, linker)) in results.iter_mut().zip(&routes) {
                let out = dir.path().join(format!("out-{backend}-{linker}.so"));
                let args = ["--child", payload.to_str().unwrap(), backend, linker, out.to_str().unwrap()];
                settle();
                if let Some(r) = run_child(&args) {
                    *slot = Some(slot.map_or(r, |b| b.best(r)));
                }
                let _ = std::fs::remove_file(&out);
            }
        }
        let floor = floor.expect("the floor failed");
        let mut print = |name: String, r: Run| {
            let (own, kid) = (r.hwm_kib as f64 / 1024.0, r.child_kib as f64 / 1024.0);
            let worst = own.max(kid) / mib as f64;
            println!(
                "| {mib} MiB | {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {own:.0} | {kid:.0} | {worst:.2} |",
                r.total,
                r.pack,
                r.link,
                floor.total,
                r.total / floor.total,
            );
            rows.push(json!({
                "blob_mib": mib, "route": name, "export_s": r.total, "pack_s": r.pack, "link_s": r.link,
                "floor_s": floor.total, "ratio_to_floor": r.total / floor.total,
                "mblob_peak_rss_mib": own, "largest_child_peak_rss_mib": kid, "worst_rss_over_blob": worst,
            }));
        };
        print("floor (.incbin + fastest link)".into(), floor);
        for (&(backend, linker), r) in routes.iter().zip(results) {
            if let Some(r) = r {
                print(label(backend, linker), r);
            }
        }
        let _ = std::fs::remove_file(&payload);
        let _ = std::fs::remove_file(&blob);
    }
    let load = loadavg();
    println!("load average after: {load}");
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    std::fs::create_dir_all(&results).unwrap();
    let doc = json!({
        "machine": machine, "load_average_after": load, "repetitions": reps,
        "note": "best time of the repetitions, largest peak RSS; ratio = export time / floor time of the same size",
        "rows": rows,
    });
    std::fs::write(results.join("export.json"), serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    plot(&rows, &results.join("export.svg"));
    println!("wrote {} and export.svg", results.join("export.json").display());
    if std::env::var_os("MBLOB_BENCH_EXPORT_ONLY").is_none() {
        load_scaling(dir.path());
        tvm_text_compile(dir.path());
    }
}

/// Time and peak memory against blob size, one line per route and the floor (log-log).
fn plot(rows: &[serde_json::Value], path: &Path) {
    use plotters::prelude::*;
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        let n = r["route"].as_str().unwrap().to_owned();
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let series = |name: &str, key: &str| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r["route"] == name)
            .map(|r| {
                let y = match key {
                    "rss" => {
                        r["mblob_peak_rss_mib"].as_f64().unwrap().max(r["largest_child_peak_rss_mib"].as_f64().unwrap())
                    }
                    k => r[k].as_f64().unwrap(),
                };
                (r["blob_mib"].as_f64().unwrap(), y)
            })
            .collect()
    };
    let max_x = rows.iter().filter_map(|r| r["blob_mib"].as_f64()).fold(1.0, f64::max) * 1.5;
    let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let (left, right) = root.split_horizontally(600);
    for (area, key, title, unit) in [
        (left, "export_s", "export time (best of runs)", "seconds"),
        (right, "rss", "peak RSS of the worst process (mblob or a child)", "MiB"),
    ] {
        let ys: Vec<f64> = names.iter().flat_map(|n| series(n, key)).map(|p| p.1).collect();
        let (lo, hi) = (ys.iter().copied().fold(f64::INFINITY, f64::min), ys.iter().copied().fold(0.0, f64::max));
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0.7..max_x).log_scale(), ((lo * 0.7).max(1e-3)..hi * 1.5).log_scale())
            .unwrap();
        chart.configure_mesh().x_desc("blob MiB").y_desc(unit).draw().unwrap();
        for (i, name) in names.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let style = if name.starts_with("floor") { BLACK.stroke_width(3) } else { color.stroke_width(2) };
            let points = series(name, key);
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .unwrap()
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, style.filled()))).unwrap();
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .unwrap();
    }
    root.present().unwrap();
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
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
        e.import(RawPayload::new("bench.Payload", map_file(&payload).unwrap()));
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
