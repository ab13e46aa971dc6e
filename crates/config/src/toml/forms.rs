//! Keys that take either a short form (a string) or a table: `listen`,
//! `access_log` and `large_client_header_buffers`. Deserialized by hand so each form keeps serde's precise
//! errors and `deny_unknown_fields`.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One `listen` entry: `"127.0.0.1:8080"` (a bare port means `0.0.0.0:PORT`)
/// or `{ addr = "...", default_server = true, reuseport = true, backlog = 511 }`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RawListen {
    /// Address only.
    Addr(String),
    /// Address with parameters.
    Table(RawListenTable),
}

/// The table form of a `listen` entry.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListenTable {
    /// The address.
    pub(crate) addr: String,
    /// `default_server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) default_server: Option<bool>,
    /// `reuseport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reuseport: Option<bool>,
    /// `backlog=N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) backlog: Option<u32>,
}

/// `access_log`: `"off"`, a path (combined format), or `{ path, format }`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RawAccessLog {
    /// `"off"`.
    Off,
    /// A log.
    Log(RawAccessLogTable),
}

/// The table form of `access_log`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccessLogTable {
    /// Where to write.
    pub(crate) path: String,
    /// `combined` (default) or `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) format: Option<String>,
}

/// `large_client_header_buffers`: `"4 8k"` (nginx's two words) or
/// `{ number = 4, size = "8k" }`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RawHeaderBuffers {
    /// `"NUMBER SIZE"`, as in nginx.conf.
    Words(String),
    /// The table form.
    Table(RawHeaderBuffersTable),
}

/// The table form of `large_client_header_buffers`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeaderBuffersTable {
    /// How many buffers (the whole header may take NUMBER × SIZE).
    pub(crate) number: u32,
    /// The size of one (a longer request line or header line is refused).
    pub(crate) size: String,
}

// === impl RawListen ===

impl<'de> Deserialize<'de> for RawListen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawListen;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an address string or a table { addr, default_server, reuseport, backlog }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawListen, E> {
                Ok(RawListen::Addr(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawListen, E> {
                Ok(RawListen::Addr(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawListen, A::Error> {
                RawListenTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawListen::Table)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for RawListen {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RawListen::Addr(a) => s.serialize_str(a),
            RawListen::Table(t) => t.serialize(s),
        }
    }
}

// === impl RawAccessLog ===

impl<'de> Deserialize<'de> for RawAccessLog {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAccessLog;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"off\", a path, or a table { path, format }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawAccessLog, E> {
                Ok(match v {
                    "off" => RawAccessLog::Off,
                    path => RawAccessLog::Log(RawAccessLogTable {
                        path: path.to_string(),
                        format: None,
                    }),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawAccessLog, A::Error> {
                RawAccessLogTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawAccessLog::Log)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for RawAccessLog {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RawAccessLog::Off => s.serialize_str("off"),
            // The short form, a path, means the combined format.
            RawAccessLog::Log(t) if t.format.is_none() && t.path != "off" => {
                s.serialize_str(&t.path)
            }
            RawAccessLog::Log(t) => t.serialize(s),
        }
    }
}

// === impl RawHeaderBuffers ===

impl<'de> Deserialize<'de> for RawHeaderBuffers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeaderBuffers;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"NUMBER SIZE\" (e.g. \"4 8k\") or a table { number, size }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawHeaderBuffers, E> {
                Ok(RawHeaderBuffers::Words(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawHeaderBuffers, A::Error> {
                RawHeaderBuffersTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawHeaderBuffers::Table)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for RawHeaderBuffers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RawHeaderBuffers::Words(w) => s.serialize_str(w),
            RawHeaderBuffers::Table(t) => t.serialize(s),
        }
    }
}
