//! vigil-config integration tests: one binary, one module per subject.

mod corpus;
mod health_rules;
mod latency_rules;
mod lint;
mod support;
mod toml_config;
mod traffic_rules;
