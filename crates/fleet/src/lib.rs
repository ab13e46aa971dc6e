//! vigil-fleet (skeleton).
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
