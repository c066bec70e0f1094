//! The logits a model function returns, and the token picked from them.

use super::GenerateError;
use crate::array::NdArray;
use crate::exec::llm::lm::sampler::Sampler;
use crate::exec::relax::vm::value::{tuple_item, Value, VmError};
use crate::exec::value::Value as ExecValue;
use crate::format::DataType;

/// The last row of a logits tensor (`[1, 1, vocab]`, or `[1, n, vocab]` from a prefill that
/// returns every position), as floats: only its `vocab * 4` bytes are read, from wherever the
/// tensor is.
pub(super) fn last_row(function: &'static str, logits: &NdArray) -> Result<Vec<f32>, GenerateError> {
    if logits.dtype() != DataType::F32 {
        return Err(GenerateError::Result {
            function,
            detail: format!("logits of dtype {:?}; mblob generates from float32 logits", logits.dtype()),
        });
    }
    let vocab = match logits.shape().last() {
        Some(&v) if v > 0 => v as usize,
        _ => return Err(GenerateError::Result { function, detail: format!("logits of shape {:?}", logits.shape()) }),
    };
    let at =
        vocab.checked_mul(4).and_then(|row| logits.nbytes().checked_sub(row)).ok_or_else(|| GenerateError::Result {
            function,
            detail: format!("logits of shape {:?} with {} bytes", logits.shape(), logits.nbytes()),
        })?;
    let mut row = vec![0u8; vocab * 4];
    logits.storage().read(at, &mut row).map_err(VmError::from)?;
    Ok(row.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// The logits a model function returned: the tensor, or the first item of its tuple.
pub(super) fn logits_of(function: &'static str, result: Value) -> Result<NdArray, GenerateError> {
    match result {
        Value::Tuple(items) => match tuple_item(&items, 0) {
            Some(Value::Tensor(t)) => Ok(t),
            other => Err(GenerateError::Result {
                function,
                detail: format!(
                    "a tuple whose first item is {}, not the logits",
                    other.as_ref().map_or("missing", kind)
                ),
            }),
        },
        Value::Tensor(t) => Ok(t),
        v => Err(GenerateError::Result { function, detail: format!("{}, not the logits", kind(&v)) }),
    }
}

/// The next token from `logits`: the sampler's draw, or the argmax when greedy.
pub(super) fn pick(sampler: &mut Sampler, function: &'static str, logits: &[f32]) -> Result<i32, GenerateError> {
    match sampler.sample(logits)? {
        Some(token) => Ok(token),
        None => argmax(function, logits),
    }
}

/// The index of the largest logit (the first of equal ones, as numpy's `argmax`).
pub(super) fn argmax(function: &'static str, logits: &[f32]) -> Result<i32, GenerateError> {
    if logits.iter().any(|x| x.is_nan()) {
        return Err(GenerateError::Result { function, detail: "logits with NaN".into() });
    }
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    i32::try_from(best).map_err(|_| GenerateError::Result { function, detail: "a vocabulary past i32".into() })
}

/// A caller's value's kind, for errors.
pub(super) fn vm_kind(v: &ExecValue) -> &'static str {
    match v {
        ExecValue::Tensor(_) => "a tensor",
        ExecValue::Shape(_) => "a shape",
        ExecValue::Int(_) => "an integer",
        ExecValue::Float(_) => "a float",
        ExecValue::Str(_) => "a string",
        ExecValue::Bytes(_) => "bytes",
        ExecValue::Tuple(_) => "a tuple",
        ExecValue::Null => "None",
        ExecValue::Object(o) => o.type_key(),
    }
}

/// A VM value's kind, for errors (in the words of [`vm_kind`]).
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Tensor(_) => "a tensor",
        Value::Shape(_) => "a shape",
        Value::Int(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Str(_) => "a string",
        Value::Tuple(_) => "a tuple",
        Value::Null => "None",
        Value::Object(o) => o.type_key(),
        v => v.kind(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    #[test]
    fn argmax_takes_the_first_of_equal_largest() {
        assert_eq!(argmax("t", &[1.0, 3.0, 3.0, -1.0]).unwrap(), 1);
        assert!(argmax("t", &[1.0, f32::NAN]).is_err());
    }

    #[test]
    fn last_row_of_every_position_logits() {
        let t = NdArray::from_f32(&[0., 1., 2., 3., 4., 5.], &[1, 2, 3], Device::cpu(0)).unwrap();
        assert_eq!(last_row("t", &t).unwrap(), vec![3., 4., 5.]);
        // A view of fewer bytes than its storage: the row is the view's last.
        assert_eq!(last_row("t", &t.view(&[1, 1, 3], DataType::F32).unwrap()).unwrap(), vec![0., 1., 2.]);
    }
}
