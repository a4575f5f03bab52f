//! Shared service state handed to every HTTP handler and WebSocket task.
//!
//! Invariants: fence writes are serialized by `fence_write` and broadcast to every shard in the
//! same order, so all shards hold the same fences; the `fences` map is the API's read copy and is
//! updated under that same serialization. In `event` mode the watermark is the maximum `ts` seen
//! across all transports minus lateness, kept in an atomic and published to shards via `watch`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::events::EventLog;
use crate::events::publisher::Publisher;
use crate::shard::{ShardMsg, WallClock};
use geodwell_core::fences::{Fence, FenceLimits};
use geodwell_core::time::Ts;

/// Shared state.
#[derive(Debug)]
pub struct AppState {
    /// Validated configuration.
    pub cfg: Config,
    /// API keys (from `cfg.api_keys`); authentication is off when empty.
    pub auth: crate::auth::Keys,
    /// One sender per shard.
    pub shards: Vec<mpsc::Sender<ShardMsg>>,
    /// The event log (read side; only the publisher appends).
    pub log: Arc<EventLog>,
    /// Commits and publishes steps (fence writes go through it too).
    pub publisher: Publisher,
    /// API read copy of the fences, by id.
    pub fences: RwLock<BTreeMap<String, Arc<Fence>>>,
    /// Serializes fence writes (and their broadcast to shards).
    pub fence_write: tokio::sync::Mutex<()>,
    /// Fence validation limits.
    pub fence_limits: FenceLimits,
    /// Wall clock.
    pub wall: WallClock,
    /// event mode: max ts seen (ms), `i64::MIN` before any.
    pub max_seen: Arc<AtomicI64>,
    /// event mode: the watermark published to shards.
    pub event_w: watch::Sender<Option<Ts>>,
    /// Prometheus renderer.
    pub metrics: PrometheusHandle,
    /// Cancelled when shutdown starts.
    pub shutdown: CancellationToken,
    /// Tracks WebSocket tasks so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// The webhook sink manager.
    pub webhooks: Arc<crate::webhooks::Webhooks>,
}

impl AppState {
    /// event mode: notes `ts` and returns the watermark this fix arrived under.
    pub fn observe_event_ts(&self, ts: Ts) -> Ts {
        let prev = self.max_seen.fetch_max(ts.0, Ordering::AcqRel);
        Ts(prev.max(ts.0)).minus(self.cfg.lateness)
    }

    /// event mode: publishes `w`, the largest watermark a batch's fixes were stamped with, to
    /// every shard once that batch has been sent to them (no-op in live mode). Publishing the
    /// batch's own stamp rather than the global maximum matters: another batch may have been
    /// stamped higher and not be sent yet, and a shard that moved past its fixes first would
    /// find them late.
    pub fn publish_event_watermark(&self, w: Option<Ts>) {
        if self.cfg.clock != crate::config::ClockMode::Event {
            return;
        }
        if let Some(w) = w {
            self.event_w.send_if_modified(|cur| {
                if cur.is_none_or(|c| c < w) {
                    *cur = Some(w);
                    true
                } else {
                    false
                }
            });
        }
    }

    /// The current watermark: live = wall - lateness; event = max seen - lateness.
    pub fn watermark(&self) -> Option<Ts> {
        match self.cfg.clock {
            crate::config::ClockMode::Live => Some(self.wall.now().minus(self.cfg.lateness)),
            crate::config::ClockMode::Event => *self.event_w.borrow(),
        }
    }
}
