//! The `mblob` binary: all of it lives in [`mblob::cli`].

fn main() -> std::process::ExitCode {
    mblob::cli::main()
}
