//! The Relay VM allocates its storages from a pool kept across runs, as TVM's VM does: once a
//! first run has allocated them, more runs add (next to) no page faults, where fresh storages
//! would fault their pages in again on every run. Counted by `getrusage` (minor faults of the
//! process), alone in its test binary so that no other test's work is counted.
#![cfg(feature = "relay-vm")]

use std::path::{Path, PathBuf};

use mblob_runtime::exec::relay_vm::RelayVm;
use mblob_runtime::exec::Value;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::{load_library, Device, LoadOptions, NdArray, Registry};

#[path = "support/npyfile.rs"]
mod npyfile;
use npyfile::tensor as npy;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/relay-vm")
}

/// The process's minor page faults so far.
fn minor_faults() -> i64 {
    // SAFETY: `getrusage` fills the struct it is given; a zeroed `rusage` is a valid one.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage`.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    usage.ru_minflt
}

/// `dyn_batch` (dense + relu + 0.5 over a batch of any size) at a batch of 2^17 rows: its
/// input (3 MiB) and output (1.5 MiB) storages are large, so fresh storages would be fresh
/// mappings whose pages fault in on every run. The first run of a new VM faults them in once;
/// ten more runs add fewer faults than that one run did. Every run gives TVM's output: the
/// rows of TVM's batch-2 case, repeated.
#[test]
fn runs_after_the_first_add_no_page_faults() {
    // SAFETY: the fixture is a library TVM built for these tests.
    let tree =
        unsafe { load_library(&dir().join("dyn_batch.so"), &Registry::default(), &LoadOptions::default()) }.unwrap();
    let vm = RelayVm::new(&tree, Device::cpu(0)).unwrap();
    let (x, want) = (npy(&dir().join("dyn_batch.0.in.0.npy")), npy(&dir().join("dyn_batch.0.out.0.npy")));
    assert_eq!((&x.shape[..], &want.shape[..]), (&[2, 6][..], &[2, 3][..]));
    let reps = 1 << 16;
    let rows = 2 * reps as i64;
    let input =
        Value::Tensor(NdArray::from_bytes(&x.data.repeat(reps), &[rows, 6], DataType::F32, Device::cpu(0)).unwrap());
    // The output is read into one buffer made here, so that the checks fault no pages of their own.
    let mut got = vec![0u8; want.data.len() * reps];
    let mut run = || {
        let out = vm.invoke("main", std::slice::from_ref(&input)).unwrap();
        let Value::Tensor(out) = out else { panic!("a tensor, got {out:?}") };
        assert_eq!((out.dtype(), out.shape()), (DataType::F32, &[rows, 3][..]));
        out.storage().read(0, &mut got).unwrap();
        assert!(got.chunks(want.data.len()).all(|c| c == &want.data[..]), "TVM's rows");
    };
    let start = minor_faults();
    run();
    let first = minor_faults() - start;
    let start = minor_faults();
    for _ in 0..10 {
        run();
    }
    let more = minor_faults() - start;
    eprintln!("page faults: first run {first}, the next ten {more}");
    assert!(more < first, "ten more runs fault {more} pages, the first {first}: the storages are not reused");
}
