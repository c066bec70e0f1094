//! The Relax VM executable: TVM's `relax.Executable` (0.19) and `relax.VMExecutable` (0.20 and
//! later), read and written.
//!
//! ```text
//! payload      := code:str                 # classic layouts (TVM 0.8 to 0.21): the executable as a string
//!               | executable               # tvm-ffi layout (0.22+): the blob's frame is the only length
//! executable   := magic:u64  version:str ("0.14")  functions:vec<function>
//!                 [scopes]                 # only with magic ...151E (TVM 0.23+)
//!                 constants  instr_offset:vec<i64>  instr_data:vec<i64>
//! function     := kind:i32 (0 packed, 1 VM, 2 VM TIR)  name:str  start:i64  end:i64
//!                 num_args:i64  register_file_size:i64  param_names:vec<str>
//! scopes       := n:u64  (constant_index:i64  scope:str){n}
//! constants    := n:u64  (tag:i32  value){n}
//! value        := tensor (TVM's tensor format) | dtype:(u8 u8 u16) | n:u64 i64{n} (shape)
//!               | n:u64 u8{n} (string) | i64 | f64
//! ```
//!
//! The tag numbering depends on the version: [`super::v019`] (TVM's own `ConstantType`)
//! and [`super::v021`] (tvm-ffi type indices). Instructions are words of `instr_data`
//! starting at `instr_offset[i]`:
//!
//! ```text
//! Call := 1  dst  func_index  num_args  arg{num_args}
//! Ret  := 2  result_register
//! Goto := 3  pc_offset
//! If   := 4  cond_register  false_offset
//! arg  := kind:u8 (top byte: 0 register, 1 immediate, 2 constant index, 3 function index)
//!         value:i56 (sign-extended)
//! ```
//!
//! Registers from `1 << 54` on are special: `%void` (`1 << 54`) and `%vm` (`(1 << 54) + 1`).
//!
//! Reading checks everything the interpreter relies on (indices of functions, constants and
//! registers, jump targets, instruction bounds), so a program that parses cannot make the VM
//! index out of range. Every failure is a [`FormatError`] with the byte offset from the first
//! byte of the payload.

use std::io::{self, Write};

use super::const_kind::ConstKind;
use super::{v019, v021};
use crate::bytes::Bytes;
use crate::error::{FormatError, FormatErrorKind};
use crate::format::stream::{self, DataType, Reader};
use crate::format::Layout;
use crate::payload::graph::Tensor;

/// Type key of the executable in TVM 0.19 (and earlier Relax releases).
pub const RELAX_EXECUTABLE: &str = "relax.Executable";
/// Type key of the executable in TVM 0.20 and later.
pub const RELAX_VM_EXECUTABLE: &str = "relax.VMExecutable";

/// Magic of TVM 0.19 to 0.22 executables.
pub const MAGIC_V1: u64 = 0xD225_DE2F_4214_151D;
/// Magic of TVM 0.23 and later executables (adds the memory-scope section).
pub const MAGIC_V2: u64 = 0xD225_DE2F_4214_151E;
/// The VM version string TVM writes since 2023-07-06 (`RELAX_VM_VERSION`, apache/tvm#15254).
pub const VM_VERSION: &str = "0.14";

/// The VM version strings of the Unity builds before `RELAX_VM_VERSION` (2023-04 to 2023-07-06):
/// the executable wrote the build's `TVM_VERSION` (`0.12.dev0` until 2023-05, then `0.13.dev0`).
/// Everything after the version string is the same bytes as `0.14`'s: the function table
/// (kind, name, start, end, num_args, register_file_size, param_names), the constant tags 0-4
/// (tensor, dtype, shape, string, int) and the code section (checked against
/// `src/runtime/relax_vm/executable.cc` and `bytecode.h` of apache/tvm 153f70aa60, 2023-06-01).
pub const VM_VERSIONS_BEFORE_0_14: &[&str] = &["0.12.dev0", "0.13.dev0"];

/// First special register.
pub(crate) const BEGIN_SPECIAL_REG: i64 = 1 << 54;
/// `%void`: reads as null, writes are dropped.
pub(crate) const VOID_REGISTER: i64 = BEGIN_SPECIAL_REG;
/// `%vm`: the VM itself (first argument of `vm.builtin.alloc_storage`).
pub(crate) const VM_REGISTER: i64 = BEGIN_SPECIAL_REG + 1;

/// The kind of constant `tag` stands for in an executable of the TVM generation `layout`
/// (the numbering follows the TVM version, and so the blob layout the executable was found in):
/// TVM 0.19 and 0.20 use TVM's own `ConstantType` tags, 0.21 tvm-ffi type indices as
/// numbered in TVM's tree, 0.22 and later the tvm-ffi package's type indices.
fn const_kind(layout: Layout, tag: i32) -> Option<ConstKind> {
    match layout {
        Layout::Classic => v019::kind(tag),
        Layout::Classic021 => v021::kind(v021::Numbering::InTree, tag),
        Layout::Ffi => v021::kind(v021::Numbering::Package, tag),
    }
}

/// The tag of a constant of `kind` in an executable of the TVM generation `layout`.
fn const_tag(layout: Layout, kind: ConstKind) -> i32 {
    match layout {
        Layout::Classic => v019::tag(kind),
        Layout::Classic021 => v021::tag(v021::Numbering::InTree, kind),
        Layout::Ffi => v021::tag(v021::Numbering::Package, kind),
    }
}

/// The magic the TVM of `layout` writes.
fn default_magic(layout: Layout) -> u64 {
    match layout {
        Layout::Ffi => MAGIC_V2,
        _ => MAGIC_V1,
    }
}

/// What kind of function an entry of the function table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FuncKind {
    /// A function looked up by name: a kernel of the library or a runtime builtin.
    Packed,
    /// A VM function: bytecode in the code section.
    Vm,
    /// A VM function compiled to TIR (`__vmtir__<name>` in the library).
    VmTir,
}

impl FuncKind {
    fn from_i32(v: i32) -> Option<FuncKind> {
        Some(match v {
            0 => FuncKind::Packed,
            1 => FuncKind::Vm,
            2 => FuncKind::VmTir,
            _ => return None,
        })
    }

    fn to_i32(self) -> i32 {
        match self {
            FuncKind::Packed => 0,
            FuncKind::Vm => 1,
            FuncKind::VmTir => 2,
        }
    }
}

/// One entry of the function table (`VMFuncInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncInfo {
    /// The kind.
    pub kind: FuncKind,
    /// The name (`main`, `vm.builtin.alloc_tensor`, a kernel's name, ...).
    pub name: String,
    /// First instruction (VM functions).
    pub start: i64,
    /// One past the last instruction (VM functions).
    pub end: i64,
    /// Number of arguments (`-2` for packed functions, whose arity is not known).
    pub num_args: i64,
    /// Registers a call of the function needs (VM functions).
    pub register_file_size: i64,
    /// Parameter names, in order.
    pub param_names: Vec<String>,
}

/// A value of the constant pool. Floats compare by their bits (a NaN equals itself), so that
/// an executable read back equals what was written.
#[derive(Debug, Clone)]
pub enum Constant {
    /// A tensor (the model's weights), its data borrowed from the payload.
    Tensor(Box<Tensor>),
    /// A data type.
    DataType(DataType),
    /// A shape tuple.
    Shape(Vec<i64>),
    /// A string (error contexts, memory scopes), as raw bytes: TVM does not require UTF-8.
    Str(Vec<u8>),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl PartialEq for Constant {
    fn eq(&self, other: &Constant) -> bool {
        match (self, other) {
            (Constant::Tensor(a), Constant::Tensor(b)) => a == b,
            (Constant::DataType(a), Constant::DataType(b)) => a == b,
            (Constant::Shape(a), Constant::Shape(b)) => a == b,
            (Constant::Str(a), Constant::Str(b)) => a == b,
            (Constant::Int(a), Constant::Int(b)) => a == b,
            (Constant::Float(a), Constant::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Constant {
    fn kind(&self) -> ConstKind {
        match self {
            Constant::Tensor(_) => ConstKind::Tensor,
            Constant::DataType(_) => ConstKind::DataType,
            Constant::Shape(_) => ConstKind::Shape,
            Constant::Str(_) => ConstKind::Str,
            Constant::Int(_) => ConstKind::Int,
            Constant::Float(_) => ConstKind::Float,
        }
    }
}

/// A register operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reg {
    /// An ordinary register of the current frame.
    Index(u32),
    /// `%void`.
    Void,
    /// `%vm`.
    Vm,
}

impl std::fmt::Display for Reg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reg::Index(i) => write!(f, "%{i}"),
            Reg::Void => f.write_str("%void"),
            Reg::Vm => f.write_str("%vm"),
        }
    }
}

/// An argument of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arg {
    /// A register.
    Reg(Reg),
    /// An immediate integer.
    Imm(i64),
    /// An index into the constant pool.
    Const(u32),
    /// An index into the function table (a function passed as a value).
    Func(u32),
}

/// One decoded instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    /// Calls function `func` of the table with `args`, the result into `dst`.
    Call {
        /// Destination register (`%void` to drop the result).
        dst: Reg,
        /// Index into the function table.
        func: u32,
        /// The arguments.
        args: Vec<Arg>,
    },
    /// Returns the value of `result`.
    Ret {
        /// The register returned.
        result: Reg,
    },
    /// Jumps by `offset` instructions.
    Goto {
        /// Relative target.
        offset: i64,
    },
    /// Continues with the next instruction if `cond` is non-zero, else jumps by `false_offset`.
    If {
        /// The condition register.
        cond: Reg,
        /// Relative target of the false branch.
        false_offset: i64,
    },
}

/// The most parameters a VM function may have: a larger count is a forged one (each
/// becomes a register and a parameter slot when the function is called or listed; TVM's
/// builder writes as many as the function has names for).
pub const MAX_VM_ARGS: i64 = 1 << 16;

/// A parsed Relax VM executable.
#[derive(Debug, Clone, PartialEq)]
pub struct RelaxExecutable {
    /// The type key it was loaded under (`relax.Executable` or `relax.VMExecutable`).
    pub type_key: String,
    /// The TVM generation whose form and constant-tag numbering it was read in.
    pub layout: Layout,
    /// The magic it was read with ([`MAGIC_V1`] or [`MAGIC_V2`]).
    pub magic: u64,
    /// The VM version string it was read with ([`VM_VERSION`], or one of
    /// [`VM_VERSIONS_BEFORE_0_14`]); written back unchanged.
    pub version: String,
    /// The function table.
    pub functions: Vec<FuncInfo>,
    /// `(constant index, memory scope)` pairs (only executables with [`MAGIC_V2`]).
    pub memory_scopes: Vec<(i64, String)>,
    /// The constant pool.
    pub constants: Vec<Constant>,
    /// The decoded instructions, in instruction-index order.
    pub instructions: Vec<Instruction>,
    instr_offset: Vec<i64>,
    instr_data: Vec<i64>,
}

fn invalid(at: u64, what: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::new(at, FormatErrorKind::Invalid { what, detail: detail.into() })
}

/// The sign-extended 56-bit value of an argument word.
fn arg_value(word: i64) -> i64 {
    (word << 8) >> 8
}

fn reg_of(value: i64) -> Option<Reg> {
    match value {
        VOID_REGISTER => Some(Reg::Void),
        VM_REGISTER => Some(Reg::Vm),
        v => u32::try_from(v).ok().map(Reg::Index),
    }
}

fn reg_value(r: Reg) -> i64 {
    match r {
        Reg::Index(i) => i64::from(i),
        Reg::Void => VOID_REGISTER,
        Reg::Vm => VM_REGISTER,
    }
}

impl RelaxExecutable {
    /// Reads a payload as it sits in a blob of `layout` (for the classic layouts, the
    /// executable wrapped in a string; for tvm-ffi, the executable itself), under `type_key`.
    /// The payload must be read whole. Tensor data stays borrowed from `payload`.
    ///
    /// The form and constant tags of `layout`'s TVM version are tried first. A payload that
    /// does not read that way (the bytes of another version, copied verbatim into this
    /// layout by a tool) is read in the other forms and generations, and [`RelaxExecutable::layout`]
    /// says which one fitted; when none does, the error is the one of `layout`'s own form.
    pub fn read_payload(payload: &Bytes, layout: Layout, type_key: &str) -> Result<RelaxExecutable, FormatError> {
        let _span = tracing::debug_span!("relax_executable", layout = layout.name(), bytes = payload.len()).entered();
        let own = layout;
        let wrapped = !layout.frames_payloads();
        let first = RelaxExecutable::read_form(payload, wrapped, own, type_key);
        if first.is_ok() {
            return first;
        }
        let generations = Layout::ALL;
        for (w, d) in [wrapped, !wrapped].into_iter().flat_map(|w| generations.into_iter().map(move |d| (w, d))) {
            if (w, d) == (wrapped, own) {
                continue;
            }
            if let Ok(exec) = RelaxExecutable::read_form(payload, w, d, type_key) {
                tracing::debug!(generation = ?d, wrapped = w, "relax executable read in another version's form");
                return Ok(exec);
            }
        }
        first
    }

    fn read_form(
        payload: &Bytes,
        wrapped: bool,
        generation: Layout,
        type_key: &str,
    ) -> Result<RelaxExecutable, FormatError> {
        if !wrapped {
            return RelaxExecutable::read(payload, 0, generation, type_key);
        }
        let mut r = Reader::new(payload, 0);
        let code = r.read_str_bytes("executable")?;
        r.finish("the executable string")?;
        let code = payload.slice(8..8 + code.len()).unwrap_or_else(|| Bytes::from_vec(code.to_vec()));
        RelaxExecutable::read(&code, 8, generation, type_key)
    }

    /// How many bytes a classic-layout payload at the start of `bytes` takes: the length of
    /// its string wrapper plus 8.
    pub fn measure_classic(bytes: &[u8], base: u64) -> Result<u64, FormatError> {
        let mut r = Reader::new(bytes, base);
        let code = r.read_str_bytes("executable")?;
        Ok(8 + code.len() as u64)
    }

    /// Reads the executable itself (from its magic on), whose first byte lies at `base` in the
    /// payload, in `generation`. Tensor data stays borrowed from `src`.
    pub fn read(src: &Bytes, base: u64, generation: Layout, type_key: &str) -> Result<RelaxExecutable, FormatError> {
        let mut r = Reader::new(src, base);
        let at = r.offset();
        let magic = r.read_u64("magic")?;
        if magic != MAGIC_V1 && magic != MAGIC_V2 {
            return Err(FormatError::new(
                at,
                FormatErrorKind::BadMagic { what: "relax executable", expected: MAGIC_V1, found: magic },
            ));
        }
        let at = r.offset();
        let version = r.read_str_bytes("VM version")?;
        let known = std::iter::once(&VM_VERSION).chain(VM_VERSIONS_BEFORE_0_14).find(|v| v.as_bytes() == version);
        let Some(version) = known else {
            return Err(invalid(
                at,
                "VM version",
                format!(
                    "{:?}, but TVM writes only {VM_VERSION:?} (and {} before 2023-07)",
                    String::from_utf8_lossy(version),
                    VM_VERSIONS_BEFORE_0_14.join(", ")
                ),
            ));
        };
        let version = (*version).to_owned();
        let functions = read_functions(&mut r)?;
        let memory_scopes = if magic == MAGIC_V2 { read_scopes(&mut r)? } else { Vec::new() };
        let constants = read_constants(&mut r, src, generation)?;
        let offsets_at = r.offset();
        let instr_offset = read_vec_i64(&mut r, "instr_offset")?;
        let data_at = r.offset() + 8;
        let instr_data = read_vec_i64(&mut r, "instr_data")?;
        r.finish("the code section")?;
        let instructions = decode(&instr_offset, &instr_data, offsets_at + 8, data_at, &functions, constants.len())?;
        let exec = RelaxExecutable {
            type_key: type_key.to_owned(),
            layout: generation,
            magic,
            version,
            functions,
            memory_scopes,
            constants,
            instructions,
            instr_offset,
            instr_data,
        };
        exec.check_functions(offsets_at)?;
        Ok(exec)
    }

    /// An executable from its parts (for tools and tests that build programs): the
    /// instructions are encoded as TVM lays them out, and the result is checked as a read
    /// executable is (indices, registers, jumps), in `generation` with its default magic.
    pub fn from_parts(
        type_key: &str,
        generation: Layout,
        functions: Vec<FuncInfo>,
        constants: Vec<Constant>,
        instructions: Vec<Instruction>,
    ) -> Result<RelaxExecutable, FormatError> {
        let mut instr_offset = Vec::with_capacity(instructions.len());
        let mut instr_data = Vec::new();
        for ins in &instructions {
            instr_offset.push(instr_data.len() as i64);
            match ins {
                Instruction::Call { dst, func, args } => {
                    instr_data.extend([1, reg_value(*dst), i64::from(*func), args.len() as i64]);
                    instr_data.extend(args.iter().map(|a| encode_arg(*a)));
                }
                Instruction::Ret { result } => instr_data.extend([2, reg_value(*result)]),
                Instruction::Goto { offset } => instr_data.extend([3, *offset]),
                Instruction::If { cond, false_offset } => instr_data.extend([4, reg_value(*cond), *false_offset]),
            }
        }
        let exec = RelaxExecutable {
            type_key: type_key.to_owned(),
            layout: generation,
            magic: default_magic(generation),
            version: VM_VERSION.to_owned(),
            functions,
            memory_scopes: Vec::new(),
            constants,
            instructions,
            instr_offset,
            instr_data,
        };
        let mut bytes = Vec::new();
        exec.write_executable(generation, &mut bytes)
            .map_err(|e| invalid(0, "executable", format!("cannot be encoded: {e}")))?;
        RelaxExecutable::read(&Bytes::from_vec(bytes), 0, generation, type_key)
    }

    /// The index of the function named `name`.
    pub fn function_index(&self, name: &str) -> Option<usize> {
        self.functions.iter().position(|f| f.name == name)
    }

    /// The VM functions (what a caller can invoke), in table order.
    pub fn vm_functions(&self) -> impl Iterator<Item = &FuncInfo> {
        self.functions.iter().filter(|f| f.kind != FuncKind::Packed)
    }

    /// Checks each VM function's instruction range, registers and jump targets.
    fn check_functions(&self, at: u64) -> Result<(), FormatError> {
        let count = self.instructions.len() as i64;
        let words = self.instr_data.len() as i64;
        for f in &self.functions {
            if f.kind != FuncKind::Vm {
                continue;
            }
            let name = &f.name;
            if !(0 <= f.start && f.start <= f.end && f.end <= count) {
                return Err(invalid(
                    at,
                    "function range",
                    format!("`{name}` spans instructions {}..{}, but there are {count}", f.start, f.end),
                ));
            }
            if f.start == f.end {
                return Err(invalid(at, "function range", format!("`{name}` has no instructions")));
            }
            // Every register is written by an argument or an instruction: a larger file is a
            // forged count, refused before any call allocates it.
            if !(0..=MAX_VM_ARGS).contains(&f.num_args)
                || f.register_file_size < f.num_args
                || f.register_file_size > f.num_args + words + 1
            {
                return Err(invalid(
                    at,
                    "register_file_size",
                    format!("`{name}` has {} arguments and {} registers", f.num_args, f.register_file_size),
                ));
            }
            let in_file = |r: &Reg| match r {
                Reg::Index(i) => i64::from(*i) < f.register_file_size,
                _ => true,
            };
            for pc in f.start..f.end {
                let ins = &self.instructions[pc as usize];
                let word_at = self.instr_offset[pc as usize];
                let bad = |detail: String| {
                    invalid(at, "instruction", format!("`{name}` instruction {pc} (word {word_at}): {detail}"))
                };
                let (regs, target): (Vec<Reg>, Option<i64>) = match ins {
                    Instruction::Call { dst, args, .. } => (
                        std::iter::once(*dst)
                            .chain(args.iter().filter_map(|a| match a {
                                Arg::Reg(r) => Some(*r),
                                _ => None,
                            }))
                            .collect(),
                        None,
                    ),
                    Instruction::Ret { result } => (vec![*result], None),
                    Instruction::Goto { offset: 0 } => {
                        // TVM never writes it: the VM would spin on it forever.
                        return Err(bad("a jump to itself".to_owned()));
                    }
                    Instruction::Goto { offset } => (vec![], Some(*offset)),
                    Instruction::If { cond, false_offset } => {
                        if *false_offset <= 1 {
                            return Err(bad(format!("false offset {false_offset} must be greater than 1")));
                        }
                        (vec![*cond], Some(*false_offset))
                    }
                };
                if let Some(r) = regs.iter().find(|r| !in_file(r)) {
                    return Err(bad(format!("register {r} is outside its {} registers", f.register_file_size)));
                }
                if let Some(off) = target {
                    let t = pc.checked_add(off);
                    if !t.is_some_and(|t| f.start <= t && t < f.end) {
                        return Err(bad(format!("jump by {off} leaves the function")));
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the executable itself (from the magic on) in `generation`. The magic is the one read
    /// when the generation is unchanged, else the one its TVM writes.
    pub fn write_executable(&self, generation: Layout, out: &mut dyn Write) -> io::Result<()> {
        let magic = if generation == self.layout { self.magic } else { default_magic(generation) };
        if magic != MAGIC_V2 && !self.memory_scopes.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "memory scopes cannot be written in an executable of TVM 0.22 or earlier",
            ));
        }
        stream::write_u64(out, magic)?;
        let version = if generation == self.layout { self.version.as_str() } else { VM_VERSION };
        stream::write_str(out, version)?;
        stream::write_u64(out, self.functions.len() as u64)?;
        for f in &self.functions {
            out.write_all(&f.kind.to_i32().to_le_bytes())?;
            stream::write_str(out, &f.name)?;
            for v in [f.start, f.end, f.num_args, f.register_file_size] {
                out.write_all(&v.to_le_bytes())?;
            }
            stream::write_vec_str(out, &f.param_names)?;
        }
        if magic == MAGIC_V2 {
            stream::write_u64(out, self.memory_scopes.len() as u64)?;
            for (index, scope) in &self.memory_scopes {
                out.write_all(&index.to_le_bytes())?;
                stream::write_str(out, scope)?;
            }
        }
        stream::write_u64(out, self.constants.len() as u64)?;
        for c in &self.constants {
            out.write_all(&const_tag(generation, c.kind()).to_le_bytes())?;
            match c {
                Constant::Tensor(t) => t.write_to(out)?,
                Constant::DataType(t) => stream::write_dtype(out, *t)?,
                Constant::Shape(s) => write_vec_i64(out, s)?,
                Constant::Str(s) => stream::write_str(out, s)?,
                Constant::Int(v) => out.write_all(&v.to_le_bytes())?,
                Constant::Float(v) => out.write_all(&v.to_le_bytes())?,
            }
        }
        write_vec_i64(out, &self.instr_offset)?;
        write_vec_i64(out, &self.instr_data)
    }

    /// The instruction words (`instr_data`), as TVM stores them.
    pub fn instr_data(&self) -> &[i64] {
        &self.instr_data
    }

    /// Where each instruction starts in [`RelaxExecutable::instr_data`].
    pub fn instr_offsets(&self) -> &[i64] {
        &self.instr_offset
    }

    /// The statistics, in the form of TVM's `stats()`: the constant pool (tensors by shape) and
    /// the function names.
    pub fn stats(&self) -> String {
        let mut pool = String::new();
        for c in &self.constants {
            let join = |v: &[i64]| v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
            match c {
                Constant::Tensor(t) if t.shape.is_empty() => pool.push_str("scalar, "),
                Constant::Tensor(t) => pool.push_str(&format!("[{}], ", join(&t.shape))),
                // TVM backs up over the last ", " even when there is none.
                Constant::Shape(s) if s.is_empty() => pool.push_str("shapetupl], "),
                Constant::Shape(s) => pool.push_str(&format!("shapetuple[{}], ", join(s))),
                Constant::Str(s) => pool.push_str(&format!("\"{}\", ", String::from_utf8_lossy(s))),
                Constant::Int(v) => pool.push_str(&format!("{v}, ")),
                Constant::Float(v) => pool.push_str(&format!("{v}, ")),
                Constant::DataType(t) => pool.push_str(&format!("{}, ", dtype_name(*t))),
            }
        }
        let pool = pool.strip_suffix(", ").unwrap_or(&pool);
        let names: Vec<&str> = self.functions.iter().map(|f| f.name.as_str()).collect();
        format!(
            "Relax VM executable statistics:\n  Constant pool (# {}): [{pool}]\n  Globals (#{}): [{}]\n",
            self.constants.len(),
            self.functions.len(),
            names.join(", ")
        )
    }

    /// The program as text, in the form of TVM's `as_text()`.
    pub fn as_text(&self) -> String {
        use std::fmt::Write as _;
        let fname = |i: u32| {
            self.functions.get(i as usize).map(|f| f.name.clone()).unwrap_or_else(|| format!("unknown_func_index({i})"))
        };
        let arg = |a: &Arg| match a {
            Arg::Reg(r) => r.to_string(),
            Arg::Imm(v) => format!("i{v}"),
            Arg::Const(c) => format!("c[{c}]"),
            Arg::Func(f) => format!("f[{}]", fname(*f)),
        };
        let mut s = String::new();
        for f in &self.functions {
            match f.kind {
                FuncKind::Packed => {
                    let _ = write!(s, "@{} packed_func;\n\n", f.name);
                }
                FuncKind::VmTir => {
                    let _ = write!(s, "@{} num_inputs={} vm_tir_func;\n\n", f.name, f.num_args);
                }
                FuncKind::Vm => {
                    let _ = writeln!(s, "@{}:", f.name);
                    for ins in &self.instructions[f.start as usize..f.end as usize] {
                        let _ = match ins {
                            Instruction::Call { dst, func, args } => {
                                let args: Vec<String> = args.iter().map(arg).collect();
                                writeln!(
                                    s,
                                    "  {:<6}{:<16} in: {:<12} dst: {dst}",
                                    "call",
                                    fname(*func),
                                    args.join(", ")
                                )
                            }
                            Instruction::Ret { result } => writeln!(s, "  {:<6}{result}", "ret "),
                            Instruction::Goto { offset } => writeln!(s, "  {:<6}{offset}", "goto"),
                            Instruction::If { cond, false_offset } => {
                                writeln!(s, "  {:<6}{cond}, {false_offset}", "If")
                            }
                        };
                    }
                    s.push('\n');
                }
            }
        }
        s
    }
}

/// A data type as TVM spells it, with tvm-ffi's `bool` (DLPack's `kDLBool`, code 6, 8 bits).
pub fn dtype_name(t: DataType) -> String {
    if t == DataType::FFI_BOOL {
        return "bool".to_owned();
    }
    t.to_string()
}

fn read_vec_i64(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<i64>, FormatError> {
    let n = r.read_count(what, 8)?;
    (0..n).map(|_| r.read_i64(what)).collect()
}

fn write_vec_i64(out: &mut dyn Write, v: &[i64]) -> io::Result<()> {
    stream::write_u64(out, v.len() as u64)?;
    v.iter().try_for_each(|x| out.write_all(&x.to_le_bytes()))
}

fn read_functions(r: &mut Reader<'_>) -> Result<Vec<FuncInfo>, FormatError> {
    // kind, name length, four i64 and the parameter count: 52 bytes at least.
    let n = r.read_count("function table", 52)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let at = r.offset();
        let kind = r.read_i32("function kind")?;
        let kind = FuncKind::from_i32(kind)
            .ok_or_else(|| invalid(at, "function kind", format!("{kind} is not 0 (packed), 1 (VM) or 2 (VM TIR)")))?;
        let name = r.read_str("function name")?.to_owned();
        let start = r.read_i64("start_instr")?;
        let end = r.read_i64("end_instr")?;
        let num_args = r.read_i64("num_args")?;
        let register_file_size = r.read_i64("register_file_size")?;
        let param_names = r.read_vec_str("param_names")?;
        out.push(FuncInfo { kind, name, start, end, num_args, register_file_size, param_names });
    }
    Ok(out)
}

fn read_scopes(r: &mut Reader<'_>) -> Result<Vec<(i64, String)>, FormatError> {
    let n = r.read_count("memory scopes", 16)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let index = r.read_i64("memory scope constant index")?;
        out.push((index, r.read_str("memory scope")?.to_owned()));
    }
    Ok(out)
}

fn read_constants(r: &mut Reader<'_>, src: &Bytes, generation: Layout) -> Result<Vec<Constant>, FormatError> {
    // A tag and the smallest value (a dtype): 8 bytes each at least.
    let n = r.read_count("constant pool", 8)?;
    let mut out = Vec::with_capacity(n);
    for index in 0..n {
        let at = r.offset();
        let tag = r.read_i32("constant tag")?;
        let kind = const_kind(generation, tag).ok_or_else(|| {
            invalid(
                at,
                "constant tag",
                format!("constant {index} has tag {tag}, which the TVM of layout {generation} does not write"),
            )
        })?;
        let c = match kind {
            ConstKind::Tensor => Constant::Tensor(Box::new(Tensor::read(r, src)?)),
            ConstKind::DataType => Constant::DataType(r.read_dtype("dtype constant")?),
            ConstKind::Shape => Constant::Shape(read_vec_i64(r, "shape constant")?),
            ConstKind::Str => Constant::Str(r.read_str_bytes("string constant")?.to_vec()),
            ConstKind::Int => Constant::Int(r.read_i64("int constant")?),
            ConstKind::Float => Constant::Float(f64::from_bits(r.read_u64("float constant")?)),
        };
        out.push(c);
    }
    Ok(out)
}

/// Decodes every instruction, checking opcodes, bounds, argument kinds and indices.
fn decode(
    offsets: &[i64],
    data: &[i64],
    offsets_at: u64,
    data_at: u64,
    functions: &[FuncInfo],
    constants: usize,
) -> Result<Vec<Instruction>, FormatError> {
    let word_at = |w: usize| data_at + 8 * w as u64;
    let mut out = Vec::with_capacity(offsets.len());
    // Instructions follow each other: each starts at or after the end of the previous one (as
    // TVM writes them), so the decoded program is never larger than `instr_data`.
    let mut next_free = 0usize;
    for (i, &off) in offsets.iter().enumerate() {
        let Some(start) = usize::try_from(off).ok().filter(|&o| o < data.len() && o >= next_free) else {
            return Err(invalid(
                offsets_at + 8 * i as u64,
                "instr_offset",
                format!(
                    "instruction {i} starts at word {off}, but instr_data has {} words and the previous instruction ends at {next_free}",
                    data.len()
                ),
            ));
        };
        // The words of this instruction after the opcode, or an error if they run past the end.
        let words = |n: usize| {
            data.get(start + 1..start + 1 + n).ok_or_else(|| {
                invalid(word_at(start), "instruction", format!("instruction {i} needs {n} words after its opcode"))
            })
        };
        let reg = |w: usize, v: i64| {
            reg_of(v).ok_or_else(|| invalid(word_at(w), "register", format!("instruction {i}: {v} is not a register")))
        };
        let ins = match data[start] {
            1 => {
                let head = words(3)?;
                let dst = reg(start + 1, head[0])?;
                let func = head[1];
                let func = u32::try_from(func).ok().filter(|&f| (f as usize) < functions.len()).ok_or_else(|| {
                    invalid(
                        word_at(start + 2),
                        "function index",
                        format!("instruction {i} calls function {func}, but there are {}", functions.len()),
                    )
                })?;
                let n = usize::try_from(head[2]).ok().filter(|n| start + 4 + n <= data.len()).ok_or_else(|| {
                    invalid(
                        word_at(start + 3),
                        "num_args",
                        format!("instruction {i}: {} arguments do not fit", head[2]),
                    )
                })?;
                let mut args = Vec::with_capacity(n);
                for (k, &word) in data[start + 4..start + 4 + n].iter().enumerate() {
                    let w = start + 4 + k;
                    let value = arg_value(word);
                    let arg = match (word >> 56) & 0xFF {
                        0 => Arg::Reg(reg(w, value)?),
                        1 => Arg::Imm(value),
                        2 => Arg::Const(u32::try_from(value).ok().filter(|&c| (c as usize) < constants).ok_or_else(
                            || {
                                invalid(
                                    word_at(w),
                                    "constant index",
                                    format!("instruction {i}: c[{value}] of {constants} constants"),
                                )
                            },
                        )?),
                        3 => Arg::Func(
                            u32::try_from(value).ok().filter(|&f| (f as usize) < functions.len()).ok_or_else(|| {
                                invalid(
                                    word_at(w),
                                    "function index",
                                    format!("instruction {i}: f[{value}] of {} functions", functions.len()),
                                )
                            })?,
                        ),
                        k => {
                            return Err(invalid(
                                word_at(w),
                                "argument kind",
                                format!("instruction {i}: kind {k} is not 0 to 3"),
                            ))
                        }
                    };
                    args.push(arg);
                }
                Instruction::Call { dst, func, args }
            }
            2 => Instruction::Ret { result: reg(start + 1, words(1)?[0])? },
            3 => Instruction::Goto { offset: words(1)?[0] },
            4 => {
                let w = words(2)?;
                Instruction::If { cond: reg(start + 1, w[0])?, false_offset: w[1] }
            }
            op => {
                return Err(invalid(
                    word_at(start),
                    "opcode",
                    format!("instruction {i} has opcode {op} (1 to 4 exist)"),
                ))
            }
        };
        next_free = start
            + match &ins {
                Instruction::Call { args, .. } => 4 + args.len(),
                Instruction::Ret { .. } | Instruction::Goto { .. } => 2,
                Instruction::If { .. } => 3,
            };
        out.push(ins);
    }
    Ok(out)
}

/// Encodes an argument word (for tests and tools that build programs).
pub fn encode_arg(arg: Arg) -> i64 {
    let (kind, value) = match arg {
        Arg::Reg(r) => (0i64, reg_value(r)),
        Arg::Imm(v) => (1, v),
        Arg::Const(c) => (2, i64::from(c)),
        Arg::Func(f) => (3, i64::from(f)),
    };
    (kind << 56) | (value & ((1 << 56) - 1))
}
