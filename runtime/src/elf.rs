//! Finding the blob in an ELF file without running it: the symbol table is read with the
//! `object` crate from a read-only mapping, and the blob's bytes are located in the file.

use object::read::elf::{ElfFile, FileHeader, SectionHeader, Sym};
use object::{Object, ObjectSection, ObjectSymbol, ReadRef, SectionKind};

use crate::bytes::Bytes;
use crate::format::Layout;

/// Where a blob symbol lies in an ELF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfBlob {
    /// The symbol's full name.
    pub symbol: String,
    /// The layout its name stands for.
    pub layout: Layout,
    /// The `c_symbol_prefix` in front of the blob name (often empty).
    pub prefix: String,
    /// Offset of the symbol's first byte in the file.
    pub file_offset: u64,
    /// The symbol's size (`st_size`), or, when that is 0, the bytes from the symbol to the
    /// end of its section.
    pub size: u64,
    /// The section that holds it.
    pub section: String,
    /// Whether it was found in the dynamic symbol table (`.dynsym`).
    pub dynamic: bool,
}

impl ElfBlob {
    /// The blob's bytes within `file`.
    pub fn bytes<'a>(&self, file: &'a [u8]) -> Option<&'a [u8]> {
        let start = usize::try_from(self.file_offset).ok()?;
        file.get(start..)?.get(..usize::try_from(self.size).ok()?)
    }
}

/// Finds the blob symbol in the ELF file `data` (see [`find_blob`]) and returns it with a view
/// of its bytes (no copy). `Ok(None)` when the file has no blob symbol; `Err` with the reader's
/// message when the file is not an ELF file it understands or the symbol is malformed.
pub fn slice_blob(data: &Bytes, prefix: Option<&str>) -> Result<Option<(ElfBlob, Bytes)>, String> {
    let Some(found) = find_blob(data, prefix)? else { return Ok(None) };
    let start = usize::try_from(found.file_offset).ok();
    let bytes = start
        .zip(usize::try_from(found.size).ok())
        .and_then(|(start, size)| data.slice(start..start.checked_add(size)?))
        .ok_or_else(|| format!("symbol `{}` lies past the end of the file", found.symbol))?;
    Ok(Some((found, bytes)))
}

/// Longest symbol name looked at: a blob symbol with a prefix of up to about 4000 bytes.
const MAX_NAME: usize = 4096;

/// For each symbol of the (dynamic) symbol table, whether its name ends (NUL) within
/// [`MAX_NAME`] bytes of the string table.
fn short_names<'d, Elf: FileHeader, R: ReadRef<'d>>(elf: &ElfFile<'d, Elf, R>, dynamic: bool) -> Vec<bool> {
    let e = elf.endian();
    let table = if dynamic { elf.elf_dynamic_symbol_table() } else { elf.elf_symbol_table() };
    let strings = elf
        .elf_section_table()
        .section(table.string_section())
        .ok()
        .and_then(|s| s.data(e, elf.data()).ok())
        .unwrap_or_default();
    // One pass down the string table, visiting the names' offsets from the highest, keeps
    // the nearest NUL at or after each: linear in the table, whatever the names.
    let symbols = table.symbols();
    let mut by_offset: Vec<(u32, usize)> = symbols.iter().enumerate().map(|(i, s)| (s.st_name(e), i)).collect();
    by_offset.sort_unstable_by(|a, b| b.cmp(a));
    let mut short = vec![false; symbols.len()];
    let (mut at, mut next_nul) = (strings.len(), None);
    for (offset, index) in by_offset {
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        if offset >= strings.len() {
            continue;
        }
        while at > offset {
            at -= 1;
            if strings[at] == 0 {
                next_nul = Some(at);
            }
        }
        short[index] = next_nul.is_some_and(|nul| nul - offset < MAX_NAME);
    }
    short
}

/// Looks for a blob symbol (any layout; with `prefix` when given, else preferring none) in
/// the ELF image `data`. `Ok(None)` when the file has none; `Err` with the reader's message
/// when the file is not an ELF file the reader understands, or the symbol is malformed.
pub fn find_blob(data: &[u8], prefix: Option<&str>) -> Result<Option<ElfBlob>, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(format!("{:?} files are not supported, only ELF", file.format()));
    }
    let mut found: Vec<ElfBlob> = Vec::new();
    // Which symbols have a name short enough to be a blob symbol, found without reading past
    // it: a name runs to the next NUL, and a string table without NULs, read once per symbol,
    // cost the square of the file's size.
    let short = |dynamic: bool| match &file {
        object::File::Elf32(elf) => short_names(elf, dynamic),
        object::File::Elf64(elf) => short_names(elf, dynamic),
        _ => Vec::new(),
    };
    let tables = [(true, file.dynamic_symbols(), short(true)), (false, file.symbols(), short(false))];
    for (dynamic, symbols, short) in tables {
        for sym in symbols {
            if !short.get(sym.index().0).copied().unwrap_or(false) {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            let Some((layout, pfx)) = Layout::from_symbol(name) else { continue };
            if prefix.is_some_and(|p| p != pfx) || sym.is_undefined() {
                continue;
            }
            if found.iter().any(|f| f.symbol == name) {
                continue;
            }
            let Some(index) = sym.section_index() else { continue };
            let section = file.section_by_index(index).map_err(|e| e.to_string())?;
            let section_name = section.name().unwrap_or("?").to_owned();
            if section.kind() == SectionKind::UninitializedData {
                return Err(format!("symbol `{name}` lies in {section_name}, which holds no bytes"));
            }
            let (sec_off, sec_size) =
                section.file_range().ok_or_else(|| format!("section {section_name} of `{name}` has no file range"))?;
            let within = sym
                .address()
                .checked_sub(section.address())
                .filter(|w| *w <= sec_size)
                .ok_or_else(|| format!("symbol `{name}` lies outside its section {section_name}"))?;
            let room = sec_size - within;
            let size = if sym.size() == 0 { room } else { sym.size() };
            if size > room {
                return Err(format!(
                    "symbol `{name}` claims {size} bytes but only {room} remain in section {section_name}"
                ));
            }
            let file_offset = sec_off.checked_add(within);
            let Some(file_offset) =
                file_offset.filter(|o| o.checked_add(size).is_some_and(|end| end <= data.len() as u64))
            else {
                return Err(format!("symbol `{name}` lies past the end of the file"));
            };
            found.push(ElfBlob {
                symbol: name.to_owned(),
                layout,
                prefix: pfx.to_owned(),
                file_offset,
                size,
                section: section_name,
                dynamic,
            });
        }
    }
    found.sort_by_key(|b| !b.prefix.is_empty());
    Ok(found.into_iter().next())
}
