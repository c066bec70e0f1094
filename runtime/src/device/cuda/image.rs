//! CUDA images before the driver sees them: PTX, cubin and fatbin checked against the
//! payload's length (the driver reads an image from a pointer alone), and CUDA C++ source
//! compiled with NVRTC ([`super::nvrtc`]) for a compute capability. Nothing here calls the
//! driver.

use std::ffi::c_void;
use std::fmt;

use object::{Object, ObjectSection, ObjectSegment};

use crate::device::cuda::nvrtc;
use crate::payload::device::DeviceModule;

/// Why a PTX image lacks kernel `name`, when its text tells.
pub(super) fn ptx_hint(ptx: &[u8], name: &str) -> String {
    let text = String::from_utf8_lossy(ptx);
    let declared = |directive: &str| {
        text.lines().filter_map(|l| l.split_once(directive).map(|(_, rest)| rest)).any(|rest| {
            rest.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',').any(|tok| tok == name)
        })
    };
    let entries = ptx_entries(&text);
    if declared(".func") && !declared(".entry") {
        format!(
            " (the PTX declares `{name}` as a `.func`, a device function, not an `.entry` kernel; \
             kernels in the PTX: {entries:?})"
        )
    } else {
        format!(" (kernels in the PTX: {entries:?})")
    }
}

/// The `.entry` names of a PTX text.
pub(super) fn ptx_entries(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(".entry").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split(|c: char| c.is_whitespace() || c == '(').find(|t| !t.is_empty()))
        .map(str::to_owned)
        .collect()
}

/// What kind of image a payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ImageKind {
    Ptx,
    Cubin,
    Fatbin,
}

impl fmt::Display for ImageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageKind::Ptx => "PTX",
            ImageKind::Cubin => "cubin",
            ImageKind::Fatbin => "fatbin",
        })
    }
}

/// Magic of a fatbin's header (`50 ed 55 ba`).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `EM_CUDA`.
pub(super) const EM_CUDA: u16 = 190;

/// Compiles the source of `module` (a `cuda` payload) with NVRTC for compute capability `cc`
/// and checks the image for the driver.
pub(super) fn compile_source(module: &DeviceModule, cc: (u32, u32)) -> Result<Image, String> {
    let source = std::str::from_utf8(&module.data)
        .map_err(|e| format!("the CUDA source (fmt `cuda`) is not UTF-8 text: {e}"))?;
    let started = std::time::Instant::now();
    let compiled = nvrtc::compile_for_device(source, cc).map_err(|e| e.to_string())?;
    tracing::info!(
        arch = %compiled.arch,
        bytes = compiled.image.len(),
        ms = started.elapsed().as_millis() as u64,
        "compiled CUDA source with NVRTC"
    );
    if !compiled.log.is_empty() {
        tracing::debug!(log = %compiled.log, "NVRTC log");
    }
    Image::prepare(compiled.output.format(), &compiled.image)
        .map_err(|e| format!("NVRTC's {} for {}: {e}", compiled.output.format(), compiled.arch))
}

/// An image checked for the driver, in an 8-byte-aligned buffer with a NUL after it.
#[derive(Debug)]
pub(super) struct Image {
    pub(super) words: Vec<u64>,
    pub(super) kind: ImageKind,
}

impl Image {
    /// Whether a payload is CUDA source for NVRTC (format `cuda` and not a cubin or fatbin,
    /// which are loaded whatever the format says).
    pub(super) fn is_source(format: &str, data: &[u8]) -> bool {
        format == "cuda" && !data.starts_with(b"\x7fELF") && !data.starts_with(&FATBIN_MAGIC.to_le_bytes())
    }

    pub(super) fn prepare(format: &str, data: &[u8]) -> Result<Image, String> {
        // Zero-filled, with room for at least one NUL after the data, and 8-byte aligned (the
        // ELF reader needs its headers aligned).
        let mut words = vec![0u64; data.len() / 8 + 1];
        for (word, chunk) in words.iter_mut().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        let aligned = object::pod::bytes_of_slice(&words).get(..data.len()).unwrap_or_default();
        let kind = if data.starts_with(b"\x7fELF") {
            check_cubin(aligned)?;
            ImageKind::Cubin
        } else if data.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
            check_fatbin(data)?;
            ImageKind::Fatbin
        } else if format == "ptx" || format == "cubin" || format == "fatbin" || format.is_empty() {
            check_ptx(data)?;
            ImageKind::Ptx
        } else if format == "cuda" {
            return Err("the payload is CUDA C++ source (fmt `cuda`): it is compiled with NVRTC for the \
                 device before it loads"
                .into());
        } else {
            return Err(format!("unknown CUDA image format `{format}`"));
        };
        Ok(Image { words, kind })
    }

    pub(super) fn as_ptr(&self) -> *const c_void {
        self.words.as_ptr().cast()
    }
}

fn check_ptx(data: &[u8]) -> Result<(), String> {
    let text_end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if let Some(at) = data.get(..text_end).and_then(|t| t.iter().position(|&b| b == 0)) {
        return Err(format!("the PTX text holds a NUL byte at {at}, which would cut it short"));
    }
    if text_end == 0 {
        return Err("the PTX text is empty".into());
    }
    Ok(())
}

fn le_u16(data: &[u8], at: u64) -> Option<u16> {
    let at = usize::try_from(at).ok()?;
    data.get(at..)?.get(..2)?.try_into().ok().map(u16::from_le_bytes)
}

fn le_u64(data: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    data.get(at..)?.get(..8)?.try_into().ok().map(u64::from_le_bytes)
}

/// Checks, with the `object` crate, that an ELF64 little-endian CUDA object's header, section
/// and segment tables, and every section's and segment's bytes lie within `data` (which must be
/// 8-byte aligned, as [`Image`]'s buffer is).
fn check_cubin(data: &[u8]) -> Result<(), String> {
    let len = data.len() as u64;
    let bad = |what: &str| format!("the cubin is malformed: {what} (image is {len} bytes)");
    let within = |range: Option<(u64, u64)>| {
        range.is_none_or(|(offset, size)| offset.checked_add(size).is_some_and(|end| end <= len))
    };
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let file = object::read::elf::ElfFile64::<object::LittleEndian>::parse(data).map_err(|e| bad(&e.to_string()))?;
    let machine = file.elf_header().e_machine.get(object::LittleEndian).0;
    if machine != EM_CUDA {
        return Err(format!("the ELF image is not a CUDA cubin (e_machine {machine}, expected {EM_CUDA})"));
    }
    for section in file.sections() {
        let i = section.index().0;
        // `file_range` is `None` for sections that take no bytes in the file (`SHT_NOBITS`).
        let range = section.file_range();
        if !within(range) {
            let (offset, size) = range.unwrap_or_default();
            return Err(bad(&format!("section {i} ({offset}+{size}) lies outside the image")));
        }
    }
    for (i, segment) in file.segments().enumerate() {
        let (offset, size) = segment.file_range();
        if !within(Some((offset, size))) {
            return Err(bad(&format!("segment {i} ({offset}+{size}) lies outside the image")));
        }
    }
    Ok(())
}

/// Checks a fatbin's header: `magic:u32, version:u16, header_size:u16, fat_size:u64`, with
/// `header_size + fat_size` within `data`.
fn check_fatbin(data: &[u8]) -> Result<(), String> {
    let len = data.len() as u64;
    let header = le_u16(data, 6).zip(le_u64(data, 8));
    let (header_size, fat_size) = header.ok_or_else(|| format!("the fatbin header is truncated ({len} bytes)"))?;
    if header_size < 16 {
        return Err(format!("the fatbin header size {header_size} is smaller than the header"));
    }
    match u64::from(header_size).checked_add(fat_size) {
        Some(end) if end <= len => Ok(()),
        _ => Err(format!("the fatbin says it takes {header_size}+{fat_size} bytes, the payload holds {len}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::module::CudaModule;
    use crate::format::DataType;
    use crate::payload::device::{FunctionInfo, CUDA};
    use std::sync::Arc;

    fn cubin_header() -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[6] = 1;
        h[0x12..0x14].copy_from_slice(&EM_CUDA.to_le_bytes());
        h[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        h[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        h
    }

    #[test]
    fn images_are_checked_before_the_driver_sees_them() {
        // PTX: copied with a NUL after it, aligned.
        let img = Image::prepare("ptx", b".version 6.0\n").unwrap();
        assert_eq!(img.kind, ImageKind::Ptx);
        assert!(img.words.len() * 8 > 13, "room for the NUL");
        assert_eq!(img.words.last().map(|w| w.to_ne_bytes()[5..].to_vec()), Some(vec![0, 0, 0]));
        assert!(Image::prepare("ptx", b".version\0 6.0").unwrap_err().contains("NUL byte at 8"));
        assert!(Image::prepare("ptx", b".version 6.0\0\0").is_ok());
        assert!(Image::prepare("cuda", b"__global__ void f() {}").unwrap_err().contains("NVRTC"));
        assert!(Image::prepare("spirv", b"x").unwrap_err().contains("unknown CUDA image format"));

        // A cubin with a null section, its section name table and one section that lies
        // inside (the whole file), then one made to run past the end.
        let mut cubin = cubin_header();
        cubin[0x28..0x30].copy_from_slice(&64u64.to_le_bytes()); // shoff
        cubin[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes()); // shnum
        cubin[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes()); // shstrndx
        let section = |kind: u8, offset: u64, size: u64| {
            let mut sh = vec![0u8; 64];
            sh[4] = kind;
            sh[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
            sh[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            sh
        };
        let total = 64 + 3 * 64 + 1;
        cubin.extend_from_slice(&[0u8; 64]); // SHT_NULL
        cubin.extend_from_slice(&section(3, total - 1, 1)); // SHT_STRTAB: one NUL
        cubin.extend_from_slice(&section(1, 0, total)); // SHT_PROGBITS
        cubin.push(0);
        assert_eq!(cubin.len() as u64, total);
        assert_eq!(Image::prepare("cubin", &cubin).unwrap().kind, ImageKind::Cubin);
        let mut past = cubin.clone();
        past[64 + 2 * 64 + 0x20..64 + 2 * 64 + 0x28].copy_from_slice(&(total + 1).to_le_bytes());
        let err = Image::prepare("cubin", &past).unwrap_err();
        assert!(err.contains("section 2"), "{err}");
        let mut table_past = cubin.clone();
        table_past[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        assert!(Image::prepare("cubin", &table_past).unwrap_err().contains("the cubin is malformed"));
        let mut x86 = cubin.clone();
        x86[0x12] = 62;
        assert!(Image::prepare("cubin", &x86).unwrap_err().contains("not a CUDA cubin"));
        for cut in 4..cubin.len() {
            assert!(Image::prepare("cubin", &cubin[..cut]).is_err(), "cut {cut}");
        }

        // A fatbin whose size fits, and one that does not.
        let mut fat = FATBIN_MAGIC.to_le_bytes().to_vec();
        fat.extend_from_slice(&1u16.to_le_bytes());
        fat.extend_from_slice(&16u16.to_le_bytes());
        fat.extend_from_slice(&8u64.to_le_bytes());
        fat.extend_from_slice(&[0; 8]);
        assert_eq!(Image::prepare("cubin", &fat).unwrap().kind, ImageKind::Fatbin);
        assert!(Image::prepare("cubin", &fat[..fat.len() - 1]).unwrap_err().contains("16+8"));
        assert!(Image::prepare("fatbin", &fat[..10]).unwrap_err().contains("truncated"));
    }

    #[test]
    fn ptx_hints_name_func_declarations() {
        let ptx = b".visible .func k(\n .param .b64 p\n)\n.visible .entry other(\n)\n";
        let hint = ptx_hint(ptx, "k");
        assert!(hint.contains("`.func`"), "{hint}");
        assert!(hint.contains("[\"other\"]"), "{hint}");
        assert!(!ptx_hint(ptx, "missing").contains(".func"));
    }

    /// The CUDA models TVM 0.27 exported (`tests/fixtures/device-run`), whose device modules
    /// hold CUDA source.
    const CUDA_FIXTURES: [&str; 4] = [
        "dev_relax_mlp_cuda_sm80",
        "dev_relax_mlp_cuda_sm90",
        "dev_relax_transformer_cuda_sm90",
        "dev_relax_cnn_cuda_sm90",
    ];

    /// The device module of fixture `name`, read from its library's blob (nothing is run).
    fn fixture_device_module(name: &str) -> DeviceModule {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/device-run").join(name);
        let so = std::fs::read(path.with_extension("so")).unwrap();
        let found = crate::elf::find_blob(&so, None).unwrap().expect("a blob symbol");
        let blob = crate::bytes::Bytes::from_vec(found.bytes(&so).unwrap().to_vec());
        let registry = crate::registry::Registry::default();
        let tree =
            crate::load::load_blob(&blob, found.layout, &registry, &crate::load::LoadOptions::default()).unwrap();
        tree.find::<DeviceModule>().expect("a device module").clone()
    }
    /// Whether NVRTC can be opened; when not, the test is skipped (and fails when
    /// `MBLOB_REQUIRE_NVRTC` is set).
    fn nvrtc_or_skip() -> bool {
        if nvrtc::available() {
            return true;
        }
        assert!(
            std::env::var_os("MBLOB_REQUIRE_NVRTC").is_none(),
            "MBLOB_REQUIRE_NVRTC is set, but {}",
            nvrtc::NvrtcError::NotFound
        );
        println!("skipped: no NVRTC");
        false
    }
    #[test]
    fn cuda_source_of_tvm_models_compiles_with_nvrtc() {
        if !nvrtc_or_skip() {
            return;
        }
        for name in CUDA_FIXTURES {
            let device = fixture_device_module(name);
            assert_eq!((device.type_key.as_str(), device.format.as_str()), (CUDA, "cuda"), "{name}");
            assert!(Image::is_source(&device.format, &device.data));
            let source = std::str::from_utf8(&device.data).unwrap();
            let kernels: Vec<&str> = device.functions.iter().map(|(n, _)| n.as_str()).collect();
            assert!(!kernels.is_empty(), "{name}");
            for (major, minor) in [(8, 0), (9, 0)] {
                let ptx = nvrtc::compile_ptx(source, (major, minor)).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(ptx.contains(&format!(".target sm_{major}{minor}")), "{name}");
                let entries = ptx_entries(&ptx);
                for kernel in &kernels {
                    assert!(entries.iter().any(|e| e == kernel), "{name} sm_{major}{minor}: no .entry {kernel}");
                }
                assert_eq!(Image::prepare("ptx", ptx.as_bytes()).unwrap().kind, ImageKind::Ptx);
                println!("{name}: {} kernels, PTX for compute_{major}{minor}: {} bytes", kernels.len(), ptx.len());
            }
        }
    }

    #[test]
    fn cuda_source_payloads_compile_once_per_compute_capability() {
        if !nvrtc_or_skip() {
            return;
        }
        // What the first load on a device does before `cuModuleLoadData`: a cubin for the
        // architecture (checked as the driver's image), kept for the next device alike.
        let m = CudaModule::new(fixture_device_module("dev_relax_mlp_cuda_sm90"));
        let run = m.run();
        let image = run.source_image((9, 0)).unwrap();
        assert_eq!(image.kind, ImageKind::Cubin);
        assert!(Arc::ptr_eq(&image, &run.source_image((9, 0)).unwrap()), "compiled once");
        let bytes = object::pod::bytes_of_slice(&image.words);
        let elf = object::File::parse(bytes).unwrap();
        let symbols: Vec<&str> =
            object::Object::symbols(&elf).filter_map(|s| object::ObjectSymbol::name(&s).ok()).collect();
        for (kernel, _) in &run.device.functions {
            assert!(symbols.contains(&kernel.as_str()), "no symbol {kernel} in the cubin");
        }
        // An architecture past what NVRTC knows gets PTX for the newest it knows below.
        let newest = nvrtc::supported_archs().unwrap().into_iter().max().unwrap();
        let past = run.source_image((newest / 10 + 1, 9)).unwrap();
        assert_eq!(past.kind, ImageKind::Ptx);
        // An architecture before the oldest is an error, remembered.
        let e = run.source_image((1, 0)).unwrap_err();
        assert!(e.contains("cannot compile for compute capability 1.0"), "{e}");
        // A source that does not compile comes back with NVRTC's log.
        let info = FunctionInfo::new("k", vec![DataType::HANDLE], vec!["threadIdx.x".into()]);
        let bad = DeviceModule::new(
            CUDA,
            "cuda",
            vec![("k".into(), info)],
            b"extern \"C\" __global__ void k(float* p) { nope(p); }".to_vec(),
        );
        let e = compile_source(&bad, (8, 0)).unwrap_err();
        assert!(e.contains("could not compile") && e.contains("nope"), "{e}");
    }
}
