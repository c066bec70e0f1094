//! The Relax VM with arguments and results beyond tensors, against TVM 0.27: the models of
//! tests/fixtures/relax-vm (closures, shape, prim, string and tuple arguments, nested tuple
//! results, `R.memory.view`, `match_cast`, a returned shape, an LLM builtin in one function)
//! run through `VirtualMachine::invoke` and through `Model`, each result compared with
//! the one TVM's VM gave (structure and bytes), and bad arguments fail with TVM's messages.

use std::path::{Path, PathBuf};

use mblob_runtime::exec::relax::{ParamKind, VirtualMachine, VmError};
use mblob_runtime::exec::{Model, Value};
use mblob_runtime::format::stream::DataType;
use mblob_runtime::payload::graph::Tensor;
use mblob_runtime::{load_library, Device, LoadOptions, LoadedTree, Registry};

#[path = "support/npyfile.rs"]
mod npyfile;

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::{host, Host, HostCalls};

/// A host value as a model's input (host tensors on the CPU).
fn input(v: Host) -> Value {
    hostvalue::value(&v)
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/relax-vm")
}

fn manifest() -> serde_json::Value {
    let path = dir().join("manifest.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn load(name: &str) -> LoadedTree {
    let path = dir().join(name);
    // SAFETY: the fixtures are libraries TVM built for these tests.
    unsafe { load_library(&path, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A `.npy` file of the fixture as a tensor.
fn npy(file: &str) -> Tensor {
    npyfile::tensor(&dir().join(file))
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A manifest value tree as a host value.
fn value(tree: &serde_json::Value) -> Host {
    let file = |k: &str| tree[k].as_str().unwrap();
    if let Some(items) = tree["tuple"].as_array() {
        Host::Tuple(items.iter().map(value).collect())
    } else if tree.get("tensor").is_some() {
        Host::Tensor(npy(file("tensor")))
    } else if tree.get("shape").is_some() {
        Host::Shape(ints(&npy(file("shape"))))
    } else if tree.get("int").is_some() {
        Host::Int(ints(&npy(file("int")))[0])
    } else if tree.get("float").is_some() {
        Host::Float(f64::from_le_bytes(npy(file("float")).data[..8].try_into().unwrap()))
    } else if tree.get("null").is_some() {
        Host::Null
    } else if let Some(s) = tree["str"].as_str() {
        Host::Str(s.to_owned())
    } else {
        panic!("unknown value {tree}")
    }
}

/// Every case of `model` with its function, arguments, and TVM's result or error.
fn cases(model: &str) -> Vec<serde_json::Value> {
    manifest()["models"][model]["cases"].as_array().unwrap().clone()
}

#[test]
fn results_equal_tvms_with_their_structure() {
    let mut ran = 0;
    for model in ["relax_vm_closure", "relax_vm_args", "relax_vm_llm", "relax_vm_misc"] {
        let tree = load(&format!("{model}.so"));
        let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
        for case in cases(model) {
            let Some(expected) = case.get("outputs") else { continue };
            let f = case["function"].as_str().unwrap();
            let args: Vec<Host> = case["inputs"].as_array().unwrap().iter().map(value).collect();
            let got = vm.call_host(f, &args).unwrap_or_else(|e| panic!("{model}.{f}: {e}"));
            assert_eq!(got, value(expected), "{model}.{f}: result differs from TVM's");
            ran += 1;
        }
    }
    // closure, 2 shape_arg, prim_args, str_arg, tuples, one_tuple, view, dataflow, shape_of,
    // fine, reset_item (TVM's tuple_reset_item leaves None in the returned tuple), debug
    assert_eq!(ran, 13);
}

#[test]
fn bad_arguments_fail_with_tvms_messages() {
    let mut checked = 0;
    for (model, case) in
        ["relax_vm_args", "relax_vm_misc"].iter().flat_map(|m| cases(m).into_iter().map(move |c| (m, c)))
    {
        let tree = load(&format!("{model}.so"));
        let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
        let Some(error) = case.get("error") else { continue };
        let f = case["function"].as_str().unwrap();
        let args: Vec<Host> = case["inputs"].as_array().unwrap().iter().map(value).collect();
        let err = vm.call_host(f, &args).expect_err(f);
        let VmError::Check { kind, message } = err.root() else { panic!("{f}: {err}") };
        assert_eq!(*kind, error["kind"].as_str().unwrap(), "{f}: {err}");
        assert_eq!(message, error["message"].as_str().unwrap(), "{f}");
        checked += 1;
    }
    // five of relax_vm_args; an invoke_debug_func of a debug function mblob does not have
    assert_eq!(checked, 7);
}

/// A module whose `cache` calls an LLM builtin (`vm.builtin.kv_state_clear`): the VM is made,
/// `fine` runs, and `cache` fails when it calls the builtin, naming it: without the `llm`
/// feature the builtin is refused (and why); with it, it refuses its argument, which is not a
/// KV cache.
#[test]
fn an_llm_builtin_is_refused_only_when_called() {
    let tree = load("relax_vm_llm.so");
    let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
    let x = npy("relax_vm_llm.fine.0.in0.npy");
    let out = vm.call_tensors("fine", std::slice::from_ref(&x)).unwrap();
    assert_eq!(out[0], npy("relax_vm_llm.fine.0.out.npy"));
    let err = vm.call_tensors("cache", &[x]).unwrap_err();
    match err.root() {
        #[cfg(not(feature = "llm"))]
        VmError::UnknownBuiltin { name, reason } => {
            assert_eq!(name, "vm.builtin.kv_state_clear");
            assert!(reason.contains("LLM"), "{reason}");
        }
        #[cfg(feature = "llm")]
        VmError::Type { callee, index: 0, expected, .. } => {
            assert_eq!(callee, "vm.builtin.kv_state_clear");
            assert!(expected.contains("PagedAttentionKVCache"), "{expected}");
        }
        e => panic!("{e}"),
    }
    assert!(err.to_string().contains("in `cache`"), "{err}");
}

/// `Model` on the same modules: the parameter kinds come from the function's checks, values
/// other than tensors are set, the structured result equals TVM's, and the flat outputs are
/// its leaves in order; a library with one function runs it without selecting it.
#[test]
fn model_takes_and_gives_values() {
    let tree = load("relax_vm_args.so");
    let mut m = Model::new(&tree, Device::cpu(0)).unwrap();
    m.select_function("prim_args").unwrap();
    assert_eq!(
        m.params().iter().map(|p| p.kind).collect::<Vec<_>>(),
        [
            ParamKind::Tensor,
            ParamKind::Prim(Some(DataType::I64)),
            ParamKind::Prim(Some(DataType { code: 2, bits: 64, lanes: 1 }))
        ]
    );
    m.select_function("tuples").unwrap();
    assert_eq!(m.params().iter().map(|p| p.kind).collect::<Vec<_>>(), [ParamKind::Tuple(2)]);
    m.select_function("shape_arg").unwrap();
    assert_eq!(m.params().iter().map(|p| p.kind).collect::<Vec<_>>(), [ParamKind::Tensor, ParamKind::Shape]);
    m.select_function("str_arg").unwrap();
    assert_eq!(m.params().iter().map(|p| p.kind).collect::<Vec<_>>(), [ParamKind::Tensor, ParamKind::Any]);

    let case = cases("relax_vm_args").into_iter().find(|c| c["function"] == "tuples").unwrap();
    m.select_function("tuples").unwrap();
    m.set_input(Some("t"), input(value(&case["inputs"][0]))).unwrap();
    m.run().unwrap();
    assert_eq!(m.result().unwrap().as_ref().map(host), Some(value(&case["outputs"])));
    let flat = m.outputs().unwrap();
    let expected = case["flat_outputs"].as_array().unwrap();
    assert_eq!(flat.len(), expected.len());
    for (o, e) in flat.iter().zip(expected) {
        match (host(o), value(e)) {
            (Host::Tensor(t), Host::Tensor(e)) => assert_eq!(t, e),
            (Host::Shape(s), Host::Shape(e)) => assert_eq!(s, e),
            (o, e) => panic!("{o:?} vs TVM's {e:?}"),
        }
    }

    // A library with several functions and a `main` runs `main`; one with a single function
    // (`forward`, TVM's CPU build of the OpenCL MLP) runs that one, giving TVM's output.
    let m = Model::new(&load("relax_vm_closure.so"), Device::cpu(0)).unwrap();
    assert_eq!(m.function(), Some("main"));
    let dev = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/device-run");
    // SAFETY: a library TVM built for the tests.
    let tree = unsafe {
        load_library(&dev.join("dev_relax_mlp_opencl.cpu.so"), &Registry::default(), &LoadOptions::default())
    }
    .unwrap();
    let mut m = Model::new(&tree, Device::cpu(0)).unwrap();
    assert_eq!(m.function(), Some("forward"));
    m.set_input(None, input(Host::Tensor(npy("../device-run/dev_relax_mlp_opencl.in.x.npy")))).unwrap();
    m.run().unwrap();
    let Value::Tensor(out) = &m.outputs().unwrap()[0] else { panic!("not a tensor") };
    let out = out.to_tensor().unwrap();
    let expected = npy("../device-run/dev_relax_mlp_opencl.out.0.npy");
    let (a, b) = (out.to_f32().unwrap(), expected.to_f32().unwrap());
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs())), "differs from TVM's");
}

/// Builtins no fixture model reaches, in a program made here, against TVM's own builtins
/// called the same way (make.py's `builtin_calls`): `check_string_info` and
/// `runtime.TVMTensorCreateView` (a view with an offset and another dtype, and one too big).
#[test]
fn check_string_info_and_create_view_as_tvm() {
    use mblob_runtime::exec::relax::{
        Arg, Constant, FuncInfo, FuncKind, Instruction, Reg, RelaxExecutable, RELAX_VM_EXECUTABLE,
    };
    let m = manifest();
    let b = &m["builtins"];
    let tree = load("relax_vm_llm.so");
    let func = |kind, name: &str, end, args| FuncInfo {
        kind,
        name: name.into(),
        start: 0,
        end,
        num_args: if kind == FuncKind::Packed { -2 } else { args },
        register_file_size: if kind == FuncKind::Packed { 0 } else { 2 },
        param_names: if kind == FuncKind::Packed { vec![] } else { vec!["x".into()] },
    };
    let vm_of = |builtin: &str, constants, args: Vec<Arg>| {
        let exec = RelaxExecutable::from_parts(
            RELAX_VM_EXECUTABLE,
            mblob_runtime::Layout::Ffi,
            vec![func(FuncKind::Vm, "main", 2, 1), func(FuncKind::Packed, builtin, 0, 0)],
            constants,
            vec![Instruction::Call { dst: Reg::Index(1), func: 1, args }, Instruction::Ret { result: Reg::Index(1) }],
        )
        .unwrap();
        VirtualMachine::with_executable(&tree, std::sync::Arc::new(exec), Device::cpu(0)).unwrap()
    };

    let vm = vm_of(
        "vm.builtin.check_string_info",
        vec![Constant::Str(b"ErrorContext(test)".to_vec())],
        vec![Arg::Reg(Reg::Index(0)), Arg::Const(0)],
    );
    assert_eq!(vm.functions()[0].kinds, [ParamKind::Str]);
    assert_eq!(vm.call_host("main", &[Host::Str("abc".into())]).unwrap(), Host::Null);
    let err = vm.call_host("main", &[Host::Int(1)]).unwrap_err();
    let e = &b["check_string_info_int"];
    assert!(
        matches!(err.root(), VmError::Check { kind, message }
        if *kind == e["kind"].as_str().unwrap() && message == e["message"].as_str().unwrap()),
        "{err}"
    );

    let ok = &b["view_ok"];
    let view = |shape: Vec<i64>, dtype, offset| {
        vm_of(
            "runtime.TVMTensorCreateView",
            vec![Constant::Shape(shape), Constant::DataType(dtype)],
            vec![Arg::Reg(Reg::Index(0)), Arg::Const(0), Arg::Const(1), Arg::Imm(offset)],
        )
    };
    let x = Host::Tensor(npy(ok["input"].as_str().unwrap()));
    let shape: Vec<i64> = ok["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
    let vm = view(shape, DataType::I32, ok["offset"].as_i64().unwrap());
    let got = vm.call_host("main", std::slice::from_ref(&x)).unwrap();
    assert_eq!(got, Host::Tensor(npy(ok["output"].as_str().unwrap())));
    let vm = view(vec![4, 4], DataType::F32, 16);
    let err = vm.call_host("main", &[x]).unwrap_err();
    let e = &b["view_too_big"];
    assert!(
        matches!(err.root(), VmError::Check { kind, message }
        if *kind == e["kind"].as_str().unwrap() && message == e["message"].as_str().unwrap()),
        "{err}"
    );
    // check_prim_value_info: numbers, short (inline) and long strings against dtypes.
    for case in b["check_prim_value_info"].as_array().unwrap() {
        let dtype = match case["dtype"].as_str().unwrap() {
            "int64" => DataType::I64,
            "bool" => DataType::FFI_BOOL,
            "float32" => DataType::F32,
            "float64" => DataType { code: 2, bits: 64, lanes: 1 },
            "handle" => DataType::HANDLE,
            "uint8" => DataType { code: 1, bits: 8, lanes: 1 },
            d => panic!("{d}"),
        };
        let v = &case["value"];
        let arg = match v {
            serde_json::Value::Bool(b) => Host::Int(i64::from(*b)),
            serde_json::Value::String(s) => Host::Str(s.clone()),
            n if n.is_i64() => Host::Int(n.as_i64().unwrap()),
            n => Host::Float(n.as_f64().unwrap()),
        };
        let vm = vm_of(
            "vm.builtin.check_prim_value_info",
            vec![Constant::DataType(dtype), Constant::Str(b"ErrorContext(test)".to_vec())],
            vec![Arg::Reg(Reg::Index(0)), Arg::Const(0), Arg::Const(1)],
        );
        let got = vm.call_host("main", std::slice::from_ref(&arg));
        match (&case["error"], got) {
            (serde_json::Value::Null, Ok(r)) => assert_eq!(r, Host::Null),
            (e, Err(err)) if !e.is_null() => assert!(
                matches!(err.root(), VmError::Check { kind, message }
                    if *kind == e["kind"].as_str().unwrap() && message == e["message"].as_str().unwrap()),
                "{case}: {err}"
            ),
            (e, got) => panic!("{case}: TVM {e}, mblob {got:?}"),
        }
    }
    // Closures made or called wrongly are typed errors, not panics.
    let vm = vm_of("vm.builtin.make_closure", vec![], vec![]);
    let err = vm.call_host("main", &[Host::Int(0)]).unwrap_err();
    assert!(matches!(err.root(), VmError::MissingArgument { index: 0, given: 0, .. }), "{err}");
    let vm = vm_of("vm.builtin.invoke_closure", vec![], vec![Arg::Reg(Reg::Vm), Arg::Reg(Reg::Index(0))]);
    let err = vm.call_host("main", &[Host::Int(0)]).unwrap_err();
    assert!(matches!(err.root(), VmError::Type { expected: "a function or closure", .. }), "{err}");
}
