//! The Relay VM executable reader (`VMExecutable`, TVM 0.8 to 0.19), under the allocation
//! bound: a typed error or an executable that writes back unchanged and reads again to the same
//! program, and whose statistics render.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, READ_FACTOR};
use mblob_runtime::payload::relay_vm::RelayVmExecutable;
use mblob_runtime::{Bytes, Layout, Payload};

fuzz_target!(|data: &[u8]| {
    let owned = Bytes::from_vec(data.to_vec());
    let read = bounded(data.len(), READ_FACTOR, "RelayVmExecutable::read_payload", || {
        RelayVmExecutable::read_payload(&owned)
    });
    if let Ok(exec) = read {
        let _ = exec.stats();
        let mut out = Vec::new();
        exec.write_payload(Layout::Classic, &mut out).expect("writing to memory");
        assert_eq!(out, data, "an executable is written back as it was read");
        let again = RelayVmExecutable::read_payload(&Bytes::from_vec(out)).expect("what was written reads back");
        assert_eq!(again.functions, exec.functions, "read, write, read changed the functions");
        assert_eq!(again.constants, exec.constants, "read, write, read changed the constants");
    }
});
