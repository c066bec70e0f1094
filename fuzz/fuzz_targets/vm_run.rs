//! Bad executables that run: a TVM 0.27 Relax executable (`user_mlp`, tests/fixtures/user-0.27)
//! and a TVM 0.19 Relay VM one (`dyn_batch`, tests/fixtures/relay-vm), their decoded program
//! words changed by the input, loaded (from memory, with the library's own kernels) and run on
//! the fixture's small inputs: a typed error or a result, never a crash (a pointer, size, offset,
//! register or index the VM hands on unchecked).
//!
//! The input: byte 0 picks the model; then records of 4 bytes, each `(word: u16, value: i8,
//! mode: u8)`: word `word` (modulo their number) of the program (the Relax `instr_data`, the
//! Relay VM executable's payload) gets the small `value` as its value bits (mode even: the
//! argument kind in the top 8 bits kept) or added to it (mode odd).
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{fixtures, npy_f32};
use mblob_runtime::exec::relax::RelaxExecutable;
use mblob_runtime::exec::{Device, Model, Value};
use mblob_runtime::NdArray;
use mblob_runtime::payload::relay_vm::RelayVmExecutable;
use mblob_runtime::{load_library_bytes, LoadOptions, Payload, Registry};

struct Fixture {
    so: Vec<u8>,
    /// Where the program's words start in `so`, and how many there are.
    at: usize,
    words: usize,
    function: &'static str,
    inputs: Vec<NdArray>,
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    let at: Vec<usize> =
        haystack.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
    assert_eq!(at.len(), 1, "the program occurs {} times in the library", at.len());
    at[0]
}

fn load(so: &[u8]) -> Option<mblob_runtime::LoadedTree> {
    // SAFETY: the fixtures are libraries TVM built, trusted to run; only the bytecode in their
    // blob differs, which mblob reads as data.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library_bytes(so, "fuzz", &Registry::default(), &LoadOptions::keep_unknown()) };
    tree.ok()
}

fn fixture_set() -> &'static [Fixture] {
    static SET: OnceLock<Vec<Fixture>> = OnceLock::new();
    SET.get_or_init(|| {
        let relax_so = std::fs::read(fixtures().join("user-0.27/user_mlp.so")).unwrap();
        let tree = load(&relax_so).unwrap();
        let exec = tree.find::<RelaxExecutable>().unwrap();
        let words: Vec<u8> = exec.instr_data().iter().flat_map(|w| w.to_le_bytes()).collect();
        let relax = Fixture {
            at: find(&relax_so, &words),
            words: exec.instr_data().len(),
            so: relax_so.clone(),
            function: "forward",
            inputs: (0..6)
                .map(|i| npy_f32(&fixtures().join(format!("user-0.27/user_mlp.forward.0.in{i}.npy"))))
                .collect(),
        };
        let relay_so = std::fs::read(fixtures().join("relay-vm/dyn_batch.so")).unwrap();
        let tree = load(&relay_so).unwrap();
        let exec = tree.find::<RelayVmExecutable>().unwrap();
        let mut payload = Vec::new();
        exec.write_payload(mblob_runtime::Layout::Classic, &mut payload).unwrap();
        let relay = Fixture {
            at: find(&relay_so, &payload),
            words: payload.len() / 8,
            so: relay_so.clone(),
            function: "main",
            inputs: vec![npy_f32(&fixtures().join("relay-vm/dyn_batch.0.in.0.npy"))],
        };
        vec![relax, relay]
    })
}

/// Runs `function` of the library in `so` on `inputs`: any error is fine.
fn run(so: &[u8], function: &str, inputs: &[NdArray]) {
    let Some(tree) = load(so) else { return };
    let Ok(mut model) = Model::new(&tree, Device::cpu(0)) else { return };
    if model.select_function(function).is_err() {
        return;
    }
    for t in inputs {
        if model.set_input(None, Value::Tensor(t.clone())).is_err() {
            return;
        }
    }
    if model.run().is_ok() {
        let _ = model.outputs();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, edits)) = data.split_first() else { return };
    let set = fixture_set();
    let f = &set[pick as usize % set.len()];
    let mut so = f.so.clone();
    for e in edits.chunks_exact(4).take(16) {
        let index = u16::from_le_bytes([e[0], e[1]]) as usize % f.words;
        let at = f.at + 8 * index;
        let old = i64::from_le_bytes(so[at..at + 8].try_into().unwrap());
        let value = i64::from(e[2] as i8);
        let new =
            if e[3] % 2 == 0 { (old & !((1 << 56) - 1)) | (value & ((1 << 56) - 1)) } else { old.wrapping_add(value) };
        so[at..at + 8].copy_from_slice(&new.to_le_bytes());
    }
    run(&so, f.function, &f.inputs);
});
