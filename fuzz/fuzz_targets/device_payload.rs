//! The device payload reader. The first byte picks the layout (`b % 3`) and the type key
//! (`b / 3 % 5`); `measure` and `read` agree, `read_exact` accepts exactly what `read` took, and
//! a payload read and written back in its layout gives the same bytes' length and reads the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{bounded, READ_FACTOR};
use mblob_runtime::payload::device::{measure, DeviceModule};
use mblob_runtime::{Bytes, Layout, Payload};

/// Type keys by reader: the triple (cuda, opencl), metal's three forms, webgpu, vulkan.
pub const KEYS: [&str; 5] = ["cuda", "opencl", "metal", "webgpu", "vulkan"];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let layout = Layout::ALL[usize::from(pick) % 3];
    let key = KEYS[usize::from(pick / 3) % KEYS.len()];
    let owned = Bytes::from_vec(rest.to_vec());
    let n = rest.len();
    let measured = bounded(n, READ_FACTOR, "measure", || measure(rest, 0, key, layout).map_err(|e| e.to_string()));
    let read = bounded(n, READ_FACTOR, "DeviceModule::read", || DeviceModule::read(&owned, 0, key, layout));
    assert_eq!(measured.clone().ok(), read.as_ref().ok().map(|(_, used)| *used), "measure and read disagree");
    let exact = bounded(n, READ_FACTOR, "DeviceModule::read_exact", || DeviceModule::read_exact(&owned, key, layout));
    if let Err(e) = &exact {
        let _ = e.to_string();
    }
    if let Ok((m, used)) = read {
        assert_eq!(exact.is_ok(), used == n as u64, "read_exact and read disagree");
        let mut out = Vec::new();
        m.write_payload(layout, &mut out).expect("writing to a Vec");
        assert_eq!(out.len() as u64, used, "written length differs from the length read");
        assert_eq!(m.payload_len(layout).unwrap(), used, "payload_len differs from the length read");
        let again = DeviceModule::read_exact(&Bytes::from_vec(out), key, layout).expect("what was written reads back");
        assert_eq!(again, m, "read, write, read changed the payload");
    }
});
