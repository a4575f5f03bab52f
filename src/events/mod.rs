//! Where events go after the engine.
//!
//! - [`publisher`]: the single writer: stamps `seq`, commits to the store, appends to the log.
//! - [`log`]: the in-memory event log (and [`compact`], the form it holds events in).
//! - [`cursor`]: a reader's position in the log, for subscribers and webhook sinks alike.
//! - [`filter`]: the one event filter every channel applies.

pub mod compact;
pub mod cursor;
pub mod filter;
pub mod health;
pub mod log;
pub mod publisher;
pub mod step;

pub use compact::{CompactError, CompactEvent, Interner};
pub use cursor::{Chunk, LogCursor};
pub use filter::EventFilter;
pub use log::{EventLog, JSON_CACHE, LogError, LoggedEvent, ReadResult};
