//! tengine's status formats, byte for byte (`ngx_http_upstream_check_module`
//! in Tengine: html, csv, json with the `up`/`down` totals, prometheus),
//! with one deliberate difference: `nginx_upstream_server_rise` and
//! `_fall` are typed `gauge` (they reset to 0; tengine says `counter`).

use std::fmt::Write as _;
use std::sync::Arc;

use vigil_core::config::CheckKind;
use vigil_core::health::HealthState;
use vigil_core::registry::Registry;

/// One checked peer, as the status page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Position among all checked peers (stable under the `status=` filter).
    pub index: usize,
    /// The upstream.
    pub upstream: Arc<str>,
    /// The server's address as written.
    pub name: Arc<str>,
    /// Up or down, as the probes say.
    pub up: bool,
    /// Consecutive passes.
    pub rise: u32,
    /// Consecutive failures.
    pub fall: u32,
    /// `tcp`, `http` or `https`.
    pub kind: &'static str,
    /// `port=`, 0 when unset (same as the server).
    pub port: u16,
}

/// The `status=` filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Every row.
    All,
    /// Up rows only.
    Up,
    /// Down rows only.
    Down,
}

/// Every checked peer of `registry`, in config order.
pub fn rows(registry: &Registry) -> Vec<Row> {
    let mut out = Vec::new();
    for up in registry.upstreams() {
        let Some(check) = up.config().check.as_ref() else {
            continue;
        };
        let kind = match check.kind {
            CheckKind::Tcp => "tcp",
            CheckKind::Http => "http",
            CheckKind::Https => "https",
        };
        for peer in up.peers() {
            let view = peer.health().view();
            out.push(Row {
                index: out.len(),
                upstream: up.name().clone(),
                name: peer.name().clone(),
                up: view.state != Some(HealthState::Down),
                rise: view.ok_streak,
                fall: view.fail_streak,
                kind,
                port: check.port.unwrap_or(0),
            });
        }
    }
    out
}

impl Filter {
    fn keeps(self, r: &Row) -> bool {
        match self {
            Filter::All => true,
            Filter::Up => r.up,
            Filter::Down => !r.up,
        }
    }
}

fn word(up: bool) -> &'static str {
    if up {
        "up"
    } else {
        "down"
    }
}

/// tengine's html page.
pub fn html(rows: &[Row], filter: Filter, generation: u64) -> String {
    let shown: Vec<&Row> = rows.iter().filter(|r| filter.keeps(r)).collect();
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html PUBLIC \"-//W3C//DTD XHTML 1.0 Strict//EN\n\
         \"http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd\">\n\
         <html xmlns=\"http://www.w3.org/1999/xhtml\">\n\
         <head>\n  <title>Nginx http upstream check status</title>\n</head>\n\
         <body>\n<h1>Nginx http upstream check status</h1>\n\
         <h2>Check upstream server number: {}, generation: {generation}</h2>\n\
         <table style=\"background-color:white\" cellspacing=\"0\"        cellpadding=\"3\" border=\"1\">\n\
         \x20 <tr bgcolor=\"#C0C0C0\">\n\
         \x20   <th>Index</th>\n    <th>Upstream</th>\n    <th>Name</th>\n    <th>Status</th>\n\
         \x20   <th>Rise counts</th>\n    <th>Fall counts</th>\n    <th>Check type</th>\n\
         \x20   <th>Check port</th>\n  </tr>\n",
        shown.len()
    );
    for r in shown {
        let _ = write!(
            out,
            "  <tr{}>\n    <td>{}</td>\n    <td>{}</td>\n    <td>{}</td>\n    <td>{}</td>\n    <td>{}</td>\n    <td>{}</td>\n    <td>{}</td>\n    <td>{}</td>\n  </tr>\n",
            if r.up { "" } else { " bgcolor=\"#FF0000\"" },
            r.index,
            html_escape(&r.upstream),
            html_escape(&r.name),
            word(r.up),
            r.rise,
            r.fall,
            r.kind,
            r.port
        );
    }
    out.push_str("</table>\n</body>\n</html>\n");
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// tengine's csv: one line per peer, no header.
pub fn csv(rows: &[Row], filter: Filter) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| filter.keeps(r)) {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{}",
            r.index,
            r.upstream,
            r.name,
            word(r.up),
            r.rise,
            r.fall,
            r.kind,
            r.port
        );
    }
    out
}

/// tengine's json (with the `up`/`down` totals; strings escaped, which
/// tengine does not do but nginx names never need).
pub fn json(rows: &[Row], filter: Filter, generation: u64) -> String {
    let shown: Vec<&Row> = rows.iter().filter(|r| filter.keeps(r)).collect();
    let up = shown.iter().filter(|r| r.up).count();
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\"servers\": {{\n  \"total\": {},\n  \"up\": {up},\n  \"down\": {},\n  \"generation\": {generation},\n  \"server\": [\n",
        shown.len(),
        shown.len() - up
    );
    for (i, r) in shown.iter().enumerate() {
        let _ = writeln!(
            out,
            "    {{\"index\": {}, \"upstream\": \"{}\", \"name\": \"{}\", \"status\": \"{}\", \"rise\": {}, \"fall\": {}, \"type\": \"{}\", \"port\": {}}}{}",
            r.index,
            json_escape(&r.upstream),
            json_escape(&r.name),
            word(r.up),
            r.rise,
            r.fall,
            r.kind,
            r.port,
            if i + 1 == shown.len() { "" } else { "," }
        );
    }
    out.push_str("  ]\n}}\n");
    out
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// tengine's prometheus output.
pub fn prometheus(rows: &[Row], filter: Filter, generation: u64) -> String {
    let shown: Vec<&Row> = rows.iter().filter(|r| filter.keeps(r)).collect();
    let up = shown.iter().filter(|r| r.up).count();
    let mut out = String::new();
    for (name, help, value) in [
        (
            "nginx_upstream_count_total",
            "Nginx total number of servers",
            shown.len() as u64,
        ),
        (
            "nginx_upstream_count_up",
            "Nginx total number of servers that are UP",
            up as u64,
        ),
        (
            "nginx_upstream_count_down",
            "Nginx total number of servers that are DOWN",
            (shown.len() - up) as u64,
        ),
        (
            "nginx_upstream_count_generation",
            "Nginx generation",
            generation,
        ),
    ] {
        header(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name} {value}");
    }
    let labels = |r: &Row, status: bool| {
        let status = if status {
            format!(",status=\"{}\"", word(r.up))
        } else {
            String::new()
        };
        format!(
            "index=\"{}\",upstream=\"{}\",name=\"{}\"{status},type=\"{}\",port=\"{}\"",
            r.index,
            escape(&r.upstream),
            escape(&r.name),
            r.kind,
            r.port
        )
    };
    header(
        &mut out,
        "nginx_upstream_server_rise",
        "gauge",
        "Nginx rise counter",
    );
    for r in &shown {
        let _ = writeln!(
            out,
            "nginx_upstream_server_rise{{{}}} {}",
            labels(r, true),
            r.rise
        );
    }
    header(
        &mut out,
        "nginx_upstream_server_fall",
        "gauge",
        "Nginx fall counter",
    );
    for r in &shown {
        let _ = writeln!(
            out,
            "nginx_upstream_server_fall{{{}}} {}",
            labels(r, true),
            r.fall
        );
    }
    header(
        &mut out,
        "nginx_upstream_server_active",
        "gauge",
        "Nginx active 1 for UP / 0 for DOWN",
    );
    for r in &shown {
        let _ = writeln!(
            out,
            "nginx_upstream_server_active{{{}}} {}",
            labels(r, false),
            u8::from(r.up)
        );
    }
    out
}

/// `# HELP` and `# TYPE` lines.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A Prometheus label value, escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
