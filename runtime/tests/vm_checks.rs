//! The VMs check every index, size and offset a program hands them (issue 33): TVM-built
//! executables (`tests/fixtures/relax-vm`, `relay-vm`, `user-0.27`), decoded, with one field
//! changed, are refused with a typed error instead of a panic or an out-of-range access, and
//! where TVM has a check its kind and message are given. TVM's messages are recorded by
//! `tests/fixtures/vm-checks/make.py` (TVM 0.27 and 0.19) from the same calls made in TVM.

use std::sync::Arc;

use mblob_runtime::exec::relax::{Arg, Instruction, Reg, RelaxExecutable, VirtualMachine, VmError};
use mblob_runtime::exec::Value;
use mblob_runtime::{Device, LoadedTree, NdArray};

#[path = "support/host.rs"]
mod hostvalue;
use hostvalue::{Host, HostCalls};

#[path = "support/vm_fixtures.rs"]
mod vm_fixtures;
use vm_fixtures::{fixtures, load, npy};

/// TVM's message as recorded (`kind`, last line), without the repeated kind and without the
/// `Check failed: cond (a vs. b) : ` / `Check failed: (cond) is false: ` prefix when the check
/// has a message of its own (mblob gives the check's own text, the whole line when it has none).
fn tvm(version: &str, case: &str) -> Option<(String, String)> {
    let path = fixtures().join(format!("vm-checks/tvm-{version}.json"));
    let all: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let e = all.get(case).unwrap_or_else(|| panic!("no case {case}"));
    if e.is_null() {
        return None;
    }
    let kind = e["kind"].as_str().unwrap().to_owned();
    let full = e["message"].as_str().unwrap();
    let m = full.strip_prefix(&format!("{kind}: ")).unwrap_or(full).trim();
    let own = [" is false: ", ") : "].iter().find_map(|sep| m.split_once(sep).map(|(_, rest)| rest.trim()));
    Some((kind, own.filter(|r| !r.is_empty()).unwrap_or(m).to_owned()))
}

fn check_of(e: &VmError) -> (String, String) {
    match e.root() {
        VmError::Check { kind, message } => ((*kind).to_owned(), message.trim().to_owned()),
        e => panic!("not one of TVM's checks: {e}"),
    }
}

fn relax_exec(tree: &LoadedTree) -> RelaxExecutable {
    tree.find::<RelaxExecutable>().expect("a relax executable").clone()
}

fn func_index(exec: &RelaxExecutable, name: &str) -> u32 {
    exec.functions.iter().position(|f| f.name == name).unwrap() as u32
}

/// The first call of `callee` inside VM function `function` whose arguments `pick` accepts.
fn call_at(exec: &RelaxExecutable, function: &str, callee: &str, pick: impl Fn(&[Arg]) -> bool) -> usize {
    let f = &exec.functions[func_index(exec, function) as usize];
    let c = func_index(exec, callee);
    (f.start as usize..f.end as usize)
        .find(|&pc| matches!(&exec.instructions[pc], Instruction::Call { func, args, .. } if *func == c && pick(args)))
        .unwrap_or_else(|| panic!("no call of {callee} in {function}"))
}

fn set_arg(exec: &mut RelaxExecutable, pc: usize, i: usize, arg: Arg) {
    let Instruction::Call { args, .. } = &mut exec.instructions[pc] else { unreachable!() };
    args[i] = arg;
}

/// Each way a decoded Relax executable can index past what it has is refused when the VM is
/// made (before, the VM indexed its register file, constants or function table with it: a panic).
#[test]
fn relax_indices_out_of_range_are_refused_when_the_vm_is_made() {
    let tree = load("user-0.27/user_flow.so");
    let good = relax_exec(&tree);
    VirtualMachine::with_executable(&tree, Arc::new(good.clone()), Device::cpu(0)).unwrap();
    let branch = good.functions[func_index(&good, "branch") as usize].clone();
    let (start, end) = (branch.start as usize, branch.end as usize);
    let first_call = (start..end).find(|&pc| matches!(good.instructions[pc], Instruction::Call { .. })).unwrap();
    let if_at = (start..end).find(|&pc| matches!(good.instructions[pc], Instruction::If { .. })).expect("an If");
    let with_const = (0..good.instructions.len())
        .find(|&pc| matches!(&good.instructions[pc], Instruction::Call { args, .. } if args.iter().any(|a| matches!(a, Arg::Const(_)))))
        .unwrap();
    let file = branch.register_file_size as u32;
    let n_funcs = good.functions.len() as u32;
    let n_consts = good.constants.len() as u32;
    type Mutation = Box<dyn Fn(&mut RelaxExecutable)>;
    let bi = func_index(&good, "branch") as usize;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "a destination register past the file",
            Box::new(move |e| {
                let Instruction::Call { dst, .. } = &mut e.instructions[first_call] else { unreachable!() };
                *dst = Reg::Index(file + 3);
            }),
        ),
        (
            "an argument register past the file",
            Box::new(move |e| {
                let Instruction::Call { args, .. } = &mut e.instructions[first_call] else { unreachable!() };
                args.push(Arg::Reg(Reg::Index(u32::MAX >> 1)));
            }),
        ),
        (
            "a constant index past the pool",
            Box::new(move |e| {
                let Instruction::Call { args, .. } = &mut e.instructions[with_const] else { unreachable!() };
                let a = args.iter_mut().find(|a| matches!(a, Arg::Const(_))).unwrap();
                *a = Arg::Const(n_consts + 1);
            }),
        ),
        (
            "a called function past the table",
            Box::new(move |e| {
                let Instruction::Call { func, .. } = &mut e.instructions[first_call] else { unreachable!() };
                *func = n_funcs;
            }),
        ),
        (
            "a function argument past the table",
            Box::new(move |e| {
                let Instruction::Call { args, .. } = &mut e.instructions[first_call] else { unreachable!() };
                args.push(Arg::Func(n_funcs + 7));
            }),
        ),
        (
            "an If jumping out of the function",
            Box::new(move |e| {
                let Instruction::If { false_offset, .. } = &mut e.instructions[if_at] else { unreachable!() };
                *false_offset = 1 << 40;
            }),
        ),
        (
            "an If whose false offset is 1 (TVM: instr.false_offset > 1)",
            Box::new(move |e| {
                let Instruction::If { false_offset, .. } = &mut e.instructions[if_at] else { unreachable!() };
                *false_offset = 1;
            }),
        ),
        ("a Goto to itself", Box::new(move |e| e.instructions[first_call] = Instruction::Goto { offset: 0 })),
        (
            "a Ret of a register past the file",
            Box::new(move |e| e.instructions[first_call] = Instruction::Ret { result: Reg::Index(file) }),
        ),
        ("a register file of 2^40 registers", Box::new(move |e| e.functions[bi].register_file_size = 1 << 40)),
        (
            // Found by the fuzz target `vm_decoded`: the bound on the file overflowed.
            "2^63-1 arguments and registers",
            Box::new(move |e| {
                e.functions[bi].num_args = i64::MAX;
                e.functions[bi].register_file_size = i64::MAX;
            }),
        ),
        ("a function range past the code", Box::new(move |e| e.functions[bi].end = 1 << 33)),
        ("a function range that is empty", Box::new(move |e| e.functions[bi].end = e.functions[bi].start)),
    ];
    for (what, mutate) in cases {
        let mut bad = good.clone();
        mutate(&mut bad);
        match VirtualMachine::with_executable(&tree, Arc::new(bad), Device::cpu(0)) {
            Err(VmError::Bytecode { function, detail, .. }) => assert_eq!(function, "branch", "{what}: {detail}"),
            Err(e) => panic!("{what}: another error: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}

/// Builtin arguments that TVM checks at run time give TVM's kind and message (recorded from
/// TVM 0.27 for the same calls).
#[test]
fn relax_builtin_checks_give_tvms_messages() {
    let tree = load("relax-vm/relax_vm_args.so");
    let vm = VirtualMachine::new(&tree, Device::cpu(0)).unwrap();
    let x = |dims: &[i64], dtype: mblob_runtime::format::stream::DataType| {
        let n: i64 = dims.iter().product::<i64>() * i64::from(dtype.bits / 8);
        Host::Array(NdArray::from_bytes(&vec![0; n as usize], dims, dtype, Device::cpu(0)).unwrap())
    };
    use mblob_runtime::format::stream::DataType as D;
    let shapes = |n: usize| Host::Tuple((1..=n as i64).map(|i| Host::Shape(vec![i])).collect());
    let ctx = || Host::Str("ctx".into());
    let cases: Vec<(&str, &str, Vec<Host>)> = vec![
        ("tuple_getitem", "vm.builtin.tuple_getitem", vec![shapes(2), Host::Int(5)]),
        ("tuple_getitem_negative", "vm.builtin.tuple_getitem", vec![shapes(1), Host::Int(-1)]),
        ("tuple_reset_item", "vm.builtin.tuple_reset_item", vec![shapes(1), Host::Int(3)]),
        ("reshape_larger", "vm.builtin.reshape", vec![x(&[2, 3], D::F32), Host::Shape(vec![4, 3])]),
        ("reshape_smaller", "vm.builtin.reshape", vec![x(&[2, 3], D::F32), Host::Shape(vec![5])]),
        ("tensor_to_shape_2d", "vm.builtin.tensor_to_shape", vec![x(&[2, 3], D::F32)]),
        ("tensor_to_shape_f32", "vm.builtin.tensor_to_shape", vec![x(&[2], D::F32)]),
        ("tensor_to_shape_i8", "vm.builtin.tensor_to_shape", vec![x(&[2], D { code: 0, bits: 8, lanes: 1 })]),
        (
            "match_shape_count",
            "vm.builtin.match_shape",
            vec![Host::Shape(vec![2, 3]), Host::Null, Host::Int(5), Host::Int(0), Host::Int(2), ctx()],
        ),
        (
            "match_shape_code",
            "vm.builtin.match_shape",
            vec![Host::Shape(vec![2]), Host::Null, Host::Int(1), Host::Int(9), Host::Int(2), ctx()],
        ),
        ("make_shape_code", "vm.builtin.make_shape", vec![Host::Null, Host::Int(1), Host::Int(7), Host::Int(2)]),
    ];
    for (case, builtin, args) in cases {
        let got = vm.call_host(builtin, &args);
        match (tvm("0.27", case), got) {
            (None, Ok(_)) => {}
            (None, Err(e)) => panic!("{case}: TVM accepts it, mblob: {e}"),
            (Some(want), Err(e)) => assert_eq!(check_of(&e), want, "{case}"),
            (Some(want), Ok(v)) => panic!("{case}: TVM refuses it ({want:?}), mblob gave {v:?}"),
        }
    }
}

/// `so` (below `tests/fixtures`) with argument `arg` of the call of `callee` at instruction
/// `pc` made the immediate `value`: the call's words (opcode, destination, function index,
/// argument count, arguments) are found in the file (once) and the one word rewritten.
fn mutant_so(so: &str, exec: &RelaxExecutable, pc: usize, arg: usize, value: i64) -> Vec<u8> {
    use mblob_runtime::payload::relax::executable::encode_arg;
    let Instruction::Call { dst, func, args } = &exec.instructions[pc] else { unreachable!() };
    // Opcode 1, the destination (a register word is its argument word of kind 0), the function.
    let head = [1, encode_arg(Arg::Reg(*dst)), i64::from(*func), args.len() as i64];
    let mut pattern: Vec<u8> = head.iter().flat_map(|w| w.to_le_bytes()).collect();
    pattern.extend(args.iter().flat_map(|a| encode_arg(*a).to_le_bytes()));
    let mut bytes = std::fs::read(fixtures().join(so)).unwrap();
    let at: Vec<usize> =
        bytes.windows(pattern.len()).enumerate().filter(|(_, w)| *w == pattern).map(|(i, _)| i).collect();
    assert_eq!(at.len(), 1, "{so}: the call's words occur {} times", at.len());
    let word = at[0] + 32 + 8 * arg;
    bytes[word..word + 8].copy_from_slice(&encode_arg(Arg::Imm(value)).to_le_bytes());
    bytes
}

/// A FNV-1a hash of `bytes`, which ties a recorded TVM result to the mutant it was made from.
fn fnv(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{h:016x}")
}

/// Arguments the program holds, changed in a TVM-built executable, reach the builtin's check
/// when the function runs: a tuple index, a `match_shape` count that overflows (before: an
/// arithmetic overflow when the VM was made), an `alloc_storage` device index. The same changes
/// written into the library file (`MBLOB_WRITE_MUTANTS=DIR` writes them, `make.py DIR` runs
/// them in TVM 0.27) give TVM's own error, recorded under `exec:NAME` with the file's hash.
#[test]
fn relax_program_arguments_reach_tvms_checks() {
    const SO: &str = "relax-vm/relax_vm_args.so";
    let tree = load(SO);
    let good = relax_exec(&tree);
    let tuple_pc = call_at(&good, "tuples", "vm.builtin.tuple_getitem", |a| a[1] == Arg::Imm(1));
    let match_pc = call_at(&good, "dataflow", "vm.builtin.match_shape", |_| true);
    let storage_pc = call_at(&good, "one_tuple", "vm.builtin.alloc_storage", |_| true);
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("vm-checks/tvm-0.27.json")).unwrap()).unwrap();
    let tuple_in = || {
        Value::Tuple(vec![
            npy("relax-vm/relax_vm_args.tuples.4.in0_0.npy"),
            Value::Tuple(vec![
                npy("relax-vm/relax_vm_args.tuples.4.in0_1_0.npy"),
                npy("relax-vm/relax_vm_args.tuples.4.in0_1_1.npy"),
            ]),
        ])
    };
    let flow_in = || npy("relax-vm/relax_vm_args.dataflow.7.in0.npy");
    let one_in = || npy("relax-vm/relax_vm_args.one_tuple.5.in0.npy");
    let cases: Vec<(&str, &str, usize, usize, i64, Value)> = vec![
        ("tuple_index_5", "tuples", tuple_pc, 1, 5, tuple_in()),
        ("match_shape_count_2e54", "dataflow", match_pc, 2, 1 << 54, flow_in()),
        ("alloc_storage_device_7", "one_tuple", storage_pc, 2, 7, one_in()),
        ("alloc_storage_device_minus_1", "one_tuple", storage_pc, 2, -1, one_in()),
        ("alloc_storage_device_minus_2", "one_tuple", storage_pc, 2, -2, one_in()),
    ];
    for (name, function, pc, arg, value, input) in cases {
        let mut exec = good.clone();
        set_arg(&mut exec, pc, arg, Arg::Imm(value));
        let vm = VirtualMachine::with_executable(&tree, Arc::new(exec), Device::cpu(0)).unwrap();
        let decoded = check_of(&vm.invoke(function, std::slice::from_ref(&input)).unwrap_err());
        let so = mutant_so(SO, &good, pc, arg, value);
        if let Some(dir) = std::env::var_os("MBLOB_WRITE_MUTANTS") {
            std::fs::write(std::path::Path::new(&dir).join(format!("{name}.{function}.so")), &so).unwrap();
            continue;
        }
        // The same change in the file, read by mblob's reader, runs into the same check.
        let vm = VirtualMachine::new(&load_bytes(&so), Device::cpu(0)).unwrap();
        let read = check_of(&vm.invoke(function, std::slice::from_ref(&input)).unwrap_err());
        assert_eq!(decoded, read, "{name}");
        let key = format!("exec:{name}");
        assert_eq!(recorded[&key]["fnv"].as_str(), Some(fnv(&so).as_str()), "{name}: TVM ran another file");
        assert_eq!(read, tvm("0.27", &key).expect("TVM refuses it"), "{name}");
    }
}

fn load_bytes(so: &[u8]) -> LoadedTree {
    // SAFETY: a fixture TVM built, with one word of its bytecode changed (data the VM checks).
    unsafe {
        mblob_runtime::load_library_bytes(
            so,
            "mutant",
            &mblob_runtime::Registry::default(),
            &mblob_runtime::LoadOptions::default(),
        )
    }
    .unwrap()
}

/// `vm.builtin.ensure_zero_offset` of a tensor `alloc_tensor` placed at a byte offset gives
/// kernels a tensor at offset 0, as TVM's does (the offset moved into the pointer when it is a
/// multiple of 64, else a copy): `user_mlp` (TVM 0.27) with its first `alloc_tensor` at offset
/// 64 or 4 fails in the kernel (`byte_offset ... expected 0`, TVM's refusal), and with an
/// `ensure_zero_offset` of that tensor added after the allocation no longer does.
#[test]
fn ensure_zero_offset_gives_kernels_offset_zero() {
    use mblob_runtime::exec::relax::{FuncInfo, FuncKind};
    let tree = load("user-0.27/user_mlp.so");
    let good = relax_exec(&tree);
    let inputs: Vec<Value> = (0..6).map(|i| npy(&format!("user-0.27/user_mlp.forward.0.in{i}.npy"))).collect();
    let alloc = func_index(&good, "vm.builtin.alloc_tensor");
    let pc = (0..good.instructions.len())
        .find(|&pc| matches!(&good.instructions[pc], Instruction::Call { func, args, .. } if *func == alloc && args[1] == Arg::Imm(0)))
        .unwrap();
    let Instruction::Call { dst, .. } = good.instructions[pc].clone() else { unreachable!() };
    let run = |e: RelaxExecutable| {
        let vm = VirtualMachine::with_executable(&tree, Arc::new(e), Device::cpu(0)).unwrap();
        vm.invoke("forward", &inputs).map(|_| ()).map_err(|e| e.to_string())
    };
    for offset in [64, 4] {
        let mut at_offset = good.clone();
        set_arg(&mut at_offset, pc, 1, Arg::Imm(offset));
        let refused = run(at_offset.clone()).unwrap_err();
        assert!(refused.contains(".byte_offset on argument #") && refused.contains("expected 0"), "{refused}");
        // The same with `dst = ensure_zero_offset(dst)` right after the allocation: a new entry
        // of the function table, one instruction more (later instructions move by one).
        let mut fixed = at_offset;
        let zero = fixed.functions.len() as u32;
        fixed.functions.push(FuncInfo {
            kind: FuncKind::Packed,
            name: "vm.builtin.ensure_zero_offset".into(),
            start: -1,
            end: -1,
            num_args: -2,
            register_file_size: -1,
            param_names: Vec::new(),
        });
        fixed.instructions.insert(pc + 1, Instruction::Call { dst, func: zero, args: vec![Arg::Reg(dst)] });
        for f in fixed.functions.iter_mut().filter(|f| f.kind == FuncKind::Vm) {
            if f.start > pc as i64 {
                f.start += 1;
            }
            if f.end > pc as i64 {
                f.end += 1;
            }
        }
        let got = run(fixed);
        assert!(got.as_ref().is_ok() || !got.as_ref().unwrap_err().contains("byte_offset"), "offset {offset}: {got:?}");
    }
}

#[cfg(feature = "relay-vm")]
mod relay {
    use super::*;
    use mblob_runtime::exec::relay_vm::{RelayVm, RelayVmError};
    use mblob_runtime::payload::relay_vm::{Instruction as I, RelayVmExecutable};

    fn exec(tree: &LoadedTree) -> RelayVmExecutable {
        tree.find::<RelayVmExecutable>().expect("a relay executable").clone()
    }

    fn vm(tree: &LoadedTree, exec: RelayVmExecutable) -> Result<RelayVm, RelayVmError> {
        RelayVm::with_executable(tree, Arc::new(exec), Device::cpu(0), &[])
    }

    fn check_of(e: &RelayVmError) -> (String, String) {
        match e.root() {
            RelayVmError::Check { kind, message } => ((*kind).to_owned(), message.clone()),
            e => panic!("not one of TVM's checks: {e}"),
        }
    }

    fn find(e: &RelayVmExecutable, pick: impl Fn(&I) -> bool) -> usize {
        e.functions[0].instructions.iter().position(pick).expect("the instruction")
    }

    /// Each way a decoded Relay VM executable can index past what it has is refused when the
    /// VM is made (before: a panic when the instruction ran).
    #[test]
    fn relay_indices_out_of_range_are_refused_when_the_vm_is_made() {
        let tree = load("relay-vm/mlp.so");
        let good = exec(&tree);
        vm(&tree, good.clone()).unwrap();
        let file = good.functions[0].register_file_size;
        let consts = good.constants.len() as u32;
        let prims = good.primitives.len() as u32;
        let load = find(&good, |i| matches!(i, I::LoadConst { .. }));
        let packed = find(&good, |i| matches!(i, I::InvokePacked { .. }));
        let ret = find(&good, |i| matches!(i, I::Ret { .. }));
        type Mutation = Box<dyn Fn(&mut RelayVmExecutable)>;
        let code = |e: &mut RelayVmExecutable, pc: usize, ins: I| e.functions[0].instructions[pc] = ins;
        let cases: Vec<(&str, Mutation)> = vec![
            ("a Ret of a register past the file", Box::new(move |e| code(e, ret, I::Ret { result: file }))),
            (
                "a Move into a register past the file",
                Box::new(move |e| code(e, ret, I::Move { from: 0, dst: file + 9 })),
            ),
            (
                "a LoadConst past the pool",
                Box::new(move |e| {
                    let I::LoadConst { const_index, .. } = &mut e.functions[0].instructions[load] else {
                        unreachable!()
                    };
                    *const_index = consts;
                }),
            ),
            (
                "an InvokePacked past the primitives",
                Box::new(move |e| {
                    let I::InvokePacked { packed_index, .. } = &mut e.functions[0].instructions[packed] else {
                        unreachable!()
                    };
                    *packed_index = prims + 2;
                }),
            ),
            (
                "an InvokePacked with more outputs than arguments",
                Box::new(move |e| {
                    let I::InvokePacked { output_size, .. } = &mut e.functions[0].instructions[packed] else {
                        unreachable!()
                    };
                    *output_size = 99;
                }),
            ),
            (
                "an Invoke past the functions",
                Box::new(move |e| code(e, ret, I::Invoke { func: 5, args: vec![], dst: 1 })),
            ),
            (
                "an AllocClosure past the functions",
                Box::new(move |e| code(e, ret, I::AllocClosure { func: 9, free_vars: vec![], dst: 1 })),
            ),
            ("a Goto out of the function", Box::new(move |e| code(e, ret, I::Goto { offset: 1 << 40 }))),
            ("a Goto to itself", Box::new(move |e| code(e, ret, I::Goto { offset: 0 }))),
            ("a register file past the maximum", Box::new(move |e| e.functions[0].register_file_size = u32::MAX)),
            ("a function with no code", Box::new(move |e| e.functions[0].instructions.clear())),
        ];
        for (what, mutate) in cases {
            let mut bad = good.clone();
            mutate(&mut bad);
            match vm(&tree, bad) {
                Err(RelayVmError::Bytecode { function, detail, .. }) => {
                    assert_eq!(function, "main", "{what}: {detail}")
                }
                Err(e) => panic!("{what}: another error: {e}"),
                Ok(_) => panic!("{what}: accepted"),
            }
        }
    }

    /// What a Relay program computes at run time and hands the VM as an offset, a size, a field
    /// index or a shape is checked as TVM 0.19 checks it, with its message.
    #[test]
    fn relay_run_time_values_get_tvms_checks() {
        let tree = load("relay-vm/mlp.so");
        let good = exec(&tree);
        let x = npy("relay-vm/mlp.0.in.0.npy");
        let run = |e: RelayVmExecutable, x: &Value| vm(&tree, e)?.invoke("main", std::slice::from_ref(x));
        run(good.clone(), &x).unwrap();

        // The offset of the first tensor (a constant scalar loaded into a register) made 2^40:
        // TVM's `StorageObj::AllocNDArray` check (before: a device bounds error of mblob's).
        let mut bad = good.clone();
        let alloc = find(&bad, |i| matches!(i, I::AllocTensor { .. }));
        let I::AllocTensor { offset, .. } = bad.functions[0].instructions[alloc].clone() else { unreachable!() };
        let at = find(&bad, |i| matches!(i, I::LoadConst { dst, .. } if *dst == offset));
        bad.functions[0].instructions[at] = I::LoadConsti { value: 1 << 40, dst: offset };
        let (kind, message) = check_of(&run(bad, &x).unwrap_err());
        assert_eq!(kind, "InternalError");
        assert!(
            message.starts_with(
                "storage allocation failure, attempted to allocate 128 at offset 1099511627776 in region that is "
            ),
            "{message}"
        );

        // An alignment that is not a power of two: TVM's allocator (`posix_memalign`) fails.
        let mut bad = good.clone();
        let storage = find(&bad, |i| matches!(i, I::AllocStorage { .. }));
        let I::AllocStorage { alignment, .. } = &mut bad.functions[0].instructions[storage] else { unreachable!() };
        *alignment = 48;
        let (_, message) = check_of(&run(bad, &x).unwrap_err());
        assert!(message.starts_with("std::bad_alloc"), "{message}");

        // A field past the ADT's: TVM's `Index 7 out of bounds 3` (ADT `operator[]`'s ICHECK).
        let tree = load("relay-vm/tuple_out.so");
        let good = exec(&tree);
        let (x, y) = (npy("relay-vm/tuple_out.0.in.0.npy"), npy("relay-vm/tuple_out.0.in.1.npy"));
        let ret = find(&good, |i| matches!(i, I::Ret { .. }));
        let I::Ret { result } = good.functions[0].instructions[ret] else { unreachable!() };
        let mut bad = good.clone();
        bad.functions[0].instructions.insert(ret, I::GetField { object: result, field_index: 7, dst: result });
        let e = vm(&tree, bad).unwrap().invoke("main", &[x, y]).unwrap_err();
        assert_eq!(check_of(&e), ("InternalError".to_owned(), "Index 7 out of bounds 3".to_owned()));
    }

    /// `ReshapeTensor` to a shape larger than the tensor gives TVM 0.19's `CreateView` message;
    /// one smaller than it is a view, as in TVM (before: refused unless the sizes were equal).
    #[test]
    fn relay_reshape_is_checked_as_tvms_create_view() {
        let tree = load("relay-vm/dyn_reshape.so");
        let good = exec(&tree);
        let x = npy("relay-vm/dyn_reshape.0.in.0.npy");
        let reshape = find(&good, |i| matches!(i, I::ReshapeTensor { .. }));
        let I::ReshapeTensor { tensor, dst, .. } = good.functions[0].instructions[reshape].clone() else {
            unreachable!()
        };
        for (case, dim) in [("reshape_larger", 100), ("reshape_smaller", 5)] {
            // The new shape is a one-element int64 tensor `[dim]`, loaded into a free register
            // just before the reshape (the shape function's result is left unused).
            let mut bad = good.clone();
            let spare = bad.functions[0].register_file_size;
            bad.functions[0].register_file_size += 1;
            let code = &mut bad.functions[0].instructions;
            code[reshape] = I::ReshapeTensor { tensor, newshape: spare, dst };
            code.insert(reshape, I::LoadConsti { value: dim, dst: spare });
            let got = vm(&tree, bad).unwrap().invoke("main", std::slice::from_ref(&x));
            match tvm("0.19", case) {
                Some(want) => assert_eq!(check_of(&got.unwrap_err()), want, "{case}"),
                // TVM makes the view; what the program does with it after is not TVM's result.
                None => assert!(!matches!(got, Err(RelayVmError::Check { .. })), "{case}: {got:?}"),
            }
        }
        // The tensor itself (float32) as the new shape: TVM's `dtype.code == 0u` check.
        let mut bad = good.clone();
        bad.functions[0].instructions[reshape] = I::ReshapeTensor { tensor, newshape: tensor, dst };
        let e = vm(&tree, bad).unwrap().invoke("main", std::slice::from_ref(&x)).unwrap_err();
        let (kind, message) = check_of(&e);
        assert_eq!(kind, "InternalError");
        assert!(message.starts_with("Check failed: dl_tensor->dtype.code == 0u ("), "{message}");
    }
}
