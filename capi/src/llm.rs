//! Language models: an MLC-LLM library (`mlc_llm compile`) with its weights, generating
//! tokens from a prompt of token ids (`mblob_llm_*`), over
//! `mblob_runtime::exec::llm::generate::LanguageModel`.
//!
//! Without the crate feature `llm` (the LLM builtins of the Relax VM) the functions are there
//! but `mblob_llm_new` fails with `MBLOB_ERR_UNSUPPORTED`.

use std::ffi::c_char;

use crate::call::call;
use crate::handle::{check, publish, release, Kind};
use crate::library::mblob_library;
use crate::llm_options::mblob_llm_options;
use crate::status::{mblob_status, not_null, Failure};

/// How `mblob_llm_generate` picks each token: greedily at `temperature` 0; else TVM's
/// `sample_top_p_from_logits` with MLC-LLM's draws (softmax at `temperature`, from the most
/// likely tokens holding `top_p` of the probability, draws seeded by `seed`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct mblob_llm_sampling {
    /// The softmax temperature; 0 is greedy decoding. Negative or not finite: refused.
    pub temperature: f64,
    /// The probability mass of the most likely tokens drawn from, in (0, 1]; 1: all of them.
    pub top_p: f64,
    /// The seed of the draws.
    pub seed: u32,
}

/// A language model on a device (`mblob_llm_new`): the library's Relax VM, its weights and a
/// paged KV cache. Used by one call at a time (a call while another thread's uses it gets
/// `MBLOB_ERR_STATE`); freed with `mblob_llm_free`.
pub struct mblob_llm {
    #[cfg(feature = "llm")]
    lm: mblob_runtime::exec::llm::generate::LanguageModel,
    /// The vocabulary size, -1 when unknown.
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
    vocab: i64,
}

/// Makes a language model of the MLC-LLM library `lib` (its VM functions `embed`, `prefill`,
/// `decode`, `create_tir_paged_kv_cache` and `_metadata`) on the device
/// `(device_type, device_id)` (DLPack's codes: `kDLCPU` = 1, `kDLCUDA` = 2, `kDLOpenCL` = 4)
/// and writes its handle to `*out`. `weights_dir` is the directory of its tensor cache
/// (`tensor-cache.json` and the shards) for a library whose functions take the weights as a
/// parameter (`packed_params`), NULL for one with the weights bound into it; giving the wrong
/// one of the two is `MBLOB_ERR_INVALID_ARGUMENT`. The weights are read (and copied to the
/// device) here, once.
///
/// A library that is not an MLC-LLM model (a function missing, metadata that is not MLC's):
/// `MBLOB_ERR_NO_MODEL`; weights that cannot be read: `MBLOB_ERR_LOAD`. A library built
/// without the `llm` feature: `MBLOB_ERR_UNSUPPORTED`. A library without `_metadata` needs
/// the settings it would give: use `mblob_llm_new_with_options`.
///
/// # Safety
/// `lib` is NULL or a handle; `weights_dir` is NULL or a NUL-terminated string; `out` is NULL
/// or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn mblob_llm_new(
    lib: *const mblob_library,
    weights_dir: *const c_char,
    device_type: i32,
    device_id: i32,
    out: *mut *mut mblob_llm,
) -> mblob_status {
    // SAFETY: the caller's contract is this function's, with no options.
    unsafe { mblob_llm_new_with_options(lib, weights_dir, device_type, device_id, std::ptr::null(), out) }
}

/// `mblob_llm_new` with `options` (NULL: the defaults; see `mblob_llm_options`): the KV
/// cache's sizes, the settings `_metadata` gives for a library without it (one built with
/// TVM's `nn.llm` directly, whose weights are then the tensor cache's `param_0`, `param_1`,
/// ...), and on OpenCL the program cache.
///
/// A setting that a library without `_metadata` needs and `options` does not give (the
/// context window, or the cache's size for a sliding-window model), one that contradicts the
/// library's `_metadata`, a size out of range, or an `options->struct_size` this library does
/// not know: `MBLOB_ERR_INVALID_ARGUMENT`, naming the field. An OpenCL program cache that
/// cannot be read, written or loaded: `MBLOB_ERR_RUN`, naming the file. Otherwise as
/// `mblob_llm_new`.
///
/// # Safety
/// As `mblob_llm_new`; `options` is NULL or points to a readable `mblob_llm_options` of
/// `options->struct_size` bytes whose `opencl_program_cache` is NULL or a NUL-terminated
/// string.
#[no_mangle]
pub unsafe extern "C" fn mblob_llm_new_with_options(
    lib: *const mblob_library,
    weights_dir: *const c_char,
    device_type: i32,
    device_id: i32,
    options: *const mblob_llm_options,
    out: *mut *mut mblob_llm,
) -> mblob_status {
    call(|| {
        imp::available()?;
        // SAFETY: the API forbids freeing `lib` while a call on it is in progress, as
        // `checked` needs (a library is never changed).
        let lib = unsafe { crate::handle::checked(Kind::Library, lib, "lib", out) }?;
        let weights = if weights_dir.is_null() {
            None
        } else {
            // SAFETY: not NULL, and the caller passes a NUL-terminated string.
            Some(unsafe { crate::args::c_path(weights_dir, "weights_dir") }?)
        };
        // SAFETY: the caller passes NULL or a readable struct of its `struct_size` bytes.
        let options = unsafe { crate::llm_options::read(options) }?;
        let cache = if options.opencl_program_cache.is_null() {
            None
        } else {
            // SAFETY: not NULL, and the caller passes a NUL-terminated string.
            Some(unsafe { crate::args::c_path(options.opencl_program_cache, "options->opencl_program_cache") }?)
        };
        let handle = imp::new(lib, weights, device_type, device_id, &options, cache)?;
        publish(Kind::Llm, handle, out);
        Ok(())
    })
}

/// Writes the vocabulary size of the model to `*out` (the metadata's `vocab_size`, else the
/// rows of the token embedding table), or -1 when neither says (then only negative token ids
/// are refused).
///
/// # Safety
/// `llm` is NULL or a handle; `out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_llm_vocab_size(llm: *const mblob_llm, out: *mut i64) -> mblob_status {
    // SAFETY: the caller's contract is `handle_get`'s.
    unsafe { crate::call::handle_get(Kind::Llm, llm, "llm", out, |l| Ok(l.vocab)) }
}

/// Generates `max_new_tokens` tokens after the `n_prompt` token ids at `prompt_ids`, in a new
/// KV cache (nothing of an earlier call is kept), as `sampling` says (NULL: greedy), writes
/// them to `out_tokens` and their number to `*n_out`. Both are written only on success.
///
/// Refused before anything runs: an empty prompt, or a prompt and new tokens that do not fit
/// the model's context window (`MBLOB_ERR_INPUT`); a token id that is negative or not below
/// the vocabulary size (`MBLOB_ERR_INPUT`, the message naming the id, its position and the
/// vocabulary size); `out_capacity` under `max_new_tokens` or a bad `sampling`
/// (`MBLOB_ERR_INVALID_ARGUMENT`). A failure of a kernel or of the VM: `MBLOB_ERR_RUN`.
///
/// # Safety
/// `llm` is NULL or a handle; `prompt_ids` is NULL or points to `n_prompt` readable `int32_t`;
/// `sampling` is NULL or points to one readable `mblob_llm_sampling`; `out_tokens` is NULL or
/// points to `out_capacity` writable `int32_t`; `n_out` is NULL or points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mblob_llm_generate(
    llm: *mut mblob_llm,
    prompt_ids: *const i32,
    n_prompt: usize,
    max_new_tokens: usize,
    sampling: *const mblob_llm_sampling,
    out_tokens: *mut i32,
    out_capacity: usize,
    n_out: *mut usize,
) -> mblob_status {
    call(|| {
        imp::available()?;
        check(Kind::Llm, llm, "llm")?;
        not_null(prompt_ids, "prompt_ids")?;
        not_null(out_tokens, "out_tokens")?;
        not_null(n_out, "n_out")?;
        if out_capacity < max_new_tokens {
            return Err(Failure::new(
                mblob_status::MBLOB_ERR_INVALID_ARGUMENT,
                format!("out_tokens holds {out_capacity} tokens, fewer than max_new_tokens ({max_new_tokens})"),
            ));
        }
        // SAFETY: the caller passes NULL or a readable `mblob_llm_sampling`.
        let sampling = unsafe { sampling_or_greedy(sampling) };
        // SAFETY: not NULL, and the caller passes `n_prompt` readable ids that outlive the call.
        let prompt = unsafe { std::slice::from_raw_parts(prompt_ids, n_prompt) };
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let l = unsafe { &mut *llm };
        let tokens = imp::generate(l, prompt, max_new_tokens, &sampling)?;
        // SAFETY: not NULL; the caller passes `out_capacity` writable ids, and
        // `tokens.len() <= max_new_tokens <= out_capacity`.
        unsafe {
            std::ptr::copy_nonoverlapping(tokens.as_ptr(), out_tokens, tokens.len());
            n_out.write(tokens.len());
        }
        Ok(())
    })
}

/// Generates `max_new_tokens` tokens after each of the `n_prompts` prompts in one batch, in a
/// new KV cache, as MLC-LLM's engine runs a batch (`batch_prefill`, then `batch_decode` of all
/// sequences each step), as `sampling` says (NULL: greedy; sequence `i` is seeded
/// `seed + i`). Prompt `i` is the `prompt_lengths[i]` token ids at `prompts[i]`. Sequence `i`'s
/// tokens are written to `out_tokens[i * max_new_tokens ..]`, and the number of tokens of each
/// sequence to `*n_out`; both only on success.
///
/// Refused before anything runs: no prompt, an empty one, more prompts than the model's
/// `max_batch_size`, prompts and new tokens that do not fit the KV cache, a token id outside
/// the vocabulary (`MBLOB_ERR_INPUT`); `out_capacity` under `n_prompts * max_new_tokens` or a
/// bad `sampling` (`MBLOB_ERR_INVALID_ARGUMENT`). A library without `batch_prefill` or
/// `batch_decode`: `MBLOB_ERR_NO_MODEL`. A failure of a kernel or of the VM: `MBLOB_ERR_RUN`.
///
/// # Safety
/// `llm` is NULL or a handle; `prompts` and `prompt_lengths` are NULL or point to `n_prompts`
/// readable entries, each prompt pointer NULL or pointing to its length of readable `int32_t`;
/// `sampling` is NULL or points to one readable `mblob_llm_sampling`; `out_tokens` is NULL or
/// points to `out_capacity` writable `int32_t`; `n_out` is NULL or points to writable storage.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mblob_llm_generate_batch(
    llm: *mut mblob_llm,
    prompts: *const *const i32,
    prompt_lengths: *const usize,
    n_prompts: usize,
    max_new_tokens: usize,
    sampling: *const mblob_llm_sampling,
    out_tokens: *mut i32,
    out_capacity: usize,
    n_out: *mut usize,
) -> mblob_status {
    call(|| {
        imp::available()?;
        check(Kind::Llm, llm, "llm")?;
        not_null(prompts, "prompts")?;
        not_null(prompt_lengths, "prompt_lengths")?;
        not_null(out_tokens, "out_tokens")?;
        not_null(n_out, "n_out")?;
        let needed = n_prompts.checked_mul(max_new_tokens).filter(|&n| n <= out_capacity).ok_or_else(|| {
            Failure::new(
                mblob_status::MBLOB_ERR_INVALID_ARGUMENT,
                format!("out_tokens holds {out_capacity} tokens, fewer than {n_prompts} prompts x {max_new_tokens}"),
            )
        })?;
        // SAFETY: the caller passes NULL or a readable `mblob_llm_sampling`.
        let sampling = unsafe { sampling_or_greedy(sampling) };
        // SAFETY: not NULL, and the caller passes `n_prompts` readable pointers and lengths.
        let (starts, lengths) = unsafe {
            (std::slice::from_raw_parts(prompts, n_prompts), std::slice::from_raw_parts(prompt_lengths, n_prompts))
        };
        let mut batch = Vec::with_capacity(n_prompts);
        for (i, (&p, &n)) in starts.iter().zip(lengths).enumerate() {
            not_null(p, &format!("prompts[{i}]"))?;
            // SAFETY: not NULL, and the caller passes `n` readable ids at it that outlive the call.
            batch.push(unsafe { std::slice::from_raw_parts(p, n) }.to_vec());
        }
        // SAFETY: checked above, and `check` took it for this call alone (in_use).
        let l = unsafe { &mut *llm };
        let outs = imp::generate_batch(l, &batch, max_new_tokens, &sampling)?;
        let per_seq = outs.first().map_or(0, Vec::len);
        // SAFETY: not NULL; the caller passes `out_capacity` writable ids, and each sequence's
        // tokens (at most `max_new_tokens`) land in its own `max_new_tokens` slots of the
        // `needed <= out_capacity`.
        unsafe {
            for (i, tokens) in outs.iter().enumerate() {
                debug_assert!((i + 1) * max_new_tokens <= needed && tokens.len() <= max_new_tokens);
                std::ptr::copy_nonoverlapping(tokens.as_ptr(), out_tokens.add(i * max_new_tokens), tokens.len());
            }
            n_out.write(per_seq);
        }
        Ok(())
    })
}

/// `*sampling`, or greedy decoding for NULL.
///
/// # Safety
/// `sampling` is NULL or points to one readable `mblob_llm_sampling`.
unsafe fn sampling_or_greedy(sampling: *const mblob_llm_sampling) -> mblob_llm_sampling {
    if sampling.is_null() {
        mblob_llm_sampling { temperature: 0.0, top_p: 1.0, seed: 0 }
    } else {
        // SAFETY: not NULL, and per the contract readable.
        unsafe { sampling.read() }
    }
}

/// Frees a language model; NULL does nothing.
///
/// # Safety
/// No other call on `llm` is in progress, and `llm` is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn mblob_llm_free(llm: *mut mblob_llm) -> mblob_status {
    call(|| release(Kind::Llm, llm, "llm"))
}

#[cfg(feature = "llm")]
mod imp {
    use std::path::Path;

    use mblob_runtime::exec::llm::generate::{GenerateError, GenerateOptions, LanguageModel, ModelSettings, Sampling};
    use mblob_runtime::Device;

    use super::{mblob_llm, mblob_llm_options, mblob_llm_sampling};
    use crate::library::mblob_library;
    use crate::llm_options::given;
    use crate::status::{mblob_status, Failure, Result};

    /// Every call may go on: the feature is on.
    #[inline(always)]
    pub(super) fn available() -> Result<()> {
        Ok(())
    }

    pub(super) fn new(
        lib: &mblob_library,
        weights: Option<&Path>,
        device_type: i32,
        device_id: i32,
        options: &mblob_llm_options,
        program_cache: Option<&Path>,
    ) -> Result<mblob_llm> {
        let device = Device::from_dlpack(device_type, device_id);
        let options = generate_options(options, program_cache)?;
        let lm = LanguageModel::new(&lib.tree, device, weights, &options).map_err(failure)?;
        let vocab = lm.vocab_size().unwrap_or(-1);
        Ok(mblob_llm { lm, vocab })
    }

    /// The runtime's options of the C options.
    fn generate_options(o: &mblob_llm_options, program_cache: Option<&Path>) -> Result<GenerateOptions> {
        let invalid = |m: String| Failure::new(mblob_status::MBLOB_ERR_INVALID_ARGUMENT, m);
        let kv_cache_bytes = given(o.kv_cache_bytes)
            .map(|b| u64::try_from(b).map_err(|_| invalid(format!("options->kv_cache_bytes is {b}, negative"))))
            .transpose()?;
        let page_size = given(o.page_size).unwrap_or(GenerateOptions::default().page_size);
        if page_size <= 0 || page_size > i64::from(i32::MAX) {
            return Err(invalid(format!("options->page_size is {page_size}, not a positive 32-bit integer")));
        }
        Ok(GenerateOptions {
            page_size,
            max_total_seq_len: given(o.max_total_seq_len),
            prefill_chunk_size: given(o.prefill_chunk_size),
            kv_cache_bytes,
            model: ModelSettings {
                context_window_size: given(o.context_window_size),
                max_batch_size: given(o.max_batch_size),
                sliding_window_size: given(o.sliding_window_size),
                attention_sink_size: given(o.attention_sink_size),
                vocab_size: given(o.vocab_size),
            },
            opencl_program_cache: program_cache.map(Path::to_path_buf),
        })
    }

    pub(super) fn generate(
        l: &mut mblob_llm,
        prompt: &[i32],
        max_new_tokens: usize,
        sampling: &mblob_llm_sampling,
    ) -> Result<Vec<i32>> {
        let sampling = Sampling { temperature: sampling.temperature, top_p: sampling.top_p, seed: sampling.seed };
        let out = l.lm.generate_sampled(prompt, max_new_tokens, &sampling, |_| {}).map_err(failure)?;
        Ok(out.tokens)
    }

    pub(super) fn generate_batch(
        l: &mut mblob_llm,
        prompts: &[Vec<i32>],
        max_new_tokens: usize,
        sampling: &mblob_llm_sampling,
    ) -> Result<Vec<Vec<i32>>> {
        let sampling = Sampling { temperature: sampling.temperature, top_p: sampling.top_p, seed: sampling.seed };
        let outs = l.lm.generate_batch(prompts, max_new_tokens, &sampling).map_err(failure)?;
        Ok(outs.into_iter().map(|g| g.tokens).collect())
    }

    /// The status of a generation error, by cause.
    pub(crate) fn status(e: &GenerateError) -> mblob_status {
        use mblob_status::*;
        match e {
            // The prompts and what is asked of them: an input problem.
            GenerateError::TokenId { .. }
            | GenerateError::NoPrompt
            | GenerateError::EmptyPrompt { .. }
            | GenerateError::TooManyPrompts { .. }
            | GenerateError::PromptTooLong { .. }
            | GenerateError::TurnCount { .. } => MBLOB_ERR_INPUT,
            GenerateError::MissingFunction { .. } | GenerateError::Metadata { .. } => MBLOB_ERR_NO_MODEL,
            // The arguments of the make call or its options.
            GenerateError::WeightsMissing
            | GenerateError::WeightsBound { .. }
            | GenerateError::Setting { .. }
            | GenerateError::NoCacheSize { .. }
            | GenerateError::BudgetWithoutCache { .. }
            | GenerateError::BudgetTooSmall { .. }
            | GenerateError::SamplingOption(_) => MBLOB_ERR_INVALID_ARGUMENT,
            GenerateError::Weights(_) | GenerateError::NoIndexedWeights => MBLOB_ERR_LOAD,
            GenerateError::NothingToContinue => MBLOB_ERR_STATE,
            GenerateError::Vm(v) => crate::status::vm_status(v),
            _ => MBLOB_ERR_RUN,
        }
    }

    fn failure(e: GenerateError) -> Failure {
        Failure::new(status(&e), e.to_string())
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use mblob_runtime::exec::llm::generate::SamplingOptionError;
        use mblob_runtime::exec::relax::VmError;
        use mblob_status::*;

        #[test]
        fn each_generation_error_has_the_status_of_its_cause() {
            let too_long =
                GenerateError::PromptTooLong { prompts: vec![129], max_new_tokens: 1, needed: 129, capacity: 128 };
            for (e, want) in [
                (GenerateError::NoPrompt, MBLOB_ERR_INPUT),
                (GenerateError::EmptyPrompt { index: Some(1) }, MBLOB_ERR_INPUT),
                (GenerateError::TooManyPrompts { given: 5, max: 4 }, MBLOB_ERR_INPUT),
                (too_long, MBLOB_ERR_INPUT),
                (GenerateError::TurnCount { given: 1, sequences: 2 }, MBLOB_ERR_INPUT),
                (GenerateError::TokenId { id: -1, position: 0, vocab: None }, MBLOB_ERR_INPUT),
                (GenerateError::WeightsMissing, MBLOB_ERR_INVALID_ARGUMENT),
                (GenerateError::WeightsBound { dir: "params".into() }, MBLOB_ERR_INVALID_ARGUMENT),
                (GenerateError::NoCacheSize { context_window_size: -1 }, MBLOB_ERR_INVALID_ARGUMENT),
                (GenerateError::BudgetWithoutCache { budget: 1 }, MBLOB_ERR_INVALID_ARGUMENT),
                (GenerateError::SamplingOption(SamplingOptionError::TopP(0.0)), MBLOB_ERR_INVALID_ARGUMENT),
                (GenerateError::Setting { option: "vocab_size", detail: "no".into() }, MBLOB_ERR_INVALID_ARGUMENT),
                (GenerateError::NoIndexedWeights, MBLOB_ERR_LOAD),
                (GenerateError::NothingToContinue, MBLOB_ERR_STATE),
                (GenerateError::Vm(VmError::VmTir { name: "main".into() }), MBLOB_ERR_UNSUPPORTED),
                (GenerateError::Vm(VmError::Check { kind: "ValueError", message: "x".into() }), MBLOB_ERR_RUN),
            ] {
                assert_eq!(status(&e), want, "{e}");
            }
        }
    }
}

#[cfg(not(feature = "llm"))]
mod imp {
    use std::path::Path;

    use super::{mblob_llm, mblob_llm_options, mblob_llm_sampling};
    use crate::library::mblob_library;
    use crate::status::{mblob_status, Failure, Result};

    /// Refuses every call first: built without the feature, no language model exists, so the
    /// arguments' checks (and their code) are not needed.
    #[inline(always)]
    pub(super) fn available() -> Result<()> {
        Err(Failure::new(
            mblob_status::MBLOB_ERR_UNSUPPORTED,
            "this libmblob was built without the `llm` feature: it runs no language model",
        ))
    }

    pub(super) fn new(
        _: &mblob_library,
        _: Option<&Path>,
        _: i32,
        _: i32,
        _: &mblob_llm_options,
        _: Option<&Path>,
    ) -> Result<mblob_llm> {
        Err(Failure::new(
            mblob_status::MBLOB_ERR_UNSUPPORTED,
            "this libmblob was built without the `llm` feature: it runs no language model",
        ))
    }

    pub(super) fn generate(_: &mut mblob_llm, _: &[i32], _: usize, _: &mblob_llm_sampling) -> Result<Vec<i32>> {
        Err(Failure::new(mblob_status::MBLOB_ERR_UNSUPPORTED, "this libmblob was built without the `llm` feature"))
    }

    pub(super) fn generate_batch(
        _: &mut mblob_llm,
        _: &[Vec<i32>],
        _: usize,
        _: &mblob_llm_sampling,
    ) -> Result<Vec<Vec<i32>>> {
        Err(Failure::new(mblob_status::MBLOB_ERR_UNSUPPORTED, "this libmblob was built without the `llm` feature"))
    }
}
