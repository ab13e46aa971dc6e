//! What nginx.conf says a request gets, compiled: the server block and
//! location a request falls in (`vhost`, `router`, `location`, `route`),
//! the rewrite module (`rewrite`, `reply`, `redirect`), variables and the
//! URI (`vars`, `uri`), `allow`/`deny` (`access`), `set_real_ip_from`
//! (`realip`), gzip, `error_page` and nginx's own pages (`error_page`,
//! `status_page`), and the marks one phase leaves for the next (`marks`).

pub(crate) mod access;
pub(crate) mod error_page;
pub(crate) mod gzip;
pub(crate) mod limit;
pub(crate) mod location;
pub(crate) mod marks;
pub(crate) mod realip;
pub(crate) mod redirect;
pub(crate) mod reply;
pub(crate) mod rewrite;
pub mod route;
pub(crate) mod router;
pub(crate) mod static_files;
pub(crate) mod status_page;
pub mod uri;
pub mod vars;
pub(crate) mod vhost;
