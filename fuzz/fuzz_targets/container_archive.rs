//! The blob lookup of `inspect`, `extract` and `pack --from` in `ar` archives of objects
//! (`container::find_blob`, and `container::find_blobs` of a bundle), then the blob parsed and its
//! payloads decoded, under the bound.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_runtime::container::ContainerFormat;

fuzz_target!(|data: &[u8]| {
    mblob_fuzz::container(data, &[ContainerFormat::Archive]);
});
