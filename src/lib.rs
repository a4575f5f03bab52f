//! geodwell: a geofence dwell-trigger service.
//!
//! - [`core`]: the pure, deterministic engine (timer wheel, fence index, pair state machine,
//!   watermark). No tokio, no I/O, no clock reads.

pub mod core;
