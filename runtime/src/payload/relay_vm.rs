//! The Relay VM executable (`VMExecutable`): what `relay.vm.compile` makes and
//! `export_library` packs (TVM 0.8 to 0.19), read as TVM's `Executable::Load` does
//! (`src/runtime/vm/executable.cc`). The interpreter is [`crate::exec::relay_vm`].
//!
//! The payload is the executable's bytes as one dmlc string (`code:str`); the executable's
//! kernel library is its one import (the host code of the `.so`).
//!
//! ```text
//! code          := magic:u64 (0xD225DE2F4214151D)  version:str (TVM_VERSION, "0.19.0")
//!                  [devices]                 # 0.9 and later
//!                  globals:vec<str>  constants  primitives:vec<str>  attrs  functions
//! devices       := n:u64 device{n}  host_device_index:i32
//! device        := device_type:i32 device_id:i32 [memory_scope:str (0.14 and later)]
//! constants     := n:u64 constant{n}  const_device:vec<i64>
//! constant      := tensor                    # 0.8: no tag
//!                | tag:u32 (0 immediate: tensor | 1 late-bound: name:str)
//! attrs         := n:u64 (index:u64  m:u64 (key:str value:str){m}){n}
//! functions     := n:u64 (info:vec<str> (name, register_file_size, instruction count)
//!                  params:vec<str>  param_device_indexes:vec<i64>  instruction{count}){n}
//! instruction   := n:u64  hash:i64  opcode:i64  field:i64{n-2}
//! ```
//!
//! `const_device` holds device indexes (0.9 and later) or device types (0.8). Each
//! instruction's hash combines its opcode and fields (TVM's `support::HashCombine`); TVM
//! refuses a mismatch and so does this reader. Every index an instruction holds (registers,
//! functions, primitives, constants, jump targets, devices) is checked here, so a program that
//! reads cannot make the interpreter index out of range. Errors are [`FormatError`]s with the
//! byte offset from the first byte of the payload.

use std::io::{self, Write};

use crate::bytes::Bytes;
use crate::error::{FormatError, FormatErrorKind};
use crate::format::stream::{DataType, Reader};
use crate::payload::graph::Tensor;

/// The type key of a Relay VM executable.
pub const VM_EXECUTABLE: &str = "VMExecutable";
/// `kTVMVMBytecodeMagic`.
pub(crate) const MAGIC: u64 = 0xD225_DE2F_4214_151D;
/// Registers a function may declare at most (far beyond what TVM's compiler makes; a larger
/// count is a forged one, refused before any call allocates it).
pub(crate) const MAX_REGISTERS: u64 = 1 << 20;

/// Which TVM releases' layout the executable has (told by its version string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FormatVersion {
    /// TVM 0.8: no device section, untagged constants, constant device types.
    V08,
    /// TVM 0.9 to 0.13: devices without memory scopes.
    V09,
    /// TVM 0.14 to 0.19: devices with memory scopes.
    V14,
}

impl FormatVersion {
    /// The layout of TVM version `version` (`0.19.0`, `0.14.dev0`, ...); releases after 0.19
    /// (which have no Relay) are read as 0.19.
    pub fn of_version(version: &str) -> Option<FormatVersion> {
        let mut parts = version.split('.');
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next()?.parse().ok()?;
        // `0`, `dev0`, `rc1` (and what a development build appends after them).
        if let Some(patch) = parts.next() {
            let tail = patch.strip_prefix("dev").or_else(|| patch.strip_prefix("rc")).unwrap_or(patch);
            let numbered = tail.starts_with(|c: char| c.is_ascii_digit());
            let bare_tag = tail.is_empty() && patch != tail;
            if !numbered && !bare_tag {
                return None;
            }
        }
        Some(match (major, minor) {
            (0, 0..=8) => FormatVersion::V08,
            (0, 9..=13) => FormatVersion::V09,
            _ => FormatVersion::V14,
        })
    }
}

/// A virtual device of the executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualDevice {
    /// DLPack device type (1 is the CPU).
    pub device_type: i32,
    /// Device id.
    pub device_id: i32,
    /// Memory scope (empty or `global` for plain memory).
    pub memory_scope: String,
}

/// A constant of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmConstant {
    /// A tensor stored in the executable, its data borrowed from the payload.
    Immediate(Box<Tensor>),
    /// A late-bound constant: only its name is stored, its value comes from a separate file
    /// (`exe.move_late_bound_consts`).
    LateBound(String),
}

/// A register index (checked to be below its function's register file size).
pub type RegName = u32;

/// One decoded instruction, with TVM's names and fields (`include/tvm/runtime/vm/bytecode.h`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Instruction {
    Move {
        from: RegName,
        dst: RegName,
    },
    Ret {
        result: RegName,
    },
    Invoke {
        func: u32,
        args: Vec<RegName>,
        dst: RegName,
    },
    InvokeClosure {
        closure: RegName,
        args: Vec<RegName>,
        dst: RegName,
    },
    /// `args` holds inputs then the `output_size` outputs.
    InvokePacked {
        packed_index: u32,
        output_size: u32,
        args: Vec<RegName>,
    },
    AllocTensor {
        storage: RegName,
        offset: RegName,
        shape: Vec<i64>,
        dtype: DataType,
        dst: RegName,
    },
    AllocTensorReg {
        storage: RegName,
        offset: RegName,
        shape_register: RegName,
        dtype: DataType,
        dst: RegName,
    },
    AllocAdt {
        tag: i64,
        fields: Vec<RegName>,
        dst: RegName,
    },
    AllocClosure {
        func: u32,
        free_vars: Vec<RegName>,
        dst: RegName,
    },
    GetField {
        object: RegName,
        field_index: u32,
        dst: RegName,
    },
    /// Jumps by `true_offset` when the scalars in `test` and `target` are equal, else by
    /// `false_offset`.
    If {
        test: RegName,
        target: RegName,
        true_offset: i64,
        false_offset: i64,
    },
    /// `device_index` is `None` in executables whose `LoadConst` has no device field.
    LoadConst {
        const_index: u32,
        device_index: Option<u32>,
        dst: RegName,
    },
    Goto {
        offset: i64,
    },
    GetTag {
        object: RegName,
        dst: RegName,
    },
    LoadConsti {
        value: i64,
        dst: RegName,
    },
    Fatal,
    /// `allocation_size` is a register unless `shape` is given (then it is unused: the size is
    /// the shape's).
    AllocStorage {
        allocation_size: Option<RegName>,
        alignment: i64,
        dtype_hint: DataType,
        device_index: i64,
        shape: Vec<i64>,
        dst: RegName,
    },
    ShapeOf {
        tensor: RegName,
        dst: RegName,
    },
    ReshapeTensor {
        tensor: RegName,
        newshape: RegName,
        dst: RegName,
    },
    DeviceCopy {
        src: RegName,
        src_device_index: i64,
        dst_device_index: i64,
        dst: RegName,
    },
    KillRegister {
        dst: RegName,
    },
}

/// A VM function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmFunction {
    /// The name (`main`, a lifted function's name, ...).
    pub name: String,
    /// Registers a call needs.
    pub register_file_size: u32,
    /// Parameter names, in order.
    pub params: Vec<String>,
    /// The device index of each parameter.
    pub param_device_indexes: Vec<i64>,
    /// The code.
    pub instructions: Vec<Instruction>,
}

/// A parsed Relay VM executable. It is written back as the bytes it was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayVmExecutable {
    /// The TVM version that wrote it (`TVM_VERSION`).
    pub version: String,
    /// Its layout.
    pub format: FormatVersion,
    /// The virtual devices (empty for TVM 0.8).
    pub virtual_devices: Vec<VirtualDevice>,
    /// Index of the host among the virtual devices.
    pub host_device_index: i64,
    /// The constant pool.
    pub constants: Vec<VmConstant>,
    /// Per constant, its device index (its device type for TVM 0.8).
    pub const_device_indexes: Vec<i64>,
    /// The primitive functions (`InvokePacked` targets), looked up in the library by name.
    pub primitives: Vec<String>,
    /// String attributes of primitives, by primitive index.
    pub primitive_attrs: Vec<(u64, Vec<(String, String)>)>,
    /// The VM functions, in global-index order.
    pub functions: Vec<VmFunction>,
    payload: Bytes,
}

fn invalid(at: u64, what: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::new(at, FormatErrorKind::Invalid { what, detail: detail.into() })
}

/// TVM's `support::HashCombine`.
fn hash_combine(key: u64, value: i64) -> u64 {
    key ^ (value as u64).wrapping_add(0x9e37_79b9).wrapping_add(key << 6).wrapping_add(key >> 2)
}

fn read_vec_i64(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<i64>, FormatError> {
    let n = r.read_count(what, 8)?;
    (0..n).map(|_| r.read_i64(what)).collect()
}

impl RelayVmExecutable {
    /// How many bytes the payload at the start of `bytes` takes: its string's length plus 8.
    pub fn measure(bytes: &[u8], base: u64) -> Result<u64, FormatError> {
        let mut r = Reader::new(bytes, base);
        let code = r.read_str_bytes("VM executable")?;
        Ok(8 + code.len() as u64)
    }

    /// Reads a payload (the executable as one string), which must be read whole. Tensor data
    /// stays borrowed from `payload`.
    pub fn read_payload(payload: &Bytes) -> Result<RelayVmExecutable, FormatError> {
        let _span = tracing::debug_span!("relay_vm_executable", bytes = payload.len()).entered();
        let mut r = Reader::new(payload, 0);
        let range = r.read_str_range("VM executable")?;
        r.finish("the VM executable string")?;
        let code = payload.slice(range.clone()).unwrap_or_else(|| Bytes::from_vec(payload[range].to_vec()));
        let mut exec = RelayVmExecutable::read_code(&code, 8)?;
        exec.payload = payload.clone();
        Ok(exec)
    }

    /// Reads the executable itself (from its magic on), whose first byte lies at `base` in the
    /// payload.
    fn read_code(src: &Bytes, base: u64) -> Result<RelayVmExecutable, FormatError> {
        let mut r = Reader::new(src, base);
        let at = r.offset();
        let magic = r.read_u64("magic")?;
        if magic != MAGIC {
            return Err(FormatError::new(
                at,
                FormatErrorKind::BadMagic { what: "Relay VM executable", expected: MAGIC, found: magic },
            ));
        }
        let at = r.offset();
        let version = r.read_str("version")?.to_owned();
        let format = FormatVersion::of_version(&version)
            .ok_or_else(|| invalid(at, "version", format!("{version:?} is not a TVM version")))?;

        // Virtual devices.
        let (virtual_devices, host_device_index) = if format == FormatVersion::V08 {
            (Vec::new(), 0)
        } else {
            let n = r.read_count("virtual devices", 8)?;
            let mut devices = Vec::with_capacity(n);
            for _ in 0..n {
                let device_type = r.read_i32("virtual device")?;
                let device_id = r.read_i32("virtual device")?;
                let memory_scope =
                    if format == FormatVersion::V14 { r.read_str("memory scope")?.to_owned() } else { String::new() };
                devices.push(VirtualDevice { device_type, device_id, memory_scope });
            }
            let at = r.offset();
            let host = i64::from(r.read_i32("host device index")?);
            if !(0..n as i64).contains(&host) {
                return Err(invalid(at, "host device index", format!("{host}, but there are {n} virtual devices")));
            }
            (devices, host)
        };

        let globals_at = r.offset();
        let globals = r.read_vec_str("globals")?;

        // Constants.
        let n = r.read_count("constants", 4)?;
        let mut constants = Vec::with_capacity(n);
        for _ in 0..n {
            let c = if format == FormatVersion::V08 {
                VmConstant::Immediate(Box::new(Tensor::read(&mut r, src)?))
            } else {
                let at = r.offset();
                match r.read_i32("constant tag")? {
                    0 => VmConstant::Immediate(Box::new(Tensor::read(&mut r, src)?)),
                    1 => VmConstant::LateBound(r.read_str("late-bound constant name")?.to_owned()),
                    t => return Err(invalid(at, "constant tag", format!("{t} (0 immediate, 1 late-bound)"))),
                }
            };
            constants.push(c);
        }
        let at = r.offset();
        let const_device_indexes = read_vec_i64(&mut r, "constant devices")?;
        if const_device_indexes.len() != n {
            return Err(invalid(
                at,
                "constant devices",
                format!("{} entries for {n} constants", const_device_indexes.len()),
            ));
        }
        if format != FormatVersion::V08 {
            if let Some(d) = const_device_indexes.iter().find(|&&d| !(0..virtual_devices.len() as i64).contains(&d)) {
                return Err(invalid(at, "constant devices", format!("device index {d} is not a virtual device")));
            }
        }

        let primitives = r.read_vec_str("primitive names")?;
        let n = r.read_count("primitive attrs", 16)?;
        let mut primitive_attrs = Vec::with_capacity(n);
        for _ in 0..n {
            let index = r.read_u64("primitive attrs")?;
            let m = r.read_count("primitive attrs", 16)?;
            let mut attrs = Vec::with_capacity(m);
            for _ in 0..m {
                attrs.push((r.read_str("attr key")?.to_owned(), r.read_str("attr value")?.to_owned()));
            }
            primitive_attrs.push((index, attrs));
        }

        // Code.
        let at = r.offset();
        let n = r.read_count("functions", 24)?;
        if n != globals.len() {
            return Err(invalid(at, "functions", format!("{n} functions for {} globals", globals.len())));
        }
        let mut slots: Vec<Option<VmFunction>> = vec![None; n];
        let counts = Counts {
            functions: n,
            primitives: primitives.len(),
            constants: constants.len(),
            devices: if format == FormatVersion::V08 { None } else { Some(virtual_devices.len()) },
        };
        for _ in 0..n {
            let at = r.offset();
            let info = r.read_vec_str("function info")?;
            let [name, regs, count] = <[String; 3]>::try_from(info)
                .map_err(|v| invalid(at, "function info", format!("{} entries, expected 3", v.len())))?;
            let register_file_size = regs
                .parse::<u64>()
                .ok()
                .filter(|&v| v <= MAX_REGISTERS)
                .ok_or_else(|| invalid(at, "register file size", format!("`{name}`: {regs:?}")))?
                as u32;
            let count: u64 = count
                .parse()
                .ok()
                .filter(|&c: &u64| c.checked_mul(24).is_some_and(|b| b <= r.remaining() as u64))
                .ok_or_else(|| invalid(at, "instruction count", format!("`{name}`: {count:?}")))?;
            let params = r.read_vec_str("params")?;
            let param_device_indexes = read_vec_i64(&mut r, "param device indexes")?;
            if params.len() as u64 > u64::from(register_file_size) {
                return Err(invalid(
                    at,
                    "register file size",
                    format!("`{name}` has {} params and {register_file_size} registers", params.len()),
                ));
            }
            // Each instruction writes at most one new register (TVM numbers them in order): a
            // larger file is a forged count, refused before any call allocates it.
            if u64::from(register_file_size) > params.len() as u64 + count + 1 {
                return Err(invalid(
                    at,
                    "register file size",
                    format!(
                        "`{name}` has {} params, {count} instructions and {register_file_size} registers",
                        params.len()
                    ),
                ));
            }
            let mut instructions = Vec::with_capacity(count as usize);
            for _ in 0..count {
                instructions.push(read_instruction(&mut r, &name, register_file_size, &counts)?);
            }
            check_jumps(&instructions, &name, at)?;
            let index = globals
                .iter()
                .position(|g| *g == name)
                .ok_or_else(|| invalid(globals_at, "globals", format!("function `{name}` is not among the globals")))?;
            if slots[index].is_some() {
                return Err(invalid(at, "functions", format!("`{name}` appears twice")));
            }
            slots[index] = Some(VmFunction { name, register_file_size, params, param_device_indexes, instructions });
        }
        r.finish("the code section")?;
        // n functions each filled a distinct slot of n.
        let functions = slots.into_iter().flatten().collect();
        Ok(RelayVmExecutable {
            version,
            format,
            virtual_devices,
            host_device_index,
            constants,
            const_device_indexes,
            primitives,
            primitive_attrs,
            functions,
            payload: Bytes::from_vec(Vec::new()),
        })
    }

    /// The index of the VM function `name`.
    pub fn function_index(&self, name: &str) -> Option<usize> {
        self.functions.iter().position(|f| f.name == name)
    }

    /// The payload bytes the executable was read from.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Statistics in the form of TVM's `Executable::Stats`.
    pub fn stats(&self) -> String {
        let shapes: Vec<String> = self
            .constants
            .iter()
            .map(|c| match c {
                VmConstant::Immediate(t) if t.shape.is_empty() => "scalar".to_owned(),
                VmConstant::Immediate(t) => {
                    format!("[{}]", t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
                }
                VmConstant::LateBound(name) => format!("late-bound {name}"),
            })
            .collect();
        let globals: Vec<String> =
            self.functions.iter().enumerate().map(|(i, f)| format!("(\"{}\", {i})", f.name)).collect();
        format!(
            "Relay VM executable statistics:\n  Constant shapes (# {}): [{}]\n  Globals (#{}): [{}]\n  Primitive ops (#{}): [{}]\n",
            self.constants.len(),
            shapes.join(", "),
            self.functions.len(),
            globals.join(", "),
            self.primitives.len(),
            self.primitives.join(", ")
        )
    }
}

/// What indices of an instruction must stay below.
struct Counts {
    functions: usize,
    primitives: usize,
    constants: usize,
    /// `None` for 0.8 (device fields are device types, not indexes).
    devices: Option<usize>,
}

fn read_instruction(
    r: &mut Reader<'_>,
    name: &str,
    registers: u32,
    counts: &Counts,
) -> Result<Instruction, FormatError> {
    let at = r.offset();
    let words = read_vec_i64(r, "instruction")?;
    let bad = |detail: String| invalid(at, "instruction", format!("`{name}`: {detail}"));
    if words.len() < 2 {
        return Err(bad(format!("{} words, at least 2 (hash, opcode) needed", words.len())));
    }
    let (hash, opcode, f) = (words[0], words[1], &words[2..]);
    let computed = f.iter().fold(opcode as u64, |k, &v| hash_combine(k, v));
    if computed != hash as u64 {
        return Err(invalid(at, "instruction hash", format!("`{name}`: mismatch for opcode {opcode}")));
    }
    let want = |n: usize| -> Result<(), FormatError> {
        if f.len() == n {
            Ok(())
        } else {
            Err(bad(format!("opcode {opcode} has {} fields, expected {n}", f.len())))
        }
    };
    let reg = |v: i64| -> Result<RegName, FormatError> {
        u32::try_from(v)
            .ok()
            .filter(|&i| i < registers)
            .ok_or_else(|| bad(format!("register {v} is outside its {registers} registers")))
    };
    let index = |v: i64, n: usize, what: &str| -> Result<u32, FormatError> {
        u32::try_from(v)
            .ok()
            .filter(|&i| (i as usize) < n)
            .ok_or_else(|| bad(format!("{what} {v} is out of range (there are {n})")))
    };
    let device = |v: i64| -> Result<i64, FormatError> {
        match counts.devices {
            Some(n) if !(0..n as i64).contains(&v) => Err(bad(format!("device index {v} is not a virtual device"))),
            _ => Ok(v),
        }
    };
    let dtype = |c: i64, b: i64, l: i64| -> Result<DataType, FormatError> {
        match (u8::try_from(c), u8::try_from(b), u16::try_from(l)) {
            (Ok(code), Ok(bits), Ok(lanes)) if bits > 0 && lanes > 0 => Ok(DataType { code, bits, lanes }),
            _ => Err(bad(format!("data type ({c}, {b}, {l}) is not valid"))),
        }
    };
    // A count field followed by that many words.
    let counted = |count_at: usize, rest_at: usize| -> Result<&[i64], FormatError> {
        let n = usize::try_from(f[count_at]).ok().filter(|&n| rest_at.checked_add(n) == Some(f.len()));
        n.map(|_| &f[rest_at..])
            .ok_or_else(|| bad(format!("opcode {opcode}: count {} does not match its {} fields", f[count_at], f.len())))
    };
    let regs = |v: &[i64]| v.iter().map(|&x| reg(x)).collect::<Result<Vec<_>, _>>();
    let shape = |v: &[i64]| -> Result<Vec<i64>, FormatError> {
        if v.iter().any(|&d| d < 0) {
            return Err(bad(format!("shape {v:?} has a negative extent")));
        }
        Ok(v.to_vec())
    };
    Ok(match opcode {
        0 => {
            want(2)?;
            Instruction::Move { from: reg(f[0])?, dst: reg(f[1])? }
        }
        1 => {
            want(1)?;
            Instruction::Ret { result: reg(f[0])? }
        }
        2 | 3 if f.len() < 3 => return Err(bad(format!("opcode {opcode} has {} fields", f.len()))),
        2 => Instruction::Invoke {
            func: index(f[0], counts.functions, "function")?,
            args: regs(counted(1, 3)?)?,
            dst: reg(f[2])?,
        },
        3 => Instruction::InvokeClosure { closure: reg(f[0])?, args: regs(counted(1, 3)?)?, dst: reg(f[2])? },
        4 => {
            if f.len() < 3 {
                return Err(bad(format!("opcode 4 has {} fields", f.len())));
            }
            let args = regs(counted(1, 3)?)?;
            let output_size = u32::try_from(f[2])
                .ok()
                .filter(|&o| o as usize <= args.len())
                .ok_or_else(|| bad(format!("output size {} of {} arguments", f[2], args.len())))?;
            Instruction::InvokePacked { packed_index: index(f[0], counts.primitives, "primitive")?, output_size, args }
        }
        5 => {
            if f.len() < 7 {
                return Err(bad(format!("opcode 5 has {} fields", f.len())));
            }
            Instruction::AllocTensor {
                storage: reg(f[0])?,
                offset: reg(f[1])?,
                dtype: dtype(f[2], f[3], f[4])?,
                shape: shape(counted(5, 7)?)?,
                dst: reg(f[6])?,
            }
        }
        6 => {
            want(7)?;
            Instruction::AllocTensorReg {
                storage: reg(f[0])?,
                offset: reg(f[1])?,
                shape_register: reg(f[2])?,
                dtype: dtype(f[3], f[4], f[5])?,
                dst: reg(f[6])?,
            }
        }
        7 | 8 if f.len() < 3 => return Err(bad(format!("opcode {opcode} has {} fields", f.len()))),
        7 => Instruction::AllocAdt { tag: f[0], fields: regs(counted(1, 3)?)?, dst: reg(f[2])? },
        8 => Instruction::AllocClosure {
            func: index(f[0], counts.functions, "function")?,
            free_vars: regs(counted(1, 3)?)?,
            dst: reg(f[2])?,
        },
        9 => {
            want(3)?;
            let field_index = u32::try_from(f[1]).map_err(|_| bad(format!("field index {} is negative", f[1])))?;
            Instruction::GetField { object: reg(f[0])?, field_index, dst: reg(f[2])? }
        }
        10 => {
            want(4)?;
            Instruction::If { test: reg(f[0])?, target: reg(f[1])?, true_offset: f[2], false_offset: f[3] }
        }
        11 => match f.len() {
            2 => Instruction::LoadConst {
                const_index: index(f[0], counts.constants, "constant")?,
                device_index: None,
                dst: reg(f[1])?,
            },
            _ => {
                want(3)?;
                let d = device(f[1])?;
                Instruction::LoadConst {
                    const_index: index(f[0], counts.constants, "constant")?,
                    device_index: Some(u32::try_from(d).map_err(|_| bad(format!("device index {d}")))?),
                    dst: reg(f[2])?,
                }
            }
        },
        12 => {
            want(1)?;
            Instruction::Goto { offset: f[0] }
        }
        13 => {
            want(2)?;
            Instruction::GetTag { object: reg(f[0])?, dst: reg(f[1])? }
        }
        14 => {
            want(2)?;
            Instruction::LoadConsti { value: f[0], dst: reg(f[1])? }
        }
        15 => {
            want(0)?;
            Instruction::Fatal
        }
        16 => match f.len() {
            // 0.8 to 0.13: size register, alignment, dtype, device, dst.
            7 => Instruction::AllocStorage {
                allocation_size: Some(reg(f[0])?),
                alignment: f[1],
                dtype_hint: dtype(f[2], f[3], f[4])?,
                device_index: device(f[5])?,
                shape: Vec::new(),
                dst: reg(f[6])?,
            },
            n if n >= 8 => {
                let dims = shape(counted(6, 8)?)?;
                Instruction::AllocStorage {
                    // With a shape, the size field is not set (TVM writes whatever it held).
                    allocation_size: if dims.is_empty() { Some(reg(f[0])?) } else { None },
                    alignment: f[1],
                    dtype_hint: dtype(f[2], f[3], f[4])?,
                    device_index: device(f[5])?,
                    shape: dims,
                    dst: reg(f[7])?,
                }
            }
            n => return Err(bad(format!("opcode 16 has {n} fields"))),
        },
        17 => {
            want(2)?;
            Instruction::ShapeOf { tensor: reg(f[0])?, dst: reg(f[1])? }
        }
        18 => {
            want(3)?;
            Instruction::ReshapeTensor { tensor: reg(f[0])?, newshape: reg(f[1])?, dst: reg(f[2])? }
        }
        19 => {
            want(4)?;
            Instruction::DeviceCopy {
                src: reg(f[0])?,
                src_device_index: device(f[1])?,
                dst_device_index: device(f[2])?,
                dst: reg(f[3])?,
            }
        }
        20 => {
            want(1)?;
            Instruction::KillRegister { dst: reg(f[0])? }
        }
        op => return Err(invalid(at, "opcode", format!("`{name}`: unknown opcode {op}"))),
    })
}

/// Every jump lands inside the function, and none jumps to itself (the VM would spin).
fn check_jumps(code: &[Instruction], name: &str, at: u64) -> Result<(), FormatError> {
    let n = code.len() as i64;
    for (pc, ins) in code.iter().enumerate() {
        let offsets: &[i64] = match ins {
            Instruction::Goto { offset } => &[*offset][..],
            Instruction::If { true_offset, false_offset, .. } => &[*true_offset, *false_offset][..],
            _ => continue,
        };
        for &off in offsets {
            let target = (pc as i64).checked_add(off);
            if off == 0 || !target.is_some_and(|t| (0..n).contains(&t)) {
                return Err(invalid(
                    at,
                    "instruction",
                    format!("`{name}` instruction {pc}: jump by {off} leaves the function or spins"),
                ));
            }
        }
    }
    Ok(())
}

impl crate::payload::Payload for RelayVmExecutable {
    fn type_key(&self) -> &str {
        VM_EXECUTABLE
    }

    /// Writes the payload as it was read (TVM's bytes, unchanged).
    fn write_payload(&self, _layout: crate::format::Layout, out: &mut dyn Write) -> io::Result<()> {
        self.payload.write_to(out)
    }

    fn payload_len(&self, _layout: crate::format::Layout) -> io::Result<u64> {
        Ok(self.payload.len() as u64)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(FormatVersion::of_version("0.19.0"), Some(FormatVersion::V14));
        assert_eq!(FormatVersion::of_version("0.14.dev0"), Some(FormatVersion::V14));
        assert_eq!(FormatVersion::of_version("0.13.0"), Some(FormatVersion::V09));
        assert_eq!(FormatVersion::of_version("0.8.0"), Some(FormatVersion::V08));
        assert_eq!(FormatVersion::of_version("0.10.dev"), Some(FormatVersion::V09));
        assert_eq!(FormatVersion::of_version("x"), None);
        assert_eq!(FormatVersion::of_version("0.19.j"), None);
        assert_eq!(FormatVersion::of_version("0.1a.0"), None);
    }

    #[test]
    fn garbage_is_an_error() {
        for bytes in [&b""[..], &[0xff; 8][..], &[4, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4][..]] {
            assert!(RelayVmExecutable::read_payload(&Bytes::from_vec(bytes.to_vec())).is_err());
        }
    }
}
