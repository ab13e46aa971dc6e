//! vigil-core integration tests: one binary, one module per subject.

mod addresses;
mod conf_files;
mod conformance;
mod golden_balancers;
mod refusals;
mod support;
