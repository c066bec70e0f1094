//! TVM's stream encoding (dmlc `Stream`, later `tvm/support/serializer.h`), both directions.
//!
//! Grammar (`tvm-format.md` §1): every scalar is little-endian with no padding; a `str` is a
//! `u64` byte length followed by the bytes (no NUL); a `vec<T>` of plain values is a `u64`
//! count followed by the elements; a map is a `u64` count followed by key, value, key, value.
//! A `DLDataType` is `u8 code, u8 bits, u16 lanes`.
//!
//! The reader never indexes: each read takes a checked slice, every length is compared with
//! what remains before anything is allocated, and each failure names the field and the byte
//! offset. `read_x` sits beside `write_x` so one search finds both directions.

use std::io::{self, Write};

pub use super::dtype::DataType;
use super::error::{FormatError, FormatErrorKind};

/// A cursor over borrowed bytes that reports absolute offsets.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of `data[0]` in the outer input, added to every reported offset.
    base: u64,
}

impl<'a> Reader<'a> {
    /// A reader over `data`, whose first byte lies at `base` in the outer input.
    pub fn new(data: &'a [u8], base: u64) -> Self {
        Reader { data, pos: 0, base }
    }

    /// Absolute offset of the next byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes read so far: the position of the next byte within the reader's own input.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Reads a `str` and returns where its bytes lie within the reader's own input (for taking
    /// the same range of a shared buffer without copying).
    pub(crate) fn read_str_range(&mut self, what: &'static str) -> Result<std::ops::Range<usize>, FormatError> {
        let bytes = self.read_str_bytes(what)?;
        Ok(self.pos - bytes.len()..self.pos)
    }

    /// Takes the next `n` bytes and returns where they lie within the reader's own input.
    pub(crate) fn read_range(&mut self, n: u64, what: &'static str) -> Result<std::ops::Range<usize>, FormatError> {
        let bytes = self.read_bytes(n, what)?;
        Ok(self.pos - bytes.len()..self.pos)
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// The bytes not yet read.
    pub fn rest(&self) -> &'a [u8] {
        self.data.get(self.pos..).unwrap_or_default()
    }

    /// True when every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// An error at the current offset.
    pub fn error(&self, kind: FormatErrorKind) -> FormatError {
        FormatError::new(self.offset(), kind)
    }

    /// Fails with [`FormatErrorKind::TrailingBytes`] unless every byte was read.
    pub fn finish(&self, what: &'static str) -> Result<(), FormatError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.error(FormatErrorKind::TrailingBytes { what, extra: self.remaining() as u64 }))
        }
    }

    /// Takes the next `n` bytes.
    pub fn read_bytes(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], FormatError> {
        let have = self.remaining() as u64;
        let taken = usize::try_from(n).ok().and_then(|n| self.data.get(self.pos..)?.get(..n));
        match taken {
            Some(bytes) => {
                self.pos += bytes.len();
                Ok(bytes)
            }
            None => Err(self.error(FormatErrorKind::Truncated { what, need: n, have })),
        }
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: u64, what: &'static str) -> Result<(), FormatError> {
        self.read_bytes(n, what).map(|_| ())
    }

    fn read_array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FormatError> {
        let bytes = self.read_bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// Reads a little-endian `u64`.
    pub fn read_u64(&mut self, what: &'static str) -> Result<u64, FormatError> {
        self.read_array(what).map(u64::from_le_bytes)
    }

    /// Reads a little-endian `i64`.
    pub(crate) fn read_i64(&mut self, what: &'static str) -> Result<i64, FormatError> {
        self.read_array(what).map(i64::from_le_bytes)
    }

    /// Reads a little-endian `i32`.
    pub(crate) fn read_i32(&mut self, what: &'static str) -> Result<i32, FormatError> {
        self.read_array(what).map(i32::from_le_bytes)
    }

    /// Reads a little-endian `u16`.
    pub(crate) fn read_u16(&mut self, what: &'static str) -> Result<u16, FormatError> {
        self.read_array(what).map(u16::from_le_bytes)
    }

    /// Reads a `u8`.
    pub(crate) fn read_u8(&mut self, what: &'static str) -> Result<u8, FormatError> {
        self.read_array::<1>(what).map(|[b]| b)
    }

    /// Reads a `u64` element count and checks that `count * min_elem_size` bytes remain, so
    /// that no caller allocates more than the input could fill.
    pub(crate) fn read_count(&mut self, what: &'static str, min_elem_size: u64) -> Result<usize, FormatError> {
        let at = self.offset();
        let count = self.read_u64(what)?;
        let remaining = self.remaining() as u64;
        let fits = count.checked_mul(min_elem_size.max(1)).is_some_and(|need| need <= remaining);
        match usize::try_from(count) {
            Ok(n) if fits => Ok(n),
            _ => Err(FormatError::new(at, FormatErrorKind::LengthTooLarge { what, len: count, remaining })),
        }
    }

    /// Reads a `str` as raw bytes.
    pub(crate) fn read_str_bytes(&mut self, what: &'static str) -> Result<&'a [u8], FormatError> {
        let at = self.offset();
        let len = self.read_u64(what)?;
        let remaining = self.remaining() as u64;
        if len > remaining {
            return Err(FormatError::new(at, FormatErrorKind::LengthTooLarge { what, len, remaining }));
        }
        self.read_bytes(len, what)
    }

    /// Reads a `str` that must be UTF-8.
    pub(crate) fn read_str(&mut self, what: &'static str) -> Result<&'a str, FormatError> {
        let at = self.offset();
        let bytes = self.read_str_bytes(what)?;
        std::str::from_utf8(bytes).map_err(|_| FormatError::new(at, FormatErrorKind::NotUtf8 { what }))
    }

    /// Reads a `vec<u64>`.
    pub(crate) fn read_vec_u64(&mut self, what: &'static str) -> Result<Vec<u64>, FormatError> {
        let n = self.read_count(what, 8)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.read_u64(what)?);
        }
        Ok(out)
    }

    /// Reads a `vec<str>` of UTF-8 strings.
    pub fn read_vec_str(&mut self, what: &'static str) -> Result<Vec<String>, FormatError> {
        let n = self.read_count(what, 8)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.read_str(what)?.to_owned());
        }
        Ok(out)
    }

    /// Reads a `DLDataType`.
    pub(crate) fn read_dtype(&mut self, what: &'static str) -> Result<DataType, FormatError> {
        Ok(DataType { code: self.read_u8(what)?, bits: self.read_u8(what)?, lanes: self.read_u16(what)? })
    }
}

/// Writes a little-endian `u64`.
pub fn write_u64(out: &mut dyn Write, v: u64) -> io::Result<()> {
    out.write_all(&v.to_le_bytes())
}

/// Writes a `str`.
pub fn write_str(out: &mut dyn Write, s: impl AsRef<[u8]>) -> io::Result<()> {
    let s = s.as_ref();
    write_u64(out, s.len() as u64)?;
    out.write_all(s)
}

/// Bytes taken by a `str` of `len` bytes.
pub(crate) fn str_len(len: u64) -> u64 {
    8 + len
}

/// Writes a `vec<u64>`.
pub fn write_vec_u64(out: &mut dyn Write, v: &[u64]) -> io::Result<()> {
    write_u64(out, v.len() as u64)?;
    v.iter().try_for_each(|x| write_u64(out, *x))
}

/// Writes a `vec<str>`.
pub fn write_vec_str<S: AsRef<[u8]>>(out: &mut dyn Write, v: &[S]) -> io::Result<()> {
    write_u64(out, v.len() as u64)?;
    v.iter().try_for_each(|s| write_str(out, s))
}

/// Writes a `DLDataType`.
pub(crate) fn write_dtype(out: &mut dyn Write, t: DataType) -> io::Result<()> {
    out.write_all(&[t.code, t.bits])?;
    out.write_all(&t.lanes.to_le_bytes())
}

/// A sink that only counts bytes: measures an encoding without allocating it.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingSink(pub u64);

impl Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn str_round_trip_and_offsets() {
        let mut buf = Vec::new();
        write_str(&mut buf, "_lib").unwrap();
        write_vec_u64(&mut buf, &[0, 1, 1]).unwrap();
        let mut r = Reader::new(&buf, 100);
        assert_eq!(r.read_str("key").unwrap(), "_lib");
        assert_eq!(r.offset(), 112);
        assert_eq!(r.read_vec_u64("row_ptr").unwrap(), vec![0, 1, 1]);
        r.finish("test").unwrap();
    }

    #[test]
    fn huge_count_is_refused_before_allocation() {
        let mut buf = Vec::new();
        write_u64(&mut buf, u64::MAX / 2).unwrap();
        buf.extend_from_slice(&[0; 16]);
        let err = Reader::new(&buf, 8).read_vec_u64("row_ptr").unwrap_err();
        assert_eq!(err.offset, 8);
        assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { what: "row_ptr", remaining: 16, .. }));
    }

    #[test]
    fn string_past_end_is_refused() {
        let mut buf = Vec::new();
        write_u64(&mut buf, 10).unwrap();
        buf.extend_from_slice(b"abc");
        let err = Reader::new(&buf, 0).read_str("key").unwrap_err();
        assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { len: 10, remaining: 3, .. }));
    }

    #[test]
    fn truncated_scalar() {
        let err = Reader::new(&[1, 2, 3], 5).read_u64("nbytes").unwrap_err();
        assert_eq!(err, FormatError::new(5, FormatErrorKind::Truncated { what: "nbytes", need: 8, have: 3 }));
    }
}
