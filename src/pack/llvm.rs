//! The LLVM route (TVM's `PackImportsToLLVM` / `codegen_blob.cc`), with LLVM 14 via inkwell.
//!
//! The module (`<prefix>devc`) holds the blob symbol as a constant `[N x i8]` global: external
//! linkage, align 1, no trailing NUL, triple and data layout of the target machine, PIC.
//! System-lib mode adds TVM's static constructor that registers the blob by name.
//!
//! Where we differ from TVM, and why:
//! - LLVM copies and hashes constant data (two extra copies of the blob, 2x its size in RSS).
//!   We give the global a zero initializer of the right size, which LLVM emits as a fill
//!   without holding the bytes, then stream the blob into the object at the symbol's file
//!   offset. The object is the one LLVM would have written for the real initializer: same
//!   section, symbol, size and alignment; only the section's contents differ, and we write those.
//! - LLVM 14 takes array lengths as 32 bits: a blob of 4 GiB or more is refused with an error
//!   instead of being silently truncated.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Once;

use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::values::BasicValue;
use inkwell::{AddressSpace, OptimizationLevel};
use object::{Object, ObjectSection, ObjectSymbol};

use super::{BlobSource, PackOptions};
use crate::{Error, Result};

/// The largest blob LLVM 14 can hold in one array (its length is a `u32`).
pub const MAX_BLOB: u64 = u32::MAX as u64;

fn llvm(step: &'static str) -> impl Fn(String) -> Error {
    move |message| Error::Llvm { step, message }
}

fn init_targets() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let config = InitializationConfig::default();
        Target::initialize_x86(&config);
        Target::initialize_aarch64(&config);
    });
}

/// A target machine for `triple` (PIC, generic CPU).
pub fn target_machine(triple: &str) -> Result<TargetMachine> {
    init_targets();
    let triple = TargetTriple::create(triple);
    let target = Target::from_triple(&triple).map_err(|e| llvm("target lookup")(e.to_string()))?;
    target
        .create_target_machine(&triple, "generic", "", OptimizationLevel::None, RelocMode::PIC, CodeModel::Default)
        .ok_or_else(|| llvm("target machine")(format!("no target machine for {}", triple.as_str().to_string_lossy())))
}

/// Checks the blob fits LLVM's array length.
pub fn check_len(len: u64) -> Result<()> {
    if len > MAX_BLOB {
        return Err(Error::TooLarge {
            what: "blob",
            len,
            limit: MAX_BLOB,
            route: "the LLVM packer (LLVM 14 array lengths are 32 bits)",
            hint: "; use `--backend c`, which has no such limit",
        });
    }
    Ok(())
}

/// Writes `<dir>/<stem>.o` holding `blob` under the blob symbol.
pub fn write_object(blob: &dyn BlobSource, opts: &PackOptions, dir: &Path) -> Result<PathBuf> {
    opts.check()?;
    let len = blob.blob_len();
    let _span = tracing::info_span!("pack", route = "llvm", bytes = len).entered();
    check_len(len)?;
    let tm = target_machine(&opts.triple())?;
    let ctx = Context::create();
    let module = build_module(&ctx, &tm, opts, len)?;
    let path = dir.join(format!("{}.o", opts.file_stem()));
    check_room(&path, len + (1 << 16))?;
    tm.write_to_file(&module, FileType::Object, &path).map_err(|e| llvm("emit object")(e.to_string()))?;
    drop(module);
    place_blob(&path, &opts.symbol(), blob)?;
    Ok(path)
}

/// The module: the blob global (zero-initialized, see the module docs) and, for system-lib,
/// the registration constructor.
pub fn build_module<'c>(ctx: &'c Context, tm: &TargetMachine, opts: &PackOptions, len: u64) -> Result<Module<'c>> {
    check_len(len)?;
    let id = opts.file_stem();
    let module = ctx.create_module(&id);
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let sym = opts.symbol();
    let i8t = ctx.i8_type();
    let array = i8t.array_type(len as u32);
    let blob = module.add_global(array, None, &sym);
    blob.set_linkage(Linkage::External);
    blob.set_constant(true);
    blob.set_alignment(1);
    blob.set_initializer(&array.const_zero());
    // Explicit, so that a zero initializer can never land in `.bss`.
    blob.set_section(Some(opts.section_for(len)));
    if opts.triple().contains("windows") {
        blob.set_dll_storage_class(inkwell::DLLStorageClass::Export);
    }
    if opts.system_lib {
        add_registration(ctx, &module, opts, blob.as_pointer_value()).map_err(|e| llvm("system-lib")(e.to_string()))?;
    }
    module.verify().map_err(|e| llvm("verify")(e.to_string()))?;
    Ok(module)
}

/// TVM's static constructor: `_GLOBAL__sub_I_<id>` calls `__cxx_global_var_init`, which
/// registers `(name, blob)` and stores the result in `<sym>_reg_`; priority 65535.
fn add_registration<'c>(
    ctx: &'c Context,
    module: &Module<'c>,
    opts: &PackOptions,
    blob: inkwell::values::PointerValue<'c>,
) -> std::result::Result<(), inkwell::builder::BuilderError> {
    let sym = opts.symbol();
    let i32t = ctx.i32_type();
    let i8p = ctx.i8_type().ptr_type(AddressSpace::default());
    let reg = module.add_global(i32t, None, &format!("{sym}_reg_"));
    reg.set_linkage(Linkage::Internal);
    reg.set_initializer(&i32t.const_zero());
    reg.set_alignment(4);
    let name = ctx.const_string(sym.as_bytes(), true);
    let name_g = module.add_global(name.get_type(), None, &format!("{sym}.str"));
    name_g.set_linkage(Linkage::Private);
    name_g.set_constant(true);
    name_g.set_alignment(1);
    name_g.set_initializer(&name);
    let register = module.add_function(opts.register_function(), i32t.fn_type(&[i8p.into(), i8p.into()], false), None);
    let void_fn = ctx.void_type().fn_type(&[], false);
    let init = module.add_function("__cxx_global_var_init", void_fn, Some(Linkage::Internal));
    let sub = module.add_function(&format!("_GLOBAL__sub_I_{}", opts.file_stem()), void_fn, Some(Linkage::Internal));
    if opts.triple().contains("linux") {
        init.set_section(Some(".text.startup"));
        sub.set_section(Some(".text.startup"));
    }
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(init, "entry"));
    let name_ptr = name_g.as_pointer_value().const_cast(i8p);
    let blob_ptr = blob.const_cast(i8p);
    let ret = b.build_call(register, &[name_ptr.into(), blob_ptr.into()], "reg")?;
    let value = ret.try_as_basic_value().basic().ok_or(inkwell::builder::BuilderError::UnsetPosition)?;
    b.build_store(reg.as_pointer_value(), value.into_int_value())?;
    b.build_return(None)?;
    b.position_at_end(ctx.append_basic_block(sub, "entry"));
    b.build_call(init, &[], "")?;
    b.build_return(None)?;

    let fn_ptr = void_fn.ptr_type(AddressSpace::default());
    if opts.triple().contains("linux") || opts.triple().contains("elf") {
        // TVM appends to `llvm.global_ctors`, which LLVM's C API target machines emit as
        // `.ctors` (its `UseInitArray` option defaults to off and cannot be set through the C
        // API). Modern start files and lld do not run `.ctors`, so on ELF the pointer goes
        // straight into `.init_array`: what clang emits for priority 65535.
        let init = module.add_global(fn_ptr.array_type(1), None, &format!("{sym}_init_array_"));
        init.set_linkage(Linkage::Private);
        init.set_constant(true);
        init.set_section(Some(".init_array"));
        init.set_alignment(8);
        init.set_initializer(&fn_ptr.const_array(&[sub.as_global_value().as_pointer_value()]));
        let used_t = i8p.array_type(1);
        let used = module.add_global(used_t, None, "llvm.used");
        used.set_linkage(Linkage::Appending);
        used.set_section(Some("llvm.metadata"));
        used.set_initializer(&i8p.const_array(&[init.as_pointer_value().const_cast(i8p)]));
    } else {
        // llvm.global_ctors = appending global [1 x { i32, void ()*, i8* }] [{ 65535, @sub, null }]
        let entry_t = ctx.struct_type(&[i32t.into(), fn_ptr.into(), i8p.into()], false);
        let entry = entry_t.const_named_struct(&[
            i32t.const_int(65535, false).as_basic_value_enum(),
            sub.as_global_value().as_pointer_value().as_basic_value_enum(),
            i8p.const_null().as_basic_value_enum(),
        ]);
        let ctors = module.add_global(entry_t.array_type(1), None, "llvm.global_ctors");
        ctors.set_linkage(Linkage::Appending);
        ctors.set_initializer(&entry_t.const_array(&[entry]));
    }
    Ok(())
}

/// Checks that an object of about `len` bytes can be written at `path` before LLVM writes
/// there: LLVM aborts the process on a failed write ("IO failure on output stream") instead of
/// returning an error, so a full disk or a file-size limit must be found first. (Writing the
/// zeros ourselves would also find it, at the cost of one more pass over the blob.)
fn check_room(path: &Path, len: u64) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let full = |detail: String| Error::Io {
        path: path.to_owned(),
        action: "cannot write the blob object",
        source: io::Error::other(detail),
    };
    if let Ok(avail) = fs4::available_space(dir) {
        if avail < len {
            return Err(full(format!("{len} bytes needed, {avail} available on the file system (disk full)")));
        }
    }
    if let Ok((soft, _)) = rlimit::Resource::FSIZE.get() {
        if soft < len {
            return Err(full(format!("{len} bytes needed, the file size limit (ulimit -f) is {soft} bytes")));
        }
    }
    Ok(())
}

/// Streams the blob into the object file at the bytes of `symbol`.
pub(crate) fn place_blob(path: &Path, symbol: &str, blob: &dyn BlobSource) -> Result<()> {
    let (offset, size) = {
        // Mapped, not read: only the headers and symbol table are touched.
        let data = mblob_runtime::map_file(path)?;
        symbol_range(&data, symbol).map_err(|detail| Error::Invalid { what: path.display().to_string(), detail })?
    };
    if size != blob.blob_len() {
        return Err(Error::Invalid {
            what: path.display().to_string(),
            detail: format!("symbol `{symbol}` has {size} bytes, the blob {}", blob.blob_len()),
        });
    }
    let file = OpenOptions::new().write(true).open(path).map_err(Error::io(path, "cannot open"))?;
    let mut w = io::BufWriter::with_capacity(1 << 20, AtWriter { file: &file, pos: offset });
    blob.write_blob(&mut w).and_then(|_| w.flush()).map_err(Error::io(path, "cannot write"))?;
    Ok(())
}

/// File offset and size of a defined symbol's bytes in an object file.
fn symbol_range(data: &[u8], symbol: &str) -> std::result::Result<(u64, u64), String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(symbol) && !s.is_undefined())
        .ok_or_else(|| format!("no symbol `{symbol}`"))?;
    let index = sym.section_index().ok_or_else(|| format!("symbol `{symbol}` has no section"))?;
    let section = file.section_by_index(index).map_err(|e| e.to_string())?;
    let (start, _) = section.file_range().ok_or_else(|| format!("section of `{symbol}` holds no bytes (bss)"))?;
    Ok((start + sym.address() - section.address(), sym.size()))
}

struct AtWriter<'f> {
    file: &'f std::fs::File,
    pos: u64,
}

impl Write for AtWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
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
    fn blobs_of_4_gib_are_refused_not_truncated() {
        assert!(check_len(MAX_BLOB).is_ok());
        let err = check_len(MAX_BLOB + 1).unwrap_err();
        assert!(matches!(err, Error::TooLarge { len, .. } if len == MAX_BLOB + 1));
        assert!(err.to_string().contains("--backend c"));
    }

    #[test]
    fn large_blobs_go_to_lrodata_on_x86_64_only() {
        let x86 = PackOptions { target: Some("x86_64-unknown-linux-gnu".into()), ..PackOptions::default() };
        let arm = PackOptions { target: Some("aarch64-unknown-linux-gnu".into()), ..PackOptions::default() };
        assert_eq!(x86.section_for(super::super::LARGE_DATA_THRESHOLD + 1), ".lrodata");
        assert_eq!(x86.section_for(1000), ".rodata");
        assert_eq!(arm.section_for(super::super::LARGE_DATA_THRESHOLD + 1), ".rodata");
    }
}
