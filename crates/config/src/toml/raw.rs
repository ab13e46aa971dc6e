//! The TOML schema as written: serde structs that mirror the file, every
//! key optional where the model has a default. Nothing here is checked
//! beyond its TOML type; [`super::build`] turns these into the model.

use serde::{Deserialize, Serialize};

use super::forms::{RawAccessLog, RawHeaderBuffers, RawListen};
use super::ordered::Ordered;

/// A whole `vigil.toml`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    /// nginx's `worker_shutdown_timeout`: the bound on a graceful stop;
    /// absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker_shutdown_timeout: Option<String>,
    /// `[admin]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) admin: Option<RawAdmin>,
    /// `[upstream.NAME]`, in file order.
    #[serde(default, skip_serializing_if = "Ordered::is_empty")]
    pub(crate) upstream: Ordered<RawUpstream>,
    /// `[[server]]`, in file order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) server: Vec<RawServer>,
    /// `[telemetry]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) telemetry: Option<RawTelemetry>,
    /// `[fleet]`: read by the binary (fleet mode), not by core.
    #[serde(default, skip_serializing)]
    pub(crate) fleet: Option<::toml::Table>,
}

/// `[telemetry]`: OpenTelemetry export.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    /// OTLP/HTTP base URL (`http://HOST:PORT`); absent: no export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) otlp_endpoint: Option<String>,
    /// `service.name`, default `vigil`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) service_name: Option<String>,
    /// Time between metric exports, default `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) export_interval: Option<String>,
}

/// `[admin]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    /// Listen address, default `127.0.0.1:9901`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<String>,
    /// Bearer token for write endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// The dashboard on `GET /`, default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dashboard: Option<bool>,
    /// Host names a request's `Host` may name besides addresses and
    /// `localhost`, default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hosts: Option<Vec<String>>,
}

/// `[upstream.NAME]`: nginx's `upstream NAME {}` block.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    /// `round_robin` (default), `least_conn`, `ip_hash`, `random`, `random_two`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) balancer: Option<String>,
    /// `hash KEY`: sets the hash balancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hash: Option<String>,
    /// `hash KEY consistent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) consistent: Option<bool>,
    /// `keepalive N`: idle connections kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keepalive: Option<u32>,
    /// `keepalive_timeout`, default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keepalive_timeout: Option<String>,
    /// `keepalive_requests`, default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keepalive_requests: Option<u32>,
    /// `zone NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) zone: Option<String>,
    /// `[[upstream.NAME.server]]`, in order.
    #[serde(default)]
    pub(crate) server: Vec<RawPeer>,
    /// `[upstream.NAME.check]`: tengine's `check` family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) check: Option<RawCheck>,
    /// `passive_count`: `["after_header"]`, `["last_try"]` or both (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) passive_count: Option<Vec<String>>,
    /// `passive_recovery`: `"window"` (default), `"probe"`, `"probation=N"` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) passive_recovery: Option<String>,
    /// `passive_penalty`: `{ base = "10s", max = "5m", jitter = "10%" }` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) passive_penalty: Option<RawPenalty>,
    /// `retry_budget`: `{ ratio = "20%", min = "10/s" }` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retry_budget: Option<RawRetryBudget>,
    /// `hedge`: `{ after = "50ms", max = 1 }` or `{ after = "p95" }` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hedge: Option<RawHedge>,
    /// `max_ejected`: `"50%"` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_ejected: Option<String>,
    /// `eject_stuck`: `{ factor = 3, min = "25ms" }` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) eject_stuck: Option<RawEjectStuck>,
    /// `eject_slow`: `{ factor = 3, window = "10s", min_requests = 20, min = "10ms" }` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) eject_slow: Option<RawEjectSlow>,
    /// `health_preset`: `"recommended"` (vigil only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) health_preset: Option<String>,
}

/// `eject_stuck = { factor, min }`: each key defaults to the preset's value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEjectStuck {
    /// K, a number from 1 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) factor: Option<f64>,
    /// T, a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min: Option<String>,
}

/// `eject_slow = { factor, window, min_requests, min, max }`: each key
/// defaults to the preset's value (`max`: none).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEjectSlow {
    /// K, a number above 1, at most 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) factor: Option<f64>,
    /// The window, a time of at least 100ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) window: Option<String>,
    /// N, 1 to 1000000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min_requests: Option<u32>,
    /// The figure at or below which a peer is never slow, a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min: Option<String>,
    /// The figure above which a peer is slow whatever the others', a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max: Option<String>,
}

/// `retry_budget = { ratio, min }`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetryBudget {
    /// `"R%"` of the requests.
    pub(crate) ratio: String,
    /// `"N/s"` whatever the ratio.
    pub(crate) min: String,
}

/// `hedge = { after, max }`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHedge {
    /// `"50ms"` or `"p95"`.
    pub(crate) after: String,
    /// Hedges per request, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max: Option<i64>,
}

/// `passive_penalty = { base, max, jitter }`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPenalty {
    /// The first exclusion's length.
    pub(crate) base: String,
    /// The longest exclusion, and the clean period that resets the growth.
    pub(crate) max: String,
    /// `"P%"`, default `"0%"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) jitter: Option<String>,
}

/// `[[upstream.NAME.server]]`: one `server ADDRESS [params]` line.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPeer {
    /// `host:port`, `ip:port` or `[v6]:port`; port 80 when absent.
    pub(crate) address: String,
    /// `weight=`, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight: Option<u32>,
    /// `max_fails=`, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_fails: Option<u32>,
    /// `fail_timeout=`, default `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fail_timeout: Option<String>,
    /// `max_conns=`, default 0 (no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_conns: Option<u32>,
    /// `backup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) backup: Option<bool>,
    /// `down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) down: Option<bool>,
    /// `slow_start=` (nginx Plus): weight ramp after a readmission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) slow_start: Option<String>,
}

/// `[upstream.NAME.check]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCheck {
    /// `tcp` (default), `http`, `https`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    /// Default `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) interval: Option<String>,
    /// Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rise: Option<u32>,
    /// Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fall: Option<u32>,
    /// Default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<String>,
    /// Probe this port instead of the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) port: Option<u32>,
    /// `up`, `down` (default), `first-result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) initial: Option<String>,
    /// Default `0s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) jitter: Option<String>,
    /// `check_http_send`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send: Option<String>,
    /// `check_http_expect_alive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expect: Option<Vec<String>>,
    /// Substring the body must contain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body_contains: Option<String>,
}

/// `proxy_set_header NAME VALUE`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSetHeader {
    /// Header name.
    pub(crate) name: String,
    /// Value with nginx variables; empty removes the header.
    pub(crate) value: String,
}

/// `add_header NAME VALUE [always]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAddHeader {
    /// Header name.
    pub(crate) name: String,
    /// Value with nginx variables.
    pub(crate) value: String,
    /// Also on error statuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) always: Option<bool>,
}

/// Calls `$m! { ARGS keys { ... } }` with the proxy keys a `[[server]]` and a
/// `[[server.location]]` share, so the list is written once.
macro_rules! proxy_keys {
    ($m:ident ! { $($args:tt)* }) => {
        $m! { $($args)* keys {
            /// `proxy_next_upstream`: failure classes, or `["off"]`.
            next_upstream: Vec<String>,
            /// `proxy_next_upstream_tries`, default 0 (no limit).
            next_upstream_tries: u32,
            /// `proxy_next_upstream_timeout`, default `0s` (none).
            next_upstream_timeout: String,
            /// `proxy_connect_timeout`, default `60s`.
            connect_timeout: String,
            /// `proxy_send_timeout`, default `60s`.
            send_timeout: String,
            /// `proxy_read_timeout`, default `60s`.
            read_timeout: String,
            /// `proxy_request_buffering`, default true.
            request_buffering: bool,
            /// `proxy_ignore_client_abort`, default false.
            ignore_client_abort: bool,
            /// `proxy_buffering`, default true.
            buffering: bool,
            /// `proxy_http_version`: `"1.0"` (default) or `"1.1"`.
            http_version: String,
            /// `proxy_set_header` list; present replaces the inherited list.
            set_header: Vec<RawSetHeader>,
            /// `add_header` list; present replaces the inherited list.
            add_header: Vec<RawAddHeader>,
            /// `client_max_body_size`, default `1m`.
            client_max_body_size: String,
            /// `proxy_ssl_verify`, default true.
            ssl_verify: bool,
            /// `proxy_ssl_server_name`, default true.
            ssl_server_name: bool,
            /// `proxy_ssl_trusted_certificate`.
            ssl_trusted_certificate: String,
            /// `access_log`: `"off"`, a path, or `{ path, format }`.
            access_log: RawAccessLog,
            /// nginx's `client_body_timeout`, default `60s`.
            client_body_timeout: String,
            /// nginx's `send_timeout` (to the client), default `60s`.
            client_send_timeout: String,
            /// nginx's `keepalive_timeout` (client connections), default `75s`; `0s` disables.
            client_keepalive_timeout: String,
        } }
    };
}

/// Defines a table struct: `head` fields, then the proxy keys (all
/// optional), then `tail` fields; plus `proxy()` and `set_proxy()`.
macro_rules! table_with_proxy_keys {
    (
        $(#[$meta:meta])* $name:ident
        { $( $(#[$hm:meta])* $head:ident : $hty:ty, )* }
        { $( $(#[$tm:meta])* $tail:ident : $tty:ty, )* }
        keys { $( $(#[$km:meta])* $key:ident : $kty:ty, )* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub(crate) struct $name {
            $( $(#[$hm])* pub(crate) $head: $hty, )*
            $(
                $(#[$km])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub(crate) $key: Option<$kty>,
            )*
            $( $(#[$tm])* pub(crate) $tail: $tty, )*
        }

        impl $name {
            /// The proxy keys of this table.
            #[allow(dead_code)]
            pub(crate) fn proxy(&self) -> RawProxy {
                RawProxy { $( $key: self.$key.clone(), )* }
            }

            /// Replace the proxy keys of this table.
            #[allow(dead_code)]
            pub(crate) fn set_proxy(&mut self, p: RawProxy) {
                $( self.$key = p.$key; )*
            }
        }
    };
}

proxy_keys!(table_with_proxy_keys! {
    /// The proxy keys alone, as a server or location gives them.
    RawProxy {} {}
});

proxy_keys!(table_with_proxy_keys! {
    /// `[[server]]`: nginx's `server {}` block. Its proxy keys are defaults
    /// for its locations.
    RawServer
    {
        /// `listen`: addresses, or tables with parameters; default `0.0.0.0:80`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        listen: Vec<RawListen>,
        /// `server_name`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        server_name: Vec<String>,
        /// nginx's `client_header_timeout`, default `60s`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_header_timeout: Option<String>,
        /// nginx's `large_client_header_buffers`: `"4 8k"` (default) or
        /// `{ number = 4, size = "8k" }`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        large_client_header_buffers: Option<RawHeaderBuffers>,
        /// nginx's `underscores_in_headers`, default false.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        underscores_in_headers: Option<bool>,
        /// nginx's `ignore_invalid_headers`, default true.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ignore_invalid_headers: Option<bool>,
        /// nginx's `merge_slashes`, default true.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        merge_slashes: Option<bool>,
        /// nginx's server-level `return`.
        #[serde(rename = "return", default, skip_serializing_if = "Option::is_none")]
        ret: Option<RawReturn>,
    }
    {
        /// `[[server.location]]`, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        location: Vec<RawLocation>,
    }
});

proxy_keys!(table_with_proxy_keys! {
    /// `[[server.location]]`: nginx's `location {}` block.
    RawLocation
    {
        /// The path.
        path: String,
        /// `prefix` (default), `exact` (`=`), `prefix_no_regex` (`^~`).
        #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
        matcher: Option<String>,
        /// `proxy_pass`: `http(s)://UPSTREAM[/uri]`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proxy_pass: Option<String>,
        /// nginx's `return` in a location.
        #[serde(rename = "return", default, skip_serializing_if = "Option::is_none")]
        ret: Option<RawReturn>,
    }
    {}
});

/// `return = { code = 301, text = "https://$host$request_uri" }`: nginx's
/// `return CODE [TEXT|URL]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReturn {
    /// The status, 0 to 999 (444 closes the connection).
    pub(crate) code: u16,
    /// The body, or the URL of a redirecting code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    /// nginx's `default_type` for the text, default `text/plain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) content_type: Option<String>,
}
