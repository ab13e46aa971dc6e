//! Configuration: one typed model ([`model`]), two front ends
//! ([`toml`](mod@self::toml) and [`nginx`]), and the shared value parsers.

pub mod model;
pub mod value;

pub use model::*;
