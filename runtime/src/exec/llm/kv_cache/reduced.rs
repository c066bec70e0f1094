//! `vm.builtin.paged_attention_kv_cache_create_reduced`, the create call of libraries built with
//! TVM 0.18 and 0.19 (removed in 0.20): the TIR kernels as plain functions at fixed slots, read
//! from TVM's sources at v0.18.0 and v0.19.0 (`src/runtime/relax_vm/paged_kv_cache.cc`):
//!
//! | slot | argument |
//! |---|---|
//! | 0 | cache_config: reserved_num_seqs, total_token_capacity, prefill_chunk_size, page_size, support_sliding_window |
//! | 1 | layer partition `[0, num_layers]` |
//! | 2, 3, 4 | query heads, KV heads, head dim (one, MHA only) |
//! | 5, 6, 7 | RoPE mode, scale, theta |
//! | 8 | `init`: the dtype and device of the cache |
//! | 9 | transpose-append |
//! | 10, 11 | paged prefill, paged decode (their first parameter is the depth, `_0: int32`) |
//! | 12, 13 | the sliding-window variants of 10 and 11 |
//! | 14 | ragged prefill |
//! | 15 | merge of partial attentions (one function) |
//! | 16, 17, 18 | split-rotary, copy-single-page, debug-get-kv |
//! | 19 | compact copy |
//! | 20, 21 | token-tree prefill, ragged and paged |
//! | 22 | RoPE extension factors (a tensor, or 0), from 23 arguments on (TVM 0.18 may omit it) |
//! | 23 | enable_kv_transfer (TVM 0.19, optional) |
//!
//! The cache then runs as in TVM 0.27, which kept these kernels' conventions (the attention's
//! last scalar, TVM 0.19's `attn_score_scaling_factor`, is passed through as given). TVM 0.17's
//! reduced call (19 to 21 arguments, the layer count an integer in slot 1) and the FlashInfer
//! create calls of 0.17 to 0.19 are refused, naming them.

use super::config::{arg_err, get, heads, init, int, kernel, num_total_pages, rope, sizes};
use super::config::{AttnKind, CacheConfig, KernelAt, Kernels};
use super::error::{KvCacheError, UnsupportedFeature};
use crate::exec::relax::vm::value::Value;
use crate::exec::relax::vm::VirtualMachine;

/// Reads the reduced create call of TVM 0.18 or 0.19, with the library's kernels.
pub(super) fn parse(vm: &VirtualMachine, args: &[&Value]) -> Result<(CacheConfig, Kernels), KvCacheError> {
    decode(args, &mut |args, i| kernel(vm, args, i))
}

/// [`parse`] with `kernel` giving the kernel at a slot.
pub(super) fn decode<K>(
    args: &[&Value],
    kernel: &mut KernelAt<'_, K>,
) -> Result<(CacheConfig, Kernels<K>), KvCacheError> {
    if (19..=21).contains(&args.len()) && matches!(args.get(1), Some(Value::Int(_))) {
        return Err(UnsupportedFeature::Tvm017Create { args: args.len() }.into());
    }
    if !(22..=24).contains(&args.len()) {
        return Err(KvCacheError::Check(format!(
            "Check failed: (args.size() == 23 || args.size() == 24) is false: Invalid number of KV cache constructor args. (got {}; TVM 0.18 takes 22 or 23)",
            args.len()
        )));
    }
    let sizes = sizes(args, &[5])?;
    let (num_qo_heads, num_kv_heads, head_dim, _) = heads(args, [2, 3, 4, 4])?;
    let (rope_mode, rotary_scale, rotary_theta, rope_ext_factors) = rope(args, [5, 6, 7, 22], sizes.sliding_requested)?;
    let (dtype, device) = init(args, 8)?;
    if args.len() == 24 && int(args, 23)? != 0 {
        return Err(UnsupportedFeature::KvTransfer.into());
    }
    if matches!(get(args, 18)?, Value::Null) {
        return Err(arg_err(18, "the debug-get-kv kernel is not given (mblob needs it)"));
    }
    let sliding = sizes.sliding_requested;
    let kernels = Kernels {
        transpose_append: kernel(args, 9)?,
        prefill: kernel(args, 10)?,
        decode: kernel(args, 11)?,
        prefill_sliding: if sliding { Some(kernel(args, 12)?) } else { None },
        decode_sliding: if sliding { Some(kernel(args, 13)?) } else { None },
        prefill_ragged: kernel(args, 14)?,
        merge: kernel(args, 15)?,
        split_rotary: kernel(args, 16)?,
        copy_single_page: kernel(args, 17)?,
        debug_get_kv: kernel(args, 18)?,
        depth_arg: true,
    };
    let config = CacheConfig {
        page_size: sizes.page_size,
        num_layers: sizes.num_layers,
        num_qo_heads,
        num_kv_heads,
        qk_head_dim: head_dim,
        v_head_dim: head_dim,
        reserved_num_seqs: sizes.reserved_num_seqs,
        num_total_pages: num_total_pages(&sizes),
        prefill_chunk_size: sizes.prefill_chunk_size,
        attn_kinds: vec![AttnKind::Mha; sizes.num_layers as usize],
        support_sliding_window: sliding,
        support_layer_sliding_window: false,
        layer_sliding_window_size: 1024,
        rope_mode,
        rotary_scale,
        rotary_theta,
        rope_ext_factors,
        dtype,
        device,
    };
    Ok((config, kernels))
}

/// Whether a `paged_attention_kv_cache_create` call has TVM 0.17 to 0.19's layout (plain
/// functions; slot 6 the RoPE scale, not the attention kinds), which only FlashInfer caches
/// used (TIR caches used the reduced call).
pub(super) fn is_old_flashinfer_create(args: &[&Value]) -> bool {
    (25..=30).contains(&args.len()) && !matches!(args.get(6), Some(Value::Shape(_)))
}

#[cfg(test)]
mod tests {
    use super::super::config::func_id;
    use super::*;
    use crate::array::NdArray;
    use crate::device::Device;
    use crate::format::DataType;

    /// The arguments TVM 0.19's `TIRPagedKVCache` passes (`python/tvm/relax/frontend/nn/llm/
    /// kv_cache.py` at v0.19.0), `n` of them, with function slots as `Value::Func(100 + slot)`.
    fn tvm019_args(n: usize, sliding: i64, rope_mode: i64, ext: Option<NdArray>) -> Vec<Value> {
        let init = NdArray::empty(&[], DataType::F32, Device::cpu(0)).unwrap();
        let mut v = vec![
            Value::Shape([4, 512, 64, 16, sliding].into()),
            Value::Shape([0, 3].into()),
            Value::Int(8),
            Value::Int(2),
            Value::Int(32),
            Value::Int(rope_mode),
            Value::Float(1.0),
            Value::Float(10000.0),
            Value::Tensor(init),
        ];
        v.extend((9..22).map(|i| Value::Func(100 + i as u32)));
        v.push(ext.map_or(Value::Int(0), Value::Tensor));
        v.push(Value::Int(0));
        v.truncate(n);
        v
    }

    fn decoded(args: &[Value]) -> Result<(CacheConfig, Kernels<u32>), KvCacheError> {
        let refs: Vec<&Value> = args.iter().collect();
        decode(&refs, &mut func_id)
    }

    #[test]
    fn tvm_019_and_018_reduced_layouts_are_read_slot_by_slot() {
        for n in [22, 23, 24] {
            let (c, k) = decoded(&tvm019_args(n, 0, 1, None)).unwrap();
            assert_eq!((c.num_layers, c.num_qo_heads, c.num_kv_heads, c.qk_head_dim, c.v_head_dim), (3, 8, 2, 32, 32));
            assert_eq!((c.page_size, c.prefill_chunk_size, c.reserved_num_seqs), (16, 64, 4));
            // TVM: ceil(512 / 16) + 1 pages.
            assert_eq!(c.num_total_pages, 33);
            assert_eq!((c.rope_mode, c.rotary_theta), (super::super::RopeMode::Normal, 10000.0));
            assert_eq!([k.transpose_append, k.prefill, k.decode, k.prefill_ragged, k.merge], [109, 110, 111, 114, 115]);
            assert_eq!([k.split_rotary, k.copy_single_page, k.debug_get_kv], [116, 117, 118]);
            assert!(k.depth_arg && k.prefill_sliding.is_none());
        }
    }

    #[test]
    fn tvm_019_sliding_window_takes_the_sliding_kernels_and_inline_rope() {
        let (c, k) = decoded(&tvm019_args(24, 1, 1, None)).unwrap();
        assert_eq!((k.prefill_sliding, k.decode_sliding), (Some(112), Some(113)));
        assert_eq!(c.rope_mode, super::super::RopeMode::Inline);
        // Two more pages per sequence.
        assert_eq!(c.num_total_pages, 33 + 8);
    }

    #[test]
    fn tvm_019_extension_factors_and_refusals() {
        let ext = NdArray::from_f32(&[1.0; 16], &[16], Device::cpu(0)).unwrap();
        let (c, _) = decoded(&tvm019_args(23, 0, 1, Some(ext.clone()))).unwrap();
        assert!(c.rope_ext_factors.is_some());
        let e = decoded(&tvm019_args(23, 0, 2, Some(ext))).unwrap_err();
        assert!(e.to_string().contains("The RoPE mode must be normal"), "{e}");
        let mut a = tvm019_args(24, 0, 1, None);
        a[23] = Value::Int(1);
        assert!(decoded(&a).unwrap_err().to_string().contains("KV transfer"));
        let e = decoded(&tvm019_args(21, 0, 1, None)).unwrap_err();
        assert!(e.to_string().contains("Invalid number of KV cache constructor args"), "{e}");
        let mut a = tvm019_args(21, 0, 1, None);
        a[1] = Value::Int(3);
        assert!(decoded(&a).unwrap_err().to_string().contains("TVM 0.17"));
        let mut a = tvm019_args(24, 0, 1, None);
        a[0] = Value::Shape([4, 512, 64, 16, 0, 1024].into());
        assert!(decoded(&a).is_err(), "TVM 0.19 has five cache-config fields");
    }
}
