//! The state of the KV cache's sequences that MLC-LLM's engine keeps between prefill rounds:
//! which sequences were prefilled (its rule for `extend`, see `extend`), and what the next turn
//! of each needs.

use std::collections::BTreeSet;

use super::GenerateError;
use crate::exec::relax::vm::FunctionSignature;

/// The state of the sequences in the current KV cache that the next turn needs.
#[derive(Debug, Clone, Default)]
pub(super) struct Turns {
    /// Whether the library has `extend` and `batch_extend`.
    pub(super) has_extend: bool,
    pub(super) has_batch_extend: bool,
    /// The sequences prefilled since the cache was made (the engine's `prefilled_seq_ids_`).
    pub(super) prefilled: BTreeSet<i64>,
    /// Per sequence of the last generation (sequence `i` has id `i`): how many tokens the cache
    /// holds, and its last new token, which it does not hold yet.
    pub(super) seqs: Vec<(usize, Option<i32>)>,
}

impl Turns {
    /// The turns of a library with these functions.
    pub(super) fn new(functions: &[FunctionSignature]) -> Turns {
        let has = |name: &str| functions.iter().any(|f| f.name == name);
        Turns { has_extend: has("extend"), has_batch_extend: has("batch_extend"), ..Turns::default() }
    }

    /// A new KV cache with `n` empty sequences.
    pub(super) fn reset(&mut self, n: usize) {
        self.prefilled.clear();
        self.seqs = vec![(0, None); n];
    }

    /// Sequence `seq` took `fed` more tokens and picked `last` (the generation's last token).
    pub(super) fn record(&mut self, seq: usize, fed: usize, last: Option<i32>) {
        if let Some(s) = self.seqs.get_mut(seq) {
            s.0 += fed;
            s.1 = last.or(s.1);
        }
    }

    /// The function a prefill round of `seqs` runs (`batch`: through the batch functions), by
    /// the engine's rule, and the round's sequences marked as prefilled.
    pub(super) fn prefill_function(&mut self, seqs: &[i64], batch: bool) -> Result<&'static str, GenerateError> {
        if !self.has_extend {
            return Ok(if batch { "batch_prefill" } else { "prefill" });
        }
        let again = seqs.iter().any(|s| self.prefilled.contains(s));
        self.prefilled.extend(seqs);
        Ok(match (batch, again) {
            (false, false) => "prefill",
            (false, true) => "extend",
            (true, false) => "batch_prefill",
            (true, true) if self.has_batch_extend => "batch_extend",
            (true, true) => {
                return Err(GenerateError::MissingFunction {
                    name: "batch_extend",
                    why: "continues several sequences in one batch (the library has `extend`, so MLC-LLM's engine \
                          needs it too)",
                    available: "extend, but no batch_extend".into(),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(extend: bool, batch_extend: bool) -> Turns {
        Turns { has_extend: extend, has_batch_extend: batch_extend, ..Turns::default() }
    }

    #[test]
    fn extend_runs_for_a_sequence_prefilled_before_as_the_engine_runs_it() {
        let mut t = turns(true, true);
        t.reset(2);
        assert_eq!(t.prefill_function(&[0], false).unwrap(), "prefill");
        assert_eq!(t.prefill_function(&[0], false).unwrap(), "extend");
        // One sequence of the round prefilled before is enough.
        assert_eq!(t.prefill_function(&[1, 0], true).unwrap(), "batch_extend");
        t.reset(2);
        assert_eq!(t.prefill_function(&[0, 1], true).unwrap(), "batch_prefill");
        // Without `extend` every round prefills.
        let mut t = turns(false, true);
        assert_eq!(t.prefill_function(&[0], false).unwrap(), "prefill");
        assert_eq!(t.prefill_function(&[0], false).unwrap(), "prefill");
        let mut t = turns(true, false);
        t.prefill_function(&[0, 1], true).unwrap();
        assert!(t.prefill_function(&[0, 1], true).unwrap_err().to_string().contains("batch_extend"));
    }
}
