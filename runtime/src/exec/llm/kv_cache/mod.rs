//! TVM's paged KV cache (`relax.vm.PagedAttentionKVCache`, TVM 0.27's
//! `src/runtime/vm/paged_kv_cache.cc`) for LLMs compiled with TIR attention kernels, for the
//! CPU or a GPU (OpenCL, CUDA), and the `vm.builtin.kv_state_*` /
//! `vm.builtin.attention_kv_cache_*` builtins on it.
//!
//! The cache lives on the device of the VM that creates it (the `init` tensor the library
//! passes to `vm.builtin.paged_attention_kv_cache_create` is allocated there): the pages, the
//! scratch tensors of the attention and the auxiliary arrays of each round, which are computed
//! on the host in `kv_state_begin_forward` and copied to the device once per round, as TVM's
//! aux data managers copy their host staging buffers. A GPU library's kernels
//! (`TIRPagedKVCache` for a GPU target: `batch_prefill_paged_kv`, `batch_decode_paged_kv`,
//! `copy_single_page`, ...) take the same parameters as the CPU ones and are called the same
//! way; they launch on the device through the library's host code. One exception: on OpenCL
//! the partial attentions of two block depths are merged on the host (TVM's
//! `merge_state_inplace` computed in Rust), since the GPU library's merge kernel has the
//! work-items of a head read and rewrite its log-sum-exp without a barrier, which is right only
//! where they run in lockstep (a GPU), not where they run one after another (pocl).
//!
//! A model library made as MLC-LLM makes them has a VM function `create_tir_paged_kv_cache`
//! that calls `vm.builtin.paged_attention_kv_cache_create` with the cache's configuration and
//! the library's own kernels (attention over pages, RoPE, page copies, merging of partial
//! attentions). The cache ([`PagedKvCache`]) keeps the keys and values of every layer in pages
//! and TVM's bookkeeping of sequences, blocks and pages, so that a sequence can be forked
//! (sharing its prefix), shortened (`popn`) and removed; each round of forwarding
//! (`kv_state_begin_forward`) computes the auxiliary arrays the kernels read, and each layer's
//! `attention_kv_cache_attention_with_fused_qkv` calls the kernels with them, as TVM does, so
//! that the model gives TVM's logits.
//!
//! The host drives it as MLC-LLM's runtime does, with
//! [`VirtualMachine::invoke`](crate::exec::relax::VirtualMachine::invoke):
//!
//! ```no_run
//! # use mblob_runtime::exec::relax::VirtualMachine;
//! # use mblob_runtime::exec::Value;
//! # fn f(vm: &VirtualMachine, embedding: Value) -> Result<(), Box<dyn std::error::Error>> {
//! let shape = |n: i64| Value::Shape(vec![n].into());
//! let cache = vm.invoke("create_tir_paged_kv_cache", &[shape(4), shape(128), shape(64), shape(16), shape(0)])?;
//! vm.invoke("vm.builtin.kv_state_add_sequence", &[cache.clone(), Value::Int(0)])?;
//! vm.invoke("vm.builtin.kv_state_begin_forward", &[cache.clone(), shape(0), shape(7)])?;
//! let out = vm.invoke("prefill", &[embedding, cache.clone()])?;
//! vm.invoke("vm.builtin.kv_state_end_forward", &[cache])?;
//! # Ok(()) }
//! ```
//!
//! Implemented: MHA layers, RoPE modes none/normal/inline and RoPE extension factors (Phi-3's
//! longrope), any number of sequences with shared prefixes (block depths and the merge of
//! partial attentions), `fork_sequence` at the end or inside a page, `popn` into a shared
//! prefix, `debug_get_kv`; sliding windows with attention sinks per sequence
//! (`support_sliding_window` and `attention_kv_cache_enable_sliding_window_for_seq`: Mistral),
//! with TVM's eviction of the pages that slid out, and per-layer sliding layers (attention kind
//! 3: Gemma 3). Refused with [`KvCacheError::Unsupported`]: token-tree attention, MLA and
//! linear attention, KV transfer, FlashInfer kernels. TVM's checks fail with
//! TVM's messages ([`KvCacheError::Check`]).

mod attention;
mod aux;
mod blocks;
mod config;
mod error;
mod reduced;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use config::{AttnKind, CacheConfig, RopeMode};
pub(crate) use error::{cmp_text, false_text};
pub use error::{KvCacheError, UnsupportedFeature};

use crate::array::NdArray;
use crate::device::Device;
use crate::format::DataType;
use crate::module::LoadedTree;

use crate::exec::relax::vm::value::{Args, ObjectRef, Value, VmError, VmObject};
use crate::exec::relax::vm::{call_kernel, BuiltinFn, VirtualMachine};
use aux::{AuxArrays, Batch};
use blocks::Table;
use config::Kernels;

/// TVM's type key of the cache.
pub const TYPE_KEY: &str = "relax.vm.PagedAttentionKVCache";

/// Scratch tensors of the attention, sized for the prefill chunk (TVM's `temp_attn_*`).
#[derive(Debug)]
struct Temp {
    q: NdArray,
    k: NdArray,
    v: NdArray,
    out: NdArray,
    lse: NdArray,
    merged_lse: NdArray,
}

/// What changes: the page table and the current round.
#[derive(Debug)]
struct State {
    table: Table,
    batch: Option<Batch>,
    aux: Option<AuxArrays>,
}

/// TVM's `PagedAttentionKVCache` with TIR kernels, on the CPU or a GPU. Shared between the VM's
/// registers and the host (an [`ObjectRef`]); its methods lock it.
#[derive(Debug)]
pub struct PagedKvCache {
    config: CacheConfig,
    kernels: Kernels,
    /// Per layer: `[num_pages, 2, num_kv_heads, page_size, head_dim]` (keys at 0, values at 1),
    /// on the cache's device.
    pages: Vec<NdArray>,
    temp: Temp,
    state: Mutex<State>,
    /// Keeps the library of the kernels loaded.
    _tree: LoadedTree,
}

impl VmObject for PagedKvCache {
    fn type_key(&self) -> &'static str {
        TYPE_KEY
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn empty(shape: &[i64], dtype: DataType, device: Device) -> Result<NdArray, VmError> {
    Ok(NdArray::empty(shape, dtype, device)?)
}

impl PagedKvCache {
    fn new(config: CacheConfig, kernels: Kernels, tree: LoadedTree) -> Result<PagedKvCache, VmError> {
        let c = &config;
        let page_shape = [c.num_total_pages, 2, c.num_kv_heads, c.page_size, c.qk_head_dim];
        let bytes = crate::array::tensor_bytes(c.dtype, &page_shape)
            .and_then(|b| b.checked_mul(c.num_layers as u64))
            .ok_or(VmError::Alloc(u64::MAX))?;
        // TVM would try; mblob refuses a cache it cannot hope to hold rather than aborting.
        if bytes > 1 << 40 {
            return Err(VmError::Alloc(bytes));
        }
        let dev = c.device;
        let pages = (0..c.num_layers).map(|_| empty(&page_shape, c.dtype, dev)).collect::<Result<Vec<_>, _>>()?;
        let chunk = c.prefill_chunk_size;
        let temp = Temp {
            q: empty(&[chunk, c.num_qo_heads, c.qk_head_dim], c.dtype, dev)?,
            k: empty(&[chunk, c.num_kv_heads, c.qk_head_dim], c.dtype, dev)?,
            v: empty(&[chunk, c.num_kv_heads, c.v_head_dim], c.dtype, dev)?,
            out: empty(&[chunk, c.num_qo_heads, c.v_head_dim], c.dtype, dev)?,
            lse: empty(&[chunk, c.num_qo_heads], DataType::F32, dev)?,
            merged_lse: empty(&[chunk, c.num_qo_heads], DataType::F32, dev)?,
        };
        let layer_window = c.support_layer_sliding_window.then_some(c.layer_sliding_window_size);
        let table = Table::new(c.page_size, c.num_total_pages, c.support_sliding_window, layer_window);
        let state = Mutex::new(State { table, batch: None, aux: None });
        Ok(PagedKvCache { config, kernels, pages, temp, state, _tree: tree })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Drops every sequence (TVM's `kv_state_clear`).
    pub fn clear(&self) {
        let mut s = self.lock();
        s.table.clear();
        s.batch = None;
        s.aux = None;
    }

    /// Adds an empty sequence.
    pub fn add_sequence(&self, seq_id: i64) -> Result<(), VmError> {
        Ok(self.lock().table.add_sequence(seq_id)?)
    }

    /// Removes a sequence, freeing the pages only it used.
    pub fn remove_sequence(&self, seq_id: i64) -> Result<(), VmError> {
        Ok(self.lock().table.remove_sequence(seq_id)?)
    }

    /// Forks `child_id` off `parent_id` at `fork_pos` (-1: at its end).
    pub fn fork_sequence(&self, parent_id: i64, child_id: i64, fork_pos: i64) -> Result<(), VmError> {
        let mut copy = |src, dst, len| self.copy_single_page(src, dst, len);
        self.lock().table.fork_sequence(parent_id, child_id, fork_pos, &mut copy)
    }

    /// Gives a sequence a sliding window of `window` positions after its first `sink` ones
    /// (TVM's `EnableSlidingWindowForSeq`): past the window, the positions between the sinks and
    /// the window are dropped and their pages freed. A cache created without sliding-window
    /// support refuses with TVM's error.
    pub fn enable_sliding_window(&self, seq_id: i64, window: i64, sink: i64) -> Result<(), VmError> {
        let supported = self.config.support_sliding_window || self.config.support_layer_sliding_window;
        Ok(self.lock().table.enable_sliding_window(seq_id, window, sink, supported)?)
    }

    /// Drops the last `n` positions of a sequence.
    pub fn popn(&self, seq_id: i64, n: i64) -> Result<(), VmError> {
        let mut copy = |src, dst, len| self.copy_single_page(src, dst, len);
        self.lock().table.popn(seq_id, n, &mut copy)
    }

    /// The library's `copy_single_page` over every layer.
    fn copy_single_page(&self, src: i32, dst: i32, len: i64) -> Result<(), VmError> {
        let k = &self.kernels.copy_single_page;
        for pages in &self.pages {
            let args =
                [Value::Tensor(pages.clone()), Value::Int(i64::from(src)), Value::Int(i64::from(dst)), Value::Int(len)];
            let refs: Vec<&Value> = args.iter().collect();
            call_kernel(&k.name, &k.f, &refs)?;
        }
        Ok(())
    }

    /// Starts a round: the sequences and how many tokens each appends.
    pub fn begin_forward(&self, seq_ids: &[i64], append_lengths: &[i64]) -> Result<(), VmError> {
        let _span = tracing::debug_span!("kv_cache_begin_forward", batch = seq_ids.len()).entered();
        let mut s = self.lock();
        s.batch = None;
        s.aux = None;
        let batch = s.table.begin_forward(seq_ids, append_lengths)?;
        s.batch = Some(batch);
        Ok(())
    }

    /// Ends a round (nothing to synchronise: the device runs the kernels in order, and reading
    /// a result back waits for them).
    pub fn end_forward(&self) {}

    /// Pages free.
    pub fn num_available_pages(&self) -> i64 {
        self.lock().table.free_pages.len() as i64
    }

    /// The sum of the sequences' lengths (a shared prefix counted once per sequence).
    pub fn total_sequence_length(&self) -> i64 {
        self.lock().table.seqs.values().map(|s| s.seq_length).sum()
    }

    /// A sequence's length.
    pub fn sequence_length(&self, seq_id: i64) -> Result<i64, VmError> {
        Ok(self.lock().table.seq(seq_id)?.seq_length)
    }

    /// Whether the cache holds no sequence and every page and block is free (TVM's `Empty`).
    pub fn is_empty(&self) -> bool {
        let s = self.lock();
        s.table.seqs.is_empty()
            && s.table.free_blocks.len() == s.table.blocks.len()
            && s.table.free_pages.len() as i64 == s.table.num_total_pages
    }
}

/// The KV cache builtins, by TVM's name.
pub(crate) const TABLE: &[(&str, BuiltinFn)] = &[
    ("vm.builtin.paged_attention_kv_cache_create", create),
    ("vm.builtin.paged_attention_kv_cache_create_reduced", create_reduced),
    ("vm.builtin.kv_state_clear", |_, n, a, _| {
        cache(n, a)?.clear();
        Ok(Value::Null)
    }),
    ("vm.builtin.kv_state_add_sequence", |_, n, a, _| {
        cache(n, a)?.add_sequence(Args::new(n, a).int(1)?).map(|_| Value::Null)
    }),
    ("vm.builtin.kv_state_remove_sequence", |_, n, a, _| {
        cache(n, a)?.remove_sequence(Args::new(n, a).int(1)?).map(|_| Value::Null)
    }),
    ("vm.builtin.kv_state_fork_sequence", |_, n, a, _| {
        let args = Args::new(n, a);
        let fork_pos = if a.len() > 3 { args.int(3)? } else { -1 };
        cache(n, a)?.fork_sequence(args.int(1)?, args.int(2)?, fork_pos).map(|_| Value::Null)
    }),
    ("vm.builtin.kv_state_popn", |_, n, a, _| {
        let args = Args::new(n, a);
        cache(n, a)?.popn(args.int(1)?, args.int(2)?).map(|_| Value::Null)
    }),
    ("vm.builtin.kv_state_begin_forward", begin_forward),
    ("vm.builtin.attention_kv_cache_enable_sliding_window_for_seq", |_, n, a, _| {
        let args = Args::new(n, a);
        cache(n, a)?.enable_sliding_window(args.int(1)?, args.int(2)?, args.int(3)?).map(|_| Value::Null)
    }),
    ("vm.builtin.kv_state_end_forward", |_, n, a, _| {
        cache(n, a)?.end_forward();
        Ok(Value::Null)
    }),
    ("vm.builtin.attention_kv_cache_get_num_available_pages", |_, n, a, _| {
        Ok(Value::Int(cache(n, a)?.num_available_pages()))
    }),
    ("vm.builtin.attention_kv_cache_get_total_sequence_length", |_, n, a, _| {
        Ok(Value::Int(cache(n, a)?.total_sequence_length()))
    }),
    ("vm.builtin.attention_kv_cache_get_sequence_length", |_, n, a, _| {
        cache(n, a)?.sequence_length(Args::new(n, a).int(1)?).map(Value::Int)
    }),
    ("vm.builtin.attention_kv_cache_empty", |_, n, a, _| Ok(Value::Int(i64::from(cache(n, a)?.is_empty())))),
    ("vm.builtin.attention_kv_cache_get_query_positions", |_, n, a, _| {
        cache(n, a)?.query_positions().map(Value::Tensor)
    }),
    ("vm.builtin.attention_kv_cache_debug_get_kv", |_, n, a, _| {
        let args = Args::new(n, a);
        let c = cache(n, a)?;
        c.debug_get_kv(args.int(1)?, args.int(2)?, args.int(3)?, args.tensor(4)?, args.tensor(5)?)?;
        Ok(Value::Null)
    }),
    ("vm.builtin.attention_kv_cache_attention_with_fused_qkv", |_, n, a, _| {
        let args = Args::new(n, a);
        let sm_scale = match args.get(2)? {
            Value::Float(f) => *f,
            Value::Int(i) => *i as f64,
            v => return Err(args.type_err(2, "a number (sm_scale)", v)),
        };
        cache(n, a)?.attention_with_fused_qkv(args.int(1)?, sm_scale, args.tensor(3)?, args.tensor(4)?)?;
        Ok(Value::Null)
    }),
];

/// Argument 0: the cache.
fn cache<'a>(name: &'a str, args: &'a [&'a Value]) -> Result<&'a PagedKvCache, VmError> {
    let a = Args::new(name, args);
    match a.get(0)? {
        Value::Object(o) => {
            o.downcast_ref::<PagedKvCache>().ok_or_else(|| a.type_err(0, "a relax.vm.PagedAttentionKVCache", args[0]))
        }
        v => Err(a.type_err(0, "a relax.vm.PagedAttentionKVCache", v)),
    }
}

fn create(vm: &VirtualMachine, _name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let _span = tracing::debug_span!("kv_cache_create").entered();
    if reduced::is_old_flashinfer_create(args) {
        return Err(KvCacheError::from(UnsupportedFeature::FlashInferCreate { args: args.len() }).into());
    }
    let (config, kernels) = config::parse(vm, args)?;
    let cache = PagedKvCache::new(config, kernels, vm.tree().clone())?;
    Ok(Value::Object(ObjectRef::new(cache)))
}

/// TVM 0.18 and 0.19's create call of a cache of TIR kernels.
fn create_reduced(vm: &VirtualMachine, _name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    let _span = tracing::debug_span!("kv_cache_create_reduced").entered();
    let (config, kernels) = reduced::parse(vm, args)?;
    let cache = PagedKvCache::new(config, kernels, vm.tree().clone())?;
    Ok(Value::Object(ObjectRef::new(cache)))
}

fn begin_forward(_vm: &VirtualMachine, name: &str, args: &[&Value], _depth: usize) -> Result<Value, VmError> {
    if args.len() != 3 && args.len() != 4 {
        return Err(KvCacheError::Check(format!(
            "Check failed: (args.size() == 3 || args.size() == 4) is false: KVState BeginForward only accepts 3 or 4 arguments (got {})",
            args.len()
        ))
        .into());
    }
    if args.len() == 4 && !matches!(args[3], Value::Null) {
        return Err(KvCacheError::from(UnsupportedFeature::TokenTree).into());
    }
    let c = cache(name, args)?;
    let a = Args::new(name, args);
    c.begin_forward(a.extents(1)?, a.extents(2)?)?;
    Ok(Value::Null)
}
