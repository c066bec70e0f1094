//! tests
mod goldens;
mod corrupt;
mod inspect;
mod concurrency;
mod device;
mod export;
mod cli;
