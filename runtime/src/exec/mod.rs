//! Executors: what runs a loaded model (TVM's graph executor, the AOT executor, the Relax
//! virtual machine). Each lives in its own file or folder here, on top of the module tree
//! ([`crate::module`]), the payload codecs ([`crate::payload`]) and the FFI edge
//! ([`crate::ffi`]). None is here yet.
