//! `mblob generate`: greedy decoding with a language-model library as MLC-LLM exports them
//! (`embed`, `prefill`, `decode`, `create_tir_paged_kv_cache`, `_metadata`), token ids in and
//! out, with `mblob-runtime` alone ([`mblob_runtime::exec::llm::generate`]).

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use mblob_runtime::exec::llm::generate::{GenerateOptions, LanguageModel};
use mblob_runtime::exec::Device;
use mblob_runtime::format::stream::DataType;
use mblob_runtime::{load_library, LoadOptions, NdArray, Registry};

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
    /// The prompt's token ids, comma-separated (no tokenizer: ids in, ids out).
    #[arg(long, value_name = "ID,ID,...", value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<i32>,
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
    /// Write the logits each new token was picked from as a float32 `.npy` of shape
    /// `[tokens, vocab]`.
    #[arg(long, value_name = "FILE.npy")]
    pub logits: Option<PathBuf>,
}

const AFTER_HELP: &str = "\
The model's functions are MLC-LLM's: `embed(input_ids[, packed_params])`, `prefill(embeddings,
kv_cache[, packed_params])`, `decode(embedding, kv_cache[, packed_params])`,
`create_tir_paged_kv_cache(max_batch_size, max_total_seq_len, prefill_chunk_size, page_size,
support_sliding_window)` and `_metadata()` (its JSON gives the weight names, the context window
and the prefill chunk size). The prompt is run in chunks of at most prefill_chunk_size tokens;
each new token is the one of largest logit (greedy). The last line of the output is the new
token ids, comma-separated.

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
    let options = GenerateOptions { page_size: args.page_size, ..GenerateOptions::default() };
    let mut lm = LanguageModel::new(&tree, args.device, args.weights.as_deref(), &options)
        .map_err(|e| invalid(mblob::with_causes(&e).to_string()))?;
    let first = lm.generate(&args.prompt_ids, args.max_new_tokens).map_err(|e| invalid(mblob::with_causes(&e)))?;
    if let Some(path) = &args.logits {
        let vocab = first.logits.first().map_or(0, Vec::len);
        let data: Vec<u8> = first.logits.iter().flatten().flat_map(|x| x.to_le_bytes()).collect();
        let t = NdArray::from_bytes(&data, &[first.logits.len() as i64, vocab as i64], DataType::F32, Device::cpu(0))
            .map_err(|_| invalid("logits of unequal lengths".into()))?;
        write_npy(path, &t)?;
    }
    if let Some(n) = args.repeat {
        let mut decode = Vec::new();
        let mut prefill = Vec::new();
        for _ in 0..n {
            let again =
                lm.generate(&args.prompt_ids, args.max_new_tokens).map_err(|e| invalid(mblob::with_causes(&e)))?;
            if again.tokens != first.tokens {
                return Err(invalid(format!(
                    "a repeated run gave other tokens ({}) than the first ({})",
                    ids(&again.tokens),
                    ids(&first.tokens)
                )));
            }
            decode.extend(again.decode_times.iter().map(|d| d.as_secs_f64()));
            // With --max-new-tokens 0 no prefill ran.
            if !again.tokens.is_empty() {
                prefill.push(again.prefill_time.as_secs_f64());
            }
        }
        print_labelled_times(&format!("prefill of {} tokens", args.prompt_ids.len()), &prefill);
        print_labelled_times("decode, per token", &decode);
    }
    println!("{}", ids(&first.tokens));
    Ok(ExitCode::SUCCESS)
}

fn ids(tokens: &[i32]) -> String {
    tokens.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}
