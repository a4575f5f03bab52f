//! Writing the sinks' state to the store: cursors, dead-letter changes and counters of every
//! sink in one transaction per flush.
//!
//! Invariants: a flush takes each sink's unpersisted changes under its lock and gives them back
//! when the commit fails, so nothing is lost to a failed write; the manager's write lock orders
//! flushes with sink creation and deletion.

use std::sync::Arc;

use super::sink::Sink;
use super::{Webhooks, run_blocking};
use crate::store::{Flush, WebhookBatch};

impl Webhooks {
    /// Writes every sink's unpersisted cursor and dead-letter changes in one transaction. On
    /// failure the changes are kept for the next flush.
    /// Writes pending cursors and dead letters; true when something was committed.
    pub(super) async fn flush(&self, durability: Flush) -> bool {
        let Some(store) = self.ctx.store.clone() else {
            return false;
        };
        let _w = self.write.lock().await;
        let sinks: Vec<Arc<Sink>> = self.read_sinks().values().cloned().collect();
        let mut batch = WebhookBatch::default();
        let mut taken = Vec::new();
        for s in sinks {
            let p = s.take_unflushed();
            if p.is_empty() {
                continue;
            }
            let id = &s.spec.id;
            if let Some(c) = p.cursor {
                batch.cursors.push((id.clone(), c));
            }
            if let Some(st) = &p.stats {
                for (field, v) in st.to_fields() {
                    batch.stats.push((id.clone(), field, v));
                }
            }
            for (seq, op) in &p.dead {
                match op {
                    Some(dl) => batch.dead_put.push((
                        id.clone(),
                        *seq,
                        serde_json::to_string(dl).unwrap_or_default(),
                    )),
                    None => batch.dead_del.push((id.clone(), *seq)),
                }
            }
            taken.push((s, p));
        }
        if taken.is_empty() {
            return false;
        }
        match run_blocking(move || store.commit_webhooks(&batch, durability)).await {
            Ok(()) => {
                for (s, p) in &taken {
                    s.flushed(p);
                }
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot persist webhook cursors; keeping them for the next try");
                for (s, p) in taken {
                    s.restore_unflushed(p);
                }
                false
            }
        }
    }

    /// Makes earlier unsynced flushes durable: an empty write transaction committed with fsync.
    pub(super) async fn sync_store(&self) -> bool {
        let Some(store) = self.ctx.store.clone() else {
            return true;
        };
        let _w = self.write.lock().await;
        run_blocking(move || store.commit_webhooks(&WebhookBatch::default(), Flush::Fsync))
            .await
            .is_ok()
    }
}
