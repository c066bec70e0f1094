//! tests
mod goldens;
mod corrupt;
