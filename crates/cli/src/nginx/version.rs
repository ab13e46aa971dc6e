//! `-v`, `-V` and `-h`: what vigil says it is when it stands in for nginx.
//!
//! `-V`'s configure line is how scripts and nginx's own test suite
//! (`Test::Nginx::has`) learn which modules are there: it names with
//! `--with-` the optional modules vigil implements and with `--without-`
//! every default module it does not, so that what vigil lacks is skipped
//! rather than failed. [`MODULES`] is that list; docs/nginx-cli.md prints it.

/// The nginx version vigil follows.
pub(crate) const NGINX_VERSION: &str = "1.22.1";

/// nginx's modules and whether vigil implements them (`true`), by the
/// configure flag that names them. Default modules are listed only when
/// vigil lacks them (`--without-`); optional ones only when it has them
/// (`--with-`).
pub(crate) const MODULES: &[(&str, bool)] = &[
    ("http_ssl_module", true),
    ("http_v2_module", true),
    ("http_realip_module", true),
    ("http_charset_module", false),
    ("http_ssi_module", false),
    ("http_userid_module", false),
    ("http_auth_basic_module", false),
    ("http_mirror_module", false),
    ("http_autoindex_module", false),
    ("http_geo_module", false),
    ("http_split_clients_module", false),
    ("http_referer_module", false),
    ("http_fastcgi_module", false),
    ("http_uwsgi_module", false),
    ("http_scgi_module", false),
    ("http_grpc_module", false),
    ("http_memcached_module", false),
    ("http_limit_conn_module", true),
    ("http_limit_req_module", true),
    ("http_empty_gif_module", false),
    ("http_browser_module", false),
    ("http_upstream_least_time_module", false),
    ("http_upstream_sticky", false),
    ("http_tunnel_module", false),
    ("http-cache", false),
    ("mail_pop3_module", false),
    ("mail_imap_module", false),
    ("mail_smtp_module", false),
];

/// The compiled-in paths vigil takes when none is given: Debian's nginx
/// package's.
pub(crate) const PREFIX: &str = "/usr/share/nginx/";
/// `--conf-path`.
pub(crate) const CONF_PATH: &str = "/etc/nginx/nginx.conf";
/// `--pid-path`.
pub(crate) const PID_PATH: &str = "/run/nginx.pid";
/// `--error-log-path`.
pub(crate) const ERROR_LOG_PATH: &str = "stderr";

/// `nginx version: nginx/1.22.1 (vigil X)`.
pub(crate) fn version_line() -> String {
    format!(
        "nginx version: nginx/{NGINX_VERSION} (vigil {})",
        env!("CARGO_PKG_VERSION")
    )
}

/// `-V`'s lines after the version.
pub(crate) fn configure() -> String {
    let mut flags = format!(
        "--prefix={} --conf-path={CONF_PATH} --error-log-path={ERROR_LOG_PATH} --pid-path={PID_PATH}",
        PREFIX.trim_end_matches('/')
    );
    for (name, has) in MODULES {
        let optional = matches!(
            *name,
            "http_ssl_module" | "http_v2_module" | "http_realip_module"
        );
        match (optional, has) {
            (true, true) => flags.push_str(&format!(" --with-{name}")),
            (false, false) => flags.push_str(&format!(" --without-{name}")),
            _ => {}
        }
    }
    // rustls, not OpenSSL: its TLS 1.2 and 1.3 are what nginx has with
    // OpenSSL 3.0, which is the version `has('openssl:N')` reads here.
    format!(
        "built with rustls in place of OpenSSL (TLS 1.2 and 1.3, as with OpenSSL 3.0.0)\n\
         TLS SNI support enabled\n\
         configure arguments: {flags}"
    )
}

/// `-h`'s usage, after the version line.
pub(crate) fn help() -> String {
    let prefix = PREFIX;
    format!(
        "Usage: nginx [-?hvVtTq] [-s signal] [-p prefix]\n\
         \x20            [-e filename] [-c filename] [-g directives]\n\
         \n\
         Options:\n\
         \x20 -?,-h         : this help\n\
         \x20 -v            : show version and exit\n\
         \x20 -V            : show version and configure options then exit\n\
         \x20 -t            : test configuration and exit\n\
         \x20 -T            : test configuration, dump it and exit\n\
         \x20 -q            : suppress non-error messages during configuration testing\n\
         \x20 -s signal     : send signal to a master process: stop, quit, reopen, reload\n\
         \x20 -p prefix     : set prefix path (default: {prefix})\n\
         \x20 -e filename   : set error log file (default: {ERROR_LOG_PATH})\n\
         \x20 -c filename   : set configuration file (default: {CONF_PATH})\n\
         \x20 -g directives : set global directives out of configuration file\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configure_line_names_what_vigil_lacks_and_the_optional_modules_it_has() {
        let v = configure();
        assert!(v.contains(" --with-http_ssl_module"));
        assert!(v.contains(" --with-http_realip_module"));
        assert!(v.contains(" --without-http_ssi_module"));
        assert!(v.contains(" --without-http-cache"));
        assert!(!v.contains("--with-stream"), "stream is not claimed");
        assert!(!v.contains("--without-http_gzip_module"), "gzip is vigil's");
        assert!(v.contains("TLS SNI support enabled"));
        // Test::Nginx's has('openssl:1.1.1') reads `with OpenSSL N`.
        assert!(v.contains("with OpenSSL 3.0.0"));
        assert!(version_line().starts_with("nginx version: nginx/1.22.1 "));
    }
}
