//! vigil-checker integration tests: one binary (see STYLE.md).

mod nginx;
mod probe;
mod render;
mod schedule;
mod serve;
mod sharing;
mod status;
mod stock;
mod support;
mod sync;
