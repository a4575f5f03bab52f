//! The webhook manager on a cluster node: every [`ROUND`] it re-reads the shared sink
//! definitions, stops the tasks of tenures lost, writes the cursors and dead letters of the sinks
//! it delivers, and takes the tenures whose turn it is ([`SharedSinks`]).
//!
//! Invariants:
//! - A node runs a sink's task only while it holds the sink's tenure; the task is cancelled the
//!   moment the tenure is lost, and its cursor and dead letters are written only while the
//!   tenure holds. The next holder starts from the last written cursor: deliveries made after
//!   that write are repeated (at least once), none is skipped.
//! - On every node the manager keeps one [`Sink`] per definition; on the nodes that do not
//!   deliver it, it is an idle copy whose cursor and dead letters are re-read every round, so
//!   `GET /v1/webhooks` answers alike everywhere (to within a round).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::shared::{ROUND, SharedSinks, SharedState, Tenure};
use super::sink::{DeadLetter, Sink, Source};
use super::spec::SinkSpec;
use super::{MAX_SINKS, WebhookError, Webhooks};

/// What the manager knows of one sink's delivery on this node.
struct Held {
    tenure: Tenure,
    /// Cancels the task of this tenure.
    stop: CancellationToken,
}

impl Webhooks {
    /// The cluster manager: reads definitions and state from `shared`, delivers the sinks whose
    /// tenure this node holds, and writes their cursors. Runs until the manager stops.
    pub(crate) async fn shared_loop(self: Arc<Self>, shared: Arc<dyn SharedSinks>) {
        let mut held: HashMap<String, Held> = HashMap::new();
        let mut tick = tokio::time::interval(ROUND);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.shared_round(&shared, &mut held).await;
        }
        // The last cursors, then the tenures go.
        self.shared_flush(&shared, &held).await;
        for (id, h) in held.drain() {
            h.stop.cancel();
            shared.release(&id).await;
        }
    }

    async fn shared_round(&self, shared: &Arc<dyn SharedSinks>, held: &mut HashMap<String, Held>) {
        // 1. Definitions: API sinks created or deleted on any node.
        match shared.definitions().await {
            Ok(defs) => self.sync_definitions(&defs, held),
            Err(e) => tracing::debug!(error = %e, "reading the cluster's webhook definitions"),
        }
        // Sinks deleted here (or there) give their tenure up.
        let gone: Vec<String> = {
            let sinks = self.read_sinks();
            held.keys()
                .filter(|id| !sinks.contains_key(*id))
                .cloned()
                .collect()
        };
        for id in gone {
            if let Some(h) = held.remove(&id) {
                h.stop.cancel();
            }
            shared.release(&id).await;
        }
        // 2. Lost tenures stop their tasks.
        held.retain(|id, h| {
            if h.tenure.lost.is_cancelled() {
                tracing::info!(webhook = %id, "webhook delivery moved to another node");
                h.stop.cancel();
                false
            } else {
                true
            }
        });
        // 3. Write what the delivered sinks did.
        self.shared_flush(shared, held).await;
        // 4. Take the sinks whose turn it is; refresh the idle copies of the others.
        let sinks: Vec<Arc<Sink>> = self.read_sinks().values().cloned().collect();
        for s in sinks {
            let id = s.spec.id.clone();
            if held.contains_key(&id) {
                continue;
            }
            if let Some(tenure) = shared.acquire(&id).await {
                match shared.state(&id).await {
                    Ok(state) => {
                        let stop = self.stop.child_token();
                        let fresh = self.replace_sink(&s, &state, stop.clone());
                        tracing::info!(webhook = %id, cursor = fresh.cursor(), "delivering webhook");
                        self.spawn(fresh);
                        held.insert(id, Held { tenure, stop });
                    }
                    Err(e) => {
                        tracing::warn!(webhook = %id, error = %e, "cannot read a webhook's cursor; leaving it for now");
                        shared.release(&id).await;
                    }
                }
            } else if let Ok(state) = shared.state(&id).await
                && state.cursor.is_some_and(|c| c != s.cursor())
            {
                self.replace_sink(&s, &state, self.stop.child_token());
            }
        }
        self.update_gauges();
    }

    /// Adds the API sinks defined elsewhere and drops the ones deleted elsewhere.
    fn sync_definitions(&self, defs: &BTreeMap<String, String>, held: &mut HashMap<String, Held>) {
        let head = self.ctx.log.next_seq();
        let mut sinks = self.write_sinks();
        let gone: Vec<String> = sinks
            .values()
            .filter(|s| s.source == Source::Api && !defs.contains_key(&s.spec.id))
            .map(|s| s.spec.id.clone())
            .collect();
        for id in gone {
            if let Some(s) = sinks.remove(&id) {
                s.stop.cancel();
            }
            if let Some(h) = held.remove(&id) {
                h.stop.cancel();
            }
            tracing::info!(webhook = %id, "webhook deleted on another node");
        }
        for (id, json) in defs {
            if sinks.contains_key(id) || sinks.len() >= MAX_SINKS {
                continue;
            }
            let spec = serde_json::from_str::<serde_json::Value>(json)
                .map_err(|e| e.to_string())
                .and_then(|v| SinkSpec::from_json(&v, &[]).map_err(|e| format!("{e:?}")));
            match spec {
                Ok(spec) => {
                    let s = Arc::new(Sink::new(
                        spec,
                        Source::Api,
                        head,
                        false,
                        Vec::new(),
                        self.stop.child_token(),
                    ));
                    sinks.insert(id.clone(), s);
                }
                Err(e) => {
                    tracing::warn!(webhook = %id, error = %e, "a stored webhook definition is invalid; skipped")
                }
            }
        }
    }

    /// Puts a fresh copy of `old` with `state` (and `stop`) in its place; returns it.
    fn replace_sink(
        &self,
        old: &Arc<Sink>,
        state: &SharedState,
        stop: CancellationToken,
    ) -> Arc<Sink> {
        let cursor = state.cursor.unwrap_or_else(|| self.ctx.log.next_seq());
        let fresh = Arc::new(Sink::new(
            old.spec.clone(),
            old.source,
            cursor,
            state.cursor.is_some(),
            state.dead.clone(),
            stop,
        ));
        old.stop.cancel();
        self.write_sinks()
            .insert(old.spec.id.clone(), fresh.clone());
        fresh
    }

    /// Writes the cursor and dead-letter changes of every sink this node delivers, while its
    /// tenure holds.
    async fn shared_flush(&self, shared: &Arc<dyn SharedSinks>, held: &HashMap<String, Held>) {
        let sinks: Vec<Arc<Sink>> = self.read_sinks().values().cloned().collect();
        for s in sinks {
            let Some(h) = held.get(&s.spec.id) else {
                continue;
            };
            if !(h.tenure.valid)() {
                continue;
            }
            let p = s.take_unflushed();
            if p.is_empty() {
                continue;
            }
            let dead: Vec<(u64, Option<DeadLetter>)> =
                p.dead.iter().map(|(k, v)| (*k, v.clone())).collect();
            match shared.save(&s.spec.id, p.cursor, dead).await {
                Ok(()) => s.flushed(&p),
                Err(e) => {
                    tracing::warn!(webhook = %s.spec.id, error = %e, "cannot write a webhook's cursor; keeping it for the next round");
                    s.restore_unflushed(p);
                }
            }
        }
    }

    /// Creates an API sink in the cluster's shared store; the node whose turn it is delivers it.
    pub(crate) async fn create_shared(
        &self,
        shared: &Arc<dyn SharedSinks>,
        spec: SinkSpec,
        cursor: u64,
    ) -> Result<Arc<Sink>, WebhookError> {
        {
            let sinks = self.read_sinks();
            if let Some(old) = sinks.get(&spec.id) {
                return Err(match old.source {
                    Source::Config => WebhookError::FromConfig(spec.id),
                    Source::Api => WebhookError::Exists(spec.id),
                });
            }
            if sinks.len() >= MAX_SINKS {
                return Err(WebhookError::TooMany);
            }
        }
        match shared.create(&spec.id, spec.to_stored_json(), cursor).await {
            Ok(true) => {}
            Ok(false) => return Err(WebhookError::Exists(spec.id)),
            Err(e) => return Err(WebhookError::Shared(e)),
        }
        let s = Arc::new(Sink::new(
            spec,
            Source::Api,
            cursor,
            true,
            Vec::new(),
            self.stop.child_token(),
        ));
        self.write_sinks().insert(s.spec.id.clone(), s.clone());
        Ok(s)
    }
}
