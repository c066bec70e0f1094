//! A TVM 0.27 executable whose `vm.builtin.alloc_tensor` offset was rewritten (4, 64, 128
//! bytes into its storage, which TVM 0.27 refuses when the tensor reaches a kernel: `ValueError:
//! Invalid ....byte_offset on argument #N when calling: ... expected 0`): mblob refuses it with
//! the kernel's own message, as TVM does, instead of running it (64, 128) or crashing in the
//! kernel (4, not 64-byte aligned: SIGSEGV).
//!
//! The fixtures `tests/fixtures/bad-exec/user_mlp.offset{4,64,128}.so` are
//! `tests/fixtures/user-0.27/user_mlp.so` (made by TVM 0.27) with that one word changed:
//! [`patched_alloc_tensor_offset`] makes them, `MBLOB_REGENERATE=1 cargo test --test all
//! bad_exec` writes them, and the test checks that the files are what it makes.

use std::path::{Path, PathBuf};
use std::process::Command;

use mblob_runtime::exec::relax::{Arg, Instruction, Reg, RelaxExecutable};
use mblob_runtime::{load_library, LoadOptions, Registry};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn word(w: i64) -> [u8; 8] {
    w.to_le_bytes()
}

fn reg_word(r: &Reg) -> i64 {
    // TVM's special registers (`vm/bytecode.h`): void = 1 << 54 + 1, vm = 1 << 54 + 2... as
    // mblob's decoder reads them; only ordinary registers are expected here.
    match r {
        Reg::Index(i) => i64::from(*i),
        other => panic!("unexpected special register {other:?}"),
    }
}

fn arg_word(a: &Arg) -> i64 {
    let (kind, value) = match a {
        Arg::Reg(Reg::Index(i)) => (0i64, i64::from(*i)),
        Arg::Reg(r) => panic!("unexpected special register {r:?}"),
        Arg::Imm(v) => (1, *v),
        Arg::Const(c) => (2, i64::from(*c)),
        Arg::Func(f) => (3, i64::from(*f)),
    };
    (kind << 56) | (value & ((1 << 56) - 1))
}

/// `so` with the byte offset of its first `vm.builtin.alloc_tensor` call made `offset`: the
/// call is decoded with mblob's reader, its words (opcode 1, dst, function, argument count,
/// arguments) found in the file (once) and the offset argument's word rewritten.
pub fn patched_alloc_tensor_offset(so: &Path, offset: i64) -> Vec<u8> {
    // SAFETY: a fixture TVM made; loading it runs its initialisers.
    #[allow(unsafe_code)]
    let tree = unsafe { load_library(so, &Registry::default(), &LoadOptions::keep_unknown()) }.unwrap();
    let exec = tree.find::<RelaxExecutable>().expect("a Relax executable");
    let alloc = exec.functions.iter().position(|f| f.name == "vm.builtin.alloc_tensor").expect("alloc_tensor") as u32;
    let (dst, args) = exec
        .instructions
        .iter()
        .find_map(|i| match i {
            Instruction::Call { dst, func, args } if *func == alloc && args.get(1) == Some(&Arg::Imm(0)) => {
                Some((dst, args))
            }
            _ => None,
        })
        .expect("an alloc_tensor call at offset 0");
    let mut pattern = Vec::new();
    for w in [1, reg_word(dst), i64::from(alloc), args.len() as i64] {
        pattern.extend(word(w));
    }
    for a in args {
        pattern.extend(word(arg_word(a)));
    }
    let mut bytes = std::fs::read(so).unwrap();
    let at: Vec<usize> =
        bytes.windows(pattern.len()).enumerate().filter(|(_, w)| *w == pattern).map(|(i, _)| i).collect();
    assert_eq!(at.len(), 1, "the alloc_tensor call's words occur {} times", at.len());
    let offset_word = at[0] + 8 * 5;
    bytes[offset_word..offset_word + 8].copy_from_slice(&word(arg_word(&Arg::Imm(offset))));
    bytes
}

#[test]
fn an_alloc_tensor_offset_tvm_refuses_is_refused_with_tvms_message() {
    let original = fixtures().join("user-0.27/user_mlp.so");
    let dir = fixtures().join("bad-exec");
    let inputs: Vec<PathBuf> =
        (0..6).map(|i| fixtures().join(format!("user-0.27/user_mlp.forward.0.in{i}.npy"))).collect();
    let tmp = tempfile::tempdir().unwrap();
    // The original runs (the inputs are good).
    let run = |so: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mblob"));
        cmd.arg("run").arg(so).args(["--function", "forward"]);
        for i in &inputs {
            cmd.arg("-i").arg(i);
        }
        cmd.arg("-o").arg(tmp.path().join("out")).output().unwrap()
    };
    let o = run(&original);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for offset in [4, 64, 128] {
        let fixture = dir.join(format!("user_mlp.offset{offset}.so"));
        let made = patched_alloc_tensor_offset(&original, offset);
        if std::env::var_os("MBLOB_REGENERATE").is_some() {
            std::fs::write(&fixture, &made).unwrap();
        }
        assert!(std::fs::read(&fixture).unwrap() == made, "{} is not what the generator makes", fixture.display());
        let o = run(&fixture);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "offset {offset}: {err}");
        assert!(err.contains("ValueError: Invalid") && err.contains(".byte_offset on argument #"), "{offset}: {err}");
        assert!(err.contains("expected 0"), "offset {offset}: {err}");
    }
}
