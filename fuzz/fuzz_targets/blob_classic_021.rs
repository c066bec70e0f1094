//! The blob reader in the `Classic021` layout: `parse_blob` strict and opaque, then `load_blob`
//! (which runs every payload's loader), each under the allocation bound.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_runtime::Layout;

fuzz_target!(|data: &[u8]| mblob_fuzz::blob(data, Layout::Classic021));
