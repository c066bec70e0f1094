//! What the options left open for a library without `_metadata`, settled once the model is
//! made (`nometa`): the prefill chunk of a cache sized from a memory budget, and the vocabulary
//! size.

use super::nometa::MAX_DEFAULT_CHUNK;
use super::{GenerateError, LanguageModel};

impl LanguageModel {
    /// What the options left open for a library without `_metadata`, once the model is made:
    /// the prefill chunk of a cache sized from a memory budget, and the vocabulary size (the
    /// length of the logits of a one-token prefill of token 0 in a cache of one page, which is
    /// then dropped).
    pub(super) fn settle_without_metadata(&mut self) -> Result<(), GenerateError> {
        if self.metadata.prefill_chunk_size <= 0 {
            self.metadata.prefill_chunk_size = self.max_total_seq_len().clamp(1, MAX_DEFAULT_CHUNK);
        }
        if self.vocab.is_none() {
            let _span = tracing::debug_span!("lm_probe_vocab").entered();
            let cache_size = self.options.max_total_seq_len.replace(self.options.page_size);
            let probe = self.new_cache().and_then(|cache| self.forward(&cache, "prefill", &[0]));
            self.options.max_total_seq_len = cache_size;
            self.vocab = Some(probe?.len() as i64);
        }
        Ok(())
    }
}
