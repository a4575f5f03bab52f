//! The pure, deterministic core: no tokio, no I/O, no clock reads. Time is always an argument.
//!
//! Dependencies point one way inside the core too: `time` <- `wheel`, `fences`, `fix`, `event`
//! <- `pairs` <- `engine`.
//!
//! - [`time`]: event time, durations and ticks.
//! - [`wheel`]: the hashed timer wheel.
//! - [`fences`]: fence model, validation, R-tree index and exact geometric tests.
//! - [`fix`]: location fixes and their validation.
//! - [`glob`]: `*` / `?` patterns over ids, matched in linear time.
//! - [`event`]: events and their deterministic ids.
//! - [`pairs`]: the device-fence pair record and its state machine.
//! - [`engine`]: reorder buffer, fix application, watermark advance, persistence of device
//!   state.
//! - [`codec`]: the binary encodings the stores share (varints, device records).
//! - [`partition`]: a partition's input records and the driver that applies them.
//! - [`mod@reference`]: a naive recompute of the semantics, the oracle of the model tests.

#![deny(missing_docs)]

pub mod codec;
pub mod engine;
pub mod event;
pub mod fences;
pub mod fix;
pub mod glob;
pub mod pairs;
pub mod partition;
pub mod reference;
pub mod time;
pub mod wheel;
