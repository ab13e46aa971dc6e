//! Configuration: one typed model ([`model`]) that both front ends
//! (nginx.conf and `vigil.toml`, in the `vigil-config` crate) build and the
//! runtime reads, and the value parsers and formatters it shares with
//! them ([`value`]).

mod cidr;
mod files;
mod limit;
pub mod model;
mod routing;
pub mod value;
pub mod vars;

pub use cidr::Cidr;
pub use files::*;
pub use limit::*;
pub use model::*;
pub use routing::*;
