//! The native TOML front end: `vigil.toml` → the typed model.
//!
//! Two steps: the file is read into serde structs that mirror it
//! (`deny_unknown_fields`: a misspelt key is an error, never ignored), then
//! checked into the model with the same rules as the nginx.conf front end.
//! Every error names the field (`vigil.toml: upstream.api.server[1].weight:
//! ...`). Key names are nginx's directive names without `proxy_`;
//! durations are strings with nginx's units (`"10s"`, `"500ms"`), sizes
//! too (`"1m"`). `docs/configuration-toml.md` describes the schema.
//!
//! [`to_toml_string`] writes a model back as TOML (what `vigil convert` prints).

mod at;
mod emit;
mod errpath;
mod forms;
mod http;
mod ordered;
mod origins;
mod raw;
mod telemetry;
mod upstream;

use std::net::SocketAddr;
use std::path::Path;

use crate::addr::Use;
use crate::{ConfigError, Resolver};
use at::At;
use raw::{RawAdmin, RawConfig};
use vigil_core::config::{AdminConfig, Config};

/// Read and check a `vigil.toml` (a regular file of at most 16 MiB, see
/// [`crate::read`]).
pub fn load_file(path: &Path, resolve: Resolver<'_>) -> Result<Config, ConfigError> {
    let io = |source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bytes = crate::read::read_regular_file(path).map_err(io)?;
    let src = String::from_utf8(bytes)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    load_str(&src, path, resolve)
}

/// Check TOML text said to come from `file` (named in errors).
pub fn load_str(src: &str, file: &Path, resolve: Resolver<'_>) -> Result<Config, ConfigError> {
    let raw: RawConfig = ::toml::from_str(src).map_err(|e| errpath::toml_error(src, file, &e))?;
    let name = file.display().to_string();
    let mut config = build(&raw, &At::root(&name), resolve)?;
    origins::fill(&mut config, src, file);
    Ok(config)
}

/// The model as `vigil.toml` text that [`load_str`] reads back into an
/// equal [`Config`] (given a resolver that maps each address as before).
/// Settings at their defaults are left out.
///
/// Durations are written in milliseconds at the finest; a model holding
/// sub-millisecond durations (neither front end makes one) loses them.
pub fn to_toml_string(config: &Config) -> String {
    let raw = emit::config(config);
    match ::toml::to_string(&raw) {
        Ok(text) => text,
        // The schema has only strings, integers, booleans, tables and
        // arrays, which always serialize; should that ever break, the
        // output must not load as an empty configuration.
        Err(e) => format!(
            "# vigil could not write this configuration: {e}\nerror = \"serialization failed\"\n"
        ),
    }
}

/// The raw document → the model.
fn build(raw: &RawConfig, at: &At<'_>, resolve: Resolver<'_>) -> Result<Config, ConfigError> {
    let mut config = Config {
        admin: admin(raw.admin.as_ref(), &at.key("admin"), resolve)?,
        telemetry: telemetry::build(raw.telemetry.as_ref(), &at.key("telemetry"))?,
        shutdown_timeout: match &raw.worker_shutdown_timeout {
            Some(t) => Some(at.key("worker_shutdown_timeout").time(t)?),
            None => None,
        },
        ..Config::default()
    };
    for (name, u) in &raw.upstream.0 {
        let up = upstream::upstream(name, u, &at.key("upstream").key(name), resolve)?;
        config.upstreams.push(up);
    }
    // Servers after upstreams: a proxy_pass may name any of them.
    let mut cx = http::Cx {
        resolve,
        upstreams: &mut config.upstreams,
        listens: Default::default(),
    };
    let mut servers = Vec::new();
    for (i, s) in raw.server.iter().enumerate() {
        servers.push(http::server(&mut cx, s, &at.key("server").index(i))?);
    }
    config.servers = servers;
    Ok(config)
}

fn admin(
    raw: Option<&RawAdmin>,
    at: &At<'_>,
    resolve: Resolver<'_>,
) -> Result<AdminConfig, ConfigError> {
    let Some(raw) = raw else {
        return Ok(AdminConfig::default());
    };
    let listen: Option<SocketAddr> = match &raw.listen {
        Some(text) => Some(
            at.key("listen")
                .resolve(resolve, text, 9901, Use::Upstream)?,
        ),
        None => None,
    };
    if raw.token.as_deref() == Some("") {
        return Err(at.key("token").err("the admin token must not be empty"));
    }
    if let Some(addr) = listen {
        if !addr.ip().is_loopback() && raw.token.is_none() {
            return Err(at.key("token").err(format!(
                "admin.listen {addr} is not a loopback address: set a token so that write endpoints are not open to the network"
            )));
        }
    }
    let hosts = raw
        .hosts
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, h)| AdminConfig::host_name(h).map_err(|e| at.key("hosts").index(i).err(e)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AdminConfig {
        listen,
        token: raw.token.clone(),
        dashboard: raw.dashboard.unwrap_or(true),
        hosts,
    })
}
