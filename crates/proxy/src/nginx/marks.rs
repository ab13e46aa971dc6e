//! Marks a request carries from the phase that knows a fact to the
//! phases that read it (request extensions; a leaf).

/// A request that came over TLS (`$scheme` is `https`, `$https` is `on`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Secure;

/// Marks a request an `error_page` redirected: its answer gets `status`
/// (None: the page's own, `=`), and is not paged again.
#[derive(Clone, Debug)]
pub(crate) struct Paged {
    /// The status of the page's answer, unless `=` left it the page's.
    pub(crate) status: Option<u16>,
    /// The client's method (`$request` shows it; the redirect made it a GET).
    pub(crate) method: http::Method,
}
