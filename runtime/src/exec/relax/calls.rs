//! Which packed functions a Relax executable calls that mblob cannot serve: what
//! `mblob inspect` flags before a run would fail on them.
//!
//! The VM resolves a packed function of the function table (TVM's `InitFuncPool`) as a VM
//! builtin, else a function of the loaded tree (the library's kernels), else one of mblob's
//! global functions ([`super::vm::is_served`] answers for the builtins and globals). A name
//! that none of these has is reported; TVM would look it up in its global registry, which
//! holds functions (the LLM groups such as `vm.builtin.rnn_state_*`, and without the `llm`
//! feature the paged KV cache's `vm.builtin.kv_state_*`, ...) mblob does not implement.

use crate::payload::relax::{FuncKind, RelaxExecutable};

/// The packed functions of `executable`'s function table that neither mblob's VM nor the
/// modules serve, in table order, each once. `modules_have` answers whether a function of that
/// name is found in the tree (the library's exported functions).
pub fn unsupported_calls(executable: &RelaxExecutable, modules_have: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in &executable.functions {
        if f.kind != FuncKind::Packed || out.contains(&f.name) {
            continue;
        }
        // A VM function of the same name is called as that function.
        let vm_function = executable.functions.iter().any(|g| g.kind != FuncKind::Packed && g.name == f.name);
        if !vm_function && !super::vm::is_served(&f.name) && !modules_have(&f.name) {
            out.push(f.name.clone());
        }
    }
    out
}

/// Of a library's undefined dynamic symbols (version suffixes such as `@GLIBC_2.27` allowed),
/// the TVM runtime functions (`TVM*`, `tvm_*`) that mblob's loader does not provide, sorted
/// and each once: it refuses to open a library that imports one.
pub fn unprovided_runtime_imports<'a>(undefined: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = undefined
        .into_iter()
        .map(|n| n.split('@').next().unwrap_or(n))
        .filter(|n| crate::ffi::shim::is_tvm_runtime(n) && !crate::ffi::shim::PROVIDED.contains(n))
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::relax::FuncInfo;

    fn func(kind: FuncKind, name: &str) -> FuncInfo {
        FuncInfo { kind, name: name.into(), start: 0, end: 0, num_args: -2, register_file_size: 0, param_names: vec![] }
    }

    #[test]
    fn builtins_globals_and_module_functions_are_served() {
        let main = FuncInfo { end: 1, num_args: 1, register_file_size: 1, ..func(FuncKind::Vm, "main") };
        let functions = vec![
            main,
            func(FuncKind::Packed, "vm.builtin.alloc_tensor"),
            func(FuncKind::Packed, "tvm.contrib.sort.argsort"),
            func(FuncKind::Packed, "matmul"),
            func(FuncKind::Packed, "vm.builtin.paged_attention_kv_cache_attention_with_fused_qkv"),
            func(FuncKind::Packed, "my.ext"),
            func(FuncKind::Packed, "my.ext"),
        ];
        let exe = RelaxExecutable::from_parts(
            crate::payload::relax::RELAX_VM_EXECUTABLE,
            crate::format::Layout::Ffi,
            functions,
            vec![],
            vec![crate::payload::relax::Instruction::Ret { result: crate::payload::relax::Reg::Index(0) }],
        )
        .unwrap();
        let got = unsupported_calls(&exe, &|n| n == "matmul");
        // TVM's sort operators are mblob's global functions with the `ops` feature only.
        let mut expected = vec!["vm.builtin.paged_attention_kv_cache_attention_with_fused_qkv", "my.ext"];
        if !cfg!(feature = "ops") {
            expected.insert(0, "tvm.contrib.sort.argsort");
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn runtime_imports_the_loader_lacks() {
        let got = unprovided_runtime_imports([
            "TVMArrayAlloc",
            "expf@GLIBC_2.27",
            "TVMBackendAllocWorkspace",
            "TVMArrayAlloc",
            "tvm_thing@V1",
        ]);
        assert_eq!(got, ["TVMArrayAlloc", "tvm_thing"]);
    }
}
