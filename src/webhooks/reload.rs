//! Reloading the configured sinks (`[[webhooks]]`) on SIGHUP: which sinks stop, restart with a
//! new definition, or start.
//!
//! Invariants: the running sinks' state is flushed (fsync) before any is replaced, so a
//! successor starts from persisted cursors and dead letters; API sinks are never touched; a
//! removed sink's stored state is deleted in one transaction.

use std::sync::Arc;

use metrics::gauge;

use super::sink::{self, Sink, Source};
use super::spec::SinkSpec;
use super::{ReloadReport, WebhookError, Webhooks, run_blocking};
use crate::store::{Flush, WebhookBatch};
use crate::telemetry as t;

impl Webhooks {
    /// Applies a new list of configured sinks (`[[webhooks]]`, SIGHUP): a sink no longer listed
    /// stops and is forgotten; a changed one is restarted with the new definition from the
    /// cursor and dead letters of the old one (an event in flight at the swap may be sent
    /// again: at least once); a new one starts at the log head. An API sink keeps its id: a
    /// configured sink of the same id is skipped, with the reason in the report. On a cluster
    /// node configured sinks change only with a restart (the report says so).
    pub async fn reload_config(
        &self,
        configured: &[SinkSpec],
    ) -> Result<ReloadReport, WebhookError> {
        let mut report = ReloadReport::default();
        if self.stop.is_cancelled() {
            return Err(WebhookError::ShuttingDown);
        }
        if self.shared.is_some() {
            report.restart_needed = true;
            return Ok(report);
        }
        // The running sinks' cursors and dead letters reach the store first, so a replaced
        // sink's successor starts from what is persisted.
        self.flush(Flush::Fsync).await;
        let _w = self.write.lock().await;
        let current: Vec<Arc<Sink>> = self.read_sinks().values().cloned().collect();
        let head = self.ctx.log.next_seq();
        let mut gone = Vec::new();
        for old in current.iter().filter(|s| s.source == Source::Config) {
            if !configured.iter().any(|n| n.id == old.spec.id) {
                old.stop.cancel();
                self.write_sinks().remove(&old.spec.id);
                gauge!(t::WEBHOOK_LAG_EVENTS, "sink" => old.spec.id.clone()).set(0.0);
                gone.push(old.spec.id.clone());
            }
        }
        for spec in configured {
            let old = current.iter().find(|s| s.spec.id == spec.id);
            let (cursor, dead, stats) = match old {
                Some(o) if o.source == Source::Api => {
                    report.skipped.push((
                        spec.id.clone(),
                        "a sink created over the API has this id; delete it first".into(),
                    ));
                    continue;
                }
                Some(o) if o.spec == *spec => continue,
                Some(o) => (o.cursor(), o.dead_letters(), o.stats()),
                None => (head, Vec::new(), sink::Stats::default()),
            };
            if let Ok(url) = reqwest::Url::parse(&spec.url)
                && let Err(e) = self.ctx.policy.check_url(&url).await
            {
                report.skipped.push((spec.id.clone(), e.to_string()));
                continue;
            }
            if let Some(o) = old {
                o.stop.cancel();
                report.changed.push(spec.id.clone());
            } else {
                report.added.push(spec.id.clone());
            }
            let s = Arc::new(
                Sink::new(
                    spec.clone(),
                    Source::Config,
                    cursor,
                    false,
                    dead,
                    self.stop.child_token(),
                )
                .with_stats(stats),
            );
            self.write_sinks().insert(spec.id.clone(), s.clone());
            self.spawn(s);
        }
        if let Some(store) = self.ctx.store.clone()
            && !gone.is_empty()
        {
            let batch = WebhookBatch {
                sinks_del: gone.clone(),
                ..WebhookBatch::default()
            };
            run_blocking(move || store.commit_webhooks(&batch, Flush::Fsync)).await?;
        }
        report.removed = gone;
        self.update_hold();
        self.update_gauges();
        Ok(report)
    }
}
