//! `DLDataType`, the element type of tensors and kernel arguments, with TVM's spelling.

/// A `DLDataType`: type code, bits per lane, lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataType {
    /// DLPack type code: 0 int, 1 uint, 2 float, 3 handle (opaque pointer), 4 bfloat.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Number of lanes (1 for scalars).
    pub lanes: u16,
}

impl DataType {
    /// `float32`.
    pub const F32: DataType = DataType { code: 2, bits: 32, lanes: 1 };
    /// `int32`.
    pub const I32: DataType = DataType { code: 0, bits: 32, lanes: 1 };
    /// `int64`.
    pub const I64: DataType = DataType { code: 0, bits: 64, lanes: 1 };
    /// `bool` as TVM 0.19 to 0.21 spell it (`uint1`, one byte per element), and numpy's.
    pub const BOOL: DataType = DataType { code: 1, bits: 1, lanes: 1 };
    /// `bool` as tvm-ffi (TVM 0.22+) spells it: DLPack's `kDLBool`, 8 bits.
    pub const FFI_BOOL: DataType = DataType { code: 6, bits: 8, lanes: 1 };
    /// `handle` (a pointer argument).
    pub const HANDLE: DataType = DataType { code: 3, bits: 64, lanes: 1 };

    /// Bytes per element as TVM's tensor format counts them: `ceil(bits / 8)`, lanes not
    /// multiplied in.
    pub fn element_bytes(self) -> u64 {
        u64::from(self.bits).div_ceil(8)
    }

    /// Parses TVM's spelling (`float32`, `int8`, `uint1`, `handle`, `bfloat16`, `float16x4`).
    pub fn parse(s: &str) -> Option<DataType> {
        if s == "handle" {
            return Some(DataType::HANDLE);
        }
        if s == "bool" {
            return Some(DataType { code: 1, bits: 1, lanes: 1 });
        }
        let (base, lanes) = match s.split_once('x') {
            Some((b, l)) => (b, l.parse().ok()?),
            None => (s, 1),
        };
        let (code, bits) = [("bfloat", 4u8), ("float", 2), ("uint", 1), ("int", 0)]
            .iter()
            .find_map(|(p, c)| base.strip_prefix(p).map(|b| (*c, b)))?;
        Some(DataType { code, bits: bits.parse().ok()?, lanes })
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == DataType::HANDLE {
            return f.write_str("handle");
        }
        if self.code == 1 && self.bits == 1 && self.lanes == 1 {
            return f.write_str("bool");
        }
        match self.code {
            0 => write!(f, "int{}", self.bits)?,
            1 => write!(f, "uint{}", self.bits)?,
            2 => write!(f, "float{}", self.bits)?,
            3 => write!(f, "handle{}", self.bits)?,
            4 => write!(f, "bfloat{}", self.bits)?,
            // DLPack's kDLBool (TVM 0.22+ stores booleans so, one byte each).
            6 if self.bits == 8 => f.write_str("bool")?,
            c => write!(f, "custom[{c}]{}", self.bits)?,
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names() {
        for s in ["float32", "int8", "uint16", "handle", "float16x4", "bfloat16", "bool"] {
            assert_eq!(DataType::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(DataType::parse("handle"), Some(DataType::HANDLE));
        assert_eq!(DataType::parse("pointer"), None);
        // TVM 0.22+'s bool: DLPack code 6, 8 bits.
        assert_eq!(DataType { code: 6, bits: 8, lanes: 1 }.to_string(), "bool");
        assert_eq!(DataType { code: 6, bits: 8, lanes: 4 }.to_string(), "boolx4");
        assert_eq!(DataType { code: 6, bits: 16, lanes: 1 }.to_string(), "custom[6]16");
    }
}
