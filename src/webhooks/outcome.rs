//! The outcome of one delivery attempt ([`Attempt`]), whatever the transport: an http(s) POST
//! (`deliver.rs`) or a publish to a message broker (`brokers.rs`).
//!
//! Invariant: this file depends on nothing else of the webhooks module, so every transport can
//! report in these terms without depending on the code that picks the transport.

use std::time::Duration;

/// The outcome of one attempt: only an acknowledged delivery counts as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver took the event: an http(s) receiver answered 2xx, or a broker acknowledged
    /// it as `brokers.rs` describes.
    Delivered,
    /// Anything else: a non-2xx status, a timeout, a connection error.
    Failed {
        /// What went wrong, for the status API and dead letters.
        error: String,
        /// The receiver's `Retry-After` (whole seconds), if it sent one.
        retry_after: Option<Duration>,
    },
}
