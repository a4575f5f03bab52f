//! The fleet simulator behind `geodwell simulate`.
//!
//! - [`rng`]: the seeded PRNG every generator here (and the benchmarks and tests) draws from.
//! - [`fleet`]: pure and deterministic: generated fence layouts and a fleet of devices driving
//!   between fences, merged into one stream of fixes. Same spec, same fixes.
//! - [`track`]: which input caused which event, and latency histograms.
//! - [`run`]: the async driver: paces batches to a server over HTTP or WebSocket ingest,
//!   subscribes to events, and reports rates, errors and latency.
//!
//! The generator depends on `core` only (fences for stop points); the driver is shell code.

pub mod fleet;
pub mod rng;
pub mod run;
pub mod track;
