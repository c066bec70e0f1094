//! Payload modules: the modules of a tree that carry bytes (everything but the DSO part).
//!
//! A payload kind implements [`Payload`] to be written, and registers a
//! [`Loader`](crate::Loader) to be read. Built-in kinds: [`graph`] (`GraphExecutorFactory`),
//! [`device`] (CUDA, OpenCL, Vulkan-source, Metal, WebGPU), and [`Opaque`] bytes for anything
//! else (`relax.Executable`, `VMExecutable`, `AotExecutorFactory`, `metadata_module`, or a kind
//! this build does not know).

pub mod device;
pub mod graph;

use std::any::Any;
use std::fmt::Debug;
use std::io::{self, Write};

use crate::format::stream::CountingSink;
use crate::format::Layout;
use crate::Bytes;

/// A module that saves itself to bytes (TVM's `SaveToBinary` / `SaveToBytes`).
pub trait Payload: Debug + Send + Sync + Any {
    /// The type key written in front of the payload (`GraphExecutorFactory`, `cuda`, ...).
    fn type_key(&self) -> &str;

    /// Writes the payload as it appears in a blob of `layout` (without the tvm-ffi length
    /// frame, which the blob writer adds).
    fn write_payload(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()>;

    /// The number of bytes [`Payload::write_payload`] writes. The default measures by writing
    /// to a counting sink; kinds that know their size should say it.
    fn payload_len(&self, layout: Layout) -> u64 {
        let mut sink = CountingSink::default();
        match self.write_payload(layout, &mut sink) {
            Ok(()) => sink.0,
            Err(_) => 0,
        }
    }

    /// For downcasting to the concrete kind.
    fn as_any(&self) -> &dyn Any;
}

/// Payload bytes kept as they are, for kinds that are not decoded (or not known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opaque {
    /// The type key.
    pub type_key: String,
    /// The payload as it sits in the blob (inside the frame for tvm-ffi).
    pub bytes: Bytes,
}

impl Opaque {
    /// An opaque payload of kind `type_key`.
    pub fn new(type_key: impl Into<String>, bytes: impl Into<Bytes>) -> Opaque {
        Opaque { type_key: type_key.into(), bytes: bytes.into() }
    }
}

impl Payload for Opaque {
    fn type_key(&self) -> &str {
        &self.type_key
    }
    fn write_payload(&self, _layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(&self.bytes)
    }
    fn payload_len(&self, _layout: Layout) -> u64 {
        self.bytes.len() as u64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Type keys that TVM writes and mblob recognises but keeps as opaque bytes (their formats
/// belong to TVM's virtual machines and AOT executor, which mblob does not run).
pub const OPAQUE_KNOWN_KEYS: &[&str] = &[
    "relax.Executable",
    "relax.VMExecutable",
    "VMExecutable",
    "AotExecutorFactory",
    "metadata_module",
    "metadata",
    "const_loader",
];
