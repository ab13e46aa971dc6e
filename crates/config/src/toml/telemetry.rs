//! `[telemetry]` → [`TelemetryConfig`] and back: where to send
//! OpenTelemetry metrics and traces (OTLP over HTTP), under which service
//! name, and how often metrics go out.

use super::at::At;
use super::raw::RawTelemetry;
use crate::ConfigError;
use vigil_core::config::value::format_time;
use vigil_core::config::TelemetryConfig;

/// Check `[telemetry]`; absent means export off.
pub(super) fn build(
    raw: Option<&RawTelemetry>,
    at: &At<'_>,
) -> Result<TelemetryConfig, ConfigError> {
    let mut t = TelemetryConfig::default();
    let Some(raw) = raw else {
        return Ok(t);
    };
    if let Some(url) = &raw.otlp_endpoint {
        check_endpoint(url).map_err(|m| at.key("otlp_endpoint").err(m))?;
        t.otlp_endpoint = Some(url.clone());
    }
    if let Some(name) = &raw.service_name {
        if name.trim().is_empty() {
            return Err(at.key("service_name").err("service_name must not be empty"));
        }
        t.service_name = name.clone();
    }
    if let Some(text) = &raw.export_interval {
        let at = at.key("export_interval");
        let d = at.time(text)?;
        if d.is_zero() {
            return Err(at.err("export_interval must be longer than 0"));
        }
        t.export_interval = d;
    }
    Ok(t)
}

/// The keys that differ from the defaults (None when all are defaults).
pub(super) fn emit(t: &TelemetryConfig) -> Option<RawTelemetry> {
    let d = TelemetryConfig::default();
    (*t != d).then(|| RawTelemetry {
        otlp_endpoint: t.otlp_endpoint.clone(),
        service_name: (t.service_name != d.service_name).then(|| t.service_name.clone()),
        export_interval: (t.export_interval != d.export_interval)
            .then(|| format_time(t.export_interval)),
    })
}

/// `http://HOST[:PORT][/path]`: the exporter speaks plain HTTP only.
fn check_endpoint(url: &str) -> Result<(), String> {
    const EXPECTED: &str = "expected http://HOST[:PORT][/path], e.g. \"http://127.0.0.1:4318\"";
    if url.starts_with("https://") {
        return Err(format!(
            "\"{url}\": https is not supported by the OTLP exporter yet; {EXPECTED} (a collector on the same host or network)"
        ));
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!("invalid otlp_endpoint \"{url}\", {EXPECTED}"));
    };
    if url.contains(|c: char| c.is_whitespace() || c == '?' || c == '#') {
        return Err(format!(
            "invalid otlp_endpoint \"{url}\": no spaces, query or fragment; {EXPECTED}"
        ));
    }
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') || h.ends_with(']') => {
            if port.parse::<u16>().ok().filter(|p| *p != 0).is_none() {
                return Err(format!(
                    "invalid port in otlp_endpoint \"{url}\", {EXPECTED}"
                ));
            }
            h
        }
        _ => authority,
    };
    if host.is_empty() || host.contains('@') {
        return Err(format!(
            "invalid otlp_endpoint \"{url}\": no host, {EXPECTED}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::literal_resolver;
    use crate::toml::{load_str, to_toml_string};
    use vigil_core::config::{Config, TelemetryConfig};

    fn load(src: &str) -> Result<Config, String> {
        load_str(src, "t.toml".as_ref(), &literal_resolver).map_err(|e| e.to_string())
    }

    #[test]
    fn absent_table_is_off_with_defaults() {
        let c = load("").expect("empty config");
        assert_eq!(c.telemetry, TelemetryConfig::default());
        assert!(!c.telemetry.is_enabled());
        assert_eq!(c.telemetry.service_name, "vigil");
        assert_eq!(c.telemetry.export_interval, Duration::from_secs(10));
    }

    #[test]
    fn table_is_read_and_round_trips() {
        let c = load(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nservice_name = \"edge\"\nexport_interval = \"30s\"\n",
        )
        .expect("config");
        assert_eq!(
            c.telemetry,
            TelemetryConfig {
                otlp_endpoint: Some("http://127.0.0.1:4318".into()),
                service_name: "edge".into(),
                export_interval: Duration::from_secs(30),
            }
        );
        let text = to_toml_string(&c);
        assert!(text.contains("[telemetry]"), "{text}");
        assert_eq!(load(&text).expect("reload"), c);
    }

    #[test]
    fn defaults_are_not_written() {
        let mut c = Config::default();
        assert!(!to_toml_string(&c).contains("telemetry"));
        c.telemetry.otlp_endpoint = Some("http://collector:4318/otlp".into());
        let text = to_toml_string(&c);
        assert_eq!(
            text.trim(),
            "[telemetry]\notlp_endpoint = \"http://collector:4318/otlp\""
        );
        assert_eq!(load(&text).expect("reload"), c);
    }

    #[test]
    fn bad_values_name_the_field() {
        for (src, want) in [
            (
                "otlp_endpoint = \"https://c:4318\"",
                "telemetry.otlp_endpoint: \"https://c:4318\": https is not supported",
            ),
            (
                "otlp_endpoint = \"c:4318\"",
                "telemetry.otlp_endpoint: invalid otlp_endpoint",
            ),
            ("otlp_endpoint = \"http://\"", "no host"),
            ("otlp_endpoint = \"http://c:0\"", "invalid port"),
            (
                "otlp_endpoint = \"http://c:4318?x=1\"",
                "no spaces, query or fragment",
            ),
            (
                "service_name = \" \"",
                "telemetry.service_name: service_name must not be empty",
            ),
            (
                "export_interval = \"0s\"",
                "telemetry.export_interval: export_interval must be longer than 0",
            ),
            (
                "export_interval = \"10\"",
                "telemetry.export_interval: invalid time \"10\", expected a unit",
            ),
            ("endpoint = \"http://c\"", "unknown field `endpoint`"),
        ] {
            let err = load(&format!("[telemetry]\n{src}\n")).expect_err(src);
            assert!(err.contains(want), "{src}: {err}");
        }
    }

    #[test]
    fn ipv6_and_paths_are_accepted() {
        for url in [
            "http://[::1]:4318",
            "http://collector",
            "http://c:4318/prefix/",
        ] {
            let c = load(&format!("[telemetry]\notlp_endpoint = \"{url}\"\n"))
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.telemetry.otlp_endpoint.as_deref(), Some(url));
        }
    }
}
