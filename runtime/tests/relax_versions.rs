//! Relax executables of the Unity builds of 2023-04 to 2023-07-06, which wrote the build's
//! `TVM_VERSION` ("0.13.dev0", "0.12.dev0") as the VM version instead of "0.14": the rest of
//! their bytes is 0.14's (apache/tvm 153f70aa60 `src/runtime/relax_vm/executable.cc`).

use std::path::Path;

use mblob_runtime::format::{parse_blob, EntryKind, UnknownKeys};
use mblob_runtime::payload::relax::executable::{RelaxExecutable, VM_VERSION};
use mblob_runtime::{Bytes, Layout, Registry};

/// TVM 0.19's executable (a `relax.Executable` in the classic layout, as the Unity builds wrote
/// it): the payload's string holds the executable.
fn tvm_executable() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens/relax_add_mul.blob");
    let blob = Bytes::from_vec(std::fs::read(path).unwrap());
    let parsed = parse_blob(&blob, Layout::Classic, &Registry::default(), UnknownKeys::Error).unwrap();
    let entry =
        parsed.entries.iter().find(|e| e.kind == EntryKind::Module && e.type_key == "relax.Executable").unwrap();
    entry.payload[8..].to_vec()
}

fn with_version(exe: &[u8], version: &str) -> Vec<u8> {
    let old = u64::from_le_bytes(exe[8..16].try_into().unwrap()) as usize;
    assert_eq!(&exe[16..16 + old], VM_VERSION.as_bytes(), "TVM 0.19 writes 0.14");
    let mut out = exe[..8].to_vec();
    out.extend_from_slice(&(version.len() as u64).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(&exe[16 + old..]);
    out
}

#[test]
fn unity_2023_versions_read_and_write_back_byte_for_byte() {
    let exe = tvm_executable();
    let original =
        RelaxExecutable::read(&Bytes::from_vec(exe.clone()), 0, Layout::Classic, "relax.Executable").unwrap();
    for version in ["0.13.dev0", "0.12.dev0"] {
        let bytes = with_version(&exe, version);
        let x = RelaxExecutable::read(&Bytes::from_vec(bytes.clone()), 0, Layout::Classic, "relax.Executable")
            .unwrap_or_else(|e| panic!("{version}: {e}"));
        assert_eq!(x.version, version);
        assert_eq!(x.functions, original.functions);
        assert_eq!(x.instructions, original.instructions);
        let mut out = Vec::new();
        x.write_executable(Layout::Classic, &mut out).unwrap();
        assert!(out == bytes, "{version}: not written back as read");
    }
    // A version no TVM wrote is still refused, naming the ones that exist.
    let err =
        RelaxExecutable::read(&Bytes::from_vec(with_version(&exe, "0.15")), 0, Layout::Classic, "relax.Executable")
            .unwrap_err()
            .to_string();
    assert!(err.contains("\"0.15\"") && err.contains("0.13.dev0"), "{err}");
}
