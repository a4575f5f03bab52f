//! Webhooks: deliver events to HTTP receivers, at least once, in `seq` order per sink.
//!
//! - [`spec`]: sink definitions (config and API share one validator), the filter, the Standard
//!   Webhooks signature, the retry schedule.
//! - [`deliver`]: one signed POST and how its answer is classified.
//! - [`sink`]: one sink's state and its task.
//! - [`Webhooks`]: the manager: restores sinks at start, creates and deletes them for the API,
//!   persists cursors and dead letters, keeps the store from trimming events a sink still needs,
//!   and stops everything at shutdown. Its flushes (`persist.rs`), configuration reloads
//!   (`reload.rs`) and cluster rounds (`rounds.rs`) are `impl Webhooks` blocks of their own:
//!   they depend on this file, and this file names nothing of theirs (so [`ReloadReport`] is
//!   defined here), which keeps them free of import cycles.
//!
//! Invariants:
//! - Ingest never waits for a webhook: sinks only *read* the event log (and the store), each in
//!   its own task; a slow or dead receiver stalls its own sink and nothing else.
//! - A sink's cursor is persisted only after it moved past an event that was delivered,
//!   dead-lettered, filtered out or lost to retention. A crash can therefore repeat deliveries
//!   made since the last flush (at least once), never skip one.
//! - Store writes (the periodic flush, sink creation and deletion) are serialized by one lock, so
//!   a deleted sink's state is never written back by a flush that raced with the deletion.
//! - With a store, every commit keeps the events at or above the lowest cursor (bounded by each
//!   sink's `max_backlog`), so a lagging sink reads its backlog from the store once the in-memory
//!   log has dropped it.
//!
//! See `docs/webhooks.md`.

pub mod brokers;
pub mod deliver;
mod outcome;
mod persist;
mod reload;
mod rounds;
pub mod shared;
pub mod sink;
pub mod spec;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics::gauge;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::EventLog;
use crate::outbound::{TargetError, TargetPolicy};
use crate::store::{Flush, Store, StoreError, WebhookBatch};
use crate::telemetry as t;

pub use sink::{DeadLetter, Phase, Sink, SinkStatus, Source};
pub use spec::{Secret, SinkSpec};

/// How often cursors and dead letters are written to the store, without fsync: they become
/// durable with the publisher's next fsync'd commit, the next durable flush, or the final flush
/// at shutdown.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// Every this many flushes, the flush is fsync'd when anything was written since the last durable
/// one. Without it a quiet service (no fixes, so no publisher commits) kept its cursors only in
/// memory, and a crash re-sent everything delivered since the last fix: the test
/// `kill_9_during_delivery_loses_no_event` saw 240 repeats of 600 events. Now a crash re-sends at
/// most about a second of deliveries.
pub const DURABLE_EVERY: u32 = 4;

/// Most sinks at once (config and API together).
pub const MAX_SINKS: usize = 256;

/// Why a webhook operation failed.
#[derive(Debug, Error)]
pub enum WebhookError {
    /// A sink with this id exists.
    #[error("webhook {0:?} already exists")]
    Exists(String),
    /// No sink with this id.
    #[error("no webhook {0:?}")]
    NotFound(String),
    /// The sink is defined in the config file, which the API does not change.
    #[error("webhook {0:?} is defined in the configuration file; change or remove it there")]
    FromConfig(String),
    /// `from_seq` is past the log head.
    #[error("from_seq {from} is ahead of the event log (the next event gets seq {head})")]
    FromSeqAhead {
        /// Asked.
        from: u64,
        /// The next seq.
        head: u64,
    },
    /// Too many sinks.
    #[error("at most {MAX_SINKS} webhooks can exist at once")]
    TooMany,
    /// The store failed.
    #[error("webhook state store: {0}")]
    Store(#[from] StoreError),
    /// Stored webhook state does not decode.
    #[error("stored webhook state is inconsistent: {0}")]
    Corrupt(String),
    /// The target is not an address deliveries may go to.
    #[error("url: {0}")]
    Target(#[from] TargetError),
    /// The manager is stopping.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The cluster's shared sink store failed.
    #[error("the cluster's webhook store: {0}")]
    Shared(String),
}

/// A sink's definition and status, for the API.
#[derive(Debug, Clone)]
pub struct SinkInfo {
    /// The definition (the secret inside never leaves the process through the API).
    pub spec: SinkSpec,
    /// Config or API.
    pub source: Source,
    /// Delivery status.
    pub status: SinkStatus,
}

/// What [`Webhooks::reload_config`] did, by sink id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Configured sinks started.
    pub added: Vec<String>,
    /// Configured sinks restarted with a new definition.
    pub changed: Vec<String>,
    /// Configured sinks stopped and forgotten.
    pub removed: Vec<String>,
    /// Configured sinks not applied, and why.
    pub skipped: Vec<(String, String)>,
    /// A cluster node: configured sinks change only with a restart.
    pub restart_needed: bool,
}

/// The sink manager. Shared through `AppState::webhooks`.
#[derive(Debug)]
pub struct Webhooks {
    sinks: RwLock<BTreeMap<String, Arc<Sink>>>,
    ctx: sink::Ctx,
    tasks: TaskTracker,
    stop: CancellationToken,
    /// Serializes store writes (flush, create, delete).
    write: tokio::sync::Mutex<()>,
    /// In a cluster: where definitions, cursors and dead letters live, and who delivers what.
    shared: Option<Arc<dyn shared::SharedSinks>>,
}

/// Runs a store call off the async workers (it may wait for the publisher's fsync).
async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, WebhookError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| WebhookError::ShuttingDown)?
        .map_err(WebhookError::from)
}

impl Webhooks {
    /// A manager with no sinks and no store (unit tests of other modules).
    pub fn inert(log: Arc<EventLog>) -> Arc<Webhooks> {
        Arc::new(Webhooks {
            sinks: RwLock::new(BTreeMap::new()),
            ctx: sink::Ctx {
                log,
                store: None,
                client: deliver::client(TargetPolicy::default()),
                policy: TargetPolicy::default(),
            },
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            write: tokio::sync::Mutex::new(()),
            shared: None,
        })
    }

    /// The manager of a cluster node: the `configured` sinks and the API sinks of `shared`,
    /// each delivered by the node holding its tenure (see [`shared`]). Nothing is delivered
    /// before the first round.
    pub fn start_shared(
        configured: &[SinkSpec],
        shared: Arc<dyn shared::SharedSinks>,
        log: Arc<EventLog>,
        policy: TargetPolicy,
        shutdown: &CancellationToken,
    ) -> Arc<Webhooks> {
        let stop = shutdown.child_token();
        let wh = Arc::new(Webhooks {
            sinks: RwLock::new(BTreeMap::new()),
            ctx: sink::Ctx {
                log,
                store: None,
                client: deliver::client(policy),
                policy,
            },
            tasks: TaskTracker::new(),
            stop,
            write: tokio::sync::Mutex::new(()),
            shared: Some(shared.clone()),
        });
        let head = wh.ctx.log.next_seq();
        for spec in configured {
            let s = Arc::new(Sink::new(
                spec.clone(),
                Source::Config,
                head,
                false,
                Vec::new(),
                wh.stop.child_token(),
            ));
            wh.write_sinks().insert(s.spec.id.clone(), s);
        }
        let me = wh.clone();
        wh.tasks.spawn(async move { me.shared_loop(shared).await });
        wh
    }

    /// Restores the sinks (`configured` ones from the configuration file, API sinks from the
    /// store), their cursors and
    /// dead letters, sets the store's event hold, and starts one task per sink plus the flusher.
    /// Call it before the publisher's first commit, so that the hold is in place before any trim.
    /// Sinks without a stored cursor start at the log head. Everything stops when `shutdown` is
    /// cancelled; [`Webhooks::stop`] then waits and makes the final flush.
    pub fn start(
        configured: &[SinkSpec],
        store: Option<Arc<Store>>,
        log: Arc<EventLog>,
        policy: TargetPolicy,
        shutdown: &CancellationToken,
    ) -> Result<Arc<Webhooks>, WebhookError> {
        let snap = match &store {
            Some(s) => s.load_webhooks()?,
            None => Default::default(),
        };
        let cursors: HashMap<String, u64> = snap.cursors.into_iter().collect();
        let mut stats: HashMap<String, sink::Stats> = HashMap::new();
        for (id, field, v) in snap.stats {
            stats.entry(id).or_default().set_field(&field, v);
        }
        let mut dead: HashMap<String, Vec<DeadLetter>> = HashMap::new();
        for (id, seq, json) in snap.dead_letters {
            let dl: DeadLetter = serde_json::from_str(&json).map_err(|e| {
                WebhookError::Corrupt(format!("dead letter ({id:?}, {seq}) does not decode: {e}"))
            })?;
            dead.entry(id).or_default().push(dl);
        }
        let mut defs: Vec<(SinkSpec, Source)> = configured
            .iter()
            .map(|s| (s.clone(), Source::Config))
            .collect();
        for (id, json) in snap.sinks {
            let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| {
                WebhookError::Corrupt(format!("webhook {id:?} definition is not JSON: {e}"))
            })?;
            let spec = SinkSpec::from_json(&v, &[]).map_err(|errs| {
                WebhookError::Corrupt(format!("webhook {id:?} definition is invalid: {errs:?}"))
            })?;
            if defs.iter().any(|(s, _)| s.id == spec.id) {
                tracing::warn!(webhook = %spec.id, "a webhook created over the API has the id of a [[webhooks]] config entry; the config entry wins (the stored one is kept, unused)");
                continue;
            }
            defs.push((spec, Source::Api));
        }
        let stop = shutdown.child_token();
        let wh = Arc::new(Webhooks {
            sinks: RwLock::new(BTreeMap::new()),
            ctx: sink::Ctx {
                log,
                store,
                client: deliver::client(policy),
                policy,
            },
            tasks: TaskTracker::new(),
            stop,
            write: tokio::sync::Mutex::new(()),
            shared: None,
        });
        let head = wh.ctx.log.next_seq();
        for (spec, source) in defs {
            let stored = cursors.get(&spec.id).copied();
            if stored.is_some_and(|c| c > head) {
                tracing::warn!(webhook = %spec.id, cursor = ?stored, head, "stored webhook cursor is past the event log head; starting at the head");
            }
            let cursor = stored.map_or(head, |c| c.min(head));
            let dl = dead.remove(&spec.id).unwrap_or_default();
            let st = stats.remove(&spec.id).unwrap_or_default();
            let s = Arc::new(
                Sink::new(
                    spec,
                    source,
                    cursor,
                    stored == Some(cursor),
                    dl,
                    wh.stop.child_token(),
                )
                .with_stats(st),
            );
            wh.write_sinks().insert(s.spec.id.clone(), s);
        }
        wh.update_hold();
        wh.update_gauges();
        let sinks: Vec<Arc<Sink>> = wh.read_sinks().values().cloned().collect();
        for s in sinks {
            wh.spawn(s);
        }
        let me = wh.clone();
        wh.tasks.spawn(async move { me.flush_loop().await });
        let n = wh.read_sinks().len();
        if n > 0 {
            tracing::info!(webhooks = n, "webhook sinks started");
        }
        Ok(wh)
    }

    fn read_sinks(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Sink>>> {
        self.sinks.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_sinks(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<Sink>>> {
        self.sinks.write().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn(&self, s: Arc<Sink>) {
        let ctx = self.ctx.clone();
        self.tasks.spawn(s.run(ctx));
    }

    fn info(&self, s: &Sink) -> SinkInfo {
        SinkInfo {
            spec: s.spec.clone(),
            source: s.source,
            status: s.status(self.ctx.log.next_seq()),
        }
    }

    /// Every sink, by id.
    pub fn list(&self) -> Vec<SinkInfo> {
        self.read_sinks().values().map(|s| self.info(s)).collect()
    }

    /// One sink.
    pub fn get(&self, id: &str) -> Option<SinkInfo> {
        self.read_sinks().get(id).map(|s| self.info(s))
    }

    fn sink(&self, id: &str) -> Result<Arc<Sink>, WebhookError> {
        self.read_sinks()
            .get(id)
            .cloned()
            .ok_or_else(|| WebhookError::NotFound(id.to_string()))
    }

    /// A sink's dead letters, oldest first.
    pub fn dead_letters(&self, id: &str) -> Result<Vec<DeadLetter>, WebhookError> {
        Ok(self.sink(id)?.dead_letters())
    }

    /// Queues every dead letter of sink `id` for another round of delivery (ahead of new
    /// events); returns how many.
    pub fn retry_dead_letters(&self, id: &str) -> Result<usize, WebhookError> {
        Ok(self.sink(id)?.request_retry())
    }

    /// Drops every dead letter of sink `id` (persisted at the next flush); returns how many.
    pub fn clear_dead_letters(&self, id: &str) -> Result<usize, WebhookError> {
        Ok(self.sink(id)?.clear_dead_letters())
    }

    /// Creates an API sink starting at `from_seq` (default: the log head, i.e. only events
    /// published from now on), persists it (fsync'd) and starts it.
    pub async fn create(
        &self,
        spec: SinkSpec,
        from_seq: Option<u64>,
    ) -> Result<SinkInfo, WebhookError> {
        if self.stop.is_cancelled() {
            return Err(WebhookError::ShuttingDown);
        }
        if let Ok(url) = reqwest::Url::parse(&spec.url) {
            self.ctx.policy.check_url(&url).await?;
        }
        let _w = self.write.lock().await;
        let head = self.ctx.log.next_seq();
        if let Some(from) = from_seq
            && from > head
        {
            return Err(WebhookError::FromSeqAhead { from, head });
        }
        let cursor = match from_seq {
            Some(from) => self.oldest_available(from).await?,
            None => head,
        };
        if let Some(shared) = &self.shared {
            let s = self.create_shared(shared, spec, cursor).await?;
            self.update_gauges();
            tracing::info!(webhook = %s.spec.id, url = %s.spec.public_url(), cursor, "webhook created");
            return Ok(self.info(&s));
        }
        let s = {
            let mut sinks = self.write_sinks();
            if let Some(old) = sinks.get(&spec.id) {
                return Err(match old.source {
                    Source::Config => WebhookError::FromConfig(spec.id),
                    Source::Api => WebhookError::Exists(spec.id),
                });
            }
            if sinks.len() >= MAX_SINKS {
                return Err(WebhookError::TooMany);
            }
            let s = Arc::new(Sink::new(
                spec,
                Source::Api,
                cursor,
                false,
                Vec::new(),
                self.stop.child_token(),
            ));
            sinks.insert(s.spec.id.clone(), s.clone());
            s
        };
        // Hold the events from the start cursor before anything can trim them.
        self.update_hold();
        if let Some(store) = self.ctx.store.clone() {
            let batch = WebhookBatch {
                sinks_put: vec![(s.spec.id.clone(), s.spec.to_stored_json())],
                cursors: vec![(s.spec.id.clone(), cursor)],
                ..WebhookBatch::default()
            };
            if let Err(e) = run_blocking(move || store.commit_webhooks(&batch, Flush::Fsync)).await
            {
                self.write_sinks().remove(&s.spec.id);
                self.update_hold();
                return Err(e);
            }
            s.flushed(&sink::Unflushed {
                cursor: Some(cursor),
                ..Default::default()
            });
        }
        self.spawn(s.clone());
        self.update_gauges();
        tracing::info!(webhook = %s.spec.id, url = %s.spec.public_url(), cursor, "webhook created");
        Ok(self.info(&s))
    }

    /// `from`, or the oldest event still held (in the log or the store) if `from` is older: a
    /// sink asked to start before the retained range starts at its beginning, rather than
    /// counting events that were gone before it existed as dropped.
    async fn oldest_available(&self, from: u64) -> Result<u64, WebhookError> {
        let from = from.max(1);
        let log_first = self.ctx.log.read(0, 0).first_seq;
        if from >= log_first {
            return Ok(from);
        }
        let Some(store) = self.ctx.store.clone() else {
            return Ok(log_first);
        };
        // Hold from `from` while looking, so that no commit trims what is found.
        store.hold_events_from(store.events_held_from().min(from));
        let rows = run_blocking(move || store.read_events(from, log_first, 1)).await?;
        Ok(rows.first().map_or(log_first, |(seq, _)| *seq))
    }

    /// Deletes API sink `id`: stops its task and forgets its definition, cursor and dead
    /// letters (fsync'd). Config sinks cannot be deleted here.
    pub async fn delete(&self, id: &str) -> Result<(), WebhookError> {
        let _w = self.write.lock().await;
        let s = self.sink(id)?;
        if s.source == Source::Config {
            return Err(WebhookError::FromConfig(id.to_string()));
        }
        if let Some(shared) = &self.shared {
            shared.remove(id).await.map_err(WebhookError::Shared)?;
            shared.release(id).await;
        }
        if let Some(store) = self.ctx.store.clone() {
            let batch = WebhookBatch {
                sinks_del: vec![id.to_string()],
                ..WebhookBatch::default()
            };
            run_blocking(move || store.commit_webhooks(&batch, Flush::Fsync)).await?;
        }
        self.write_sinks().remove(id);
        s.stop.cancel();
        gauge!(t::WEBHOOK_LAG_EVENTS, "sink" => id.to_string()).set(0.0);
        self.update_hold();
        tracing::info!(webhook = %id, "webhook deleted");
        Ok(())
    }

    /// Lets the store trim only events no sink needs: below the lowest cursor, and in any case
    /// below `head - max_backlog` of each sink.
    fn update_hold(&self) {
        let Some(store) = &self.ctx.store else {
            return;
        };
        let head = self.ctx.log.next_seq();
        let floor = self
            .read_sinks()
            .values()
            .map(|s| s.cursor().max(head.saturating_sub(s.spec.max_backlog)))
            .min()
            .unwrap_or(u64::MAX);
        store.hold_events_from(floor);
    }

    fn update_gauges(&self) {
        let head = self.ctx.log.next_seq();
        for (id, s) in self.read_sinks().iter() {
            gauge!(t::WEBHOOK_LAG_EVENTS, "sink" => id.clone())
                .set(head.saturating_sub(s.cursor()) as f64);
        }
    }

    async fn flush_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(FLUSH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u32 = 0;
        let mut unsynced = false;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(DURABLE_EVERY) {
                let committed = self.flush(Flush::Fsync).await;
                if committed || !unsynced || self.sync_store().await {
                    unsynced = false;
                }
            } else if self.flush(Flush::Deferred).await {
                unsynced = true;
            }
            self.update_gauges();
            self.update_hold();
        }
    }

    /// Stops every sink (in-flight attempts are abandoned: those events are sent again after a
    /// restart), waits up to `grace` for the tasks, and writes the cursors and dead letters with
    /// fsync.
    pub async fn stop(&self, grace: Duration) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("webhook tasks did not stop within the shutdown grace period");
        }
        self.flush(Flush::Fsync).await;
        self.update_gauges();
    }
}
