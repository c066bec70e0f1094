//! The RNN state's builtins, by TVM's name: `rnn_state_create`, `rnn_state_get`,
//! `rnn_state_set`, `rnn_state_debug_get`, and the generic `kv_state_*` ones on an RNN state
//! (any other object goes on to the paged KV cache's builtin of the same name).

use super::{Accessor, RnnState, RnnStateError};
use crate::exec::llm::kv_cache;
use crate::exec::relax::vm::value::{Args, ObjectRef, Value, VmError};
use crate::exec::relax::vm::{BuiltinFn, VirtualMachine};

const CREATE: &str = "vm.builtin.rnn_state_create";

/// The RNN state builtins, looked up before the paged KV cache's.
pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    (CREATE, create),
    ("vm.builtin.rnn_state_get", |_, n, a, _| {
        let args = Args::new(n, a);
        state(n, a)?.get(args.int(1)?, args.int(2)?, args.tensor(3)?)?;
        Ok(Value::Null)
    }),
    ("vm.builtin.rnn_state_set", |_, n, a, _| {
        let args = Args::new(n, a);
        state(n, a)?.set(args.int(1)?, args.int(2)?, args.tensor(3)?)?;
        Ok(a[0].clone())
    }),
    ("vm.builtin.rnn_state_debug_get", |_, n, a, _| {
        let args = Args::new(n, a);
        state(n, a)?.debug_get(args.int(1)?, args.int(2)?, args.int(3)?).map(Value::Tensor)
    }),
    ("vm.builtin.kv_state_clear", |vm, n, a, d| match rnn(a) {
        Some(s) => {
            s.clear();
            Ok(Value::Null)
        }
        None => to_cache(vm, n, a, d),
    }),
    ("vm.builtin.kv_state_add_sequence", |vm, n, a, d| match rnn(a) {
        Some(s) => s.add_sequence(Args::new(n, a).int(1)?).map(|_| Value::Null),
        None => to_cache(vm, n, a, d),
    }),
    ("vm.builtin.kv_state_remove_sequence", |vm, n, a, d| match rnn(a) {
        Some(s) => s.remove_sequence(Args::new(n, a).int(1)?).map(|_| Value::Null),
        None => to_cache(vm, n, a, d),
    }),
    ("vm.builtin.kv_state_fork_sequence", |vm, n, a, d| match rnn(a) {
        // TVM's RNN state takes `fork_pos` and ignores it.
        Some(s) => {
            let args = Args::new(n, a);
            s.fork_sequence(args.int(1)?, args.int(2)?).map(|_| Value::Null)
        }
        None => to_cache(vm, n, a, d),
    }),
    ("vm.builtin.kv_state_popn", |vm, n, a, d| match rnn(a) {
        Some(s) => {
            let args = Args::new(n, a);
            s.popn(args.int(1)?, args.int(2)?).map(|_| Value::Null)
        }
        None => to_cache(vm, n, a, d),
    }),
    ("vm.builtin.kv_state_begin_forward", |vm, n, a, d| match rnn(a) {
        Some(s) => begin_forward(s, n, a),
        None => to_cache(vm, n, a, d),
    }),
    ("vm.builtin.kv_state_end_forward", |vm, n, a, d| match rnn(a) {
        Some(s) => s.end_forward().map(|_| Value::Null),
        None => to_cache(vm, n, a, d),
    }),
];

/// Argument 0 as an RNN state, if it is one.
fn rnn<'a>(args: &'a [&'a Value]) -> Option<&'a RnnState> {
    match args.first()? {
        Value::Object(o) => o.downcast_ref::<RnnState>(),
        _ => None,
    }
}

/// Argument 0: the state.
fn state<'a>(name: &'a str, args: &'a [&'a Value]) -> Result<&'a RnnState, VmError> {
    let a = Args::new(name, args);
    let v = a.get(0)?;
    rnn(args).ok_or_else(|| a.type_err(0, "a relax.vm.RNNState", v))
}

/// The paged KV cache's builtin of this name, for an argument 0 that is no RNN state.
fn to_cache(vm: &VirtualMachine, name: &str, args: &[&Value], depth: usize) -> Result<Value, VmError> {
    match kv_cache::TABLE.iter().find(|(n, _)| *n == name) {
        Some((_, f)) => f(vm, name, args, depth),
        None => Err(VmError::UnknownBuiltin { name: name.to_string(), reason: "no KV state builtin of that name" }),
    }
}

/// `kv_state_begin_forward(state, seq_ids, append_lengths[, token_tree_parent_ptr])`: a token
/// tree must be chains, as TVM's RNN state requires.
fn begin_forward(s: &RnnState, name: &str, args: &[&Value]) -> Result<Value, VmError> {
    if args.len() != 3 && args.len() != 4 {
        return Err(RnnStateError::unless(
            "args.size() == 3 || args.size() == 4",
            "KVState BeginForward only accepts 3 or 4 arguments",
        )
        .into());
    }
    let a = Args::new(name, args);
    let (seq_ids, lengths) = (a.extents(1)?, a.extents(2)?);
    if args.len() == 4 && !matches!(args[3], Value::Null) {
        let parents = a.extents(3)?;
        let mut at = 0usize;
        for &length in lengths {
            for i in 0..length.max(0) {
                let parent = parents.get(at).copied().ok_or_else(|| RnnStateError::Arg {
                    builtin: name.to_owned(),
                    index: 3,
                    detail: format!(
                        "{} parent pointers for {} appended tokens",
                        parents.len(),
                        lengths.iter().fold(0i64, |a, &l| a.saturating_add(l))
                    ),
                })?;
                if parent != i - 1 {
                    return Err(RnnStateError::compare(
                        "token_tree_parent_ptr[matched_pos] == i - 1",
                        parent,
                        i - 1,
                        "Unexpected token tree for RNN state. RNN state only supports chains as token trees.",
                    )
                    .into());
                }
                at += 1;
            }
        }
    }
    s.begin_forward(seq_ids, lengths)?;
    Ok(Value::Null)
}

fn arg(index: usize, detail: impl Into<String>) -> RnnStateError {
    RnnStateError::Arg { builtin: CREATE.to_owned(), index, detail: detail.into() }
}

/// The library's kernels of a tuple argument.
fn accessors(vm: &VirtualMachine, a: &Args<'_>, index: usize) -> Result<Vec<Accessor>, VmError> {
    a.tuple(index)?
        .iter()
        .map(|v| match v {
            Value::Func(f) => vm
                .kernel_of(*f)
                .map(|(name, f)| Accessor { name: name.to_owned(), f })
                .ok_or_else(|| arg(index, "a function that is not one of the library's kernels").into()),
            v => Err(arg(index, format!("expected functions of the library, got {}", v.kind())).into()),
        })
        .collect()
}

/// `rnn_state_create(num_layers, reserved_num_seqs, max_history, f_gets, f_sets,
/// init_layer_value)`, with TVM's checks in TVM's order.
fn create(vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let _span = tracing::debug_span!("rnn_state_create").entered();
    let a = Args::new(name, args);
    let (num_layers, reserved, max_history) = (a.int(0)?, a.int(1)?, a.int(2)?);
    let gets = accessors(vm, &a, 3)?;
    let sets = accessors(vm, &a, 4)?;
    let init = a
        .tuple(5)?
        .into_iter()
        .map(|v| match v {
            Value::Tensor(t) => Ok(t),
            v => Err(arg(5, format!("expected tensors (the initial values), got {}", v.kind()))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gt = |expr: &str, v: i64, text: &str| RnnStateError::compare(expr, v, 0, text);
    if num_layers <= 0 {
        return Err(gt("num_layers > 0", num_layers, "The number of layers should be greater than 0.").into());
    }
    if reserved <= 0 {
        return Err(gt(
            "reserved_num_seqs > 0",
            reserved,
            "The number of reserved sequences should be greater than 0.",
        )
        .into());
    }
    if max_history < 0 {
        return Err(gt(
            "max_history >= 0",
            max_history,
            "The maximum history length should be greater or equal than 0.",
        )
        .into());
    }
    if init.is_empty() {
        return Err(RnnStateError::compare(
            "init_layer_value.size() > 0",
            0,
            0,
            "The number of states per layer should be greater than 0.",
        )
        .into());
    }
    // The kernels index the storages with int32 slot ids.
    for (index, v, what) in [(1, reserved, "sequence slots"), (2, max_history, "history slots")] {
        if v > i64::from(i32::MAX) {
            return Err(arg(index, format!("{v} {what}: the state's kernels take int32 slot ids")).into());
        }
    }
    let device = init[0].device();
    if init.iter().any(|t| t.device() != device) {
        return Err(RnnStateError::unless(
            "state->device.device_type == device.device_type && state->device.device_id == device.device_id",
            "The device type of all states should be the same.",
        )
        .into());
    }
    for (what, n) in [("getters", gets.len()), ("setters", sets.len())] {
        if n != init.len() {
            let expr = if what == "getters" {
                "f_gets.size() == init_layer_value.size()"
            } else {
                "f_sets.size() == init_layer_value.size()"
            };
            return Err(RnnStateError::compare(
                expr,
                n,
                init.len(),
                format!(
                    "The number of state {what} should be the same as the number of states per layer, but got {n} and {} \
                     respectively.",
                    init.len()
                ),
            )
            .into());
        }
    }
    let state = RnnState::new(num_layers, reserved, max_history, gets, sets, init, vm.tree().clone())?;
    Ok(Value::Object(ObjectRef::new(state)))
}
