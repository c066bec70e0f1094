//! tests
mod cli;
mod concurrency;
mod corrupt;
#[path = "../../examples/custom_kind.rs"]
#[allow(unsafe_code)]
mod custom_kind;
mod device;
mod export;
mod fuzz_inspect;
mod goldens;
mod inspect;
mod pack;
mod run;
mod run_relax;
mod user_kind;
