//! vigil-core: the shared record of every upstream peer and every rule
//! about health. No sockets, no runtime: time comes from an injected
//! [`clock::Clock`] or a `now` argument.
//!
//! - [`upstream`]: peers, nginx's passive accounting, balancers, retries;
//! - [`outcome`]: failure classes and the retry decision table;
//! - [`health`]: active-check state (rise/fall);
//! - [`event`]: the transition log;
//! - [`config`]: the typed model the runtime reads (its nginx.conf and TOML
//!   front ends, lint and convert are the `vigil-config` crate).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod api;
pub mod balancer;
pub mod clock;
pub mod config;
pub mod event;
pub mod health;
pub mod limit;
pub mod outcome;
pub mod peer;
pub mod registry;
pub mod upstream;

pub use clock::{Clock, ManualClock, Timestamp};
pub use outcome::{FailureClass, NextUpstream, RequestFacts, TransportFailure};
pub use upstream::{
    Accounting, FailureVerdict, NoLiveUpstreams, RetryDenied, RetryPolicy, SelectKey, Selection,
    StatusVerdict, Upstream,
};
