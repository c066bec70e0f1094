//! Where the LLVM of TVM's wheels writes an object differently from LLVM 14 (which mblob
//! links through inkwell), the difference patched after emission, so that the blob object
//! stays TVM's byte for byte. Each patch checks that the object is laid out as expected and
//! leaves it alone otherwise; the byte tests against TVM's objects (`tests/fixtures/targets/`)
//! prove them.
//!
//! - **AArch64 ELF mapping symbols.** LLVM 14 names them `$x.0`, `$d.1`, ...; LLVM 16 and
//!   later `$x` and `$d`. The names are changed and the string table (the last section
//!   contents in LLVM's layout, shared by section and symbol names) is rebuilt as LLVM's
//!   `StringTableBuilder` builds it: sorted by the strings read backwards, a string that ends
//!   the previous one sharing its bytes.
//! - **COFF section checksums.** LLVM fills a section definition's `CheckSum` with the CRC of
//!   the section's contents; it saw zeros where mblob places the blob afterwards (see
//!   [`super::llvm`]), so the checksum of the blob's section is computed again.

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, Sym};

/// Changes to make to an object file: bytes to write at offsets, then the file's new length.
#[derive(Debug, Default)]
pub(crate) struct Patch {
    pub(crate) writes: Vec<(u64, Vec<u8>)>,
    pub(crate) len: Option<u64>,
}

impl Patch {
    /// Applies the patch to bytes held in memory.
    pub(crate) fn apply(&self, data: &mut Vec<u8>) {
        for (at, bytes) in &self.writes {
            let end = *at as usize + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[*at as usize..end].copy_from_slice(bytes);
        }
        if let Some(len) = self.len {
            data.truncate(len as usize);
        }
    }

    /// Applies the patch to a file.
    pub(crate) fn apply_to_file(&self, path: &std::path::Path) -> crate::Result<()> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(path).map_err(crate::Error::io(path, "cannot open"))?;
        for (at, bytes) in &self.writes {
            file.write_all_at(bytes, *at).map_err(crate::Error::io(path, "cannot write"))?;
        }
        if let Some(len) = self.len {
            file.set_len(len).map_err(crate::Error::io(path, "cannot write"))?;
        }
        Ok(())
    }
}

/// The mapping symbol name LLVM 16+ gives to LLVM 14's `$x.N` / `$d.N`.
fn mapping_name(name: &[u8]) -> Option<&'static [u8]> {
    let (kind, rest) = match name {
        [b'$', b'x', b'.', rest @ ..] => (&b"$x"[..], rest),
        [b'$', b'd', b'.', rest @ ..] => (&b"$d"[..], rest),
        _ => return None,
    };
    (!rest.is_empty() && rest.iter().all(u8::is_ascii_digit)).then_some(kind)
}

/// An ELF string table as LLVM's `StringTableBuilder::finalize` lays it out, and each
/// string's offset in it.
pub(crate) fn llvm_string_table(strings: &[&[u8]]) -> (Vec<u8>, std::collections::HashMap<Vec<u8>, u32>) {
    let mut sorted: Vec<&[u8]> = strings.iter().copied().filter(|s| !s.is_empty()).collect();
    sorted.sort_unstable();
    sorted.dedup();
    multikey_sort(&mut sorted, 0);
    let mut table = vec![0u8];
    let mut offsets = std::collections::HashMap::new();
    let mut previous: &[u8] = b"";
    for s in sorted {
        if previous.ends_with(s) {
            offsets.insert(s.to_vec(), (table.len() - s.len() - 1) as u32);
            continue;
        }
        offsets.insert(s.to_vec(), table.len() as u32);
        table.extend_from_slice(s);
        table.push(0);
        previous = s;
    }
    (table, offsets)
}

/// The character `pos` places from the end, or -1 past the start.
fn tail_at(s: &[u8], pos: usize) -> i32 {
    if pos >= s.len() {
        -1
    } else {
        i32::from(s[s.len() - pos - 1])
    }
}

/// LLVM's three-way radix quicksort of strings by their characters from the end, greatest
/// first.
fn multikey_sort(v: &mut [&[u8]], pos: usize) {
    if v.len() <= 1 {
        return;
    }
    let pivot = tail_at(v[0], pos);
    let (mut i, mut j, mut k) = (0, v.len(), 1);
    while k < j {
        let c = tail_at(v[k], pos);
        if c > pivot {
            v.swap(i, k);
            i += 1;
            k += 1;
        } else if c < pivot {
            j -= 1;
            v.swap(j, k);
        } else {
            k += 1;
        }
    }
    multikey_sort(&mut v[..i], pos);
    multikey_sort(&mut v[j..], pos);
    if pivot != -1 {
        multikey_sort(&mut v[i..j], pos + 1);
    }
}

fn c_str(table: &[u8], at: usize) -> Option<&[u8]> {
    let rest = table.get(at..)?;
    rest.iter().position(|&b| b == 0).map(|n| &rest[..n])
}

/// The patch that renames an AArch64 ELF object's mapping symbols as LLVM 16+ names them
/// (see the module docs); `None` when there is nothing to rename or the object is not laid
/// out as LLVM 14 lays it out.
pub(crate) fn mapping_symbols(data: &[u8]) -> Option<Patch> {
    let e = object::LittleEndian;
    let header = elf::FileHeader64::<object::LittleEndian>::parse(data).ok()?;
    if header.e_machine(e) != elf::EM_AARCH64 || header.e_type(e) != elf::ET_REL {
        return None;
    }
    let sections = header.sections(e, data).ok()?;
    let symtab = sections.symbols(e, data, elf::SHT_SYMTAB).ok()?;
    let strtab_index = symtab.string_section().0;
    if header.shstrndx(e, data).ok()? as usize != strtab_index {
        return None;
    }
    let strtab_header = sections.section(object::SectionIndex(strtab_index)).ok()?;
    let (str_off, str_size) = (strtab_header.sh_offset(e), strtab_header.sh_size(e));
    let table = data.get(str_off as usize..(str_off + str_size) as usize)?;
    // The string table must be the last contents, the section headers right after it.
    let last_end =
        sections.iter().filter(|s| s.sh_type(e) != elf::SHT_NOBITS).map(|s| s.sh_offset(e) + s.sh_size(e)).max()?;
    let shsize = u64::from(header.e_shnum(e)) * u64::from(header.e_shentsize(e));
    if last_end != str_off + str_size
        || header.e_shoff(e) != (str_off + str_size).next_multiple_of(8)
        || header.e_shoff(e) + shsize != data.len() as u64
    {
        return None;
    }
    let section_names: Vec<&[u8]> =
        sections.iter().map(|s| c_str(table, s.sh_name(e) as usize)).collect::<Option<_>>()?;
    let symbol_names: Vec<&[u8]> =
        symtab.symbols().iter().map(|s| c_str(table, s.st_name(e) as usize)).collect::<Option<_>>()?;
    let renamed: Vec<&[u8]> = symbol_names.iter().map(|n| mapping_name(n).unwrap_or(n)).collect();
    if renamed == symbol_names {
        return None;
    }
    // The layout rule must give the table LLVM wrote from the old names.
    let old: Vec<&[u8]> = section_names.iter().chain(&symbol_names).copied().collect();
    if llvm_string_table(&old).0 != table {
        return None;
    }
    let new: Vec<&[u8]> = section_names.iter().chain(&renamed).copied().collect();
    let (new_table, offsets) = llvm_string_table(&new);
    let at = |name: &[u8]| if name.is_empty() { Some(0) } else { offsets.get(name).copied() };
    let mut patch = Patch::default();
    let new_shoff = (str_off + new_table.len() as u64).next_multiple_of(8);
    let mut tail = new_table.clone();
    tail.resize((new_shoff - str_off) as usize, 0);
    for (i, s) in sections.iter().enumerate() {
        let mut h = *s;
        h.sh_name = object::U32::new(e, at(section_names[i])?);
        if i == strtab_index {
            h.sh_size = object::U64::new(e, new_table.len() as u64);
        }
        tail.extend_from_slice(object::bytes_of(&h));
    }
    patch.writes.push((str_off, tail));
    let symtab_off = sections.section(symtab.section()).ok()?.sh_offset(e);
    let entsize = std::mem::size_of::<elf::Sym64<object::LittleEndian>>() as u64;
    for (i, s) in symtab.symbols().iter().enumerate() {
        let mut sym = *s;
        sym.st_name = object::U32::new(e, at(renamed[i])?);
        patch.writes.push((symtab_off + i as u64 * entsize, object::bytes_of(&sym).to_vec()));
    }
    let mut fh = *header;
    fh.e_shoff = object::U64::new(e, new_shoff);
    patch.writes.push((0, object::bytes_of(&fh).to_vec()));
    patch.len = Some(new_shoff + shsize);
    Some(patch)
}

/// The patch that sets the COFF section checksum of the section holding `symbol` to the CRC
/// LLVM computes (JamCRC from 0) of its contents; `None` for an object that is not COFF or
/// whose checksum is already right.
pub(crate) fn coff_checksum(data: &[u8], symbol: &str) -> Option<Patch> {
    use object::read::coff::CoffFile;
    use object::{Object, ObjectSection, ObjectSymbol};
    let file: CoffFile<'_, &[u8]> = CoffFile::parse(data).ok()?;
    let sym = file.symbols().find(|s| s.name() == Ok(symbol))?;
    let index = sym.section_index()?;
    let contents = file.section_by_index(index).ok()?.data().ok()?;
    let mut hasher = crc32fast::Hasher::new_with_initial(u32::MAX);
    hasher.update(contents);
    let crc = hasher.finalize() ^ u32::MAX;
    // The symbol records (18 bytes each): the section's own static symbol (value 0, storage
    // class 3) is followed by its definition: length (4), relocations (2), line numbers (2),
    // then the checksum.
    let u32_at = |at: usize| data.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let (table, count) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let mut i = 0;
    while i < count {
        let rec = data.get(table + i * 18..table + (i + 1) * 18)?;
        let section = i16::from_le_bytes([rec[12], rec[13]]);
        let (class, aux) = (rec[16], usize::from(rec[17]));
        if class == object::pe::IMAGE_SYM_CLASS_STATIC.0
            && aux >= 1
            && section as usize == index.0
            && rec[8..12] == [0; 4]
        {
            let at = table + (i + 1) * 18 + 8;
            if u32_at(at)? == crc {
                return None;
            }
            return Some(Patch { writes: vec![(at as u64, crc.to_le_bytes().to_vec())], len: None });
        }
        i += 1 + aux;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_table_is_laid_out_as_llvm_lays_it_out() {
        // An object of TVM 0.27's LLVM (tests/fixtures/targets): its table, rebuilt.
        let data = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/targets/tvm27-aarch64-linux-gnu.syslib.devc.o"
        ))
        .unwrap();
        let file = object::File::parse(&*data).unwrap();
        use object::{Object, ObjectSection, ObjectSymbol};
        let table = file.section_by_name(".strtab").unwrap().data().unwrap().to_vec();
        let mut names: Vec<Vec<u8>> = file.sections().map(|s| s.name_bytes().unwrap().to_vec()).collect();
        names.extend(file.symbols().map(|s| s.name_bytes().unwrap().to_vec()));
        names.push(b".strtab".to_vec());
        names.push(b".symtab".to_vec());
        let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        assert_eq!(llvm_string_table(&refs).0, table);
        assert_eq!(mapping_name(b"$x.0"), Some(&b"$x"[..]));
        assert_eq!(mapping_name(b"$d.12"), Some(&b"$d"[..]));
        for other in [&b"$d"[..], b"$x.", b"$x.a", b"x.0"] {
            assert_eq!(mapping_name(other), None);
        }
    }
}
