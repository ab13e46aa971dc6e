//! `error_page` for the answers of a location that proxies, as
//! `ngx_http_send_error_page` makes them: for the errors vigil answers
//! itself (502, 504, 503, 500, ...) and, with `proxy_intercept_errors on`,
//! for an upstream's answer of 300 or more that has a page. The page is a
//! redirect (`error_page 404 =301 http://...`), or an internal redirect
//! (method GET, except HEAD, for a URI; a named location keeps the
//! method) to a URI or a named location, which answers with `return` or
//! proxies (after its rewrite and access phases; the request body goes
//! again, as nginx sends `r->request_body` again). Pages are not applied
//! to the answer of a page (nginx's `recursive_error_pages off`).

use std::net::SocketAddr;
use std::sync::Arc;

use http::request::Parts;
use vigil_core::config::ErrorPage;

use crate::rewrite::Net;
use crate::route::{Answer, Refusal, Reply, RouteError, Routes, Target};
use crate::vars::{Scope, Template, VarContext};

/// Marks a response vigil made itself (not an upstream's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Generated;

/// Marks a request an `error_page` redirected: its answer gets `status`
/// (None: the page's own, `=`), and is not paged again.
#[derive(Clone, Debug)]
pub(crate) struct Paged {
    /// The status of the page's answer, unless `=` left it the page's.
    pub(crate) status: Option<u16>,
    /// The client's method (`$request` shows it; the redirect made it a GET).
    pub(crate) method: http::Method,
}

/// Where an `error_page` sends a request.
pub(crate) struct Redirected {
    /// Who answers the redirected request (a refusal: its URI found no
    /// location, then nginx's 404).
    pub(crate) answer: Result<Answer, Refusal>,
    /// The request as redirected (URI, method).
    pub(crate) parts: Parts,
    /// The status of the answer (see [`Paged`]).
    pub(crate) forced: Option<u16>,
    /// The client's method.
    pub(crate) method: http::Method,
}

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

    /// Whether a page replaces a response of `status` (`generated`: vigil made it).
    pub(crate) fn replaces(&self, status: u16, generated: bool) -> bool {
        !self.pages.is_empty() && self.find(status, generated).is_some()
    }

    /// The page for a response of `status` (`generated`: vigil made it).
    fn find(&self, status: u16, generated: bool) -> Option<&Page> {
        if !(generated || self.intercept && status >= 300) {
            return None;
        }
        self.pages.iter().find(|p| p.codes.contains(&status))
    }
}

/// What an error page makes of a response of `status`: who answers the
/// redirected request and the status it gets; None keeps the response.
pub(crate) fn apply(
    routes: &Routes,
    pages: &ErrorPages,
    status: u16,
    generated: bool,
    mut parts: Parts,
    local: SocketAddr,
    client: SocketAddr,
) -> Option<Redirected> {
    let page = pages.find(status, generated)?;
    let method = parts.method.clone();
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
            return Some(Redirected {
                answer: Ok(Answer::Return(Arc::new(base.redirect(code, &url)))),
                parts,
                forced: Some(code),
                method,
            });
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
            // The earlier pass's proxy_pass URI is not this location's.
            parts.extensions.remove::<crate::route::PassUri>();
            routes.phases(server, net, &mut parts)
        }
        To::Named(name) => {
            let li = routes.router.named(server, name)?;
            parts.extensions.remove::<crate::route::PassUri>();
            routes.location_phase(server, li, net, &mut parts)
        }
    };
    Some(Redirected {
        answer,
        parts,
        forced,
        method,
    })
}

/// Startup (and `vigil lint`): every `@name` page of a location or a
/// server names a location of its server (nginx finds it only when the
/// page is used, and then answers 500; vigil refuses the conf).
pub(crate) fn check(
    config: &vigil_core::config::Config,
    router: &crate::router::Router,
) -> Vec<RouteError> {
    let mut out = Vec::new();
    for (si, s) in config.servers.iter().enumerate() {
        let levels = s
            .locations
            .iter()
            .filter(|l| l.proxy.pass.is_some())
            .map(|l| &l.proxy.error_pages)
            .chain(std::iter::once(&s.error_pages));
        for pages in levels {
            for p in pages.iter().filter(|p| p.uri.starts_with('@')) {
                let e = RouteError {
                    at: p.origin.to_string(),
                    message: format!("no location \"{}\" for error_page", p.uri),
                };
                // A server's page is every location's that inherits it: once.
                let seen = out
                    .iter()
                    .any(|o: &RouteError| o.at == e.at && o.message == e.message);
                if router.named(si, &p.uri).is_none() && !seen {
                    out.push(e);
                }
            }
        }
    }
    out
}
