//! The Relax executable reader in each layout's form (string-wrapped for the classic layouts,
//! bare for tvm-ffi), under the allocation bound: a typed error or an executable that writes
//! back and reads again unchanged, and whose text and statistics render.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, READ_FACTOR};
use mblob_runtime::exec::relax::{RelaxExecutable, RELAX_VM_EXECUTABLE};
use mblob_runtime::{Bytes, Layout, Payload};

fuzz_target!(|data: &[u8]| {
    let owned = Bytes::from_vec(data.to_vec());
    for layout in Layout::ALL {
        let read = bounded(data.len(), READ_FACTOR, "RelaxExecutable::read_payload", || {
            RelaxExecutable::read_payload(&owned, layout, RELAX_VM_EXECUTABLE)
        });
        if let Ok(exec) = read {
            let _ = exec.as_text();
            let _ = exec.stats();
            let mut out = Vec::new();
            if let Err(e) = exec.write_payload(layout, &mut out) {
                // Only memory scopes (TVM 0.23+) have no form in older versions.
                assert!(!exec.memory_scopes.is_empty(), "writing failed: {e}");
                continue;
            }
            let again = RelaxExecutable::read_payload(&Bytes::from_vec(out), layout, RELAX_VM_EXECUTABLE)
                .expect("what was written reads back");
            assert_eq!(again.functions, exec.functions, "read, write, read changed the functions");
            assert_eq!(again.constants, exec.constants, "read, write, read changed the constants");
            assert_eq!(again.instructions, exec.instructions, "read, write, read changed the code");
        }
    }
});
