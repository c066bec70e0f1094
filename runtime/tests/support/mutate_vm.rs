//! Mutations of decoded VM executables, shared by the fuzz target `vm_decoded` (its input picks
//! them) and the stable driver `runtime/tests/vm_mutations.rs` (a seeded generator picks them):
//! registers, constant, function and primitive indices, immediates, offsets, sizes and
//! alignments of the decoded program changed to values near its bounds and far past them, then
//! the VM made and the function run. Jumps are only made forward, so that no mutation makes a
//! loop the original did not have (TVM's VM would spin there too).
#![allow(dead_code)]

use mblob_runtime::exec::relax::{Arg, Instruction, Reg, RelaxExecutable};
#[cfg(feature = "relay-vm")]
use mblob_runtime::payload::relay_vm::{Instruction as R, RelayVmExecutable};

/// The source of choices: the next 64 random bits.
pub type Choose<'a> = &'a mut dyn FnMut() -> u64;

fn below(c: Choose<'_>, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (c() % n as u64) as usize
    }
}

/// A value near `bound` (a table's length, a register file's size) or one of the values that
/// break unchecked code: negative, 64-byte misaligned, past 32 and 63 bits.
fn value_near(c: Choose<'_>, bound: i64) -> i64 {
    const EDGES: [i64; 14] = [0, 1, 2, 3, 4, -1, -2, 63, 64, 65, 4096, 1 << 31, 1 << 40, i64::MAX];
    match c() % 4 {
        0 => bound.saturating_add((c() % 5) as i64 - 2),
        1 => (c() % 16) as i64,
        _ => EDGES[below(c, EDGES.len())],
    }
}

fn index_near(c: Choose<'_>, bound: usize) -> u32 {
    u32::try_from(value_near(c, bound as i64)).unwrap_or(u32::MAX)
}

/// A forward jump: to the next instructions, just past the function's end, or far past it.
fn forward(c: Choose<'_>, left: i64) -> i64 {
    match c() % 3 {
        0 => 1 + (c() % left.max(1) as u64) as i64,
        1 => left.saturating_add((c() % 3) as i64),
        _ => 1 << (20 + c() % 40),
    }
}

/// Changes one thing of the decoded Relax executable `e` (its VM functions' instructions or
/// their register counts and ranges).
pub fn relax(e: &mut RelaxExecutable, c: Choose<'_>) {
    let (n_funcs, n_consts, n_ins) = (e.functions.len(), e.constants.len(), e.instructions.len());
    // Functions whose range an earlier mutation left usable.
    let vm: Vec<usize> = (0..n_funcs)
        .filter(|&i| 0 <= e.functions[i].start && e.functions[i].start < e.functions[i].end)
        .filter(|&i| e.functions[i].end <= n_ins as i64)
        .collect();
    if vm.is_empty() {
        return;
    }
    let fi = vm[below(c, vm.len())];
    let (start, end, file) = (e.functions[fi].start, e.functions[fi].end, e.functions[fi].register_file_size);
    if c() & 15 == 0 {
        let f = &mut e.functions[fi];
        match c() % 4 {
            0 => f.register_file_size = value_near(c, file),
            1 => f.num_args = value_near(c, f.num_args),
            2 => f.end = value_near(c, n_ins as i64),
            _ => f.start = value_near(c, start),
        }
        return;
    }
    let pc = start as usize + below(c, (end - start) as usize);
    let left = end - pc as i64;
    let reg = |c: Choose<'_>| match c() % 8 {
        0 => Reg::Void,
        1 => Reg::Vm,
        _ => Reg::Index(index_near(c, file as usize)),
    };
    let ins = &mut e.instructions[pc];
    match ins {
        Instruction::Call { dst, func, args } => match c() % 6 {
            0 => *dst = reg(c),
            1 => *func = index_near(c, n_funcs),
            2 if !args.is_empty() => args.truncate(below(c, args.len())),
            3 => args.push(Arg::Imm(value_near(c, 0))),
            _ if !args.is_empty() => {
                let a = below(c, args.len());
                args[a] = match c() % 5 {
                    0 => Arg::Reg(reg(c)),
                    1 => Arg::Const(index_near(c, n_consts)),
                    2 => Arg::Func(index_near(c, n_funcs)),
                    // An immediate changed a little (a tuple index, an offset, a device, a count).
                    3 => match args[a] {
                        Arg::Imm(v) => Arg::Imm(v.wrapping_add((c() % 5) as i64 - 2)),
                        _ => Arg::Imm(value_near(c, 0)),
                    },
                    _ => Arg::Imm(value_near(c, 0)),
                };
            }
            _ => *dst = reg(c),
        },
        Instruction::Ret { result } => *result = reg(c),
        Instruction::Goto { offset } => *offset = forward(c, left),
        Instruction::If { cond, false_offset } => match c() % 2 {
            0 => *cond = reg(c),
            _ => *false_offset = forward(c, left),
        },
    }
    if c() & 7 == 0 {
        // Now and then another kind of instruction in its place.
        e.instructions[pc] = match c() % 3 {
            0 => Instruction::Ret { result: reg(c) },
            1 => Instruction::Goto { offset: forward(c, left) },
            _ => Instruction::If { cond: reg(c), false_offset: forward(c, left) },
        };
    }
}

/// Changes one thing of the decoded Relay VM executable `e`.
#[cfg(feature = "relay-vm")]
pub fn relay(e: &mut RelayVmExecutable, c: Choose<'_>) {
    let (n_funcs, n_consts, n_prims) = (e.functions.len(), e.constants.len(), e.primitives.len());
    if n_funcs == 0 {
        return;
    }
    let fi = below(c, n_funcs);
    let f = &mut e.functions[fi];
    let file = f.register_file_size as usize;
    if c() & 15 == 0 || f.instructions.is_empty() {
        f.register_file_size = index_near(c, file);
        return;
    }
    let pc = below(c, f.instructions.len());
    let left = (f.instructions.len() - pc) as i64;
    let ins = &mut f.instructions[pc];
    let replace = match ins {
        R::Move { from, .. } => {
            *from = index_near(c, file);
            None
        }
        R::Ret { result } => {
            *result = index_near(c, file);
            None
        }
        R::Invoke { func, .. } => {
            *func = index_near(c, n_funcs);
            None
        }
        R::InvokePacked { packed_index, output_size, args } => {
            match c() % 4 {
                0 => *packed_index = index_near(c, n_prims),
                1 => *output_size = index_near(c, args.len()),
                2 if !args.is_empty() => args.truncate(below(c, args.len())),
                _ if !args.is_empty() => {
                    let a = below(c, args.len());
                    args[a] = index_near(c, file);
                }
                _ => {}
            }
            None
        }
        R::AllocTensor { storage, offset, shape, .. } => {
            match c() % 3 {
                0 => *storage = index_near(c, file),
                1 => *offset = index_near(c, file),
                _ => shape.iter_mut().for_each(|d| *d = value_near(c, *d).max(0)),
            }
            None
        }
        R::AllocStorage { alignment, shape, .. } => {
            match c() % 2 {
                0 => *alignment = value_near(c, *alignment),
                _ => shape.iter_mut().for_each(|d| *d = value_near(c, *d).max(0) % (1 << 20)),
            }
            None
        }
        R::LoadConst { const_index, .. } => {
            *const_index = index_near(c, n_consts);
            None
        }
        R::GetField { field_index, .. } => {
            *field_index = index_near(c, 2);
            None
        }
        R::Goto { offset } => {
            *offset = forward(c, left);
            None
        }
        R::If { true_offset, false_offset, .. } => {
            *true_offset = forward(c, left);
            *false_offset = forward(c, left);
            None
        }
        // An offset, a size or a shape the program computes: a scalar in a register.
        R::LoadConsti { dst, .. } => Some(R::LoadConsti { value: value_near(c, 0), dst: *dst }),
        R::KillRegister { dst } => Some(R::LoadConsti { value: value_near(c, 0), dst: *dst }),
        R::ShapeOf { tensor, dst } | R::ReshapeTensor { tensor, dst, .. } | R::DeviceCopy { src: tensor, dst, .. } => {
            let (t, d) = (*tensor, *dst);
            Some(match c() % 3 {
                0 => R::ReshapeTensor { tensor: t, newshape: index_near(c, file), dst: d },
                1 => R::GetField { object: t, field_index: index_near(c, 2), dst: d },
                _ => R::ShapeOf { tensor: index_near(c, file), dst: d },
            })
        }
        _ => None,
    };
    if let Some(new) = replace {
        *ins = new;
    }
}

/// A seeded generator for the stable driver (xorshift64*).
pub fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.max(1);
    move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Choices read from a fuzzer's input, 8 bytes each (zeros once it runs out).
pub fn from_bytes(data: &[u8]) -> impl FnMut() -> u64 + '_ {
    let mut at = 0;
    move || {
        let mut b = [0u8; 8];
        let end = data.len().min(at + 8);
        if at < end {
            b[..end - at].copy_from_slice(&data[at..end]);
        }
        at = end;
        u64::from_le_bytes(b)
    }
}
