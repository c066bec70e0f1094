//! The C route: TVM's `PackImportsToC` text, a fast `.incbin` form, and compiling either with
//! the system C compiler (found by the `cc` crate).
//!
//! - [`CStyle::Tvm`] writes exactly what TVM 0.14+ writes (`tvm-format.md` §4): one `0xNN,` per
//!   byte, 20 per line. A C compiler parses every byte as an expression: gcc 12 at `-O0` took
//!   6 s and 0.48 GB for 4 MiB, 31 s and 2.4 GB for 16 MiB, 191 s and 9.2 GB for 64 MiB. Kept
//!   for byte-for-byte compatibility and small blobs.
//! - [`CStyle::Fast`] writes the blob to `<stem>.bin` and a C file whose top-level `__asm__`
//!   block defines the symbol and pulls the bytes in with `.incbin`: the compiler never looks at
//!   them (64 MiB: 0.3 s; 512 MiB: 0.8 to 2.2 s, the assembler holding the file once). The
//!   object holds the same symbol (global, `STT_OBJECT`, exact size) with the same bytes.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::filespan::MappedFiles;
use super::{BlobSource, CStyle, PackOptions};
use crate::{Error, Result};

const PREAMBLE: &str = "#ifdef _WIN32\n#define TVM_EXPORT __declspec(dllexport)\n#else\n#define TVM_EXPORT\n#endif\n\
#ifdef __cplusplus\nextern \"C\" {\n#endif\n";
const POSTAMBLE: &str = "#ifdef __cplusplus\n}\n#endif\n";

/// Writes TVM's C text for `blob` (TVM 0.14+ style: 20 bytes per line, `0xNN,` each, the
/// system-lib registration as a static initializer, which is valid C++ only, as in TVM).
///
/// The text is produced while the blob streams through, a few KiB at a time; `out` is written
/// in small pieces, so give it a buffered writer.
pub fn write_tvm_text<B: BlobSource + ?Sized>(blob: &B, opts: &PackOptions, out: &mut dyn Write) -> io::Result<()> {
    let sym = opts.symbol();
    out.write_all(PREAMBLE.as_bytes())?;
    writeln!(out, "TVM_EXPORT extern const unsigned char {sym}[];")?;
    write!(out, "const unsigned char {sym}[{}] = {{", blob.blob_len())?;
    let mut hex = HexLines { out: &mut *out, index: 0, text: Vec::new() };
    blob.write_blob(&mut hex)?;
    if hex.index != blob.blob_len() {
        let detail = format!("the blob source wrote {} bytes but announced {}", hex.index, blob.blob_len());
        return Err(io::Error::new(io::ErrorKind::InvalidData, detail));
    }
    out.write_all(b"\n};\n")?;
    if opts.system_lib {
        let reg = opts.register_function();
        writeln!(out, "extern int {reg}(const char*, void*);")?;
        writeln!(out, "static int {sym}_reg_ = {reg}(\"{sym}\", (void*){sym});")?;
    }
    out.write_all(POSTAMBLE.as_bytes())
}

/// Formats bytes as TVM does: before byte `k`, `\n  ` if `k % 20 == 0`; each byte `0xNN,`.
struct HexLines<'a> {
    out: &'a mut dyn Write,
    /// Bytes formatted so far.
    index: u64,
    /// Reused text buffer (at most [`HexLines::CHUNK`] bytes of input at a time).
    text: Vec<u8>,
}

impl HexLines<'_> {
    /// Input bytes formatted per call, so that a multi-GiB `write_all` does not allocate
    /// five times its size.
    const CHUNK: usize = 16 << 10;
}

impl Write for HexLines<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let buf = buf.get(..Self::CHUNK).unwrap_or(buf);
        self.text.clear();
        for &b in buf {
            if self.index % 20 == 0 {
                self.text.extend_from_slice(b"\n  ");
            }
            self.text.extend_from_slice(&[b'0', b'x', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)], b',']);
            self.index += 1;
        }
        self.out.write_all(&self.text)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes `<dir>/<stem>.c` (and, for [`CStyle::Fast`], the blob as `<dir>/<stem>.bin`, which
/// the source names by its absolute path) and returns the source's path.
///
/// # Errors
/// [`Error::Options`] for a bad prefix, [`Error::Target`] for [`CStyle::Fast`] with a target that is not
/// ELF (its assembly directives are ELF's); [`Error::Io`] when a file cannot be written (the
/// files written so far are removed).
pub fn write_source(blob: &dyn BlobSource, opts: &PackOptions, style: CStyle, dir: &Path) -> Result<PathBuf> {
    write_source_with(blob, opts, style, dir, false)
}

/// [`write_source`], except that in the fast form the bytes of large payloads that are
/// read-only mappings of files (payloads read with [`mblob_runtime::map_file`]) are
/// `.incbin`ed from those files where they lie, and only the rest goes into `<stem>.bin`: the
/// blob's bytes are read once, by the assembler, instead of being written to `<stem>.bin`
/// first. The source is then valid only while those files stay as they are: compile it at
/// once (an export does).
///
/// # Errors
/// As [`write_source`].
pub fn write_source_in_place(blob: &dyn BlobSource, opts: &PackOptions, style: CStyle, dir: &Path) -> Result<PathBuf> {
    write_source_with(blob, opts, style, dir, true)
}

fn write_source_with(
    blob: &dyn BlobSource,
    opts: &PackOptions,
    style: CStyle,
    dir: &Path,
    in_place: bool,
) -> Result<PathBuf> {
    opts.check_c()?;
    let len = blob.blob_len();
    let _span =
        tracing::info_span!("pack", route = "c", style = ?style, bytes = len, symbol = %opts.symbol()).entered();
    let path = dir.join(format!("{}.c", opts.file_stem()));
    let mut created = Created(Vec::new());
    match style {
        CStyle::Tvm => {
            let mut out = created.create(&path)?;
            write_tvm_text(blob, opts, &mut out).and_then(|_| out.flush()).map_err(Error::io(&path, "cannot write"))?;
        }
        CStyle::Fast => {
            let section = opts.section_for(len).ok_or_else(|| Error::Target {
                what: format!("target {}", opts.triple()),
                detail: "the fast C form uses ELF assembly directives; use TVM's C text for other targets".into(),
            })?;
            let bin = dir.join(format!("{}.bin", opts.file_stem()));
            let mut pieces = Pieces { bin: created.create(&bin)?, bin_len: 0, list: Vec::new(), files: None };
            if in_place {
                pieces.files = Some(MappedFiles::default());
            }
            blob.write_blob(&mut pieces).and_then(|_| pieces.bin.flush()).map_err(Error::io(&bin, "cannot write"))?;
            let written: u64 = pieces.list.iter().map(|p| p.len).sum();
            if written != len {
                return Err(Error::Internal {
                    what: bin.display().to_string(),
                    detail: format!("the blob source wrote {written} bytes but announced {len}").into(),
                });
            }
            let bin = bin.canonicalize().map_err(Error::io(&bin, "cannot resolve"))?;
            let list: Vec<(PathBuf, u64, u64)> =
                pieces.list.into_iter().map(|p| (p.file.unwrap_or_else(|| bin.clone()), p.offset, p.len)).collect();
            if list.len() > 1 {
                tracing::debug!(pieces = list.len(), "blob .incbin'ed in pieces, payload files in place");
            }
            let mut out = created.create(&path)?;
            write_fast_text(len, section, &list, opts, &mut out)
                .and_then(|_| out.flush())
                .map_err(Error::io(&path, "cannot write"))?;
        }
    }
    created.0.clear();
    tracing::debug!(source = %path.display(), "wrote C source");
    Ok(path)
}

/// Files created by [`write_source`], removed on drop unless the list was cleared (success).
struct Created(Vec<PathBuf>);

impl Created {
    fn create(&mut self, path: &Path) -> Result<BufWriter<File>> {
        let f = File::create(path).map_err(Error::io(path, "cannot create"))?;
        self.0.push(path.to_owned());
        Ok(BufWriter::with_capacity(1 << 16, f))
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The blob as it goes into the fast form: spans of `<stem>.bin` (what was copied) and, in
/// place, spans of payload files. Adjacent spans of one file are merged.
struct Pieces {
    bin: BufWriter<File>,
    bin_len: u64,
    list: Vec<Piece>,
    /// Looks up payload files; `None`: copy everything.
    files: Option<MappedFiles>,
}

/// `len` bytes from `offset` of `file` (`None`: the `.bin` file).
struct Piece {
    file: Option<PathBuf>,
    offset: u64,
    len: u64,
}

impl Pieces {
    fn push(&mut self, file: Option<PathBuf>, offset: u64, len: u64) {
        match self.list.last_mut() {
            Some(last) if last.file == file && last.offset + last.len == offset => last.len += len,
            _ => self.list.push(Piece { file, offset, len }),
        }
    }
}

impl Write for Pieces {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(span) = self.files.as_mut().and_then(|f| f.span(buf)) {
            self.push(Some(span.path), span.offset, buf.len() as u64);
            return Ok(buf.len());
        }
        let n = self.bin.write(buf)?;
        let at = self.bin_len;
        self.bin_len += n as u64;
        self.push(None, at, n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.bin.flush()
    }
}

/// The fast form: a top-level `__asm__` block defines the symbol in `section` and `.incbin`s
/// the blob's pieces (file, offset, length) in order. Valid C and C++, for any ELF target (`%`
/// type prefixes, which both the x86 and the Arm assemblers accept).
fn write_fast_text(
    len: u64,
    section: &str,
    pieces: &[(PathBuf, u64, u64)],
    opts: &PackOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let sym = opts.symbol();
    // `a` = allocatable; `l` marks x86-64 large data (SHF_X86_64_LARGE), which gold needs to
    // place the section away from the small ones.
    let flags = if section == ".lrodata" { "al" } else { "a" };
    let incbins = pieces
        .iter()
        .map(|(file, offset, n)| format!(".incbin \"{}\",{offset},{n}", gas_string(file.as_os_str().as_bytes())));
    writeln!(
        out,
        "/* The blob of a packed module tree: {len} bytes, in the files named below. Generated by mblob. */"
    )?;
    writeln!(out, "#ifdef __cplusplus\nextern \"C\" {{\n#endif")?;
    writeln!(out, "extern const unsigned char {sym}[];")?;
    writeln!(out, "__asm__(")?;
    let head = [
        format!(".pushsection {section},\"{flags}\",%progbits"),
        format!(".globl {sym}"),
        format!(".type {sym}, %object"),
        format!(".size {sym}, {len}"),
        format!("{sym}:"),
    ];
    for line in head.into_iter().chain(incbins).chain([".popsection".to_owned()]) {
        writeln!(out, "  \"{}\\n\"", c_string(&line))?;
    }
    writeln!(out, ");")?;
    if opts.system_lib {
        // TVM's `static int x = f();` is C++ only; a constructor function is valid in both.
        let reg = opts.register_function();
        writeln!(out, "extern int {reg}(const char*, void*);")?;
        writeln!(out, "__attribute__((constructor)) static void {sym}_reg_(void) {{")?;
        writeln!(out, "  (void){reg}(\"{sym}\", (void*){sym});")?;
        writeln!(out, "}}")?;
    }
    writeln!(out, "#ifdef __cplusplus\n}}\n#endif")
}

/// `bytes` as the inside of an assembler string: `"` and `\` escaped, anything not printable
/// ASCII as a three-digit octal escape.
fn gas_string(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'"' | b'\\' => {
                s.push('\\');
                s.push(char::from(b));
            }
            0x20..=0x7e => s.push(char::from(b)),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s
}

/// Printable ASCII `text` as the inside of a C string literal (`?` escaped too, so that no
/// trigraph can form under `-std=c11`).
fn c_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if matches!(c, '"' | '\\' | '?') {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

/// Compiles a C source to `<out_dir>/<source stem>.o` with the system C compiler, as the `cc`
/// crate finds it for `opts.target` (`$CC`, `$CFLAGS`, then `cc`), position-independent, `-O0`.
///
/// TVM's system-lib text ([`CStyle::Tvm`] with `system_lib`) is valid C++ only, as in TVM:
/// compile it with [`compile_with`] and `cpp = true`.
///
/// # Errors
/// [`Error::Tool`] when the compiler cannot be determined or fails (with the command and the
/// end of its stderr), [`Error::ToolNotFound`] when it cannot be started.
pub fn compile(source: &Path, opts: &PackOptions, out_dir: &Path) -> Result<PathBuf> {
    compile_with(source, opts, out_dir, false)
}

/// [`compile`], as C++ when `cpp` is set (the `cc` crate's C++ compiler: `$CXX`, then `c++`).
///
/// C for the host target is compiled by the link step's driver (`$CC`, then `cc`), run
/// directly: the `cc` crate's compiler detection (a preprocessor run, a `-?` run and a probe
/// file it syncs to disk) took 0.2 to 0.4 s of every export on this VM, as long as the fast
/// form's whole compile. Other targets, and C++, go through the `cc` crate, which knows their
/// compilers.
pub fn compile_with(source: &Path, opts: &PackOptions, out_dir: &Path, cpp: bool) -> Result<PathBuf> {
    if !cpp && opts.triple() == super::host_triple() {
        return compile_for_host(source, opts, out_dir);
    }
    let mut build = base_build(opts, cpp);
    build.opt_level(0);
    compile_build(&build, source, opts, out_dir)
}

/// `<driver> -c -fPIC -O0 source -o <out_dir>/<stem>.o` with the link step's driver.
fn compile_for_host(source: &Path, opts: &PackOptions, out_dir: &Path) -> Result<PathBuf> {
    let _span = tracing::info_span!("compile", source = %source.display()).entered();
    let stem = source.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "source".into());
    let object = out_dir.join(format!("{stem}.o"));
    let mut cmd = std::process::Command::new(crate::link::driver(&crate::link::LinkOptions::default()));
    cmd.args(["-c", "-fPIC", "-O0"]).arg(source).arg("-o").arg(&object);
    if let Some(dir) = crate::tool::ToolContext::tmpdir() {
        cmd.env("TMPDIR", dir);
    }
    let step = format!("compile {}", source.display());
    let compiled = crate::tool::run_tool(&step, &mut cmd).and_then(|_| check_machine(&object, &opts.triple(), &cmd));
    if let Err(e) = compiled {
        let _ = std::fs::remove_file(&object);
        return Err(e);
    }
    Ok(object)
}

/// A `cc` build for `opts`' target: position-independent, no debug information, nothing
/// printed for cargo. The caller adds the optimisation level and its own options.
pub(crate) fn base_build(opts: &PackOptions, cpp: bool) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .pic(true)
        .debug(false)
        .cpp(cpp)
        .target(&cc_triple(&opts.triple()))
        .host(&super::host_triple())
        .cargo_metadata(false)
        .cargo_warnings(false)
        .emit_rerun_if_env_changed(false);
    build
}

/// Compiles `source` with `build`'s compiler and flags to `<out_dir>/<source stem>.o`, and
/// checks that the object is for the target's machine.
pub(crate) fn compile_build(build: &cc::Build, source: &Path, opts: &PackOptions, out_dir: &Path) -> Result<PathBuf> {
    let _span = tracing::info_span!("compile", source = %source.display()).entered();
    let step = format!("compile {}", source.display());
    // The `cc` crate probes the compiler with files in its output directory: ours.
    // Its probes run the compiler itself: they get the tools' `TMPDIR` too.
    let mut build = build.clone();
    build.out_dir(out_dir);
    if let Some(dir) = crate::tool::ToolContext::tmpdir() {
        build.env("TMPDIR", dir);
    }
    let compiler = build.try_get_compiler().map_err(|e| Error::Tool {
        step: step.clone(),
        command: "(compiler detection by the cc crate)".into(),
        status: "not run".into(),
        stderr: e.to_string(),
    })?;
    let mut cmd = compiler.to_command();
    let stem = source.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "source".into());
    let object = out_dir.join(format!("{stem}.o"));
    cmd.arg("-c").arg(source).arg("-o").arg(&object);
    let triple = cc_triple(&opts.triple());
    let compiled = crate::tool::run_tool(&step, &mut cmd).and_then(|_| check_machine(&object, &triple, &cmd));
    if let Err(e) = compiled {
        let _ = std::fs::remove_file(&object);
        return Err(e);
    }
    Ok(object)
}

/// The triple as the `cc` crate knows it: GNU's short `aarch64-linux-gnu` gets Rust's vendor
/// field (`aarch64-unknown-linux-gnu`); with the short form, `cc` would not know the target
/// and would fall back to the host's compiler.
fn cc_triple(triple: &str) -> String {
    match triple.split('-').collect::<Vec<_>>()[..] {
        [arch, "linux", env] => format!("{arch}-unknown-linux-{env}"),
        _ => triple.to_owned(),
    }
}

/// Checks that `object` is for the architecture of `triple`: a compiler for another one (the
/// host's `cc` when no cross compiler was found, a `$CC` left set) must not go unnoticed.
fn check_machine(object: &Path, triple: &str, cmd: &std::process::Command) -> Result<()> {
    use object::{Architecture, Object};
    let want = match triple.split('-').next().unwrap_or_default() {
        "x86_64" => Architecture::X86_64,
        "aarch64" | "arm64" => Architecture::Aarch64,
        "riscv64" | "riscv64gc" => Architecture::Riscv64,
        "i386" | "i586" | "i686" => Architecture::I386,
        _ => return Ok(()), // not one we can tell apart; the linker will
    };
    // Mapped, not read: only the headers are touched, not the blob the object holds.
    let data = mblob_runtime::map_file(object)?;
    let found = object::File::parse(data.as_ref()).map(|f| f.architecture());
    match found {
        Ok(found) if found == want => Ok(()),
        found => Err(Error::Target {
            what: object.display().to_string(),
            detail: format!(
                "compiled for {} by `{}`, but the target is {triple} ({want:?}): set CC (or CXX) to a compiler \
                 for the target",
                found.map(|a| format!("{a:?}")).unwrap_or_else(|_| "an unknown machine".into()),
                cmd.get_program().to_string_lossy()
            )
            .into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tvm_text_streams_in_small_pieces() {
        // One `write_all` of the whole blob must not be formatted in one piece.
        struct Counting(Vec<u8>, usize, usize);
        impl Write for Counting {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.1 = self.1.max(b.len());
                self.2 += 1;
                self.0.extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let blob: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let mut out = Counting(Vec::new(), 0, 0);
        write_tvm_text(&blob[..], &PackOptions::default(), &mut out).unwrap();
        assert!(out.1 < 6 * HexLines::CHUNK, "largest write {}", out.1);
        let text = String::from_utf8(out.0).unwrap();
        let body: Vec<&str> = text.lines().filter(|l| l.starts_with("  0x")).collect();
        assert_eq!(body.len(), 10_000);
        assert!(body.iter().all(|l| l.len() == 2 + 20 * 5));
        assert_eq!(
            body[1],
            "  0x8c,0x93,0x9a,0xa1,0xa8,0xaf,0xb6,0xbd,0xc4,0xcb,0xd2,0xd9,0xe0,0xe7,0xee,0xf5,0xfc,0x03,0x0a,0x11,"
        );
    }

    #[test]
    fn short_gnu_triples_get_a_vendor_for_cc() {
        assert_eq!(cc_triple("aarch64-linux-gnu"), "aarch64-unknown-linux-gnu");
        assert_eq!(cc_triple("riscv64-linux-musl"), "riscv64-unknown-linux-musl");
        assert_eq!(cc_triple("aarch64-unknown-linux-gnu"), "aarch64-unknown-linux-gnu");
        assert_eq!(cc_triple("x86_64-apple-darwin"), "x86_64-apple-darwin");
    }

    #[test]
    fn incbin_paths_survive_both_escaping_levels() {
        assert_eq!(gas_string(b"/t/a\"b\\c\n\xff.bin"), "/t/a\\\"b\\\\c\\012\\377.bin");
        assert_eq!(c_string(".incbin \"a\\\"b??=\""), ".incbin \\\"a\\\\\\\"b\\?\\?=\\\"");
    }

    #[test]
    fn fast_text_for_large_blobs_uses_large_data_flags() {
        let mut text = Vec::new();
        let pieces = [(PathBuf::from("/x/devc.bin"), 0, 5 << 30)];
        write_fast_text(5 << 30, ".lrodata", &pieces, &PackOptions::default(), &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(r#"".pushsection .lrodata,\"al\",%progbits\n""#), "{text}");
        assert!(text.contains(r#"".size __tvm_dev_mblob, 5368709120\n""#), "{text}");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fast_form_in_lrodata_is_large_data_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let blob: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
        let bin = dir.path().join("devc.bin");
        std::fs::write(&bin, &blob).unwrap();
        let opts = PackOptions::default();
        let src = dir.path().join("devc.c");
        let mut text = Vec::new();
        write_fast_text(blob.len() as u64, ".lrodata", &[(bin.clone(), 0, blob.len() as u64)], &opts, &mut text)
            .unwrap();
        std::fs::write(&src, text).unwrap();
        let o = compile(&src, &opts, dir.path()).unwrap();
        let data = std::fs::read(&o).unwrap();
        use object::{Object, ObjectSection};
        let file = object::File::parse(&*data).unwrap();
        let sec = file.section_by_name(".lrodata").unwrap();
        let object::SectionFlags::Elf { sh_flags, sh_type } = sec.flags() else { panic!("not ELF") };
        assert_eq!(sh_type, object::elf::SHT_PROGBITS);
        assert_eq!(sh_flags.0, object::elf::SHF_ALLOC.0 | super::super::SHF_X86_64_LARGE);
        assert!(sec.data().unwrap() == blob);
        let so = dir.path().join("x.so");
        let out = std::process::Command::new("cc").arg("-shared").arg("-o").arg(&so).arg(&o).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let data = std::fs::read(&so).unwrap();
        let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
        assert!(found.bytes(&data).unwrap() == blob);
    }

    /// A blob of small parts and a large payload mapped from a file.
    struct Mixed(mblob_runtime::Bytes);

    impl BlobSource for Mixed {
        fn blob_len(&self) -> u64 {
            8 + self.0.len() as u64 + 3
        }
        fn write_blob(&self, out: &mut dyn Write) -> io::Result<()> {
            out.write_all(&(self.0.len() as u64 + 3).to_le_bytes())?;
            // In two slices, as the export's progress writer hands it over.
            let half = self.0.len() / 2;
            out.write_all(&self.0[..half])?;
            out.write_all(&self.0[half..])?;
            out.write_all(b"end")
        }
    }

    #[test]
    fn in_place_form_incbins_the_payload_file_and_compiles_to_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, mapped) = super::super::mapped_test_file(dir.path(), "payload \"odd\".bin", 3 << 20, 9);
        let blob = Mixed(mapped);
        let mut want = Vec::new();
        blob.write_blob(&mut want).unwrap();
        let opts = PackOptions::default();
        let objects: Vec<Vec<u8>> = [false, true]
            .into_iter()
            .map(|in_place| {
                let out = dir.path().join(if in_place { "in-place" } else { "copy" });
                std::fs::create_dir(&out).unwrap();
                let src = write_source_with(&blob, &opts, CStyle::Fast, &out, in_place).unwrap();
                let bin_len = std::fs::metadata(out.join("devc.bin")).unwrap().len();
                let text = std::fs::read_to_string(&src).unwrap();
                if in_place {
                    assert_eq!(bin_len, 11, "only the header and the tail are copied");
                    assert_eq!(text.matches(".incbin").count(), 3, "{text}");
                } else {
                    assert_eq!(bin_len, want.len() as u64);
                }
                let o = compile(&src, &opts, &out).unwrap();
                let data = std::fs::read(&o).unwrap();
                let found = mblob_runtime::elf::find_blob(&data, None).unwrap().unwrap();
                assert!(found.bytes(&data).unwrap() == want, "in place: {in_place}");
                data
            })
            .collect();
        assert!(objects[0] == objects[1], "the two objects differ");
    }

    #[test]
    fn fast_form_needs_an_elf_target() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PackOptions { target: Some("x86_64-pc-windows-msvc".into()), ..PackOptions::default() };
        let err = write_source(&vec![0u8; 16], &opts, CStyle::Fast, dir.path()).unwrap_err();
        assert!(matches!(err, Error::Target { .. }), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files left behind");
    }

    #[test]
    fn a_source_that_lies_about_its_length_leaves_no_files() {
        struct Short;
        impl BlobSource for Short {
            fn blob_len(&self) -> u64 {
                100
            }
            fn write_blob(&self, out: &mut dyn Write) -> io::Result<()> {
                out.write_all(&[1; 10])
            }
        }
        let dir = tempfile::tempdir().unwrap();
        for style in [CStyle::Fast, CStyle::Tvm] {
            let err = write_source(&Short, &PackOptions::default(), style, dir.path()).unwrap_err();
            let chain =
                format!("{err}: {}", std::error::Error::source(&err).map(|s| s.to_string()).unwrap_or_default());
            assert!(chain.contains("wrote 10 bytes but announced 100"), "{chain}");
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{style:?}: files left behind");
        }
    }
}
