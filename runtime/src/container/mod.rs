//! Finding the blob in any container TVM writes, without running it: ELF, Mach-O (32/64-bit and
//! fat/universal), PE/COFF (`.dll`, `.obj`), WebAssembly (linked modules and relocatable
//! objects) and `ar` archives of any of these.
//!
//! Every container is read with the `object` crate's readers; WebAssembly's data segments and
//! `linking` section, which `object` does not expose one by one, are read with `wasmparser`
//! (the reader `object` itself uses). ELF goes to [`crate::elf`], which guards its string
//! tables against names without an end.
//!
//! A linked WebAssembly module has no symbol sizes and no file offsets for its data: `wasm-ld`
//! exports the blob symbol as a global holding its address in linear memory, and binaryen (which
//! MLC's web builds run) splits the data section around runs of zeros, so the blob is cut out of
//! the linear memory rebuilt from the active data segments (zeros where no segment writes), and
//! its length comes from its own 8-byte header.

#[cfg(feature = "containers")]
mod wasm;

use std::borrow::Cow;

#[cfg(feature = "containers")]
use object::read::archive::ArchiveFile;
#[cfg(feature = "containers")]
use object::read::macho::{FatArch, MachOFatFile32, MachOFatFile64};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

use crate::bytes::Bytes;
use crate::format::Layout;

/// The kinds of file that hold a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerFormat {
    /// ELF: a shared library or a relocatable object (Linux, Android).
    Elf,
    /// Mach-O: a `.dylib`/`.so` or an object (macOS, iOS).
    MachO,
    /// A fat (universal) Mach-O file: one Mach-O file per architecture.
    MachOFat,
    /// PE: a Windows `.dll`.
    Pe,
    /// COFF: a Windows object (`.obj`, or TVM's `devc.o` for Windows).
    Coff,
    /// WebAssembly: a linked module or a relocatable object.
    Wasm,
    /// An `ar` archive (`.a`, `.lib`) of objects.
    Archive,
}

impl ContainerFormat {
    /// Its name in `inspect` (JSON `container.format`).
    pub fn name(self) -> &'static str {
        match self {
            ContainerFormat::Elf => "elf",
            ContainerFormat::MachO => "macho",
            ContainerFormat::MachOFat => "macho-fat",
            ContainerFormat::Pe => "pe",
            ContainerFormat::Coff => "coff",
            ContainerFormat::Wasm => "wasm",
            ContainerFormat::Archive => "archive",
        }
    }

    /// The operating systems whose programs use it, for messages.
    pub fn os(self) -> &'static str {
        match self {
            ContainerFormat::Elf => "Linux/Android",
            ContainerFormat::MachO | ContainerFormat::MachOFat => "macOS/iOS",
            ContainerFormat::Pe | ContainerFormat::Coff => "Windows",
            ContainerFormat::Wasm => "WebAssembly",
            ContainerFormat::Archive => "a static archive",
        }
    }
}

impl std::fmt::Display for ContainerFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a file is, told without finding a blob: its container and the machine its code is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The container.
    pub format: ContainerFormat,
    /// The machine (`x86_64`, `aarch64`, `wasm32`, ...; `unknown` when the file does not say).
    pub machine: String,
}

impl Identity {
    /// Whether this process can load and run the file's code: an ELF file for this machine.
    pub fn runs_here(&self) -> bool {
        self.format == ContainerFormat::Elf && self.machine == host_machine()
    }

    /// `built for MACHINE/OS`, for messages.
    pub(crate) fn built_for(&self) -> String {
        format!("built for {}/{} ({})", self.machine, self.format.os(), self.format)
    }
}

/// The machine this process runs on, named as [`Identity::machine`] names machines.
pub(crate) fn host_machine() -> &'static str {
    machine_name(if cfg!(target_arch = "x86_64") {
        object::Architecture::X86_64
    } else if cfg!(target_arch = "aarch64") {
        object::Architecture::Aarch64
    } else if cfg!(target_arch = "x86") {
        object::Architecture::I386
    } else if cfg!(target_arch = "riscv64") {
        object::Architecture::Riscv64
    } else if cfg!(target_arch = "arm") {
        object::Architecture::Arm
    } else {
        object::Architecture::Unknown
    })
}

fn machine_name(arch: object::Architecture) -> &'static str {
    use object::Architecture as A;
    match arch {
        A::X86_64 | A::X86_64_X32 => "x86_64",
        A::Aarch64 | A::Aarch64_Ilp32 => "aarch64",
        A::Arm => "arm",
        A::I386 => "i386",
        A::Riscv64 => "riscv64",
        A::Riscv32 => "riscv32",
        A::Wasm32 => "wasm32",
        A::Wasm64 => "wasm64",
        A::PowerPc64 => "powerpc64",
        A::LoongArch64 => "loongarch64",
        _ => "unknown",
    }
}

/// Why a container could not be read, with the byte offset in the file where it went wrong
/// (the start of the archive member, fat slice or section concerned; 0 for the file's header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{format} file, at byte {offset}: {kind}")]
pub struct ContainerError {
    /// The container being read.
    pub format: &'static str,
    /// Byte offset in the (outermost) file.
    pub offset: u64,
    /// What is wrong.
    pub kind: ContainerErrorKind,
}

/// What is wrong with a container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContainerErrorKind {
    /// The container's reader refused its headers or tables.
    #[error("unreadable: {0}")]
    Unreadable(String),
    /// The blob symbol lies in a section that holds no bytes in the file.
    #[error("symbol `{symbol}` lies in {section}, which holds no bytes")]
    NoBytes {
        /// The symbol.
        symbol: String,
        /// Its section.
        section: String,
    },
    /// The blob symbol's bytes do not fit where the file says they are.
    #[error("symbol `{symbol}` {detail}")]
    Outside {
        /// The symbol.
        symbol: String,
        /// Where it does not fit.
        detail: String,
    },
    /// Two archive members (or fat slices) hold a blob.
    #[error("two members hold a blob: {first} and {second}")]
    TwoBlobs {
        /// The first.
        first: String,
        /// The second.
        second: String,
    },
}

/// Where a blob symbol lies in a container, and its bytes.
#[derive(Debug, Clone)]
pub struct ContainerBlob {
    /// The symbol's full name, as C names it (Mach-O's leading `_` removed).
    pub symbol: String,
    /// The layout its name stands for.
    pub layout: Layout,
    /// The `c_symbol_prefix` in front of the blob name (often empty).
    pub prefix: String,
    /// The file (or archive member, or fat slice) that holds it.
    pub identity: Identity,
    /// The archive member or fat slice (`arm64`) holding it, when the file has several.
    pub member: Option<String>,
    /// Offset of the blob's first byte in the file, when its bytes lie there in one piece
    /// (`None` for a linked WebAssembly module, whose memory is rebuilt from segments).
    pub file_offset: Option<u64>,
    /// The section (or wasm data segment) that holds it.
    pub section: String,
    /// Whether it was found among the dynamic symbols or exports.
    pub dynamic: bool,
    /// Whether the file registers the blob with TVM's system library at start-up (TVM's
    /// `--system-lib` builds): it calls `TVMBackendRegisterSystemLibSymbol` (TVM up to 0.21) or
    /// `TVMFFIEnvModRegisterSystemLibSymbol` (0.22+), or, in a linked WebAssembly module, the
    /// blob was found through that call.
    pub system_lib: bool,
    /// The blob's bytes (header included): a view of the file, or the bytes rebuilt from a
    /// WebAssembly module's data segments.
    pub bytes: Bytes,
}

/// Longest symbol name looked at (as [`crate::elf`]).
const MAX_NAME: usize = 4096;

/// Nesting allowed: an archive of fat Mach-O files of objects.
#[cfg(feature = "containers")]
const MAX_DEPTH: u32 = 2;

/// What `data` is: its container and machine; `None` when it is none of the containers this
/// module reads (a raw blob, a tar archive, text).
pub fn identify(data: &[u8]) -> Option<Identity> {
    use object::FileKind as K;
    let kind = K::parse(data).ok()?;
    let format = match kind {
        K::Elf32 | K::Elf64 => ContainerFormat::Elf,
        #[cfg(feature = "containers")]
        K::MachO32 | K::MachO64 => ContainerFormat::MachO,
        #[cfg(feature = "containers")]
        K::MachOFat32 | K::MachOFat64 => ContainerFormat::MachOFat,
        #[cfg(feature = "containers")]
        K::Pe32 | K::Pe64 => ContainerFormat::Pe,
        #[cfg(feature = "containers")]
        K::Coff | K::CoffBig => ContainerFormat::Coff,
        #[cfg(feature = "containers")]
        K::Wasm => ContainerFormat::Wasm,
        #[cfg(feature = "containers")]
        K::Archive => ContainerFormat::Archive,
        _ => return None,
    };
    let machine = match format {
        #[cfg(feature = "containers")]
        ContainerFormat::MachOFat => fat_arches(data).ok()?.first().map(|(n, _)| n.clone()).unwrap_or_default(),
        ContainerFormat::Archive => "unknown".to_owned(),
        _ => object::File::parse(data).ok().map(|f| machine_name(f.architecture()).to_owned()).unwrap_or_default(),
    };
    Some(Identity { format, machine: if machine.is_empty() { "unknown".into() } else { machine } })
}

/// What `data` is, told from its headers alone, as the loader needs it before opening a file:
/// the container by its magic, the machine from the ELF or Mach-O header (`unknown` for the
/// others). Unlike [`identify`] it does not read the whole file with every format's reader, so
/// a program that only loads libraries (the C library) does not carry them.
pub(crate) fn identify_header(data: &[u8]) -> Option<Identity> {
    #[cfg(feature = "containers")]
    use object::read::macho::MachHeader;
    use object::FileKind as K;
    let (format, machine) = match K::parse(data).ok()? {
        K::Elf32 => {
            (ContainerFormat::Elf, object::read::elf::ElfFile32::<object::Endianness>::parse(data).ok()?.architecture())
        }
        K::Elf64 => {
            (ContainerFormat::Elf, object::read::elf::ElfFile64::<object::Endianness>::parse(data).ok()?.architecture())
        }
        #[cfg(feature = "containers")]
        K::MachO32 => {
            let h = object::macho::MachHeader32::<object::Endianness>::parse(data, 0).ok()?;
            (ContainerFormat::MachO, macho_arch(h.cputype(h.endian().ok()?)))
        }
        #[cfg(feature = "containers")]
        K::MachO64 => {
            let h = object::macho::MachHeader64::<object::Endianness>::parse(data, 0).ok()?;
            (ContainerFormat::MachO, macho_arch(h.cputype(h.endian().ok()?)))
        }
        #[cfg(feature = "containers")]
        K::MachOFat32 | K::MachOFat64 => (ContainerFormat::MachOFat, object::Architecture::Unknown),
        #[cfg(feature = "containers")]
        K::Pe32 => (
            ContainerFormat::Pe,
            object::read::pe::PeFile32::parse(data).map_or(object::Architecture::Unknown, |f| f.architecture()),
        ),
        #[cfg(feature = "containers")]
        K::Pe64 => (
            ContainerFormat::Pe,
            object::read::pe::PeFile64::parse(data).map_or(object::Architecture::Unknown, |f| f.architecture()),
        ),
        #[cfg(feature = "containers")]
        K::Coff => (
            ContainerFormat::Coff,
            object::read::coff::CoffFile::<&[u8]>::parse(data)
                .map_or(object::Architecture::Unknown, |f| f.architecture()),
        ),
        #[cfg(feature = "containers")]
        K::CoffBig => (ContainerFormat::Coff, object::Architecture::Unknown),
        #[cfg(feature = "containers")]
        K::Wasm => (ContainerFormat::Wasm, object::Architecture::Wasm32),
        #[cfg(feature = "containers")]
        K::Archive => (ContainerFormat::Archive, object::Architecture::Unknown),
        _ => return None,
    };
    Some(Identity { format, machine: machine_name(machine).to_owned() })
}

#[cfg(feature = "containers")]
fn macho_arch(cputype: object::macho::CpuType) -> object::Architecture {
    match cputype {
        object::macho::CPU_TYPE_ARM64 => object::Architecture::Aarch64,
        object::macho::CPU_TYPE_X86_64 => object::Architecture::X86_64,
        object::macho::CPU_TYPE_X86 => object::Architecture::I386,
        object::macho::CPU_TYPE_ARM => object::Architecture::Arm,
        _ => object::Architecture::Unknown,
    }
}

/// Finds the blob symbol (any layout; with `prefix` when given, else preferring none) in the
/// container `data`. `Ok(None)` when the container holds none; `Err` when it is not a container
/// this module reads, or the symbol is malformed.
pub fn find_blob(data: &Bytes, prefix: Option<&str>) -> Result<Option<ContainerBlob>, ContainerError> {
    let _span = tracing::debug_span!("find_blob", bytes = data.len()).entered();
    find_in(data, 0, prefix, 0)
}

fn find_in(data: &Bytes, base: u64, prefix: Option<&str>, depth: u32) -> Result<Option<ContainerBlob>, ContainerError> {
    let Some(identity) = identify(data) else {
        let detail = match object::FileKind::parse(&data[..]) {
            Ok(kind) => format!("{kind:?} files hold no blob mblob reads"),
            Err(e) => format!("not an object file, shared library, archive or WebAssembly module: {e}"),
        };
        return Err(ContainerError { format: "unknown", offset: base, kind: ContainerErrorKind::Unreadable(detail) });
    };
    let format = identity.format.name();
    let err = |offset: u64, kind: ContainerErrorKind| ContainerError { format, offset, kind };
    match identity.format {
        ContainerFormat::Elf => {
            let found =
                crate::elf::find_blob(data, prefix).map_err(|d| err(base, ContainerErrorKind::Unreadable(d)))?;
            let Some(found) = found else { return Ok(None) };
            let bytes = slice(data, found.file_offset, found.size)
                .ok_or_else(|| err(base, outside(&found.symbol, "lies past the end of the file")))?;
            Ok(Some(ContainerBlob {
                symbol: found.symbol,
                layout: found.layout,
                prefix: found.prefix,
                identity,
                member: None,
                file_offset: Some(base + found.file_offset),
                section: found.section,
                dynamic: found.dynamic,
                system_lib: calls_registration(data),
                bytes,
            }))
        }
        ContainerFormat::MachO | ContainerFormat::Pe | ContainerFormat::Coff => {
            find_by_symbols(data, base, prefix, identity)
        }
        #[cfg(feature = "containers")]
        ContainerFormat::Wasm => wasm::find(data, base, prefix, identity),
        #[cfg(feature = "containers")]
        ContainerFormat::MachOFat => {
            let arches = fat_arches(data).map_err(|d| err(base, ContainerErrorKind::Unreadable(d)))?;
            let parts = arches.into_iter().map(|(name, (start, size))| (name, start, size));
            find_in_parts(data, base, prefix, depth, format, parts)
        }
        #[cfg(feature = "containers")]
        ContainerFormat::Archive => {
            let archive = ArchiveFile::parse(&data[..]).map_err(|e| err(base, unreadable(e)))?;
            let mut parts = Vec::new();
            for member in archive.members() {
                let member = member.map_err(|e| err(base, unreadable(e)))?;
                let name = String::from_utf8_lossy(member.name()).into_owned();
                let (start, size) = member.file_range();
                parts.push((name, start, size));
            }
            find_in_parts(data, base, prefix, depth, format, parts.into_iter())
        }
        #[cfg(not(feature = "containers"))]
        _ => {
            let _ = depth;
            let kind =
                ContainerErrorKind::Unreadable("mblob-runtime was built without the `containers` feature".into());
            Err(err(base, kind))
        }
    }
}

#[cfg(feature = "containers")]
/// The blob among the parts of a fat file or an archive: at most one may hold one. Parts that
/// are no container (an archive's symbol index, a text file) hold none.
fn find_in_parts(
    data: &Bytes,
    base: u64,
    prefix: Option<&str>,
    depth: u32,
    format: &'static str,
    parts: impl Iterator<Item = (String, u64, u64)>,
) -> Result<Option<ContainerBlob>, ContainerError> {
    if depth >= MAX_DEPTH {
        let kind = ContainerErrorKind::Unreadable("containers nested too deep".into());
        return Err(ContainerError { format, offset: base, kind });
    }
    let mut found: Option<ContainerBlob> = None;
    for (name, start, size) in parts {
        let Some(part) = slice(data, start, size) else {
            let kind = ContainerErrorKind::Unreadable(format!(
                "member {name} (bytes {start}..{}) lies past the end of the file",
                start.saturating_add(size)
            ));
            return Err(ContainerError { format, offset: base, kind });
        };
        if identify(&part).is_none() {
            continue;
        }
        let Some(mut blob) = find_in(&part, base + start, prefix, depth + 1)? else { continue };
        if let Some(first) = &found {
            let kind = ContainerErrorKind::TwoBlobs { first: first.member.clone().unwrap_or_default(), second: name };
            return Err(ContainerError { format, offset: base + start, kind });
        }
        blob.member = Some(match blob.member.take() {
            Some(inner) => format!("{name}({inner})"),
            None => name,
        });
        found = Some(blob);
    }
    Ok(found)
}

/// Every blob of a container: one per archive member that holds one, in member order (a
/// bundle: MLC's `libmodel_android.a` of several models, each under its own prefix), or the
/// one blob of any other container ([`find_blob`] without a prefix).
pub fn find_blobs(data: &Bytes) -> Result<Vec<ContainerBlob>, ContainerError> {
    #[cfg(feature = "containers")]
    if identify(data).is_some_and(|i| i.format == ContainerFormat::Archive) {
        let err = |kind| ContainerError { format: "archive", offset: 0, kind };
        let archive = ArchiveFile::parse(&data[..]).map_err(|e| err(unreadable(e)))?;
        let mut found = Vec::new();
        for member in archive.members() {
            let member = member.map_err(|e| err(unreadable(e)))?;
            let name = String::from_utf8_lossy(member.name()).into_owned();
            let (start, size) = member.file_range();
            let part = slice(data, start, size).ok_or_else(|| {
                err(ContainerErrorKind::Unreadable(format!("member {name} lies past the end of the file")))
            })?;
            if identify(&part).is_none() {
                continue;
            }
            if let Some(mut blob) = find_in(&part, start, None, 1)? {
                blob.member = Some(name);
                found.push(blob);
            }
        }
        return Ok(found);
    }
    Ok(find_blob(data, None)?.into_iter().collect())
}

/// A slice of a fat Mach-O file: architecture name and file range (offset, size).
#[cfg(feature = "containers")]
type FatSlice = (String, (u64, u64));

/// The slices of a fat Mach-O file.
#[cfg(feature = "containers")]
fn fat_arches(data: &[u8]) -> Result<Vec<FatSlice>, String> {
    fn arches<A: FatArch>(list: &[A]) -> Vec<FatSlice> {
        list.iter().map(|a| (machine_name(a.architecture()).to_owned(), a.file_range())).collect()
    }
    match object::FileKind::parse(data).map_err(|e| e.to_string())? {
        object::FileKind::MachOFat32 => {
            MachOFatFile32::parse(data).map(|f| arches(f.arches())).map_err(|e| e.to_string())
        }
        object::FileKind::MachOFat64 => {
            MachOFatFile64::parse(data).map(|f| arches(f.arches())).map_err(|e| e.to_string())
        }
        other => Err(format!("{other:?} is not a fat Mach-O file")),
    }
}

fn unreadable(e: object::read::Error) -> ContainerErrorKind {
    ContainerErrorKind::Unreadable(e.to_string())
}

fn outside(symbol: &str, detail: impl Into<String>) -> ContainerErrorKind {
    ContainerErrorKind::Outside { symbol: symbol.to_owned(), detail: detail.into() }
}

/// `data[start..start + size]`, when it lies in `data`.
pub(crate) fn slice(data: &Bytes, start: u64, size: u64) -> Option<Bytes> {
    let start = usize::try_from(start).ok()?;
    let end = start.checked_add(usize::try_from(size).ok()?)?;
    data.slice(start..end)
}

/// The C name of a symbol: Mach-O (and 32-bit Windows) put `_` in front of C names.
fn c_name<'a>(name: &'a str, identity: &Identity) -> Option<&'a str> {
    let underscore = identity.format == ContainerFormat::MachO
        || (identity.format == ContainerFormat::Coff || identity.format == ContainerFormat::Pe)
            && identity.machine == "i386";
    if underscore {
        name.strip_prefix('_')
    } else {
        Some(name)
    }
}

/// The blob's length as its 8-byte header gives it (header included), when the header fits in
/// `room` bytes and the length fits too: formats without symbol sizes (Mach-O, COFF, PE exports)
/// cut the blob by it.
pub(crate) fn header_len(bytes: &[u8]) -> Option<u64> {
    let header: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    u64::from_le_bytes(header).checked_add(8)
}

/// A blob symbol of a Mach-O, PE or COFF file, found by its symbols (and a PE file's exports).
fn find_by_symbols(
    data: &Bytes,
    base: u64,
    prefix: Option<&str>,
    identity: Identity,
) -> Result<Option<ContainerBlob>, ContainerError> {
    let format = identity.format.name();
    let err = |kind: ContainerErrorKind| ContainerError { format, offset: base, kind };
    let file = object::File::parse(&data[..]).map_err(|e| err(unreadable(e)))?;
    // Candidates: (name, address, size, section index, dynamic).
    let mut candidates: Vec<(String, u64, u64, Option<object::SectionIndex>, bool)> = Vec::new();
    for sym in file.symbols() {
        if sym.is_undefined() {
            continue;
        }
        let Ok(raw) = sym.name_bytes() else { continue };
        if raw.len() > MAX_NAME {
            continue;
        }
        let Ok(name) = std::str::from_utf8(raw) else { continue };
        let Some(name) = c_name(name, &identity) else { continue };
        if Layout::from_symbol(name).is_some() {
            candidates.push((name.to_owned(), sym.address(), sym.size(), sym.section_index(), false));
        }
    }
    // PE keeps what a DLL exports in its export table, not in a symbol table. A Mach-O file's
    // exported symbols are in its symbol table (read above), and its export trie is not walked:
    // `object`'s walk of a trie whose nodes point back at each other never ends (found by the
    // `container_macho` fuzz target; the input is in runtime/tests/fuzz_regressions/).
    let walk_exports = !matches!(file.format(), object::BinaryFormat::MachO);
    if let Some(exports) = file.exports().ok().filter(|_| walk_exports) {
        for export in exports.flatten() {
            let object::ExportTarget::Address { address } = export.target() else { continue };
            let object::NameOrOrdinal::Name(raw) = export.name() else { continue };
            let Ok(name) = std::str::from_utf8(raw) else { continue };
            let Some(name) = c_name(name, &identity) else { continue };
            if Layout::from_symbol(name).is_some() && !candidates.iter().any(|c| c.0 == name) {
                candidates.push((name.to_owned(), address, 0, None, true));
            }
        }
    }
    let mut found: Vec<ContainerBlob> = Vec::new();
    for (name, address, size, index, dynamic) in candidates {
        let Some((layout, pfx)) = Layout::from_symbol(&name) else { continue };
        if prefix.is_some_and(|p| p != pfx) {
            continue;
        }
        // The section: the symbol's own, or the one whose addresses hold it.
        let section = match index {
            Some(i) => file.section_by_index(i).map_err(|e| err(unreadable(e)))?,
            None => match file.sections().find(|s| s.address() <= address && address - s.address() < s.size().max(1)) {
                Some(s) => s,
                None => return Err(err(outside(&name, format!("(address {address:#x}) lies in no section")))),
            },
        };
        let section_name = section.name().map(Cow::Borrowed).unwrap_or(Cow::Borrowed("?")).into_owned();
        if section.kind() == SectionKind::UninitializedData {
            return Err(err(ContainerErrorKind::NoBytes { symbol: name, section: section_name }));
        }
        let Some((sec_off, sec_size)) = section.file_range() else {
            return Err(err(ContainerErrorKind::NoBytes { symbol: name, section: section_name }));
        };
        let within = address
            .checked_sub(section.address())
            .filter(|w| *w <= sec_size)
            .ok_or_else(|| err(outside(&name, format!("lies outside its section {section_name}"))))?;
        let room = sec_size - within;
        let start = sec_off
            .checked_add(within)
            .filter(|s| *s <= data.len() as u64)
            .ok_or_else(|| err(outside(&name, "lies past the end of the file")))?;
        let room = room.min(data.len() as u64 - start);
        let size = if size == 0 {
            // No symbol size: the blob's own header says how long it is.
            let head = slice(data, start, room.min(8)).unwrap_or_else(|| Bytes::from_vec(Vec::new()));
            header_len(&head).filter(|n| *n <= room).ok_or_else(|| {
                err(outside(
                    &name,
                    format!("has a header that claims more than the {room} bytes left in {section_name}"),
                ))
            })?
        } else {
            size
        };
        if size > room {
            return Err(err(outside(
                &name,
                format!("claims {size} bytes but only {room} remain in section {section_name}"),
            )));
        }
        let bytes = slice(data, start, size).ok_or_else(|| err(outside(&name, "lies past the end of the file")))?;
        found.push(ContainerBlob {
            symbol: name.clone(),
            layout,
            prefix: pfx.to_owned(),
            identity: identity.clone(),
            member: None,
            file_offset: Some(base + start),
            section: section_name,
            dynamic,
            system_lib: false,
            bytes,
        });
    }
    found.sort_by_key(|b| !b.prefix.is_empty());
    let system_lib = calls_registration(data);
    Ok(found.into_iter().next().map(|b| ContainerBlob { system_lib, ..b }))
}

/// The functions a system-lib blob registers itself with (TVM up to 0.21, and 0.22+).
pub(crate) const REGISTER_FUNCTIONS: [&str; 2] =
    ["TVMBackendRegisterSystemLibSymbol", "TVMFFIEnvModRegisterSystemLibSymbol"];

/// Whether the object or library `data` calls a system-lib registration function (an undefined
/// symbol of that name, with Mach-O's `_` in front or not).
pub(crate) fn calls_registration(data: &[u8]) -> bool {
    let Ok(file) = object::File::parse(data) else { return false };
    let is_register = |name: &str| {
        REGISTER_FUNCTIONS.contains(&name.strip_prefix('_').unwrap_or(name)) || REGISTER_FUNCTIONS.contains(&name)
    };
    file.symbols().chain(file.dynamic_symbols()).any(|s| {
        s.is_undefined()
            && s.name_bytes()
                .ok()
                .filter(|n| n.len() <= MAX_NAME)
                .and_then(|n| std::str::from_utf8(n).ok())
                .is_some_and(is_register)
    })
}
