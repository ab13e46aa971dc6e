//! A compiled `return`: what a `return`, a redirecting `rewrite` or an
//! `error_page` redirect answers (a leaf below the routes and the rewrite
//! scripts that make them).

use std::sync::Arc;

use http::HeaderName;

use crate::nginx::vars::Template;

/// A compiled `return`.
pub(crate) struct Reply {
    /// The status; 444 closes the connection without a response.
    pub code: u16,
    /// The body, or the `Location` of a redirecting code.
    pub text: Option<Template>,
    /// The body's `Content-Type` (`default_type`).
    pub content_type: http::HeaderValue,
    /// The location's `client_max_body_size` (nginx checks it when the
    /// location is found, before its `return` runs); 0 for a server's.
    pub max_body: u64,
    /// The location's `add_header`s (none for a server's `return`).
    pub add_headers: Vec<(HeaderName, Template, bool)>,
    /// The location's access log (none for a server's `return`).
    pub access_log: Option<Arc<crate::obs::log::AccessLogWriter>>,
    /// The `error_page`s in force where the `return` is (the location's,
    /// the server's for a server's): a `return CODE` without a text is
    /// nginx's special response, which they replace.
    pub error_pages: Arc<crate::nginx::error_page::ErrorPages>,
}

impl Reply {
    /// This reply's headers, log and limit with another code and text.
    pub(crate) fn with(&self, code: u16, text: Option<Template>) -> Self {
        Self {
            code,
            text,
            content_type: self.content_type.clone(),
            max_body: self.max_body,
            add_headers: self.add_headers.clone(),
            access_log: self.access_log.clone(),
            error_pages: self.error_pages.clone(),
        }
    }

    /// A redirect to `url` (made absolute as a `return`'s is): bytes, as
    /// a rewrite's or an error page's expansion made them.
    pub(crate) fn redirect(&self, code: u16, url: &[u8]) -> Self {
        self.with(code, Some(Template::literal(url)))
    }

    /// The code's page.
    pub(crate) fn status(&self, code: u16) -> Self {
        self.with(code, None)
    }

    /// A bare 500 (a rewrite cycle).
    pub(crate) fn internal_error() -> Self {
        Self {
            code: 500,
            text: None,
            content_type: http::HeaderValue::from_static("text/plain"),
            max_body: 0,
            add_headers: Vec::new(),
            access_log: None,
            error_pages: Arc::default(),
        }
    }
}
