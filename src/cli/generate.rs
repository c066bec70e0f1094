//! `mblob generate`: greedy decoding with a language-model library as MLC-LLM exports them
//! (`embed`, `prefill`, `decode`, `create_tir_paged_kv_cache`, `_metadata`), token ids in and
//! out, with `mblob-runtime` alone ([`mblob_runtime::exec::llm::generate`]).

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use mblob_runtime::exec::llm::generate::{GenerateOptions, Generation, LanguageModel, Sampling};
use mblob_runtime::exec::Device;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::{load_library, LoadOptions, NdArray, Registry};

use super::model_settings::{prompt_ids, ModelSettingsArgs};
use super::output::print_labelled_times;
use super::run::{set_threads, thread_count, write_npy};
use crate::{Error, Result};

/// Arguments of `mblob generate`.
///
/// Examples:
///
/// ```text
/// mblob generate model.so --weights params/ --prompt-ids 17,211,5 --max-new-tokens 16
/// mblob generate model_bound.so --prompt-ids 17,211,5 --max-new-tokens 16 --repeat 20 --threads 1
/// mblob generate model_opencl.so --device opencl --weights params/ --prompt-ids 17,211,5
/// mblob generate model_opencl.so --device opencl --weights params/ --prompt-ids 17,211,5 \
///     --opencl-program-cache model_opencl.programs
/// ```
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct GenerateArgs {
    /// The model library (TVM's `export_library` output of an MLC-LLM-style model).
    #[arg(value_name = "MODEL.so")]
    pub model: PathBuf,
    /// The directory of the weights' tensor cache (`tensor-cache.json` and its shards), for a
    /// library whose functions take the weights as a parameter (`packed_params`). A library
    /// with the weights bound as constants needs none.
    #[arg(long, value_name = "DIR")]
    pub weights: Option<PathBuf>,
    /// The prompt's token ids, comma-separated (no tokenizer: ids in, ids out). Given more than
    /// once, the prompts run as one batch (sequence K is the K-th prompt), through the model's
    /// `batch_prefill` and `batch_decode` as MLC-LLM's engine runs a batch.
    #[arg(long, value_name = "ID,ID,...", value_parser = prompt_ids, required_unless_present = "prompt_file")]
    pub prompt_ids: Vec<Vec<i32>>,
    /// A file of prompts, one per line (token ids separated by commas or spaces; empty lines
    /// and lines starting with `#` are skipped), run as one batch after any `--prompt-ids`.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// The sampling temperature: 0 (the default) picks the token of largest logit; above 0
    /// each token is drawn with TVM's `sample_top_p_from_logits`.
    #[arg(long, value_name = "T", default_value_t = 0.0)]
    pub temperature: f64,
    /// Draw from the smallest set of most likely tokens whose probability reaches P (with
    /// --temperature above 0).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub top_p: f64,
    /// The seed of the draws (MLC-LLM's: std::mt19937 and uniform_real_distribution); the
    /// K-th sequence of a batch gets SEED + K.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u32,
    /// How many tokens to generate: the prefill's, then one per decode step.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Generate N more times after the first and print the time per decoded token (mean,
    /// median, min over all decode steps of those runs) and per prefill.
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// Threads for the kernels' parallel loops, this thread included (default:
    /// MBLOB_NUM_THREADS, then TVM_NUM_THREADS, then the number of cores).
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub threads: Option<NonZeroUsize>,
    /// The device to run on (cpu, opencl, cuda, optionally with `:N`): a library built for
    /// that device; its weights and the paged KV cache are put there.
    #[arg(short, long, value_name = "DEVICE", default_value = "cpu")]
    pub device: Device,
    /// Tokens per page of the paged KV cache.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(i64).range(1..))]
    pub page_size: i64,
    /// Tokens the paged KV cache holds in all (`max_total_seq_len`); default: the model's
    /// context window. A sliding-window model whose context window is -1 needs it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..i64::from(i32::MAX)))]
    pub max_total_seq_len: Option<i64>,
    /// The most tokens of one prefill step; default: the model's `prefill_chunk_size` (without
    /// `_metadata`: the context window, else the cache's size, at most 8192, as MLC-LLM's).
    #[arg(long, visible_alias = "prefill-chunk", value_name = "N", value_parser = clap::value_parser!(i64).range(1..i64::from(i32::MAX)))]
    pub prefill_chunk_size: Option<i64>,
    /// Size the KV cache from a memory budget for its pages, in bytes (as MLC-LLM's engine sizes
    /// it from the memory it may use): as many tokens as whole pages fit. Ignored with
    /// --max-total-seq-len.
    #[arg(long, value_name = "BYTES")]
    pub kv_cache_bytes: Option<u64>,
    /// On OpenCL, a file of the kernels' compiled programs in TVM's layout (what
    /// `opencl.GetPreCompiledPrograms` returns): written on the first run, after every kernel
    /// is built from its OpenCL C source; loaded on later runs (`SetPreCompiledPrograms`), which
    /// then skip the builds. Delete it after a driver update.
    #[arg(long, value_name = "FILE")]
    pub opencl_program_cache: Option<PathBuf>,
    /// Write the logits each new token was picked from as a float32 `.npy` of shape
    /// `[tokens, vocab]`.
    #[arg(long, value_name = "FILE.npy")]
    pub logits: Option<PathBuf>,
    /// What `_metadata` gives, and further turns.
    #[command(flatten)]
    pub model_settings: ModelSettingsArgs,
}

const AFTER_HELP: &str = "\
The model's functions are MLC-LLM's: `embed(input_ids[, packed_params])`, `prefill(embeddings,
kv_cache[, packed_params])`, `decode(embedding, kv_cache[, packed_params])`,
`create_tir_paged_kv_cache(max_batch_size, max_total_seq_len, prefill_chunk_size, page_size,
support_sliding_window)` and `_metadata()` (its JSON gives the weight names, the context window
and the prefill chunk size). A model whose `kv_state_kind` is `rnn_state` (RWKV) has
`create_rnn_state(max_batch_size, max_history)` instead, and its state goes where the cache goes. A
`hybrid` model (Qwen3.5) has both, and no `prefill`/`decode`: each step runs through
`batch_prefill(embeddings, logit_positions, kv_cache, rnn_state[, packed_params])` or
`batch_decode(embeddings, kv_cache, rnn_state[, packed_params])`, as MLC-LLM's engine runs it. The prompt is run in chunks of at most prefill_chunk_size tokens;
each new token is the one of largest logit (greedy). The last line of the output is the new
token ids, comma-separated (one line per prompt for several, in order). With --temperature
above 0 each token is drawn with TVM's sampling builtin from MLC-LLM's seeded draws. A model with a sliding window (`sliding_window_size` in its
metadata) gets it on its sequence, with its `attention_sink_size` sinks, as MLC-LLM's engine
does: the prompt may then be longer than the cache.

A library without `_metadata` (the model functions alone, e.g. built with TVM's `nn.llm`
directly) runs too: its weights are the tensor cache's `param_0`, `param_1`, ... and what the
metadata would give comes from --context-window (or --max-total-seq-len), --prefill-chunk-size,
--max-batch-size, --sliding-window, --attention-sinks and --vocab-size; an error names the one
that is needed. With --then-prompt-ids the sequences continue in the same cache; a later chunk
or turn of a sequence runs through `extend`/`batch_extend` when the library has them, as
MLC-LLM's engine runs them. One line of new ids is printed per sequence and turn.

Exit status: 0 done, 1 failure (a file that cannot be read, a library that is not such a
model, weights that do not match it, a prompt longer than its context window), 2 usage error.

Environment:
  MBLOB_NUM_THREADS  threads when --threads is not given (a number, at least 1); else
                     TVM_NUM_THREADS, the same; else one per core
  MBLOB_LOG          log filter for stderr (e.g. `debug`); RUST_LOG when unset";

/// Runs `mblob generate`.
pub fn run(args: &GenerateArgs) -> Result<ExitCode> {
    if let Err(message) = set_threads(args.threads) {
        return Ok(super::usage_error("generate", message));
    }
    let model = args.model.display().to_string();
    let invalid = |detail: String| Error::Run { what: model.clone(), detail: detail.into() };
    // SAFETY: generating with a model means running its code: the user asked for this file.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library(&args.model, &Registry::default(), &LoadOptions::keep_unknown()) }?;
    let options = GenerateOptions {
        page_size: args.page_size,
        max_total_seq_len: args.max_total_seq_len,
        prefill_chunk_size: args.prefill_chunk_size,
        kv_cache_bytes: args.kv_cache_bytes,
        model: args.model_settings.settings(),
        opencl_program_cache: args.opencl_program_cache.clone(),
    };
    let mut lm = LanguageModel::new(&tree, args.device, args.weights.as_deref(), &options)
        .map_err(|e| invalid(mblob::with_causes(&e).to_string()))?;
    let mut prompts = args.prompt_ids.clone();
    if let Some(path) = &args.prompt_file {
        let text = std::fs::read_to_string(path).map_err(Error::io(path, "cannot read"))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let ids = prompt_ids(&line.replace(char::is_whitespace, ",")).map_err(|e| Error::Input {
                what: path.display().to_string(),
                detail: format!("line {}: {e}", n + 1).into(),
            })?;
            prompts.push(ids);
        }
    }
    if prompts.is_empty() {
        return Ok(super::usage_error("generate", "no prompt: give --prompt-ids or a --prompt-file with one".into()));
    }
    if let Err(message) = args.model_settings.check_turns(prompts.len()) {
        return Ok(super::usage_error("generate", message));
    }
    let sampling = Sampling { temperature: args.temperature, top_p: args.top_p, seed: args.seed };
    let mut generate = || -> Result<Vec<Generation>> {
        let out = args.model_settings.run_turns(&mut lm, &prompts, args.max_new_tokens, &sampling);
        out.map_err(|e| invalid(mblob::with_causes(&e)))
    };
    let first = generate()?;
    if let Some(path) = &args.logits {
        let vocab = first.iter().find_map(|g| g.logits.first()).map_or(0, Vec::len);
        let steps = first[0].logits.len() as i64;
        let rows = first.iter().map(|g| g.logits.len() as i64).sum();
        let data: Vec<u8> =
            first.iter().flat_map(|g| g.logits.iter().flatten()).flat_map(|x| x.to_le_bytes()).collect();
        let shape =
            if prompts.len() == 1 { vec![rows, vocab as i64] } else { vec![first.len() as i64, steps, vocab as i64] };
        let t = NdArray::from_bytes(&data, &shape, DataType::F32, Device::cpu(0))
            .map_err(|_| invalid("logits of unequal lengths".into()))?;
        write_npy(path, &t)?;
    }
    if let Some(n) = args.repeat {
        let mut decode = Vec::new();
        let mut prefill = Vec::new();
        for _ in 0..n {
            let again = generate()?;
            for (a, f) in again.iter().zip(&first) {
                if a.tokens != f.tokens {
                    return Err(invalid(format!(
                        "a repeated run gave other tokens ({}) than the first ({})",
                        ids(&a.tokens),
                        ids(&f.tokens)
                    )));
                }
            }
            decode.extend(again[0].decode_times.iter().map(|d| d.as_secs_f64()));
            // With --max-new-tokens 0 no prefill ran.
            if !again[0].tokens.is_empty() {
                prefill.push(again[0].prefill_time.as_secs_f64());
            }
        }
        let total: usize = prompts.iter().map(Vec::len).sum();
        let per = if prompts.len() == 1 { "decode, per token" } else { "decode, per step of the batch" };
        print_labelled_times(&format!("prefill of {total} tokens"), &prefill);
        print_labelled_times(per, &decode);
    }
    for g in &first {
        println!("{}", ids(&g.tokens));
    }
    Ok(ExitCode::SUCCESS)
}

fn ids(tokens: &[i32]) -> String {
    tokens.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}
