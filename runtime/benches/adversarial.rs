//! Time of the classic reader on the inputs of `tests/support/adversarial.rs`, per MiB:
//! `cargo bench -p mblob-runtime --bench adversarial` (best of 5; issue 16's target is 50 ms
//! per MiB at most).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Instant;

use mblob_runtime::format::{classic, parse_blob, UnknownKeys};
use mblob_runtime::{Layout, Registry};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let registry = Registry::default();
    println!("| input | MiB | keys | result | positions / tries per byte | ms per MiB (best of 5) |");
    println!("|---|---|---|---|---|---|");
    for (name, build) in support::adversarial::ALL {
        for mib in [1usize, 4] {
            let data = build(mib << 20);
            for unknown in [UnknownKeys::Error, UnknownKeys::KeepRaw] {
                let mut best = f64::INFINITY;
                let mut ok = false;
                for _ in 0..5 {
                    let t = Instant::now();
                    ok = parse_blob(&data, Layout::Classic, &registry, unknown).is_ok();
                    best = best.min(t.elapsed().as_secs_f64());
                }
                let (positions, tries) = classic::last_search_work();
                let steps =
                    format!("{:.2} / {:.3}", positions as f64 / data.len() as f64, tries as f64 / data.len() as f64);
                let per_mib = best * 1000.0 / (data.len() as f64 / (1 << 20) as f64);
                let result = if ok { "parsed" } else { "refused" };
                println!("| {name} | {mib} | {unknown:?} | {result} | {steps} | {per_mib:.2} |");
            }
        }
    }
    for mib in [1usize, 4] {
        let data = support::adversarial::elf_unterminated_names(mib << 20);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            let found = mblob_runtime::elf::find_blob(&data, None);
            best = best.min(t.elapsed().as_secs_f64());
            assert_eq!(found, Ok(None));
        }
        let per_mib = best * 1000.0 / (data.len() as f64 / (1 << 20) as f64);
        println!("| ELF: symbol names without an end (find_blob) | {mib} | - | no blob | - | {per_mib:.2} |");
    }
}
