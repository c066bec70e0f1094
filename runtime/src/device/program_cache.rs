//! The bytes of an OpenCL program cache, as TVM's OpenCL module writes and reads them
//! (`opencl.GetPreCompiledPrograms` / `opencl.SetPreCompiledPrograms`, apache/tvm
//! `src/runtime/opencl/opencl_module.cc`; `src/backend/opencl/runtime/` from 0.24): what
//! MLC-LLM's engine passes from one to the other before it loads the VM on OpenCL.
//!
//! The layout is TVM's stream serialisation, little-endian:
//!
//! ```text
//! u64 count
//! count times:
//!   u64 name length, the kernel's name (its `// Function: NAME` section)
//!   u64 binary length, the program binary (clGetProgramInfo(CL_PROGRAM_BINARIES))
//! ```
//!
//! [`parse`] reads it without trusting it (every length is checked against the bytes left;
//! nothing is allocated from a length; bytes after the last entry, which TVM ignores, are
//! refused as a sign of a damaged file); [`write()`] writes it. No OpenCL is needed here: the
//! OpenCL module (feature `opencl`) builds and reads the programs.

/// TVM's name of the function of an OpenCL module that returns its program cache.
pub const GET_PROGRAMS: &str = "opencl.GetPreCompiledPrograms";
/// TVM's name of the function of an OpenCL module that loads a program cache.
pub const SET_PROGRAMS: &str = "opencl.SetPreCompiledPrograms";

/// What is wrong with a program cache: its bytes, or what they hold for a module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProgramCacheError {
    /// A program of the cache is for a kernel the module does not have (a cache of another
    /// library).
    #[error("the OpenCL program cache holds a program for `{name}`, which is not a kernel of this module")]
    UnknownKernel {
        /// The kernel's name.
        name: String,
    },
    /// The module's source has no `// Function: NAME` sections (a hand-written module, which
    /// TVM does not load): it has no programs per kernel to cache.
    #[error(
        "the OpenCL module's source has no `// Function: NAME` sections, so it has no programs per kernel to cache"
    )]
    NoSections,
    /// The bytes end inside a field.
    #[error("the OpenCL program cache is cut short: {what} needs {needed} bytes at offset {offset}, {left} are left")]
    Truncated {
        /// The field.
        what: String,
        /// Its offset.
        offset: usize,
        /// The bytes it needs.
        needed: u64,
        /// The bytes left.
        left: usize,
    },
    /// The count says more programs than the bytes can hold.
    #[error("the OpenCL program cache says it holds {count} programs, but its {size} bytes hold at most {most}")]
    Count {
        /// The count.
        count: u64,
        /// The size of the bytes.
        size: usize,
        /// How many entries of 16 bytes or more fit.
        most: usize,
    },
    /// A kernel name is not UTF-8 or is empty.
    #[error("the OpenCL program cache's entry {index} has no kernel name (empty or not UTF-8)")]
    Name {
        /// The entry.
        index: usize,
    },
    /// Bytes follow the last entry.
    #[error("the OpenCL program cache has {extra} bytes after its last program (at offset {offset})")]
    Trailing {
        /// Where they start.
        offset: usize,
        /// How many.
        extra: usize,
    },
}

/// One program of a cache: the kernel's name and the program binary, borrowed from the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedProgram<'a> {
    /// The kernel (the `// Function: NAME` section whose program this is).
    pub name: &'a str,
    /// The program binary, as the driver gave it.
    pub binary: &'a [u8],
}

/// Reads the bytes of a program cache (see the module's docs).
pub fn parse(bytes: &[u8]) -> Result<Vec<CachedProgram<'_>>, ProgramCacheError> {
    let mut at = 0usize;
    let count = read_u64(bytes, &mut at, || "the count".into())?;
    // Each entry takes two lengths (16 bytes) at least: a count above that is refused before
    // anything is reserved for it.
    let most = (bytes.len() - at) / 16;
    if count > most as u64 {
        return Err(ProgramCacheError::Count { count, size: bytes.len(), most });
    }
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let name = read_field(bytes, &mut at, || format!("entry {index}'s name"))?;
        let name = std::str::from_utf8(name).ok().filter(|n| !n.is_empty()).ok_or(ProgramCacheError::Name { index })?;
        let binary = read_field(bytes, &mut at, || format!("the program binary of `{name}`"))?;
        out.push(CachedProgram { name, binary });
    }
    if at != bytes.len() {
        return Err(ProgramCacheError::Trailing { offset: at, extra: bytes.len() - at });
    }
    Ok(out)
}

/// Writes the bytes of a program cache of `programs` (name, binary), in their order.
pub fn write<'a>(programs: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Vec<u8> {
    let programs: Vec<(&str, &[u8])> = programs.into_iter().collect();
    let mut out = Vec::with_capacity(8 + programs.iter().map(|(n, b)| 16 + n.len() + b.len()).sum::<usize>());
    out.extend_from_slice(&(programs.len() as u64).to_le_bytes());
    for (name, binary) in programs {
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(binary.len() as u64).to_le_bytes());
        out.extend_from_slice(binary);
    }
    out
}

fn read_u64(bytes: &[u8], at: &mut usize, what: impl Fn() -> String) -> Result<u64, ProgramCacheError> {
    let field = bytes.get(*at..).and_then(|rest| rest.get(..8)).ok_or_else(|| ProgramCacheError::Truncated {
        what: what(),
        offset: *at,
        needed: 8,
        left: bytes.len().saturating_sub(*at),
    })?;
    *at += 8;
    Ok(u64::from_le_bytes(field.try_into().unwrap_or_default()))
}

/// A length-prefixed field (`std::string` / `std::vector<unsigned char>` in TVM's stream).
fn read_field<'a>(bytes: &'a [u8], at: &mut usize, what: impl Fn() -> String) -> Result<&'a [u8], ProgramCacheError> {
    let n = read_u64(bytes, at, || format!("the length of {}", what()))?;
    let left = bytes.len() - *at;
    if n > left as u64 {
        return Err(ProgramCacheError::Truncated { what: what(), offset: *at, needed: n, left });
    }
    let field = &bytes[*at..*at + n as usize];
    *at += n as usize;
    Ok(field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_reads_back_as_written_and_bad_bytes_are_refused() {
        let bytes = write([("add_kernel", &b"\x7fELF"[..]), ("mul_kernel", &b""[..])]);
        // TVM's layout, by hand: the count, then each name and binary after its u64 length.
        let mut want = 2u64.to_le_bytes().to_vec();
        for (name, bin) in [(&b"add_kernel"[..], &b"\x7fELF"[..]), (b"mul_kernel", b"")] {
            want.extend((name.len() as u64).to_le_bytes());
            want.extend(name);
            want.extend((bin.len() as u64).to_le_bytes());
            want.extend(bin);
        }
        assert_eq!(bytes, want);
        let read = parse(&bytes).unwrap();
        assert_eq!(read[0], CachedProgram { name: "add_kernel", binary: b"\x7fELF" });
        assert_eq!(read[1], CachedProgram { name: "mul_kernel", binary: b"" });
        for cut in 0..bytes.len() {
            assert!(parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(matches!(parse(&u64::MAX.to_le_bytes()), Err(ProgramCacheError::Count { .. })));
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(parse(&extra), Err(ProgramCacheError::Trailing { offset: bytes.len(), extra: 1 }));
        let mut huge = 1u64.to_le_bytes().to_vec();
        huge.extend(u64::MAX.to_le_bytes());
        huge.extend(0u64.to_le_bytes());
        assert!(matches!(parse(&huge), Err(ProgramCacheError::Truncated { .. })));
        assert_eq!(parse(&write([("", &b"x"[..])])), Err(ProgramCacheError::Name { index: 0 }));
    }
}
