//! The typed configuration model. Both front ends (TOML and nginx.conf)
//! build exactly this; nothing downstream knows which one was used.
//!
//! Every default equals nginx's (or tengine's for `check`), and
//! `docs/configuration.md` lists each setting with its unit and default.

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::outcome::NextUpstream;

/// Where a setting came from, for lint findings and error messages.
/// Two origins always compare equal: the source position is not part of the
/// model's meaning (a converted config equals its original).
#[derive(Clone, Debug, Default)]
pub struct Origin(pub Option<Arc<SourcePos>>);

/// A file position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourcePos {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

/// A whole configuration.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Config {
    /// Upstream groups, in file order.
    pub upstreams: Vec<UpstreamConfig>,
    /// Virtual servers (nginx `server {}` blocks), in file order.
    pub servers: Vec<ServerBlock>,
    /// `map` blocks of the http level, in file order.
    pub maps: Vec<super::MapBlock>,
    /// `limit_req_zone` and `limit_conn_zone`, in file order.
    pub limit_zones: Vec<super::LimitZone>,
    /// The admin listener.
    pub admin: AdminConfig,
    /// OpenTelemetry export (off unless an endpoint is set).
    pub telemetry: TelemetryConfig,
    /// nginx's `worker_shutdown_timeout`: how long a graceful stop (SIGQUIT)
    /// lets the requests and tunnels in flight run before it closes them.
    /// None (nginx's default): no limit.
    pub shutdown_timeout: Option<Duration>,
}

/// OpenTelemetry export of the proxy's metrics and request traces
/// (OTLP over HTTP with protobuf bodies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL, `http://HOST:PORT[/path]`:
    /// traces go to `<base>/v1/traces`, metrics to `<base>/v1/metrics`.
    /// None (the default): no export.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute; default `vigil`.
    pub service_name: String,
    /// Time between two metric exports; default 10s.
    pub export_interval: Duration,
}

/// The admin API listener.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminConfig {
    /// Listen address; default `127.0.0.1:9901`.
    pub listen: Option<SocketAddr>,
    /// Bearer token for write endpoints (and required for a non-loopback listen).
    pub token: Option<String>,
    /// `GET /` serves the live dashboard; default true (false: the list of
    /// endpoints there).
    pub dashboard: bool,
    /// Host names a request's `Host` may name besides an IP address and
    /// `localhost` (`[admin] hosts`, `--admin-host`); lower-case, without
    /// a trailing dot; default none. Other names are refused (DNS rebinding).
    pub hosts: Vec<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: None,
            token: None,
            dashboard: true,
            hosts: Vec::new(),
        }
    }
}

/// One `upstream NAME { ... }` block.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamConfig {
    /// The upstream's name.
    pub name: String,
    /// The balancing method.
    pub balancer: Balancer,
    /// The servers, in config order (order matters for round-robin ties and hashes).
    pub servers: Vec<ServerConfig>,
    /// `keepalive N`: idle connections kept per upstream (a cache, not a cap).
    pub keepalive: Option<Keepalive>,
    /// Active health check (tengine's `check`), if any.
    pub check: Option<CheckConfig>,
    /// `zone NAME [SIZE]`: accepted for compatibility; vigil's state is always shared.
    pub zone: Option<String>,
    /// vigil's peer rules beyond nginx (`passive_count`, `passive_recovery`,
    /// `passive_penalty`, `max_ejected`); the default is nginx's behaviour.
    pub rules: HealthRules,
    /// The `resolver` in force for the `server NAME resolve` lines: the
    /// upstream's own, else the http level's (nginx 1.27.3+). None: no
    /// `resolve` line may stand here.
    pub resolver: Option<ResolverConfig>,
    /// The upstream's own `resolver_timeout`, if written (the one in force
    /// is `resolver.timeout`: this, else the http level's, else 30s).
    pub resolver_timeout: Option<Duration>,
    /// Where the block starts.
    pub origin: Origin,
}

/// `resolver ADDRESS ... [valid=TIME] [ipv4=on|off] [ipv6=on|off]` with
/// `resolver_timeout`: the DNS servers that re-resolve `server NAME
/// resolve` lines while vigil runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolverConfig {
    /// The name servers (port 53 unless written), in order.
    pub servers: Vec<SocketAddr>,
    /// `valid=`: how long an answer stands; None (nginx's default): its TTL.
    pub valid: Option<Duration>,
    /// `ipv4=`, default on: ask for A records.
    pub ipv4: bool,
    /// `ipv6=`, default on: ask for AAAA records.
    pub ipv6: bool,
    /// `resolver_timeout`, default 30s.
    pub timeout: Duration,
    /// Where `resolver` is.
    pub origin: Origin,
}

/// The vigil-only peer rules of an upstream. Each is off by default, and
/// with all of them off vigil behaves exactly as nginx 1.22.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HealthRules {
    /// `passive_count after_header last_try`: what counts toward
    /// `max_fails` beyond nginx's rules. Default: nothing more.
    pub count: PassiveCount,
    /// `passive_recovery window | probe | probation=N`: how a passively
    /// excluded peer comes back. Default `window` (nginx).
    pub recovery: Recovery,
    /// `passive_penalty base=T max=T [jitter=P%]`: exclusions that grow.
    /// Default none: every exclusion lasts `fail_timeout` (nginx).
    pub penalty: Option<Penalty>,
    /// `retry_budget ratio=R% min=N/s`: the retries and hedges of the
    /// upstream's requests, over the last 10 s, may not exceed R% of its
    /// requests plus N per second. Default none (nginx: no limit).
    pub retry_budget: Option<RetryBudget>,
    /// `hedge after=T|pNN [max=M]`: an idempotent request with no response
    /// header after T is sent to another peer too; the first header wins.
    /// Default none (nginx: never).
    pub hedge: Option<Hedge>,
    /// `max_ejected P%`: at most this percentage (0..=100) of the primaries
    /// in service ejected at once by every rule together. Default none.
    pub max_ejected: Option<u8>,
    /// The count form of `max_ejected`: at least this many primaries in
    /// service stay eligible whatever the health rules say. No directive:
    /// `vigil check --min-healthy N` sets it. Default none: one, the floor
    /// `max_ejected` always keeps. Set without `max_ejected`, it alone puts
    /// the rule in force (as `max_ejected 100%` keeping N).
    pub keep_in_service: Option<NonZeroU32>,
    /// `eject_stuck factor=K min=T`: a peer whose oldest attempt still
    /// waiting for its header is older than max(T, K × the upstream's
    /// recent p99 time-to-header) takes no new requests. Default none.
    pub eject_stuck: Option<EjectStuck>,
    /// `eject_slow factor=K window=T min_requests=N [min=T]`: a peer whose
    /// median time-to-header over the window is above K × the median of
    /// the other peers' is ejected as a passive exclusion. Default none.
    pub eject_slow: Option<EjectSlow>,
    /// `health_preset NAME`: the preset written, and which settings it
    /// supplied (the rest were written). Default none.
    pub preset: Option<PresetUse>,
    /// Where each directive is, for errors and lint findings.
    pub origins: RuleOrigins,
}

/// `passive_count`: the two extra kinds of evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PassiveCount {
    /// `after_header`: a failure after the response header went out (body
    /// cut short, reset or read timeout mid-body) counts toward `max_fails`
    /// (it is still not retried).
    pub after_header: bool,
    /// `last_try`: a listed status (`http_503`, ...) on an attempt that
    /// cannot be retried counts as a failure instead of nginx's success.
    pub last_try: bool,
}

/// `passive_recovery`: what happens when a passive exclusion ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Recovery {
    /// nginx: one request tests the peer; a success forgives its failures.
    #[default]
    Window,
    /// The peer stays out until an active probe passes after the exclusion
    /// ended (the upstream needs a `check`). No user request tests it.
    Probe,
    /// Half-open: at most one request at a time until this many succeed in
    /// a row; a failure excludes it again.
    Probation(NonZeroU32),
}

/// `retry_budget ratio=R% min=N/s` (Finagle's retry budget): each request
/// deposits R% of a token, each retry or hedge withdraws one (deposits and
/// withdrawals older than [`RetryBudget::WINDOW`] expire); when none is
/// left, a reserve of N per second (a `governor` rate limiter, burst N)
/// pays instead; when that is empty too, the retry is denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryBudget {
    /// `ratio=`: R, 0..=100 percent of the requests.
    pub ratio_percent: u8,
    /// `min=`: N retries per second whatever the ratio (0: none).
    pub min_per_sec: u32,
}

/// `hedge after=T|pNN [max=M]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hedge {
    /// `after=`: when the next hedge goes out, counted from the start of
    /// the latest attempt still waiting.
    pub after: HedgeAfter,
    /// `max=`: hedges per request (default 1, at most 8).
    pub max: NonZeroU32,
}

/// When a hedge goes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeAfter {
    /// `after=T`: a fixed delay (more than 0).
    Fixed(Duration),
    /// `after=pNN`: the upstream's recent NN-th percentile (1..=99)
    /// time-to-header.
    Percentile(u8),
}

/// `passive_penalty`: the k-th exclusion in a row lasts
/// `min(base × 2^(k−1), max)`, ± `jitter` percent; after a clean period as
/// long as `max`, k starts again at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Penalty {
    /// `base=`: the first exclusion's length.
    pub base: Duration,
    /// `max=`: the cap, and the clean period that resets the growth.
    pub max: Duration,
    /// `jitter=P%`: each exclusion lasts up to this percentage (0..=100)
    /// more or less, at random. Default 0.
    pub jitter_percent: u8,
}

/// `eject_stuck factor=K min=T`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EjectStuck {
    /// `factor=`: K, a multiple of the upstream's recent p99
    /// time-to-header (1 to 1000).
    pub factor: f64,
    /// `min=`: T, the threshold whatever the p99 (and the whole threshold
    /// while too few samples give a p99).
    pub min: Duration,
}

/// `eject_slow factor=K window=T min_requests=N [min=T]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EjectSlow {
    /// `factor=`: K, a multiple of the median of the other peers'
    /// figures (above 1, at most 1000).
    pub factor: f64,
    /// `window=`: the span the figures cover (kept as two halves: a figure
    /// covers the last window/2 to window).
    pub window: Duration,
    /// `min_requests=`: headers a peer needs in the window to be judged or
    /// to count in its peers' median.
    pub min_requests: u32,
    /// `min=`: a figure at or below this is never slow, whatever the
    /// others' (default 0).
    pub min: Duration,
    /// `max=`: a figure above this is slow whatever the others' (an
    /// absolute bound, for a tier whose peers are all slow, or where no
    /// other peer has a figure); None: no bound (the default).
    pub max: Option<Duration>,
}

/// A `health_preset` and what it set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PresetUse {
    /// Which preset.
    pub preset: Preset,
    /// The settings the preset supplied (not written beside it).
    pub supplied: PresetSettings,
}

/// The presets of `health_preset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// `recommended`: every health rule beyond nginx, with vigil's defaults.
    Recommended,
}

/// Which settings a preset supplied (true) rather than the configuration
/// writing them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PresetSettings {
    /// `passive_count`.
    pub passive_count: bool,
    /// `passive_recovery`.
    pub passive_recovery: bool,
    /// `passive_penalty`.
    pub passive_penalty: bool,
    /// `max_ejected`.
    pub max_ejected: bool,
    /// `eject_stuck`.
    pub eject_stuck: bool,
    /// `eject_slow`.
    pub eject_slow: bool,
    /// `retry_budget`.
    pub retry_budget: bool,
    /// `hedge`.
    pub hedge: bool,
}

/// Where the rule directives are (all compare equal, as [`Origin`] does).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RuleOrigins {
    /// `passive_count`.
    pub count: Origin,
    /// `passive_recovery`.
    pub recovery: Origin,
    /// `passive_penalty`.
    pub penalty: Origin,
    /// `retry_budget`.
    pub retry_budget: Origin,
    /// `hedge`.
    pub hedge: Origin,
    /// `max_ejected`.
    pub max_ejected: Origin,
    /// `eject_stuck`.
    pub eject_stuck: Origin,
    /// `eject_slow`.
    pub eject_slow: Origin,
    /// `health_preset`.
    pub preset: Origin,
}

/// The balancing method of an upstream.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Balancer {
    /// Smooth weighted round robin (nginx's default).
    #[default]
    RoundRobin,
    /// `least_conn`.
    LeastConn,
    /// `hash KEY [consistent]`.
    Hash {
        /// The key, with nginx variables (`$request_uri`, `$arg_x`, ...).
        key: String,
        /// Ketama consistent hashing.
        consistent: bool,
    },
    /// `ip_hash`.
    IpHash,
    /// `random [two [least_conn]]`.
    Random {
        /// Power of two choices, keeping the less loaded one.
        two: bool,
    },
}

/// One `server ADDRESS [params]` line.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// The address as written (`127.0.0.1:8080`, `backend1:80`); consistent
    /// hashing hashes this text, as nginx does.
    pub address: String,
    /// The resolved socket address (`0.0.0.0:0` for a `unix:` server:
    /// connect to [`ServerConfig::peer_addr`]).
    pub addr: SocketAddr,
    /// The socket path of `server unix:/path`.
    pub unix: Option<std::path::PathBuf>,
    /// Which of the addresses `address` resolved to this server is
    /// (0-based): nginx makes one peer per address of a `server` line
    /// (`ngx_http_upstream_init_round_robin`), each with the line's
    /// parameters; see [`ServerConfig::per_address`].
    pub addr_nth: u32,
    /// How many addresses `address` resolved to (1 for an IP address).
    pub addr_count: u32,
    /// `weight=N`, default 1.
    pub weight: NonZeroU32,
    /// `max_fails=N`, default 1; 0 disables the exclusion test.
    pub max_fails: u32,
    /// `fail_timeout=T`, default 10s.
    pub fail_timeout: Duration,
    /// `max_conns=N`, default 0 (no limit).
    pub max_conns: u32,
    /// `backup`.
    pub backup: bool,
    /// `down`.
    pub down: bool,
    /// `slow_start=T` (nginx Plus): after any readmission (passive exclusion
    /// over, probe up, admin up) the weight rises linearly from
    /// `max(1, weight/10)` to `weight` over T. Default none. Refused with
    /// `hash` and `ip_hash`.
    pub slow_start: Option<Duration>,
    /// `resolve` (nginx 1.27.3+): the name is re-resolved while vigil runs,
    /// through the upstream's `resolver`.
    pub resolve: bool,
    /// Where the line is.
    pub origin: Origin,
}

/// `keepalive N` and its companions.
#[derive(Clone, Debug, PartialEq)]
pub struct Keepalive {
    /// Idle connections kept per upstream (per worker in nginx).
    pub idle: NonZeroU32,
    /// `keepalive_timeout`, default 60s.
    pub timeout: Duration,
    /// `keepalive_requests`, default 1000.
    pub requests: u32,
    /// Where `keepalive` is.
    pub origin: Origin,
}

/// Active health check settings (tengine's `check` directive family).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckConfig {
    /// `type=`, default `tcp`.
    pub kind: CheckKind,
    /// `interval=`, default 30s.
    pub interval: Duration,
    /// `rise=`, default 2.
    pub rise: NonZeroU32,
    /// `fall=`, default 5.
    pub fall: NonZeroU32,
    /// `timeout=`, default 1s: one deadline for the whole probe.
    pub timeout: Duration,
    /// `port=`: probe this port instead of the server's.
    pub port: Option<u16>,
    /// State before the first result: tengine's `default_down=true` (the default) is `Down`.
    pub initial: InitialState,
    /// Random extra delay added to each interval, up to this much.
    pub jitter: Duration,
    /// HTTP probe details (for `http` and `https`).
    pub http: HttpCheck,
    /// Where `check` is.
    pub origin: Origin,
}

/// Probe type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CheckKind {
    /// TCP connect.
    #[default]
    Tcp,
    /// HTTP request over TCP.
    Http,
    /// HTTP request over TLS.
    Https,
}

/// State of a peer before its first probe result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InitialState {
    /// Routable until a probe says otherwise.
    Up,
    /// Not routable until `rise` probes pass (tengine's `default_down=true`).
    #[default]
    Down,
    /// Routable, and the first result alone decides (no streak needed for it).
    FirstResult,
}

/// HTTP probe request and acceptance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCheck {
    /// The raw request (`check_http_send`); default `GET / HTTP/1.0\r\n\r\n`.
    pub send: String,
    /// Accepted statuses (`check_http_expect_alive`); default `http_2xx http_3xx`.
    pub expect: Vec<StatusClass>,
    /// Optional substring the body must contain (first 64 KiB).
    pub body_contains: Option<String>,
}

/// An accepted status class or exact status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusClass {
    /// `http_Nxx`, N in 1..=5.
    Class(u8),
    /// An exact status.
    Exact(u16),
}

/// A `server {}` block: where clients connect and how requests are routed.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerBlock {
    /// `listen` addresses.
    pub listen: Vec<Listen>,
    /// `server_name`s: exact names, `*.example.com`, `example.*`, `~regex`,
    /// `""` (requests without a Host), as nginx selects virtual servers.
    pub server_names: Vec<String>,
    /// The client-side settings of the request header phase.
    pub client: ClientSettings,
    /// Locations, in config order.
    pub locations: Vec<Location>,
    /// A server-level `return`: answers every request of the block before
    /// any location is looked up (nginx's server rewrite phase).
    pub ret: Option<Return>,
    /// The server-level rewrite script (`rewrite`, `set`, `return` in
    /// file order), run before the location is looked up.
    pub rewrite: Vec<super::RewriteStep>,
    /// Where the block starts.
    pub origin: Origin,
    /// The block's TLS settings (`ssl_*`, inherited from `http`), used
    /// when it listens on a TLS address.
    pub tls: ServerTls,
    /// The `error_page`s in force at the server level (its own, else
    /// `http`'s): nginx's for a request no location answers (a 404 of
    /// no location). None from TOML.
    pub error_pages: Vec<super::ErrorPage>,
    /// The `access_log` in force at the server level (its own, else
    /// `http`'s): where nginx logs what no location answers (a 404 of no
    /// location, a server-level `return`, a 400). None = off.
    pub access_log: Option<AccessLog>,
    /// The static-file settings of the server level: nginx serves a
    /// request no location takes from the server's `root`.
    pub files: super::FileSettings,
}

/// The `ssl_*` settings of a `server` block (ngx_http_ssl_module).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerTls {
    /// `ssl_certificate` / `ssl_certificate_key` pairs, in order (nginx
    /// pairs the Nth certificate with the Nth key); none by default.
    pub certificates: Vec<CertificatePair>,
    /// `ssl_protocols`: offer TLS 1.2. Default on.
    pub tls12: bool,
    /// `ssl_protocols`: offer TLS 1.3. Default off: nginx 1.22's default
    /// is `TLSv1 TLSv1.1 TLSv1.2` (1.23.4 added TLSv1.3 to it).
    pub tls13: bool,
    /// `ssl_protocols` names written that rustls does not implement
    /// (`SSLv2`, `SSLv3`, `TLSv1`, `TLSv1.1`): accepted, not offered.
    pub not_offered: Vec<String>,
    /// `ssl_session_cache`; default `none`.
    pub session_cache: SessionCache,
    /// `ssl_session_timeout`; default 5m.
    pub session_timeout: Duration,
    /// `ssl_session_tickets`; default on.
    pub session_tickets: bool,
    /// `ssl_ciphers` as written (None: nginx's default `HIGH:!aNULL:!MD5`);
    /// rustls's own suites are offered whatever it says.
    pub ciphers: Option<String>,
    /// `ssl_prefer_server_ciphers`; default off.
    pub prefer_server_ciphers: bool,
    /// Where `ssl_protocols` was written, if it was.
    pub protocols_origin: Origin,
}

/// One `ssl_certificate` and its `ssl_certificate_key`.
#[derive(Clone, Debug, PartialEq)]
pub struct CertificatePair {
    /// The PEM certificate chain.
    pub certificate: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
    /// Where `ssl_certificate` was written.
    pub certificate_origin: Origin,
    /// Where `ssl_certificate_key` was written.
    pub key_origin: Origin,
}

/// `ssl_session_cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionCache {
    /// `off`: no session is resumed.
    Off,
    /// `none` (the default): nginx keeps no session either.
    None,
    /// `builtin[:N]` and/or `shared:NAME:SIZE`: about this many sessions
    /// (N, plus 4000 per megabyte of SIZE as nginx's documentation counts).
    Sessions(u64),
}

impl Default for ServerTls {
    fn default() -> Self {
        Self {
            certificates: Vec::new(),
            tls12: true,
            tls13: false,
            not_offered: Vec::new(),
            session_cache: SessionCache::None,
            session_timeout: Duration::from_secs(300),
            session_tickets: true,
            ciphers: None,
            prefer_server_ciphers: false,
            protocols_origin: Origin::default(),
        }
    }
}

/// `return CODE [TEXT|URL]` or `return URL` (ngx_http_rewrite_module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Return {
    /// The status (`return URL` is 302); 444 closes the connection
    /// without a response.
    pub code: u16,
    /// The body, or for 301, 302, 303, 307 and 308 the `Location`, with
    /// variables; None when only a code was written.
    pub text: Option<String>,
    /// The `Content-Type` of the text: the `default_type` in force
    /// (`text/plain` unless set).
    pub content_type: String,
}

impl Return {
    /// Whether `code` takes a URL (sent as `Location`) rather than a body.
    pub fn redirects(code: u16) -> bool {
        matches!(code, 301 | 302 | 303 | 307 | 308)
    }
}

/// How the request header is read and judged (nginx's http/server-level
/// core directives). As in nginx, the values of the *default* server of an
/// address apply while the header is read (the Host is not known yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSettings {
    /// `client_header_timeout`, default 60s: from accept (or the first byte
    /// of the next request on a kept-alive connection) to the end of the header.
    pub header_timeout: Duration,
    /// `large_client_header_buffers NUMBER SIZE`, default `4 8k`: a request
    /// line or one header line longer than SIZE is refused (414 / 400), and
    /// the whole header may not exceed NUMBER × SIZE.
    pub header_buffers: u32,
    /// The SIZE of `large_client_header_buffers`, in bytes.
    pub header_buffer_size: u64,
    /// `underscores_in_headers`, default off: header names with `_` are invalid.
    pub underscores_in_headers: bool,
    /// `ignore_invalid_headers`, default on: invalid header lines are dropped
    /// (off: passed on).
    pub ignore_invalid_headers: bool,
    /// `merge_slashes`, default on: `//` in the path is merged before routing.
    pub merge_slashes: bool,
}

/// One `listen` directive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// The address.
    pub addr: SocketAddr,
    /// `default_server`.
    pub default_server: bool,
    /// `reuseport`.
    pub reuseport: bool,
    /// `backlog=N`.
    pub backlog: Option<u32>,
    /// `ssl`: a TLS listener. As in nginx, one `listen ... ssl` makes the
    /// address a TLS address for every block on it.
    pub ssl: bool,
    /// `http2`: on a TLS address, ALPN offers `h2` (any `listen` of the
    /// address with `http2` turns it on for the address, as nginx).
    pub http2: bool,
}

/// How a location matches the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocationMatch {
    /// `location /prefix` (longest prefix wins).
    Prefix,
    /// `location ^~ /prefix`: a prefix that would stop regex matching (vigil has none).
    PrefixNoRegex,
    /// `location = /exact`.
    Exact,
    /// `location ~ REGEX` (`path` is the expression).
    Regex,
    /// `location ~* REGEX`: case-insensitive.
    RegexCaseless,
    /// `location @name`: reached only by an internal redirect (`error_page`).
    Named,
}

/// One `location` block.
#[derive(Clone, Debug, PartialEq)]
pub struct Location {
    /// Match kind.
    pub matcher: LocationMatch,
    /// The path.
    pub path: String,
    /// Proxy settings in force here (inherited from server and http levels).
    pub proxy: ProxySettings,
    /// A `return` in the location: answered instead of proxying.
    pub ret: Option<Return>,
    /// Nesting and the rewrite-phase script (`rewrite`, `set`, `return`).
    pub routing: super::LocationRouting,
    /// Where the block starts.
    pub origin: Origin,
}

/// `proxy_pass` target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyPass {
    /// `http` or `https`.
    pub tls: bool,
    /// Upstream name (an `upstream` block, or a `host:port` made into an implicit upstream).
    pub upstream: String,
    /// The URI part, if any (`proxy_pass http://u/v1` has `/v1`).
    pub uri: Option<String>,
}

/// Request header change (`proxy_set_header NAME VALUE`; empty value removes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetHeader {
    /// Header name.
    pub name: String,
    /// Value with nginx variables.
    pub value: String,
}

/// Response header added (`add_header NAME VALUE [always]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddHeader {
    /// Header name.
    pub name: String,
    /// Value with nginx variables.
    pub value: String,
    /// Also on error statuses.
    pub always: bool,
}

/// Everything `proxy_*` that applies to a location, after inheritance.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxySettings {
    /// `proxy_pass`.
    pub pass: Option<ProxyPass>,
    /// `proxy_next_upstream`, default `error timeout`.
    pub next_upstream: NextUpstream,
    /// `proxy_next_upstream_tries`, default 0 (no limit beyond the peer count).
    pub next_upstream_tries: u32,
    /// `proxy_next_upstream_timeout`, default 0 (none).
    pub next_upstream_timeout: Option<Duration>,
    /// `proxy_connect_timeout`, default 60s.
    pub connect_timeout: Duration,
    /// `proxy_send_timeout`, default 60s (between two writes).
    pub send_timeout: Duration,
    /// `proxy_read_timeout`, default 60s (between two reads).
    pub read_timeout: Duration,
    /// `proxy_request_buffering`, default on.
    pub request_buffering: bool,
    /// `proxy_ignore_client_abort`, default off: a client that closes its
    /// connection while its request waits for the upstream ends the
    /// attempt (logged 499, not retried, not charged to the peer); on, the
    /// request goes on to the end.
    pub ignore_client_abort: bool,
    /// `proxy_buffering`, default on.
    pub buffering: bool,
    /// `proxy_http_version`, default 1.0 in nginx; vigil speaks 1.1 upstream
    /// when `keepalive` is set and records what was asked.
    pub http_version: HttpVersion,
    /// `proxy_set_header` list (replaces the inherited list when present).
    pub set_headers: Vec<SetHeader>,
    /// `add_header` list (replaces the inherited list when present).
    pub add_headers: Vec<AddHeader>,
    /// `client_max_body_size` in bytes, default 1 MiB; 0 = no limit.
    pub client_max_body_size: u64,
    /// `proxy_ssl_verify`, default on in vigil (off in nginx: a trap).
    pub ssl_verify: bool,
    /// `proxy_ssl_trusted_certificate`.
    pub ssl_trusted_certificate: Option<PathBuf>,
    /// `proxy_ssl_server_name`, default on in vigil (SNI).
    pub ssl_server_name: bool,
    /// `access_log` path (None = off).
    pub access_log: Option<AccessLog>,
    /// `client_body_timeout`, default 60s: between two reads of the request body.
    pub client_body_timeout: Duration,
    /// nginx's `send_timeout`, default 60s: between two writes of the
    /// response to the client.
    pub client_send_timeout: Duration,
    /// nginx's `keepalive_timeout` (the client side), default 75s: how long
    /// an idle client connection is kept after a response; 0 disables
    /// keep-alive.
    pub client_keepalive_timeout: Duration,
    /// `error_page`s in force (a level with its own replaces the inherited list).
    pub error_pages: Vec<super::ErrorPage>,
    /// `proxy_intercept_errors`, default off: an upstream's answer of 300
    /// or more that has an `error_page` gets that page instead.
    pub intercept_errors: bool,
    /// `gzip` and its `gzip_*` settings.
    pub gzip: Gzip,
    /// `allow` / `deny`, in order (the first that matches decides; none
    /// matching allows). A level with any replaces the inherited list.
    pub access: Vec<AccessRule>,
    /// `set_real_ip_from`, `real_ip_header`, `real_ip_recursive`.
    pub real_ip: RealIp,
    /// The realip settings of the location's server (what nginx applies
    /// in its post-read phase, before the location is known; the
    /// location's own apply only when these did not).
    pub server_real_ip: RealIp,
    /// `proxy_redirect`: None = `off`; an empty list = nginx's default
    /// (the `default` rule at a location with `proxy_pass`).
    pub redirect: Option<Vec<RedirectRule>>,
    /// `proxy_hide_header` (lowercase names).
    pub hide_headers: Vec<String>,
    /// `proxy_pass_header` (lowercase names).
    pub pass_headers: Vec<String>,
    /// `limit_req`, `limit_conn` and their settings.
    pub limits: super::Limits,
    /// Static files: where a location without `proxy_pass` or `return`
    /// finds them, and how they are answered.
    pub files: super::FileSettings,
    /// How a `Location` vigil makes (a redirect, the 301 to a
    /// directory's slash) is made absolute.
    pub redirects: Redirects,
}

/// One `proxy_redirect`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedirectRule {
    /// `default`: the `proxy_pass` URL (with `/` when it has no URI) to
    /// the location's name (to `/`).
    Default,
    /// `REDIRECT REPLACEMENT` (both may hold variables).
    Rewrite {
        /// A prefix of the header's value (case-sensitive).
        redirect: String,
        /// What replaces it.
        replacement: String,
    },
}

/// One `allow` or `deny`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessRule {
    /// `allow` (true) or `deny`.
    pub allow: bool,
    /// The addresses it is for.
    pub net: crate::config::Cidr,
}

/// nginx's realip module: which peers may say who the client is, and where.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RealIp {
    /// `set_real_ip_from` (none: the module is off).
    pub from: Vec<crate::config::Cidr>,
    /// `real_ip_header`, default `X-Real-IP`.
    pub header: RealIpHeader,
    /// `real_ip_recursive`, default off.
    pub recursive: bool,
}

/// `real_ip_header`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum RealIpHeader {
    /// `X-Real-IP` (the first such header).
    #[default]
    XRealIp,
    /// `X-Forwarded-For` (every such header, last first).
    XForwardedFor,
    /// Any other header (lowercase name; the first such header).
    Other(String),
}

/// `gzip on` and the `gzip_*` directives (nginx's gzip filter, 1.22).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gzip {
    /// `gzip`, default off.
    pub enable: bool,
    /// `gzip_types`: lowercase MIME types besides `text/html` (always
    /// compressed); `*` = any. Default none.
    pub types: Vec<String>,
    /// `gzip_min_length` in bytes (from Content-Length), default 20.
    pub min_length: u64,
    /// `gzip_comp_level` 1..=9, default 1.
    pub comp_level: u32,
    /// `gzip_proxied` (for requests with `Via`), default off.
    pub proxied: GzipProxied,
    /// `gzip_vary`, default off.
    pub vary: bool,
    /// `gzip_http_version`: the lowest request version compressed, default 1.1.
    pub http_version: HttpVersion,
    /// `gzip_disable "msie6"`.
    pub disable_msie6: bool,
}

/// `gzip_proxied`'s words (`off` = none set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GzipProxied {
    /// `expired`: the response has an `Expires` in the past.
    pub expired: bool,
    /// `no-cache` in Cache-Control.
    pub no_cache: bool,
    /// `no-store` in Cache-Control.
    pub no_store: bool,
    /// `private` in Cache-Control.
    pub private: bool,
    /// `no_last_modified`: no `Last-Modified`.
    pub no_last_modified: bool,
    /// `no_etag`: no `ETag`.
    pub no_etag: bool,
    /// `auth`: the request has `Authorization`.
    pub auth: bool,
    /// `any`.
    pub any: bool,
}

impl Default for Gzip {
    fn default() -> Self {
        Self {
            enable: false,
            types: Vec::new(),
            min_length: 20,
            comp_level: 1,
            proxied: GzipProxied::default(),
            vary: false,
            http_version: HttpVersion::Http11,
            disable_msie6: false,
        }
    }
}

/// HTTP version used to talk to upstreams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HttpVersion {
    /// HTTP/1.0 (nginx's default).
    #[default]
    Http10,
    /// HTTP/1.1.
    Http11,
}

/// An access log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLog {
    /// Where to write.
    pub path: PathBuf,
    /// Line format.
    pub format: LogFormat,
    /// `if=VALUE`: the line is written only when VALUE expands to
    /// something other than "" and "0" (nginx's `access_log ... if=`).
    pub condition: Option<String>,
}

/// Access log line format.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// nginx's `combined`, byte for byte.
    #[default]
    Combined,
    /// One JSON object per line (vigil's own, with every attempt).
    Json,
    /// A `log_format` of the conf.
    Custom(LogFormatDef),
}

/// `log_format NAME [escape=default|json|none] STRING...;`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFormatDef {
    /// The format's name.
    pub name: String,
    /// How variable values are escaped.
    pub escape: LogEscape,
    /// The strings, joined (nginx concatenates them without a separator).
    pub text: String,
    /// Where the `log_format` is.
    pub origin: Origin,
}

/// `log_format`'s `escape=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogEscape {
    /// `"`, `\`, bytes below 0x20 and from 0x7f as `\xHH`; a missing value as `-`.
    #[default]
    Default,
    /// JSON string escaping; a missing value as nothing.
    Json,
    /// Values as they are; a missing value as nothing.
    None,
}

// === impl Origin ===

impl Origin {
    /// An origin at a file position.
    pub fn at(file: PathBuf, line: u32, col: u32) -> Self {
        Origin(Some(Arc::new(SourcePos { file, line, col })))
    }
}

impl PartialEq for Origin {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Origin {}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(p) => write!(f, "{}:{}:{}", p.file.display(), p.line, p.col),
            None => f.write_str("<unknown>"),
        }
    }
}

// === impl defaults ===

impl HealthRules {
    /// The rule directives inside `upstream {}`. They are vigil's own:
    /// stock nginx refuses them ("unknown directive"), so `vigil check`
    /// leaves them out of the files it renders, as it does `check`.
    pub const DIRECTIVES: [&'static str; 7] = [
        "passive_count",
        "passive_recovery",
        "passive_penalty",
        "max_ejected",
        "eject_stuck",
        "eject_slow",
        "health_preset",
    ];

    /// Whether every rule is at nginx's default.
    pub fn is_nginx(&self) -> bool {
        *self == HealthRules::default()
    }

    /// Whether `max_ejected` is in force, in its percentage form, its count
    /// form ([`HealthRules::keep_in_service`]) or both.
    pub fn limits_ejection(&self) -> bool {
        self.max_ejected.is_some() || self.keep_in_service.is_some()
    }
}

impl Preset {
    /// The word in nginx.conf and TOML.
    pub fn word(self) -> &'static str {
        match self {
            Preset::Recommended => "recommended",
        }
    }
}

impl PresetSettings {
    /// The directive names of the settings supplied, in config order.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.passive_count, "passive_count"),
            (self.passive_recovery, "passive_recovery"),
            (self.passive_penalty, "passive_penalty"),
            (self.max_ejected, "max_ejected"),
            (self.eject_stuck, "eject_stuck"),
            (self.eject_slow, "eject_slow"),
            (self.retry_budget, "retry_budget"),
            (self.hedge, "hedge"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| n)
        .collect()
    }
}

impl Recovery {
    /// The word in nginx.conf and TOML: `window`, `probe`, `probation=N`.
    pub fn word(self) -> String {
        match self {
            Recovery::Window => "window".into(),
            Recovery::Probe => "probe".into(),
            Recovery::Probation(n) => format!("probation={n}"),
        }
    }
}

impl HealthRules {
    /// The traffic directives inside `upstream {}` (`retry_budget`,
    /// `hedge`): vigil's own like [`HealthRules::DIRECTIVES`], left out of
    /// the files `vigil check` renders.
    pub const TRAFFIC_DIRECTIVES: [&'static str; 2] = ["retry_budget", "hedge"];
}

impl RetryBudget {
    /// How long a request's deposit and a retry's withdrawal count.
    pub const WINDOW: Duration = Duration::from_secs(10);
}

impl Hedge {
    /// The most hedges a request may have (`max=`).
    pub const MAX: u32 = 8;
}

impl HedgeAfter {
    /// The word in nginx.conf and TOML: `50ms`, `p95`.
    pub fn word(self) -> String {
        match self {
            HedgeAfter::Fixed(d) => super::value::format_time(d),
            HedgeAfter::Percentile(p) => format!("p{p}"),
        }
    }
}

impl TelemetryConfig {
    /// The default `service.name`.
    pub const DEFAULT_SERVICE_NAME: &'static str = "vigil";
    /// The default time between metric exports.
    pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(10);

    /// Whether anything is exported.
    pub fn is_enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: Self::DEFAULT_SERVICE_NAME.to_string(),
            export_interval: Self::DEFAULT_EXPORT_INTERVAL,
        }
    }
}

impl AdminConfig {
    /// The default admin listen address.
    pub const DEFAULT_LISTEN: &'static str = "127.0.0.1:9901";

    /// One name of `[admin] hosts` / `--admin-host`, checked and made
    /// canonical: DNS labels of letters, digits, `-` and `_` (at most 63
    /// bytes each, 253 in all), lower-cased, a trailing dot dropped. A port,
    /// a wildcard or an address is refused: addresses are always accepted.
    pub fn host_name(text: &str) -> Result<String, String> {
        let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
        if name.parse::<std::net::IpAddr>().is_ok()
            || name.starts_with('[')
            || name.parse::<std::net::SocketAddr>().is_ok()
        {
            return Err(format!(
                "\"{text}\" is an address: any IP address is accepted already; list host names only"
            ));
        }
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(format!(
                "\"{text}\" is not a host name (letters, digits, '-' and '_' in dot-separated labels; no port, no wildcard)"
            ));
        }
        Ok(name)
    }
}

impl ServerConfig {
    /// `server` parameters vigil reads that stock nginx (open source)
    /// refuses ("invalid parameter"): `slow_start` is nginx Plus's. `vigil
    /// check` leaves them out of the server lines it renders.
    pub const NGINX_PLUS_PARAMETERS: [&'static str; 1] = ["slow_start"];

    /// A server with nginx's defaults.
    pub fn new(address: impl Into<String>, addr: SocketAddr) -> Self {
        Self {
            address: address.into(),
            addr,
            unix: None,
            addr_nth: 0,
            addr_count: 1,
            weight: NonZeroU32::MIN,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            max_conns: 0,
            backup: false,
            down: false,
            slow_start: None,
            resolve: false,
            origin: Origin::default(),
        }
    }
}

/// Where a peer is reached: a TCP socket address, or the path of a
/// unix-domain socket (`server unix:/path`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerAddr {
    /// IPv4 or IPv6 address and port.
    Inet(SocketAddr),
    /// A unix-domain socket.
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for PeerAddr {
    /// `10.0.0.7:8080`, `[::1]:80`, or `unix:/path` (nginx's `$upstream_addr`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Inet(a) => a.fmt(f),
            PeerAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl ServerConfig {
    /// A `server unix:PATH` with nginx's defaults.
    pub fn unix(address: impl Into<String>, path: std::path::PathBuf) -> Self {
        let mut s = Self::new(address, SocketAddr::from(([0, 0, 0, 0], 0)));
        s.unix = Some(path);
        s
    }

    /// Where to connect: the unix path when there is one, else `addr`.
    pub fn peer_addr(&self) -> PeerAddr {
        match &self.unix {
            Some(p) => PeerAddr::Unix(p.clone()),
            None => PeerAddr::Inet(self.addr),
        }
    }

    /// One server per address of `addrs` (in that order), each a copy of
    /// `self` (its `addr` replaced), as nginx makes one peer per address
    /// of a `server` line whose name resolves to several; `self` alone
    /// when `addrs` is empty.
    pub fn per_address(self, addrs: &[SocketAddr]) -> Vec<Self> {
        if addrs.is_empty() {
            return vec![self];
        }
        let count = addrs.len() as u32;
        addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Self {
                addr: *a,
                addr_nth: i as u32,
                addr_count: count,
                ..self.clone()
            })
            .collect()
    }

    /// The peer's name: the address as written when it stands for one
    /// address; the resolved address (`10.0.0.7:8080`) when the written
    /// name resolved to several (nginx Plus's API names such peers by
    /// address too, with the written text as `server`).
    pub fn peer_name(&self) -> String {
        if self.addr_count > 1 {
            self.addr.to_string()
        } else {
            self.address.clone()
        }
    }

    /// Whether `other` is the same server of the same line, whatever the
    /// number of addresses its name resolved to: what a reload keeps
    /// state across.
    pub fn same_server(&self, other: &Self) -> bool {
        let norm = |s: &Self| Self {
            addr_nth: 0,
            addr_count: 1,
            ..s.clone()
        };
        self.addr == other.addr && norm(self) == norm(other)
    }
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            pass: None,
            next_upstream: NextUpstream::nginx_default(),
            next_upstream_tries: 0,
            next_upstream_timeout: None,
            connect_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            read_timeout: Duration::from_secs(60),
            request_buffering: true,
            ignore_client_abort: false,
            buffering: true,
            http_version: HttpVersion::Http10,
            set_headers: Vec::new(),
            add_headers: Vec::new(),
            client_max_body_size: 1024 * 1024,
            ssl_verify: true,
            ssl_trusted_certificate: None,
            ssl_server_name: true,
            access_log: None,
            client_body_timeout: Duration::from_secs(60),
            client_send_timeout: Duration::from_secs(60),
            client_keepalive_timeout: Duration::from_secs(75),
            error_pages: Vec::new(),
            intercept_errors: false,
            gzip: Gzip::default(),
            access: Vec::new(),
            real_ip: RealIp::default(),
            server_real_ip: RealIp::default(),
            redirect: Some(Vec::new()),
            hide_headers: Vec::new(),
            pass_headers: Vec::new(),
            limits: super::Limits::default(),
            files: super::FileSettings::default(),
            redirects: Redirects::default(),
        }
    }
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(60),
            header_buffers: 4,
            header_buffer_size: 8 * 1024,
            underscores_in_headers: false,
            ignore_invalid_headers: true,
            merge_slashes: true,
        }
    }
}

impl Default for HttpCheck {
    fn default() -> Self {
        Self {
            send: "GET / HTTP/1.0\r\n\r\n".to_string(),
            expect: vec![StatusClass::Class(2), StatusClass::Class(3)],
            body_contains: None,
        }
    }
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            kind: CheckKind::Tcp,
            interval: Duration::from_secs(30),
            rise: NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN),
            fall: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            timeout: Duration::from_secs(1),
            port: None,
            initial: InitialState::Down,
            jitter: Duration::ZERO,
            http: HttpCheck::default(),
            origin: Origin::default(),
        }
    }
}

impl StatusClass {
    /// Whether `status` is accepted.
    pub fn accepts(self, status: u16) -> bool {
        match self {
            StatusClass::Class(c) => status / 100 == u16::from(c),
            StatusClass::Exact(s) => status == s,
        }
    }

    /// The word in nginx.conf (`http_2xx`) or the number.
    pub fn word(self) -> String {
        match self {
            StatusClass::Class(c) => format!("http_{c}xx"),
            StatusClass::Exact(s) => s.to_string(),
        }
    }

    /// Parse `http_2xx` or `204`.
    pub fn parse(word: &str) -> Option<Self> {
        if let Some(rest) = word.strip_prefix("http_") {
            let b = rest.as_bytes();
            if b.len() == 3 && (b'1'..=b'5').contains(&b[0]) && &b[1..] == b"xx" {
                return Some(StatusClass::Class(b[0] - b'0'));
            }
            return None;
        }
        match word.parse::<u16>() {
            Ok(s) if (100..=599).contains(&s) => Some(StatusClass::Exact(s)),
            _ => None,
        }
    }
}

impl UpstreamConfig {
    /// An upstream with nginx's defaults and no servers.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            balancer: Balancer::RoundRobin,
            servers: Vec::new(),
            keepalive: None,
            check: None,
            zone: None,
            rules: HealthRules::default(),
            resolver: None,
            resolver_timeout: None,
            origin: Origin::default(),
        }
    }

    /// Primary servers (not `backup`).
    pub fn primaries(&self) -> impl Iterator<Item = &ServerConfig> {
        self.servers.iter().filter(|s| !s.backup)
    }

    /// nginx's `peers->single`: exactly one primary (down ones included) and no backup.
    pub fn is_single(&self) -> bool {
        self.primaries().count() == 1 && !self.servers.iter().any(|s| s.backup)
    }
}

impl Config {
    /// The upstream called `name`.
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }
}

/// `absolute_redirect`, `server_name_in_redirect`, `port_in_redirect`:
/// how nginx's header filter completes a `Location` that starts with `/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Redirects {
    /// `absolute_redirect`, default on: `scheme://host[:port]` before it.
    pub absolute: bool,
    /// `server_name_in_redirect`, default off: the server's first name,
    /// not the request's host.
    pub server_name: bool,
    /// `port_in_redirect`, default on: the listener's port, unless it is
    /// the scheme's own.
    pub port: bool,
}

impl Default for Redirects {
    fn default() -> Self {
        Self {
            absolute: true,
            server_name: false,
            port: true,
        }
    }
}
