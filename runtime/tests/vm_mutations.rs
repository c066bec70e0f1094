//! The stable driver of the fuzz target `vm_decoded` (cargo-fuzz needs a nightly toolchain):
//! TVM-built executables (`tests/fixtures/user-0.27`, `relax-vm`, `relay-vm`), decoded, get
//! one to three changes from a seeded generator (`support/mutate_vm.rs`, the target's own
//! mutations), and the function runs on the fixture's inputs: a result or a typed error, never
//! a panic, an abort or an out-of-range access (issue 33).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use mblob_runtime::exec::relax::{RelaxExecutable, VirtualMachine};
use mblob_runtime::exec::Value;
use mblob_runtime::Device;

#[path = "support/mutate_vm.rs"]
mod mutate_vm;
#[path = "support/vm_fixtures.rs"]
mod vm_fixtures;
use vm_fixtures::{load, npy};

/// Mutated executables per fixture.
const RUNS: u64 = 3000;

/// Runs `RUNS` mutants of `exec`, each through `run`, and counts the outcomes: a panic fails
/// the test, naming the mutant's seed.
fn drive<E: Clone>(name: &str, exec: &E, mutate: impl Fn(&mut E, mutate_vm::Choose<'_>), run: impl Fn(E) -> bool) {
    let (mut ok, mut refused) = (0, 0);
    for seed in 1..=RUNS {
        let mut choose = mutate_vm::seeded(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut e = exec.clone();
        for _ in 0..1 + choose() % 3 {
            mutate(&mut e, &mut choose);
        }
        match catch_unwind(AssertUnwindSafe(|| run(e))) {
            Ok(true) => ok += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!("{name}: mutant {seed} panicked"),
        }
    }
    // The mutations reach both outcomes (a driver whose mutants all fail to build tests nothing).
    assert!(refused > 0 && ok + refused == RUNS, "{name}: {ok} ran, {refused} refused");
    eprintln!("{name}: {ok} ran, {refused} refused");
}

#[test]
fn mutated_relax_executables_run_or_fail_cleanly() {
    for (so, function, inputs) in [
        (
            "user-0.27/user_mlp.so",
            "forward",
            (0..6).map(|i| format!("user-0.27/user_mlp.forward.0.in{i}.npy")).collect::<Vec<_>>(),
        ),
        ("relax-vm/relax_vm_args.so", "dataflow", vec!["relax-vm/relax_vm_args.dataflow.7.in0.npy".to_owned()]),
    ] {
        let tree = load(so);
        let exec = tree.find::<RelaxExecutable>().unwrap().clone();
        let inputs: Vec<Value> = inputs.iter().map(|p| npy(p)).collect();
        drive(so, &exec, mutate_vm::relax, |e| {
            let Ok(vm) = VirtualMachine::with_executable(&tree, Arc::new(e), Device::cpu(0)) else { return false };
            vm.invoke(function, &inputs).is_ok()
        });
    }
}

#[cfg(feature = "relay-vm")]
#[test]
fn mutated_relay_executables_run_or_fail_cleanly() {
    use mblob_runtime::exec::relay_vm::RelayVm;
    use mblob_runtime::payload::relay_vm::RelayVmExecutable;
    for (so, inputs) in [
        ("relay-vm/mlp.so", vec!["relay-vm/mlp.0.in.0.npy"]),
        ("relay-vm/dyn_reshape.so", vec!["relay-vm/dyn_reshape.0.in.0.npy"]),
        ("relay-vm/tuple_out.so", vec!["relay-vm/tuple_out.0.in.0.npy", "relay-vm/tuple_out.0.in.1.npy"]),
    ] {
        let tree = load(so);
        let exec = tree.find::<RelayVmExecutable>().unwrap().clone();
        let inputs: Vec<Value> = inputs.iter().map(|p| npy(p)).collect();
        drive(so, &exec, mutate_vm::relay, |e| {
            let Ok(vm) = RelayVm::with_executable(&tree, Arc::new(e), Device::cpu(0), &[]) else { return false };
            vm.invoke("main", &inputs).is_ok()
        });
    }
}
