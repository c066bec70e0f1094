//! Payload modules: the modules of a tree that carry bytes (everything but the DSO part).
//!
//! A payload kind implements [`Payload`] to be written, and registers a
//! [`Loader`](crate::registry::Loader) to be read. Built-in kinds: [`graph`]
//! (`GraphExecutorFactory`), [`device`] (CUDA, OpenCL, Vulkan-source, Metal, WebGPU),
//! [`relax`] (`relax.Executable`, `relax.VMExecutable`), `relay_vm` (`VMExecutable`, with the
//! `relay-vm` feature), and
//! [`RawPayload`] bytes for anything else (`AotExecutorFactory`, `metadata_module`, or a kind
//! this build does not know).

pub mod device;
pub mod graph;
pub mod relax;
#[cfg(feature = "relay-vm")]
pub mod relay_vm;

use std::any::Any;
use std::fmt::Debug;
use std::io::{self, Write};
use std::sync::Arc;

use crate::bytes::Bytes;
use crate::format::stream::CountingSink;
use crate::format::{EntryPayload, Layout};

/// A module that saves itself to bytes (TVM's `SaveToBinary` / `SaveToBytes`).
pub trait Payload: Debug + Send + Sync + Any {
    /// The type key written in front of the payload (`GraphExecutorFactory`, `cuda`, ...).
    fn type_key(&self) -> &str;

    /// Writes the payload as it appears in a blob of `layout` (without the tvm-ffi length
    /// frame, which the blob writer adds).
    fn write_payload(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()>;

    /// The number of bytes [`Payload::write_payload`] writes. The default measures by writing
    /// to a counting sink, and fails as the writer does; kinds that know their size should say
    /// it.
    fn payload_len(&self, layout: Layout) -> io::Result<u64> {
        let mut sink = CountingSink::default();
        self.write_payload(layout, &mut sink)?;
        Ok(sink.0)
    }

    /// For downcasting to the concrete kind.
    fn as_any(&self) -> &dyn Any;
}

/// The blob writers write a tree's payload modules through this.
impl EntryPayload for Arc<dyn Payload> {
    fn entry_key(&self) -> &str {
        self.type_key()
    }
    fn entry_len(&self, layout: Layout) -> io::Result<u64> {
        self.payload_len(layout)
    }
    fn write_entry(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        self.write_payload(layout, out)
    }
}

/// Payload bytes kept as they are, for kinds that are not decoded (TVM's executables) or not
/// known to the registry of a load that keeps unknown kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPayload {
    /// The type key.
    pub type_key: String,
    /// The payload as it sits in the blob (inside the frame for tvm-ffi).
    pub bytes: Bytes,
}

impl RawPayload {
    /// Raw payload bytes of kind `type_key`.
    pub fn new(type_key: impl Into<String>, bytes: impl Into<Bytes>) -> RawPayload {
        RawPayload { type_key: type_key.into(), bytes: bytes.into() }
    }
}

impl Payload for RawPayload {
    fn type_key(&self) -> &str {
        &self.type_key
    }
    fn write_payload(&self, _layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        self.bytes.write_to(out)
    }
    fn payload_len(&self, _layout: Layout) -> io::Result<u64> {
        Ok(self.bytes.len() as u64)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Type keys that TVM writes and mblob recognises, registered as raw bytes by default (the
/// executables among them are then decoded by their own loaders, registered after these).
pub const RAW_KNOWN_KEYS: &[&str] = &[
    "relax.Executable",
    "relax.VMExecutable",
    "VMExecutable",
    "AotExecutorFactory",
    "metadata_module",
    "metadata",
    "const_loader",
];
