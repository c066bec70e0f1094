//! Decoded VM executables changed, then run (issue 33): a TVM 0.27 Relax executable
//! (`user_mlp`, tests/fixtures/user-0.27) and a TVM 0.19 Relay VM one (`mlp`,
//! tests/fixtures/relay-vm), decoded once; the input picks the model (byte 0) and then the
//! changes to its decoded program (registers, constant, function and primitive indices,
//! immediates, offsets, sizes, alignments, jumps: `runtime/tests/support/mutate_vm.rs`, which
//! the stable driver `runtime/tests/vm_mutations.rs` also runs); the VM is made from the changed
//! executable and the function run on the fixture's small inputs: a result or a typed error,
//! never a crash. (`vm_run` changes the program's bytes instead, which the reader checks first.)
#![no_main]
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mblob_fuzz::{fixtures, npy_f32};
use mblob_runtime::exec::relax::{RelaxExecutable, VirtualMachine};
use mblob_runtime::exec::relay_vm::RelayVm;
use mblob_runtime::exec::{Device, Value};
use mblob_runtime::payload::relay_vm::RelayVmExecutable;
use mblob_runtime::{load_library, LoadOptions, LoadedTree, Registry};

#[path = "../../runtime/tests/support/mutate_vm.rs"]
mod mutate_vm;

/// A float32 `.npy` file of the fixtures as an input.
fn npy(rel: &str) -> Value {
    Value::Tensor(npy_f32(&fixtures().join(rel)))
}

fn load(rel: &str) -> LoadedTree {
    // SAFETY: the fixtures are libraries TVM built, trusted to run; only their decoded programs
    // are changed, which the VMs check as data.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library(&fixtures().join(rel), &Registry::default(), &LoadOptions::default()) };
    tree.unwrap()
}

struct Fixtures {
    relax: (LoadedTree, RelaxExecutable, Vec<Value>),
    relay: (LoadedTree, RelayVmExecutable, Vec<Value>),
}

fn fixtures_set() -> &'static Fixtures {
    static SET: OnceLock<Fixtures> = OnceLock::new();
    SET.get_or_init(|| {
        let tree = load("user-0.27/user_mlp.so");
        let exec = tree.find::<RelaxExecutable>().unwrap().clone();
        let inputs =
            (0..6).map(|i| npy(&format!("user-0.27/user_mlp.forward.0.in{i}.npy"))).collect();
        let relax = (tree, exec, inputs);
        let tree = load("relay-vm/mlp.so");
        let exec = tree.find::<RelayVmExecutable>().unwrap().clone();
        let relay = (tree, exec, vec![npy("relay-vm/mlp.0.in.0.npy")]);
        Fixtures { relax, relay }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let Some((&count, rest)) = rest.split_first() else { return };
    let set = fixtures_set();
    let mut choose = mutate_vm::from_bytes(rest);
    if pick % 2 == 0 {
        let (tree, exec, inputs) = &set.relax;
        let mut e = exec.clone();
        for _ in 0..1 + count % 4 {
            mutate_vm::relax(&mut e, &mut choose);
        }
        if let Ok(vm) = VirtualMachine::with_executable(tree, Arc::new(e), Device::cpu(0)) {
            let _ = vm.invoke("forward", inputs);
        }
    } else {
        let (tree, exec, inputs) = &set.relay;
        let mut e = exec.clone();
        for _ in 0..1 + count % 4 {
            mutate_vm::relay(&mut e, &mut choose);
        }
        if let Ok(vm) = RelayVm::with_executable(tree, Arc::new(e), Device::cpu(0), &[]) {
            let _ = vm.invoke("main", inputs);
        }
    }
});
