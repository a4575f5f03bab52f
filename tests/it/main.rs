//! The integration tests, one binary: each former `tests/*.rs` file is a module here, so the
//! whole service is linked once instead of once per file.
//!
//! `tests/log_memory.rs` stays a binary of its own: it installs a counting
//! `#[global_allocator]`, which in this binary would count (and slow down) every other test's
//! allocations, and its per-event figures would include whatever the tests running beside it
//! allocate.
//!
//! The servers run in process (`common::start`) and are reached over real sockets, except the
//! request/answer error matrices, which go through the router in process
//! (`common::App`, `tower::ServiceExt::oneshot`). Every test's files live in a `tempfile::TempDir`
//! that is removed when the test is done with it.

mod common;

mod auth;
mod bad_input;
mod cli;
mod cluster;
mod delayed;
mod durability;
mod e2e;
mod events_api;
mod fences_api;
mod first_impression;
mod hardening;
mod lifecycle;
mod mqtt;
mod openapi;
mod probe;
mod replay;
mod simulate;
mod trackers;
mod ui;
mod webhooks;
