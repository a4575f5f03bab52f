//! Where events go after the engine: the event log and its subscribers (later: delivery sinks).

pub mod log;

pub use log::{EventLog, LoggedEvent, ReadResult};
