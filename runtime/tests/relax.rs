//! The Relax VM against TVM: executables read from TVM 0.19, 0.21 and 0.27 libraries compared
//! with TVM's own description of them (`as_text`, `stats`, the function table), and models run
//! with TVM's inputs, their outputs compared bit for bit with the outputs TVM computed.

use std::path::{Path, PathBuf};

use mblob_runtime::exec::relax::{
    Constant, FuncKind, Instruction, Reg, RelaxExecutable, VirtualMachine, VmError, RELAX_EXECUTABLE,
    RELAX_VM_EXECUTABLE,
};
use mblob_runtime::exec::Value;
use mblob_runtime::ffi::threadpool;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{
    load_blob, load_library, Bytes, Device, DeviceType, Layout, LoadOptions, LoadedTree, NdArray, Payload, Registry,
};

#[path = "support/npyfile.rs"]
mod npyfile;
use npyfile::tensor as npy;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::HostCalls;

const CPU: Device = Device { device_type: DeviceType::Cpu, device_id: 0 };

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tvm-goldens")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(path: &Path) -> LoadedTree {
    // SAFETY: the goldens are libraries TVM built for this test; running their initialisers is
    // what TVM's own loader does.
    unsafe { load_library(path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn executable(tree: &LoadedTree) -> &RelaxExecutable {
    tree.find::<RelaxExecutable>().expect("the loaded tree has a typed relax executable")
}

/// Each relax MLP: the loaded executable describes itself as TVM described it.
#[test]
fn mlp_executables_match_tvms_description() {
    for (name, key, layout) in [
        ("relax_mlp_tvm019", RELAX_EXECUTABLE, Layout::Classic),
        ("relax_mlp_tvm027", RELAX_VM_EXECUTABLE, Layout::Ffi),
    ] {
        let dir = goldens().join("run");
        let meta = json(&dir.join(format!("{name}.json")));
        let tree = load(&dir.join(format!("{name}.so")));
        assert_eq!(tree.type_keys(), [key, "library"], "{name}");
        let exec = executable(&tree);
        assert_eq!(exec.type_key, key);
        assert_eq!(exec.layout, layout);

        // TVM's `as_text()`, line for line.
        let tvm_text: Vec<&str> =
            meta["relax"]["as_text"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
        let ours = exec.as_text();
        let ours: Vec<&str> = ours.lines().collect();
        assert_eq!(ours, tvm_text, "{name}: as_text");

        // TVM's `stats()`: the constant pool and the function table.
        let tvm_stats: Vec<&str> =
            meta["relax"]["stats"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
        let stats = exec.stats();
        assert_eq!(stats.lines().collect::<Vec<_>>(), tvm_stats, "{name}: stats");

        // main's parameters are the model's inputs, and its instructions are TVM's.
        let main = &exec.functions[exec.function_index("main").unwrap()];
        let inputs: Vec<&str> =
            meta["inputs"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
        assert_eq!(main.param_names, inputs);
        assert_eq!(main.kind, FuncKind::Vm);
        let calls = tvm_text.iter().filter(|l| l.starts_with("  call")).count();
        let rets = tvm_text.iter().filter(|l| l.starts_with("  ret")).count();
        assert_eq!((main.end - main.start) as usize, calls + rets);
        let kinds: Vec<&str> =
            meta["relax"]["instruction_kinds"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        assert_eq!(kinds, ["call", "ret"]);
        assert!(exec.instructions.iter().all(|i| matches!(i, Instruction::Call { .. } | Instruction::Ret { .. })));
        let vm = VirtualMachine::new(&tree, CPU).unwrap();
        let fns = vm.functions();
        assert_eq!(fns.len(), 1);
        assert_eq!((fns[0].name.as_str(), fns[0].params.clone()), ("main", vec!["x".to_owned()]));
    }
}

/// The MLPs of TVM 0.19 and 0.27 give TVM's outputs bit for bit.
#[test]
fn mlp_outputs_equal_tvms() {
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let dir = goldens().join("run");
        let tree = load(&dir.join(format!("{name}.so")));
        let vm = VirtualMachine::new(&tree, CPU).unwrap();
        let x = npy(&dir.join(format!("{name}.in.x.npy")));
        let expected = npy(&dir.join(format!("{name}.out.0.npy")));
        for _ in 0..2 {
            let out = vm.call_tensors("main", std::slice::from_ref(&x)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].shape, expected.shape, "{name}");
            assert_eq!(out[0].dtype, expected.dtype, "{name}");
            assert_eq!(&out[0].data[..], &expected.data[..], "{name}: output differs from TVM's");
        }
    }
}

const VERSIONS: [(&str, Layout, &str); 3] = [
    ("tvm-0.19.0", Layout::Classic, RELAX_EXECUTABLE),
    ("tvm-0.21.0", Layout::Classic021, RELAX_VM_EXECUTABLE),
    ("tvm-0.27.0.post1", Layout::Ffi, RELAX_VM_EXECUTABLE),
];

fn add_mul_dir(version: &str) -> PathBuf {
    goldens().join("other_versions").join(version)
}

/// `relax_add_mul` (`main(x, y) = (x + y) * 2`) from TVM 0.19, 0.21 and 0.27: the payload TVM
/// wrote parses, writes back byte for byte, and runs to TVM's output.
#[test]
fn add_mul_every_version() {
    for (version, layout, key) in VERSIONS {
        let dir = add_mul_dir(version);
        let payload = Bytes::from_vec(read(&dir.join(format!("relax_add_mul.{key}.bin"))));
        let exec = RelaxExecutable::read_payload(&payload, layout, key).unwrap_or_else(|e| panic!("{version}: {e}"));
        let names: Vec<&str> = exec.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "main",
                "vm.builtin.check_tensor_info",
                "vm.builtin.match_shape",
                "vm.builtin.alloc_storage",
                "vm.builtin.alloc_tensor",
                "vm.builtin.null_value",
                "add",
                "multiply"
            ],
            "{version}"
        );
        assert_eq!(exec.functions[0].param_names, ["x", "y"]);
        let mut again = Vec::new();
        exec.write_payload(layout, &mut again).unwrap();
        assert!(again == payload[..], "{version}: writing the executable back changed its bytes");
        let probe = json(&dir.join("probe.json"));
        assert_eq!(probe["root_payload"]["magic"].as_str().unwrap(), format!("{:#x}", exec.magic));

        let tree = load(&dir.join("relax_add_mul.so"));
        assert_eq!(executable(&tree), &exec, "{version}: the loaded payload differs from the file");
        let vm = VirtualMachine::new(&tree, CPU).unwrap();
        let x = npy(&dir.join("relax_add_mul.in.x.npy"));
        let y = npy(&dir.join("relax_add_mul.in.y.npy"));
        let expected = npy(&dir.join("relax_add_mul.out.0.npy"));
        let out = vm.call_tensors("main", &[x, y]).unwrap_or_else(|e| panic!("{version}: {e}"));
        assert_eq!(out.len(), 1);
        assert_eq!((&out[0].shape, &out[0].data[..]), (&expected.shape, &expected.data[..]), "{version}");
    }
}

/// The executable of one version, converted to another version's constant tags and back,
/// is unchanged; the converted bytes use the target's tags and magic.
#[test]
fn convert_between_versions() {
    let (_, layout, key) = VERSIONS[0];
    let payload = Bytes::from_vec(read(&add_mul_dir("tvm-0.19.0").join(format!("relax_add_mul.{key}.bin"))));
    let exec = RelaxExecutable::read_payload(&payload, layout, key).unwrap();
    let reference_027 = read(&add_mul_dir("tvm-0.27.0.post1").join("relax_add_mul.relax.VMExecutable.bin"));
    // TVM 0.19's bytes copied verbatim into the other layouts (as a tool that keeps payloads
    // opaque does) still read, in 0.19's dialect.
    for target in [Layout::Classic021, Layout::Ffi] {
        let copied = RelaxExecutable::read_payload(&payload, target, key).unwrap();
        assert_eq!(copied.layout, Layout::Classic);
        assert_eq!(copied.instructions, exec.instructions);
    }
    for target in Layout::ALL {
        let mut bytes = Vec::new();
        exec.write_payload(target, &mut bytes).unwrap();
        let back = RelaxExecutable::read_payload(&Bytes::from_vec(bytes.clone()), target, key).unwrap();
        assert_eq!(back.functions, exec.functions);
        assert_eq!(back.constants, exec.constants);
        assert_eq!(back.instructions, exec.instructions);
        if target == Layout::Ffi {
            // Apart from the code TVM 0.27 generated (its constant pool is deduplicated), the
            // header and function table are what 0.27 writes.
            let table_end = 8
                + 12
                + exec
                    .functions
                    .iter()
                    .map(|f| 4 + 8 + f.name.len() + 32 + 8 + f.param_names.iter().map(|p| 8 + p.len()).sum::<usize>())
                    .sum::<usize>()
                + 8;
            assert_eq!(&bytes[..table_end], &reference_027[..table_end]);
        }
    }
}

/// The loaded tree of a blob in memory gives the typed executable (the registry's loader),
/// and the classic reader measures the payload itself.
#[test]
fn blob_loads_typed_executable() {
    let blob = Bytes::from_vec(read(&add_mul_dir("tvm-0.19.0").join("relax_add_mul.blob")));
    let tree = load_blob(&blob, Layout::Classic, &Registry::default(), &LoadOptions::default()).unwrap();
    assert_eq!(tree.type_keys(), ["relax.Executable", "library"]);
    assert_eq!(executable(&tree).functions.len(), 8);
    // Without a library there are no kernels: the VM names the first one it cannot find.
    let err = VirtualMachine::new(&tree, CPU).unwrap_err();
    assert!(matches!(&err, VmError::MissingFunction { name } if name == "add"), "{err}");
}

fn mlp_vm(name: &str) -> (LoadedTree, Tensor) {
    let dir = goldens().join("run");
    (load(&dir.join(format!("{name}.so"))), npy(&dir.join(format!("{name}.in.x.npy"))))
}

/// A wrong shape or dtype gets TVM's message from `check_tensor_info` / `match_shape`.
#[test]
fn wrong_inputs_get_tvms_messages() {
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let (tree, x) = mlp_vm(name);
        let vm = VirtualMachine::new(&tree, CPU).unwrap();
        let ctx = r#"ErrorContext(fn=main, loc=param[0], param=x, annotation=R.Tensor((2, 64), dtype="float32")) "#;

        let wrong_dim = Tensor::new(DataType::F32, vec![2, 32], vec![0; 2 * 32 * 4]).unwrap();
        let err = vm.call_tensors("main", &[wrong_dim]).unwrap_err();
        assert_eq!(
            err.root().to_string(),
            format!("RuntimeError: {ctx} match_cast error,  shape[1] mismatch to specified constant.")
        );
        assert!(err.to_string().contains("vm.builtin.match_shape"), "{err}");

        let wrong_ndim = Tensor::new(DataType::F32, vec![128], vec![0; 128 * 4]).unwrap();
        let err = vm.call_tensors("main", &[wrong_ndim]).unwrap_err();
        assert_eq!(err.root().to_string(), format!("ValueError: {ctx} expect Tensor with ndim 2 but get 1"));

        let wrong_dtype = Tensor::new(DataType::I32, vec![2, 64], vec![0; 2 * 64 * 4]).unwrap();
        let err = vm.call_tensors("main", &[wrong_dtype]).unwrap_err();
        assert_eq!(err.root().to_string(), format!("ValueError: {ctx} expect Tensor with dtype float32 but get int32"));

        let err = vm.call_tensors("main", &[x.clone(), x.clone()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ValueError: Invoking function main expects 1 arguments (x), but 2 arguments were provided."
        );
        let err = vm.call_tensors("softmax", std::slice::from_ref(&x)).unwrap_err();
        assert!(matches!(err, VmError::UnknownFunction { .. }), "{err}");
        // The VM still works after the errors.
        assert_eq!(vm.call_tensors("main", &[x]).unwrap().len(), 1);
    }
}

/// Every truncation of every golden executable is a typed error, never a panic.
#[test]
fn truncations_are_errors() {
    let mut cases: Vec<(Vec<u8>, Layout, &str)> = VERSIONS
        .iter()
        .map(|(v, l, k)| (read(&add_mul_dir(v).join(format!("relax_add_mul.{k}.bin"))), *l, *k))
        .collect();
    for (name, layout, key) in [
        ("relax_mlp_tvm019", Layout::Classic, RELAX_EXECUTABLE),
        ("relax_mlp_tvm027", Layout::Ffi, RELAX_VM_EXECUTABLE),
    ] {
        let tree = mlp_vm(name).0;
        let mut bytes = Vec::new();
        executable(&tree).write_payload(layout, &mut bytes).unwrap();
        cases.push((bytes, layout, key));
    }
    for (bytes, layout, key) in cases {
        for cut in 0..bytes.len() {
            let part = Bytes::from_vec(bytes[..cut].to_vec());
            let err = RelaxExecutable::read_payload(&part, layout, key);
            assert!(err.is_err(), "{key} {layout}: a truncation to {cut} bytes parsed");
            if layout != Layout::Ffi {
                // The classic string wrapper is measured from its length.
                assert!(RelaxExecutable::measure_classic(&part, 0).is_err());
            }
        }
    }
}

/// Corrupt executables (each byte replaced, forged counts and indices) are typed errors or
/// programs that still pass every check; no panic, no huge allocation.
#[test]
fn corrupt_bytes_are_errors() {
    let (_, layout, key) = VERSIONS[2];
    let bytes = read(&add_mul_dir("tvm-0.27.0.post1").join(format!("relax_add_mul.{key}.bin")));
    let mut parsed = 0;
    for i in 0..bytes.len() {
        for v in [0x00, 0xFF, 0x7F, 0x80] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok(e) = RelaxExecutable::read_payload(&Bytes::from_vec(b), layout, key) {
                parsed += 1;
                let _ = e.as_text();
            }
        }
    }
    assert!(parsed > 0, "some corruptions (in tensor data, names) still parse");

    // A forged register file size is refused before any call allocates it.
    let exec = RelaxExecutable::read_payload(&Bytes::from_vec(bytes.clone()), layout, key).unwrap();
    let mut forged = exec.clone();
    forged.functions[0].register_file_size = 1 << 40;
    let mut out = Vec::new();
    forged.write_payload(layout, &mut out).unwrap();
    let err = RelaxExecutable::read_payload(&Bytes::from_vec(out), layout, key).unwrap_err();
    assert!(err.to_string().contains("register_file_size"), "{err}");

    // A constant index past the pool.
    let mut forged = exec.clone();
    forged.constants.truncate(1);
    let mut out = Vec::new();
    forged.write_payload(layout, &mut out).unwrap();
    let err = RelaxExecutable::read_payload(&Bytes::from_vec(out), layout, key).unwrap_err();
    assert!(err.to_string().contains("constant index"), "{err}");
    assert!(matches!(exec.constants[0], Constant::Str(_) | Constant::DataType(_)));

    // Two instructions forged to start at the same word (which would let a short input decode
    // into a large program) are refused at the second offset.
    let (no, nd) = (exec.instr_offsets().len(), exec.instr_data().len());
    let offsets_at = bytes.len() - (16 + 8 * (no + nd)) + 8;
    let mut b = bytes.clone();
    b[offsets_at + 8..offsets_at + 16].copy_from_slice(&0i64.to_le_bytes());
    let err = RelaxExecutable::read_payload(&Bytes::from_vec(b), layout, key).unwrap_err();
    assert_eq!(err.offset, offsets_at as u64 + 8, "{err}");
    assert!(err.to_string().contains("instr_offset"), "{err}");
}

/// Constant tensors stay borrowed from the blob (a model's weights are not copied on load),
/// and the relax MLP's blob, found in the ELF file without running it, loads from memory.
#[test]
fn constant_tensors_are_borrowed() {
    let so = read(&goldens().join("run/relax_mlp_tvm019.so"));
    let found = mblob_runtime::elf::find_blob(&so, None).unwrap().expect("blob symbol");
    let blob = Bytes::from_vec(found.bytes(&so).unwrap().to_vec());
    let tree = load_blob(&blob, found.layout, &Registry::default(), &LoadOptions::default()).unwrap();
    let exec = executable(&tree);
    let range = blob.as_ptr() as usize..blob.as_ptr() as usize + blob.len();
    let tensors: Vec<_> = exec
        .constants
        .iter()
        .filter_map(|c| match c {
            Constant::Tensor(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(tensors.len(), 4, "W1, b1, W2, b2");
    assert!(tensors.iter().all(|t| range.contains(&(t.data.as_ptr() as usize))));
}

/// Models built and run by TVM 0.27 for this test (`tests/fixtures/tvm-goldens/relax/make.py`):
/// tuple outputs, `vm.builtin.reshape` views, a fused kernel, a symbolic batch (shape heap,
/// `shape_func`, `make_shape`), `If`/`Goto` on a boolean tensor, and a call of a second VM
/// function. Each executable reads as TVM describes it, and every run gives TVM's outputs.
#[test]
fn tvm_027_feature_models() {
    let dir = goldens().join("relax/tvm-0.27");
    for name in ["relax_tuple_reshape", "relax_dynamic", "relax_fused", "relax_branch", "relax_two_functions"] {
        let meta = json(&dir.join(format!("{name}.json")));
        let tree = load(&dir.join(format!("{name}.so")));
        let exec = executable(&tree);
        let lines = |k: &str| -> Vec<String> {
            meta[k].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_owned()).collect()
        };
        assert_eq!(exec.as_text().split('\n').collect::<Vec<_>>(), lines("as_text"), "{name}: as_text");
        assert_eq!(exec.stats().split('\n').collect::<Vec<_>>(), lines("stats"), "{name}: stats");
        let vm = VirtualMachine::new(&tree, CPU).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (k, run) in meta["runs"].as_array().unwrap().iter().enumerate() {
            let inputs: Vec<Tensor> =
                run["inputs"].as_array().unwrap().iter().map(|i| npy(&dir.join(i["file"].as_str().unwrap()))).collect();
            let names: Vec<&str> =
                run["inputs"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
            let main = vm.functions().into_iter().find(|f| f.name == "main").unwrap();
            assert_eq!(main.params, names, "{name}");
            let outs = vm.call_tensors("main", &inputs).unwrap_or_else(|e| panic!("{name} run {k}: {e}"));
            let want = run["outputs"].as_array().unwrap();
            assert_eq!(outs.len(), want.len(), "{name} run {k}");
            for (o, w) in outs.iter().zip(want) {
                let w = npy(&dir.join(w["file"].as_str().unwrap()));
                assert_eq!((&o.shape, o.dtype), (&w.shape, w.dtype), "{name} run {k}");
                assert!(o.data[..] == w.data[..], "{name} run {k}: output differs from TVM's");
            }
        }
    }
}

/// Equal to TVM's output: bit for bit where TVM's 1- and 4-thread runs agreed, else (float32)
/// within 1e-5 relative.
fn assert_like_tvms(got: &Tensor, want: &Tensor, bit_equal: bool, what: &str) {
    assert_eq!((&got.shape, got.dtype), (&want.shape, want.dtype), "{what}: shape/dtype");
    if bit_equal || want.dtype != DataType::F32 {
        assert!(got.data[..] == want.data[..], "{what}: differs from TVM's output");
        return;
    }
    let f = |d: &[u8]| d.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    for (i, (g, w)) in f(&got.data).into_iter().zip(f(&want.data)).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-30), "{what}: element {i}: {g} vs TVM's {w}");
    }
}

/// Models no one wrote the VM against (`relax/unseen/make.py`: conv + pooling, layer norm /
/// softmax / gelu, attention, concat / split with nested tuples, int8 / int32 / bool, a
/// hand-written TIR kernel and a subfunction, an input and a shape returned), built by TVM 0.19
/// (`relax.build`) and 0.27 (`tvm.compile`): each executable describes itself as TVM did, and
/// each runs at 1 and 4 threads with TVM's outputs.
#[test]
fn unseen_models_from_tvm_019_and_027() {
    let mut seen = 0;
    for version in ["tvm-0.19-unseen", "tvm-0.27-unseen"] {
        let dir = goldens().join("relax").join(version);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().into_string().ok()?.strip_suffix(".json").map(str::to_owned))
            .collect();
        names.sort();
        assert_eq!(names.len(), 11, "{version}: {names:?}");
        for name in &names {
            let meta = json(&dir.join(format!("{name}.json")));
            let tree = load(&dir.join(format!("{name}.so")));
            let exec = executable(&tree);
            let lines = |k: &str| -> Vec<String> {
                meta[k].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_owned()).collect()
            };
            assert_eq!(exec.as_text().split('\n').collect::<Vec<_>>(), lines("as_text"), "{version}/{name}: as_text");
            assert_eq!(exec.stats().split('\n').collect::<Vec<_>>(), lines("stats"), "{version}/{name}: stats");
            let vm = VirtualMachine::new(&tree, CPU).unwrap_or_else(|e| panic!("{version}/{name}: {e}"));
            for run in meta["runs"].as_array().unwrap() {
                let ins = run["inputs"].as_array().unwrap();
                let inputs: Vec<Tensor> = ins.iter().map(|i| npy(&dir.join(i["file"].as_str().unwrap()))).collect();
                let agree = run["threads_1_and_4_agree"].as_bool().unwrap();
                for threads in [1, 4] {
                    threadpool::set_num_threads(threads);
                    let what = format!("{version}/{name} at {threads} threads");
                    let args: Vec<Value> = inputs.iter().map(hostvalue::tensor).collect();
                    let result = vm.invoke("main", &args).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let outs = result.flatten();
                    let want = run["outputs"].as_array().unwrap();
                    assert_eq!(outs.len(), want.len(), "{what}");
                    for (j, (o, w)) in outs.iter().zip(want).enumerate() {
                        let file = w[if threads == 4 && !agree && w.get("file_4_threads").is_some() {
                            "file_4_threads"
                        } else {
                            "file"
                        }]
                        .as_str()
                        .unwrap();
                        let mut w_t = npy(&dir.join(file));
                        if w_t.dtype == (DataType { code: 6, bits: 8, lanes: 1 }) {
                            // A bool comes back as numpy spells it, `uint1` (one byte per
                            // element, as TVM 0.19's bool), whichever TVM built the model.
                            w_t.dtype = DataType { code: 1, bits: 1, lanes: 1 };
                        }
                        match (o, w["kind"].as_str().unwrap()) {
                            (Value::Tensor(t), "tensor") => {
                                assert_like_tvms(&t.to_tensor().unwrap(), &w_t, agree, &format!("{what} out {j}"))
                            }
                            (Value::Shape(s), "shape") => {
                                let want: Vec<i64> = w_t
                                    .data
                                    .chunks_exact(8)
                                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                                    .collect();
                                assert_eq!(s[..], want[..], "{what} out {j}");
                            }
                            (o, k) => panic!("{what} out {j}: got {o:?}, TVM returned a {k}"),
                        }
                    }
                    seen += 1;
                }
            }
            threadpool::set_num_threads(0);
        }
    }
    assert_eq!(seen, 44);
}

/// `unseen_dynamic_branch`'s else branch, as TVM 0.19 and 0.27 compile it, allocates a tensor
/// from a storage register only the then branch sets (TVM's own VM segfaults there): a typed
/// error naming the builtin and the argument, not a crash.
#[test]
fn miscompiled_else_branch_is_a_typed_error() {
    for version in ["tvm-0.19-unseen", "tvm-0.27-unseen"] {
        let dir = goldens().join("relax").join(version);
        let tree = load(&dir.join("unseen_dynamic_branch.so"));
        let vm = VirtualMachine::new(&tree, CPU).unwrap();
        let bool_dtype = if version == "tvm-0.19-unseen" {
            DataType { code: 1, bits: 1, lanes: 1 }
        } else {
            DataType { code: 6, bits: 8, lanes: 1 }
        };
        let c = Tensor::new(bool_dtype, vec![], vec![0]).unwrap();
        let x = npy(&dir.join("unseen_dynamic_branch.run0.in.x.npy"));
        let w = npy(&dir.join("unseen_dynamic_branch.run0.in.w.npy"));
        let err = vm.call_tensors("main", &[c, x.clone(), w.clone()]).unwrap_err();
        assert!(
            matches!(
                err.root(),
                VmError::Type { callee, index: 0, got: "None", .. } if callee == "vm.builtin.alloc_tensor"
            ),
            "{version}: {err}"
        );
        assert!(err.to_string().contains("in `main` at instruction"), "{version}: {err}");
        // The VM is still usable: the then branch gives TVM's output, with bool spelled either
        // way (`uint1` as TVM 0.19 does, tvm-ffi's `kDLBool` as numpy's `|b1` reads).
        for spelling in [DataType { code: 1, bits: 1, lanes: 1 }, DataType { code: 6, bits: 8, lanes: 1 }] {
            let c = Tensor::new(spelling, vec![], vec![1]).unwrap();
            let out = vm.call_tensors("main", &[c, x.clone(), w.clone()]).unwrap_or_else(|e| panic!("{version}: {e}"));
            assert_eq!(out[0].data, npy(&dir.join("unseen_dynamic_branch.run0.out.0.npy")).data, "{version}");
        }
    }
}

/// A symbolic dimension that disagrees with one bound earlier gets TVM's message (the shape
/// heap's "previous populated value").
#[test]
fn dynamic_shape_mismatch_gets_tvms_message() {
    let dir = goldens().join("relax/tvm-0.27");
    let tree = load(&dir.join("relax_dynamic.so"));
    let vm = VirtualMachine::new(&tree, CPU).unwrap();
    let x = Tensor::new(DataType::F32, vec![3, 4], vec![0; 48]).unwrap();
    let w = Tensor::new(DataType::F32, vec![5, 3], vec![0; 60]).unwrap();
    let err = vm.call_tensors("main", &[x, w]).unwrap_err();
    let ctx = r#"ErrorContext(fn=main, loc=param[1], param=w, annotation=R.Tensor((4, 3), dtype="float32")) "#;
    assert_eq!(
        err.root().to_string(),
        format!("RuntimeError: {ctx} match_cast error,  shape[0] mismatch to specified constant.")
    );
}

/// VMs over one loaded library run at the same time on several threads (one moved into each
/// thread), each giving TVM's output every time.
#[test]
fn vms_run_concurrently() {
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let dir = goldens().join("run");
        let tree = load(&dir.join(format!("{name}.so")));
        let x = npy(&dir.join(format!("{name}.in.x.npy")));
        let expected = npy(&dir.join(format!("{name}.out.0.npy")));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let vm = VirtualMachine::new(&tree, CPU).unwrap();
                let (x, expected) = (&x, &expected);
                s.spawn(move || {
                    for _ in 0..50 {
                        let out = vm.call_tensors("main", std::slice::from_ref(x)).unwrap();
                        assert!(out[0].data[..] == expected.data[..], "{name}");
                    }
                });
            }
        });
    }
}

/// A program built with `RelaxExecutable::from_parts` for `relax_add_mul.so`'s `add` kernel,
/// which has no argument checks in front: `main(x, y)` allocates a storage on device index
/// `device_index`, a [2, 3] float32 tensor in it, and calls `add(x, y, out)`.
fn add_program(tree: &LoadedTree, layout: Layout, device_index: i64) -> VirtualMachine {
    use mblob_runtime::exec::relax::{Arg, FuncInfo};
    let packed = |name: &str| FuncInfo {
        kind: FuncKind::Packed,
        name: name.into(),
        start: 0,
        end: 0,
        num_args: -2,
        register_file_size: 0,
        param_names: vec![],
    };
    let main = FuncInfo {
        kind: FuncKind::Vm,
        name: "main".into(),
        start: 0,
        end: 4,
        num_args: 2,
        register_file_size: 4,
        param_names: vec!["x".into(), "y".into()],
    };
    let functions = vec![main, packed("vm.builtin.alloc_storage"), packed("vm.builtin.alloc_tensor"), packed("add")];
    let constants = vec![
        Constant::Shape(vec![24]),
        Constant::DataType(DataType { code: 1, bits: 8, lanes: 1 }),
        Constant::Str(b"global".to_vec()),
        Constant::Shape(vec![2, 3]),
        Constant::DataType(DataType::F32),
    ];
    let r = |i| Reg::Index(i);
    let code = vec![
        Instruction::Call {
            dst: r(2),
            func: 1,
            args: vec![Arg::Reg(Reg::Vm), Arg::Const(0), Arg::Imm(device_index), Arg::Const(1), Arg::Const(2)],
        },
        Instruction::Call { dst: r(3), func: 2, args: vec![Arg::Reg(r(2)), Arg::Imm(0), Arg::Const(3), Arg::Const(4)] },
        Instruction::Call { dst: Reg::Void, func: 3, args: vec![Arg::Reg(r(0)), Arg::Reg(r(1)), Arg::Reg(r(3))] },
        Instruction::Ret { result: r(3) },
    ];
    let exec = RelaxExecutable::from_parts(RELAX_VM_EXECUTABLE, layout, functions, constants, code).unwrap();
    VirtualMachine::with_executable(tree, std::sync::Arc::new(exec), CPU).unwrap()
}

/// A program built with `RelaxExecutable::from_parts` that calls a kernel with no argument
/// checks in front: with the right shapes it computes `x + y` (TVM's output halved, exactly),
/// and with a wrong shape the kernel's own check fails and its message comes back as an error,
/// in each version's convention (0.19 `TVMAPISetLastError`, 0.21 `TVMFFIErrorSetRaisedFromCStr`,
/// 0.27 `TVMFFIErrorSetRaisedFromCStrParts`).
#[test]
fn kernel_errors_come_back_in_every_convention() {
    for (version, layout, _) in VERSIONS {
        let dir = add_mul_dir(version);
        let tree = load(&dir.join("relax_add_mul.so"));
        let vm = add_program(&tree, layout, 0);
        let x = npy(&dir.join("relax_add_mul.in.x.npy"));
        let y = npy(&dir.join("relax_add_mul.in.y.npy"));
        let out = vm.call_tensors("main", &[x.clone(), y.clone()]).unwrap_or_else(|e| panic!("{version}: {e}"));
        let twice: Vec<f32> = out[0].to_f32().unwrap().iter().map(|v| v * 2.0).collect();
        assert_eq!(twice, npy(&dir.join("relax_add_mul.out.0.npy")).to_f32().unwrap(), "{version}");

        let wrong = Tensor::new(DataType::F32, vec![3, 2], x.data.clone()).unwrap();
        let err = vm.call_tensors("main", &[wrong, y]).unwrap_err();
        match err.root() {
            VmError::Kernel { name, code, message } => {
                assert_eq!(name, "add");
                assert_ne!(*code, 0);
                assert!(message.contains("shape"), "{version}: {message}");
            }
            e => panic!("{version}: {e}"),
        }
    }
}

/// Programs the VM refuses: an unknown builtin when it is called, a missing kernel when the
/// VM is created (as TVM's `InitFuncPool` does), a VM TIR function is unsupported, and
/// a jump to itself is refused when the executable is built.
#[test]
fn unsupported_programs_are_named() {
    use mblob_runtime::exec::relax::{Arg, FuncInfo};
    let tree = load(&add_mul_dir("tvm-0.27.0.post1").join("relax_add_mul.so"));
    let func = |kind, name: &str, end| FuncInfo {
        kind,
        name: name.into(),
        start: 0,
        end,
        num_args: if kind == FuncKind::Packed { -2 } else { 0 },
        register_file_size: if kind == FuncKind::Packed { 0 } else { 1 },
        param_names: vec![],
    };
    let build = |callee: FuncInfo| {
        let code = vec![
            Instruction::Call { dst: Reg::Index(0), func: 1, args: vec![Arg::Imm(1)] },
            Instruction::Ret { result: Reg::Index(0) },
        ];
        let exec = RelaxExecutable::from_parts(
            RELAX_VM_EXECUTABLE,
            Layout::Ffi,
            vec![func(FuncKind::Vm, "main", 2), callee],
            vec![],
            code,
        )
        .unwrap();
        VirtualMachine::with_executable(&tree, std::sync::Arc::new(exec), CPU).unwrap_err()
    };
    // An unknown builtin is refused only when it is called, naming it.
    let exec = RelaxExecutable::from_parts(
        RELAX_VM_EXECUTABLE,
        Layout::Ffi,
        vec![func(FuncKind::Vm, "main", 2), func(FuncKind::Packed, "vm.builtin.frobnicate", 0)],
        vec![],
        vec![
            Instruction::Call { dst: Reg::Index(0), func: 1, args: vec![Arg::Imm(1)] },
            Instruction::Ret { result: Reg::Index(0) },
        ],
    )
    .unwrap();
    let vm = VirtualMachine::with_executable(&tree, std::sync::Arc::new(exec), CPU).unwrap();
    let err = vm.call_tensors("main", &[]).unwrap_err();
    assert!(matches!(err.root(), VmError::UnknownBuiltin { name, .. } if name == "vm.builtin.frobnicate"), "{err}");
    let err = build(func(FuncKind::Packed, "no_such_kernel", 0));
    assert!(matches!(&err, VmError::MissingFunction { name } if name == "no_such_kernel"), "{err}");
    let err = build(func(FuncKind::VmTir, "compiled", 0));
    assert!(matches!(&err, VmError::VmTir { name } if name == "compiled"), "{err}");

    let spin = RelaxExecutable::from_parts(
        RELAX_VM_EXECUTABLE,
        Layout::Ffi,
        vec![func(FuncKind::Vm, "main", 2)],
        vec![],
        vec![Instruction::Goto { offset: 0 }, Instruction::Ret { result: Reg::Void }],
    )
    .unwrap_err();
    assert!(spin.to_string().contains("jump to itself"), "{spin}");
}

/// The VM's device list is TVM's: the CPU alone for the CPU. `invoke` takes tensors
/// already on it, passes them uncopied, and gives the outputs as they are (TVM's output, bit
/// for bit); a tensor used as an input is not changed by the run.
#[test]
fn arrays_in_and_out_on_the_cpu() {
    for name in ["relax_mlp_tvm019", "relax_mlp_tvm027"] {
        let dir = goldens().join("run");
        let (tree, x) = mlp_vm(name);
        let vm = VirtualMachine::new(&tree, CPU).unwrap();
        assert_eq!(vm.devices(), [CPU]);
        let expected = npy(&dir.join(format!("{name}.out.0.npy")));
        let xa = NdArray::from_tensor(&x, CPU).unwrap();
        for _ in 0..2 {
            let out = vm.invoke("main", &[Value::Tensor(xa.clone())]).unwrap_or_else(|e| panic!("{name}: {e}"));
            let out = out.as_tensor().expect("main returns a tensor");
            assert_eq!(out.device(), CPU);
            assert_eq!((out.shape(), out.dtype()), (&expected.shape[..], expected.dtype), "{name}");
            assert!(out.to_bytes().unwrap() == expected.data[..], "{name}: output differs from TVM's");
        }
        assert!(xa.to_bytes().unwrap() == x.data[..], "{name}: the input changed");
        // A tensor made from the host form gives the same.
        assert!(vm.call_tensors("main", std::slice::from_ref(&x)).unwrap()[0].data[..] == expected.data[..]);
    }
}

/// A device the library has no code for is refused when the VM is created, naming the device
/// and what the library holds (no device API is opened for that).
#[test]
fn devices_without_code_are_refused() {
    let (tree, _) = mlp_vm("relax_mlp_tvm027");
    for device in [Device::opencl(0), Device::cuda(1), Device { device_type: DeviceType::Vulkan, device_id: 0 }] {
        let err = VirtualMachine::new(&tree, device).unwrap_err();
        match &err {
            VmError::UnsupportedDevice { device: d, reason } => {
                assert_eq!(*d, device);
                assert!(reason.contains("relax.VMExecutable, library"), "{err}");
            }
            e => panic!("{device}: {e}"),
        }
        assert!(err.to_string().starts_with(&format!("not supported on {device}: the relax VM ")), "{err}");
    }
}

/// `vm.builtin.alloc_storage`'s device index is an index into TVM's device list: `0` the VM's
/// device, anything else TVM's error (`-1` too: TVM's check compares as unsigned, see
/// `tests/fixtures/vm-checks/tvm-0.27.json`, `exec:alloc_storage_device_minus_1`).
#[test]
fn alloc_storage_device_indices() {
    let (version, layout, _) = VERSIONS[2];
    let dir = add_mul_dir(version);
    let tree = load(&dir.join("relax_add_mul.so"));
    let program = |device_index| add_program(&tree, layout, device_index);
    let x = npy(&dir.join("relax_add_mul.in.x.npy"));
    let y = npy(&dir.join("relax_add_mul.in.y.npy"));
    let want: Vec<f32> = npy(&dir.join("relax_add_mul.out.0.npy")).to_f32().unwrap().iter().map(|v| v / 2.0).collect();
    let out = program(0).call_tensors("main", &[x.clone(), y.clone()]).unwrap();
    assert_eq!(out[0].to_f32().unwrap(), want, "device index 0");
    for index in [-1, 1, -2, 7] {
        let err = program(index).call_tensors("main", &[x.clone(), y.clone()]).unwrap_err();
        // TVM's check and message (`src/runtime/vm/builtin.cc`, `VMAllocStorage`).
        assert!(
            matches!(err.root(), VmError::Check { kind: "InternalError", message }
                if message == "The device index is out of VM physical devices list"),
            "{index}: {err}"
        );
    }
}

/// The device-run goldens (`tests/fixtures/device-run`): models TVM 0.27 compiled for a GPU
/// target, with the outputs TVM computed for the same model on the CPU.
fn device_run() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/device-run")
}

/// The API of `device`, or `None` (after saying so) when it does not open. When the device's
/// feature is built in and `require` (`MBLOB_REQUIRE_OPENCL`, ...) is set, as CI sets it where
/// the device is, that is a failure instead.
fn device_or_skip(
    device: Device,
    feature_built: bool,
    require: &str,
) -> Option<std::sync::Arc<dyn mblob_runtime::device::DeviceApi>> {
    match mblob_runtime::device::device_api(device) {
        Ok(api) => Some(api),
        Err(e) => {
            if feature_built && std::env::var_os(require).is_some() {
                panic!("{require} is set but {device} does not open: {e}");
            }
            eprintln!("skipped: no {device} device ({e})");
            None
        }
    }
}

/// Within `rtol` of `max(1, max|ref|)` elementwise (the device-run goldens' rule).
fn assert_close(got: &Tensor, want: &Tensor, rtol: f64, what: &str) {
    assert_eq!((&got.shape, got.dtype), (&want.shape, want.dtype), "{what}: shape/dtype");
    let (g, w) = (got.to_f32().unwrap(), want.to_f32().unwrap());
    let scale = w.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let err = (f64::from(*a) - f64::from(*b)).abs();
        assert!(err <= rtol * scale, "{what}: element {i}: {a} vs TVM's {b} (|diff| {err} > {rtol} * {scale})");
    }
}

/// Runs every case of the device-run golden `name` on `device`: each input (`invoke`, host
/// tensors in and out) gives TVM's output within the golden's tolerance, twice. An error of
/// the VM comes back; a wrong output fails.
fn run_device_golden(name: &str, device: Device) -> Result<(), VmError> {
    let dir = device_run();
    let meta = json(&dir.join(format!("{name}.json")));
    let tree = load(&dir.join(format!("{name}.so")));
    let vm = VirtualMachine::new(&tree, device)?;
    assert_eq!(vm.devices(), [device, Device::cpu(0)]);
    let entry = meta["entry"].as_str().unwrap();
    let rtol = meta["rtol"].as_f64().unwrap();
    let cases = match meta.get("cases") {
        Some(c) => c.as_array().unwrap().clone(),
        None => vec![meta.clone()],
    };
    for (k, case) in cases.iter().enumerate() {
        let file = |v: &serde_json::Value| npy(&dir.join(v["file"].as_str().unwrap()));
        let inputs: Vec<Tensor> = case["inputs"].as_array().unwrap().iter().map(file).collect();
        let want: Vec<Tensor> = case["outputs"].as_array().unwrap().iter().map(file).collect();
        for run in 0..2 {
            let what = format!("{name} on {device}, case {k}, run {run}");
            let outs = vm.call_tensors(entry, &inputs)?;
            assert_eq!(outs.len(), want.len(), "{what}");
            for (o, w) in outs.iter().zip(&want) {
                assert_close(o, w, rtol, &what);
            }
        }
    }
    Ok(())
}

/// Serialises the tests that run on OpenCL: one of them counts the device's copies, which are
/// counted per device for the whole process.
static OPENCL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// TVM 0.27's default GPU pipeline output for OpenCL (`dev_relax_mlp_opencl`, and the CNN and
/// the transformer with a symbolic sequence length when present) runs on OpenCL device 0 to
/// TVM's outputs. Skipped, saying so, without an OpenCL device.
#[test]
fn opencl_goldens_run_on_opencl() {
    let _serial = OPENCL.lock().unwrap_or_else(|e| e.into_inner());
    if device_or_skip(Device::opencl(0), cfg!(feature = "opencl"), "MBLOB_REQUIRE_OPENCL").is_none() {
        return;
    }
    run_device_golden("dev_relax_mlp_opencl", Device::opencl(0))
        .unwrap_or_else(|e| panic!("dev_relax_mlp_opencl: {e}"));
    for name in ["dev_relax_cnn_opencl", "dev_relax_transformer_opencl"] {
        run_device_golden(name, Device::opencl(0)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// On OpenCL, a run moves only what TVM's VM moves: the constants once when the VM is made,
/// then per `invoke` one upload per input and one download per output, nothing between
/// kernels; an input already on the device, the output left there, moves nothing at all.
#[test]
fn opencl_copies_inputs_outputs_and_constants_once() {
    let _serial = OPENCL.lock().unwrap_or_else(|e| e.into_inner());
    let device = Device::opencl(0);
    let Some(api) = device_or_skip(device, cfg!(feature = "opencl"), "MBLOB_REQUIRE_OPENCL") else { return };
    let name = "dev_relax_mlp_opencl";
    let dir = device_run();
    let tree = load(&dir.join(format!("{name}.so")));
    let constants = executable(&tree).constants.iter().filter(|c| matches!(c, Constant::Tensor(_))).count() as u64;
    assert_eq!(constants, 4, "W1, b1, W2, b2");
    let x = npy(&dir.join(format!("{name}.in.x.npy")));
    let want = npy(&dir.join(format!("{name}.out.0.npy")));

    let before = api.transfers();
    let vm = VirtualMachine::new(&tree, device).unwrap();
    let d = api.transfers() - before;
    assert_eq!((d.host_to_device, d.device_to_host, d.device_to_device), (constants, 0, 0), "creating the VM: {d:?}");

    for run in 0..3 {
        let before = api.transfers();
        let out = vm.call_tensors("forward", std::slice::from_ref(&x)).unwrap();
        let d = api.transfers() - before;
        assert_eq!((d.host_to_device, d.device_to_host, d.device_to_device), (1, 1, 0), "invoke {run}: {d:?}");
        assert_eq!(d.host_to_device_bytes, x.data.len() as u64);
        assert_eq!(d.device_to_host_bytes, want.data.len() as u64);
        assert_close(&out[0], &want, 1e-4, name);
    }

    // Inputs already on the device, outputs left there.
    let xa = NdArray::from_tensor(&x, device).unwrap();
    let before = api.transfers();
    let out = vm.invoke("forward", &[Value::Tensor(xa)]).unwrap();
    let d = api.transfers() - before;
    assert_eq!((d.host_to_device, d.device_to_host, d.device_to_device), (0, 0, 0), "on the device: {d:?}");
    let out = out.as_tensor().expect("forward returns a tensor").clone();
    assert_eq!(out.device(), device);
    assert_close(&out.to_tensor().unwrap(), &want, 1e-4, name);
    // A host input is copied to the device, once.
    let xh = NdArray::from_tensor(&x, Device::cpu(0)).unwrap();
    let before = api.transfers();
    let out = vm.invoke("forward", &[Value::Tensor(xh)]).unwrap();
    let d = api.transfers() - before;
    assert_eq!((d.host_to_device, d.device_to_host, d.device_to_device), (1, 0, 0), "a host input: {d:?}");
    let out = out.as_tensor().expect("forward returns a tensor").clone();
    assert_close(&out.to_tensor().unwrap(), &want, 1e-4, name);
}

/// The CUDA builds of the device-run goldens run to TVM's outputs on CUDA device 0: those for
/// its architecture (a build for another one has no kernel image for it, and is skipped with a
/// message), at least the MLP. Ignored without an NVIDIA GPU (`cargo test -- --ignored` where
/// there is one).
#[test]
#[ignore = "needs an NVIDIA GPU with its driver, and NVRTC"]
fn cuda_goldens_run_on_cuda() {
    if device_or_skip(Device::cuda(0), cfg!(feature = "cuda"), "MBLOB_REQUIRE_CUDA").is_none() {
        return;
    }
    let mut mlps = 0;
    for name in [
        "dev_relax_mlp_cuda_sm90",
        "dev_relax_mlp_cuda_sm80",
        "dev_relax_cnn_cuda_sm90",
        "dev_relax_transformer_cuda_sm90",
    ] {
        match run_device_golden(name, Device::cuda(0)) {
            Ok(()) => mlps += usize::from(name.starts_with("dev_relax_mlp")),
            Err(e) if e.to_string().contains("NO_BINARY_FOR_GPU") || e.to_string().contains("no kernel image") => {
                eprintln!("skipped: {name} (built for another GPU architecture: {e})")
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    assert!(mlps > 0, "no build of the relax MLP ran on this GPU");
}
