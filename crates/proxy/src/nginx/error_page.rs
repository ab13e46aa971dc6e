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

use vigil_core::config::ErrorPage;

use crate::nginx::router::RouteError;
use crate::nginx::vars::{Scope, Template};

pub(crate) use crate::nginx::marks::Paged;

/// A location's compiled `error_page`s.
#[derive(Debug, Default)]
pub(crate) struct ErrorPages {
    pages: Vec<Page>,
    /// `proxy_intercept_errors`.
    intercept: bool,
}

/// One `error_page`.
#[derive(Debug)]
pub(crate) struct Page {
    codes: Vec<u16>,
    /// nginx's `overwrite`: -1 none, 0 `=`, else `=CODE`.
    pub(crate) overwrite: i32,
    /// Where it sends the request.
    pub(crate) to: To,
}

/// Where an `error_page` sends a request.
#[derive(Debug)]
pub(crate) enum To {
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
    pub(crate) fn find(&self, status: u16, generated: bool) -> Option<&Page> {
        if !(generated || self.intercept && status >= 300) {
            return None;
        }
        self.pages.iter().find(|p| p.codes.contains(&status))
    }
}

/// Startup (and `vigil lint`): every `@name` page of a location or a
/// server names a location of its server (nginx finds it only when the
/// page is used, and then answers 500; vigil refuses the conf).
pub(crate) fn check(
    config: &vigil_core::config::Config,
    router: &crate::nginx::router::Router,
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
