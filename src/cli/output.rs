//! Outputs that appear whole or not at all: `run -o DIR`, `generate --logits FILE` and
//! `extract -o DIR`.
//!
//! - A directory of outputs is written into a fresh directory beside it (`.NAME.mblob-XXXXXX`)
//!   and moved into place by one rename once every file is written ([`StagedDir`]). An
//!   existing `DIR` (`run`: empty or holding only an earlier run's `out.K.npy` files; `extract`:
//!   empty) is replaced as a whole, by an atomic exchange of the two directories where the
//!   file system has one (Linux `renameat2(RENAME_EXCHANGE)`), so a reader sees either the old
//!   set or the new one, never a mix; the old one is then removed.
//! - One file is written beside itself and renamed into place ([`write_file`]).
//! - Parents of the destination that did not exist are created for the staging and removed
//!   again when the write fails, so a failure leaves nothing new behind.
//! - SIGINT and SIGTERM while the outputs are written remove what was written and end with
//!   status 130 or 143 ([`exit_code`]); a second signal ends the process at once.
//! - Files and directories get the mode the umask gives (0666 and 0777 less the umask), as any
//!   file a program creates.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use mblob_runtime::ffi::threadpool;

use crate::{Error, Result};

/// The flags SIGINT and SIGTERM set while outputs are written: (any signal, SIGTERM).
static FLAGS: OnceLock<(Arc<AtomicBool>, Arc<AtomicBool>)> = OnceLock::new();

fn flags() -> &'static (Arc<AtomicBool>, Arc<AtomicBool>) {
    FLAGS.get_or_init(|| (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false))))
}

/// The handlers of SIGINT and SIGTERM while outputs are written: the first signal sets the
/// flags, which the writers check; a second one exits at once with 128 + the signal. Removed
/// when dropped, so that a signal after the writing ends the process as it always does.
struct Handlers(Vec<signal_hook::SigId>);

impl Handlers {
    fn install() -> Handlers {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let (cancel, term) = flags();
        let mut ids = Vec::new();
        for sig in [SIGINT, SIGTERM] {
            // Without a handler a signal ends the process as it always does.
            ids.extend(signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, cancel.clone()).ok());
            ids.extend(signal_hook::flag::register(sig, cancel.clone()).ok());
        }
        ids.extend(signal_hook::flag::register(SIGTERM, term.clone()).ok());
        Handlers(ids)
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// `Err(Cancelled)` when SIGINT or SIGTERM came while outputs were written.
fn check_cancelled() -> Result<()> {
    if flags().0.load(Ordering::SeqCst) {
        return Err(Error::Cancelled { step: "writing the outputs (removed what was written)".into() });
    }
    Ok(())
}

/// The exit status of a command that failed with `e`: 130 (SIGINT) or 143 (SIGTERM) when a
/// signal cancelled the writing of its outputs, else 1.
pub(crate) fn exit_code(e: &Error) -> ExitCode {
    let (cancel, term) = flags();
    match e {
        Error::Cancelled { .. } if cancel.load(Ordering::SeqCst) => {
            ExitCode::from(if term.load(Ordering::SeqCst) { 143 } else { 130 })
        }
        _ => ExitCode::from(super::EXIT_FAILURE),
    }
}

/// A name beside `dest` for staging: `.NAME.mblob-XXXXXX` in `dest`'s parent.
fn staging_name(dest: &Path, n: u32) -> PathBuf {
    let name = dest.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    let nonce = u64::from(std::process::id()) << 32 | u64::from(n);
    let tag = format!("{:06x}", xxhash_rust::xxh3::xxh3_64(&nonce.to_le_bytes()) & 0xff_ffff);
    parent_of(dest).join(format!(".{name}.mblob-{tag}"))
}

/// `path`'s parent (`.` for a bare name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Creates the missing ancestors of `path` (not `path` itself), outermost first, and returns
/// those it created, innermost first (to remove them again).
fn create_parents(path: &Path) -> Result<Vec<PathBuf>> {
    let missing: Vec<PathBuf> = parent_of(path)
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && fs::symlink_metadata(a).is_err())
        .map(Path::to_owned)
        .collect();
    let mut created = Vec::new();
    for dir in missing.iter().rev() {
        if let Err(e) = fs::DirBuilder::new().mode(0o777).create(dir) {
            remove_dirs(&created);
            return Err(Error::io(dir, "cannot create")(e));
        }
        created.insert(0, dir.clone());
    }
    Ok(created)
}

/// Removes the (empty) directories `dirs`, innermost first.
fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs {
        let _ = fs::remove_dir(d);
    }
}

/// A directory of outputs being written beside its destination; moved into place by
/// [`StagedDir::commit`], removed (with the parents it created) when dropped before.
pub(crate) struct StagedDir {
    dest: PathBuf,
    staging: PathBuf,
    created: Vec<PathBuf>,
    done: bool,
    /// Dropped after the clean-up of `drop`.
    _handlers: Handlers,
}

impl StagedDir {
    /// Creates the staging directory beside `dest` (and `dest`'s missing parents), with the
    /// handlers of SIGINT and SIGTERM installed.
    pub(crate) fn new(dest: &Path) -> Result<StagedDir> {
        let handlers = Handlers::install();
        check_cancelled()?;
        let created = create_parents(dest)?;
        for n in 0u32.. {
            let staging = staging_name(dest, n);
            match fs::DirBuilder::new().mode(0o777).create(&staging) {
                Ok(()) => {
                    return Ok(StagedDir { dest: dest.to_owned(), staging, created, done: false, _handlers: handlers })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
                Err(e) => {
                    remove_dirs(&created);
                    return Err(Error::io(parent_of(dest), "cannot create a directory in")(e));
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// Writes the file `name` of the outputs (named in errors as it will be: `DEST/name`).
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write_with(name, &mut |w| w.write_all(bytes))
    }

    /// Writes the file `name` of the outputs as `content` writes it, through a buffer (what
    /// it writes is never all in memory at once).
    pub(crate) fn write_with(
        &self,
        name: &str,
        content: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> Result<()> {
        check_cancelled()?;
        write_new_with(&self.staging.join(name), content)
            .map_err(|(action, e)| Error::io(self.dest.join(name), action)(e))?;
        check_cancelled()
    }

    /// Moves the outputs into place: `dest` must not exist, or be a directory that
    /// `replaceable` accepts (checked again here), which is then replaced as a whole.
    pub(crate) fn commit(mut self, replaceable: impl Fn(&Path) -> Result<()>) -> Result<()> {
        check_cancelled()?;
        let dest = self.dest.clone();
        // A symbolic link to a directory: its target is replaced, the link stays.
        let dest = match fs::symlink_metadata(&dest) {
            Ok(m) if m.file_type().is_symlink() => {
                fs::canonicalize(&dest).map_err(Error::io(&dest, "cannot resolve"))?
            }
            _ => dest,
        };
        if fs::symlink_metadata(&dest).is_err() {
            fs::rename(&self.staging, &dest).map_err(Error::io(&dest, "cannot create"))?;
            self.done = true;
            return Ok(());
        }
        replaceable(&dest)?;
        let old = match exchange(&self.staging, &dest) {
            Ok(()) => self.staging.clone(),
            Err(_) => {
                // No atomic exchange on this file system: the old directory is moved aside, the
                // new one into place, and the old one back if that fails.
                let aside = staging_name(&dest, u32::MAX);
                fs::rename(&dest, &aside).map_err(Error::io(&dest, "cannot replace"))?;
                if let Err(e) = fs::rename(&self.staging, &dest) {
                    let _ = fs::rename(&aside, &dest);
                    return Err(Error::io(&dest, "cannot replace")(e));
                }
                aside
            }
        };
        self.done = true;
        fs::remove_dir_all(&old).map_err(Error::io(&old, "cannot remove the earlier outputs in"))
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.staging);
            remove_dirs(&self.created);
        }
    }
}

/// Swaps the directories `a` and `b` atomically (Linux `renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(std::io::Error::from)
}

/// Creates `path` (it must not exist) with the umask's mode and writes `bytes`; on failure the
/// file is removed. `Err` carries the action that failed.
fn write_new(path: &Path, bytes: &[u8]) -> std::result::Result<(), (&'static str, std::io::Error)> {
    write_new_with(path, &mut |w| w.write_all(bytes))
}

/// [`write_new`] of what `content` writes, through a buffer.
fn write_new_with(
    path: &Path,
    content: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> std::result::Result<(), (&'static str, std::io::Error)> {
    let f: File =
        OpenOptions::new().write(true).create_new(true).mode(0o666).open(path).map_err(|e| ("cannot create", e))?;
    let mut w = io::BufWriter::with_capacity(1 << 20, f);
    let written = content(&mut w).and_then(|()| w.flush());
    let synced = written.and_then(|()| w.get_ref().sync_data());
    if let Err(e) = synced {
        drop(w);
        let _ = fs::remove_file(path);
        return Err(("cannot write", e));
    }
    Ok(())
}

/// Writes the file `path` whole or not at all: into a new file beside it, renamed into place
/// when written (replacing an earlier file), with SIGINT and SIGTERM handled as for
/// directories. The parent must exist.
// Used by `generate` (feature `llm`).
#[cfg_attr(not(feature = "llm"), allow(dead_code))]
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let _handlers = Handlers::install();
    check_cancelled()?;
    let mut n = 0u32;
    let tmp = loop {
        let tmp = staging_name(path, n);
        match write_new(&tmp, bytes) {
            Ok(()) => break tmp,
            Err((_, e)) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err((action, e)) => return Err(Error::io(path, action)(e)),
        }
    };
    let placed = check_cancelled().and_then(|()| fs::rename(&tmp, path).map_err(Error::io(path, "cannot write")));
    if placed.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    placed
}

/// Whether `name` is an output file of `run` (`out.K.npy`, K in decimal).
fn is_run_output(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .and_then(|n| n.strip_prefix("out.")?.strip_suffix(".npy"))
        .is_some_and(|k| k.parse::<usize>().is_ok_and(|n| n.to_string() == k))
}

/// `run -o DIR`: DIR may be absent, empty, or hold an earlier run's outputs (`out.K.npy` files)
/// and nothing else, since it is replaced as a whole. Checked before the model runs, and again
/// when the outputs are moved into place.
pub(crate) fn check_run_dir(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(dir, "cannot use as the output directory")(e)),
    };
    for entry in entries {
        let entry = entry.map_err(Error::io(dir, "cannot list"))?;
        if !(is_run_output(&entry.file_name()) && entry.file_type().is_ok_and(|t| t.is_file())) {
            return Err(Error::OutputPath {
                what: dir.display().to_string(),
                detail: format!(
                    "holds {}, which is not an output of an earlier run: the outputs replace the directory as a \
                     whole, so give a new directory, an empty one or one that holds only out.K.npy files",
                    entry.file_name().to_string_lossy()
                )
                .into(),
            });
        }
    }
    Ok(())
}

/// `run -o DIR`: writes `out.0.npy`, `out.1.npy`, ... (the encoded `files`, in output order)
/// into DIR whole or not at all; an earlier run's outputs in DIR are replaced as a set.
pub(crate) fn write_run_outputs(dir: &Path, files: &[Vec<u8>]) -> Result<()> {
    check_run_dir(dir)?;
    let staged = StagedDir::new(dir)?;
    for (i, bytes) in files.iter().enumerate() {
        staged.write(&format!("out.{i}.npy"), bytes)?;
    }
    staged.commit(check_run_dir)
}

/// Prints `label: ` and the times as [`print_times`] does, or nothing when there
/// are none (the last line of `generate` stays the token ids).
// Used by `generate` (feature `llm`).
#[cfg_attr(not(feature = "llm"), allow(dead_code))]
pub(crate) fn print_labelled_times(label: &str, times: &[f64]) {
    if !times.is_empty() {
        print!("{label}: ");
        print_times(times);
    }
}

/// Prints the time per run as TVM's `time_evaluator` reports it: mean, median and min.
pub(crate) fn print_times(times: &[f64]) {
    if times.is_empty() {
        return;
    }
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let mean = times.iter().sum::<f64>() / n as f64;
    let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
    println!(
        "{n} runs, {} threads: mean {:.3} us, median {:.3} us, min {:.3} us",
        threadpool::num_threads(),
        mean * 1e6,
        median * 1e6,
        sorted[0] * 1e6
    );
}
