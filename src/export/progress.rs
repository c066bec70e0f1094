//! What an export tells its caller while it runs ([`Progress`]), and the blob source that
//! counts the bytes packed and stops when the export is cancelled. (The pages of mapped
//! payloads are let go of as they are written by the payloads themselves:
//! [`mblob_runtime::Bytes::write_to`].)

use std::io::{self, Write};
use std::time::Instant;

use crate::pack::BlobSource;
use crate::tool::ToolContext;

/// What [`super::Export::progress`] is told while an export runs.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// A stage begins: `serialize`, `compile`, `pack`, then `link` (or `tar`); on the direct
    /// route (the default) `link` comes before `pack`, which writes the blob into the linked
    /// library.
    Started {
        /// The stage.
        stage: &'static str,
    },
    /// Bytes of the blob written so far while packing, about once per 1 % (only for blobs
    /// of [`Progress::REPORTED_BLOB`] bytes or more).
    Packed {
        /// Bytes written.
        done: u64,
        /// Bytes of the blob.
        total: u64,
    },
    /// A stage ended.
    Finished {
        /// The stage.
        stage: &'static str,
        /// What it did (`1 modules, blob 512.0 MiB`, `512.0 MiB through llvm`, the output).
        detail: &'a str,
        /// Seconds it took.
        seconds: f64,
    },
}

impl Progress<'_> {
    /// Blobs from this size on report [`Progress::Packed`] (smaller ones pack in moments).
    pub const REPORTED_BLOB: u64 = 16 << 20;
}

impl std::fmt::Display for Progress<'_> {
    /// `pack: 512.0 MiB through llvm (1.20 s)`, `pack: 1.2 GiB of 2.5 GiB (48 %)`, `link...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Progress::Started { stage } => write!(f, "{stage}..."),
            Progress::Packed { done, total } => write!(
                f,
                "pack: {} of {} ({} %)",
                human_size(done),
                human_size(total),
                done.saturating_mul(100).checked_div(total).unwrap_or(100)
            ),
            Progress::Finished { stage, detail, seconds } => write!(f, "{stage}: {detail} ({seconds:.2} s)"),
        }
    }
}

/// The callback of [`super::Export::progress`]: exports run on any thread.
pub(crate) type ProgressFn = Box<dyn Fn(Progress<'_>) + Send + Sync>;

/// The stages of one export as they run: reports their start and end to the callback and
/// keeps their times for the report.
pub(crate) struct Stages<'a> {
    report: Option<&'a (dyn Fn(Progress<'_>) + Send + Sync)>,
    pub(crate) times: Vec<(&'static str, f64)>,
    /// The stage running (or the last one run).
    pub(crate) current: &'static str,
}

impl<'a> Stages<'a> {
    pub(crate) fn new(report: Option<&'a (dyn Fn(Progress<'_>) + Send + Sync)>) -> Stages<'a> {
        Stages { report, times: Vec::new(), current: "start" }
    }

    pub(crate) fn report(&self, p: Progress<'_>) {
        if let Some(f) = self.report {
            f(p);
        }
    }

    /// Runs one stage: `f` returns its result and the detail line of its end.
    pub(crate) fn run<T>(
        &mut self,
        stage: &'static str,
        f: impl FnOnce(&Stages<'a>) -> crate::Result<(T, String)>,
    ) -> crate::Result<T> {
        let _span = tracing::info_span!("stage", stage).entered();
        let start = Instant::now();
        self.current = stage;
        tracing::debug!("started");
        self.report(Progress::Started { stage });
        let (value, detail) = f(self)?;
        let seconds = start.elapsed().as_secs_f64();
        self.times.push((stage, seconds));
        self.report(Progress::Finished { stage, detail: &detail, seconds });
        Ok(value)
    }
}

/// A blob source that writes in steps of about 1 % (at least 64 KiB), reporting the bytes
/// written (when asked to) and failing once the export's
/// cancel flag is set (see [`ToolContext`]).
pub(crate) struct Watched<'a> {
    pub(crate) inner: &'a dyn BlobSource,
    pub(crate) len: u64,
    pub(crate) report: Option<&'a (dyn Fn(Progress<'_>) + Send + Sync)>,
}

impl BlobSource for Watched<'_> {
    fn blob_len(&self) -> u64 {
        self.len
    }
    fn write_blob(&self, out: &mut dyn Write) -> io::Result<()> {
        let total = self.len;
        let step = (total / 100).max(1);
        let report = self.report.filter(|_| total >= Progress::REPORTED_BLOB);
        let mut w = WatchedWriter { out, done: 0, next: step, step, total, report };
        self.inner.write_blob(&mut w)
    }
}

struct WatchedWriter<'a> {
    out: &'a mut dyn Write,
    done: u64,
    next: u64,
    step: u64,
    total: u64,
    report: Option<&'a (dyn Fn(Progress<'_>) + Send + Sync)>,
}

impl Write for WatchedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if ToolContext::cancelled() {
            // Not `Interrupted`: `write_all` would retry it.
            return Err(io::Error::other("the export was cancelled"));
        }
        // A payload comes in one call; taking a step at a time lets the count move (the
        // caller's `write_all` loops), at a cost of a hundred calls per blob.
        let chunk = usize::try_from(self.step).unwrap_or(usize::MAX).max(64 << 10);
        let n = self.out.write(&buf[..buf.len().min(chunk)])?;
        self.done += n as u64;
        if self.done >= self.next || (self.done == self.total && n > 0) {
            self.next = self.done + self.step;
            if let Some(report) = self.report {
                report(Progress::Packed { done: self.done, total: self.total });
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// `512.0 MiB`, `12.3 KiB`, `100 B`.
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}
