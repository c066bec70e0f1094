//! The direct route: the linker never sees the blob's bytes; mblob writes them once, into the
//! linked library.
//!
//! 1. `write_placeholder` writes a tiny object (with the `object` crate): the blob symbol,
//!    `PLACEHOLDER_LEN` byte long, alone in the section [`SECTION`] (read-only, allocated;
//!    flagged `SHF_X86_64_LARGE` on x86-64), and a linker script fragment
//!    (`LINKER_SCRIPT`) that places that section after `.bss`, on a page of its own: the last
//!    loadable segment, at the end of the address space and of the file's loaded part. GNU ld
//!    and ld.lld both take the fragment (`INSERT AFTER` keeps their default layout).
//! 2. The library is linked as usual, with the placeholder among the objects.
//! 3. `place_blob` checks that layout in the linked library (ELF64, little-endian), moves
//!    what follows the placeholder in the file (the sections that are not loaded and the
//!    section header table) past the blob, streams the blob in at the section's file offset,
//!    and sets the sizes that grow with it: the section's `sh_size`, the segment's `p_filesz`
//!    and `p_memsz`, the symbol's `st_size` in `.symtab` and `.dynsym`, and any symbol that
//!    marked the placeholder's end.
//!
//! The linker's work is then independent of the blob (milliseconds), the blob is written once
//! (the LLVM and C routes write it three times: the object, the linker's read, its output), and
//! no process holds it in memory. The address and every relocation stay as the linker made
//! them: only the last segment grows, and nothing lies above it.
//!
//! The linker's build ID (`.note.gnu.build-id`, which Debian's compilers ask for) covers the
//! placeholder, not the blob: two exports of the same host code with different blobs would
//! share it, and debuggers and `debuginfod` would take one library for the other. `place_blob`
//! therefore replaces it, same size, with a hash (XXH3-128, extended with seeds to the note's
//! size) of the linker's ID and of the blob's bytes, computed as they stream by. It is not the
//! linker's algorithm over the whole file (that would read the blob a second time), but like it
//! it changes whenever the host code or the blob does, and is the same for the same inputs.
//!
//! What the route does not give: the blob object itself (a `.tar` output or `--emit-devc` need
//! one).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, Sym};
use object::write::{Object, Symbol, SymbolSection};
use object::{
    Architecture, BinaryFormat, Endianness, LittleEndian as LE, SectionFlags, SectionKind, SymbolFlags, SymbolKind,
    SymbolScope, U64,
};

use xxhash_rust::xxh3::{xxh3_128_with_seed, Xxh3};

use super::{BlobSource, PackOptions};
use crate::{Error, Result};

/// The section that holds the blob, in the placeholder object and in the library.
pub const SECTION: &str = ".lrodata.mblob";

/// Bytes of the placeholder (the symbol's size until the blob is placed).
pub(crate) const PLACEHOLDER_LEN: u64 = 1;

/// The linker script fragment: [`SECTION`] alone, after `.bss`, starting a page of its own
/// (the expression is the one GNU ld's default script uses for `.lrodata`).
pub(crate) const LINKER_SCRIPT: &str = "/* mblob: the blob placeholder goes last, in a segment of its own. */\n\
SECTIONS\n{\n  .lrodata.mblob ALIGN(CONSTANT(MAXPAGESIZE)) + (. & (CONSTANT(MAXPAGESIZE) - 1)) : { KEEP(*(.lrodata.mblob)) }\n}\n\
INSERT AFTER .bss;\n";

/// Whether the direct route can write a library for these options: ELF64 little-endian
/// targets whose objects mblob writes (x86-64, AArch64), without the system-lib constructor.
pub(crate) fn supports(opts: &PackOptions) -> bool {
    let t = opts.triple();
    opts.is_elf() && !opts.system_lib && (t.starts_with("x86_64") || t.starts_with("aarch64"))
}

/// Writes `<dir>/<stem>.o` (the placeholder object) and `<dir>/<stem>.ld` (the linker script
/// fragment); returns their paths. Pass the script to the linker as `-Wl,-T,<script>`.
///
/// # Errors
/// [`Error::Options`] for a bad prefix, [`Error::Target`] for options the route does not support ([`supports`]),
/// [`Error::Io`] when a file cannot be written.
pub(crate) fn write_placeholder(opts: &PackOptions, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    opts.check()?;
    if !supports(opts) {
        return Err(Error::Target {
            what: format!("target {}", opts.triple()),
            detail: "the direct route writes x86-64 and AArch64 ELF libraries without --system-lib only".into(),
        });
    }
    let x86 = opts.triple().starts_with("x86_64");
    let arch = if x86 { Architecture::X86_64 } else { Architecture::Aarch64 };
    let mut obj = Object::new(BinaryFormat::Elf, arch, Endianness::Little);
    let sec = obj.add_section(Vec::new(), SECTION.as_bytes().to_vec(), SectionKind::ReadOnlyData);
    let large = if x86 { super::SHF_X86_64_LARGE } else { 0 };
    obj.section_mut(sec).flags =
        SectionFlags::Elf { sh_type: elf::SHT_PROGBITS, sh_flags: elf::SectionFlags(elf::SHF_ALLOC.0 | large) };
    obj.set_section_data(sec, vec![0u8; PLACEHOLDER_LEN as usize], 1);
    obj.add_symbol(Symbol {
        name: opts.symbol().into_bytes(),
        value: 0,
        size: PLACEHOLDER_LEN,
        kind: SymbolKind::Data,
        scope: SymbolScope::Dynamic,
        weak: false,
        section: SymbolSection::Section(sec),
        flags: SymbolFlags::None,
    });
    // Without it the linker would make the library's stack executable.
    let note = obj.add_section(Vec::new(), b".note.GNU-stack".to_vec(), SectionKind::Other);
    obj.section_mut(note).flags = SectionFlags::Elf { sh_type: elf::SHT_PROGBITS, sh_flags: elf::SectionFlags(0) };
    let bytes = obj
        .write()
        .map_err(|e| Error::Internal { what: "the placeholder object".into(), detail: e.to_string().into() })?;
    let path = dir.join(format!("{}.o", opts.file_stem()));
    std::fs::write(&path, bytes).map_err(Error::io(&path, "cannot write"))?;
    let script = dir.join(format!("{}.ld", opts.file_stem()));
    std::fs::write(&script, LINKER_SCRIPT).map_err(Error::io(&script, "cannot write"))?;
    tracing::debug!(object = %path.display(), script = %script.display(), "wrote the blob placeholder");
    Ok((path, script))
}

/// A checked write at a file offset, naming the file in its error.
fn write_at(file: &File, path: &Path, bytes: &[u8], at: u64) -> Result<()> {
    file.write_all_at(bytes, at).map_err(Error::io(path, "cannot write"))
}

/// What [`place_blob`] changes, worked out from the linked library before anything is written.
#[derive(Debug)]
struct Plan {
    /// File offset of the blob (the placeholder's).
    at: u64,
    /// Where the part that follows the placeholder starts in the linked file.
    tail_from: u64,
    /// How far that part moves.
    shift: u64,
    /// The linked file with the headers, section headers and symbols already changed.
    patched: Vec<u8>,
    /// The build ID's bytes in the file, replaced once the blob's hash is known.
    build_id: Option<std::ops::Range<u64>>,
}

/// Writes the blob into `library`, a shared library linked with the placeholder of
/// [`write_placeholder`] for `symbol`, and fixes the sizes (see the module docs).
///
/// # Errors
/// [`Error::Linked`] naming the library when its layout is not the one the linker script asks
/// for (another linker, a host object with its own large data...), or when the blob source
/// writes a length other than the one it announced; [`Error::Io`] when the file cannot be
/// read or written.
pub(crate) fn place_blob(library: &Path, symbol: &str, blob: &dyn BlobSource) -> Result<()> {
    let len = blob.blob_len();
    let _span = tracing::info_span!("place", library = %library.display(), bytes = len).entered();
    let invalid = |detail: String| Error::Linked { what: library.display().to_string(), detail: detail.into() };
    // The library holds the host code and a 1-byte placeholder: small whatever the blob.
    let data = std::fs::read(library).map_err(Error::io(library, "cannot read"))?;
    let plan = plan(&data, symbol, len).map_err(invalid)?;
    let file = OpenOptions::new().write(true).open(library).map_err(Error::io(library, "cannot open"))?;
    // What followed the placeholder, moved past the blob (the file takes its final length).
    let tail = plan.patched.get(usize::try_from(plan.tail_from).unwrap_or(usize::MAX)..).unwrap_or_default();
    let tail_at = plan.tail_from + plan.shift;
    write_at(&file, library, tail, tail_at)?;
    // The blob, once, streamed (and hashed on the way, for the build ID).
    let at = super::AtWriter { file: &file, pos: plan.at, written: 0 };
    let mut w = io::BufWriter::with_capacity(1 << 20, Hashing { inner: at, hash: Xxh3::new() });
    blob.write_blob(&mut w).and_then(|_| w.flush()).map_err(Error::io(library, "cannot write the blob"))?;
    let Hashing { inner, hash } =
        w.into_inner().map_err(|e| Error::io(library, "cannot write the blob")(e.into_error()))?;
    let written = inner.written;
    let mut patched = plan.patched;
    if let Some(id) = plan.build_id {
        let range = usize::try_from(id.start).unwrap_or(usize::MAX)..usize::try_from(id.end).unwrap_or(usize::MAX);
        let old = patched.get(range.clone()).ok_or_else(|| invalid("build ID outside the file".into()))?.to_vec();
        let new = build_id(&old, hash.digest128());
        patched[range].copy_from_slice(&new);
    }
    if written != len {
        return Err(invalid(format!("the blob source wrote {written} bytes but announced {len}")));
    }
    // Zeros between the blob and the moved part (old bytes of the tail may lie there).
    let gap_from = plan.at + len;
    let gap = usize::try_from(tail_at - gap_from).map_err(|_| invalid("gap too large".into()))?;
    write_at(&file, library, &vec![0u8; gap], gap_from)?;
    // The headers (and the build ID), last.
    write_at(&file, library, &patched[..usize::try_from(plan.at).unwrap_or(0)], 0)?;
    Ok(())
}

/// Passes writes on and hashes what was written.
struct Hashing<W> {
    inner: W,
    hash: Xxh3,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The new build ID: as many bytes as the linker's `old` one, from XXH3-128 of the old ID
/// and the blob's hash, with seeds 0, 1, ... for each further 16 bytes.
fn build_id(old: &[u8], blob_hash: u128) -> Vec<u8> {
    let mut input = old.to_vec();
    input.extend_from_slice(&blob_hash.to_le_bytes());
    let mut id = Vec::with_capacity(old.len() + 16);
    for seed in 0u64.. {
        if id.len() >= old.len() {
            break;
        }
        id.extend_from_slice(&xxh3_128_with_seed(&input, seed).to_le_bytes());
    }
    id.truncate(old.len());
    id
}

/// Where the descriptor of the `NT_GNU_BUILD_ID` note lies in the file, when there is one
/// before `before` (in the loaded part, which the headers' rewrite covers).
fn find_build_id(
    data: &[u8],
    sections: &object::read::elf::SectionTable<'_, elf::FileHeader64<LE>>,
    before: u64,
) -> Option<std::ops::Range<u64>> {
    let e = LE;
    for s in sections.iter().filter(|s| s.sh_type(e) == elf::SHT_NOTE) {
        let Ok(Some(mut notes)) = s.notes(e, data) else { continue };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(e) == elf::NT_GNU_BUILD_ID {
                let desc = note.desc();
                let start = desc.as_ptr() as usize - data.as_ptr() as usize;
                let range = start as u64..(start + desc.len()) as u64;
                return (!desc.is_empty() && range.end <= before).then_some(range);
            }
        }
    }
    None
}

/// Checks the linked layout and prepares the patched headers.
fn plan(data: &[u8], symbol: &str, len: u64) -> std::result::Result<Plan, String> {
    let header = elf::FileHeader64::<LE>::parse(data).map_err(|e| format!("not an ELF64 file: {e}"))?;
    if header.e_ident.data != elf::ELFDATA2LSB {
        return Err("not a little-endian ELF file".into());
    }
    let e = LE;
    let sections = header.sections(e, data).map_err(|e| e.to_string())?;
    let segments = header.program_headers(e, data).map_err(|e| e.to_string())?;
    // The blob symbol in the dynamic symbol table names the placeholder section.
    let dynsym = sections.symbols(e, data, elf::SHT_DYNSYM).map_err(|e| e.to_string())?;
    let sym = dynsym
        .symbols()
        .iter()
        .find(|s| dynsym.symbol_name(e, s) == Ok(symbol.as_bytes()) && s.st_shndx(e) != elf::SHN_UNDEF)
        .ok_or_else(|| format!("no dynamic symbol `{symbol}`"))?;
    let index = object::SectionIndex(usize::from(sym.st_shndx(e).index().ok_or("the blob symbol has no section")?));
    let sec = sections.section(index).map_err(|e| e.to_string())?;
    let name = sections.section_name(e, sec).unwrap_or(b"?");
    let (addr, at, size) = (sec.sh_addr(e), sec.sh_offset(e), sec.sh_size(e));
    if name != SECTION.as_bytes() || sec.sh_type(e) != elf::SHT_PROGBITS || size != PLACEHOLDER_LEN {
        return Err(format!(
            "`{symbol}` is in {} ({size} bytes), not in the {PLACEHOLDER_LEN}-byte placeholder section {SECTION}",
            String::from_utf8_lossy(name)
        ));
    }
    if sym.st_value(e) != addr || sym.st_size(e) != PLACEHOLDER_LEN {
        return Err(format!("`{symbol}` is not the whole placeholder section"));
    }
    let end = at + PLACEHOLDER_LEN;
    let addr_end = addr + PLACEHOLDER_LEN;
    let not_last = |what: String| {
        format!(
            "the placeholder section {SECTION} is not the last of the loaded part ({what}); the linker did not follow \
             mblob's linker script (a linker other than GNU ld or ld.lld, or host objects with their own large \
             data): use another backend (--backend llvm or c)"
        )
    };
    // Nothing loaded above it, in memory or in the file.
    for (i, s) in sections.iter().enumerate() {
        if i == index.0 || s.sh_flags(e).0 & elf::SHF_ALLOC.0 == 0 {
            continue;
        }
        let s_end = s.sh_addr(e).checked_add(s.sh_size(e)).ok_or("section address overflows")?;
        let in_file = s.sh_type(e) != elf::SHT_NOBITS;
        if s_end > addr || (in_file && s.sh_offset(e) >= end) {
            return Err(not_last(format!(
                "section {} follows it",
                String::from_utf8_lossy(sections.section_name(e, s).unwrap_or(b"?"))
            )));
        }
    }
    let mut segment = None;
    for (i, p) in segments.iter().enumerate() {
        let (off, filesz, vaddr, memsz) = (p.p_offset(e), p.p_filesz(e), p.p_vaddr(e), p.p_memsz(e));
        let f_end = off.checked_add(filesz).ok_or("segment overflows")?;
        let v_end = vaddr.checked_add(memsz).ok_or("segment overflows")?;
        if p.p_type(e) == elf::PT_LOAD && f_end == end && v_end == addr_end && off <= at && filesz == memsz {
            segment = Some(i);
        } else if f_end > end || (p.p_type(e) == elf::PT_LOAD && v_end > addr) {
            return Err(not_last(format!("segment {i} reaches past it")));
        }
    }
    let segment = segment.ok_or_else(|| not_last("no loadable segment ends with it".into()))?;
    // What follows it in the file moves by a whole number of pages (alignments kept).
    let mut align = 4096u64;
    for s in sections.iter().filter(|s| s.sh_offset(e) >= end && s.sh_type(e) != elf::SHT_NOBITS) {
        let a = s.sh_addralign(e);
        if a > align {
            if !a.is_power_of_two() || a > 1 << 30 {
                return Err(format!("section alignment {a} is not a power of two up to 1 GiB"));
            }
            align = a;
        }
    }
    let grow = len.checked_sub(PLACEHOLDER_LEN).ok_or("the blob is shorter than its placeholder")?;
    let shift = grow.checked_next_multiple_of(align).ok_or("blob too large")?;
    let data_len = data.len() as u64;
    data_len.checked_add(shift).ok_or("blob too large")?;
    if header.e_phoff(e) >= at {
        return Err("the program headers follow the placeholder".into());
    }

    let mut patched = data.to_vec();
    let put = |buf: &mut Vec<u8>, at: u64, bytes: &[u8]| -> std::result::Result<(), String> {
        let at = usize::try_from(at).map_err(|_| "offset overflows")?;
        buf.get_mut(at..at + bytes.len()).ok_or("header outside the file")?.copy_from_slice(bytes);
        Ok(())
    };
    // ELF header: the section header table moves when it follows the placeholder.
    let shoff = header.e_shoff(e);
    let mut fh = *header;
    if shoff >= end {
        fh.e_shoff = U64::new(e, shoff + shift);
    }
    put(&mut patched, 0, object::bytes_of(&fh))?;
    // Section headers: the blob section's size; the moved sections' offsets.
    let shentsize = u64::from(header.e_shentsize(e));
    for (i, s) in sections.iter().enumerate() {
        let mut h = *s;
        if i == index.0 {
            h.sh_size = U64::new(e, len);
        } else if s.sh_offset(e) >= end && s.sh_type(e) != elf::SHT_NOBITS {
            h.sh_offset = U64::new(e, s.sh_offset(e) + shift);
        } else {
            continue;
        }
        put(&mut patched, shoff + i as u64 * shentsize, object::bytes_of(&h))?;
    }
    // The last segment grows by the blob.
    let phentsize = u64::from(header.e_phentsize(e));
    let mut ph = segments[segment];
    ph.p_filesz = U64::new(e, ph.p_filesz(e) + grow);
    ph.p_memsz = U64::new(e, ph.p_memsz(e) + grow);
    put(&mut patched, header.e_phoff(e) + segment as u64 * phentsize, object::bytes_of(&ph))?;
    // Symbols: the blob's size, and end markers moved to the new end.
    let mut found_dynamic = false;
    for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        let table = sections.symbols(e, data, kind).map_err(|e| e.to_string())?;
        let Some(table_header) = sections.section(table.section()).ok().filter(|_| !table.is_empty()) else {
            continue;
        };
        let base = table_header.sh_offset(e);
        for (i, s) in table.symbols().iter().enumerate() {
            if s.st_shndx(e).index().map(usize::from) != Some(index.0) {
                continue;
            }
            let mut new = *s;
            if s.st_value(e) == addr && table.symbol_name(e, s) == Ok(symbol.as_bytes()) {
                new.st_size = U64::new(e, len);
                found_dynamic |= kind == elf::SHT_DYNSYM;
            } else if s.st_value(e) == addr_end {
                new.st_value = U64::new(e, addr + len);
            } else {
                continue;
            }
            let at = base + i as u64 * std::mem::size_of::<elf::Sym64<LE>>() as u64;
            put(&mut patched, at, object::bytes_of(&new))?;
        }
    }
    if !found_dynamic {
        return Err(format!("`{symbol}` is not in the dynamic symbol table"));
    }
    let build_id = find_build_id(data, &sections, at);
    Ok(Plan { at, tail_from: end, shift, patched, build_id })
}
