//! The ELF symbol lookup of `inspect` (`find_blob`), then the blob it finds parsed as `inspect`
//! parses it (opaque unknown keys) and every module payload decoded by its loader.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, registry, READ_FACTOR};
use mblob_runtime::elf::find_blob;
use mblob_runtime::format::{parse_blob, EntryKind, UnknownKeys};
use mblob_runtime::Bytes;

fuzz_target!(|data: &[u8]| {
    let registry = registry();
    let owned = Bytes::from_vec(data.to_vec());
    let data: &[u8] = &owned;
    bounded(data.len(), READ_FACTOR, "find_blob + parse_blob + loaders", || {
        let Ok(Some(found)) = find_blob(data, None) else { return };
        let blob = found.bytes(data).expect("find_blob checked the symbol lies in the file");
        let Ok(parsed) = parse_blob(blob, found.layout, registry, UnknownKeys::KeepRaw) else { return };
        for e in parsed.entries.iter().filter(|e| e.kind == EntryKind::Module) {
            if let Some(loader) = registry.get(e.type_key) {
                let payload = owned.slice_ref(e.payload).expect("the payload lies in the input");
                if let Err(err) = loader.load(payload, parsed.layout) {
                    let _ = err.to_string();
                }
            }
        }
    });
});
