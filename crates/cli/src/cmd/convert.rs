//! `vigil convert`: print the vigil TOML equivalent of an nginx.conf.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use vigil_config::{nginx, system_resolver};

/// Arguments of `vigil convert`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  vigil convert /etc/nginx/nginx.conf > vigil.toml")]
pub(crate) struct Args {
    /// The nginx.conf to convert.
    path: PathBuf,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let loaded = nginx::load_file(&args.path, &system_resolver)?;
    let lost = vigil_config::convert::untranslatable(&loaded.config);
    if !lost.is_empty() {
        anyhow::bail!(
            "the TOML schema cannot express these (keep the nginx.conf for vigil serve):\n  {}",
            lost.join("\n  ")
        );
    }
    let text = vigil_config::convert::nginx_to_toml(&loaded);
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
