//! Constants held once: each tensor constant of a Relax executable becomes one tensor on the
//! VM's device, a read-only view of the library's bytes where they lie at the alignment TVM's
//! kernels assume (64 bytes on the CPU), else one aligned copy; the outputs stay TVM's.
//! Against TVM 0.27: `relax_mlp_tvm027` (run goldens) and `relax_consts_calls` (the constants
//! TVM was given, `tests/fixtures/inspect`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mblob_runtime::exec::relax::{Constant, RelaxExecutable, VirtualMachine};
use mblob_runtime::{load_library, Bytes, Device, DeviceType, LoadOptions, LoadedTree, NdArray, Registry};

#[path = "support/npyfile.rs"]
mod npyfile;
use npyfile::tensor as npy;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::HostCalls;

const CPU: Device = Device { device_type: DeviceType::Cpu, device_id: 0 };
const ALIGN: usize = 64;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn load(path: &Path) -> LoadedTree {
    // SAFETY: the fixtures are libraries TVM built for these tests.
    unsafe { load_library(path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn executable(tree: &LoadedTree) -> &RelaxExecutable {
    tree.modules().iter().find_map(|m| m.module.as_any().downcast_ref::<RelaxExecutable>()).unwrap()
}

fn data_ptr(a: &NdArray) -> usize {
    a.dl_tensor().data as usize
}

/// Every tensor constant of the VM is one tensor: the library's bytes in place when aligned,
/// else an aligned, writable copy. Returns how many were held in place.
fn check_held_once(vm: &VirtualMachine, exec: &RelaxExecutable, what: &str) -> usize {
    let mut in_place = 0;
    for (i, c) in exec.constants.iter().enumerate() {
        let Constant::Tensor(t) = c else {
            assert!(vm.constant_tensor(i).is_none(), "{what}: constant {i} is not a tensor");
            continue;
        };
        let a = vm.constant_tensor(i).unwrap_or_else(|| panic!("{what}: constant {i} has no tensor"));
        let at = t.data.as_ptr() as usize;
        if at % ALIGN == 0 {
            assert_eq!(data_ptr(a), at, "{what}: aligned constant {i} was copied");
            assert!(a.storage().is_read_only(), "{what}: constant {i}");
            in_place += 1;
        } else {
            assert_ne!(data_ptr(a), at, "{what}: constant {i}");
            assert_eq!(data_ptr(a) % ALIGN, 0, "{what}: the copy of constant {i} is misaligned");
            assert!(!a.storage().is_read_only(), "{what}: constant {i}");
        }
        assert_eq!(a.shape(), &t.shape[..], "{what}: constant {i}");
        assert!(a.to_bytes().unwrap() == t.data[..], "{what}: constant {i} holds other bytes");
    }
    in_place
}

/// The executable of `tree` with each tensor constant's bytes moved to `shift` bytes past a
/// 64-byte boundary of a buffer of its own (a stand-in for a library that lays them out so).
fn placed_at(exec: &RelaxExecutable, shift: usize) -> RelaxExecutable {
    let mut exec = exec.clone();
    for c in &mut exec.constants {
        if let Constant::Tensor(t) = c {
            let mut buf = vec![0u8; t.data.len() + 2 * ALIGN];
            let start = buf.as_ptr().align_offset(ALIGN) + shift;
            buf[start..start + t.data.len()].copy_from_slice(&t.data);
            t.data = Bytes::from_vec(buf).slice(start..start + t.data.len()).unwrap();
        }
    }
    exec
}

/// The MLP's constants are held once, in place when aligned, and it gives TVM's output, with
/// every constant in place and with every one copied.
#[test]
fn mlp_constants_are_held_once_and_give_tvms_output() {
    let dir = fixtures().join("tvm-goldens/run");
    let tree = load(&dir.join("relax_mlp_tvm027.so"));
    let exec = executable(&tree);
    assert!(exec.constants.iter().any(|c| matches!(c, Constant::Tensor(_))), "the MLP has tensor constants");
    let x = npy(&dir.join("relax_mlp_tvm027.in.x.npy"));
    let expected = npy(&dir.join("relax_mlp_tvm027.out.0.npy"));
    let tensors = exec.constants.iter().filter(|c| matches!(c, Constant::Tensor(_))).count();
    let cases: [(&str, Arc<RelaxExecutable>, Option<usize>); 3] = [
        ("as loaded", Arc::new(exec.clone()), None),
        ("aligned", Arc::new(placed_at(exec, 0)), Some(tensors)),
        ("misaligned", Arc::new(placed_at(exec, 4)), Some(0)),
    ];
    for (what, exec, in_place) in cases {
        let vm = VirtualMachine::with_executable(&tree, exec.clone(), CPU).unwrap();
        let held = check_held_once(&vm, &exec, what);
        if let Some(n) = in_place {
            assert_eq!(held, n, "{what}: constants held in place");
        }
        for _ in 0..2 {
            let out = vm.call_tensors("main", std::slice::from_ref(&x)).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].shape, expected.shape, "{what}");
            assert!(out[0].data[..] == expected.data[..], "{what}: output differs from TVM's");
        }
    }
    // `VirtualMachine::new` holds them the same way.
    let vm = VirtualMachine::new(&tree, CPU).unwrap();
    check_held_once(&vm, vm.executable(), "new");
}

/// The VM's constants are the tensors TVM was given (`relax.const`), held once.
#[test]
fn vm_constants_are_the_ones_tvm_was_given() {
    let dir = fixtures().join("inspect");
    let tree = load(&dir.join("relax_consts_calls.so"));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("relax_consts_calls.json")).unwrap()).unwrap();
    // Its `append` calls a packed function nobody provides (for `inspect`'s tests), which a
    // VM refuses to be made with: named as a builtin here, as `append` is not called.
    let mut exec = executable(&tree).clone();
    for f in &mut exec.functions {
        if f.name == "my_ext.not_registered" {
            f.name = "vm.builtin.shape_of".into();
        }
    }
    let vm = VirtualMachine::with_executable(&tree, Arc::new(exec), CPU).unwrap();
    check_held_once(&vm, vm.executable(), "relax_consts_calls");
    let listed = meta["tensor_constants"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    for c in listed {
        let i = c["index"].as_u64().unwrap() as usize;
        let given = npy(&dir.join(c["file"].as_str().unwrap()));
        let a = vm.constant_tensor(i).unwrap_or_else(|| panic!("constant {i} has no tensor"));
        assert_eq!(a.shape(), &given.shape[..], "constant {i}");
        assert_eq!(a.dtype(), given.dtype, "constant {i}");
        assert!(a.to_bytes().unwrap() == given.data[..], "constant {i} is not the tensor TVM was given");
    }
}
