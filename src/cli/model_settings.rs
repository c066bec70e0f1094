//! `mblob generate`'s options for what MLC-LLM's `_metadata` gives (for a library without it,
//! such as one built with `tvm.relax.frontend.nn` and `nn.llm` directly), and its further turns
//! (`--then-prompt-ids`: the same sequences continued, through `extend`/`batch_extend` when the
//! library has them).

use mblob_runtime::exec::llm::generate::{GenerateError, Generation, LanguageModel, ModelSettings, Sampling};

/// What `_metadata` would give; each is refused when it contradicts the library's `_metadata`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelSettingsArgs {
    /// The context window, for a library without `_metadata` (needed there unless
    /// --max-total-seq-len or --kv-cache-bytes sizes the cache); -1 for none (a sliding-window
    /// model, which then needs --max-total-seq-len or --kv-cache-bytes).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub context_window: Option<i64>,
    /// The most sequences of one batch (default for a library without `_metadata`: 1); at most
    /// the `_metadata`'s.
    #[arg(long, value_name = "N")]
    pub max_batch_size: Option<i64>,
    /// The sliding window of each sequence, for a library without `_metadata` (default: none).
    #[arg(long, value_name = "N")]
    pub sliding_window: Option<i64>,
    /// The attention sinks kept in front of the sliding window (default 0).
    #[arg(long, value_name = "N")]
    pub attention_sinks: Option<i64>,
    /// The vocabulary size, for a library without `_metadata` (default: the length of the
    /// logits of a one-token probe).
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<i64>,
    /// A further turn: after the generation, the same sequence continues with its last new
    /// token and these ids (through `extend` when the library has it, as MLC-LLM's engine
    /// continues a sequence it prefilled before), then --max-new-tokens more. Repeatable: with
    /// one prompt each is the next turn; with K prompts (a batch) each K of them in order are
    /// the next turn of the K sequences (through `batch_extend`).
    #[arg(long, value_name = "ID,ID,...", value_parser = prompt_ids)]
    pub then_prompt_ids: Vec<Vec<i32>>,
}

impl ModelSettingsArgs {
    /// The runtime's settings.
    pub fn settings(&self) -> ModelSettings {
        ModelSettings {
            context_window_size: self.context_window,
            max_batch_size: self.max_batch_size,
            sliding_window_size: self.sliding_window,
            attention_sink_size: self.attention_sinks,
            vocab_size: self.vocab_size,
        }
    }

    /// Refuses further turns that do not split into one prompt per sequence of `prompts`.
    pub fn check_turns(&self, prompts: usize) -> Result<(), String> {
        if prompts > 0 && self.then_prompt_ids.len() % prompts != 0 {
            return Err(format!(
                "{} --then-prompt-ids for {prompts} sequences: give one per sequence for each further turn",
                self.then_prompt_ids.len()
            ));
        }
        Ok(())
    }

    /// The generation of `prompts` and its further turns: one [`Generation`] per sequence and
    /// turn, turn by turn (the sequences of a turn in order).
    pub fn run_turns(
        &self,
        lm: &mut LanguageModel,
        prompts: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Generation>, GenerateError> {
        let mut out = if prompts.len() == 1 {
            vec![lm.generate_sampled(&prompts[0], max_new_tokens, sampling, |_| {})?]
        } else {
            lm.generate_batch(prompts, max_new_tokens, sampling)?
        };
        for turn in self.then_prompt_ids.chunks(prompts.len().max(1)) {
            if prompts.len() == 1 {
                out.push(lm.continue_sampled(&turn[0], max_new_tokens, sampling, |_| {})?);
            } else {
                out.extend(lm.continue_batch(turn, max_new_tokens, sampling)?);
            }
        }
        Ok(out)
    }
}

/// One prompt: token ids separated by commas.
pub(super) fn prompt_ids(s: &str) -> std::result::Result<Vec<i32>, String> {
    s.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| t.trim().parse::<i32>().map_err(|e| format!("token id {t:?}: {e}")))
        .collect()
}
