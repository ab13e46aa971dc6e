//! nginx's request and connection limits as the model holds them:
//! `limit_req_zone` / `limit_conn_zone` (the http level's zones) and
//! `limit_req` / `limit_conn` with their `_status`, `_log_level` and
//! `_dry_run` settings (per location, after inheritance). The rules
//! themselves are [`crate::limit`].

use super::Origin;

/// One `limit_req_zone` or `limit_conn_zone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitZone {
    /// `zone=NAME:SIZE`'s name.
    pub name: String,
    /// The key, with nginx variables (`$binary_remote_addr`); an empty
    /// value is not accounted.
    pub key: String,
    /// `zone=NAME:SIZE`'s size in bytes (at least 32 KiB, as nginx's
    /// 8 pages): it bounds the number of keys ([`crate::limit::keys_in`]).
    pub size: u64,
    /// Which module the zone is for.
    pub kind: ZoneKind,
    /// Where the zone was declared.
    pub origin: Origin,
}

/// What a [`LimitZone`] limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneKind {
    /// `limit_req_zone ... rate=Nr/s|Nr/m`: `rate` in milli-requests a
    /// second, as nginx keeps it (`N * 1000 / 60` for r/m, rounded down:
    /// `1r/m` is 16).
    Req {
        /// Milli-requests a second.
        rate: u64,
    },
    /// `limit_conn_zone`.
    Conn,
}

/// The limits in force at a location (a level with any `limit_req`
/// replaces the inherited list, and so for `limit_conn`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `limit_req`, in order.
    pub req: Vec<ReqLimit>,
    /// `limit_req_status`, default 503 (400..=599).
    pub req_status: u16,
    /// `limit_req_log_level`, default `error`; delays are logged one level
    /// lower.
    pub req_log_level: LimitLogLevel,
    /// `limit_req_dry_run`, default off.
    pub req_dry_run: bool,
    /// `limit_conn`, in order.
    pub conn: Vec<ConnLimit>,
    /// `limit_conn_status`, default 503 (400..=599).
    pub conn_status: u16,
    /// `limit_conn_log_level`, default `error`.
    pub conn_log_level: LimitLogLevel,
    /// `limit_conn_dry_run`, default off.
    pub conn_dry_run: bool,
}

/// One `limit_req zone=NAME [burst=N] [nodelay | delay=N]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReqLimit {
    /// The zone's name.
    pub zone: String,
    /// `burst=N`, requests; default 0.
    pub burst: u32,
    /// `nodelay` / `delay=N`.
    pub delay: ReqDelay,
}

/// How much of a burst is delayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReqDelay {
    /// Neither given: every request over the rate is delayed (`delay=0`).
    #[default]
    All,
    /// `delay=N`: the first N requests over the rate pass at once.
    After(u32),
    /// `nodelay`: none is delayed.
    NoDelay,
}

/// One `limit_conn NAME N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnLimit {
    /// The zone's name.
    pub zone: String,
    /// N, 1..=65535: requests in flight a key may have.
    pub conn: u32,
}

/// `limit_req_log_level` / `limit_conn_log_level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LimitLogLevel {
    /// `info`.
    Info,
    /// `notice`.
    Notice,
    /// `warn`.
    Warn,
    /// `error` (the default).
    #[default]
    Error,
}

// === impl Limits ===

impl Default for Limits {
    fn default() -> Self {
        Self {
            req: Vec::new(),
            req_status: 503,
            req_log_level: LimitLogLevel::Error,
            req_dry_run: false,
            conn: Vec::new(),
            conn_status: 503,
            conn_log_level: LimitLogLevel::Error,
            conn_dry_run: false,
        }
    }
}

impl Limits {
    /// Whether any limit applies (else the location pays nothing for them).
    pub fn is_empty(&self) -> bool {
        self.req.is_empty() && self.conn.is_empty()
    }
}

// === impl ReqDelay ===

impl ReqDelay {
    /// nginx's `limit->delay`: the excess in milli-requests that passes
    /// undelayed (`nodelay` is `NGX_MAX_INT_T_VALUE / 1000 * 1000`).
    pub fn milli(self) -> u64 {
        match self {
            ReqDelay::All => 0,
            ReqDelay::After(n) => u64::from(n) * 1000,
            ReqDelay::NoDelay => (i64::MAX as u64) / 1000 * 1000,
        }
    }
}

// === impl LimitLogLevel ===

impl LimitLogLevel {
    /// nginx's word for the level.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitLogLevel::Info => "info",
            LimitLogLevel::Notice => "notice",
            LimitLogLevel::Warn => "warn",
            LimitLogLevel::Error => "error",
        }
    }

    /// The level a delay is logged at: one lower (`info` stays `info`),
    /// as `ngx_http_limit_req_merge_conf` sets `delay_log_level`.
    pub fn lower(self) -> Self {
        match self {
            LimitLogLevel::Info | LimitLogLevel::Notice => LimitLogLevel::Info,
            LimitLogLevel::Warn => LimitLogLevel::Notice,
            LimitLogLevel::Error => LimitLogLevel::Warn,
        }
    }
}
