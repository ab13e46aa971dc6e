//! The pages vigil answers with itself, in nginx's words (a leaf: the
//! head gate, the handler and `error_page` use them).

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::wire::payload::UpBody;

/// Marks a response vigil made itself (not an upstream's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Generated;

/// nginx-style error page.
pub(crate) fn error_page(code: StatusCode) -> Response<UpBody> {
    let reason = match code {
        // nginx's own words (ngx_http_error_405_page).
        StatusCode::METHOD_NOT_ALLOWED => "Not Allowed",
        _ => code.canonical_reason().unwrap_or(""),
    };
    let text = format!(
        "<html>\r\n<head><title>{} {reason}</title></head>\r\n<body>\r\n<center><h1>{} {reason}</h1></center>\r\n<hr><center>vigil</center>\r\n</body>\r\n</html>\r\n",
        code.as_u16(),
        code.as_u16()
    );
    let mut r = Response::new(crate::wire::payload::full(text));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
    r.extensions_mut().insert(Generated);
    r
}

/// nginx's answer for a status it finalizes a request with: the code's
/// page where nginx has one (ngx_http_error_pages), else an empty body
/// with no type (a `try_files ... =418`).
pub(crate) fn code_page(code: StatusCode) -> Response<UpBody> {
    let has_page = matches!(
        code.as_u16(),
        301..=303 | 307 | 308 | 400..=406 | 408..=416 | 421 | 429 | 494..=498 | 500..=505 | 507
    );
    if has_page {
        return error_page(code);
    }
    let mut r = Response::new(crate::wire::payload::empty());
    *r.status_mut() = code;
    r.extensions_mut().insert(Generated);
    r
}
