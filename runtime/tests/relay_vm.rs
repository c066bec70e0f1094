//! The Relay VM against TVM 0.19: executables `relay.vm.compile` made and `export_library`
//! packed (`tests/fixtures/relay-vm/make.py`), read and compared with TVM's own description of
//! them (`exe.bytecode`), run with TVM's inputs and compared bit for bit with the outputs TVM's
//! VM computed; corrupt executables give typed errors, never a panic.

use std::path::{Path, PathBuf};

use mblob_runtime::exec::relay_vm::{RelayVm, RelayVmError};
use mblob_runtime::exec::Value;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::payload::relay_vm::{FormatVersion, Instruction, RelayVmExecutable, VmConstant, VM_EXECUTABLE};
use mblob_runtime::{
    load_library, Bytes, Device, DeviceType, Layout, LoadOptions, LoadedTree, NdArray, Payload, Registry,
};

#[path = "support/npyfile.rs"]
mod npyfile;
use npyfile::tensor as npy;

const CPU: Device = Device { device_type: DeviceType::Cpu, device_id: 0 };

/// A host tensor as a VM input.
fn v(t: Tensor) -> Value {
    Value::Tensor(NdArray::from_tensor(&t, CPU).unwrap())
}

/// The tensors of a result, tuples flattened in order, on the host.
fn flat(out: &Value) -> Vec<Tensor> {
    out.flatten().iter().map(|l| l.as_tensor().expect("a tensor").to_tensor().unwrap()).collect()
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/relay-vm")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(name: &str) -> LoadedTree {
    let path = dir().join(name);
    // SAFETY: the fixtures are libraries TVM built for this test; running their initialisers is
    // what TVM's own loader does.
    unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn manifest() -> Vec<serde_json::Value> {
    let m: serde_json::Value = serde_json::from_slice(&read(&dir().join("manifest.json"))).unwrap();
    assert_eq!(m["tvm"], "0.19.0");
    m["cases"].as_array().unwrap().clone()
}

fn executable(tree: &LoadedTree) -> &RelayVmExecutable {
    tree.find::<RelayVmExecutable>().expect("the loaded tree has a typed Relay VM executable")
}

/// Every case of the manifest, run by mblob, gives TVM's outputs bit for bit (shapes and
/// dtypes too): static and dynamic batch, `If`, a recursive loop, closures, tuples, dynamic
/// reshape.
#[test]
fn outputs_match_tvm_bit_for_bit() {
    let cases = manifest();
    assert!(cases.len() >= 11);
    for case in cases {
        let name = case["case"].as_str().unwrap();
        let tree = load(case["library"].as_str().unwrap());
        let vm = RelayVm::new(&tree, CPU).unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs: Vec<Value> =
            (0..case["inputs"].as_u64().unwrap()).map(|i| v(npy(&dir().join(format!("{name}.in.{i}.npy"))))).collect();
        let outs =
            flat(&vm.invoke(case["function"].as_str().unwrap(), &inputs).unwrap_or_else(|e| panic!("{name}: {e}")));
        let n = case["outputs"].as_u64().unwrap() as usize;
        assert_eq!(outs.len(), n, "{name}");
        for (i, got) in outs.iter().enumerate() {
            let want = npy(&dir().join(format!("{name}.out.{i}.npy")));
            assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{name} output {i}");
            assert_eq!(got.data, want.data, "{name} output {i}");
        }
    }
}

/// `invoke` keeps the result's structure as TVM's VM returns it: `tuple_out` returns a
/// flat 3-tuple (an ADT of tag 0, TVM's three outputs), `mlp` one tensor. (A nested tuple:
/// `tests/fixtures/user-0.19/vm_nested`, in `python/tests/test_user_019.py`.)
#[test]
fn invoke_nested_keeps_tvms_structure() {
    let tree = load("tuple_out.so");
    let vm = RelayVm::new(&tree, CPU).unwrap();
    let inputs: Vec<Value> = (0..2).map(|i| v(npy(&dir().join(format!("tuple_out.0.in.{i}.npy"))))).collect();
    let Value::Tuple(fields) = vm.invoke("main", &inputs).unwrap() else { panic!("tuple_out returns a tuple") };
    assert_eq!(fields.len(), 3);
    for (i, f) in fields.iter().enumerate() {
        let Value::Tensor(f) = f else { panic!("field {i} is a {}", f.kind()) };
        assert_eq!(f.to_tensor().unwrap(), npy(&dir().join(format!("tuple_out.0.out.{i}.npy"))), "field {i}");
    }
    let tree = load("mlp.so");
    let vm = RelayVm::new(&tree, CPU).unwrap();
    let Value::Tensor(out) = vm.invoke("main", &[v(npy(&dir().join("mlp.0.in.0.npy")))]).unwrap() else {
        panic!("mlp returns a tensor")
    };
    assert_eq!(out.to_tensor().unwrap(), npy(&dir().join("mlp.0.out.0.npy")));
}

/// The same VM runs the dynamic-batch model at two batch sizes, one after the other.
#[test]
fn one_vm_runs_two_batch_sizes() {
    let tree = load("dyn_batch.so");
    let vm = RelayVm::new(&tree, CPU).unwrap();
    for k in [1, 0, 1] {
        let x = npy(&dir().join(format!("dyn_batch.{k}.in.0.npy")));
        let out = flat(&vm.invoke("main", &[v(x)]).unwrap());
        assert_eq!(out[0].data, npy(&dir().join(format!("dyn_batch.{k}.out.0.npy"))).data);
    }
}

/// The executables describe themselves as TVM's `exe.bytecode` did: functions, parameters,
/// register file sizes, instruction counts and each instruction's opcode.
#[test]
fn executables_match_tvms_bytecode_listing() {
    for lib in ["mlp", "dyn_batch", "if_cond", "loop", "tuple_out", "dyn_reshape", "closure"] {
        let tree = load(&format!("{lib}.so"));
        assert_eq!(tree.type_keys()[0], VM_EXECUTABLE, "{lib}");
        let exec = executable(&tree);
        assert_eq!(exec.version, "0.19.0");
        assert_eq!(exec.format, FormatVersion::V14);
        assert_eq!(exec.virtual_devices.len(), 1, "{lib}");
        assert_eq!(exec.virtual_devices[0].device_type, 1, "{lib}");
        let text = String::from_utf8(read(&dir().join(format!("{lib}.bytecode.txt")))).unwrap();
        let mut funcs = exec.functions.iter();
        let mut current = None;
        let mut opcodes = Vec::new();
        let check = |f: Option<&mblob_runtime::payload::relay_vm::VmFunction>, ops: &[i64]| {
            if let Some(f) = f {
                assert_eq!(f.instructions.len(), ops.len(), "{lib} {}", f.name);
                for (ins, op) in f.instructions.iter().zip(ops) {
                    assert_eq!(opcode(ins), *op, "{lib} {}: {ins:?}", f.name);
                }
            }
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("VM Function[") {
                check(current, &opcodes);
                opcodes.clear();
                let f = funcs.next().unwrap_or_else(|| panic!("{lib}: fewer functions than TVM lists"));
                let (_, sig) = rest.split_once("]: ").unwrap();
                let (fname, params) = sig.split_once('(').unwrap();
                assert_eq!(f.name, fname, "{lib}");
                let params: Vec<&str> = params.trim_end_matches(')').split(", ").filter(|p| !p.is_empty()).collect();
                assert_eq!(f.params, params, "{lib} {fname}");
                current = Some(f);
            } else if let Some(n) = line.strip_prefix("# reg file size = ") {
                assert_eq!(current.unwrap().register_file_size, n.parse::<u32>().unwrap(), "{lib}");
            } else if let Some((idx, rest)) = line.split_once(": ") {
                if idx.trim().parse::<usize>().is_ok() {
                    opcodes.push(rest.split_whitespace().next().unwrap().parse().unwrap());
                }
            }
        }
        check(current, &opcodes);
        assert!(funcs.next().is_none(), "{lib}: more functions than TVM lists");
    }
}

fn opcode(i: &Instruction) -> i64 {
    match i {
        Instruction::Move { .. } => 0,
        Instruction::Ret { .. } => 1,
        Instruction::Invoke { .. } => 2,
        Instruction::InvokeClosure { .. } => 3,
        Instruction::InvokePacked { .. } => 4,
        Instruction::AllocTensor { .. } => 5,
        Instruction::AllocTensorReg { .. } => 6,
        Instruction::AllocAdt { .. } => 7,
        Instruction::AllocClosure { .. } => 8,
        Instruction::GetField { .. } => 9,
        Instruction::If { .. } => 10,
        Instruction::LoadConst { .. } => 11,
        Instruction::Goto { .. } => 12,
        Instruction::GetTag { .. } => 13,
        Instruction::LoadConsti { .. } => 14,
        Instruction::Fatal => 15,
        Instruction::AllocStorage { .. } => 16,
        Instruction::ShapeOf { .. } => 17,
        Instruction::ReshapeTensor { .. } => 18,
        Instruction::DeviceCopy { .. } => 19,
        Instruction::KillRegister { .. } => 20,
    }
}

/// The MLP's weights are immediate constants holding the params given to `relay.vm.compile`
/// (the dense weights, laid out by TVM), and its primitives are found in the library.
#[test]
fn mlp_constants_and_primitives() {
    let tree = load("mlp.so");
    let exec = executable(&tree);
    assert!(!exec.primitives.is_empty());
    for p in &exec.primitives {
        assert!(tree.packed_function(p).is_some(), "{p}");
    }
    assert_eq!(exec.const_device_indexes.len(), exec.constants.len());
    let tensors =
        exec.constants.iter().filter(|c| matches!(c, VmConstant::Immediate(t) if t.dtype == DataType::F32)).count();
    assert!(tensors >= 3, "weights, bias and second weights are constants");
    assert!(exec.stats().contains(&format!("Primitive ops (#{})", exec.primitives.len())));
}

/// A loaded executable is written back as TVM's bytes (packers keep it unchanged).
#[test]
fn payload_round_trips() {
    let tree = load("loop.so");
    let exec = executable(&tree);
    let mut out = Vec::new();
    exec.write_payload(Layout::Classic, &mut out).unwrap();
    assert_eq!(&out[..], &exec.payload()[..]);
    let again = RelayVmExecutable::read_payload(&Bytes::from_vec(out)).unwrap();
    assert_eq!(&again.functions, &exec.functions);
}

fn payload(lib: &str) -> Vec<u8> {
    let tree = load(lib);
    executable(&tree).payload().to_vec()
}

/// Every truncation of an executable is a typed error, and so is a change of its header; no
/// one-byte change anywhere panics.
#[test]
fn corrupt_executables_are_typed_errors() {
    for lib in ["closure.so", "if_cond.so"] {
        let bytes = payload(lib);
        for len in 0..bytes.len() {
            let cut = Bytes::from_vec(bytes[..len].to_vec());
            assert!(RelayVmExecutable::read_payload(&cut).is_err(), "{lib}: truncated to {len}");
        }
        // The string length, the magic, the version and the device count: errors.
        for at in 0..38 {
            let mut b = bytes.clone();
            b[at] ^= 0x5a;
            assert!(RelayVmExecutable::read_payload(&Bytes::from_vec(b)).is_err(), "{lib}: byte {at}");
        }
        // Every byte: an error or an executable, never a panic.
        for at in 0..bytes.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] ^= x;
                let _ = RelayVmExecutable::read_payload(&Bytes::from_vec(b));
            }
        }
    }
}

/// A changed instruction word fails the instruction's hash check, as in TVM.
#[test]
fn changed_instruction_fails_its_hash() {
    let bytes = payload("closure.so");
    // The last instruction of the last function is `ret $5`: [n=3, hash, 1, 5] at the end.
    let n = bytes.len();
    let mut b = bytes.clone();
    assert_eq!(i64::from_le_bytes(b[n - 16..n - 8].try_into().unwrap()), 1, "opcode of ret");
    b[n - 8] = 4;
    let e = RelayVmExecutable::read_payload(&Bytes::from_vec(b)).unwrap_err();
    assert!(e.to_string().contains("instruction hash"), "{e}");
}

/// Errors of a run: an unknown function, a wrong argument count, bad input data, another
/// device.
#[test]
fn run_errors() {
    let tree = load("loop.so");
    let vm = RelayVm::new(&tree, CPU).unwrap();
    let e = vm.invoke("nope", &[]).unwrap_err();
    assert!(matches!(e, RelayVmError::UnknownFunction { .. }), "{e}");
    assert!(e.to_string().contains("main"), "{e}");
    let e = vm.invoke("main", &[v(npy(&dir().join("loop.0.in.0.npy")))]).unwrap_err();
    assert!(matches!(e.root(), RelayVmError::ArgumentCount { expected: 2, got: 1, .. }), "{e}");
    let e = vm.invoke("main", &[Value::Int(3), Value::Shape(vec![4].into())]).unwrap_err();
    assert!(matches!(e, RelayVmError::Input { index: 0, .. }), "{e}");
    let e = RelayVm::new(&tree, Device { device_type: DeviceType::Cuda, device_id: 0 }).unwrap_err();
    assert!(matches!(e, RelayVmError::UnsupportedDevice { .. }), "{e}");
}

/// An executable whose weights were moved out (`exe.move_late_bound_consts`): the names are read
/// (tag 1), the VM refuses to run without them, and with TVM's constants file it gives TVM's
/// output (TVM ran it after `exe.load_late_bound_consts`).
#[test]
fn late_bound_constants() {
    let m: serde_json::Value = serde_json::from_slice(&read(&dir().join("manifest.json"))).unwrap();
    let case = &m["late_bound"][0];
    let tree = load(case["library"].as_str().unwrap());
    let exec = executable(&tree);
    let late: Vec<&str> = exec
        .constants
        .iter()
        .filter_map(|c| match c {
            VmConstant::LateBound(n) => Some(n.as_str()),
            VmConstant::Immediate(_) => None,
        })
        .collect();
    assert!(!late.is_empty());
    assert!(late.iter().all(|n| n.starts_with("const_")), "{late:?}");
    let e = RelayVm::new(&tree, CPU).unwrap_err();
    assert!(matches!(e, RelayVmError::LateBound { .. }), "{e}");
    let file = dir().join(case["consts"].as_str().unwrap());
    let consts = mblob_runtime::exec::graph::read_params(&Bytes::from_vec(read(&file))).unwrap();
    assert_eq!(consts.len(), late.len());
    let vm = RelayVm::with_late_bound(&tree, CPU, &consts).unwrap();
    let x = npy(&dir().join("mlp_late.0.in.0.npy"));
    let out = flat(&vm.invoke("main", &[v(x)]).unwrap());
    let want = npy(&dir().join("mlp_late.0.out.0.npy"));
    assert_eq!((out[0].dtype, &out[0].shape, &out[0].data), (want.dtype, &want.shape, &want.data));
    // A constant too many, or one missing, is an error.
    let mut extra = consts.clone();
    extra.push(("const_999".to_owned(), consts[0].1.clone()));
    let e = RelayVm::with_late_bound(&tree, CPU, &extra).unwrap_err();
    assert!(matches!(&e, RelayVmError::UnusedLateBound { names } if names == &["const_999"]), "{e}");
    let e = RelayVm::with_late_bound(&tree, CPU, &consts[1..]).unwrap_err();
    assert!(matches!(e, RelayVmError::LateBound { .. }), "{e}");
}

/// A recursion deeper than the VM allows (the loop run a million times) is a typed error, not a
/// stack overflow; the same VM runs normally afterwards.
#[test]
fn runaway_recursion_is_an_error() {
    let tree = load("loop.so");
    let vm = RelayVm::new(&tree, CPU).unwrap();
    let x = npy(&dir().join("loop.0.in.1.npy"));
    let n = Tensor::new(DataType::I32, vec![], 1_000_000i32.to_le_bytes().to_vec()).unwrap();
    let e = vm.invoke("main", &[v(n), v(x.clone())]).unwrap_err();
    assert!(matches!(e.root(), RelayVmError::Limit { limit, .. } if *limit > 0), "{e}");
    let out = flat(&vm.invoke("main", &[v(npy(&dir().join("loop.0.in.0.npy"))), v(x)]).unwrap());
    assert_eq!(out[0].data, npy(&dir().join("loop.0.out.0.npy")).data);
}
