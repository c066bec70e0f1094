//! The attention of one layer (`vm.builtin.attention_kv_cache_attention_with_fused_qkv`) and
//! the read-back of keys and values (`debug_get_kv`), as TVM's `AttentionWithFusedQKV`,
//! `AttentionInternal` and `DebugGetKV` call the library's TIR kernels.

use smallvec::SmallVec;

use crate::array::NdArray;
use crate::device::DeviceType;
use crate::exec::relax::vm::call_kernel;
use crate::exec::relax::vm::value::{Value, VmError};
use crate::format::DataType;

use super::aux::{int32_array, AuxArrays, Batch};
use super::config::{AttnKind, Kernel, RopeMode};
use super::error::{check_cmp, check_false, unknown_sequence, KvCacheError, UnsupportedFeature};
use super::{PagedKvCache, State};

/// Calls a kernel with tensors and numbers.
fn run(k: &Kernel, args: &[Value]) -> Result<(), VmError> {
    let refs: SmallVec<[&Value; 16]> = args.iter().collect();
    call_kernel(&k.name, &k.f, &refs).map(|_| ())
}

/// Zeroes the 64 KiB of stack below the caller's frame, where the kernel called next puts its
/// frame. TVM 0.27's CPU paged-prefill kernel (`_attention_prefill_cpu` in
/// `python/tvm/relax/frontend/nn/llm/_prefill_kernels.py`) reads its running maximum `new_m`
/// before writing it when a row's first columns are masked, which happens only with the
/// per-layer window's mask (causal, sliding): it then computes with whatever its stack slot
/// held. Left from earlier calls that can be a NaN; zero leaves the softmax exact (any finite
/// start cancels), which is what TVM's runs give.
#[inline(never)]
fn scrub_stack() {
    let mut below = [0u8; 64 * 1024];
    std::hint::black_box(&mut below);
}

fn t(a: &NdArray) -> Value {
    Value::Tensor(a.clone())
}

fn view(a: &NdArray, shape: &[i64]) -> Result<NdArray, VmError> {
    Ok(a.view(shape, a.dtype())?)
}

/// TVM's `merge_state_inplace` on the host, for OpenCL: merges the partial attention
/// `v_other` (log-sum-exp `s_other`, base 2) into `v` (`s`) in place, `[n, heads, dim]` and
/// `[n, heads]`. The GPU library's merge kernel has the work-items of one head (one per
/// 4 features) each read `S[n, h]` and write the merged value back without a barrier between
/// them: right where a work-group's lanes run in lockstep (GPUs), wrong where work-items run one
/// after another (pocl on a CPU), where every lane after the first reads the merged value.
fn merge_on_host(v: &NdArray, s: &NdArray, v_other: &NdArray, s_other: &NdArray) -> Result<(), VmError> {
    if v.dtype() != DataType::F32 || v_other.dtype() != DataType::F32 {
        let dtype = crate::payload::relax::executable::dtype_name(v.dtype());
        return Err(KvCacheError::from(UnsupportedFeature::MergeDtype { dtype }).into());
    }
    let floats = |a: &NdArray| -> Result<Vec<f32>, VmError> {
        Ok(a.to_bytes()?.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    };
    let (mut vv, mut ss, vo, so) = (floats(v)?, floats(s)?, floats(v_other)?, floats(s_other)?);
    if ss.is_empty() || vv.len() != vo.len() || ss.len() != so.len() || vv.len() % ss.len() != 0 {
        return Err(check_false("V and S of the merge", "partial attentions of different shapes").into());
    }
    let dim = vv.len() / ss.len();
    for (i, (lse, lse_other)) in ss.iter_mut().zip(&so).enumerate() {
        let max = lse.max(*lse_other);
        let (a, b) = ((*lse - max).exp2(), (*lse_other - max).exp2());
        let (scale, other_scale) = (a / (a + b), b / (a + b));
        for (x, y) in vv[i * dim..(i + 1) * dim].iter_mut().zip(&vo[i * dim..(i + 1) * dim]) {
            *x = *x * scale + *y * other_scale;
        }
        *lse = (a + b).log2() + max;
    }
    let bytes = |f: &[f32]| f.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    v.copy_from_bytes(&bytes(&vv))?;
    s.copy_from_bytes(&bytes(&ss))?;
    Ok(())
}

impl PagedKvCache {
    /// Attention of layer `layer_id` for the round `begin_forward` started: splits the fused
    /// `qkv` ([tokens, qo_heads + 2 kv_heads, head_dim]) into queries, keys and values with
    /// RoPE applied, appends the keys and values to the pages, and writes the attention of
    /// each query over its sequence (the cached positions and the new ones, causally) into
    /// `o` ([tokens, qo_heads, head_dim]).
    pub fn attention_with_fused_qkv(
        &self,
        layer_id: i64,
        sm_scale: f64,
        qkv: &NdArray,
        o: &NdArray,
    ) -> Result<(), VmError> {
        let _span = tracing::trace_span!("kv_cache_attention", layer_id).entered();
        let c = &self.config;
        let mut guard = self.lock();
        let state: &mut State = &mut guard;
        if layer_id < 0 || layer_id >= c.num_layers {
            return Err(check_cmp("local_layer_id < num_layers_", layer_id, c.num_layers, "").into());
        }
        if qkv.device() != c.device || o.device() != c.device {
            return Err(KvCacheError::Check(format!(
                "attention with tensors on {} and {}, but the cache is on {}: the kernels read and write \
                 the cache's device",
                qkv.device(),
                o.device(),
                c.device
            ))
            .into());
        }
        if qkv.dtype() != c.dtype || o.dtype() != c.dtype {
            return Err(check_false("qkv_data.DataType() == pages.DataType()", "").into());
        }
        let (qs, os) = (qkv.shape(), o.shape());
        if qs.len() != 3 || os.len() != 3 {
            return Err(check_cmp("qkv_data->ndim == 3 && o_data->ndim", qs.len(), 3, "").into());
        }
        if qs[1] != c.num_qo_heads + 2 * c.num_kv_heads {
            return Err(check_cmp(
                "qkv_data->shape[1] == num_qo_heads_ + 2 * num_kv_heads_",
                qs[1],
                c.num_qo_heads + 2 * c.num_kv_heads,
                "",
            )
            .into());
        }
        if os[1] != c.num_qo_heads {
            return Err(check_cmp("o_data->shape[1] == num_qo_heads_", os[1], c.num_qo_heads, "").into());
        }
        if os[0] != qs[0] || os[2] != qs[2] {
            return Err(check_cmp("o_data->shape[0] == qkv_data->shape[0]", os[0], qs[0], "").into());
        }
        if qs[2] != c.qk_head_dim {
            return Err(check_cmp("qkv_data->shape[2] == qk_head_dim_", qs[2], c.qk_head_dim, "").into());
        }
        let Some(batch) = state.batch.as_ref() else {
            return Err(check_false("cur_batch_size_ > 0", "attention called before kv_state_begin_forward").into());
        };
        let total = batch.total_append_length();
        if total > qs[0] {
            return Err(check_cmp("total_seq_length <= qkv_data->shape[0]", total, qs[0], "").into());
        }
        if total > c.prefill_chunk_size {
            return Err(KvCacheError::Check(format!(
                "{total} tokens in one round exceed the prefill chunk size {} of the cache",
                c.prefill_chunk_size
            ))
            .into());
        }
        if state.aux.is_none() {
            state.aux =
                Some(AuxArrays::new(batch, c.device, c.support_sliding_window, c.support_layer_sliding_window)?);
        }
        let (Some(batch), Some(aux)) = (state.batch.as_ref(), state.aux.as_ref()) else {
            return Err(check_false("!dirty_aux_data_device_", "the auxiliary arrays of the round are missing").into());
        };
        let pages = &self.pages[layer_id as usize];

        let q = view(&self.temp.q, &[total, c.num_qo_heads, c.qk_head_dim])?;
        let k = view(&self.temp.k, &[total, c.num_kv_heads, c.qk_head_dim])?;
        let v = view(&self.temp.v, &[total, c.num_kv_heads, c.v_head_dim])?;
        let (qkv, o) = if total != qs[0] {
            (view(qkv, &[total, qs[1], qs[2]])?, view(o, &[total, c.num_qo_heads, c.qk_head_dim])?)
        } else {
            (qkv.clone(), o.clone())
        };
        let kern = &self.kernels;
        // With RoPE extension factors, `f_split_rotary` takes them in place of the RoPE flag.
        let rope = match &c.rope_ext_factors {
            Some(factors) => t(factors),
            None => Value::Int(i64::from(c.rope_mode == RopeMode::Normal)),
        };
        run(&kern.split_rotary, &[t(&qkv), t(&aux.q_rope_position_map), t(&q), t(&k), t(&v), rope])?;
        let append = || run(&kern.transpose_append, &[t(pages), t(&k), t(&v), t(&aux.append_position_map)]);
        if batch.append_before_attn {
            append()?;
        }
        let layer_sliding = c.attn_kinds[layer_id as usize] == AttnKind::MhaSliding;
        self.attention_internal(batch, aux, pages, layer_sliding, &q, &k, &v, &o, total, sm_scale)?;
        if !batch.append_before_attn {
            append()?;
        }
        Ok(())
    }

    /// TVM's `AttentionInternal`: the new tokens among themselves (ragged prefill, when they
    /// are not in the pages yet), then each depth of cached blocks, merged by log-sum-exp. A
    /// cache with sliding windows reads the cached blocks with the sliding-window kernels; a
    /// per-layer sliding layer (`layer_sliding`) reads only its window's pages, with TVM's fixed
    /// RoPE theta 10000 and scale 1 of those layers.
    #[allow(clippy::too_many_arguments)]
    fn attention_internal(
        &self,
        batch: &Batch,
        aux: &AuxArrays,
        pages: &NdArray,
        layer_sliding: bool,
        q: &NdArray,
        k: &NdArray,
        v: &NdArray,
        o: &NdArray,
        total: i64,
        sm_scale: f64,
    ) -> Result<(), VmError> {
        let c = &self.config;
        let kern = &self.kernels;
        let inline = Value::Int(i64::from(c.rope_mode == RopeMode::Inline));
        let sm = Value::Float(sm_scale);
        let (scale, theta) = (Value::Float(c.rotary_scale), Value::Float(c.rotary_theta));
        let merged_lse = self.temp.merged_lse.view(&[total, c.num_qo_heads], DataType::F32)?;
        let temp_out = view(&self.temp.out, &[total, c.num_qo_heads, c.v_head_dim])?;
        let temp_lse = self.temp.lse.view(&[total, c.num_qo_heads], DataType::F32)?;
        let mut is_first = true;
        if !batch.append_before_attn {
            is_first = false;
            run(
                &kern.prefill_ragged,
                &[
                    t(q),
                    t(&aux.cur_append_length_indptr),
                    t(k),
                    t(v),
                    t(&aux.cur_append_length_indptr),
                    t(&aux.q_rope_position_map),
                    t(&aux.k_ragged_rope_pos_offset),
                    t(o),
                    t(&merged_lse),
                    Value::Int(1),
                    inline.clone(),
                    scale.clone(),
                    theta.clone(),
                    sm.clone(),
                ],
            )?;
        }
        let self_computed = !is_first;
        let mut cross_computed = false;
        let sliding_kernels = c.support_sliding_window || layer_sliding;
        let (prefill, decode) = match (&kern.prefill_sliding, &kern.decode_sliding) {
            (Some(p), Some(d)) if sliding_kernels => (p, d),
            _ if sliding_kernels => {
                return Err(check_false("f_prefill != nullptr", "the sliding-window kernels are not given").into())
            }
            _ => (&kern.prefill, &kern.decode),
        };
        let causal = Value::Int(i64::from(!batch.append_before_attn && layer_sliding));
        for (d, arrays) in aux.depths.iter().enumerate() {
            let Some(page_indices) = &arrays.page_indices else { continue };
            let (out, lse) = if is_first { (o, &merged_lse) } else { (&temp_out, &temp_lse) };
            let window = if layer_sliding { arrays.sliding.as_ref() } else { None };
            let (page_indptr, page_indices, length_info, k_rope_pos_offset, scale, theta) = match window {
                Some(w) => (
                    &w.page_indptr,
                    &w.page_indices,
                    &w.length_info,
                    &w.k_rope_pos_offset,
                    Value::Float(1.0),
                    Value::Float(10000.0),
                ),
                None => (
                    &arrays.page_indptr,
                    page_indices,
                    &arrays.length_info,
                    &arrays.k_rope_pos_offset,
                    scale.clone(),
                    theta.clone(),
                ),
            };
            // TVM's decode and prefill kernels take the same paged arguments; the prefill kernel
            // also takes `qo_indptr` after `q`, and `causal` after the log-sum-exp.
            let use_decode = batch.use_decode_kernel[d];
            let mut args: SmallVec<[Value; 16]> = SmallVec::new();
            if kern.depth_arg {
                args.push(Value::Int(d as i64));
            }
            args.push(t(q));
            if !use_decode {
                args.push(t(&arrays.qo_indptr));
            }
            args.extend([
                t(pages),
                t(page_indptr),
                t(page_indices),
                t(length_info),
                t(k_rope_pos_offset),
                t(&aux.q_rope_position_map),
                t(out),
                t(lse),
            ]);
            if !use_decode {
                args.push(causal.clone());
            }
            args.extend([inline.clone(), scale, theta, sm.clone()]);
            if layer_sliding && !use_decode {
                scrub_stack();
            }
            run(if use_decode { decode } else { prefill }, &args)?;
            if is_first {
                is_first = false;
            } else if c.device.device_type == DeviceType::OpenCl {
                merge_on_host(o, &merged_lse, &temp_out, &temp_lse)?;
            } else {
                run(&kern.merge, &[t(o), t(&merged_lse), t(&temp_out), t(&temp_lse)])?;
            }
            cross_computed = true;
        }
        if !self_computed && !cross_computed {
            return Err(check_false(
                "self_attn_computed || cross_attn_computed",
                "Both self-attention and cross-attention are not computed.",
            )
            .into());
        }
        Ok(())
    }

    /// TVM's `DebugGetKV`: the keys (RoPE applied) and values of positions `start..end` of
    /// sequence `seq_id`, every layer, written into `k` and `v` ([layers, end - start,
    /// kv_heads, head_dim], the cache's dtype), on the cache's device (as TVM's kernel needs)
    /// or on the host (copied back from the device).
    pub fn debug_get_kv(&self, seq_id: i64, start: i64, end: i64, k: &NdArray, v: &NdArray) -> Result<(), VmError> {
        let c = &self.config;
        let state = self.lock();
        let seq = state.table.seqs.get(&seq_id).ok_or_else(|| unknown_sequence(seq_id))?;
        if start < 0 {
            return Err(check_cmp(
                "start_pos >= 0",
                start,
                0,
                format!("DebugGetKV does not accept negative start_pos {start}"),
            )
            .into());
        }
        if end > seq.seq_length {
            return Err(check_cmp(
                "end_pos <= seq.seq_length",
                end,
                seq.seq_length,
                "DebugGetKV does not accept out-of-range end_pos",
            )
            .into());
        }
        if start >= end {
            return Err(check_cmp(
                "start_pos < end_pos",
                start,
                end,
                "DebugGetKV does not accept \"start_pos >= end_pos\"",
            )
            .into());
        }
        let msg = "DebugGetKV expects the k_data in layout (num_layers, seq_length, num_kv_heads, qk_head_dim).";
        for a in [k, v] {
            let s = a.shape();
            let want = [c.num_layers, end - start, c.num_kv_heads, c.qk_head_dim];
            if s != want || a.dtype() != c.dtype {
                return Err(KvCacheError::Check(format!(
                    "{msg} Got shape {s:?} ({}), expected {want:?}",
                    crate::payload::relax::executable::dtype_name(a.dtype())
                ))
                .into());
            }
            if a.device() != c.device && !a.device().is_cpu() {
                return Err(KvCacheError::Check(format!(
                    "DebugGetKV writes into tensors on the cache's device ({}) or on the host, got one on {}",
                    c.device,
                    a.device()
                ))
                .into());
            }
        }
        let ps = c.page_size;
        let mut positions = Vec::with_capacity(seq.seq_length as usize);
        let unfilled = || {
            KvCacheError::Check(format!(
                "sequence {seq_id} has length {} but its pages hold fewer positions (a round that failed for want of pages)",
                seq.seq_length
            ))
        };
        for b in state.table.trace(seq) {
            let block = &state.table.blocks[b];
            for i in 0..block.seq_length {
                let offset = block.offset_of(i);
                let page = block.page_ids.get((offset / ps) as usize).ok_or_else(unfilled)?;
                positions.push(page * ps as i32 + (offset % ps) as i32);
            }
        }
        let positions = positions.get(start as usize..end as usize).ok_or_else(unfilled)?;
        let map = int32_array(positions, c.device)?;
        // The kernel writes on the cache's device: host tensors of a device cache get the
        // values through device tensors, copied back after the last layer.
        let on_device = |a: &NdArray| -> Result<NdArray, VmError> {
            if a.device() == c.device {
                Ok(a.clone())
            } else {
                Ok(NdArray::empty(a.shape(), a.dtype(), c.device)?)
            }
        };
        let (kd, vd) = (on_device(k)?, on_device(v)?);
        for (layer, pages) in self.pages.iter().enumerate() {
            run(&self.kernels.debug_get_kv, &[t(pages), t(&map), t(&kd), t(&vd), Value::Int(layer as i64)])?;
        }
        for (dev, host) in [(&kd, k), (&vd, v)] {
            if dev.device() != host.device() {
                dev.copy_to(host)?;
            }
        }
        Ok(())
    }

    /// The positions of the round's queries (TVM's `GetQueryPositions`), an `int32` tensor on
    /// the cache's device.
    pub fn query_positions(&self) -> Result<NdArray, VmError> {
        let mut state = self.lock();
        let Some(batch) = state.batch.as_ref() else {
            return Err(
                check_false("cur_batch_size_ > 0", "query positions asked before kv_state_begin_forward").into()
            );
        };
        let c = &self.config;
        let aux = AuxArrays::new(batch, c.device, c.support_sliding_window, c.support_layer_sliding_window)?;
        let positions = aux.q_rope_position_map.clone();
        state.aux = Some(aux);
        Ok(positions)
    }
}
