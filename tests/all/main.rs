//! tests
mod artifacts;
mod bad_exec;
mod cli;
mod concurrency;
mod containers;
mod corrupt;
#[path = "../../examples/custom_kind.rs"]
#[allow(unsafe_code)]
mod custom_kind;
mod detect;
mod device;
mod direct;
mod export;
mod export_faults;
mod export_options;
mod fuzz_inspect;
#[cfg(feature = "llm")]
mod generate;
mod goldens;
mod inspect;
mod inspect_more;
mod library;
#[cfg(feature = "llm")]
mod mlc;
#[cfg(feature = "llm")]
mod nometa;
mod outputs;
mod pack;
mod packing;
mod run;
mod run_more;
// Needs the `opencl` feature (on by default) for `mblob run --device opencl`.
#[cfg(feature = "opencl")]
mod run_device;
mod run_relax;
mod run_relax_args;
mod run_relay_vm;
// Blob objects for other machines come from the LLVM route (without it, a cross C compiler).
#[cfg(feature = "llvm")]
mod targets;
mod trio;
mod user_019;
mod user_027;
mod user_kind;
#[cfg(feature = "llvm")]
mod windows;
