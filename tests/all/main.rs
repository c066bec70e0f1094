//! tests
mod goldens;
