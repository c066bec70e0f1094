//! Classic blobs built to make the end search of unmeasured payloads work as hard as it can,
//! each about `n` bytes; shared by `runtime/tests/adversarial.rs` (work counted) and
//! `runtime/benches/adversarial.rs` (timed).

#![allow(dead_code)]

use super::blobs::{blob, push_str, u64le};

/// Builds an input of about the given size.
pub type Build = fn(usize) -> Vec<u8>;

/// Name and builder of every construction.
pub const ALL: [(&str, Build); 6] = [
    ("unmeasured keys, then a zero tail", opaque_before_long_tail),
    ("unmeasured keys back to back", unmeasured_run),
    ("unmeasured keys between runs of _lib", unmeasured_between_libs),
    ("one-letter unknown keys (kept raw)", plausible_unknown_keys),
    ("import trees that almost fit", near_miss_trees),
    ("a real chain of unmeasured payloads, then junk", real_chain_then_junk),
];

/// Every candidate end lies before a long tail of zeros: the old search walked the tail again
/// for each try.
pub fn opaque_before_long_tail(n: usize) -> Vec<u8> {
    let mut body = u64le(40).to_vec();
    for _ in 0..=100 {
        push_str(&mut body, b"AotExecutorFactory");
    }
    body.resize(n.max(body.len()), 0);
    blob(body)
}

/// Unmeasured entries back to back, more than the count: every entry start is a candidate for
/// every other, at every nesting level.
pub fn unmeasured_run(n: usize) -> Vec<u8> {
    let mut body = u64le((n / 24) as u64).to_vec();
    while body.len() < n {
        push_str(&mut body, b"AotExecutorFactory");
    }
    blob(body)
}

/// Unmeasured entries separated by runs of `_lib` of every length up to 64: from each
/// candidate a different number of entries parses, so the search is asked for many different
/// counts of entries to come.
pub fn unmeasured_between_libs(n: usize) -> Vec<u8> {
    let mut body = u64le((n / 12) as u64).to_vec();
    let mut run = 0;
    while body.len() < n {
        push_str(&mut body, b"metadata");
        for _ in 0..run {
            push_str(&mut body, b"_lib");
        }
        run = (run + 1) % 64;
    }
    body.extend_from_slice(&[0xff; 7]);
    blob(body)
}

/// Unknown one-letter keys (kept raw: the second pass accepts any plausible key as the next
/// entry), so that candidates are as dense as the format allows.
pub fn plausible_unknown_keys(n: usize) -> Vec<u8> {
    let mut body = u64le((n / 9) as u64 + 7).to_vec();
    while body.len() < n {
        push_str(&mut body, b"a");
    }
    blob(body)
}

/// Unmeasured entries each followed by an import tree that is one entry short or one byte
/// long: each candidate parses a whole tree before failing.
pub fn near_miss_trees(n: usize) -> Vec<u8> {
    let mut body = u64le(3).to_vec();
    let mut i = 0u64;
    while body.len() < n {
        push_str(&mut body, b"AotExecutorFactory");
        push_str(&mut body, b"_import_tree");
        body.extend_from_slice(&u64le(3));
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        body.extend_from_slice(&u64le(1));
        body.extend_from_slice(&u64le(1 + i % 2));
        i += 1;
    }
    blob(body)
}

/// Eight unmeasured payloads of real-looking bytes that would parse with `_lib` and a tree,
/// followed by junk, so no end fits and every level searches.
pub fn real_chain_then_junk(n: usize) -> Vec<u8> {
    let k = 8;
    let keys: [&[u8]; 2] = [b"AotExecutorFactory", b"metadata"];
    let size = n / (k + 1);
    let mut body = u64le(k as u64 + 2).to_vec();
    for i in 0..k {
        push_str(&mut body, keys[i % 2]);
        body.extend((0..size).map(|j| (j * 7 + i) as u8 & 0x3f));
    }
    push_str(&mut body, b"_lib");
    push_str(&mut body, b"_import_tree");
    body.extend_from_slice(&u64le(k as u64 + 2));
    body.extend_from_slice(&[0xee; 9]);
    blob(body)
}

/// A valid classic blob of `k` unmeasured payloads of `size` bytes each, then `_lib` and the
/// import tree (module 0 imports every other one).
pub fn classic_opaque_chain_ok(k: usize, size: usize) -> Vec<u8> {
    classic_opaque_chain_keyed(b"AotExecutorFactory", k, size)
}

/// [`classic_opaque_chain_ok`] with `first_key` in place of `AotExecutorFactory` (every third
/// payload's key; the others are `metadata` and `const_loader`).
pub fn classic_opaque_chain_keyed(first_key: &[u8], k: usize, size: usize) -> Vec<u8> {
    let keys: [&[u8]; 3] = [first_key, b"metadata", b"const_loader"];
    let mut body = u64le(k as u64 + 2).to_vec();
    for i in 0..k {
        push_str(&mut body, keys[i % keys.len()]);
        body.extend((0..size).map(|j| (j * 7 + i) as u8 & 0x3f));
    }
    push_str(&mut body, b"_lib");
    push_str(&mut body, b"_import_tree");
    body.extend_from_slice(&u64le(k as u64 + 2));
    body.extend_from_slice(&u64le(0));
    for _ in 0..=k {
        body.extend_from_slice(&u64le(k as u64));
    }
    body.extend_from_slice(&u64le(k as u64));
    for c in 1..=k {
        body.extend_from_slice(&u64le(c as u64));
    }
    blob(body)
}

/// An ELF64 file of about `n` bytes whose symbol table (half the file) names every symbol at a
/// different offset of a string table (the other half) without a single NUL: reading each
/// name to its end would read the rest of the table, for every symbol.
pub fn elf_unterminated_names(n: usize) -> Vec<u8> {
    let symbols = (n / 2 / 24).max(2);
    let strtab_len = n / 2;
    let shstrtab = b"\0.symtab\0.strtab\0.shstrtab\0";
    let symtab_at = 64usize;
    let strtab_at = symtab_at + symbols * 24;
    let shstrtab_at = strtab_at + strtab_len;
    let sh_at = (shstrtab_at + shstrtab.len()).next_multiple_of(8);
    let mut f = Vec::with_capacity(sh_at + 4 * 64);
    f.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    f.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&[0; 16]); // entry, phoff
    f.extend_from_slice(&(sh_at as u64).to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 0, 64, 4, 3] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    f.extend_from_slice(&[0; 24]); // the null symbol
    for i in 1..symbols {
        f.extend_from_slice(&(i as u32).to_le_bytes());
        f.extend_from_slice(&[0x11, 0]);
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&[0; 16]);
    }
    f.resize(strtab_at + strtab_len, b'a');
    f.extend_from_slice(shstrtab);
    f.resize(sh_at, 0);
    let header = |f: &mut Vec<u8>, name: u32, ty: u32, at: usize, size: usize, link: u32, info: u32, entsize: u64| {
        f.extend_from_slice(&name.to_le_bytes());
        f.extend_from_slice(&ty.to_le_bytes());
        f.extend_from_slice(&[0; 16]); // flags, addr
        f.extend_from_slice(&(at as u64).to_le_bytes());
        f.extend_from_slice(&(size as u64).to_le_bytes());
        f.extend_from_slice(&link.to_le_bytes());
        f.extend_from_slice(&info.to_le_bytes());
        f.extend_from_slice(&8u64.to_le_bytes());
        f.extend_from_slice(&entsize.to_le_bytes());
    };
    header(&mut f, 0, 0, 0, 0, 0, 0, 0);
    header(&mut f, 1, 2, symtab_at, symbols * 24, 2, 1, 24);
    header(&mut f, 9, 3, strtab_at, strtab_len, 0, 0, 0);
    header(&mut f, 17, 3, shstrtab_at, shstrtab.len(), 0, 0, 0);
    f
}
