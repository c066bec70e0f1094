//! Finding the blob in an ELF file without running it: the symbol table is read with the
//! `object` crate from a read-only mapping, and the blob's bytes are located in the file.

use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

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

/// Looks for a blob symbol (any layout; with `prefix` when given, else preferring none) in
/// the ELF image `data`. `Ok(None)` when the file has none; `Err` with the reader's message
/// when the file is not an ELF file the reader understands, or the symbol is malformed.
pub fn find_blob(data: &[u8], prefix: Option<&str>) -> Result<Option<ElfBlob>, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(format!("{:?} files are not supported, only ELF", file.format()));
    }
    let mut found: Vec<ElfBlob> = Vec::new();
    let tables = [(true, file.dynamic_symbols()), (false, file.symbols())];
    for (dynamic, symbols) in tables {
        for sym in symbols {
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
