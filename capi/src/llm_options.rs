//! `mblob_llm_options`: what `mblob_llm_new_with_options` takes beyond the library and the
//! weights: the KV cache's sizes, what `_metadata` gives for a library without it (a library
//! built with TVM's `nn.llm` directly), and the OpenCL program cache. Versioned by its size, as
//! the caller compiled it: a later mblob that adds fields reads an older caller's struct, the
//! fields it lacks left at their defaults.

use std::ffi::c_char;

use crate::status::{mblob_status, Failure, Result};

/// A field of `mblob_llm_options` that is not given: its default (the library's `_metadata`,
/// or the default the field's documentation names) applies. `INT64_MIN`.
pub const MBLOB_LLM_UNSET: i64 = i64::MIN;

/// The options of `mblob_llm_new_with_options`. Fill it with
/// `mblob_llm_options_init(&options, sizeof(options))` (which sets `struct_size` and every
/// field to its default), then set the fields you need. A size
/// given to a library that has `_metadata` must agree with it (else `MBLOB_ERR_INVALID_ARGUMENT`,
/// naming the field).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct mblob_llm_options {
    /// `sizeof(mblob_llm_options)` as the caller compiled it (`mblob_llm_options_init` sets it):
    /// the version of the struct.
    pub struct_size: usize,
    /// Tokens per page of the paged KV cache; `MBLOB_LLM_UNSET`: 16 (MLC-LLM's).
    pub page_size: i64,
    /// Tokens the KV cache holds in all; `MBLOB_LLM_UNSET`: the context window.
    pub max_total_seq_len: i64,
    /// The longest prefill chunk; `MBLOB_LLM_UNSET`: the metadata's, else the context window
    /// (or the cache's size), at most 8192.
    pub prefill_chunk_size: i64,
    /// Size the KV cache from a memory budget (bytes for its pages) when `max_total_seq_len`
    /// is unset, as MLC-LLM's engine does; `MBLOB_LLM_UNSET`: none. Negative: refused.
    pub kv_cache_bytes: i64,
    /// The longest sequence (`context_window_size`); -1 for a sliding-window model, which then
    /// needs `max_total_seq_len` or `kv_cache_bytes`. Without `_metadata` it (or a cache size)
    /// is needed.
    pub context_window_size: i64,
    /// The most sequences of one batch; `MBLOB_LLM_UNSET`: the metadata's, else 1.
    pub max_batch_size: i64,
    /// The sliding window each sequence gets; `MBLOB_LLM_UNSET`: the metadata's, else none.
    pub sliding_window_size: i64,
    /// The attention sinks kept in front of the sliding window; `MBLOB_LLM_UNSET`: the
    /// metadata's, else 0.
    pub attention_sink_size: i64,
    /// The vocabulary size; `MBLOB_LLM_UNSET`: the metadata's, else the length of the logits.
    pub vocab_size: i64,
    /// On OpenCL, a file of the kernels' program binaries in TVM's layout
    /// (`opencl.GetPreCompiledPrograms`): loaded when it exists, else written after the
    /// programs are built, as MLC-LLM's engine does. NULL: none. Not used on other devices.
    pub opencl_program_cache: *const c_char,
}

impl Default for mblob_llm_options {
    fn default() -> mblob_llm_options {
        mblob_llm_options {
            struct_size: std::mem::size_of::<mblob_llm_options>(),
            page_size: MBLOB_LLM_UNSET,
            max_total_seq_len: MBLOB_LLM_UNSET,
            prefill_chunk_size: MBLOB_LLM_UNSET,
            kv_cache_bytes: MBLOB_LLM_UNSET,
            context_window_size: MBLOB_LLM_UNSET,
            max_batch_size: MBLOB_LLM_UNSET,
            sliding_window_size: MBLOB_LLM_UNSET,
            attention_sink_size: MBLOB_LLM_UNSET,
            vocab_size: MBLOB_LLM_UNSET,
            opencl_program_cache: std::ptr::null(),
        }
    }
}

/// The struct sizes this library reads: each version's `sizeof(mblob_llm_options)` (one so
/// far). A later version appends fields and adds its size here.
const KNOWN_SIZES: [usize; 1] = [std::mem::size_of::<mblob_llm_options>()];

/// Writes the default options to the `struct_size` bytes at `options`: `struct_size` itself,
/// every size `MBLOB_LLM_UNSET`, `opencl_program_cache` NULL. Pass
/// `sizeof(mblob_llm_options)`, the size of the struct of the header the caller was compiled
/// with (a library of a later version then writes only that version's fields). A size of no
/// version this library knows: `MBLOB_ERR_INVALID_ARGUMENT`, nothing written.
///
/// # Safety
/// `options` is NULL or points to `struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn mblob_llm_options_init(options: *mut mblob_llm_options, struct_size: usize) -> mblob_status {
    crate::call::call(|| {
        crate::status::not_null(options, "options")?;
        known_size(struct_size, "struct_size")?;
        let defaults = mblob_llm_options { struct_size, ..mblob_llm_options::default() };
        // SAFETY: not NULL; the caller passes `struct_size` writable bytes, and `struct_size`
        // is a known version's size (at most ours, a whole number of fields).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&defaults as *const mblob_llm_options).cast::<u8>(),
                options.cast::<u8>(),
                struct_size,
            )
        };
        Ok(())
    })
}

/// Refuses a struct size of no version this library knows.
fn known_size(size: usize, what: &str) -> Result<()> {
    if KNOWN_SIZES.contains(&size) {
        return Ok(());
    }
    Err(Failure::new(
        mblob_status::MBLOB_ERR_INVALID_ARGUMENT,
        format!(
            "{what} is {size}, not the size of a mblob_llm_options this libmblob knows ({}): pass \
             sizeof(mblob_llm_options) to mblob_llm_options_init",
            KNOWN_SIZES.map(|s| s.to_string()).join(", ")
        ),
    ))
}

/// Reads the caller's options (NULL: the defaults): the prefix of `struct_size` bytes, a size
/// of a version this library knows, the fields past it left at their defaults.
///
/// # Safety
/// `options` is NULL or points to a readable struct of `options->struct_size` bytes.
pub(crate) unsafe fn read(options: *const mblob_llm_options) -> Result<mblob_llm_options> {
    let mut out = mblob_llm_options::default();
    if options.is_null() {
        return Ok(out);
    }
    // SAFETY: not NULL; every version of the struct starts with `struct_size`.
    let size = unsafe { options.cast::<usize>().read() };
    known_size(size, "options->struct_size")?;
    // SAFETY: the caller's struct has `size` readable bytes, `size` is a known version's
    // size (at most ours, a whole number of fields), and every field takes any bit pattern.
    unsafe {
        std::ptr::copy_nonoverlapping(options.cast::<u8>(), (&mut out as *mut mblob_llm_options).cast::<u8>(), size)
    };
    Ok(out)
}

/// A field as an option: `None` when unset.
#[cfg(feature = "llm")]
pub(crate) fn given(v: i64) -> Option<i64> {
    (v != MBLOB_LLM_UNSET).then_some(v)
}
