//! `vigil events`: the transition log.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use crate::client;

/// Arguments of `vigil events`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 done, 2 the admin API could not be reached.\n\nExamples:\n  vigil events\n  vigil events --follow --upstream api"
)]
pub(crate) struct Args {
    /// Keep printing new events until Ctrl-C.
    #[arg(long, short)]
    follow: bool,
    /// Only this upstream's events.
    #[arg(long)]
    upstream: Option<String>,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut since = 0u64;
        let mut widths = Widths::default();
        loop {
            let mut path = format!("/api/events?since={since}&limit=1000");
            if let Some(u) = &args.upstream {
                path.push_str(&format!("&upstream={}", client::encode(u)));
            }
            let v = client::get(args.admin, &path).await?;
            let mut out = std::io::stdout().lock();
            if v["missed"].as_u64().unwrap_or(0) > 0 {
                writeln!(
                    out,
                    "({} older events were dropped from the bounded log)",
                    v["missed"]
                )?;
            }
            let events: &[serde_json::Value] = v["events"].as_array().map_or(&[], |a| a);
            if !args.json {
                widths.grow(events);
            }
            for e in events {
                if args.json {
                    writeln!(out, "{e}")?;
                } else {
                    writeln!(out, "{}", widths.line(e))?;
                }
            }
            out.flush()?;
            since = v["next"].as_u64().unwrap_or(since);
            if !args.follow {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

/// Column widths of the event lines: at least the usual figures, grown to
/// the widest id, upstream and peer seen so far (never shrunk, so that
/// `--follow` keeps its columns).
#[derive(Debug)]
struct Widths {
    seq: usize,
    upstream: usize,
    peer: usize,
    kind: usize,
}

impl Default for Widths {
    fn default() -> Self {
        Self {
            seq: 5,
            upstream: 14,
            peer: 22,
            kind: 13,
        }
    }
}

impl Widths {
    fn grow(&mut self, events: &[serde_json::Value]) {
        for e in events {
            self.seq = self.seq.max(seq(e).len());
            self.upstream = self.upstream.max(text(e, "upstream").chars().count());
            self.peer = self.peer.max(text(e, "peer").chars().count());
            self.kind = self.kind.max(text(e, "kind").chars().count());
        }
    }

    /// `HH:MM:SS #SEQ UPSTREAM PEER KIND TEXT`, padded to the widths.
    fn line(&self, e: &serde_json::Value) -> String {
        format!(
            "{} #{:<ws$} {:<wu$} {:<wp$} {:<wk$} {}",
            client::clock(e["at_unix_ms"].as_u64().unwrap_or(0)),
            seq(e),
            text(e, "upstream"),
            text(e, "peer"),
            text(e, "kind"),
            text(e, "text"),
            ws = self.seq,
            wu = self.upstream,
            wp = self.peer,
            wk = self.kind,
        )
        .trim_end()
        .to_string()
    }
}

fn seq(e: &serde_json::Value) -> String {
    e["seq"].as_u64().map(|n| n.to_string()).unwrap_or_default()
}

fn text<'a>(e: &'a serde_json::Value, key: &str) -> &'a str {
    e[key].as_str().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_stay_aligned_for_ids_names_and_peers_of_any_width() {
        let ev = |seq: u64, upstream: &str, peer: &str, kind: &str| {
            serde_json::json!({"seq": seq, "at_unix_ms": 3_600_000, "upstream": upstream,
                "peer": peer, "kind": kind, "text": "the sentence"})
        };
        let events = vec![
            ev(9, "app", "10.0.0.1:80", "probe_down"),
            ev(10, "app", "10.0.0.1:80", "probe_up"),
            ev(
                1_234_567,
                "a-rather-long-upstream-name",
                "backend.internal.example.com:8080",
                "excluded",
            ),
        ];
        let mut w = Widths::default();
        w.grow(&events);
        let lines: Vec<String> = events.iter().map(|e| w.line(e)).collect();
        let start = |l: &str, s: &str| l.find(s).unwrap_or_else(|| panic!("{s:?} in {l:?}"));
        let kind_at = start(&lines[2], "excluded");
        assert_eq!(start(&lines[0], "probe_down"), kind_at, "{lines:#?}");
        assert_eq!(start(&lines[1], "probe_up"), kind_at, "{lines:#?}");
        let text_at = start(&lines[0], "the sentence");
        assert!(
            lines.iter().all(|l| start(l, "the sentence") == text_at),
            "{lines:#?}"
        );
        assert!(lines[0].starts_with("01:00:00 #9       app "), "{lines:#?}");
        // Ids wider than the minimum still leave a blank before the upstream.
        assert!(
            lines[2].starts_with("01:00:00 #1234567 a-rather-long-upstream-name "),
            "{lines:#?}"
        );
        // --follow: a later, narrower batch keeps the columns.
        w.grow(&[ev(11, "app", "10.0.0.1:80", "probe_up")]);
        let later = w.line(&ev(11, "app", "10.0.0.1:80", "probe_up"));
        assert_eq!(start(&later, "probe_up"), kind_at, "{later}");
    }
}
