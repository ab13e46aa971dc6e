//! Misuse of vigil's traffic rules (`retry_budget`, `hedge`): settings that
//! load but do nothing, or do more than they seem to.

use super::{finding, Positioned, Severity};
use vigil_core::config::{Config, Location, UpstreamConfig};
use vigil_core::outcome::FailureClass;

pub(super) const HEDGE_NEVER_SENT: &str = "hedge-never-sent";
pub(super) const HEDGE_SINGLE_SERVER: &str = "hedge-single-server";
pub(super) const HEDGE_WITHOUT_BUDGET: &str = "hedge-without-budget";
pub(super) const RETRY_BUDGET_ZERO: &str = "retry-budget-zero";

pub(super) fn lint(config: &Config, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    budget(up, out);
    hedge(config, up, out);
}

/// `retry-budget-zero`: ratio=0% and min=0/s forbid every retry.
fn budget(up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(b) = up.rules.retry_budget else {
        return;
    };
    if b.ratio_percent != 0 || b.min_per_sec != 0 {
        return;
    }
    out.push(finding(
        RETRY_BUDGET_ZERO,
        Severity::Warning,
        &up.rules.origins.retry_budget,
        format!(
            "upstream {}: retry_budget ratio=0% min=0/s allows no retry and no hedge at all",
            up.name
        ),
        "retry_budget pays for each retry or hedge with R% of the requests plus N per \
         second; with both at zero nothing is ever paid, so every failure is answered as if \
         proxy_next_upstream were off (and hedge never sends anything). Write \
         proxy_next_upstream off; if that is the intent, or give the budget a ratio (20% is \
         Finagle's and Envoy's default) and a small reserve (min=3/s)."
            .to_string(),
    ));
}

/// `hedge-single-server`, `hedge-never-sent`, `hedge-without-budget`.
fn hedge(config: &Config, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(h) = up.rules.hedge else {
        return;
    };
    let at = &up.rules.origins.hedge;
    if up.is_single() {
        out.push(finding(
            HEDGE_SINGLE_SERVER,
            Severity::Warning,
            at,
            format!(
                "upstream {}: hedge does nothing with a single server",
                up.name
            ),
            "A hedge sends the request to another peer; with one server (and no backup) \
             there is none, and nginx's single-server rule never moves a request on anyway. \
             Add servers or remove hedge."
                .to_string(),
        ));
        return;
    }
    let locations: Vec<&Location> = config
        .servers
        .iter()
        .flat_map(|b| &b.locations)
        .filter(|l| l.proxy.pass.as_ref().is_some_and(|p| p.upstream == up.name))
        .collect();
    let may_hedge = |l: &&Location| {
        l.proxy.next_upstream.contains(FailureClass::Timeout) && l.proxy.next_upstream_tries != 1
    };
    if !locations.is_empty() && !locations.iter().any(may_hedge) {
        out.push(finding(
            HEDGE_NEVER_SENT,
            Severity::Warning,
            at,
            format!(
                "upstream {}: hedge is never sent: no location proxying to it may move a request on after a timeout",
                up.name
            ),
            "A hedge is a retry sent early, so it follows the retry rules of the location: \
             proxy_next_upstream must list timeout (nginx's default `error timeout` does) and \
             proxy_next_upstream_tries must allow a second attempt. Every location using this \
             upstream has proxy_next_upstream without timeout (or off) or tries 1, so no \
             request is ever hedged. POST, LOCK and PATCH are never hedged either, even with \
             non_idempotent, and neither is a body streamed with proxy_request_buffering off."
                .to_string(),
        ));
        return;
    }
    if up.rules.retry_budget.is_none() {
        out.push(finding(
            HEDGE_WITHOUT_BUDGET,
            Severity::Info,
            at,
            format!(
                "upstream {}: hedge without retry_budget may send up to {} times the requests when every peer is slow",
                up.name,
                1 + h.max.get()
            ),
            "Each hedge is a second copy of a request. When one peer hangs that is what \
             hides it; when the whole upstream is slow (overload), every request is hedged \
             and the load multiplies exactly when the servers can least take it. A \
             retry_budget (for example `retry_budget ratio=20% min=3/s;`) caps hedges and \
             retries together at a share of the traffic; a denied hedge just keeps waiting \
             for the first attempt."
                .to_string(),
        ));
    }
}
