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
        if layout != Layout::Ffi {
            let measured = RelaxExecutable::measure_classic(data, 0).ok();
            if read.is_ok() {
                assert_eq!(measured, Some(data.len() as u64), "measure and read disagree");
            }
        }
        if let Ok(exec) = read {
            let _ = exec.as_text();
            let _ = exec.stats();
            let mut out = Vec::new();
            exec.write_payload(layout, &mut out).expect("writing to a Vec");
            let again = RelaxExecutable::read_payload(&Bytes::from_vec(out), layout, RELAX_VM_EXECUTABLE)
                .expect("what was written reads back");
            assert_eq!(again, exec, "read, write, read changed the executable");
        }
    }
});
