//! A payload kind defined outside mblob: a tokenizer vocabulary that ships inside the model's
//! shared library, next to the host code.
//!
//! Three steps make a kind: implement [`Payload`] (how it is written), implement [`Loader`]
//! (how long its bytes are in a classic blob, and how they become a module), and register the
//! loader. Built-in kinds (`GraphExecutorFactory`, `cuda`, ...) are added exactly this way.
//!
//! Run it with `cargo run --example custom_kind`.

use std::any::Any;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use mblob::export::Export;
use mblob_runtime::format::stream::{self, Reader};
use mblob_runtime::registry::{LoaderError, Measure};
use mblob_runtime::{load_library, Bytes, FormatError, Layout, LoadOptions, Loader, Module, Payload, Registry};

/// The type key written in front of the payload.
pub const VOCAB: &str = "example.Vocab";

/// The payload: `vec<str>` of tokens, in TVM's stream encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    pub tokens: Vec<String>,
}

impl Vocab {
    /// Reads a vocabulary from the start of `bytes`; returns it and the bytes it took.
    fn read(bytes: &[u8], base: u64) -> Result<(Vocab, u64), FormatError> {
        let mut r = Reader::new(bytes, base);
        let tokens = r.read_vec_str("tokens")?;
        Ok((Vocab { tokens }, r.offset() - base))
    }
}

impl Payload for Vocab {
    fn type_key(&self) -> &str {
        VOCAB
    }
    fn write_payload(&self, _layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        stream::write_vec_str(out, &self.tokens)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// The loaded module is the vocabulary itself.
mblob_runtime::payload_module!(Vocab);

/// The loader.
pub struct VocabLoader;

impl Loader for VocabLoader {
    fn type_key(&self) -> &str {
        VOCAB
    }
    fn measure(&self, bytes: &[u8], base: u64, _layout: Layout) -> Result<Measure, FormatError> {
        Vocab::read(bytes, base).map(|(_, n)| Measure::Len(n))
    }
    fn load(&self, payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        let (vocab, used) = Vocab::read(&payload, 0)?;
        if used != payload.len() as u64 {
            return Err("trailing bytes after the vocabulary".into());
        }
        Ok(Arc::new(vocab))
    }
}

const HOST_C: &str = "int token_count_hint(void) { return 3; }\n";

/// Exports a library whose host imports a vocabulary, then loads it back with and without the
/// loader. Returns the tokens read back.
pub fn run(dir: &Path, layout: Layout) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let host_c = dir.join("host.c");
    std::fs::write(&host_c, HOST_C)?;
    let vocab = Vocab { tokens: vec!["<s>".into(), "hello".into(), "world".into()] };
    let so = dir.join(format!("with_vocab_{}.so", layout.name()));
    let mut export = Export::new();
    export.c_source(&host_c).layout(layout).import(vocab.clone());
    export.write(&so)?;

    // Without the loader the error names the key and the loaders there are.
    // SAFETY: the library was just built from HOST_C, which has no initialisers.
    let err = unsafe { load_library(&so, &Registry::default(), &LoadOptions::default()) }.unwrap_err();
    assert!(err.to_string().contains(VOCAB), "{err}");

    let mut registry = Registry::default();
    registry.register(VocabLoader);
    // SAFETY: as above.
    let loaded = unsafe { load_library(&so, &registry, &LoadOptions::default()) }?;
    assert_eq!(loaded.type_keys(), ["library", VOCAB]);
    assert!(loaded.get_function("token_count_hint").is_some());
    let back = loaded.find::<Vocab>().ok_or("no vocabulary in the loaded tree")?;
    assert_eq!(back, &vocab);
    Ok(back.tokens.clone())
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    for layout in Layout::ALL {
        let tokens = run(dir.path(), layout)?;
        println!("{layout}: exported and loaded back a `{VOCAB}` module: {tokens:?}");
    }
    Ok(())
}
