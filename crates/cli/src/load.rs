//! Loading a configuration from either front end.

use std::path::{Path, PathBuf};

use anyhow::Context;
use vigil_config::{nginx, system_resolver};
use vigil_core::config::Config;

/// Which front end a file is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Nginx,
    Toml,
}

/// A loaded configuration and the nginx directives it ignored.
pub(crate) struct Loaded {
    pub(crate) config: Config,
    pub(crate) ignored: Vec<(String, String)>,
    /// The main context's process directives (nginx.conf only).
    pub(crate) process: nginx::process::Process,
}

/// How a running server reads its configuration, at start and at each
/// reload: the file, its front end, nginx's `-g` directives, and
/// `--listen`'s replacement of the first listen.
#[derive(Clone, Debug)]
pub(crate) struct Loader {
    pub(crate) path: PathBuf,
    pub(crate) kind: Kind,
    /// nginx's `-g DIRECTIVES` (empty: none).
    pub(crate) globals: String,
    pub(crate) listen: Option<std::net::SocketAddr>,
}

impl Loader {
    /// Read the configuration.
    pub(crate) fn load(&self) -> anyhow::Result<Loaded> {
        let mut loaded = match self.kind {
            Kind::Nginx => {
                let l = nginx::load_file_with_globals(
                    &self.path,
                    &self.globals,
                    &system_resolver,
                    nginx::Mode::Strict,
                )?;
                Loaded {
                    config: l.config,
                    ignored: l.ignored,
                    process: l.process,
                }
            }
            Kind::Toml => load(&self.path, self.kind)?,
        };
        if let Some(addr) = self.listen {
            let Some(first) = loaded.config.servers.first_mut() else {
                anyhow::bail!(
                    "{}: no server block to apply --listen to",
                    self.path.display()
                );
            };
            match first.listen.first_mut() {
                Some(l) => l.addr = addr,
                None => first.listen.push(vigil_core::config::Listen {
                    addr,
                    default_server: false,
                    reuseport: false,
                    backlog: None,
                    ssl: false,
                    http2: false,
                }),
            }
        }
        Ok(loaded)
    }
}

impl Kind {
    /// TOML by extension, nginx.conf otherwise.
    pub(crate) fn of(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Kind::Toml,
            _ => Kind::Nginx,
        }
    }
}

/// Load `path` with the given front end.
pub(crate) fn load(path: &Path, kind: Kind) -> Result<Loaded, vigil_config::ConfigError> {
    match kind {
        Kind::Nginx => {
            let l = nginx::load_file(path, &system_resolver)?;
            Ok(Loaded {
                config: l.config,
                ignored: l.ignored,
                process: l.process,
            })
        }
        Kind::Toml => Ok(Loaded {
            config: vigil_config::toml::load_file(path, &system_resolver)?,
            ignored: Vec::new(),
            process: Default::default(),
        }),
    }
}

/// The config path and kind from `--nginx-conf` / `--config`.
pub(crate) fn pick(
    nginx_conf: Option<PathBuf>,
    config: Option<PathBuf>,
) -> anyhow::Result<(PathBuf, Kind)> {
    match (nginx_conf, config) {
        (Some(p), None) => Ok::<_, anyhow::Error>((p, Kind::Nginx)),
        (None, Some(p)) => {
            let kind = Kind::of(&p);
            Ok((p, kind))
        }
        (None, None) => anyhow::bail!("give --nginx-conf PATH or --config PATH.toml"),
        (Some(_), Some(_)) => anyhow::bail!("give only one of --nginx-conf and --config"),
    }
    .context("choosing the configuration")
}
