//! vigil-config integration tests: one binary, one module per subject.

mod addresses;
mod conf_files;
mod conformance;
mod corpus;
mod explain;
mod health_rules;
mod latency_rules;
mod limits;
mod lint;
mod refusals;
mod support;
mod toml_config;
mod traffic_rules;
