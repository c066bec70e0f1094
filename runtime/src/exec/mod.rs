//! Executors: run a loaded model. [`graph`] is TVM's graph executor, [`aot`] its AOT executor
//! (packed interface); both take and give [`Tensor`](crate::payload::graph::Tensor)s.
