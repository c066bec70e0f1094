//! Device modules: the kernels a host library launches on a GPU (CUDA, OpenCL, ROCm, Metal,
//! Vulkan, WebGPU), as TVM saves them (`tvm-format.md` §7, checked against the device goldens
//! of TVM 0.19, 0.21 and 0.27).
//!
//! ```text
//! triple (cuda, opencl, hip, hexagon, and DeviceSourceModule: metal, hsaco, aocl, sdaccel, hex):
//!            fmt:str  fmap:map<str,FunctionInfo>  data:str
//! metal      version:str ("0.1.0")  smap:map<str,str>  fmap  fmt:str   (MetalModule, macOS builds)
//!            fmt:str  fmap  smap:map<str,str>                       (tvm-ffi without Metal runtime)
//!            the triple                                             (TVM <= 0.21 without Metal runtime)
//! webgpu     fmap  smap:map<str,str>
//! vulkan     fmt:str  fmap  smap:map<str,SPIRVShader>    SPIRVShader := flag:u32  words:vec<u32>
//!
//! FunctionInfo := name:str  arg_types:vec<DLDataType>  launch_param_tags:vec<str>
//!                 arg_extra_tags:vec<i32>           (TVM 0.21 and later: Classic021 and Ffi only)
//! map<K,V>     := count:u64  (key, value){count}    (C++ unordered_map: order kept as read)
//! ```
//!
//! The metal forms are told apart by their first string (the version `0.1.0` is never a
//! format); in the tvm-ffi layout, where the payload's length is known, `data` and `smap` are
//! told apart by which one ends exactly at the end of the payload. Vulkan has no golden: its
//! reader follows TVM's `VulkanModuleNode::SaveToBinary` and keeps each shader's words as bytes.
//!
//! `FunctionInfo.launch_param_tags` name the thread axes whose extents a caller passes after the
//! kernel arguments (`blockIdx.x`, `threadIdx.y`, ...), optionally followed by
//! `tir.use_dyn_shared_memory`, whose value (the dynamic shared memory in bytes) comes last:
//! [`LaunchParams`] turns them into grid and block dimensions.

mod launch;

use std::any::Any;
use std::collections::HashSet;
use std::io::{self, Write};
use std::ops::Range;

pub use launch::{LaunchDims, LaunchError, LaunchParams, DYN_SHARED_MEMORY_TAG};

use super::Payload;
use crate::bytes::Bytes;
use crate::format::stream::{self, Reader};
use crate::format::{DataType, FormatError, FormatErrorKind, Layout};

/// Type key of CUDA modules.
pub const CUDA: &str = "cuda";
/// Type key of OpenCL modules.
pub const OPENCL: &str = "opencl";
/// Type key of Metal modules.
pub(crate) const METAL: &str = "metal";
/// Type key of WebGPU modules.
pub const WEBGPU: &str = "webgpu";
/// Type key of Vulkan modules.
pub const VULKAN: &str = "vulkan";

/// Type keys whose payload is the triple `fmt, fmap, data`: the runtime modules of CUDA,
/// OpenCL, ROCm (`hip`) and Hexagon, and TVM's `DeviceSourceModule` (written when a runtime is
/// not built in) under its keys. `metal` also has other forms (see the module docs).
pub const TRIPLE_TYPE_KEYS: &[&str] = &["cuda", "opencl", "hip", "hexagon", "metal", "hsaco", "aocl", "sdaccel", "hex"];

/// Every device type key with a loader.
pub const DEVICE_TYPE_KEYS: &[&str] =
    &["cuda", "opencl", "hip", "hexagon", "metal", "hsaco", "aocl", "sdaccel", "hex", "vulkan", "webgpu"];

/// The version string that starts a `MetalModule` payload (`kMetalModuleVersion`).
pub(crate) const METAL_MODULE_VERSION: &str = "0.1.0";

/// What TVM knows about one kernel (`runtime::FunctionInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionInfo {
    /// The name. Empty in what TVM up to 0.21 writes for CUDA, OpenCL and Metal (the map key
    /// carries it); the kernel name in TVM 0.27 and in WebGPU modules.
    pub name: String,
    /// The kernel arguments' types: `handle` for buffers, scalars otherwise.
    pub arg_types: Vec<DataType>,
    /// Thread axes whose extents follow the arguments, then optional flags (see
    /// [`LaunchParams`]).
    pub launch_param_tags: Vec<String>,
    /// One tag per argument in TVM 0.21 and later (0 none, 1 CUDA tensor map). Written only in
    /// [`Layout::Classic021`] and [`Layout::Ffi`]. A payload read in [`Layout::Classic`] gets one
    /// 0 per argument (WebGPU: none), which is what TVM 0.21 writes for such kernels.
    pub arg_extra_tags: Vec<i32>,
}

impl FunctionInfo {
    /// A function info with one "none" extra tag per argument, as TVM 0.21+ writes it.
    pub fn new(name: impl Into<String>, arg_types: Vec<DataType>, launch_param_tags: Vec<String>) -> FunctionInfo {
        let arg_extra_tags = vec![0; arg_types.len()];
        FunctionInfo { name: name.into(), arg_types, launch_param_tags, arg_extra_tags }
    }

    /// The launch parameters its tags describe.
    pub fn launch_params(&self) -> Result<LaunchParams, LaunchError> {
        LaunchParams::from_tags(&self.launch_param_tags)
    }

    /// Reads one function info; `extra_tags` says whether the field is present, and
    /// `fill_extra` whether to give one 0 per argument when it is not.
    fn read(r: &mut Reader<'_>, extra_tags: bool, fill_extra: bool) -> Result<FunctionInfo, FormatError> {
        let name = r.read_str("FunctionInfo.name")?.to_owned();
        let n = r.read_count("arg_types", 4)?;
        let mut arg_types = Vec::with_capacity(n);
        for _ in 0..n {
            arg_types.push(r.read_dtype("arg_types")?);
        }
        let launch_param_tags = r.read_vec_str("launch_param_tags")?;
        let arg_extra_tags = if extra_tags {
            let n = r.read_count("arg_extra_tags", 4)?;
            let mut tags = Vec::with_capacity(n);
            for _ in 0..n {
                tags.push(r.read_i32("arg_extra_tags")?);
            }
            tags
        } else if fill_extra {
            vec![0; arg_types.len()]
        } else {
            Vec::new()
        };
        Ok(FunctionInfo { name, arg_types, launch_param_tags, arg_extra_tags })
    }

    fn write(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        let FunctionInfo { name, arg_types, launch_param_tags, arg_extra_tags } = self;
        stream::write_str(out, name)?;
        stream::write_u64(out, arg_types.len() as u64)?;
        for t in arg_types {
            stream::write_dtype(out, *t)?;
        }
        stream::write_vec_str(out, launch_param_tags)?;
        if layout.has_arg_extra_tags() {
            stream::write_u64(out, arg_extra_tags.len() as u64)?;
            for t in arg_extra_tags {
                out.write_all(&t.to_le_bytes())?;
            }
        }
        Ok(())
    }

    fn encoded_len(&self, layout: Layout) -> u64 {
        let tags: u64 = self.launch_param_tags.iter().map(|t| stream::str_len(t.len() as u64)).sum();
        let extra = if layout.has_arg_extra_tags() { 8 + 4 * self.arg_extra_tags.len() as u64 } else { 0 };
        stream::str_len(self.name.len() as u64) + 8 + 4 * self.arg_types.len() as u64 + 8 + tags + extra
    }
}

/// A Vulkan shader (`SPIRVShader`): a flag word and the SPIR-V words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpirvShader {
    /// `flag`, as TVM's Vulkan codegen set it (kept as read).
    pub flag: u32,
    /// The SPIR-V words, little-endian, 4 bytes each (borrowed from the blob).
    pub words: Bytes,
}

/// The field order of a device payload (which of TVM's writers made it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceForm {
    /// `fmt, fmap, data`: CUDA, OpenCL, ROCm, Hexagon, and every `DeviceSourceModule`.
    FmtFmapData,
    /// `version, smap, fmap, fmt`: TVM's `MetalModule` (built with the Metal runtime).
    VersionSmapFmapFmt {
        /// The version string (`0.1.0`).
        version: String,
    },
    /// `fmt, fmap, smap`: Metal in the tvm-ffi era without the Metal runtime. Read only in
    /// [`Layout::Ffi`]: in the classic layouts a `metal` payload that does not start with the
    /// version is the triple.
    FmtFmapSmap,
    /// `fmap, smap`: WebGPU (WGSL sources, no format).
    FmapSmap,
    /// `fmt, fmap, smap<SPIRVShader>`: Vulkan.
    FmtFmapShaders,
}

/// A device module's payload, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceModule {
    /// The type key (`cuda`, `opencl`, `metal`, `webgpu`, `vulkan`, ...).
    pub type_key: String,
    /// `fmt`: `ptx`, `cubin`, `fatbin`, `cuda` (CUDA C), `cl`, `metal`, `hsaco`, ... Empty for
    /// WebGPU, which has none.
    pub format: String,
    /// The kernels, in the order of the payload (TVM writes an unordered map).
    pub functions: Vec<(String, FunctionInfo)>,
    /// `data`: PTX text, a cubin or fatbin, or source text ([`DeviceForm::FmtFmapData`] only;
    /// empty otherwise). Borrowed from the blob.
    pub data: Bytes,
    /// `smap`: kernel name to source (Metal, WebGPU), in payload order.
    pub sources: Vec<(String, Bytes)>,
    /// `smap`: kernel name to SPIR-V (Vulkan), in payload order.
    pub shaders: Vec<(String, SpirvShader)>,
    /// The field order, written back as read.
    pub form: DeviceForm,
}

impl DeviceModule {
    /// A `fmt, fmap, data` module (CUDA, OpenCL, ...).
    pub fn new(
        type_key: impl Into<String>,
        format: impl Into<String>,
        functions: Vec<(String, FunctionInfo)>,
        data: impl Into<Bytes>,
    ) -> DeviceModule {
        DeviceModule {
            type_key: type_key.into(),
            format: format.into(),
            functions,
            data: data.into(),
            sources: Vec::new(),
            shaders: Vec::new(),
            form: DeviceForm::FmtFmapData,
        }
    }

    /// A CUDA module holding PTX text (`fmt` `ptx`, as TVM's NVPTX backend writes it).
    pub fn cuda_from_ptx(ptx: impl Into<Bytes>, functions: Vec<(String, FunctionInfo)>) -> DeviceModule {
        DeviceModule::new(CUDA, "ptx", functions, ptx)
    }

    /// A CUDA module holding a cubin (`fmt` `cubin`).
    pub fn cuda_from_cubin(cubin: impl Into<Bytes>, functions: Vec<(String, FunctionInfo)>) -> DeviceModule {
        DeviceModule::new(CUDA, "cubin", functions, cubin)
    }

    /// A CUDA module holding a fatbin (`fmt` `fatbin`; TVM's nvcc path writes `cubin` for
    /// fatbins too, and every reader ignores the format).
    pub fn cuda_from_fatbin(fatbin: impl Into<Bytes>, functions: Vec<(String, FunctionInfo)>) -> DeviceModule {
        DeviceModule::new(CUDA, "fatbin", functions, fatbin)
    }

    /// The kernel called `name`.
    pub fn function(&self, name: &str) -> Option<&FunctionInfo> {
        self.functions.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }

    /// The source or shader of `name` in a module with a source map.
    pub fn source(&self, name: &str) -> Option<&Bytes> {
        self.sources.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// Reads the `type_key` payload at the start of `src` (its first byte lies at `base`, for
    /// errors). Returns the module and the bytes it took. In [`Layout::Ffi`] payloads are framed:
    /// pass exactly the payload, since the end tells two Metal forms apart.
    pub fn read(src: &Bytes, base: u64, type_key: &str, layout: Layout) -> Result<(DeviceModule, u64), FormatError> {
        let raw = parse(src, base, type_key, layout)?;
        let used = raw.used;
        Ok((raw.into_module(src, base, type_key)?, used))
    }

    /// Reads a payload that must be exactly `payload` (no trailing bytes).
    pub fn read_exact(payload: &Bytes, type_key: &str, layout: Layout) -> Result<DeviceModule, FormatError> {
        let (m, used) = DeviceModule::read(payload, 0, type_key, layout)?;
        let extra = (payload.len() as u64).saturating_sub(used);
        if extra > 0 {
            return Err(FormatError::new(used, FormatErrorKind::TrailingBytes { what: "the device payload", extra }));
        }
        Ok(m)
    }
}

/// A Vulkan shader as read: name, flag, where its words lie.
type RawShader = (String, u32, Range<usize>);

/// A payload taken apart: the byte fields as ranges of the input, so that a caller holding the
/// input as [`Bytes`] takes views of it and one that only measures takes nothing.
struct Raw<'a> {
    form: DeviceForm,
    format: &'a str,
    functions: Vec<(String, FunctionInfo)>,
    data: Range<usize>,
    sources: Vec<(String, Range<usize>)>,
    shaders: Vec<RawShader>,
    used: u64,
}

impl Raw<'_> {
    fn new(form: DeviceForm) -> Self {
        Raw { form, format: "", functions: Vec::new(), data: 0..0, sources: Vec::new(), shaders: Vec::new(), used: 0 }
    }

    /// The module, its byte fields views of `src` (the input the payload was parsed from).
    fn into_module(self, src: &Bytes, base: u64, type_key: &str) -> Result<DeviceModule, FormatError> {
        let share = |range: Range<usize>| {
            let at = base + range.start as u64;
            src.slice(range).ok_or_else(|| {
                FormatError::new(
                    at,
                    FormatErrorKind::Invalid {
                        what: "device payload",
                        detail: "a field lies outside the input".into(),
                    },
                )
            })
        };
        let mut sources = Vec::with_capacity(self.sources.len());
        for (k, v) in self.sources {
            sources.push((k, share(v)?));
        }
        let mut shaders = Vec::with_capacity(self.shaders.len());
        for (k, flag, words) in self.shaders {
            shaders.push((k, SpirvShader { flag, words: share(words)? }));
        }
        Ok(DeviceModule {
            type_key: type_key.to_owned(),
            format: self.format.to_owned(),
            functions: self.functions,
            data: share(self.data)?,
            sources,
            shaders,
            form: self.form,
        })
    }
}

/// How a payload's function infos are read.
#[derive(Clone, Copy)]
struct InfoMode {
    extra_tags: bool,
    fill_extra: bool,
}

impl InfoMode {
    fn new(type_key: &str, layout: Layout) -> Self {
        // TVM's WebGPU codegen builds its function infos without extra tags (0.21, 0.27 goldens).
        InfoMode { extra_tags: layout.has_arg_extra_tags(), fill_extra: type_key != WEBGPU }
    }
}

/// Smallest `fmap` entry: key length, name length, two counts (and a third with extra tags).
fn fmap_entry_min(mode: InfoMode) -> u64 {
    if mode.extra_tags {
        40
    } else {
        32
    }
}

fn read_fmap(r: &mut Reader<'_>, mode: InfoMode) -> Result<Vec<(String, FunctionInfo)>, FormatError> {
    let n = r.read_count("fmap", fmap_entry_min(mode))?;
    let mut out = Vec::with_capacity(n);
    let mut seen = HashSet::with_capacity(n);
    for _ in 0..n {
        let at = r.offset();
        let key = r.read_str("fmap key")?;
        if !seen.insert(key) {
            return Err(FormatError::new(
                at,
                FormatErrorKind::Invalid { what: "fmap", detail: format!("kernel `{key}` appears twice") },
            ));
        }
        let info = FunctionInfo::read(r, mode.extra_tags, mode.fill_extra)?;
        out.push((key.to_owned(), info));
    }
    Ok(out)
}

fn read_smap(r: &mut Reader<'_>) -> Result<Vec<(String, Range<usize>)>, FormatError> {
    let n = r.read_count("smap", 16)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let key = r.read_str("smap key")?.to_owned();
        out.push((key, r.read_str_range("smap value")?));
    }
    Ok(out)
}

fn read_shaders(r: &mut Reader<'_>) -> Result<Vec<RawShader>, FormatError> {
    let n = r.read_count("smap", 20)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let key = r.read_str("smap key")?.to_owned();
        let flag = u32::from_le_bytes(r.read_i32("SPIRVShader.flag")?.to_le_bytes());
        let words = r.read_count("SPIRVShader.data", 4)? as u64;
        out.push((key, flag, r.read_range(words * 4, "SPIRVShader.data")?));
    }
    Ok(out)
}

fn finish<'a>(mut raw: Raw<'a>, r: &Reader<'a>, start: u64) -> Raw<'a> {
    raw.used = r.offset() - start;
    raw
}

fn parse_triple<'a>(mut r: Reader<'a>, mode: InfoMode) -> Result<Raw<'a>, FormatError> {
    let start = r.offset();
    let mut raw = Raw::new(DeviceForm::FmtFmapData);
    raw.format = r.read_str("fmt")?;
    raw.functions = read_fmap(&mut r, mode)?;
    raw.data = r.read_str_range("data")?;
    Ok(finish(raw, &r, start))
}

fn parse_fmt_fmap_smap<'a>(mut r: Reader<'a>, mode: InfoMode) -> Result<Raw<'a>, FormatError> {
    let start = r.offset();
    let mut raw = Raw::new(DeviceForm::FmtFmapSmap);
    raw.format = r.read_str("fmt")?;
    raw.functions = read_fmap(&mut r, mode)?;
    raw.sources = read_smap(&mut r)?;
    Ok(finish(raw, &r, start))
}

fn parse_metal_versioned<'a>(mut r: Reader<'a>, mode: InfoMode) -> Result<Raw<'a>, FormatError> {
    let start = r.offset();
    let version = r.read_str("version")?.to_owned();
    let mut raw = Raw::new(DeviceForm::VersionSmapFmapFmt { version });
    raw.sources = read_smap(&mut r)?;
    raw.functions = read_fmap(&mut r, mode)?;
    raw.format = r.read_str("fmt")?;
    Ok(finish(raw, &r, start))
}

fn parse_metal<'a>(r: Reader<'a>, mode: InfoMode, layout: Layout) -> Result<Raw<'a>, FormatError> {
    let first = r.clone().read_str("fmt")?;
    if first == METAL_MODULE_VERSION {
        return parse_metal_versioned(r, mode);
    }
    if layout != Layout::Ffi {
        return parse_triple(r, mode);
    }
    // tvm-ffi: `fmt, fmap, smap` (TVM 0.27) or the triple; the payload's end decides.
    // When neither ends there, the `smap` reading is returned (its error, or its length for the
    // caller's trailing-bytes check).
    let all = r.remaining() as u64;
    let fits = |p: &Result<Raw<'_>, FormatError>| matches!(p, Ok(raw) if raw.used == all);
    let with_smap = parse_fmt_fmap_smap(r.clone(), mode);
    if fits(&with_smap) {
        return with_smap;
    }
    let triple = parse_triple(r, mode);
    if fits(&triple) {
        return triple;
    }
    with_smap
}

fn parse_webgpu(mut r: Reader<'_>, mode: InfoMode) -> Result<Raw<'_>, FormatError> {
    let start = r.offset();
    let mut raw = Raw::new(DeviceForm::FmapSmap);
    raw.functions = read_fmap(&mut r, mode)?;
    raw.sources = read_smap(&mut r)?;
    Ok(finish(raw, &r, start))
}

fn parse_vulkan(mut r: Reader<'_>, mode: InfoMode) -> Result<Raw<'_>, FormatError> {
    let start = r.offset();
    let mut raw = Raw::new(DeviceForm::FmtFmapShaders);
    raw.format = r.read_str("fmt")?;
    raw.functions = read_fmap(&mut r, mode)?;
    raw.shaders = read_shaders(&mut r)?;
    Ok(finish(raw, &r, start))
}

/// Parses the `type_key` payload at the start of `data`. Keys that are not device keys are
/// read as the triple.
fn parse<'a>(data: &'a [u8], base: u64, type_key: &str, layout: Layout) -> Result<Raw<'a>, FormatError> {
    let _span = tracing::trace_span!("device_payload", type_key, bytes = data.len()).entered();
    let r = Reader::new(data, base);
    let mode = InfoMode::new(type_key, layout);
    match type_key {
        WEBGPU => parse_webgpu(r, mode),
        VULKAN => parse_vulkan(r, mode),
        METAL => parse_metal(r, mode, layout),
        _ => parse_triple(r, mode),
    }
}

/// Bytes a payload's length needs, measured without decoding into owned bytes (for the classic
/// reader, which needs every payload's length).
pub fn measure(bytes: &[u8], base: u64, type_key: &str, layout: Layout) -> Result<u64, FormatError> {
    parse(bytes, base, type_key, layout).map(|raw| raw.used)
}

fn write_fmap(out: &mut dyn Write, functions: &[(String, FunctionInfo)], layout: Layout) -> io::Result<()> {
    stream::write_u64(out, functions.len() as u64)?;
    for (name, info) in functions {
        stream::write_str(out, name)?;
        info.write(layout, out)?;
    }
    Ok(())
}

fn write_smap(out: &mut dyn Write, sources: &[(String, Bytes)]) -> io::Result<()> {
    stream::write_u64(out, sources.len() as u64)?;
    for (name, src) in sources {
        stream::write_str(out, name)?;
        stream::write_str(out, src)?;
    }
    Ok(())
}

fn odd_spirv(name: &str, shader: &SpirvShader) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("SPIR-V of `{name}` is {} bytes, not whole 4-byte words", shader.words.len()),
    )
}

fn write_shaders(out: &mut dyn Write, shaders: &[(String, SpirvShader)]) -> io::Result<()> {
    stream::write_u64(out, shaders.len() as u64)?;
    for (name, shader) in shaders {
        if shader.words.len() % 4 != 0 {
            return Err(odd_spirv(name, shader));
        }
        stream::write_str(out, name)?;
        out.write_all(&shader.flag.to_le_bytes())?;
        stream::write_u64(out, shader.words.len() as u64 / 4)?;
        out.write_all(&shader.words)?;
    }
    Ok(())
}

impl Payload for DeviceModule {
    fn type_key(&self) -> &str {
        &self.type_key
    }

    fn write_payload(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        let DeviceModule { type_key: _, format, functions, data, sources, shaders, form } = self;
        match form {
            DeviceForm::FmtFmapData => {
                stream::write_str(out, format)?;
                write_fmap(out, functions, layout)?;
                stream::write_u64(out, data.len() as u64)?;
                data.write_to(out)
            }
            DeviceForm::VersionSmapFmapFmt { version } => {
                stream::write_str(out, version)?;
                write_smap(out, sources)?;
                write_fmap(out, functions, layout)?;
                stream::write_str(out, format)
            }
            DeviceForm::FmtFmapSmap => {
                stream::write_str(out, format)?;
                write_fmap(out, functions, layout)?;
                write_smap(out, sources)
            }
            DeviceForm::FmapSmap => {
                write_fmap(out, functions, layout)?;
                write_smap(out, sources)
            }
            DeviceForm::FmtFmapShaders => {
                stream::write_str(out, format)?;
                write_fmap(out, functions, layout)?;
                write_shaders(out, shaders)
            }
        }
    }

    fn payload_len(&self, layout: Layout) -> io::Result<u64> {
        let str_len = |n: usize| stream::str_len(n as u64);
        let fmap: u64 = 8 + self.functions.iter().map(|(k, f)| str_len(k.len()) + f.encoded_len(layout)).sum::<u64>();
        let smap: u64 = 8 + self.sources.iter().map(|(k, v)| str_len(k.len()) + str_len(v.len())).sum::<u64>();
        let shaders: u64 =
            8 + self.shaders.iter().map(|(k, s)| str_len(k.len()) + 4 + 8 + s.words.len() as u64).sum::<u64>();
        let fmt = str_len(self.format.len());
        if let Some((name, s)) = self.shaders.iter().find(|(_, s)| s.words.len() % 4 != 0) {
            return Err(odd_spirv(name, s));
        }
        Ok(match &self.form {
            DeviceForm::FmtFmapData => fmt + fmap + str_len(self.data.len()),
            DeviceForm::VersionSmapFmapFmt { version } => str_len(version.len()) + smap + fmap + fmt,
            DeviceForm::FmtFmapSmap => fmt + fmap + smap,
            DeviceForm::FmapSmap => fmap + smap,
            DeviceForm::FmtFmapShaders => fmt + fmap + shaders,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(args: &[&str], tags: &[&str]) -> FunctionInfo {
        FunctionInfo::new(
            "",
            args.iter().map(|a| DataType::parse(a).unwrap()).collect(),
            tags.iter().map(|t| t.to_string()).collect(),
        )
    }

    fn bytes_of(m: &DeviceModule, layout: Layout) -> Vec<u8> {
        let mut out = Vec::new();
        m.write_payload(layout, &mut out).unwrap();
        assert_eq!(out.len() as u64, m.payload_len(layout).unwrap(), "payload_len of {:?} in {layout}", m.form);
        out
    }

    fn sample_cuda() -> DeviceModule {
        DeviceModule::cuda_from_ptx(
            b"// ptx\n.version 6.0\n".to_vec(),
            vec![
                ("add".into(), info(&["handle", "handle", "int32"], &["blockIdx.x", "threadIdx.x"])),
                ("scale".into(), info(&["handle", "float32"], &["threadIdx.x", DYN_SHARED_MEMORY_TAG])),
            ],
        )
    }

    fn all_forms() -> Vec<DeviceModule> {
        let f = || vec![("k".to_string(), info(&["handle"], &["threadIdx.x"]))];
        let src = || vec![("k".to_string(), Bytes::from_vec(b"kernel source".to_vec()))];
        let mut metal_v = DeviceModule::new(METAL, "metal", f(), Vec::new());
        metal_v.form = DeviceForm::VersionSmapFmapFmt { version: METAL_MODULE_VERSION.into() };
        metal_v.sources = src();
        let mut metal_s = DeviceModule::new(METAL, "metal", f(), Vec::new());
        metal_s.form = DeviceForm::FmtFmapSmap;
        metal_s.sources = src();
        let mut webgpu = DeviceModule::new(WEBGPU, "", f(), Vec::new());
        webgpu.form = DeviceForm::FmapSmap;
        webgpu.sources = src();
        webgpu.functions[0].1.arg_extra_tags.clear();
        let mut vulkan = DeviceModule::new(VULKAN, "vulkan", f(), Vec::new());
        vulkan.form = DeviceForm::FmtFmapShaders;
        let words: Vec<u8> = [0x0723_0203u32, 0x0001_0000, 7].iter().flat_map(|w| w.to_le_bytes()).collect();
        vulkan.shaders = vec![("k".into(), SpirvShader { flag: 1, words: Bytes::from_vec(words) })];
        vec![
            sample_cuda(),
            DeviceModule::new("opencl", "cl", f(), b"__kernel".to_vec()),
            metal_v,
            metal_s,
            webgpu,
            vulkan,
        ]
    }

    /// Whether a form can be read back in `layout` (see [`DeviceForm::FmtFmapSmap`]).
    fn readable(m: &DeviceModule, layout: Layout) -> bool {
        m.form != DeviceForm::FmtFmapSmap || layout == Layout::Ffi
    }

    #[test]
    fn every_form_round_trips_in_every_layout() {
        for m in all_forms() {
            for layout in Layout::ALL.into_iter().filter(|&l| readable(&m, l)) {
                let bytes = bytes_of(&m, layout);
                let src = Bytes::from_vec(bytes.clone());
                let (back, used) = DeviceModule::read(&src, 0, &m.type_key, layout)
                    .unwrap_or_else(|e| panic!("{} {:?} {layout}: {e}", m.type_key, m.form));
                assert_eq!(used, bytes.len() as u64);
                assert_eq!(back, m, "{} {:?} {layout}", m.type_key, m.form);
                assert_eq!(measure(&bytes, 0, &m.type_key, layout).unwrap(), used);
            }
        }
    }

    #[test]
    fn classic_has_no_extra_tags_and_reads_them_as_zeros() {
        let m = sample_cuda();
        let classic = bytes_of(&m, Layout::Classic);
        let newer = bytes_of(&m, Layout::Classic021);
        // Two kernels, each with a count and one i32 per argument (3 and 2).
        assert_eq!(newer.len() - classic.len(), 2 * 8 + 5 * 4);
        let (back, _) = DeviceModule::read(&Bytes::from_vec(classic), 0, CUDA, Layout::Classic).unwrap();
        assert_eq!(back.function("add").unwrap().arg_extra_tags, [0, 0, 0]);
        assert_eq!(back.function("scale").unwrap().arg_types, [DataType::HANDLE, DataType::F32]);
        assert!(back.function("missing").is_none());
    }

    #[test]
    fn trailing_bytes_and_classic_measure() {
        let m = sample_cuda();
        let mut bytes = bytes_of(&m, Layout::Classic);
        let len = bytes.len() as u64;
        bytes.extend_from_slice(b"next entry");
        assert_eq!(measure(&bytes, 100, CUDA, Layout::Classic).unwrap(), len);
        let err = DeviceModule::read_exact(&Bytes::from_vec(bytes), CUDA, Layout::Classic).unwrap_err();
        assert_eq!(err.offset, len);
        assert!(matches!(err.kind, FormatErrorKind::TrailingBytes { extra: 10, .. }));
    }

    #[test]
    fn bad_input_is_a_typed_error_with_offset() {
        let m = sample_cuda();
        let good = bytes_of(&m, Layout::Classic021);
        // A huge fmap count, right after fmt (8 + 3 bytes).
        let mut forged = good.clone();
        forged[11..19].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = measure(&forged, 1000, CUDA, Layout::Classic021).unwrap_err();
        assert_eq!(err.offset, 1011);
        assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { what: "fmap", .. }), "{err}");
        // A kernel name that is not UTF-8 (the first key starts at 19 + 8).
        let mut forged = good.clone();
        forged[27] = 0xff;
        let err = measure(&forged, 0, CUDA, Layout::Classic021).unwrap_err();
        assert_eq!(err.offset, 19);
        assert!(matches!(err.kind, FormatErrorKind::NotUtf8 { what: "fmap key" }));
        // The same kernel twice.
        let mut twice = DeviceModule::new("opencl", "cl", Vec::new(), Vec::new());
        twice.functions = vec![("k".into(), info(&[], &[])), ("k".into(), info(&[], &[]))];
        let err = measure(&bytes_of(&twice, Layout::Classic), 0, "opencl", Layout::Classic).unwrap_err();
        assert!(matches!(err.kind, FormatErrorKind::Invalid { what: "fmap", .. }), "{err}");
        // Every truncation fails, none panics. One exception: a tvm-ffi Metal payload cut just
        // after the `smap` count is a whole triple whose `data` is the next byte.
        for layout in Layout::ALL {
            for m in all_forms().into_iter().filter(|m| readable(m, layout)) {
                let bytes = bytes_of(&m, layout);
                let mut other_form = 0;
                for cut in 0..bytes.len() {
                    let src = Bytes::from_vec(bytes[..cut].to_vec());
                    match DeviceModule::read_exact(&src, &m.type_key, layout) {
                        Err(_) => {}
                        Ok(back) if m.form == DeviceForm::FmtFmapSmap && back.form == DeviceForm::FmtFmapData => {
                            other_form += 1
                        }
                        Ok(back) => panic!("{} cut {cut} read as {back:?}", m.type_key),
                    }
                }
                assert!(other_form <= 1, "{} {layout}: {other_form} cuts read", m.type_key);
            }
        }
    }

    #[test]
    fn metal_forms_are_told_apart() {
        let forms = all_forms();
        let (versioned, smap) = (&forms[2], &forms[3]);
        let triple = DeviceModule::new(METAL, "metal", smap.functions.clone(), b"source".to_vec());
        for (m, layouts) in [(versioned, &Layout::ALL[..]), (&triple, &Layout::ALL[..]), (smap, &[Layout::Ffi][..])] {
            for &layout in layouts {
                let src = Bytes::from_vec(bytes_of(m, layout));
                let back = DeviceModule::read_exact(&src, METAL, layout).unwrap();
                assert_eq!(&back.form, &m.form, "{layout}");
            }
        }
    }
}
