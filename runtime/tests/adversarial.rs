//! The classic reader's end search on inputs built to make it work: every one is parsed or
//! refused within a work bound linear in its size, counted by the reader
//! ([`classic::last_search_work`]), not timed (the times are in `benches/adversarial.rs`).

mod support;

use mblob_runtime::format::{classic, parse_blob, UnknownKeys};
use mblob_runtime::{Layout, Registry};
use support::adversarial::{classic_opaque_chain_ok, ALL};

/// The bounds the reader promises: positions looked at, and candidate ends tried.
fn within_bounds(n: usize, (positions, tries): (u64, u64)) -> bool {
    positions <= 4 * n as u64 + (1 << 16) && tries <= n as u64 / 16 + (1 << 12)
}

#[test]
fn adversarial_blobs_are_parsed_or_refused_in_linear_work() {
    let registry = Registry::default();
    for (name, build) in ALL {
        let mut per_byte = Vec::new();
        for n in [64 << 10, 1 << 20] {
            let data = build(n);
            for unknown in [UnknownKeys::Error, UnknownKeys::KeepRaw] {
                let result = parse_blob(&data, Layout::Classic, &registry, unknown);
                let work = classic::last_search_work();
                assert!(within_bounds(data.len(), work), "{name} ({n} B, {unknown:?}): {work:?}, {result:?}");
                if let Err(e) = &result {
                    // A refusal is a typed error inside the input.
                    assert!(e.offset <= data.len() as u64, "{name}: {e}");
                }
                per_byte.push((work.0 as f64 / data.len() as f64, work.1 as f64 / data.len() as f64));
            }
        }
        eprintln!("{name}: (positions, tries) per byte {per_byte:.3?}");
    }
}

/// What the bounds must leave room for: a real blob's unmeasured payloads in a row, each search
/// walking back over the later ones, are found looking at each position once, with a few
/// tries per entry.
#[test]
fn real_chains_of_unmeasured_payloads_parse_in_about_one_step_per_byte() {
    let registry = Registry::default();
    for (k, size) in [(1, 4 << 20), (3, 256 << 10), (10, 4 << 10), (32, 16 << 10)] {
        let data = classic_opaque_chain_ok(k, size);
        for unknown in [UnknownKeys::Error, UnknownKeys::KeepRaw] {
            let parsed = parse_blob(&data, Layout::Classic, &registry, unknown).expect("parses");
            assert_eq!(parsed.entries.len(), k + 2);
            assert!(parsed.entries[..k].iter().all(|e| e.payload.len() == size), "k={k}");
            let (positions, tries) = classic::last_search_work();
            assert!(positions <= data.len() as u64 + 4096, "k={k}: {positions} positions for {} bytes", data.len());
            assert!(tries <= 4 * (k as u64 + 2).pow(2), "k={k}: {tries} tries");
        }
    }
}

/// The ELF lookup on a string table without NULs: every symbol is looked at, none is read past
/// the name bound, and the file has no blob symbol (timed in `benches/adversarial.rs`).
#[test]
fn elf_names_without_an_end_are_skipped() {
    for n in [64 << 10, 1 << 20] {
        let data = support::adversarial::elf_unterminated_names(n);
        let file = object::File::parse(&*data).expect("a valid ELF file");
        assert!(object::Object::symbols(&file).count() > n / 64);
        assert_eq!(mblob_runtime::elf::find_blob(&data, None), Ok(None));
    }
    // One name ended: that symbol is found.
    let n = 64 << 10;
    let mut data = support::adversarial::elf_unterminated_names(n);
    let strtab_at = 64 + (n / 2 / 24) * 24;
    let name = b"__tvm_dev_mblob\0";
    data[strtab_at + 1..strtab_at + 1 + name.len()].copy_from_slice(name);
    let found = mblob_runtime::elf::find_blob(&data, None).expect("a symbol in its section").expect("found");
    assert_eq!(found.symbol, "__tvm_dev_mblob");
}
