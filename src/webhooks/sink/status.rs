//! What a sink is and reports, apart from its task: where its definition comes from
//! ([`Source`]), what its task is doing ([`Phase`]), its delivery status ([`SinkStatus`]) and the
//! events it gave up on ([`DeadLetter`]).
//!
//! Invariants: these are plain values (the API's and the store's view of a sink); this file
//! depends on nothing else of the webhooks module, so the sink, its persisted part and the
//! cluster's shared store can all use them.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use geodwell_core::event::EventKind;
use geodwell_core::time::Ts;

/// Where a sink's definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = WebhookSource)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A `[[webhooks]]` entry: re-read at every start, not deletable over the API.
    Config,
    /// Created with `POST /v1/webhooks`: persisted in the store (when there is one).
    Api,
}

/// An event that could not be delivered within `max_attempts`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The event's `seq`.
    pub seq: u64,
    /// The event's id (the `webhook-id` it was sent with).
    pub id: String,
    /// The event's type.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The event's fence.
    pub fence: String,
    /// Attempts made (all rounds together, retries requested over the API included).
    pub attempts: u32,
    /// Why the last attempt failed.
    pub last_error: String,
    /// When it was (last) given up (wall clock).
    pub dead_lettered_at: Ts,
    /// The event JSON exactly as it was sent.
    pub event: Box<RawValue>,
}

/// What a sink's task is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = WebhookState)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Caught up with the log head; waiting for events.
    Idle,
    /// Sending an event (or reading a backlog).
    Delivering,
    /// Waiting out a backoff delay before the next attempt.
    Retrying,
    /// The task has ended (shutdown or deletion).
    Stopped,
}

/// A sink's delivery status, as `GET /v1/webhooks` shows it.
// Fields in alphabetical order: the order the API shows them in, which clients may rely on.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = WebhookStatus)]
pub struct SinkStatus {
    /// The attempt number of the event being sent (0 when idle).
    pub attempt: u32,
    /// The next `seq` the sink will look at.
    pub cursor: u64,
    /// Events dead-lettered (kept across restarts).
    pub dead_lettered: u64,
    /// Dead letters held now.
    #[schema(value_type = u64)]
    pub dead_letters: usize,
    /// Events lost to retention before this sink processed them (kept across restarts).
    pub dropped: u64,
    /// Failed attempts (kept across restarts).
    pub failed: u64,
    /// The `seq` the next published event will get.
    pub head_seq: u64,
    /// `head_seq - cursor`: events published but not yet processed by this sink (delivered,
    /// dead-lettered or filtered out).
    pub lag: u64,
    /// The last failure's reason.
    pub last_error: Option<String>,
    /// When the last attempt failed.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_failure_at: Option<Ts>,
    /// When the last delivery succeeded.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_success_at: Option<Ts>,
    /// Attempts after the first for an event (kept across restarts).
    pub retried: u64,
    /// Events delivered (kept across restarts).
    pub sent: u64,
    /// What the task is doing.
    pub state: Phase,
}
