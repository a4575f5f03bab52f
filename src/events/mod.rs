//! Where events go after the engine: the event log and its subscribers (later: delivery sinks).

pub mod compact;
pub mod log;
pub mod publisher;

pub use compact::{CompactError, CompactEvent, Interner};
pub use log::{EventLog, JSON_CACHE, LogError, LoggedEvent, ReadResult};
