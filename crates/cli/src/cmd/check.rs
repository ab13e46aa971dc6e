//! `vigil check`: the checker beside a stock nginx. Probes the servers of
//! tengine-style upstream blocks kept in a source file nginx does not read,
//! renders one stock-nginx `upstream` file per block (down servers marked
//! `down`, never more than `--min-healthy` and `max_ejected` let go), tests
//! and reloads nginx, and serves
//! tengine's status page and Prometheus metrics.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use vigil_checker::nginx::{
    render_once, CheckOnly, CheckOnlyOptions, CommandLine, Guard, NginxControl, SyncOptions,
};
use vigil_checker::{CheckerOptions, TlsOptions, TlsPolicy};
use vigil_config::{literal_resolver, nginx};
use vigil_core::config::CheckConfig;

/// Arguments of `vigil check`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  vigil check --upstreams /etc/vigil/upstreams.conf --render-dir /etc/vigil/upstreams \\\n      --nginx-conf /etc/nginx/nginx.conf --status-listen 127.0.0.1:9902\n\nnginx.conf includes the rendered files inside http {}:  include /etc/vigil/upstreams/*.conf;\nSignals: SIGHUP re-reads --upstreams (unchanged servers keep their state); SIGUSR1 is accepted (no log file to reopen); SIGTERM, SIGINT and SIGQUIT stop.\nSee docs/checker-only.md."
)]
pub(crate) struct Args {
    /// Upstream blocks with tengine `check` directives (nginx syntax, at the
    /// top level or inside http {}), or a vigil TOML file (`.toml`).
    #[arg(long, value_name = "SRC")]
    upstreams: PathBuf,
    /// Directory for the rendered `NAME.conf` files (nginx.conf includes `DIR/*.conf`).
    #[arg(long, value_name = "DIR")]
    render_dir: PathBuf,
    /// The nginx.conf nginx runs with (for the default test and reload commands and the pid file).
    #[arg(long, value_name = "NGINX_CONF")]
    nginx_conf: PathBuf,
    /// The nginx binary (default: `nginx` on PATH, else /usr/sbin/nginx).
    #[arg(long, value_name = "BIN")]
    nginx_bin: Option<PathBuf>,
    /// Test command, run with /bin/sh -c (default: `BIN -t -c NGINX_CONF`).
    #[arg(long, value_name = "CMD")]
    nginx_test_cmd: Option<String>,
    /// Reload command, run with /bin/sh -c (default: `BIN -s reload -c NGINX_CONF`).
    #[arg(long, value_name = "CMD")]
    nginx_reload_cmd: Option<String>,
    /// nginx master's pid file, to verify reloads (default: the `pid` of NGINX_CONF, else /run/nginx.pid).
    #[arg(long, value_name = "PATH")]
    nginx_pid_file: Option<PathBuf>,
    /// Serve /status (tengine formats) and /metrics (Prometheus) here.
    #[arg(long, value_name = "ADDR")]
    status_listen: Option<SocketAddr>,
    /// Admin API address (`vigil status`, `explain`, `events`, `peer`; default 127.0.0.1:9901).
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// Bearer token for the admin API's write endpoints.
    #[arg(long, env = "VIGIL_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// A host name the admin API answers to besides IP addresses and
    /// localhost (repeatable). Requests naming any other Host get 421 (DNS
    /// rebinding).
    #[arg(long = "admin-host", value_name = "NAME", value_parser = vigil_core::config::AdminConfig::host_name)]
    admin_hosts: Vec<String>,
    /// Do not serve the admin API.
    #[arg(long)]
    no_admin: bool,
    /// Do not serve the web dashboard on the admin listener's `GET /` (it
    /// lists the endpoints instead).
    #[arg(long)]
    no_dashboard: bool,
    /// tengine `check` parameters for upstreams without a check,
    /// e.g. "type=http interval=5000 rise=2 fall=3 timeout=1000".
    #[arg(long, value_name = "PARAMS")]
    default_check: Option<String>,
    /// Raw request of the default http check, with \r\n escapes
    /// (tengine's check_http_send; default "GET / HTTP/1.0\r\n\r\n").
    #[arg(long, value_name = "REQUEST", conflicts_with_all = ["default_check_http_path", "default_check_http_method", "default_check_http_host"])]
    default_check_http_send: Option<String>,
    /// Method of the default http check's request (with --default-check-http-path).
    #[arg(long, value_name = "METHOD", default_value = "GET")]
    default_check_http_method: String,
    /// Path of the default http check's request (builds an HTTP/1.0 request).
    #[arg(long, value_name = "PATH")]
    default_check_http_path: Option<String>,
    /// Host header of the default http check's request.
    #[arg(long, value_name = "HOST")]
    default_check_http_host: Option<String>,
    /// Accepted statuses of the default http check (tengine's check_http_expect_alive).
    #[arg(long, value_name = "CLASSES")]
    default_check_http_expect_alive: Option<String>,
    /// Primaries per upstream that stay in nginx whatever the probes say: when more fail,
    /// the least bad are kept up (core's max_ejected rule, count form; an upstream's own
    /// `max_ejected P%` applies too, the stricter wins). 0: no guard.
    #[arg(long, default_value_t = 1, value_name = "N")]
    min_healthy: usize,
    /// No guard: mark down every server the probes fail, even all of them (an upstream's
    /// own `max_ejected` still applies).
    #[arg(long)]
    fail_closed: bool,
    /// Quiet time after the last transition before rendering a change that takes no
    /// server out (servers coming back, bursts); a server leaving nginx does not wait.
    #[arg(long, default_value = "1s", value_parser = crate::cmd::parse_duration, value_name = "TIME")]
    debounce: Duration,
    /// Longest a burst of transitions may delay such a render.
    #[arg(long, default_value = "5s", value_parser = crate::cmd::parse_duration, value_name = "TIME")]
    max_delay: Duration,
    /// Least time between two reloads, unless the second takes a server out of nginx.
    #[arg(long, default_value = "5s", value_parser = crate::cmd::parse_duration, value_name = "TIME")]
    reload_min_interval: Duration,
    /// Least time between a reload and one that takes a server out of nginx (rendered
    /// `down`), which is rendered, tested and reloaded at once otherwise.
    #[arg(long, default_value = "1s", value_parser = crate::cmd::parse_duration, value_name = "TIME")]
    down_reload_min_interval: Duration,
    /// How long a reload may take to show new nginx workers.
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration, value_name = "TIME")]
    reload_verify_timeout: Duration,
    /// Probes in flight at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_concurrent_probes: usize,
    /// One probe per server line even when several upstreams name the same server.
    #[arg(long)]
    no_dedup: bool,
    /// Extra CA certificates (PEM) for https probes.
    #[arg(long, value_name = "PEM")]
    probe_ca: Option<PathBuf>,
    /// Do not verify certificates of https probes.
    #[arg(long)]
    probe_no_verify: bool,
    /// Client certificate (PEM) for https probes.
    #[arg(long, value_name = "PEM", requires = "probe_client_key")]
    probe_client_cert: Option<PathBuf>,
    /// Client certificate key (PEM) for https probes.
    #[arg(long, value_name = "PEM", requires = "probe_client_cert")]
    probe_client_key: Option<PathBuf>,
    /// Render the files as written in SRC, test them, and exit (before nginx first starts).
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    fleet: crate::fleet::FleetArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    crate::cmd::init_logging();
    let mut options = options(&args)?;
    let fleet = crate::fleet::Settings::gather(&args.fleet, Some(&args.upstreams))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        if args.once {
            render_once(&options).await?;
            tracing::info!(dir = %options.sync.render_dir.display(), "files rendered and tested");
            return Ok(ExitCode::SUCCESS);
        }
        // Fleet mode: the fleet chooses who probes what (joining runs in
        // the background; until then every target is probed here).
        let fleet = match &fleet {
            Some(s) if !args.once => Some(std::sync::Arc::new(crate::fleet::Member::start(s)?)),
            _ => None,
        };
        options.checker.sharing = fleet.as_ref().and_then(|f| f.sharing());
        let running = CheckOnly::start(options).await?;
        if let Some(f) = &fleet {
            f.attach(running.checker());
            f.wire_events(running.events(), running.clock());
        }
        if let Some(addr) = running.status_addr() {
            tracing::info!(%addr, "status page on /status and /metrics");
        }
        let stop_admin = tokio_util::sync::CancellationToken::new();
        let mut serving = None;
        if !args.no_admin {
            let checker = running.checker().clone();
            let c2 = checker.clone();
            let status = vigil_checker::status::StatusPage::for_checker(checker);
            let annotator = running.annotator();
            let sync = running.annotator();
            let admin = crate::admin::Admin::new(
                move || c2.registry(),
                running.clock().clone(),
                running.events().clone(),
                args.admin_token.clone(),
                status,
            )
            .with_annotate(move |view| annotator.annotate(view))
            .with_nginx_status(move || sync.sync_view())
            .with_dashboard(!args.no_dashboard)
            .with_hosts(args.admin_hosts.clone());
            let admin = match fleet.clone() {
                Some(f) => admin.with_fleet(move || f.view_json()),
                None => admin,
            };
            let reloader = running.source_reloader();
            admin.set_reload(move || source_reload(&reloader));
            let explicit = args.admin_listen.is_some();
            let addr = args.admin_listen.unwrap_or(crate::admin::DEFAULT_LISTEN);
            match admin.clone().listen(addr, stop_admin.clone()).await {
                Ok(_) => serving = Some(admin),
                Err(e @ crate::admin::AdminError::Bind { .. }) if !explicit => {
                    crate::admin::warn_default_unavailable(&e, "set --admin-listen");
                }
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(targets = running.checker().targets(), "probing");
        signals(&running, serving.as_ref()).await?;
        stop_admin.cancel();
        if let Some(f) = &fleet {
            f.leave().await;
        }
        running.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

async fn signals(running: &CheckOnly, admin: Option<&crate::admin::Admin>) -> anyhow::Result<()> {
    let mut signals = crate::cmd::Signals::install()?;
    let reloader = running.source_reloader();
    loop {
        match signals.next().await {
            crate::cmd::SignalAction::Reload => {
                let r = source_reload(&reloader);
                if let Some(admin) = admin {
                    admin.record_reload(&r);
                }
            }
            // Its only log is standard error, which is not reopened.
            crate::cmd::SignalAction::Reopen => {
                tracing::info!("SIGUSR1: vigil check writes no log file (its log is standard error); nothing to reopen")
            }
            crate::cmd::SignalAction::Unsupported(name) => crate::cmd::refuse_upgrade(name),
            crate::cmd::SignalAction::Quit
            | crate::cmd::SignalAction::Terminate
            | crate::cmd::SignalAction::Interrupt => break,
        }
    }
    tracing::info!("shutting down");
    Ok(())
}

/// Re-read the upstreams source (SIGHUP, `POST /api/reload`): the new
/// generation, or the error (with file:line:col for a bad source).
fn source_reload(reloader: &vigil_checker::nginx::SourceReloader) -> Result<u64, String> {
    match reloader.reload() {
        Ok((generation, s)) => {
            tracing::info!(
                generation,
                kept = s.kept,
                started = s.started,
                stopped = s.stopped,
                "upstreams source reloaded"
            );
            Ok(generation)
        }
        Err(e) => {
            tracing::error!(error = %e, "reload of the upstreams source failed; keeping the running one");
            Err(e.to_string())
        }
    }
}

fn options(args: &Args) -> anyhow::Result<CheckOnlyOptions> {
    let bin = args.nginx_bin.clone().unwrap_or_else(find_nginx);
    let mut control = NginxControl::new(&bin, &args.nginx_conf);
    if let Some(cmd) = &args.nginx_test_cmd {
        control.test = CommandLine::Shell(cmd.clone());
    }
    if let Some(cmd) = &args.nginx_reload_cmd {
        control.reload = CommandLine::Shell(cmd.clone());
    }
    if let Some(p) = &args.nginx_pid_file {
        control.pid_file = p.clone();
    }
    control.verify_timeout = args.reload_verify_timeout;
    let mut sync = SyncOptions::new(args.render_dir.clone());
    sync.guard = Guard {
        min_healthy: args.min_healthy,
        fail_open: !args.fail_closed,
    };
    sync.debounce = args.debounce;
    sync.max_delay = args.max_delay;
    sync.min_reload_interval = args.reload_min_interval;
    sync.down_reload_interval = args.down_reload_min_interval;
    let tls = TlsOptions {
        verify: !args.probe_no_verify,
        ca_file: args.probe_ca.clone(),
        client_cert: args.probe_client_cert.clone(),
        client_key: args.probe_client_key.clone(),
    };
    Ok(CheckOnlyOptions {
        source: args.upstreams.clone(),
        default_check: default_check(args)?,
        control,
        sync,
        checker: CheckerOptions {
            max_concurrent: args.max_concurrent_probes,
            dedup: !args.no_dedup,
            tls: TlsPolicy::uniform(tls),
            ..CheckerOptions::default()
        },
        status_listen: args.status_listen,
    })
}

/// The default check, parsed by the nginx front end as tengine's directives.
fn default_check(args: &Args) -> anyhow::Result<Option<CheckConfig>> {
    // As the text of a quoted nginx string: a raw --default-check-http-send
    // keeps its \r\n escapes for nginx's unescaping; a built request has
    // real CR LF bytes and only needs quotes and backslashes escaped.
    let send = match (&args.default_check_http_send, &args.default_check_http_path) {
        (Some(raw), _) => Some(raw.replace('"', "\\\"")),
        (None, Some(path)) => Some(
            vigil_checker::probe::http_request(
                &args.default_check_http_method,
                path,
                args.default_check_http_host.as_deref(),
            )
            .replace('\\', "\\\\")
            .replace('"', "\\\""),
        ),
        (None, None) => None,
    };
    let Some(params) = &args.default_check else {
        if send.is_some() || args.default_check_http_expect_alive.is_some() {
            anyhow::bail!("--default-check-http-* needs --default-check");
        }
        return Ok(None);
    };
    let mut text = format!("upstream default_check {{ server 127.0.0.1:1; check {params};");
    if let Some(send) = send {
        text.push_str(&format!(" check_http_send \"{send}\";"));
    }
    if let Some(e) = &args.default_check_http_expect_alive {
        text.push_str(&format!(" check_http_expect_alive {e};"));
    }
    text.push_str(" }");
    let loaded = nginx::load_str(
        &text,
        Path::new("--default-check"),
        Path::new("."),
        &literal_resolver,
    )
    .context("--default-check")?;
    Ok(loaded
        .config
        .upstreams
        .into_iter()
        .next()
        .and_then(|u| u.check))
}

fn find_nginx() -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("nginx");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from("/usr/sbin/nginx")
}
