//! The LLVM route (TVM's `PackImportsToLLVM` / `codegen_blob.cc`), with LLVM 14 via inkwell.
//!
//! The module (`<prefix>devc`) holds the blob symbol as a constant `[N x i8]` global: external
//! linkage, align 1, no trailing NUL, triple and data layout of the target machine, PIC.
//! System-lib mode adds TVM's static constructor that registers the blob by name. For every
//! golden blob, the object is byte for byte the `devc.o` TVM wrote.
//!
//! Where we differ from TVM, and why:
//! - **Bytes placed after emission.** LLVM copies and hashes constant data (two extra copies
//!   of the blob, 2x its size in RSS, and most of the time). We give the global a zero
//!   initializer of the right size in an explicitly named section (`.rodata`, so it stays
//!   `PROGBITS` and never becomes `.bss`), which LLVM emits as a fill without holding the
//!   bytes, then stream the blob into the object at the symbol's file offset. Section, symbol,
//!   size, alignment and every other byte are what LLVM writes for the real initializer (a
//!   test compares whole objects). Measured at 512 MiB: 1.0 s and a flat 29 MB peak RSS,
//!   against 2.9 to 4.2 s and 1.05 GB with the bytes as the initializer.
//! - **No 4 GiB ceiling.** LLVM 14 takes array lengths as 32 bits (inkwell passes `len as u32`,
//!   which would silently truncate). A blob of 4 GiB or more becomes a packed struct
//!   `<{ [K x [2 GiB x i8]], [R x i8] }>`: same bytes, same symbol size.
//! - **`SHF_X86_64_LARGE` on `.lrodata`.** LLVM 14 names the section but does not flag it, and
//!   GNU gold places large sections by flag (it fails to link a 2.5 GiB blob otherwise); we set
//!   the flag in the section header, as GCC and the C packer's assembly do.
//! - **`.init_array` for the system-lib constructor on ELF** (see `build_module`).
//! - **Relaxable GOT relocations on x86-64.** The system-lib constructor loads the blob's
//!   address through the GOT; LLVM 14's C API writes `R_X86_64_GOTPCREL`, the LLVM of TVM's
//!   wheels `R_X86_64_REX_GOTPCRELX` (same instruction, relaxable by the linker), which we
//!   write too. With the constructor first, as TVM defines it, a system-lib object is TVM
//!   0.19's byte for byte (checked with TVM from PyPI); TVM 0.27's LLVM also relocates the
//!   `.init_array` entry against the constructor's symbol instead of its section's.
//! - **Grown, not emitted at full size.** LLVM emits the object of a 1-byte blob; mblob
//!   writes it out at the blob's length by LLVM's layout rule (section contents at their
//!   alignments in file order, the section header table last), streaming the blob in, so the
//!   blob is written once. A test compares the result with LLVM's object for many lengths.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Once;

use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, PointerValue};
use inkwell::{AddressSpace, OptimizationLevel};
use object::{Object, ObjectSection, ObjectSymbol};

use super::{BlobSource, PackOptions};
use crate::{Error, Result};

/// The largest blob the LLVM packer accepts: far beyond any disk, and small enough that the
/// sizes and offsets inside LLVM (signed 64-bit in places) cannot overflow.
pub(crate) const MAX_BLOB: u64 = 1 << 48;

/// Array length of each part of a blob of 4 GiB or more (LLVM 14 array lengths are `u32`).
const PART: u64 = 1 << 31;

fn llvm(step: &'static str) -> impl Fn(String) -> Error {
    move |message| Error::Llvm { step, message }
}

fn init_targets() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let config = InitializationConfig::default();
        Target::initialize_x86(&config);
        Target::initialize_aarch64(&config);
    });
}

/// A target machine for `triple` as TVM's LLVM target makes it (PIC, optimization level 3,
/// the CPU TVM's LLVM takes by default), with the x86 and AArch64
/// targets initialized.
///
/// # Errors
/// [`Error::Llvm`] when LLVM does not know the triple.
pub(crate) fn target_machine(triple: &str) -> Result<TargetMachine> {
    init_targets();
    // TVM's LLVM picks Apple's first 64-bit core for an arm64 Apple triple without `-mcpu`
    // (its scheduling model orders the system-lib constructor's loads as TVM's objects have
    // them); `generic` elsewhere.
    let apple = ["apple", "darwin", "macos", "ios"].iter().any(|p| triple.contains(p));
    let cpu =
        if apple && (triple.starts_with("arm64") || triple.starts_with("aarch64")) { "apple-a7" } else { "generic" };
    let triple = TargetTriple::create(triple);
    let target = Target::from_triple(&triple).map_err(|e| llvm("target lookup")(e.to_string()))?;
    target
        .create_target_machine(&triple, cpu, "", OptimizationLevel::Aggressive, RelocMode::PIC, CodeModel::Default)
        .ok_or_else(|| llvm("target machine")(format!("no target machine for {}", triple.as_str().to_string_lossy())))
}

/// Checks that a blob of `len` bytes is within [`MAX_BLOB`].
///
/// # Errors
/// [`Error::TooLarge`] above it.
pub(crate) fn check_len(len: u64) -> Result<()> {
    if len > MAX_BLOB {
        return Err(Error::TooLarge { what: "blob", len, limit: MAX_BLOB, route: "the LLVM packer", hint: "" });
    }
    Ok(())
}

/// The LLVM type of a blob of `len` bytes: `[len x i8]` below 4 GiB (what TVM emits), else a
/// packed struct of 2 GiB arrays and the rest, whose size is exactly `len`.
///
/// # Errors
/// [`Error::TooLarge`] above [`MAX_BLOB`].
pub(crate) fn blob_type(ctx: &Context, len: u64) -> Result<BasicTypeEnum<'_>> {
    check_len(len)?;
    let i8t = ctx.i8_type();
    if let Ok(n) = u32::try_from(len) {
        return Ok(i8t.array_type(n).into());
    }
    let too_large = || Error::TooLarge { what: "blob", len, limit: MAX_BLOB, route: "the LLVM packer", hint: "" };
    let parts = u32::try_from(len / PART).map_err(|_| too_large())?;
    let part = i8t.array_type(u32::try_from(PART).map_err(|_| too_large())?);
    let mut fields: Vec<BasicTypeEnum<'_>> = vec![part.array_type(parts).into()];
    let rest = u32::try_from(len % PART).map_err(|_| too_large())?;
    if rest > 0 {
        fields.push(i8t.array_type(rest).into());
    }
    Ok(ctx.struct_type(&fields, true).into())
}

/// Writes `<dir>/<stem>.o` holding `blob` under the blob symbol (see the module docs for how).
///
/// # Errors
/// [`Error::Options`] for a bad prefix, [`Error::Target`] for a target that is not ELF, [`Error::TooLarge`] above
/// 2<sup>48</sup> bytes,
/// [`Error::Llvm`] when LLVM refuses the target or the emission, [`Error::Io`] when the object
/// cannot be written (checked before LLVM writes: LLVM aborts the process on a failed write).
/// On error no object is left at the path.
pub fn write_object(blob: &dyn BlobSource, opts: &PackOptions, dir: &Path) -> Result<PathBuf> {
    write_object_in(blob, opts, dir, opts.section_for(blob.blob_len()))
}

/// [`write_object`] with the section chosen by the caller (tests use `.lrodata` on small
/// blobs).
pub(crate) fn write_object_in(
    blob: &dyn BlobSource,
    opts: &PackOptions,
    dir: &Path,
    section: Option<&'static str>,
) -> Result<PathBuf> {
    opts.check()?;
    let len = blob.blob_len();
    let triple = opts.triple();
    let span = tracing::info_span!(
        "pack",
        route = "llvm",
        bytes = len,
        symbol = %opts.symbol(),
        section = section.unwrap_or("(default)"),
        target = %triple,
        system_lib = opts.system_lib,
    );
    let _span = span.entered();
    check_len(len)?;
    let tm = target_machine(&triple)?;
    let path = dir.join(format!("{}.o", opts.file_stem()));
    check_room(&path, len.saturating_add(1 << 16))?;
    let large = section == Some(".lrodata") && opts.is_x86_64_elf();
    // The object of a 1-byte blob, grown to the blob's length as LLVM would have laid it out;
    // where that layout cannot be reproduced, the object LLVM emits for the real length.
    let ctx = Context::create();
    let small = build_module_in(&ctx, &tm, opts, GROW_FROM, section)?;
    let small = tm.write_to_memory_buffer(&small, FileType::Object).map_err(|e| llvm("emit object")(e.to_string()))?;
    let mut small = small.as_slice().to_vec();
    for (at, bytes) in relaxed_relocations(&small) {
        small[at..at + 8].copy_from_slice(&bytes);
    }
    if let Some(patch) = super::fixups::mapping_symbols(&small) {
        patch.apply(&mut small);
    }
    let written = match GrownObject::plan(&small, &opts.symbol(), len, large) {
        Some(plan) => plan.write(&path, blob),
        None => {
            tracing::debug!("the small object's layout is not LLVM's usual one: emitting at full size");
            write_object_full(&ctx, &tm, opts, blob, section, &path, large)
        }
    };
    if let Err(e) = written {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    tracing::debug!(object = %path.display(), "wrote blob object");
    Ok(path)
}

/// The blob length of the object that [`GrownObject`] grows.
const GROW_FROM: u64 = 1;

/// LLVM's object for the real length, with the blob written over the zeros it emits.
fn write_object_full(
    ctx: &Context,
    tm: &TargetMachine,
    opts: &PackOptions,
    blob: &dyn BlobSource,
    section: Option<&str>,
    path: &Path,
    large: bool,
) -> Result<()> {
    let module = build_module_in(ctx, tm, opts, blob.blob_len(), section)?;
    let emitted = write_module(tm, &module, path, "emit object");
    drop(module);
    emitted.and_then(|_| place_blob(path, &opts.symbol(), blob, large))?;
    let patches = relaxed_relocations(&mblob_runtime::map_file(path)?);
    if !patches.is_empty() {
        let file = OpenOptions::new().write(true).open(path).map_err(Error::io(path, "cannot open"))?;
        for (at, bytes) in patches {
            file.write_all_at(&bytes, at as u64).map_err(Error::io(path, "cannot write"))?;
        }
    }
    let data = mblob_runtime::map_file(path)?;
    let patch = super::fixups::mapping_symbols(&data).or_else(|| super::fixups::coff_checksum(&data, &opts.symbol()));
    drop(data);
    match patch {
        Some(patch) => patch.apply_to_file(path),
        None => Ok(()),
    }
}

/// The `r_info` words (file offset, new bytes) that turn an x86-64 object's
/// `R_X86_64_GOTPCREL` relocations into the relaxable `R_X86_64_REX_GOTPCRELX` (after a REX
/// prefix and `mov`) or `R_X86_64_GOTPCRELX` (after a plain `mov`), as LLVM does from version
/// 18 on (`RelaxELFRelocations`, which LLVM 14's C API cannot set) and as the TVM wheels'
/// LLVM does: the system-lib constructor loads the blob's address through the GOT, and with
/// this its object is TVM 0.19's byte for byte. The instruction bytes do not change; linkers
/// may relax the load to a `lea`.
fn relaxed_relocations(data: &[u8]) -> Vec<(usize, [u8; 8])> {
    use object::elf;
    use object::read::elf::{FileHeader, Rela, SectionHeader};
    let e = object::LittleEndian;
    let mut out = Vec::new();
    let Ok(header) = elf::FileHeader64::<object::LittleEndian>::parse(data) else { return out };
    if header.e_machine(e) != elf::EM_X86_64 || header.e_ident.data != elf::ELFDATA2LSB {
        return out;
    }
    let Ok(sections) = header.sections(e, data) else { return out };
    for rela_sec in sections.iter().filter(|s| s.sh_type(e) == elf::SHT_RELA) {
        let Ok(target) = sections.section(object::SectionIndex(rela_sec.sh_info(e) as usize)) else { continue };
        let (Ok(Some((relas, _))), Ok(code)) = (rela_sec.rela(e, data), target.data(e, data)) else { continue };
        for (i, r) in relas.iter().enumerate() {
            if r.r_type(e, false) != elf::R_X86_64_GOTPCREL {
                continue;
            }
            let Some(o) = usize::try_from(r.r_offset(e)).ok().filter(|&o| o >= 2) else { continue };
            let new_type = match (o.checked_sub(3).and_then(|k| code.get(k)), code.get(o - 2)) {
                (Some(0x48..=0x4f), Some(0x8b)) => elf::R_X86_64_REX_GOTPCRELX,
                (_, Some(0x8b)) => elf::R_X86_64_GOTPCRELX,
                _ => continue,
            };
            let info = (u64::from(r.r_sym(e, false)) << 32) | u64::from(new_type.0);
            let at = rela_sec.sh_offset(e) as usize + i * std::mem::size_of::<elf::Rela64<object::LittleEndian>>() + 8;
            out.push((at, info.to_le_bytes()));
        }
    }
    out
}

/// An object emitted by LLVM for a [`GROW_FROM`]-byte blob, and how to write it for the real
/// length: LLVM's ELF writer lays out section contents one after the other in file order, each
/// at the next multiple of its alignment, then the section header table at the next multiple
/// of 8. The blob ends its section, so only its section's size, the blob symbol's size and the
/// offsets of what follows change; they are recomputed by the same rule, and the object is
/// written in one pass with the blob streamed in (LLVM would first write the blob's length in
/// zeros, then mblob the blob over them). [`GrownObject::plan`] checks that the small object
/// follows the rule and answers `None` otherwise (a system-lib object, whose section holds the
/// blob's name after the blob, is one); a test compares the result with LLVM's own object for
/// many lengths.
struct GrownObject<'a> {
    small: &'a [u8],
    /// File offset of the blob's first byte (the same in both objects).
    blob_at: usize,
    /// Bytes of the blob.
    len: u64,
    /// The small object's section contents after the blob: (old offset, size, new offset).
    moved: Vec<(usize, usize, u64)>,
    /// Patches to the small object's bytes: (offset, bytes).
    patches: Vec<(usize, Vec<u8>)>,
    /// The new section header table, and its offset.
    shdrs: (Vec<u8>, u64),
}

impl<'a> GrownObject<'a> {
    fn plan(small: &'a [u8], symbol: &str, len: u64, large: bool) -> Option<GrownObject<'a>> {
        use object::elf;
        use object::read::elf::{FileHeader, SectionHeader, Sym};
        let e = object::LittleEndian;
        let header = elf::FileHeader64::<object::LittleEndian>::parse(small).ok()?;
        if header.e_ident.data != elf::ELFDATA2LSB || header.e_type(e) != elf::ET_REL {
            return None;
        }
        let sections = header.sections(e, small).ok()?;
        let symtab = sections.symbols(e, small, elf::SHT_SYMTAB).ok()?;
        let (sym_index, sym) = symtab
            .symbols()
            .iter()
            .enumerate()
            .find(|(_, s)| symtab.symbol_name(e, s) == Ok(symbol.as_bytes()) && s.st_shndx(e) != elf::SHN_UNDEF)?;
        let blob_sec = usize::from(sym.st_shndx(e).index()?);
        let sec = sections.section(object::SectionIndex(blob_sec)).ok()?;
        let (sec_off, sec_size) = (sec.sh_offset(e), sec.sh_size(e));
        if sec.sh_type(e) != elf::SHT_PROGBITS || sym.st_size(e) != GROW_FROM || sym.st_value(e) + GROW_FROM != sec_size
        {
            return None;
        }
        let blob_at = usize::try_from(sec_off + sym.st_value(e)).ok()?;
        let delta = len.checked_sub(GROW_FROM)?;
        // The contents in file order, checked against the layout rule.
        let mut contents: Vec<(usize, u64, u64, u64)> = sections
            .iter()
            .enumerate()
            .filter(|(_, s)| s.sh_type(e) != elf::SHT_NULL && s.sh_type(e) != elf::SHT_NOBITS)
            .map(|(i, s)| (i, s.sh_offset(e), s.sh_size(e), s.sh_addralign(e).max(1)))
            .collect();
        contents.sort_by_key(|c| c.1);
        let mut cursor = u64::from(header.e_ehsize(e));
        for &(_, off, size, align) in &contents {
            if !align.is_power_of_two() || off != cursor.checked_next_multiple_of(align)? {
                return None;
            }
            cursor = off + size;
        }
        let shoff = header.e_shoff(e);
        let shsize = usize::from(header.e_shnum(e)) * usize::from(header.e_shentsize(e));
        if shoff != cursor.checked_next_multiple_of(8)? || shoff as usize + shsize != small.len() {
            return None;
        }
        // The new layout.
        let mut patches = Vec::new();
        let mut moved = Vec::new();
        let mut cursor = u64::from(header.e_ehsize(e));
        let mut new_offsets = vec![None; sections.len()];
        for &(i, off, size, align) in &contents {
            let new_off = if off > sec_off { cursor.checked_next_multiple_of(align)? } else { off };
            let new_size = if i == blob_sec { size + delta } else { size };
            if off > sec_off {
                moved.push((usize::try_from(off).ok()?, usize::try_from(size).ok()?, new_off));
            }
            new_offsets[i] = Some(new_off);
            cursor = new_off.checked_add(new_size)?;
        }
        let new_shoff = cursor.checked_next_multiple_of(8)?;
        let mut fh = *header;
        fh.e_shoff = object::U64::new(e, new_shoff);
        patches.push((0, object::bytes_of(&fh).to_vec()));
        let mut table = small.get(shoff as usize..shoff as usize + shsize)?.to_vec();
        let entsize = usize::from(header.e_shentsize(e));
        for (i, s) in sections.iter().enumerate() {
            let mut h = *s;
            if let Some(off) = new_offsets[i] {
                h.sh_offset = object::U64::new(e, off);
            }
            if i == blob_sec {
                h.sh_size = object::U64::new(e, sec_size + delta);
                if large {
                    h.sh_flags =
                        object::U64::new(e, object::elf::SectionFlags(s.sh_flags(e).0 | super::SHF_X86_64_LARGE));
                }
            }
            table.get_mut(i * entsize..(i + 1) * entsize)?.copy_from_slice(object::bytes_of(&h));
        }
        // The blob symbol's size.
        let symtab_header = sections.section(symtab.section()).ok()?;
        let at =
            symtab_header.sh_offset(e) as usize + sym_index * std::mem::size_of::<elf::Sym64<object::LittleEndian>>();
        let mut new_sym = *sym;
        new_sym.st_size = object::U64::new(e, len);
        patches.push((at, object::bytes_of(&new_sym).to_vec()));
        Some(GrownObject { small, blob_at, len, moved, patches, shdrs: (table, new_shoff) })
    }

    /// The small object's bytes in `range`, with the patches applied.
    fn patched(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let mut out = self.small[range.clone()].to_vec();
        for (at, bytes) in &self.patches {
            for (k, b) in bytes.iter().enumerate() {
                if (range.start..range.end).contains(&(at + k)) {
                    out[at + k - range.start] = *b;
                }
            }
        }
        out
    }

    fn write(&self, path: &Path, blob: &dyn BlobSource) -> Result<()> {
        let file = File::create(path).map_err(Error::io(path, "cannot create"))?;
        let mut w = io::BufWriter::with_capacity(1 << 20, super::AtWriter { file: &file, pos: 0, written: 0 });
        let io_err = |e: io::Error| Error::io(path, "cannot write")(e);
        w.write_all(&self.patched(0..self.blob_at)).map_err(&io_err)?;
        let before = w.get_ref().written + w.buffer().len() as u64;
        blob.write_blob(&mut w).map_err(&io_err)?;
        let after = w.get_ref().written + w.buffer().len() as u64;
        if after - before != self.len {
            return Err(Error::Internal {
                what: path.display().to_string(),
                detail: format!("the blob source wrote {} bytes but announced {}", after - before, self.len).into(),
            });
        }
        let pad_to = |w: &mut io::BufWriter<super::AtWriter<'_>>, to: u64| -> io::Result<()> {
            let at = w.get_ref().written + w.buffer().len() as u64;
            io::copy(&mut io::repeat(0).take(to.saturating_sub(at)), w).map(|_| ())
        };
        for &(off, size, new_off) in &self.moved {
            pad_to(&mut w, new_off).map_err(&io_err)?;
            w.write_all(&self.patched(off..off + size)).map_err(&io_err)?;
        }
        pad_to(&mut w, self.shdrs.1).map_err(&io_err)?;
        w.write_all(&self.shdrs.0).map_err(&io_err)?;
        w.flush().map_err(&io_err)
    }
}

/// Writes `module` as an object file at `path` (`step` names the job in an error).
///
/// LLVM opens files by UTF-8 names only (inkwell panics on any other path). A path that is
/// not UTF-8 is reached through its directory's file descriptor, `/proc/self/fd/N/name`
/// (Linux), when the file name itself is UTF-8; otherwise the error says so.
///
/// # Errors
/// [`Error::Llvm`] when LLVM fails, [`Error::OutputPath`] for a path LLVM cannot be given.
pub(crate) fn write_module(tm: &TargetMachine, module: &Module<'_>, path: &Path, step: &'static str) -> Result<()> {
    if path.to_str().is_some() {
        return tm.write_to_file(module, FileType::Object, path).map_err(|e| llvm(step)(e.to_string()));
    }
    let not_utf8 = |detail: &str| Error::OutputPath { what: path.display().to_string(), detail: detail.into() };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| not_utf8("LLVM writes files by UTF-8 names only, and this file name is not UTF-8"))?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = File::open(parent).map_err(Error::io(parent, "cannot open"))?;
    let via = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)));
    if !via.is_dir() {
        return Err(not_utf8(
            "LLVM writes files by UTF-8 names only, and without /proc this path cannot be given to it",
        ));
    }
    let written = tm.write_to_file(module, FileType::Object, &via.join(name)).map_err(|e| llvm(step)(e.to_string()));
    drop(dir);
    written
}

/// The module TVM's `CodeGenBlob` builds, with a zero initializer (see the module docs): the
/// blob global in the section [`PackOptions::section_for`] picks, and for system-lib the
/// registration constructor.
///
/// TVM appends the constructor to `llvm.global_ctors`. LLVM's C API target machines emit that
/// as `.ctors` (the `UseInitArray` option defaults to off and the C API cannot set it), which
/// glibc's start files and lld do not run; so on ELF the constructor's pointer goes straight
/// into `.init_array`, which is what clang emits for priority 65535. Other object formats get
/// TVM's `llvm.global_ctors` entry.
///
/// # Errors
/// [`Error::TooLarge`] above [`MAX_BLOB`], [`Error::Llvm`] when the module does not verify.
#[cfg(test)]
fn build_module<'c>(ctx: &'c Context, tm: &TargetMachine, opts: &PackOptions, len: u64) -> Result<Module<'c>> {
    build_module_in(ctx, tm, opts, len, opts.section_for(len))
}

fn build_module_in<'c>(
    ctx: &'c Context,
    tm: &TargetMachine,
    opts: &PackOptions,
    len: u64,
    section: Option<&str>,
) -> Result<Module<'c>> {
    let ty = blob_type(ctx, len)?;
    let module = ctx.create_module(&opts.file_stem());
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let blob = module.add_global(ty, None, &opts.symbol());
    blob.set_linkage(Linkage::External);
    blob.set_constant(true);
    blob.set_alignment(1);
    blob.set_initializer(&ty.const_zero());
    // Named explicitly, so that a zero initializer can never land in `.bss`: LLVM keeps a
    // constant out of BSS anyway, and a named section is `PROGBITS` unless it is called `.bss`.
    blob.set_section(section);
    if opts.triple().contains("windows") {
        blob.set_dll_storage_class(inkwell::DLLStorageClass::Export);
    }
    if opts.system_lib {
        add_registration(ctx, &module, opts, blob.as_pointer_value()).map_err(|e| llvm("system-lib")(e.to_string()))?;
    }
    module.verify().map_err(|e| llvm("verify")(e.to_string()))?;
    Ok(module)
}

/// TVM's static constructor: `_GLOBAL__sub_I_<id>` calls `__cxx_global_var_init`, which
/// registers `(name, blob)` and stores the result in `<sym>_reg_`; priority 65535.
fn add_registration<'c>(
    ctx: &'c Context,
    module: &Module<'c>,
    opts: &PackOptions,
    blob: PointerValue<'c>,
) -> std::result::Result<(), inkwell::builder::BuilderError> {
    let sym = opts.symbol();
    let i32t = ctx.i32_type();
    let i8p = ctx.i8_type().ptr_type(AddressSpace::default());
    let reg = module.add_global(i32t, None, &format!("{sym}_reg_"));
    reg.set_linkage(Linkage::Internal);
    reg.set_initializer(&i32t.const_zero());
    reg.set_alignment(4);
    let name = ctx.const_string(sym.as_bytes(), true);
    let name_g = module.add_global(name.get_type(), None, &format!("{sym}.str"));
    name_g.set_linkage(Linkage::Private);
    name_g.set_constant(true);
    name_g.set_alignment(1);
    name_g.set_initializer(&name);
    let register = module.add_function(opts.register_function(), i32t.fn_type(&[i8p.into(), i8p.into()], false), None);
    let void_fn = ctx.void_type().fn_type(&[], false);
    // In TVM's order: the objects TVM's LLVM writes have `_GLOBAL__sub_I_*` first.
    let sub = module.add_function(&format!("_GLOBAL__sub_I_{}", opts.file_stem()), void_fn, Some(Linkage::Internal));
    let init = module.add_function("__cxx_global_var_init", void_fn, Some(Linkage::Internal));
    let startup = opts.static_init_section();
    init.set_section(startup);
    sub.set_section(startup);
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(init, "entry"));
    let name_ptr = name_g.as_pointer_value().const_cast(i8p);
    let blob_ptr = blob.const_cast(i8p);
    let ret = b.build_call(register, &[name_ptr.into(), blob_ptr.into()], "reg")?;
    let value = ret.try_as_basic_value().basic().ok_or(inkwell::builder::BuilderError::UnsetPosition)?;
    b.build_store(reg.as_pointer_value(), value.into_int_value())?;
    b.build_return(None)?;
    b.position_at_end(ctx.append_basic_block(sub, "entry"));
    b.build_call(init, &[], "")?;
    b.build_return(None)?;

    let fn_ptr = void_fn.ptr_type(AddressSpace::default());
    if opts.is_elf() {
        // See `build_module`: `.init_array`, kept by `llvm.compiler.used` (`llvm.used` would
        // also mark the section `SHF_GNU_RETAIN`, and the object ELFOSABI_GNU, which TVM's
        // objects are not).
        let init = module.add_global(fn_ptr.array_type(1), None, &format!("{sym}_init_array_"));
        init.set_linkage(Linkage::Private);
        init.set_constant(true);
        init.set_section(Some(".init_array"));
        init.set_alignment(8);
        init.set_initializer(&fn_ptr.const_array(&[sub.as_global_value().as_pointer_value()]));
        let used = module.add_global(i8p.array_type(1), None, "llvm.compiler.used");
        used.set_linkage(Linkage::Appending);
        used.set_section(Some("llvm.metadata"));
        used.set_initializer(&i8p.const_array(&[init.as_pointer_value().const_cast(i8p)]));
    } else {
        // llvm.global_ctors = appending global [1 x { i32, void ()*, i8* }] [{ 65535, @sub, null }]
        let entry_t = ctx.struct_type(&[i32t.into(), fn_ptr.into(), i8p.into()], false);
        let entry = entry_t.const_named_struct(&[
            i32t.const_int(65535, false).as_basic_value_enum(),
            sub.as_global_value().as_pointer_value().as_basic_value_enum(),
            i8p.const_null().as_basic_value_enum(),
        ]);
        let ctors = module.add_global(entry_t.array_type(1), None, "llvm.global_ctors");
        ctors.set_linkage(Linkage::Appending);
        ctors.set_initializer(&entry_t.const_array(&[entry]));
    }
    Ok(())
}

/// Checks that an object of about `len` bytes can be written at `path` before LLVM writes
/// there: LLVM aborts the process on a failed write ("IO failure on output stream") instead of
/// returning an error, so a full disk or a file-size limit must be found first.
fn check_room(path: &Path, len: u64) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let full = |detail: String| Error::Io {
        path: path.to_owned(),
        action: "cannot write the blob object",
        source: io::Error::other(detail),
    };
    if let Ok(avail) = fs4::available_space(dir) {
        if avail < len {
            return Err(full(format!("{len} bytes needed, {avail} available on the file system (disk full)")));
        }
    }
    if let Ok((soft, _)) = rlimit::Resource::FSIZE.get() {
        if soft < len {
            return Err(full(format!("{len} bytes needed, the file size limit (ulimit -f) is {soft} bytes")));
        }
    }
    Ok(())
}

/// Where the blob goes in an emitted object.
#[derive(Debug)]
struct Placement {
    /// File offset of the symbol's first byte.
    offset: u64,
    /// File offset of the section header's `sh_flags` (ELF64 only).
    sh_flags_at: Option<(u64, u64)>,
}

/// Streams the blob into the object file at the bytes of `symbol`, after checking that the
/// symbol has exactly the blob's size and that its bytes are in the file (not `NOBITS`); with
/// `large`, also sets `SHF_X86_64_LARGE` on its section.
fn place_blob(path: &Path, symbol: &str, blob: &dyn BlobSource, large: bool) -> Result<()> {
    let place = {
        // Mapped, not read: only the headers and the symbol table are touched.
        let data = mblob_runtime::map_file(path)?;
        locate(&data, symbol, blob.blob_len())
            .map_err(|detail| Error::Internal { what: path.display().to_string(), detail: detail.into() })?
    };
    let file = OpenOptions::new().write(true).open(path).map_err(Error::io(path, "cannot open"))?;
    let mut w = io::BufWriter::with_capacity(1 << 20, super::AtWriter { file: &file, pos: place.offset, written: 0 });
    blob.write_blob(&mut w).and_then(|_| w.flush()).map_err(Error::io(path, "cannot write"))?;
    let written = w.get_ref().written;
    drop(w);
    if written != blob.blob_len() {
        return Err(Error::Internal {
            what: path.display().to_string(),
            detail: format!("the blob source wrote {written} bytes but announced {}", blob.blob_len()).into(),
        });
    }
    if large {
        let (at, flags) = place.sh_flags_at.ok_or_else(|| Error::Internal {
            what: path.display().to_string(),
            detail: "large data flag requested for an object that is not ELF64".into(),
        })?;
        let flags = flags | super::SHF_X86_64_LARGE;
        file.write_all_at(&flags.to_le_bytes(), at).map_err(Error::io(path, "cannot write"))?;
    }
    Ok(())
}

/// Finds the file range of the defined symbol `symbol` and checks it holds exactly `len` bytes.
fn locate(data: &[u8], symbol: &str, len: u64) -> std::result::Result<Placement, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    // Mach-O names C symbols with a leading `_`.
    let mangled = format!("_{symbol}");
    let name = if file.format() == object::BinaryFormat::MachO { mangled.as_str() } else { symbol };
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name) && !s.is_undefined())
        .ok_or_else(|| format!("no symbol `{symbol}`"))?;
    let index = sym.section_index().ok_or_else(|| format!("symbol `{symbol}` has no section"))?;
    let section = file.section_by_index(index).map_err(|e| e.to_string())?;
    let (start, size) =
        section.file_range().ok_or_else(|| format!("section of `{symbol}` holds no bytes in the file (NOBITS)"))?;
    let within = sym.address().checked_sub(section.address()).ok_or("symbol before its section")?;
    // Mach-O and COFF symbols have no size: the symbol's bytes reach the next symbol of its
    // section, or the section's end.
    let sym_size = if file.format() == object::BinaryFormat::Elf {
        sym.size()
    } else {
        let next = file
            .symbols()
            .filter(|s| s.section_index() == Some(index) && s.address() > sym.address())
            .map(|s| s.address())
            .min()
            .unwrap_or(section.address() + section.size());
        next - sym.address()
    };
    // (A COFF system-lib object puts the blob's name right after it, with no symbol.)
    let fits = if file.format() == object::BinaryFormat::Elf { sym_size == len } else { sym_size >= len };
    if !fits {
        return Err(format!("symbol `{symbol}` has {sym_size} bytes, the blob {len}"));
    }
    if within.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!("symbol `{symbol}` ({len} bytes at {within}) does not fit its section ({size} bytes)"));
    }
    let sh_flags_at = match (&file, section.flags()) {
        (object::File::Elf64(elf), object::SectionFlags::Elf { sh_flags, .. }) => {
            let header = elf.elf_header();
            let endian = elf.endian();
            use object::read::elf::FileHeader;
            let shoff = header.e_shoff(endian);
            let entsize = u64::from(header.e_shentsize(endian));
            // `sh_flags` follows `sh_name` and `sh_type` (two u32) in an Elf64_Shdr.
            let at =
                u64::try_from(index.0).ok().and_then(|i| i.checked_mul(entsize)).and_then(|o| o.checked_add(shoff));
            at.and_then(|a| a.checked_add(8)).map(|a| (a, sh_flags.0))
        }
        _ => None,
    };
    Ok(Placement { offset: start + within, sh_flags_at })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob that says it is `len` bytes long and must never be written.
    struct Huge(u64);
    impl BlobSource for Huge {
        fn blob_len(&self) -> u64 {
            self.0
        }
        fn write_blob(&self, _: &mut dyn Write) -> io::Result<()> {
            panic!("a blob of {} bytes was written", self.0)
        }
    }

    fn x86() -> PackOptions {
        PackOptions { target: Some("x86_64-unknown-linux-gnu".into()), ..PackOptions::default() }
    }

    #[test]
    fn blobs_of_4_gib_and_more_keep_their_exact_size() {
        let ctx = Context::create();
        let tm = target_machine("x86_64-unknown-linux-gnu").unwrap();
        let td = tm.get_target_data();
        for len in [1, u64::from(u32::MAX), 1 << 32, (1 << 32) + 1, 5 << 30, (5 << 30) + 12345, 1 << 40, MAX_BLOB] {
            let ty = blob_type(&ctx, len).unwrap();
            assert_eq!(td.get_abi_size(&ty), len, "{len}: {}", ty.print_to_string());
            assert_eq!(td.get_abi_alignment(&ty), 1, "{len}");
        }
        assert_eq!(blob_type(&ctx, 1987).unwrap().print_to_string().to_string(), "[1987 x i8]");
        assert_eq!(
            blob_type(&ctx, (5 << 30) + 7).unwrap().print_to_string().to_string(),
            "<{ [2 x [2147483648 x i8]], [1073741831 x i8] }>"
        );
        // The whole module builds and verifies without touching the bytes.
        let opts = PackOptions { system_lib: true, ..x86() };
        let m = build_module(&ctx, &tm, &opts, 5 << 30).unwrap();
        let ir = m.print_to_string().to_string();
        assert!(ir.contains("@__tvm_dev_mblob = constant <{ [2 x [2147483648 x i8]], [1073741824 x i8] }> zeroinitializer, section \".lrodata\", align 1"), "{ir}");
    }

    #[test]
    fn blobs_beyond_the_limit_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_object(&Huge(MAX_BLOB + 1), &x86(), dir.path()).unwrap_err();
        assert!(matches!(err, Error::TooLarge { len, limit: MAX_BLOB, .. } if len == MAX_BLOB + 1), "{err}");
        let err = write_object(&Huge(u64::MAX), &x86(), dir.path()).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        // Within the limit but larger than the disk: refused before LLVM writes (it would abort).
        let err = write_object(&Huge(MAX_BLOB), &x86(), dir.path()).unwrap_err();
        assert!(matches!(&err, Error::Io { action: "cannot write the blob object", .. }), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn system_lib_module_has_tvms_pieces() {
        let ctx = Context::create();
        let opts = PackOptions { system_lib: true, prefix: "demo_".into(), ..x86() };
        let tm = target_machine(&opts.triple()).unwrap();
        let ir = build_module(&ctx, &tm, &opts, 598).unwrap().print_to_string().to_string();
        for needle in [
            "; ModuleID = 'demo_devc'",
            "source_filename = \"demo_devc\"",
            "target triple = \"x86_64-unknown-linux-gnu\"",
            "target datalayout = \"e-m:e-",
            "@demo___tvm_dev_mblob = constant [598 x i8] zeroinitializer, section \".rodata\", align 1",
            "@demo___tvm_dev_mblob_reg_ = internal global i32 0, align 4",
            "@demo___tvm_dev_mblob.str = private constant [21 x i8] c\"demo___tvm_dev_mblob\\00\", align 1",
            "declare i32 @TVMBackendRegisterSystemLibSymbol(i8*, i8*)",
            "define internal void @__cxx_global_var_init() section \".text.startup\"",
            "define internal void @_GLOBAL__sub_I_demo_devc() section \".text.startup\"",
            "call i32 @TVMBackendRegisterSystemLibSymbol(i8* getelementptr inbounds ([21 x i8], [21 x i8]* @demo___tvm_dev_mblob.str, i32 0, i32 0), i8* getelementptr inbounds ([598 x i8], [598 x i8]* @demo___tvm_dev_mblob, i32 0, i32 0))",
            "store i32 %reg, i32* @demo___tvm_dev_mblob_reg_",
            "[void ()* @_GLOBAL__sub_I_demo_devc], section \".init_array\"",
        ] {
            assert!(ir.contains(needle), "missing {needle:?} in\n{ir}");
        }
        // Not ELF: TVM's `llvm.global_ctors` with priority 65535.
        let mac = PackOptions { target: Some("x86_64-apple-darwin".into()), ..opts };
        let tm = target_machine(&mac.triple()).unwrap();
        let ir = build_module(&ctx, &tm, &mac, 598).unwrap().print_to_string().to_string();
        assert!(ir.contains("@llvm.global_ctors = appending global [1 x { i32, void ()*, i8* }] [{ i32, void ()*, i8* } { i32 65535, void ()* @_GLOBAL__sub_I_demo_devc, i8* null }]"), "{ir}");
        assert!(ir.contains("section \"__TEXT,__StaticInit,regular,pure_instructions\""), "{ir}");
        assert!(!ir.contains("section \".rodata\""), "{ir}");
        // A Mach-O object holds the blob at its symbol (Mach-O symbols have no size).
        let dir = tempfile::tempdir().unwrap();
        let blob: Vec<u8> = (0..16).collect();
        let data = std::fs::read(write_object(&blob, &mac, dir.path()).unwrap()).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let sym = file.symbols().find(|s| s.name() == Ok("_demo___tvm_dev_mblob")).unwrap();
        let sec = file.section_by_index(sym.section_index().unwrap()).unwrap();
        let at = (sym.address() - sec.address()) as usize;
        assert_eq!(&sec.data().unwrap()[at..at + 16], &blob[..]);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lrodata_is_progbits_and_flagged_large() {
        use object::elf;
        let dir = tempfile::tempdir().unwrap();
        let blob: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let path = write_object_in(&blob, &x86(), dir.path(), Some(".lrodata")).unwrap();
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let sec = file.section_by_name(".lrodata").unwrap();
        let object::SectionFlags::Elf { sh_flags, sh_type } = sec.flags() else { panic!("not ELF") };
        assert_eq!(sh_type, elf::SHT_PROGBITS);
        assert_eq!(sh_flags.0, elf::SHF_ALLOC.0 | super::super::SHF_X86_64_LARGE);
        assert_eq!(sec.kind(), object::SectionKind::ReadOnlyData);
        assert!(sec.data().unwrap() == blob);
        // The linkers take it as large data into a shared library.
        let so = dir.path().join("x.so");
        let out = std::process::Command::new("cc").arg("-shared").arg("-o").arg(&so).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let data = std::fs::read(&so).unwrap();
        let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
        assert!(found.bytes(&data).unwrap() == blob);
    }

    /// Grown objects (and the full-size fallback) are byte for byte what LLVM writes with the
    /// blob as the initializer (TVM's way), for lengths around every alignment the sections
    /// after the blob have, both targets, system-lib or not, with and without a prefix, and in
    /// `.lrodata`; and the grown route is the one taken.
    #[test]
    fn patched_objects_equal_what_llvm_writes_with_the_real_initializer() {
        let dir = tempfile::tempdir().unwrap();
        let lens = [1usize, 2, 3, 7, 8, 9, 15, 16, 17, 4095, 4096, 4097, 70_001];
        let cases = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"]
            .into_iter()
            .flat_map(|t| [false, true].into_iter().map(move |s| (t, s)))
            .flat_map(|(t, s)| ["", "p_"].into_iter().map(move |p| (t, s, p)))
            .flat_map(|c| lens.into_iter().map(move |n| (c, n)));
        for ((target, system_lib, prefix), n) in cases {
            let blob: Vec<u8> = (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
            let opts = PackOptions {
                target: Some(target.into()),
                system_lib,
                prefix: prefix.into(),
                ..PackOptions::default()
            };
            for section in [Some(".rodata"), Some(".lrodata")] {
                let large = section == Some(".lrodata") && target.starts_with("x86_64");
                let what = format!("{target} system_lib={system_lib} prefix={prefix:?} len={n} {section:?}");
                let ours = std::fs::read(write_object_in(&blob, &opts, dir.path(), section).unwrap()).unwrap();
                let ctx = Context::create();
                let tm = target_machine(target).unwrap();
                let small = build_module_in(&ctx, &tm, &opts, GROW_FROM, section).unwrap();
                let small = tm.write_to_memory_buffer(&small, FileType::Object).unwrap();
                // System-lib objects put the blob's name after it in its section: they are
                // emitted at full size.
                let grown = GrownObject::plan(small.as_slice(), &opts.symbol(), n as u64, large).is_some();
                assert_eq!(grown, !system_lib, "{what}: grown");
                // TVM's way: the bytes as the initializer, emitted by LLVM.
                let module = build_module_in(&ctx, &tm, &opts, blob.len() as u64, section).unwrap();
                let global = module.get_global(&opts.symbol()).unwrap();
                global.set_initializer(&ctx.const_string(&blob, false));
                let mut theirs = tm.write_to_memory_buffer(&module, FileType::Object).unwrap().as_slice().to_vec();
                relax(&mut theirs);
                if large {
                    let placed = locate(&theirs, &opts.symbol(), n as u64).unwrap();
                    let (at, flags) = placed.sh_flags_at.unwrap();
                    theirs[at as usize..at as usize + 8]
                        .copy_from_slice(&(flags | super::super::SHF_X86_64_LARGE).to_le_bytes());
                }
                assert!(ours == theirs, "{what}: objects differ");
                let full = dir.path().join("full.o");
                write_object_full(&ctx, &tm, &opts, &blob, section, &full, large).unwrap();
                assert!(std::fs::read(&full).unwrap() == theirs, "{what}: the full-size route differs");
            }
        }
    }

    #[test]
    fn write_object_equals_the_object_llvm_writes_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let blob: Vec<u8> = (0..70_001u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        for target in ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"] {
            for system_lib in [false, true] {
                let opts = PackOptions { target: Some(target.into()), system_lib, ..PackOptions::default() };
                let ours = std::fs::read(write_object(&blob, &opts, dir.path()).unwrap()).unwrap();
                // TVM's way: the bytes as the initializer, emitted by LLVM.
                let ctx = Context::create();
                let tm = target_machine(target).unwrap();
                let module = build_module(&ctx, &tm, &opts, blob.len() as u64).unwrap();
                let global = module.get_global(&opts.symbol()).unwrap();
                global.set_initializer(&ctx.const_string(&blob, false));
                let theirs_path = dir.path().join("theirs.o");
                tm.write_to_file(&module, FileType::Object, &theirs_path).unwrap();
                let mut theirs = std::fs::read(&theirs_path).unwrap();
                relax(&mut theirs);
                assert!(ours == theirs, "{target} system_lib={system_lib}: objects differ");
            }
        }
    }

    /// LLVM's object with the GOT relocations relaxed and the mapping symbols renamed, as
    /// [`write_object`] writes it.
    fn relax(object: &mut Vec<u8>) {
        for (at, bytes) in relaxed_relocations(object) {
            object[at..at + 8].copy_from_slice(&bytes);
        }
        if let Some(patch) = super::super::fixups::mapping_symbols(object) {
            patch.apply(object);
        }
    }

    /// The system-lib constructor's load of the blob's address: `movq blob@GOTPCREL(%rip)`
    /// with a REX prefix, relocated as `R_X86_64_REX_GOTPCRELX` on x86-64; nothing to relax on
    /// AArch64 or without system-lib.
    #[test]
    fn the_constructors_got_load_is_relaxable() {
        use object::ObjectSection;
        let dir = tempfile::tempdir().unwrap();
        for (target, system_lib, want) in [
            ("x86_64-unknown-linux-gnu", true, 1),
            ("x86_64-unknown-linux-gnu", false, 0),
            ("aarch64-unknown-linux-gnu", true, 0),
        ] {
            let opts = PackOptions { target: Some(target.into()), system_lib, ..PackOptions::default() };
            let data = std::fs::read(write_object(&vec![1u8; 64], &opts, dir.path()).unwrap()).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let mut relaxed = 0;
            for section in file.sections() {
                for (offset, r) in section.relocations() {
                    match r.flags() {
                        object::RelocationFlags::Elf { r_type } if r_type == object::elf::R_X86_64_REX_GOTPCRELX => {
                            let code = section.data().unwrap();
                            assert_eq!(code[offset as usize - 2], 0x8b, "a mov");
                            assert!((0x48..=0x4f).contains(&code[offset as usize - 3]), "after a REX prefix");
                            relaxed += 1;
                        }
                        object::RelocationFlags::Elf { r_type } => {
                            assert_ne!(r_type, object::elf::R_X86_64_GOTPCREL, "{target}: a GOTPCREL left")
                        }
                        _ => {}
                    }
                }
            }
            assert_eq!(relaxed, want, "{target} system_lib={system_lib}");
        }
    }

    #[test]
    fn short_sources_are_errors_and_leave_no_object() {
        struct Short;
        impl BlobSource for Short {
            fn blob_len(&self) -> u64 {
                64
            }
            fn write_blob(&self, out: &mut dyn Write) -> io::Result<()> {
                out.write_all(&[7; 8])
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let err = write_object(&Short, &x86(), dir.path()).unwrap_err();
        assert!(err.to_string().contains("wrote 8 bytes but announced 64"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
