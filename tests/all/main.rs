//! tests
mod cli;
mod concurrency;
mod corrupt;
#[path = "../../examples/custom_kind.rs"]
#[allow(unsafe_code)]
mod custom_kind;
mod device;
mod direct;
mod export;
mod export_faults;
mod export_options;
mod fuzz_inspect;
mod goldens;
mod inspect;
mod pack;
mod user_kind;
