//! Misuse of vigil's peer rules beyond nginx (`passive_count`,
//! `passive_recovery`, `passive_penalty`, `slow_start`, `max_ejected`).
//! Settings that cannot work at all are load errors (see `error.rs`:
//! `passive_recovery probe` without `check`, `slow_start` with a hash);
//! these are the ones that load but do not do what they seem to.

use super::{finding, t, Cx, Positioned, Severity};
use vigil_core::config::{Config, UpstreamConfig};
use vigil_core::outcome::FailureClass;

pub(super) const PENALTY_MAX_BELOW_BASE: &str = "passive-penalty-max-below-base";
pub(super) const MAX_EJECTED_ZERO: &str = "max-ejected-zero";
pub(super) const MAX_EJECTED_ALL: &str = "max-ejected-all";
pub(super) const MAX_EJECTED_WITH_BACKUP: &str = "max-ejected-with-backup";
pub(super) const LAST_TRY_NOTHING_LISTED: &str = "last-try-nothing-listed";

pub(super) fn lint(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let config = cx.config;
    penalty(cx, up, out);
    max_ejected(up, out);
    last_try(config, up, out);
}

/// `passive-penalty-max-below-base`: the cap is below the first exclusion.
fn penalty(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(p) = &up.rules.penalty else {
        return;
    };
    if p.max >= p.base {
        return;
    }
    out.push(finding(
        PENALTY_MAX_BELOW_BASE,
        Severity::Warning,
        &cx.at_upstream_param(up, "passive_penalty", "max", &up.rules.origins.penalty),
        format!(
            "upstream {}: passive_penalty max={} is below base={}: every exclusion lasts {} and never grows",
            up.name,
            t(p.max),
            t(p.base),
            t(p.max)
        ),
        format!(
            "passive_penalty makes the k-th exclusion in a row last min(base × 2^(k−1), max), \
             so with max ({max}) under base ({base}) the cap wins from the first exclusion on: \
             every exclusion lasts {max}, the growth the directive is for never happens, and \
             the clean period that resets it is {max} too. Swap the values if they were \
             written the wrong way round (base is the first, short pause; max the longest), \
             or drop passive_penalty and set fail_timeout={max} for a fixed pause.",
            max = t(p.max),
            base = t(p.base)
        ),
    ));
}

/// `max-ejected-zero`, `max-ejected-all`, `max-ejected-with-backup`.
fn max_ejected(up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(pct) = up.rules.max_ejected else {
        return;
    };
    let at = &up.rules.origins.max_ejected;
    if pct == 0 {
        out.push(finding(
            MAX_EJECTED_ZERO,
            Severity::Warning,
            at,
            format!(
                "upstream {}: max_ejected 0% never lets a health rule take a primary out",
                up.name
            ),
            "max_ejected caps how many primaries the health rules (passive exclusion, active \
             checks, a pending recovery probe) may eject at once. At 0% that is none: a \
             primary that fails every request or every probe keeps getting its share of \
             requests, as if max_fails and the check were not there. If the intent is a \
             fail-open guard, use a percentage such as 50%: the worst peers are still ejected \
             and at least one primary always stays eligible."
                .to_string(),
        ));
    } else if pct == 100 {
        out.push(finding(
            MAX_EJECTED_ALL,
            Severity::Info,
            at,
            format!(
                "upstream {}: max_ejected 100% limits nothing except that one primary always stays eligible",
                up.name
            ),
            "max_ejected 100% allows every primary to be ejected, but vigil always keeps at \
             least one primary in service (the one with the best recent record), so the rule \
             still acts when every primary is failing: that last one gets every request \
             instead of an immediate 502 \"no live upstreams\" (and backups, if any, are not \
             used). If that is the intent, this is fine; a lower percentage also keeps the \
             rest of the fleet from being ejected at once by a shared cause."
                .to_string(),
        ));
    }
    if pct > 0 && up.servers.iter().any(|s| s.backup && !s.down) {
        out.push(finding(
            MAX_EJECTED_WITH_BACKUP,
            Severity::Info,
            at,
            format!(
                "upstream {}: with max_ejected, backup servers are used only when no primary is in service",
                up.name
            ),
            "Backups take requests only when no primary is eligible. max_ejected always keeps \
             at least one primary eligible (the least bad of the ejected ones), so failures and \
             probes alone never send traffic to the backups any more: only primaries that are \
             `down`, set down or draining through the admin API, or at max_conns do. Remove \
             max_ejected if the backups are the fallback for a failing primary tier."
                .to_string(),
        ));
    }
}

/// `last-try-nothing-listed`: `passive_count last_try` with no location
/// listing a status that counts.
fn last_try(config: &Config, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    if !up.rules.count.last_try {
        return;
    }
    let counted = [
        FailureClass::Http500,
        FailureClass::Http502,
        FailureClass::Http503,
        FailureClass::Http504,
        FailureClass::Http429,
    ];
    let locations: Vec<_> = config
        .servers
        .iter()
        .flat_map(|b| &b.locations)
        .filter(|l| l.proxy.pass.as_ref().is_some_and(|p| p.upstream == up.name))
        .collect();
    if locations.is_empty() {
        return;
    }
    let listed = locations
        .iter()
        .any(|l| counted.iter().any(|c| l.proxy.next_upstream.contains(*c)));
    if listed {
        return;
    }
    out.push(finding(
        LAST_TRY_NOTHING_LISTED,
        Severity::Warning,
        &up.rules.origins.count,
        format!(
            "upstream {}: passive_count last_try does nothing: no location proxying to it lists http_500, http_502, http_503, http_504 or http_429 in proxy_next_upstream",
            up.name
        ),
        "last_try charges a listed status (http_503 and the others of proxy_next_upstream) \
         that could not be retried, where nginx counts it a success. An unlisted status is a \
         success in nginx and in vigil alike (the peer answered), so with no status listed \
         the rule never applies. Add the statuses that mean \"this peer is unwell\" to \
         proxy_next_upstream (for example `proxy_next_upstream error timeout http_502 \
         http_503;`), or remove last_try."
            .to_string(),
    ));
}
