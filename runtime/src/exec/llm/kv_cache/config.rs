//! `vm.builtin.paged_attention_kv_cache_create`: its 28 arguments, checked and turned into the
//! cache's configuration and kernels. What mblob does not implement is refused here, naming it.

use crate::array::NdArray;
use crate::device::Device;
use crate::ffi::call::PackedFunction;
use crate::format::DataType;

use super::error::{check_cmp, check_false, KvCacheError, UnsupportedFeature};
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

/// Gives the kernel at a slot of the create call's arguments (the library's kernel; the
/// layout tests give positions).
pub(super) type KernelAt<'a, K> = dyn FnMut(&[&Value], usize) -> Result<K, KvCacheError> + 'a;

/// The library's kernels the cache calls (`K`: a kernel; the layout tests use positions).
#[derive(Debug, Clone)]
pub(super) struct Kernels<K = Kernel> {
    pub transpose_append: K,
    pub prefill_ragged: K,
    pub prefill: K,
    pub decode: K,
    /// The sliding-window variants, for a cache with sliding windows.
    pub prefill_sliding: Option<K>,
    pub decode_sliding: Option<K>,
    pub merge: K,
    pub split_rotary: K,
    pub copy_single_page: K,
    pub debug_get_kv: K,
    /// Whether the paged prefill and decode kernels take the depth first (TVM 0.18/0.19's
    /// TIR kernels: `_0: int32`).
    pub depth_arg: bool,
}

pub(super) fn arg_err(index: usize, detail: impl Into<String>) -> KvCacheError {
    KvCacheError::Arg { builtin: CREATE.to_owned(), index, detail: detail.into() }
}

pub(super) fn get<'a>(args: &[&'a Value], i: usize) -> Result<&'a Value, KvCacheError> {
    args.get(i).copied().ok_or_else(|| arg_err(i, "missing"))
}

pub(super) fn int(args: &[&Value], i: usize) -> Result<i64, KvCacheError> {
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
pub(super) fn kernel(vm: &VirtualMachine, args: &[&Value], i: usize) -> Result<Kernel, KvCacheError> {
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
fn backend<K>(kernel: &mut KernelAt<'_, K>, args: &[&Value], i: usize, what: &str) -> Result<Option<K>, KvCacheError> {
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
        return Err(UnsupportedFeature::Backend { backend, kernel: what.to_owned() }.into());
    }
    if items.len() != 2 {
        return Err(arg_err(i, format!("a \"{backend}\" backend takes one function, got {}", items.len() - 1)));
    }
    let item: &Value = &items[1];
    kernel(&[item], 0).map(Some).map_err(|e| match e {
        KvCacheError::Arg { detail, .. } => arg_err(i, detail),
        e => e,
    })
}

/// Checks and reads the create call's arguments.
/// The sizes of slot 0 (`cache_config`, of one of `lengths` fields) and slot 1 (the layer
/// partition), checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    pub reserved_num_seqs: i64,
    pub total_token_capacity: i64,
    pub prefill_chunk_size: i64,
    pub page_size: i64,
    pub sliding_requested: bool,
    pub layer_sliding_window_size: i64,
    pub num_layers: i64,
}

pub(super) fn sizes(args: &[&Value], lengths: &[usize]) -> Result<Sizes, KvCacheError> {
    let cache_config = shape(args, 0)?;
    if !lengths.contains(&cache_config.len()) {
        return Err(if lengths.len() == 2 {
            KvCacheError::Check(
                "Check failed: (cache_config.size() == 5 || cache_config.size() == 6) is false: KV cache config must contain five legacy fields and an optional per-layer sliding window size.".into(),
            )
        } else {
            check_cmp("cache_config.size() == 5", cache_config.len(), 5, "")
        });
    }
    let (reserved_num_seqs, total_token_capacity, prefill_chunk_size, page_size) =
        (cache_config[0], cache_config[1], cache_config[2], cache_config[3]);
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
        return Err(UnsupportedFeature::LayerGroups { groups: layers.len().saturating_sub(1) }.into());
    }
    let num_layers = layers[1] - layers[0];
    if layers[0] != 0 || num_layers <= 0 || num_layers > 1 << 16 {
        return Err(arg_err(1, format!("layer partition {layers:?}: expected [0, num_layers]")));
    }
    Ok(Sizes {
        reserved_num_seqs,
        total_token_capacity,
        prefill_chunk_size,
        page_size,
        sliding_requested: cache_config[4] != 0,
        layer_sliding_window_size: cache_config.get(5).copied().unwrap_or(1024),
        num_layers,
    })
}

/// Query heads, KV heads, and the head dims of queries/keys and values, at `slots` (the same
/// slot twice where one head dim serves both), checked.
pub(super) fn heads(args: &[&Value], slots: [usize; 4]) -> Result<(i64, i64, i64, i64), KvCacheError> {
    let v = [int(args, slots[0])?, int(args, slots[1])?, int(args, slots[2])?, int(args, slots[3])?];
    for (&i, &x) in slots.iter().zip(&v) {
        if x <= 0 || x > 1 << 16 {
            return Err(arg_err(i, format!("{x} is out of range")));
        }
    }
    if v[0] % v[1] != 0 {
        return Err(arg_err(slots[1], format!("{} query heads are not a multiple of {} KV heads", v[0], v[1])));
    }
    Ok((v[0], v[1], v[2], v[3]))
}

/// RoPE mode, scale, theta and extension factors at `slots`, as TVM's constructor takes them
/// (inline when sliding windows are requested; extension factors only with the normal mode).
pub(super) fn rope(
    args: &[&Value],
    slots: [usize; 4],
    sliding_requested: bool,
) -> Result<(RopeMode, f64, f64, Option<NdArray>), KvCacheError> {
    let rope_mode = match int(args, slots[0])? {
        0 => RopeMode::None,
        1 => RopeMode::Normal,
        2 => RopeMode::Inline,
        m => return Err(arg_err(slots[0], format!("unknown RoPE mode {m}"))),
    };
    // TVM decides on the requested flag (before a per-layer window turns it off).
    let rope_mode = if sliding_requested && rope_mode != RopeMode::None { RopeMode::Inline } else { rope_mode };
    let rotary_scale = float(args, slots[1])?;
    let rotary_theta = float(args, slots[2])?;
    let rope_ext_factors = match args.get(slots[3]) {
        Some(Value::Tensor(t)) => Some(t.clone()),
        _ => None,
    };
    if rope_ext_factors.is_some() && rope_mode != RopeMode::Normal {
        return Err(check_false(
            "rope_mode_ == RoPEMode::kNormal",
            "The RoPE mode must be normal to support RoPE extension factors.",
        ));
    }
    Ok((rope_mode, rotary_scale, rotary_theta, rope_ext_factors))
}

/// The dtype and device of the cache, from the `init` tensor at `slot`.
pub(super) fn init(args: &[&Value], slot: usize) -> Result<(DataType, Device), KvCacheError> {
    match get(args, slot)? {
        Value::Tensor(t) => Ok((t.dtype(), t.device())),
        v => Err(arg_err(slot, format!("expected a tensor (the dtype and device of the cache), got {}", v.kind()))),
    }
}

/// The page count TVM gives a cache of these sizes.
pub(super) fn num_total_pages(s: &Sizes) -> i64 {
    let mut n = (s.total_token_capacity + s.page_size - 1) / s.page_size + 1;
    if s.sliding_requested {
        // TVM: a sequence with a sliding window may use two more pages at most.
        n += s.reserved_num_seqs * 2;
    }
    n
}

/// Checks and reads the create call's arguments (TVM 0.20 to 0.27: backends as tuples).
pub(super) fn parse(vm: &VirtualMachine, args: &[&Value]) -> Result<(CacheConfig, Kernels), KvCacheError> {
    decode(args, &mut |args, i| kernel(vm, args, i))
}

/// [`parse`] with `kernel` giving the kernel at a slot.
pub(super) fn decode<K>(
    args: &[&Value],
    kernel: &mut KernelAt<'_, K>,
) -> Result<(CacheConfig, Kernels<K>), KvCacheError> {
    if args.len() != 28 && args.len() != 29 {
        return Err(KvCacheError::Check(format!(
            "Check failed: (args.size() == 28 || args.size() == 29) is false: Invalid number of KV cache constructor args: {}",
            args.len()
        )));
    }
    let sizes = sizes(args, &[5, 6])?;
    let Sizes { num_layers, sliding_requested, .. } = sizes;
    let layer_sliding_window_size = sizes.layer_sliding_window_size;
    let (num_qo_heads, num_kv_heads, qk_head_dim, v_head_dim) = heads(args, [2, 3, 4, 5])?;
    let kinds = shape(args, 6)?;
    if kinds.len() as i64 != num_layers {
        return Err(arg_err(6, format!("{} attention kinds for {num_layers} layers", kinds.len())));
    }
    let attn_kinds = kinds
        .iter()
        .map(|&k| match k {
            0 => Ok(AttnKind::Mha),
            3 => Ok(AttnKind::MhaSliding),
            kind => Err(KvCacheError::from(UnsupportedFeature::AttentionKind { kind })),
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
        return Err(UnsupportedFeature::KvTransfer.into());
    }
    let (rope_mode, rotary_scale, rotary_theta, rope_ext_factors) = rope(args, [8, 9, 10, 11], sliding_requested)?;
    let (dtype, device) = init(args, 12)?;
    let transpose_append = match get(args, 13)? {
        Value::Null => return Err(arg_err(13, "an MHA cache needs the transpose-append function")),
        _ => kernel(args, 13)?,
    };
    let missing = |i: usize, what: &str| arg_err(i, format!("the {what} kernel is not given"));
    let prefill_ragged = backend(kernel, args, 15, "ragged prefill")?.ok_or_else(|| missing(15, "ragged prefill"))?;
    let prefill = backend(kernel, args, 16, "paged prefill")?.ok_or_else(|| missing(16, "paged prefill"))?;
    let decode = backend(kernel, args, 17, "paged decode")?.ok_or_else(|| missing(17, "paged decode"))?;
    let (prefill_sliding, decode_sliding) = if support_sliding_window || support_layer_sliding_window {
        (
            Some(
                backend(kernel, args, 18, "sliding-window paged prefill")?
                    .ok_or_else(|| missing(18, "sliding-window paged prefill"))?,
            ),
            Some(
                backend(kernel, args, 19, "sliding-window paged decode")?
                    .ok_or_else(|| missing(19, "sliding-window paged decode"))?,
            ),
        )
    } else {
        (None, None)
    };
    let merge = match get(args, 23)? {
        Value::Tuple(t) => match tuple_items(t).first() {
            Some(first) => {
                kernel(&[first], 0).map_err(|_| arg_err(23, "the merge function is not a kernel of the library"))?
            }
            None => {
                return Err(KvCacheError::Check(
                    "Check failed: (!f_merge_inplace.empty()) is false: Merge inplace function is not defined.".into(),
                ))
            }
        },
        v => return Err(arg_err(23, format!("expected a tuple of merge functions, got {}", v.kind()))),
    };
    let split_rotary = kernel(args, 24)?;
    let copy_single_page = kernel(args, 25)?;
    let debug_get_kv = kernel(args, 26)?;
    Ok((
        CacheConfig {
            page_size: sizes.page_size,
            num_layers,
            num_qo_heads,
            num_kv_heads,
            qk_head_dim,
            v_head_dim,
            reserved_num_seqs: sizes.reserved_num_seqs,
            num_total_pages: num_total_pages(&sizes),
            prefill_chunk_size: sizes.prefill_chunk_size,
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
            depth_arg: false,
        },
    ))
}

/// The kernel "at" a slot as the id of its `Value::Func`, for the layout tests.
#[cfg(test)]
pub(super) fn func_id(args: &[&Value], i: usize) -> Result<u32, KvCacheError> {
    match get(args, i)? {
        Value::Func(f) => Ok(*f),
        v => Err(arg_err(i, format!("not a function: {}", v.kind()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(items: Vec<Value>) -> Value {
        Value::tuple(items)
    }

    fn backend_of(tag: &str, f: u32) -> Value {
        tuple(vec![Value::Str(tag.as_bytes().into()), Value::Func(f)])
    }

    /// The create call MLC-LLM's CPU libraries make with TVM 0.20 to 0.27 (`mblob inspect` of
    /// tests/fixtures/mlc/qwen2-q0f32 shows it; `python/tvm/relax/frontend/nn/llm/kv_cache.py`
    /// writes it): `config` in slot 0, `kinds` in slot 6, kernels as `Value::Func(100 + slot)`,
    /// backends tagged `tag`.
    fn tvm027_args(config: &[i64], kinds: &[i64], tag: &str) -> Vec<Value> {
        let init = NdArray::empty(&[], DataType::F32, Device::cpu(0)).unwrap();
        let mut v = vec![
            Value::Shape(config.into()),
            Value::Shape([0, kinds.len() as i64].into()),
            Value::Int(4),
            Value::Int(2),
            Value::Int(64),
            Value::Int(64),
            Value::Shape(kinds.into()),
            Value::Int(0),
            Value::Int(1),
            Value::Float(1.0),
            Value::Float(1e6),
            Value::Int(0),
            Value::Tensor(init),
            Value::Func(113),
            Value::Func(114),
        ];
        v.extend((15..22).map(|i| backend_of(tag, 100 + i)));
        v.push(tuple(Vec::new()));
        v.push(tuple(vec![Value::Func(123)]));
        v.extend((24..28).map(|i| Value::Func(100 + i)));
        v
    }

    fn decoded(args: &[Value]) -> Result<(CacheConfig, Kernels<u32>), KvCacheError> {
        let refs: Vec<&Value> = args.iter().collect();
        decode(&refs, &mut func_id)
    }

    #[test]
    fn tvm_020_to_027_layout_with_either_backend_tag() {
        for tag in ["tirx", "tir"] {
            let (c, k) = decoded(&tvm027_args(&[4, 256, 16, 16, 0], &[0, 0], tag)).unwrap();
            assert_eq!((c.num_layers, c.num_qo_heads, c.num_kv_heads, c.qk_head_dim), (2, 4, 2, 64));
            assert_eq!(c.num_total_pages, 256 / 16 + 1);
            assert_eq!([k.transpose_append, k.prefill_ragged, k.prefill, k.decode], [113, 115, 116, 117]);
            assert_eq!([k.merge, k.split_rotary, k.copy_single_page, k.debug_get_kv], [123, 124, 125, 126]);
            assert!(!k.depth_arg && k.prefill_sliding.is_none());
        }
        let e = decoded(&tvm027_args(&[4, 256, 16, 16, 0], &[0, 0], "flashinfer")).unwrap_err();
        assert!(e.to_string().contains("`flashinfer` attention backend"), "{e}");
    }

    #[test]
    fn sliding_windows_per_sequence_and_per_layer() {
        // Mistral: support_sliding_window = 1: inline RoPE, the sliding kernels, 2 pages more
        // per sequence.
        let (c, k) = decoded(&tvm027_args(&[4, 256, 16, 16, 1], &[0, 0], "tirx")).unwrap();
        assert!(c.support_sliding_window && !c.support_layer_sliding_window);
        assert_eq!((c.rope_mode, c.num_total_pages), (RopeMode::Inline, 17 + 8));
        assert_eq!((k.prefill_sliding, k.decode_sliding), (Some(118), Some(119)));
        // Gemma 3: kind 3 layers turn the per-sequence window off (RoPE still inline, as TVM
        // decides on the requested flag); the window from the sixth field, 1024 without it.
        let (c, _) = decoded(&tvm027_args(&[4, 256, 16, 16, 1, 512], &[3, 0], "tirx")).unwrap();
        assert!(!c.support_sliding_window && c.support_layer_sliding_window);
        assert_eq!((c.layer_sliding_window_size, c.rope_mode), (512, RopeMode::Inline));
        assert_eq!(c.attn_kinds, [AttnKind::MhaSliding, AttnKind::Mha]);
        let (c, _) = decoded(&tvm027_args(&[4, 256, 16, 16, 0], &[3, 3], "tirx")).unwrap();
        assert_eq!((c.layer_sliding_window_size, c.rope_mode), (1024, RopeMode::Normal));
        let e = decoded(&tvm027_args(&[4, 256, 16, 16, 0, 0], &[3, 0], "tirx")).unwrap_err();
        assert!(e.to_string().contains("Per-layer sliding window size must be positive."), "{e}");
    }

    #[test]
    fn unsupported_kinds_are_refused_naming_them() {
        for (kinds, word) in [([1, 1], "multi-head latent attention (MLA)"), ([0, 2], "linear attention")] {
            let e = decoded(&tvm027_args(&[4, 256, 16, 16, 0], &kinds, "tirx")).unwrap_err();
            assert!(matches!(e, KvCacheError::Unsupported(UnsupportedFeature::AttentionKind { .. })), "{e}");
            assert!(e.to_string().contains(word), "{e}");
        }
        let mut a = tvm027_args(&[4, 256, 16, 16, 0], &[0, 0], "tirx");
        a[7] = Value::Int(1);
        assert!(decoded(&a).unwrap_err().to_string().contains("disaggregation"));
        a[7] = Value::Int(0);
        a[1] = Value::Shape([0, 1, 2].into());
        assert!(decoded(&a).unwrap_err().to_string().contains("Disco"));
        let e = decoded(&tvm027_args(&[4, 256, 16, 16], &[0, 0], "tirx")).unwrap_err();
        assert!(e.to_string().contains("five legacy fields"), "{e}");
    }
}
