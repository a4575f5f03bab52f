//! The fleet simulator behind `geodwell simulate`.
//!
//! - [`rng`]: the seeded PRNG every generator here (and the benchmarks and tests) draws from.
//! - [`layout`]: pure and deterministic: generated fence layouts.
//! - [`fleet`]: pure and deterministic: a fleet of devices driving between fences, merged into
//!   one stream of fixes. Same spec, same fixes.
//! - [`track`]: which input caused which event, and latency histograms.
//! - [`run`]: the async driver: paces batches to a server over HTTP or WebSocket ingest,
//!   subscribes to events, and reports rates, errors and latency.
//! - [`cli`]: the `geodwell simulate` command: its arguments, and its exit status.
//! - [`error`]: [`SimError`], the one error type of the crate.
//!
//! The generators depend on `core` only (fences for stop points); the driver and the command
//! are shell code.

pub mod cli;
pub mod error;
pub mod fleet;
pub mod layout;
pub mod rng;
pub mod run;
pub mod track;

pub use error::SimError;
