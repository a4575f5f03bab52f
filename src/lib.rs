//! geodwell: a geofence dwell-trigger service. This crate is the service around the pure engine
//! in `geodwell-core`; docs/architecture.md draws the layers and the seams.
//!
//! Data flows one way:
//!
//! ```text
//! http (one file per resource)       -- parse the wire (wire), check keys (auth)
//!   -> ingest                        -- validate, stamp with the watermark (clock), route by device
//!   -> shard                         -- one task per shard owning a geodwell_core::engine::Engine
//!   -> events::publisher             -- stamp seq, commit to the store, publish
//!   -> events::log                   -- the event log -> WebSocket subscribers, webhooks
//! ```
//!
//! - [`config`]: raw TOML, environment and flags -> a validated [`config::Config`].
//! - [`boot`]: the warm start (store or preload -> engines, event log, watermark).
//! - [`service`]: [`Service::spawn`] and [`Service::shutdown`].
//! - [`state`]: the handles every handler is given.
//! - [`wire`]: pure parsing of fixes and tracker protocols.
//! - [`ingest`], [`clock`], [`shard`], [`fences`]: the shell around the core.
//! - [`events`]: the event log, the publisher, filters and cursors.
//! - [`webhooks`]: delivery of events to HTTP receivers.
//! - [`cluster`]: one node of a cluster on NATS JetStream (partitions under leases, their
//!   input and events in streams); it implements the seams below (`shard::Partitions`,
//!   `fences::SharedFences`).
//! - [`durable`]: the seams a store implements (input log, checkpoint storage);
//!   [`store`]: the embedded redb store: the input log and the checkpoints;
//!   [`checkpoint`]: the background checkpoint writer.
//! - [`http`]: the HTTP / WebSocket interface; [`auth`]: API keys.
//! - [`telemetry`]: metric names and tracing.
//! - [`outbound`]: where outgoing connections may go (no SSRF).
//! - [`budget`]: the memory budget for queued input; [`machine`]: the limits read off the
//!   machine at start.

pub mod auth;
pub mod boot;
pub mod budget;
pub mod checkpoint;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod durable;
pub mod events;
pub mod fences;
pub mod http;
pub mod ingest;
pub mod machine;
pub mod mqtt;
pub mod outbound;
pub mod runtime;
pub mod service;
pub mod shard;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod webhooks;
pub mod wire;

pub use service::{Service, ServiceError};
