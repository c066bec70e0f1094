//! TVM's tensor cache of weights (`src/runtime/vm/tensor_cache_support.cc`): the directory
//! `tvm.contrib.tvmjs.dump_tensor_cache` writes (`tensor-cache.json` and its shard files) read
//! into named tensors, and the builtins that hand them to a model
//! (`vm.builtin.tensor_cache.*`, `vm.builtin.param_array_from_cache*`).
//!
//! `tensor-cache.json` lists shards (`dataPath`, `format` `"raw-shard"`, `nbytes`), each with
//! its records (`name`, `shape`, `dtype`, `format`, `nbytes`, `byteOffset`). Shards are mapped,
//! not read: on the CPU a weight whose bytes start 64-byte aligned in the shard (TVM's
//! `kAllocAlignment`) stays a view of the mapping (copy-on-write, so a kernel writing to it
//! never changes the file), and any other weight is copied once into its own tensor. Record
//! formats: `raw`, and `f32-to-bf16` (bfloat16 bytes of a `float32` tensor, widened on load,
//! as TVM does); others are refused by name.
//!
//! TVM's cache is process-global: the functions named after the builtins
//! ([`tensor_cache_load`], [`param_array_from_cache_by_name`], ...) use one [`TensorCache`]
//! behind a lock. A [`TensorCache`] value is the same thing owned by its caller.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::Deserialize;

use crate::array::{tensor_bytes, ArrayError, NdArray};
use crate::device::Device;
use crate::ffi::device_api::{HostFileMapping, Storage, CPU_ALIGNMENT};
use crate::format::DataType;

/// The tensor cache refused a directory, a shard or a request. Messages carry TVM's text
/// and name the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorCacheError {
    /// A file that cannot be opened, read or mapped (TVM: `Cannot open PATH`).
    #[error("Cannot open {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `tensor-cache.json` is not the JSON TVM writes.
    #[error("{}: Failed to parse JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Where and what.
        source: serde_path_to_error::Error<serde_json::Error>,
    },
    /// A shard whose length is not the `nbytes` the JSON gives.
    #[error(
        "Error when loading parameters from {}: Check failed: this->nbytes == raw_data_buffer->length() ({expected} vs. {found}) : Encountered an corrupted parameter shard. It means it is not downloaded completely or downloading is interrupted. Please try to download again.",
        path.display()
    )]
    ShardSize {
        /// The shard.
        path: PathBuf,
        /// Bytes the JSON gives.
        expected: i64,
        /// Bytes of the file.
        found: u64,
    },
    /// A shard format other than `raw-shard`.
    #[error("Error when loading parameters from {}: Only `raw-shard` format is supported (the shard's format is {format:?})", path.display())]
    ShardFormat {
        /// The shard.
        path: PathBuf,
        /// Its format.
        format: String,
    },
    /// A record whose bytes are not inside its shard.
    #[error("{}: parameter {name}: bytes {offset}..{offset}+{nbytes} lie outside the shard of {shard_len} bytes", path.display())]
    RecordBounds {
        /// The shard.
        path: PathBuf,
        /// The parameter.
        name: String,
        /// `byteOffset`.
        offset: i64,
        /// `nbytes`.
        nbytes: i64,
        /// Bytes of the shard.
        shard_len: u64,
    },
    /// A record whose `nbytes` is not what its shape, dtype and format need.
    #[error("{}: parameter {name}: {dtype} {shape:?} in format {format:?} needs {expected} bytes, the record gives {nbytes}", path.display())]
    RecordSize {
        /// The shard.
        path: PathBuf,
        /// The parameter.
        name: String,
        /// The dtype.
        dtype: DataType,
        /// The shape.
        shape: Vec<i64>,
        /// The record's format.
        format: String,
        /// Bytes needed.
        expected: u64,
        /// `nbytes`.
        nbytes: i64,
    },
    /// A record format mblob does not decode.
    #[error("{}: parameter {name}: unsupported encode format {format:?} for {dtype} (supported: \"raw\", \"f32-to-bf16\" for float32)", path.display())]
    Encoding {
        /// The shard.
        path: PathBuf,
        /// The parameter.
        name: String,
        /// The format.
        format: String,
        /// The dtype.
        dtype: String,
    },
    /// A dtype TVM's spelling does not name.
    #[error("{}: parameter {name}: unknown dtype {dtype:?}", path.display())]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The parameter.
        name: String,
        /// The dtype string.
        dtype: String,
    },
    /// `param_array_from_cache_by_name`: a name not in the cache.
    #[error("Cannot find parameter in cache: {name}")]
    NotInCache {
        /// The name.
        name: String,
    },
    /// `param_array_from_cache`: `PREFIX_I` not in the cache.
    #[error("Cannot find {name} in cache")]
    IndexedNotInCache {
        /// `PREFIX_I`.
        name: String,
    },
    /// `tensor_cache.update` without override of a name already there.
    #[error("Check failed: pool->pool_.count(name) == 0 (1 vs. 0) : Name {name} already exists in the cache")]
    Exists {
        /// The name.
        name: String,
    },
    /// `param_array_from_cache_by_name_unpacked`: an argument that is not a string.
    #[error("Expect string as input, but get {type_key} at {index}")]
    NotAString {
        /// The argument's position.
        index: usize,
        /// Its type key.
        type_key: String,
    },
    /// A weight could not be made on the device.
    #[error("{}: parameter {name}: {source}", path.display())]
    Array {
        /// The shard.
        path: PathBuf,
        /// The parameter.
        name: String,
        /// Why.
        source: ArrayError,
    },
}

impl TensorCacheError {
    /// The class of the error TVM raises for it: `ValueError` for a corrupt shard and a
    /// parameter not in the cache (as TVM), `InternalError` otherwise.
    pub fn tvm_kind(&self) -> &'static str {
        match self {
            TensorCacheError::ShardSize { .. }
            | TensorCacheError::ShardFormat { .. }
            | TensorCacheError::NotInCache { .. }
            | TensorCacheError::NotAString { .. } => "ValueError",
            _ => "InternalError",
        }
    }
}

/// `tensor-cache.json`: the shards of a tensor cache (TVM's `TensorCacheMetadata`).
#[derive(Debug, Clone, Deserialize)]
pub struct TensorCacheMetadata {
    /// The shards, in order.
    pub records: Vec<FileRecord>,
}

/// One shard file (TVM's `TensorCacheMetadata::FileRecord`).
#[derive(Debug, Clone, Deserialize)]
pub struct FileRecord {
    /// The file, relative to the cache directory (`dataPath`).
    #[serde(rename = "dataPath")]
    pub data_path: String,
    /// The shard format (`raw-shard`).
    pub format: String,
    /// The file's size.
    pub nbytes: i64,
    /// The tensors in it.
    pub records: Vec<ParamRecord>,
}

/// One tensor of a shard (TVM's `ParamRecord`).
#[derive(Debug, Clone, Deserialize)]
pub struct ParamRecord {
    /// The parameter's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its dtype, as TVM spells it (`float32`).
    pub dtype: String,
    /// The encoding of its bytes (`raw`, `f32-to-bf16`).
    pub format: String,
    /// Bytes in the shard.
    pub nbytes: i64,
    /// Where they start in the shard (`byteOffset`).
    #[serde(rename = "byteOffset")]
    pub byte_offset: i64,
}

impl TensorCacheMetadata {
    /// Reads `DIR/tensor-cache.json`.
    pub fn load(dir: &Path) -> Result<TensorCacheMetadata, TensorCacheError> {
        let path = dir.join("tensor-cache.json");
        let text = std::fs::read(&path).map_err(|source| TensorCacheError::Io { path: path.clone(), source })?;
        let de = &mut serde_json::Deserializer::from_slice(&text);
        serde_path_to_error::deserialize(de).map_err(|source| TensorCacheError::Json { path, source })
    }
}

/// `dtype` parsed as TVM 0.27 parses it (`bool` is DLPack's 8-bit `kDLBool`).
fn parse_dtype(dtype: &str) -> Option<DataType> {
    if dtype == "bool" {
        return Some(DataType::FFI_BOOL);
    }
    DataType::parse(dtype).filter(|d| d.bits > 0 && d.lanes > 0)
}

/// The tensors of one shard, checked against its record, on `device`.
fn load_shard(dir: &Path, shard: &FileRecord, device: Device) -> Result<Vec<(String, NdArray)>, TensorCacheError> {
    let path = dir.join(&shard.data_path);
    let io = |source| TensorCacheError::Io { path: path.clone(), source };
    let file = std::fs::File::open(&path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if shard.format != "raw-shard" {
        return Err(TensorCacheError::ShardFormat { path, format: shard.format.clone() });
    }
    if u64::try_from(shard.nbytes).ok() != Some(len) {
        return Err(TensorCacheError::ShardSize { path, expected: shard.nbytes, found: len });
    }
    let map = if len == 0 { None } else { Some(HostFileMapping::map(&file).map_err(io)?) };
    let whole = match &map {
        Some(m) => Some(Storage::in_file_mapping(m, 0, m.len()).map_err(|e| TensorCacheError::Array {
            path: path.clone(),
            name: String::new(),
            source: e.into(),
        })?),
        None => None,
    };
    let mut out = Vec::with_capacity(shard.records.len().min(1 << 16));
    for rec in &shard.records {
        let _span = tracing::trace_span!("tensor_cache_record", name = %rec.name).entered();
        let array_err =
            |source: ArrayError| TensorCacheError::Array { path: path.clone(), name: rec.name.clone(), source };
        let dtype = parse_dtype(&rec.dtype).ok_or_else(|| TensorCacheError::Dtype {
            path: path.clone(),
            name: rec.name.clone(),
            dtype: rec.dtype.clone(),
        })?;
        let bf16 = match rec.format.as_str() {
            "raw" => false,
            "f32-to-bf16" if dtype == DataType::F32 => true,
            _ => {
                return Err(TensorCacheError::Encoding {
                    path: path.clone(),
                    name: rec.name.clone(),
                    format: rec.format.clone(),
                    dtype: rec.dtype.clone(),
                })
            }
        };
        let tensor = tensor_bytes(dtype, &rec.shape)
            .ok_or_else(|| array_err(ArrayError::BadShape { shape: rec.shape.clone(), dtype }))?;
        let expected = if bf16 { tensor / 2 } else { tensor };
        if u64::try_from(rec.nbytes).ok() != Some(expected) {
            return Err(TensorCacheError::RecordSize {
                path: path.clone(),
                name: rec.name.clone(),
                dtype,
                shape: rec.shape.clone(),
                format: rec.format.clone(),
                expected,
                nbytes: rec.nbytes,
            });
        }
        let bounds = || TensorCacheError::RecordBounds {
            path: path.clone(),
            name: rec.name.clone(),
            offset: rec.byte_offset,
            nbytes: rec.nbytes,
            shard_len: len,
        };
        let start = usize::try_from(rec.byte_offset).map_err(|_| bounds())?;
        let nbytes = usize::try_from(rec.nbytes).map_err(|_| bounds())?;
        match start.checked_add(nbytes) {
            Some(end) if end as u64 <= len => {}
            _ => return Err(bounds()),
        }
        let array = match (&map, &whole) {
            (Some(m), Some(whole)) => {
                if !bf16 && device.is_cpu() && m.address(start) % CPU_ALIGNMENT == 0 {
                    let storage = Storage::in_file_mapping(m, start, nbytes).map_err(|e| array_err(e.into()))?;
                    NdArray::in_storage(&storage, 0, &rec.shape, dtype).map_err(array_err)?
                } else if !bf16 {
                    let a = NdArray::empty(&rec.shape, dtype, device).map_err(array_err)?;
                    whole.copy_to(start, a.storage(), 0, nbytes).map_err(|e| array_err(e.into()))?;
                    a
                } else {
                    let mut raw = vec![0u8; nbytes];
                    whole.read(start, &mut raw).map_err(|e| array_err(e.into()))?;
                    let wide: Vec<u8> = raw
                        .chunks_exact(2)
                        .flat_map(|h| (u32::from(u16::from_le_bytes([h[0], h[1]])) << 16).to_le_bytes())
                        .collect();
                    NdArray::from_bytes(&wide, &rec.shape, dtype, device).map_err(array_err)?
                }
            }
            // An empty shard holds only empty tensors.
            _ => NdArray::empty(&rec.shape, dtype, device).map_err(array_err)?,
        };
        out.push((rec.name.clone(), array));
    }
    Ok(out)
}

/// A cache of named weight tensors (TVM's `TensorCache`, owned by its caller).
#[derive(Debug, Clone, Default)]
pub struct TensorCache {
    pool: HashMap<String, NdArray>,
}

impl TensorCache {
    /// An empty cache.
    pub fn new() -> TensorCache {
        TensorCache::default()
    }

    /// `TensorCache::Load`: every tensor of the cache directory `dir` onto `device`, added
    /// under its name (replacing one of the same name). Nothing is added when any shard
    /// fails.
    pub fn load(&mut self, dir: &Path, device: Device) -> Result<(), TensorCacheError> {
        let _span = tracing::debug_span!("tensor_cache_load", dir = %dir.display(), %device).entered();
        let metadata = TensorCacheMetadata::load(dir)?;
        let mut loaded = Vec::new();
        for shard in &metadata.records {
            let _span = tracing::debug_span!("tensor_cache_shard", file = %shard.data_path).entered();
            loaded.extend(load_shard(dir, shard, device)?);
        }
        self.pool.extend(loaded);
        Ok(())
    }

    /// `TensorCache::Get`: the tensor named `name`, if any (sharing its storage).
    pub fn get(&self, name: &str) -> Option<NdArray> {
        self.pool.get(name).cloned()
    }

    /// `TensorCache::Update`: `array` under `name`; without `override_`, a name already there
    /// is an error.
    pub fn update(&mut self, name: &str, array: NdArray, override_: bool) -> Result<(), TensorCacheError> {
        if !override_ && self.pool.contains_key(name) {
            return Err(TensorCacheError::Exists { name: name.to_owned() });
        }
        self.pool.insert(name.to_owned(), array);
        Ok(())
    }

    /// `TensorCache::Remove`: drops `name` (nothing when it is not there).
    pub fn remove(&mut self, name: &str) {
        self.pool.remove(name);
    }

    /// `TensorCache::Clear`: drops every tensor.
    pub fn clear(&mut self) {
        self.pool.clear();
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.pool.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.pool.is_empty()
    }

    /// The names held, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.pool.keys().map(String::as_str)
    }

    /// `ParamModuleNode::GetParams`: the tensors `PREFIX_0`, `PREFIX_1`, ... up to
    /// `num_params`, or while they exist when `num_params` is -1.
    pub fn param_array(&self, prefix: &str, num_params: i64) -> Result<Vec<NdArray>, TensorCacheError> {
        let mut out = Vec::new();
        let mut i = 0i64;
        while i < num_params || num_params == -1 {
            let name = format!("{prefix}_{i}");
            match self.pool.get(&name) {
                Some(a) => out.push(a.clone()),
                None if num_params == -1 => return Ok(out),
                None => return Err(TensorCacheError::IndexedNotInCache { name }),
            }
            i += 1;
        }
        Ok(out)
    }

    /// `ParamModuleNode::GetParamByName`: the tensors named `names`, in order.
    pub fn param_array_by_name<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<NdArray>, TensorCacheError> {
        names
            .iter()
            .map(|n| {
                let n = n.as_ref();
                self.pool.get(n).cloned().ok_or_else(|| TensorCacheError::NotInCache { name: n.to_owned() })
            })
            .collect()
    }
}

/// The process-wide cache (TVM's `TensorCache::Global()`).
fn global() -> std::sync::MutexGuard<'static, TensorCache> {
    static GLOBAL: OnceLock<Mutex<TensorCache>> = OnceLock::new();
    GLOBAL.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// A copy of the process-wide cache (sharing the tensors), e.g. to inspect it.
pub fn global_snapshot() -> TensorCache {
    global().clone()
}

/// `vm.builtin.tensor_cache.load(cache_path, device_type, device_id)`: the cache directory's
/// tensors into the process-wide cache, on DLPack device `(device_type, device_id)`. The
/// shards are read without the lock held.
pub fn tensor_cache_load(cache_path: &Path, device_type: i32, device_id: i32) -> Result<(), TensorCacheError> {
    let mut loaded = TensorCache::new();
    loaded.load(cache_path, Device::from_dlpack(device_type, device_id))?;
    global().pool.extend(loaded.pool);
    Ok(())
}

/// `vm.builtin.tensor_cache.get(name) -> Optional[Tensor]`.
pub fn tensor_cache_get(name: &str) -> Option<NdArray> {
    global().get(name)
}

/// `vm.builtin.tensor_cache.update(name, array[, override])`: `override` defaults to false
/// (the two-argument call), when a name already there is an error.
pub fn tensor_cache_update(name: &str, array: NdArray, override_: Option<bool>) -> Result<(), TensorCacheError> {
    global().update(name, array, override_.unwrap_or(false))
}

/// `vm.builtin.tensor_cache.remove(name)`.
pub fn tensor_cache_remove(name: &str) {
    global().remove(name)
}

/// `vm.builtin.tensor_cache.clear()`.
pub fn tensor_cache_clear() {
    global().clear()
}

/// `vm.builtin.param_array_from_cache(prefix, num_params) -> Array[Tensor]`:
/// [`TensorCache::param_array`] on the process-wide cache.
pub fn param_array_from_cache(prefix: &str, num_params: i64) -> Result<Vec<NdArray>, TensorCacheError> {
    global().param_array(prefix, num_params)
}

/// `vm.builtin.param_array_from_cache_by_name(names) -> Array[Tensor]`:
/// [`TensorCache::param_array_by_name`] on the process-wide cache.
pub fn param_array_from_cache_by_name<S: AsRef<str>>(names: &[S]) -> Result<Vec<NdArray>, TensorCacheError> {
    global().param_array_by_name(names)
}

/// `vm.builtin.param_array_from_cache_by_name_unpacked(name0, name1, ...) -> Array[Tensor]`:
/// the names as separate arguments (the VM refuses a non-string argument with
/// [`TensorCacheError::NotAString`]).
pub fn param_array_from_cache_by_name_unpacked<S: AsRef<str>>(names: &[S]) -> Result<Vec<NdArray>, TensorCacheError> {
    param_array_from_cache_by_name(names)
}
