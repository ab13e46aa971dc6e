//! `error_page` for the answers of a location that proxies, as
//! `ngx_http_send_error_page` makes them: for the errors vigil answers
//! itself (502, 504, 503, 500, ...) and, with `proxy_intercept_errors on`,
//! for an upstream's answer of 300 or more that has a page. The page is a
//! redirect (`error_page 404 =301 http://...`), or an internal redirect
//! (method GET, except HEAD) to a URI or a named location that answers
//! with `return` (after its rewrite phase). Pages are not applied to the
//! answer of a page (nginx's `recursive_error_pages off`).

use std::net::SocketAddr;
use std::sync::Arc;

use http::request::Parts;
use vigil_core::config::ErrorPage;

use crate::rewrite::Net;
use crate::route::{Answer, Reply, RouteError, Routes, Target};
use crate::vars::{Scope, Template, VarContext};

/// Marks a response vigil made itself (not an upstream's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Generated;

/// A location's compiled `error_page`s.
#[derive(Debug, Default)]
pub(crate) struct ErrorPages {
    pages: Vec<Page>,
    /// `proxy_intercept_errors`.
    intercept: bool,
}

#[derive(Debug)]
struct Page {
    codes: Vec<u16>,
    /// nginx's `overwrite`: -1 none, 0 `=`, else `=CODE`.
    overwrite: i32,
    to: To,
}

#[derive(Debug)]
enum To {
    /// A URI (`/x?a=1`): an internal redirect.
    Uri(Template),
    /// `@name`.
    Named(String),
    /// Anything else: a redirect to it.
    Redirect(Template),
}

// === impl ErrorPages ===

impl ErrorPages {
    pub(crate) fn build(
        pages: &[ErrorPage],
        intercept: bool,
        scope: &Scope,
    ) -> Result<Self, RouteError> {
        let mut out = Vec::new();
        for p in pages {
            let err = |message: String| RouteError {
                at: p.origin.to_string(),
                message,
            };
            let tpl = || Template::parse_with(&p.uri, scope).map_err(|e| err(e.to_string()));
            let to = if p.uri.starts_with('/') {
                To::Uri(tpl()?)
            } else if p.uri.starts_with('@') {
                To::Named(p.uri.clone())
            } else {
                To::Redirect(tpl()?)
            };
            out.push(Page {
                codes: p.codes.clone(),
                overwrite: p.answer.map_or(-1, i32::from),
                to,
            });
        }
        Ok(Self {
            pages: out,
            intercept,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The page for a response of `status` (`generated`: vigil made it).
    fn find(&self, status: u16, generated: bool) -> Option<&Page> {
        if !(generated || self.intercept && status >= 300) {
            return None;
        }
        self.pages.iter().find(|p| p.codes.contains(&status))
    }
}

/// What an error page makes of a response of `status`: the reply to send
/// and the status it gets; None keeps the response.
pub(crate) fn apply(
    routes: &Routes,
    pages: &ErrorPages,
    status: u16,
    generated: bool,
    mut parts: Parts,
    local: SocketAddr,
    client: SocketAddr,
) -> Option<(Arc<Reply>, Parts, Option<u16>)> {
    let page = pages.find(status, generated)?;
    // nginx's err_status: the original code, `=CODE`, or (`=`) the page's own.
    let forced = match page.overwrite {
        -1 => Some(status),
        0 => None,
        c => u16::try_from(c).ok(),
    };
    let net = Net { local, client };
    let cx = |parts: &Parts, t: &Template| {
        t.expand(&VarContext {
            parts,
            client,
            local,
            proxy_host: "",
            attempts: &[],
            status,
            request_time: 0.0,
        })
    };
    let server = parts.extensions.get::<Target>()?.server;
    let answer = match &page.to {
        To::Redirect(t) => {
            let url = cx(&parts, t);
            let code = forced
                .filter(|c| matches!(c, 301 | 302 | 303 | 307 | 308))
                .unwrap_or(302);
            let base = Reply::internal_error();
            return Some((Arc::new(base.redirect(code, &url)), parts, Some(code)));
        }
        To::Uri(t) => {
            let uri = cx(&parts, t);
            let (path, args) = uri.split_once('?').unwrap_or((&uri, ""));
            if parts.method != http::Method::HEAD {
                parts.method = http::Method::GET;
            }
            let t = parts.extensions.get_mut::<Target>()?;
            t.uri.rewrite(path.as_bytes().to_vec(), args.to_string());
            t.internal = true;
            routes.phases(server, net, &mut parts).ok()?
        }
        To::Named(name) => {
            let li = routes.router.named(server, name)?;
            routes.location_phase(server, li, net, &mut parts).ok()?
        }
    };
    match answer {
        Answer::Return(r) => Some((r, parts, forced)),
        // Refused at startup where it can be seen; after a rewrite, the
        // original response stays.
        Answer::Proxy(_) => None,
    }
}

/// Startup (and `vigil lint`): every page of a location that proxies
/// must be one vigil can answer: a literal URI or `@name` whose location
/// answers with `return` (a page that proxies is not implemented yet).
pub(crate) fn check(
    config: &vigil_core::config::Config,
    router: &crate::router::Router,
) -> Vec<RouteError> {
    let mut out = Vec::new();
    for (si, s) in config.servers.iter().enumerate() {
        for l in s.locations.iter().filter(|l| l.proxy.pass.is_some()) {
            for p in &l.proxy.error_pages {
                let err = |message: String| RouteError {
                    at: p.origin.to_string(),
                    message,
                };
                let li = if p.uri.starts_with('@') {
                    match router.named(si, &p.uri) {
                        Some(li) => Some(li),
                        None => {
                            out.push(err(format!("no location \"{}\" for error_page", p.uri)));
                            continue;
                        }
                    }
                } else if p.uri.starts_with('/') && !p.uri.contains('$') {
                    router.static_location(si, p.uri.split('?').next().unwrap_or(""))
                } else {
                    None
                };
                let proxies = li
                    .and_then(|li| s.locations.get(li))
                    .is_some_and(|t| t.proxy.pass.is_some() && t.ret.is_none());
                if proxies {
                    out.push(err(format!(
                        "error_page to a location that proxies is not implemented yet (\"{}\" must answer with return)",
                        p.uri
                    )));
                }
            }
        }
    }
    out
}
