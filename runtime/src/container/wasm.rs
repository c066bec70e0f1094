//! The blob of a WebAssembly module.
//!
//! - A relocatable object (what TVM's `ModulePackImportsToLLVM` writes for a `wasm32` target):
//!   the `linking` section's symbol table names the blob symbol as a data symbol, with the data
//!   segment, the offset in it and the size.
//! - A linked module (`wasm-ld`'s output, after binaryen): `wasm-ld` exports the blob symbol as
//!   an immutable global that holds its address in linear memory (read by `object`). The bytes
//!   are cut out of the linear memory rebuilt from the active data segments (zeros where none
//!   writes), for as long as the blob's header says.
//! - A linked system-lib module that exports nothing (MLC's web builds): the blob's address is
//!   what the start-up code passes to the system-lib registration, next to the address of the
//!   blob symbol's name: `i32.const NAME; i32.const BLOB; call REGISTER`, where NAME is the
//!   address of the NUL-terminated string `<prefix>__tvm_dev_mblob` in the data segments.
//!
//! `wasmparser` reads the sections; nothing here decodes WebAssembly by hand.

use wasmparser::{DataKind, KnownCustom, Linking, Operator, Parser, Payload, SymbolInfo};

use super::{outside, slice, ContainerBlob, ContainerError, ContainerErrorKind, Identity};
use crate::bytes::Bytes;
use crate::format::Layout;

/// The most bytes a rebuilt blob may span for each byte of the file (zeros that binaryen left
/// out cost nothing in the file), plus a fixed allowance: a header that claims more is refused,
/// not allocated.
const ZEROS_PER_BYTE: u64 = 32;
const ZEROS_ALLOWANCE: u64 = 4 << 10;

/// One data segment: where its bytes lie in the file, and the address (active segments) where
/// they go in linear memory.
struct Segment {
    file_start: u64,
    len: u64,
    address: Option<u64>,
    name: String,
}

pub(super) fn find(
    data: &Bytes,
    base: u64,
    prefix: Option<&str>,
    identity: Identity,
) -> Result<Option<ContainerBlob>, ContainerError> {
    let err = |offset: u64, kind: ContainerErrorKind| ContainerError { format: "wasm", offset: base + offset, kind };
    let bad = |e: wasmparser::BinaryReaderError| {
        err(e.offset() as u64, ContainerErrorKind::Unreadable(e.message().to_owned()))
    };
    let mut segments: Vec<Segment> = Vec::new();
    // Data symbols of the linking section: (name, segment, offset, size).
    let mut data_symbols: Vec<(String, u32, u64, u64)> = Vec::new();
    let mut memory_bytes: Option<u64> = None;
    // `(name address, blob address)` pairs passed to a call: candidates for the registration.
    let mut registered: Vec<(u64, u64)> = Vec::new();
    for payload in Parser::new(0).parse_all(&data[..]) {
        match payload.map_err(bad)? {
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().map_err(bad)?;
                let mut last: [Option<u64>; 2] = [None, None];
                while !ops.eof() {
                    match ops.read().map_err(bad)? {
                        Operator::I32Const { value } => last = [last[1], Some(u64::from(value as u32))],
                        Operator::Call { .. } => {
                            if let [Some(name), Some(blob)] = last {
                                registered.push((name, blob));
                            }
                            last = [None, None];
                        }
                        _ => last = [None, None],
                    }
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    let memory = memory.map_err(bad)?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16);
                    memory_bytes.get_or_insert(memory.initial.saturating_mul(page));
                }
            }
            Payload::DataSection(reader) => {
                for (index, segment) in reader.into_iter().enumerate() {
                    let segment = segment.map_err(bad)?;
                    let file_start = (segment.range.end - segment.data.len()) as u64;
                    let address = match segment.kind {
                        DataKind::Active { offset_expr, .. } => {
                            match offset_expr.get_operators_reader().read().map_err(bad)? {
                                Operator::I32Const { value } => Some(u64::from(value as u32)),
                                Operator::I64Const { value } => Some(value as u64),
                                _ => None,
                            }
                        }
                        DataKind::Passive => None,
                    };
                    let name = format!("data segment {index}");
                    segments.push(Segment { file_start, len: segment.data.len() as u64, address, name });
                }
            }
            Payload::CustomSection(reader) => {
                if let KnownCustom::Linking(linking) = reader.as_known() {
                    for sub in linking {
                        let Linking::SymbolTable(symbols) = sub.map_err(bad)? else { continue };
                        for symbol in symbols {
                            if let SymbolInfo::Data { name, symbol: Some(def), .. } = symbol.map_err(bad)? {
                                data_symbols.push((name.to_owned(), def.index, def.offset.into(), def.size.into()));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut found: Vec<ContainerBlob> = Vec::new();
    // A relocatable object: the symbol's segment, offset and size.
    for (name, index, offset, size) in data_symbols {
        let Some((layout, pfx)) = Layout::from_symbol(&name) else { continue };
        if prefix.is_some_and(|p| p != pfx) {
            continue;
        }
        let segment = segments
            .get(index as usize)
            .ok_or_else(|| err(0, outside(&name, format!("names data segment {index}, which the module lacks"))))?;
        let start = offset
            .checked_add(size)
            .filter(|end| *end <= segment.len)
            .map(|_| segment.file_start + offset)
            .ok_or_else(|| err(segment.file_start, outside(&name, format!("does not fit in {}", segment.name))))?;
        let bytes = slice(data, start, size)
            .ok_or_else(|| err(segment.file_start, outside(&name, "lies past the end of the file")))?;
        found.push(blob(name.clone(), layout, pfx, &identity, Some(base + start), segment.name.clone(), false, bytes));
    }
    // A linked module: exported globals holding addresses in linear memory.
    if found.is_empty() {
        if let Ok(file) = object::File::parse(&data[..]) {
            use object::{Object, ObjectSymbol};
            for sym in file.symbols() {
                if sym.kind() != object::SymbolKind::Data || sym.is_undefined() {
                    continue;
                }
                let Ok(name) = sym.name() else { continue };
                let Some((layout, pfx)) = Layout::from_symbol(name) else { continue };
                if prefix.is_some_and(|p| p != pfx) || found.iter().any(|f| f.symbol == name) {
                    continue;
                }
                let bytes = read_memory(data, &segments, sym.address(), memory_bytes)
                    .map_err(|detail| err(0, outside(name, detail)))?;
                found.push(blob(name.to_owned(), layout, pfx, &identity, None, "linear memory".into(), true, bytes));
            }
        }
    }
    // A system-lib module that exports nothing: the registration call's arguments.
    if found.is_empty() && !registered.is_empty() {
        for (name, address) in blob_names(data, &segments) {
            let Some((layout, pfx)) = Layout::from_symbol(&name) else { continue };
            if prefix.is_some_and(|p| p != pfx) || found.iter().any(|f| f.symbol == name) {
                continue;
            }
            let Some(&(_, blob_address)) = registered.iter().find(|(n, _)| *n == address) else { continue };
            let bytes = read_memory(data, &segments, blob_address, memory_bytes)
                .map_err(|detail| err(0, outside(&name, detail)))?;
            let mut b = blob(name.clone(), layout, pfx, &identity, None, "linear memory".into(), false, bytes);
            b.system_lib = true;
            found.push(b);
        }
    }
    found.sort_by_key(|b| !b.prefix.is_empty());
    let calls = super::calls_registration(data);
    Ok(found.into_iter().next().map(|b| ContainerBlob { system_lib: b.system_lib || calls, ..b }))
}

/// The NUL-terminated strings of the active data segments that end in a blob symbol's name,
/// with their addresses in linear memory.
fn blob_names(data: &[u8], segments: &[Segment]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for s in segments {
        let Some(at) = s.address else { continue };
        let (Ok(start), Ok(len)) = (usize::try_from(s.file_start), usize::try_from(s.len)) else { continue };
        let Some(bytes) = data.get(start..).and_then(|d| d.get(..len)) else { continue };
        for layout in Layout::ALL {
            let needle = layout.symbol().as_bytes();
            let mut from = 0;
            while let Some(i) = find_bytes(&bytes[from..], needle).map(|i| i + from) {
                from = i + 1;
                if bytes.get(i + needle.len()) != Some(&0) {
                    continue;
                }
                // The name starts after the previous NUL (a prefix of at most MAX_NAME bytes).
                let floor = i.saturating_sub(MAX_NAME);
                let begin = bytes[floor..i].iter().rposition(|b| *b == 0).map_or(floor, |p| floor + p + 1);
                if let Ok(name) = std::str::from_utf8(&bytes[begin..i + needle.len()]) {
                    out.push((name.to_owned(), at.saturating_add(begin as u64)));
                }
            }
        }
    }
    out
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Longest prefix looked at in front of a blob symbol's name.
const MAX_NAME: usize = 4096;

#[allow(clippy::too_many_arguments)]
fn blob(
    symbol: String,
    layout: Layout,
    prefix: &str,
    identity: &Identity,
    file_offset: Option<u64>,
    section: String,
    dynamic: bool,
    bytes: Bytes,
) -> ContainerBlob {
    ContainerBlob {
        symbol,
        layout,
        prefix: prefix.to_owned(),
        identity: identity.clone(),
        member: None,
        file_offset,
        section,
        dynamic,
        system_lib: false,
        bytes,
    }
}

/// The blob at `address` of the linear memory that the active segments build: its 8-byte
/// header, then as many bytes as it gives. When one segment holds it whole, a view of the file.
fn read_memory(data: &Bytes, segments: &[Segment], address: u64, memory: Option<u64>) -> Result<Bytes, String> {
    let mut header = [0u8; 8];
    copy_range(data, segments, address, &mut header);
    let len = super::header_len(&header).ok_or("has a header whose length overflows")?;
    let limit = (data.len() as u64).saturating_mul(ZEROS_PER_BYTE).saturating_add(ZEROS_ALLOWANCE);
    let end = address.checked_add(len).ok_or("lies past the end of the address space")?;
    if memory.is_some_and(|m| end > m) {
        return Err(format!(
            "(address {address:#x}) has a header that claims {len} bytes, past the end of linear memory ({} bytes)",
            memory.unwrap_or(0)
        ));
    }
    if len > limit {
        return Err(format!(
            "(address {address:#x}) has a header that claims {len} bytes, more than the file can hold"
        ));
    }
    // One segment holding it all: no copy.
    for s in segments {
        if let Some(at) = s.address.filter(|a| *a <= address && end <= a.saturating_add(s.len)) {
            if let Some(bytes) = slice(data, s.file_start + (address - at), len) {
                return Ok(bytes);
            }
        }
    }
    let mut out = vec![0u8; usize::try_from(len).map_err(|_| "is too large for this machine")?];
    copy_range(data, segments, address, &mut out);
    Ok(Bytes::from_vec(out))
}

/// Fills `out` with linear memory from `address` on, as the active segments write it (in
/// order: a later segment overwrites an earlier one, as instantiation does).
fn copy_range(data: &[u8], segments: &[Segment], address: u64, out: &mut [u8]) {
    let end = address.saturating_add(out.len() as u64);
    for s in segments {
        let Some(at) = s.address else { continue };
        let from = at.max(address);
        let to = at.saturating_add(s.len).min(end);
        if from >= to {
            continue;
        }
        let (Ok(src), Ok(dst), Ok(n)) =
            (usize::try_from(s.file_start + (from - at)), usize::try_from(from - address), usize::try_from(to - from))
        else {
            continue;
        };
        if let (Some(src), Some(dst)) = (data.get(src..src + n), out.get_mut(dst..dst + n)) {
            dst.copy_from_slice(src);
        }
    }
}
