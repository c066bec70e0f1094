//! `vm.builtin.paged_attention_kv_cache_create`: its 28 arguments, checked and turned into the
//! cache's configuration and kernels. What mblob does not implement is refused here, naming it.

use crate::array::NdArray;
use crate::device::Device;
use crate::ffi::call::PackedFunction;
use crate::format::DataType;

use super::error::{check_cmp, check_false, KvCacheError};
use crate::exec::relax::vm::value::{tuple_items, Value};
use crate::exec::relax::vm::VirtualMachine;

const CREATE: &str = "vm.builtin.paged_attention_kv_cache_create";

/// How RoPE is applied (TVM's `RoPEMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// No RoPE.
    None,
    /// RoPE applied to the queries and keys when they are split from the fused QKV.
    Normal,
    /// RoPE applied inside the attention kernels.
    Inline,
}

/// The attention of one layer (TVM's `AttnKind`; the cache runs the MHA kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Multi-head attention (MHA, MQA and GQA), kind 0.
    Mha,
    /// Multi-head attention over a per-layer sliding window (kind 3, Gemma 3's local layers):
    /// the layer sees the last `layer_sliding_window_size` positions of each sequence.
    MhaSliding,
}

/// The configuration of a paged KV cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Positions per page.
    pub page_size: i64,
    /// Layers (this cache's share: the whole model without Disco).
    pub num_layers: i64,
    /// Query (and output) heads.
    pub num_qo_heads: i64,
    /// Key and value heads.
    pub num_kv_heads: i64,
    /// Features per head of queries and keys.
    pub qk_head_dim: i64,
    /// Features per head of values.
    pub v_head_dim: i64,
    /// Sequences planned for (TVM's `reserved_num_seqs`, the max batch size).
    pub reserved_num_seqs: i64,
    /// Pages of the cache: `ceil(max_total_seq_len / page_size) + 1`.
    pub num_total_pages: i64,
    /// The most tokens of one round.
    pub prefill_chunk_size: i64,
    /// Per layer: its attention.
    pub attn_kinds: Vec<AttnKind>,
    /// Whether sequences may have a sliding window with attention sinks (cache config field 4,
    /// `support_sliding_window`; TVM turns it off when a layer has a per-layer window). Such a
    /// cache has `2 * reserved_num_seqs` more pages.
    pub support_sliding_window: bool,
    /// Whether a layer has a per-layer sliding window ([`AttnKind::MhaSliding`]).
    pub support_layer_sliding_window: bool,
    /// The window of the per-layer sliding layers (cache config field 5; TVM's default 1024).
    pub layer_sliding_window_size: i64,
    /// How RoPE is applied (inline in the attention kernels when sliding windows are supported
    /// and the library asked for RoPE, as TVM switches it).
    pub rope_mode: RopeMode,
    /// RoPE scale.
    pub rotary_scale: f64,
    /// RoPE theta.
    pub rotary_theta: f64,
    /// RoPE extension factors (argument 11; Phi-3's longrope): `f_split_rotary` gets them in
    /// place of its RoPE flag.
    pub rope_ext_factors: Option<NdArray>,
    /// The dtype of keys and values.
    pub dtype: DataType,
    /// Where the pages, the scratch tensors and the auxiliary arrays live: the device of the
    /// `init` tensor (argument 12), which the VM allocates on its device (TVM's `device_`).
    pub device: Device,
}

/// A kernel of the library and its name (for errors).
#[derive(Debug, Clone)]
pub(super) struct Kernel {
    pub name: String,
    pub f: PackedFunction,
}

/// The library's kernels the cache calls.
#[derive(Debug, Clone)]
pub(super) struct Kernels {
    pub transpose_append: Kernel,
    pub prefill_ragged: Kernel,
    pub prefill: Kernel,
    pub decode: Kernel,
    /// The sliding-window variants (arguments 18 and 19), for a cache with sliding windows.
    pub prefill_sliding: Option<Kernel>,
    pub decode_sliding: Option<Kernel>,
    pub merge: Kernel,
    pub split_rotary: Kernel,
    pub copy_single_page: Kernel,
    pub debug_get_kv: Kernel,
}

fn arg_err(index: usize, detail: impl Into<String>) -> KvCacheError {
    KvCacheError::Arg { builtin: CREATE.to_owned(), index, detail: detail.into() }
}

fn get<'a>(args: &[&'a Value], i: usize) -> Result<&'a Value, KvCacheError> {
    args.get(i).copied().ok_or_else(|| arg_err(i, "missing"))
}

fn int(args: &[&Value], i: usize) -> Result<i64, KvCacheError> {
    match get(args, i)? {
        Value::Int(v) => Ok(*v),
        v => Err(arg_err(i, format!("expected an integer, got {}", v.kind()))),
    }
}

fn float(args: &[&Value], i: usize) -> Result<f64, KvCacheError> {
    match get(args, i)? {
        Value::Int(v) => Ok(*v as f64),
        Value::Float(v) => Ok(*v),
        v => Err(arg_err(i, format!("expected a number, got {}", v.kind()))),
    }
}

fn shape(args: &[&Value], i: usize) -> Result<Vec<i64>, KvCacheError> {
    match get(args, i)? {
        Value::Shape(s) => Ok(s.to_vec()),
        v => Err(arg_err(i, format!("expected a shape, got {}", v.kind()))),
    }
}

/// A function value of the library.
fn kernel(vm: &VirtualMachine, args: &[&Value], i: usize) -> Result<Kernel, KvCacheError> {
    match get(args, i)? {
        Value::Func(f) => vm
            .kernel_of(*f)
            .map(|(name, f)| Kernel { name: name.to_owned(), f })
            .ok_or_else(|| arg_err(i, "the function is not one of the library's kernels")),
        v => Err(arg_err(i, format!("expected a function of the library, got {}", v.kind()))),
    }
}

/// An attention backend tuple: `("tirx", kernel)`, or `("tir", kernel)` as TVM 0.20 to 0.23
/// spell TVM's TIR kernels; `None` for an empty tuple.
fn backend(vm: &VirtualMachine, args: &[&Value], i: usize, what: &str) -> Result<Option<Kernel>, KvCacheError> {
    let items = match get(args, i)? {
        Value::Tuple(t) => tuple_items(t),
        v => return Err(arg_err(i, format!("expected a tuple (backend, function), got {}", v.kind()))),
    };
    if items.is_empty() {
        return Ok(None);
    }
    let backend = match &items[0] {
        Value::Str(s) => String::from_utf8_lossy(s).into_owned(),
        v => return Err(arg_err(i, format!("expected the backend name first, got {}", v.kind()))),
    };
    if backend != "tirx" && backend != "tir" {
        return Err(KvCacheError::Unsupported(format!(
            "the `{backend}` attention backend of the {what} (only TVM's TIR kernels, \"tirx\" or TVM 0.20-0.23's \"tir\", run on the CPU)"
        )));
    }
    if items.len() != 2 {
        return Err(arg_err(i, format!("a \"{backend}\" backend takes one function, got {}", items.len() - 1)));
    }
    let item: &Value = &items[1];
    kernel(vm, &[item], 0).map(Some).map_err(|e| match e {
        KvCacheError::Arg { detail, .. } => arg_err(i, detail),
        e => e,
    })
}

/// Checks and reads the create call's arguments.
pub(super) fn parse(vm: &VirtualMachine, args: &[&Value]) -> Result<(CacheConfig, Kernels), KvCacheError> {
    if args.len() != 28 && args.len() != 29 {
        return Err(KvCacheError::Check(format!(
            "Check failed: (args.size() == 28 || args.size() == 29) is false: Invalid number of KV cache constructor args: {}",
            args.len()
        )));
    }
    let cache_config = shape(args, 0)?;
    if cache_config.len() != 5 && cache_config.len() != 6 {
        return Err(KvCacheError::Check(
            "Check failed: (cache_config.size() == 5 || cache_config.size() == 6) is false: KV cache config must contain five legacy fields and an optional per-layer sliding window size.".into(),
        ));
    }
    let (reserved_num_seqs, total_token_capacity, prefill_chunk_size, page_size) =
        (cache_config[0], cache_config[1], cache_config[2], cache_config[3]);
    let sliding_requested = cache_config[4] != 0;
    let layer_sliding_window_size = cache_config.get(5).copied().unwrap_or(1024);
    for (name, v) in [
        ("max batch size", reserved_num_seqs),
        ("max total sequence length", total_token_capacity),
        ("prefill chunk size", prefill_chunk_size),
        ("page size", page_size),
    ] {
        if v <= 0 || v > i64::from(i32::MAX) {
            return Err(arg_err(0, format!("the {name} {v} is not a positive 32-bit integer")));
        }
    }
    let layers = shape(args, 1)?;
    if layers.len() != 2 {
        return Err(KvCacheError::Unsupported(format!(
            "a layer partition over {} groups (Disco); mblob runs the cache in one group",
            layers.len().saturating_sub(1)
        )));
    }
    let num_layers = layers[1] - layers[0];
    if layers[0] != 0 || num_layers <= 0 {
        return Err(arg_err(1, format!("layer partition {layers:?}: expected [0, num_layers]")));
    }
    let (num_qo_heads, num_kv_heads, qk_head_dim, v_head_dim) =
        (int(args, 2)?, int(args, 3)?, int(args, 4)?, int(args, 5)?);
    for (i, v) in [(2, num_qo_heads), (3, num_kv_heads), (4, qk_head_dim), (5, v_head_dim)] {
        if v <= 0 || v > 1 << 16 {
            return Err(arg_err(i, format!("{v} is out of range")));
        }
    }
    if num_qo_heads % num_kv_heads != 0 {
        return Err(arg_err(3, format!("{num_qo_heads} query heads are not a multiple of {num_kv_heads} KV heads")));
    }
    let kinds = shape(args, 6)?;
    if kinds.len() as i64 != num_layers {
        return Err(arg_err(6, format!("{} attention kinds for {num_layers} layers", kinds.len())));
    }
    let attn_kinds = kinds
        .iter()
        .map(|&k| match k {
            0 => Ok(AttnKind::Mha),
            3 => Ok(AttnKind::MhaSliding),
            1 => Err("multi-head latent attention (MLA) layers"),
            2 => Err("linear attention layers"),
            _ => Err("unknown attention kinds"),
        })
        .zip(&kinds)
        .map(|(r, &k)| {
            r.map_err(|what| {
                KvCacheError::Unsupported(format!(
                    "{what} (attention kind {k}); only MHA (0) and per-layer sliding MHA (3) are implemented"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // TVM: a per-layer window turns the per-sequence sliding window off.
    let support_layer_sliding_window = attn_kinds.contains(&AttnKind::MhaSliding);
    let support_sliding_window = sliding_requested && !support_layer_sliding_window;
    if layer_sliding_window_size <= 0 {
        return Err(check_cmp(
            "layer_sliding_window_size_ > 0",
            layer_sliding_window_size,
            0,
            "Per-layer sliding window size must be positive.",
        ));
    }
    if qk_head_dim != v_head_dim {
        return Err(arg_err(5, format!("an MHA cache has one head dim, got {qk_head_dim} and {v_head_dim}")));
    }
    if int(args, 7)? != 0 {
        return Err(KvCacheError::Unsupported("KV transfer (disaggregation over NVSHMEM)".into()));
    }
    let rope_mode = match int(args, 8)? {
        0 => RopeMode::None,
        1 => RopeMode::Normal,
        2 => RopeMode::Inline,
        m => return Err(arg_err(8, format!("unknown RoPE mode {m}"))),
    };
    // TVM decides on the requested flag (before a per-layer window turns it off).
    let rope_mode = if sliding_requested && rope_mode != RopeMode::None { RopeMode::Inline } else { rope_mode };
    let rotary_scale = float(args, 9)?;
    let rotary_theta = float(args, 10)?;
    let rope_ext_factors = match get(args, 11)? {
        Value::Tensor(t) => Some(t.clone()),
        _ => None,
    };
    if rope_ext_factors.is_some() && rope_mode != RopeMode::Normal {
        return Err(check_false(
            "rope_mode_ == RoPEMode::kNormal",
            "The RoPE mode must be normal to support RoPE extension factors.",
        ));
    }
    let (dtype, device) = match get(args, 12)? {
        Value::Tensor(t) => (t.dtype(), t.device()),
        v => {
            return Err(arg_err(12, format!("expected a tensor (the dtype and device of the cache), got {}", v.kind())))
        }
    };
    let transpose_append = match get(args, 13)? {
        Value::Null => return Err(arg_err(13, "an MHA cache needs the transpose-append function")),
        _ => kernel(vm, args, 13)?,
    };
    let missing = |i: usize, what: &str| arg_err(i, format!("the {what} kernel is not given"));
    let prefill_ragged = backend(vm, args, 15, "ragged prefill")?.ok_or_else(|| missing(15, "ragged prefill"))?;
    let prefill = backend(vm, args, 16, "paged prefill")?.ok_or_else(|| missing(16, "paged prefill"))?;
    let decode = backend(vm, args, 17, "paged decode")?.ok_or_else(|| missing(17, "paged decode"))?;
    let (prefill_sliding, decode_sliding) = if support_sliding_window || support_layer_sliding_window {
        (
            Some(
                backend(vm, args, 18, "sliding-window paged prefill")?
                    .ok_or_else(|| missing(18, "sliding-window paged prefill"))?,
            ),
            Some(
                backend(vm, args, 19, "sliding-window paged decode")?
                    .ok_or_else(|| missing(19, "sliding-window paged decode"))?,
            ),
        )
    } else {
        (None, None)
    };
    let merge = match get(args, 23)? {
        Value::Tuple(t) => match tuple_items(t).first() {
            Some(first) => {
                kernel(vm, &[first], 0).map_err(|_| arg_err(23, "the merge function is not a kernel of the library"))?
            }
            None => {
                return Err(KvCacheError::Check(
                    "Check failed: (!f_merge_inplace.empty()) is false: Merge inplace function is not defined.".into(),
                ))
            }
        },
        v => return Err(arg_err(23, format!("expected a tuple of merge functions, got {}", v.kind()))),
    };
    let split_rotary = kernel(vm, args, 24)?;
    let copy_single_page = kernel(vm, args, 25)?;
    let debug_get_kv = kernel(vm, args, 26)?;
    let mut num_total_pages = (total_token_capacity + page_size - 1) / page_size + 1;
    if sliding_requested {
        // TVM: a sequence with a sliding window may use two more pages at most.
        num_total_pages += reserved_num_seqs * 2;
    }
    Ok((
        CacheConfig {
            page_size,
            num_layers,
            num_qo_heads,
            num_kv_heads,
            qk_head_dim,
            v_head_dim,
            reserved_num_seqs,
            num_total_pages,
            prefill_chunk_size,
            attn_kinds,
            support_sliding_window,
            support_layer_sliding_window,
            layer_sliding_window_size,
            rope_mode,
            rotary_scale,
            rotary_theta,
            rope_ext_factors,
            dtype,
            device,
        },
        Kernels {
            transpose_append,
            prefill_ragged,
            prefill,
            decode,
            prefill_sliding,
            decode_sliding,
            merge,
            split_rotary,
            copy_single_page,
            debug_get_kv,
        },
    ))
}
