//! A partition: the unit of state every deployment runs (a single process owns all of its
//! partitions; a cluster spreads them over its nodes).
//!
//! - [`record`]: the partition's input records and their one encoding, whichever log holds them.
//! - [`driver`]: the sans-IO [`Driver`] that applies them to an engine, fires its timers, sweeps
//!   idle devices and cuts checkpoint chunks.
//! - [`recent`]: the parts a driver applied lately, so that a part its log holds twice is
//!   answered as a duplicate.

pub mod driver;
pub mod recent;
pub mod record;

pub use driver::{
    Applied, ChangeLog, Driver, FenceSource, FenceUpdate, Frozen, MissingFences, NoFences,
};
pub use record::{FenceChange, Input, Removal};
