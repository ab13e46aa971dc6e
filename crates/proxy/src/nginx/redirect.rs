//! What the upstream's response headers become for the client:
//! `proxy_hide_header` / `proxy_pass_header` over nginx's hidden set
//! (`Date`, `Server`, `X-Pad`, `X-Accel-*`), and `proxy_redirect` on
//! `Location` and `Refresh` (`ngx_http_proxy_rewrite_redirect`, 1.22): the
//! first rule whose REDIRECT starts the value (case-sensitive) replaces
//! that prefix; a rewritten `Location` that starts with `/` is made
//! absolute, as nginx's header filter does (`absolute_redirect on`).

use std::borrow::Cow;
use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName};
use vigil_core::config::{Location, RedirectRule};

use crate::nginx::vars::{Template, UnknownVariable, VarContext};

/// nginx's `ngx_http_proxy_hide_headers`.
const HIDDEN: &[&str] = &[
    "date",
    "server",
    "x-pad",
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

/// A location's response-header rules, compiled.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rules {
    hide: crate::wire::hop::Names,
    redirects: Vec<(Text, Text)>,
}

/// A rule's side: the default's are literal, a written one's may hold
/// variables.
#[derive(Debug, Clone)]
enum Text {
    Lit(String),
    Tpl(Template),
}

impl Text {
    /// The side's bytes for this request (a variable's as they came).
    fn expand(&self, cx: &VarContext<'_>) -> Cow<'_, [u8]> {
        match self {
            Text::Lit(s) => Cow::Borrowed(s.as_bytes()),
            Text::Tpl(t) => Cow::Owned(t.expand(cx)),
        }
    }
}

// === impl Rules ===

impl Rules {
    /// The rules of `loc` (its `proxy_pass` gives the default redirect).
    pub(crate) fn of(loc: &Location) -> Result<Self, UnknownVariable> {
        let p = &loc.proxy;
        let mut hide: Vec<HeaderName> = Vec::new();
        for name in HIDDEN
            .iter()
            .map(|s| s.to_string())
            .filter(|n| !p.pass_headers.contains(n))
            .chain(p.hide_headers.iter().cloned())
        {
            if let Ok(h) = HeaderName::from_bytes(name.as_bytes()) {
                if !hide.contains(&h) {
                    hide.push(h);
                }
            }
        }
        let mut redirects = Vec::new();
        let rules = match &p.redirect {
            None => &[][..],
            Some(r) if r.is_empty() => &[RedirectRule::Default][..],
            Some(r) => r.as_slice(),
        };
        for r in rules {
            match r {
                RedirectRule::Default => {
                    let Some(pass) = &p.pass else { continue };
                    let url = format!(
                        "{}://{}{}",
                        if pass.tls { "https" } else { "http" },
                        pass.upstream,
                        pass.uri.as_deref().unwrap_or("")
                    );
                    let (from, to) = match pass.uri.as_deref() {
                        Some(u) if !u.is_empty() => (url, loc.path.clone()),
                        _ => (format!("{url}/"), "/".to_string()),
                    };
                    redirects.push((Text::Lit(from), Text::Lit(to)));
                }
                RedirectRule::Rewrite {
                    redirect,
                    replacement,
                } => redirects.push((
                    Text::Tpl(Template::parse(redirect)?),
                    Text::Tpl(Template::parse(replacement)?),
                )),
            }
        }
        Ok(Self {
            hide: crate::wire::hop::Names::new(hide),
            redirects,
        })
    }

    /// The fields the client never sees (nginx's hidden set, less
    /// `proxy_pass_header`'s, with `proxy_hide_header`'s): an upstream
    /// head read by vigil leaves them out of its map as it builds it.
    pub(crate) fn hidden(&self) -> &crate::wire::hop::Names {
        &self.hide
    }

    /// Apply to the upstream's headers `h`, which the reader built without
    /// the hidden fields (upstream::head::parse_with).
    pub(crate) fn apply(&self, h: &mut HeaderMap, cx: &VarContext<'_>, local: SocketAddr) {
        let kept = crate::wire::hop::redirectable(h);
        if self.redirects.is_empty() {
            return;
        }
        if let Some(v) = kept
            .location
            .then(|| h.get(header::LOCATION))
            .flatten()
            .map(|v| v.as_bytes().to_vec())
        {
            if let Some(mut new) = self.rewrite(&v, 0, cx) {
                if new.starts_with(b"/") {
                    if let Some(t) = cx.target {
                        let mut abs = crate::nginx::router::absolute_prefix(t, local).into_bytes();
                        abs.extend_from_slice(&new);
                        new = abs;
                    }
                }
                set(h, header::LOCATION, new);
            }
        }
        if !kept.refresh {
            return;
        }
        let refresh = HeaderName::from_static("refresh");
        if let Some(v) = h.get(&refresh).map(|v| v.as_bytes().to_vec()) {
            let at = v
                .windows(4)
                .position(|w| w.eq_ignore_ascii_case(b"url="))
                .map(|i| i + 4);
            if let Some(new) = at.and_then(|at| self.rewrite(&v, at, cx)) {
                set(h, refresh, new);
            }
        }
    }

    /// The value with the first matching rule applied after `prefix`.
    fn rewrite(&self, v: &[u8], prefix: usize, cx: &VarContext<'_>) -> Option<Vec<u8>> {
        let rest = &v[prefix..];
        self.redirects.iter().find_map(|(from, to)| {
            let from = from.expand(cx);
            rest.starts_with(&from).then(|| {
                let mut out = v[..prefix].to_vec();
                out.extend_from_slice(&to.expand(cx));
                out.extend_from_slice(&rest[from.len()..]);
                out
            })
        })
    }
}

/// `name` set to `v`, or removed when `v` holds a byte no field can
/// carry (`vars::field_value`).
fn set(h: &mut HeaderMap, name: HeaderName, v: Vec<u8>) {
    match crate::nginx::vars::field_value(v) {
        Some(v) => {
            h.insert(name, v);
        }
        None => {
            h.remove(name);
        }
    }
}
