//! vigil-core integration tests: one binary, one module per subject.

mod golden_balancers;
mod support;
