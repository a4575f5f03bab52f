//! Where events go after the engine: the event log and its subscribers (later: delivery sinks).

pub mod log;
pub mod publisher;

pub use log::{EventLog, LoggedEvent, ReadResult};
