//! vigil-core integration tests: one binary, one module per subject.

mod conformance;
mod golden_balancers;
mod health_rules;
mod lint;
mod support;
mod toml_config;
