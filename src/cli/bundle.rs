//! `mblob bundle`: one static archive of several system-lib models (MLC's `package` step).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::export::write_bundle;
use crate::Result;

/// Arguments of `mblob bundle`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Each input is one model built as a system library with its own prefix: TVM's or mblob's
`.tar` (export_library(\"x.tar\"), MLC's `*-android.tar` / `*-iphone.tar`), a static archive
(`pack -o X.a`) or a blob object with its host objects in an archive. The bundle holds every
object of every input, in order (what MLC's `package` step makes with TVM's create_staticlib:
`libmodel_android.a`, `libmodel_iphone.a`); a program linking it finds each model by its prefix.
Refused before anything is written: an input that is not one system-lib model, two models with
one prefix, objects of two formats. `inspect` and `extract` list the models of a bundle.
Exit status: 0 done, 1 error (nothing written), 2 usage error.")]
pub struct BundleArgs {
    /// The static archive to write (`.a`; BSD format for Mach-O objects, GNU otherwise).
    #[arg(short, long, value_name = "OUT.a")]
    pub output: PathBuf,
    /// The models.
    #[arg(required = true, value_name = "MODEL")]
    pub inputs: Vec<PathBuf>,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Runs `mblob bundle`.
pub fn run(args: &BundleArgs) -> Result<ExitCode> {
    let models = write_bundle(&args.inputs, &args.output)?;
    if !args.quiet {
        println!("wrote {} ({} models)", args.output.display(), models.len());
        for m in &models {
            println!("  {:<32} {} ({})", m.prefix, m.symbol, m.members.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
