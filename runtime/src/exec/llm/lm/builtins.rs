//! The VM's side of the LM builtins: each `vm.builtin.*` name of [`super::BUILTINS`] as a
//! function on VM values (arguments converted, the result made a VM value), for the Relax VM's
//! dispatch and [`VirtualMachine::invoke`](crate::exec::relax::VirtualMachine::invoke).
//!
//! Conversions: tensors are the VM's tensors (no copy; in-place builtins write into them),
//! numbers accept integers where TVM takes a `double`, strings are UTF-8, `Array`s are tuples
//! (of strings, of tensors, of legacy caches), `bool` is an integer, and a legacy cache is an
//! [`ObjectRef`] to a [`LegacyKvObject`].

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::array::NdArray;

use super::legacy_kv::{self, AttentionKvCacheLegacy};
use super::{sampling, tensor_cache, LmError, TensorCacheError};
use crate::exec::relax::vm::value::{Args, ObjectRef, Value, VmError, VmObject};
use crate::exec::relax::vm::BuiltinFn;

/// TVM's type key of the legacy cache.
pub const LEGACY_KV_TYPE_KEY: &str = "relax.vm.AttentionKVCacheLegacy";

/// The legacy KV cache as a VM object (shared, changed under its lock).
#[derive(Debug)]
pub struct LegacyKvObject(Mutex<AttentionKvCacheLegacy>);

impl LegacyKvObject {
    /// The object holding `cache`.
    pub fn new(cache: AttentionKvCacheLegacy) -> LegacyKvObject {
        LegacyKvObject(Mutex::new(cache))
    }

    /// The cache, locked.
    pub fn lock(&self) -> MutexGuard<'_, AttentionKvCacheLegacy> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl VmObject for LegacyKvObject {
    fn type_key(&self) -> &'static str {
        LEGACY_KV_TYPE_KEY
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// TVM's type key of the module `vm.builtin.param_module_from_cache*` returns (tvm-ffi's
/// module object).
pub const PARAM_MODULE_TYPE_KEY: &str = "ffi.Module";

/// The module `vm.builtin.param_module_from_cache` and `..._by_name` return (TVM's
/// `ParamModuleNode`): the weights taken from the tensor cache when it was made, served by its
/// one function, `get_params`.
#[derive(Debug)]
pub struct ParamModule {
    params: Vec<NdArray>,
}

impl ParamModule {
    /// The module holding `params`.
    pub fn new(params: Vec<NdArray>) -> ParamModule {
        ParamModule { params }
    }

    /// What the module's function `get_params` returns: the weights, in order.
    pub fn get_params(&self) -> &[NdArray] {
        &self.params
    }
}

impl VmObject for ParamModule {
    fn type_key(&self) -> &'static str {
        PARAM_MODULE_TYPE_KEY
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn lm<T, E: Into<LmError>>(r: Result<T, E>) -> Result<T, VmError> {
    r.map_err(|e| VmError::from(e.into()))
}

fn legacy<'a>(name: &str, value: &'a Value, index: usize) -> Result<&'a LegacyKvObject, VmError> {
    let a = Args::new(name, &[]);
    match value {
        Value::Object(o) => o
            .downcast_ref::<LegacyKvObject>()
            .ok_or_else(|| a.type_err(index, "a relax.vm.AttentionKVCacheLegacy", value)),
        v => Err(a.type_err(index, "a relax.vm.AttentionKVCacheLegacy", v)),
    }
}

/// Argument 0, the legacy cache, and the call's result: the same object.
fn with_cache(
    name: &str,
    args: &[&Value],
    f: impl FnOnce(&mut AttentionKvCacheLegacy) -> Result<(), legacy_kv::LegacyKvError>,
) -> Result<Value, VmError> {
    let cache = legacy(name, Args::new(name, args).get(0)?, 0)?;
    lm(f(&mut cache.lock()))?;
    Ok(args[0].clone())
}

/// Parameter names: strings, else TVM's `Expect string as input` error.
fn strings<'a>(values: impl Iterator<Item = &'a Value>) -> Result<Vec<String>, VmError> {
    values
        .enumerate()
        .map(|(index, v)| match v {
            Value::Str(s) => Ok(String::from_utf8_lossy(s).into_owned()),
            v => Err(LmError::from(TensorCacheError::NotAString { index, type_key: v.kind().to_owned() }).into()),
        })
        .collect()
}

fn tensors(list: Vec<NdArray>) -> Value {
    Value::tuple(list.into_iter().map(Value::Tensor))
}

/// The LM builtins, by TVM's name.
pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.tensor_cache.load", |_, n, a, _| {
        let args = Args::new(n, a);
        let path = args.string(0)?;
        lm(tensor_cache::tensor_cache_load(Path::new(&path), args.int(1)? as i32, args.int(2)? as i32))?;
        Ok(Value::Null)
    }),
    ("vm.builtin.tensor_cache.get", |_, n, a, _| {
        Ok(tensor_cache::tensor_cache_get(&Args::new(n, a).string(0)?).map_or(Value::Null, Value::Tensor))
    }),
    ("vm.builtin.tensor_cache.update", |_, n, a, _| {
        let args = Args::new(n, a);
        if a.len() != 2 && a.len() != 3 {
            return Err(VmError::Check {
                kind: "InternalError",
                message: "Check failed: (args.size() == 2 || args.size() == 3) is false: ".into(),
            });
        }
        let override_ = if a.len() == 3 { Some(args.int(2)? != 0) } else { None };
        lm(tensor_cache::tensor_cache_update(&args.string(0)?, args.tensor(1)?.clone(), override_))?;
        Ok(Value::Null)
    }),
    ("vm.builtin.tensor_cache.remove", |_, n, a, _| {
        tensor_cache::tensor_cache_remove(&Args::new(n, a).string(0)?);
        Ok(Value::Null)
    }),
    ("vm.builtin.tensor_cache.clear", |_, _, _, _| {
        tensor_cache::tensor_cache_clear();
        Ok(Value::Null)
    }),
    ("vm.builtin.param_array_from_cache", |_, n, a, _| {
        let args = Args::new(n, a);
        Ok(tensors(lm(tensor_cache::param_array_from_cache(&args.string(0)?, args.int(1)?))?))
    }),
    ("vm.builtin.param_array_from_cache_by_name", |_, n, a, _| {
        let names = strings(Args::new(n, a).tuple(0)?.iter())?;
        Ok(tensors(lm(tensor_cache::param_array_from_cache_by_name(&names))?))
    }),
    ("vm.builtin.param_module_from_cache", |_, n, a, _| {
        let args = Args::new(n, a);
        let params = lm(tensor_cache::param_array_from_cache(&args.string(0)?, args.int(1)?))?;
        Ok(Value::Object(ObjectRef::new(ParamModule::new(params))))
    }),
    ("vm.builtin.param_module_from_cache_by_name", |_, n, a, _| {
        let names = strings(Args::new(n, a).tuple(0)?.iter())?;
        let params = lm(tensor_cache::param_array_from_cache_by_name(&names))?;
        Ok(Value::Object(ObjectRef::new(ParamModule::new(params))))
    }),
    ("vm.builtin.param_array_from_cache_by_name_unpacked", |_, _, a, _| {
        let names = strings(a.iter().copied())?;
        Ok(tensors(lm(tensor_cache::param_array_from_cache_by_name_unpacked(&names))?))
    }),
    ("vm.builtin.sample_top_p_from_logits", |_, n, a, _| {
        let args = Args::new(n, a);
        let token = sampling::sample_top_p_from_logits(args.tensor(0)?, args.float(1)?, args.float(2)?, args.float(3)?);
        Ok(Value::Int(i64::from(lm(token)?)))
    }),
    ("vm.builtin.sample_top_p_from_prob", |_, n, a, _| {
        let args = Args::new(n, a);
        Ok(Value::Int(lm(sampling::sample_top_p_from_prob(args.tensor(0)?, args.float(1)?, args.float(2)?))?))
    }),
    ("vm.builtin.multinomial_from_uniform", |_, n, a, _| {
        let args = Args::new(n, a);
        Ok(Value::Tensor(lm(sampling::multinomial_from_uniform(args.tensor(0)?, args.tensor(1)?))?))
    }),
    ("vm.builtin.apply_repetition_penalty", |_, n, a, _| {
        let args = Args::new(n, a);
        lm(sampling::apply_repetition_penalty(args.tensor(0)?, args.tensor(1)?, args.float(2)?))?;
        Ok(Value::Null)
    }),
    ("vm.builtin.apply_presence_and_frequency_penalty", |_, n, a, _| {
        let args = Args::new(n, a);
        lm(sampling::apply_presence_and_frequency_penalty(
            args.tensor(0)?,
            args.tensor(1)?,
            args.tensor(2)?,
            args.float(3)?,
            args.float(4)?,
        ))?;
        Ok(Value::Null)
    }),
    ("vm.builtin.apply_softmax_with_temperature", |_, n, a, _| {
        let args = Args::new(n, a);
        lm(sampling::apply_softmax_with_temperature(args.tensor(0)?, args.float(1)?))?;
        Ok(Value::Null)
    }),
    ("vm.builtin.attention_kv_cache_create", |_, n, a, _| {
        let args = Args::new(n, a);
        let cache = lm(legacy_kv::attention_kv_cache_create(args.tensor(0)?, args.extents(1)?, args.int(2)?))?;
        Ok(Value::Object(ObjectRef::new(LegacyKvObject::new(cache))))
    }),
    ("vm.builtin.attention_kv_cache_update", |_, n, a, _| {
        let value = Args::new(n, a).tensor(1)?;
        with_cache(n, a, |c| c.update(value))
    }),
    ("vm.builtin.attention_kv_cache_append", |_, n, a, _| {
        let value = Args::new(n, a).tensor(1)?;
        with_cache(n, a, |c| c.append(value))
    }),
    ("vm.builtin.attention_kv_cache_window_override", |_, n, a, _| {
        let args = Args::new(n, a);
        let (value, max) = (args.tensor(1)?, args.int(2)?);
        with_cache(n, a, |c| c.window_override(value, max, 0))
    }),
    ("vm.builtin.attention_kv_cache_window_override_with_sinks", |_, n, a, _| {
        let args = Args::new(n, a);
        let (value, max, sinks) = (args.tensor(1)?, args.int(2)?, args.int(3)?);
        with_cache(n, a, |c| c.window_override(value, max, sinks))
    }),
    ("vm.builtin.attention_kv_cache_view", |_, n, a, _| {
        if a.len() != 1 && a.len() != 2 {
            return Err(VmError::Check {
                kind: "ValueError",
                message: format!("`vm.builtin.attention_kv_cache_view` expects 1 or 2 arguments, but got {}.", a.len()),
            });
        }
        let cache = legacy(n, a[0], 0)?;
        let s = if a.len() == 2 { Some(Args::new(n, a).extents(1)?) } else { None };
        Ok(Value::Tensor(lm(legacy_kv::attention_kv_cache_view(&cache.lock(), s))?))
    }),
    // TVM pops and clears the caches one after the other (a failed pop leaves the caches
    // before it popped); each is locked in turn, so an array may name a cache twice.
    ("vm.builtin.attention_kv_cache_array_popn", |_, n, a, _| {
        let args = Args::new(n, a);
        let count = args.int(1)?;
        for (i, c) in args.tuple(0)?.iter().enumerate() {
            lm(legacy(n, c, i)?.lock().pop_n(count))?;
        }
        Ok(Value::Null)
    }),
    ("vm.builtin.attention_kv_cache_array_clear", |_, n, a, _| {
        for (i, c) in Args::new(n, a).tuple(0)?.iter().enumerate() {
            legacy(n, c, i)?.lock().clear();
        }
        Ok(Value::Null)
    }),
];
