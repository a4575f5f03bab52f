//! Webhook delivery state in the store: API-created sink definitions, per-sink delivery cursors,
//! dead letters, and the event-retention floor that keeps events a lagging sink still needs.
//!
//! Tables (added without a schema bump; see `docs/webhooks.md`):
//! - `webhook_sinks`: sink id -> the API-created sink's definition as JSON (secret included, so
//!   the store file must be protected like the config file). Config sinks are not stored: they
//!   are re-read from the config at every start.
//! - `webhook_dead_letters`: (sink id, seq) -> the dead-letter record as JSON (the event's JSON
//!   inside, so a dead letter outlives the event log's retention).
//! - cursors live in the existing `cursors` table under `webhook:<sink id>` (the next `seq` the
//!   sink has to look at), and each sink's counters and last success / failure times under
//!   `webhook-stat:<field>:<sink id>` (sink ids hold no `:`).
//!
//! Invariants:
//! - These tables are created on the first webhook write, never at open: a store written by a
//!   build without webhooks opens unchanged, reads as "no webhook state", and a build without
//!   webhooks ignores the extra tables. `SCHEMA_VERSION` therefore stays 1.
//! - One [`WebhookBatch`] is one write transaction: a sink's cursor and the dead letters it wrote
//!   before that cursor land together, so after a crash a cursor never points past an event that
//!   is neither delivered nor dead-lettered.
//! - [`Store::hold_events_from`] only ever lowers what a commit trims (`min` with the publisher's
//!   retention bound), so the stored event range stays contiguous.

use std::sync::atomic::Ordering;

use redb::{ReadableTable, TableDefinition, TableError};

use super::events::{EVENT_PAGES, read_range};
use super::tables::CURSORS;
use super::{Flush, Store, StoreError, db_err};

/// API-created sinks: id -> definition JSON.
pub(crate) const WEBHOOK_SINKS: TableDefinition<&str, &str> = TableDefinition::new("webhook_sinks");
/// Dead letters: (sink id, seq) -> record JSON.
pub(crate) const WEBHOOK_DEAD_LETTERS: TableDefinition<(&str, u64), &str> =
    TableDefinition::new("webhook_dead_letters");

/// Prefix of webhook cursor keys in the `cursors` table.
pub const WEBHOOK_CURSOR_PREFIX: &str = "webhook:";

/// Prefix of webhook counter keys in the `cursors` table (`webhook-stat:<field>:<sink id>`).
pub const WEBHOOK_STAT_PREFIX: &str = "webhook-stat:";

/// The `cursors` key of sink `id`.
pub fn webhook_cursor_key(id: &str) -> String {
    format!("{WEBHOOK_CURSOR_PREFIX}{id}")
}

/// Webhook state changes committed together in one write transaction (deletes before puts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebhookBatch {
    /// API sink definitions to write: (sink id, definition JSON).
    pub sinks_put: Vec<(String, String)>,
    /// Sinks to forget entirely: definition, cursor and every dead letter.
    pub sinks_del: Vec<String>,
    /// Cursors to write: (sink id, next seq to look at).
    pub cursors: Vec<(String, u64)>,
    /// Dead letters to write: (sink id, seq, record JSON).
    pub dead_put: Vec<(String, u64, String)>,
    /// Dead letters to delete: (sink id, seq).
    pub dead_del: Vec<(String, u64)>,
    /// Counters to write: (sink id, field, value).
    pub stats: Vec<(String, &'static str, u64)>,
}

impl WebhookBatch {
    /// Whether committing this batch would change nothing.
    pub fn is_empty(&self) -> bool {
        self.sinks_put.is_empty()
            && self.sinks_del.is_empty()
            && self.cursors.is_empty()
            && self.dead_put.is_empty()
            && self.dead_del.is_empty()
            && self.stats.is_empty()
    }
}

/// Everything the webhook manager restores at start, read in one read transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebhookSnapshot {
    /// API sink definitions: (sink id, definition JSON), by id.
    pub sinks: Vec<(String, String)>,
    /// Webhook cursors: (sink id, next seq), by id.
    pub cursors: Vec<(String, u64)>,
    /// Dead letters: (sink id, seq, record JSON), by sink then seq.
    pub dead_letters: Vec<(String, u64, String)>,
    /// Counters: (sink id, field, value).
    pub stats: Vec<(String, String, u64)>,
}

/// Opens a table in a read transaction; a table that does not exist yet reads as empty.
fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, TableError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Store {
    fn begin_read_txn(&self, op: &'static str) -> Result<redb::ReadTransaction, StoreError> {
        // Sees every commit made so far (events journaled and not yet in the file included).
        self.begin_read(op)
    }

    /// Reads the webhook state: API sink definitions, webhook cursors and dead letters.
    pub fn load_webhooks(&self) -> Result<WebhookSnapshot, StoreError> {
        let path = &self.path;
        let txn = self.begin_read_txn("load webhooks")?;
        let err = |e: redb::Error| db_err(path, "load webhooks", e);
        let mut snap = WebhookSnapshot::default();
        if let Some(t) = open_read(&txn, WEBHOOK_SINKS).map_err(|e| err(e.into()))? {
            for r in t.iter().map_err(|e| err(e.into()))? {
                let (k, v) = r.map_err(|e| err(e.into()))?;
                snap.sinks
                    .push((k.value().to_string(), v.value().to_string()));
            }
        }
        if let Some(t) = open_read(&txn, CURSORS).map_err(|e| err(e.into()))? {
            for r in t.iter().map_err(|e| err(e.into()))? {
                let (k, v) = r.map_err(|e| err(e.into()))?;
                if let Some(id) = k.value().strip_prefix(WEBHOOK_CURSOR_PREFIX) {
                    snap.cursors.push((id.to_string(), v.value()));
                } else if let Some(rest) = k.value().strip_prefix(WEBHOOK_STAT_PREFIX)
                    && let Some((field, id)) = rest.split_once(':')
                {
                    snap.stats
                        .push((id.to_string(), field.to_string(), v.value()));
                }
            }
        }
        if let Some(t) = open_read(&txn, WEBHOOK_DEAD_LETTERS).map_err(|e| err(e.into()))? {
            for r in t.iter().map_err(|e| err(e.into()))? {
                let (k, v) = r.map_err(|e| err(e.into()))?;
                let (id, seq) = k.value();
                snap.dead_letters
                    .push((id.to_string(), seq, v.value().to_string()));
            }
        }
        Ok(snap)
    }

    /// Commits `batch` in one write transaction. [`Flush::Deferred`] skips the fsync: the
    /// change is visible at once and becomes durable with the next fsync'd transaction (the
    /// applier's, or a later `Sync` one here). On error nothing of the batch is stored.
    ///
    /// Unlike the applier this does not reopen a failed database handle (the applier's next
    /// write does that); the caller keeps its state and retries later.
    pub fn commit_webhooks(&self, batch: &WebhookBatch, flush: Flush) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let path = &self.path;
        let g = self.lock();
        let db = g.as_ref().ok_or_else(|| StoreError::Db {
            path: path.clone(),
            op: "commit webhooks",
            source: Box::new(redb::Error::DatabaseClosed),
        })?;
        let err = |op: &'static str| move |e: redb::Error| db_err(path, op, e);
        let mut txn = db.begin_write().map_err(|e| err("begin write")(e.into()))?;
        txn.set_durability(match flush {
            Flush::Fsync => redb::Durability::Immediate,
            Flush::Deferred => redb::Durability::None,
        })
        .map_err(|e| err("set durability")(e.into()))?;
        write_webhooks(&txn, batch).map_err(err("write webhooks"))?;
        txn.commit().map_err(|e| err("commit webhooks")(e.into()))?;
        Ok(())
    }

    /// Up to `limit` stored events with `from <= seq < below`, ascending: (seq, event JSON).
    /// The result starts above `from` when the store no longer holds `from` (retention).
    pub fn read_events(
        &self,
        from: u64,
        below: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        let path = &self.path;
        if from >= below || limit == 0 {
            return Ok(Vec::new());
        }
        let txn = self.begin_read_txn("read events")?;
        let err = |e: redb::Error| db_err(path, "read events", e);
        let Some(t) = open_read(&txn, EVENT_PAGES).map_err(|e| err(e.into()))? else {
            return Ok(Vec::new());
        };
        read_range(&t, from, below, limit).map_err(err)
    }

    /// Asks every later commit to keep the stored events with `seq >= seq` even when the event
    /// log's retention would trim them (`u64::MAX`: no hold). Webhook sinks that lag behind the
    /// in-memory log read them from here.
    pub fn hold_events_from(&self, seq: u64) {
        self.live.event_floor.store(seq, Ordering::Release);
    }

    /// The current hold (see [`Store::hold_events_from`]).
    pub fn events_held_from(&self) -> u64 {
        self.live.event_floor.load(Ordering::Acquire)
    }
}

fn write_webhooks(txn: &redb::WriteTransaction, b: &WebhookBatch) -> Result<(), redb::Error> {
    if !b.sinks_put.is_empty() || !b.sinks_del.is_empty() {
        let mut t = txn.open_table(WEBHOOK_SINKS)?;
        for id in &b.sinks_del {
            t.remove(id.as_str())?;
        }
        for (id, def) in &b.sinks_put {
            t.insert(id.as_str(), def.as_str())?;
        }
    }
    if !b.sinks_del.is_empty() || !b.cursors.is_empty() || !b.stats.is_empty() {
        let mut t = txn.open_table(CURSORS)?;
        for id in &b.sinks_del {
            t.remove(webhook_cursor_key(id).as_str())?;
            let tail = format!(":{id}");
            t.retain(|k, _| !(k.starts_with(WEBHOOK_STAT_PREFIX) && k.ends_with(&tail)))?;
        }
        for (id, at) in &b.cursors {
            t.insert(webhook_cursor_key(id).as_str(), *at)?;
        }
        for (id, field, v) in &b.stats {
            t.insert(format!("{WEBHOOK_STAT_PREFIX}{field}:{id}").as_str(), *v)?;
        }
    }
    if !b.sinks_del.is_empty() || !b.dead_put.is_empty() || !b.dead_del.is_empty() {
        let mut t = txn.open_table(WEBHOOK_DEAD_LETTERS)?;
        for id in &b.sinks_del {
            t.retain_in((id.as_str(), 0)..=(id.as_str(), u64::MAX), |_, _| false)?;
        }
        for (id, seq) in &b.dead_del {
            t.remove((id.as_str(), *seq))?;
        }
        for (id, seq, rec) in &b.dead_put {
            t.insert((id.as_str(), *seq), rec.as_str())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::Batch;

    /// A temp dir (removed when dropped, also when the test fails) and, inside it, a store
    /// path that does not exist yet.
    fn temp(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::Builder::new()
            .prefix(&format!("geodwell-store-wh-{name}-"))
            .tempdir()
            .unwrap();
        let p = root.path().join("store");
        (root, p)
    }

    fn events(range: std::ops::Range<u64>) -> Vec<(u64, Arc<str>)> {
        range
            .map(|s| (s, Arc::from(format!("{{\"seq\":{s}}}").as_str())))
            .collect()
    }

    #[test]
    fn a_store_without_webhook_tables_loads_empty_and_round_trips() {
        let (_root, dir) = temp("rt");
        let store = Store::open(&dir).unwrap();
        assert_eq!(store.load_webhooks().unwrap(), WebhookSnapshot::default());
        store
            .commit(
                &Batch {
                    cursors: vec![("other".into(), 7)],
                    ..Batch::default()
                },
                Flush::Fsync,
            )
            .unwrap();
        let b = WebhookBatch {
            sinks_put: vec![("a".into(), "{\"id\":\"a\"}".into())],
            cursors: vec![("a".into(), 5), ("b".into(), 9)],
            dead_put: vec![
                ("a".into(), 2, "{}".into()),
                ("a".into(), 3, "{}".into()),
                ("b".into(), 1, "{}".into()),
            ],
            ..WebhookBatch::default()
        };
        store.commit_webhooks(&b, Flush::Deferred).unwrap();
        store
            .commit_webhooks(
                &WebhookBatch {
                    dead_del: vec![("a".into(), 2)],
                    ..WebhookBatch::default()
                },
                Flush::Fsync,
            )
            .unwrap();
        drop(store);
        // Reopened: state survived, and cursors of other consumers are left alone.
        let store = Store::open(&dir).unwrap();
        let snap = store.load_webhooks().unwrap();
        assert_eq!(
            snap.sinks,
            vec![("a".to_string(), "{\"id\":\"a\"}".to_string())]
        );
        assert_eq!(
            snap.cursors,
            vec![("a".to_string(), 5), ("b".to_string(), 9)]
        );
        assert_eq!(
            snap.dead_letters
                .iter()
                .map(|(id, s, _)| (id.as_str(), *s))
                .collect::<Vec<_>>(),
            vec![("a", 3), ("b", 1)]
        );
        // Deleting a sink removes its definition, cursor and dead letters only.
        store
            .commit_webhooks(
                &WebhookBatch {
                    sinks_del: vec!["a".into()],
                    ..WebhookBatch::default()
                },
                Flush::Fsync,
            )
            .unwrap();
        let snap = store.load_webhooks().unwrap();
        assert!(snap.sinks.is_empty());
        assert_eq!(snap.cursors, vec![("b".to_string(), 9)]);
        assert_eq!(snap.dead_letters.len(), 1);
        assert_eq!(
            store.load(0).unwrap().cursors,
            vec![("other".to_string(), 7), (webhook_cursor_key("b"), 9)]
        );
        drop(store);
        let report = crate::store::check(&dir).unwrap();
        assert!(report.is_ok(), "{report}");
    }

    #[test]
    fn the_hold_keeps_events_the_trim_would_drop_and_reads_see_them() {
        let (_root, dir) = temp("hold");
        let store = Store::open(&dir).unwrap();
        store.hold_events_from(4);
        // One event per commit: a trim deletes whole commits' events.
        for seq in 1..11 {
            store
                .commit(
                    &Batch {
                        events: events(seq..seq + 1),
                        trim_events_below: (seq == 10).then_some(8),
                        next_seq: Some(seq + 1),
                        ..Batch::default()
                    },
                    Flush::Fsync,
                )
                .unwrap();
        }
        let got = store.read_events(0, 100, 100).unwrap();
        assert_eq!(
            got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            (4..11).collect::<Vec<_>>(),
            "trimmed below the hold (4), not below the retention bound (8)"
        );
        assert_eq!(store.read_events(5, 7, 100).unwrap().len(), 2);
        assert_eq!(store.read_events(5, 100, 1).unwrap()[0].0, 5);
        // Releasing the hold lets the next commit trim as usual.
        store.hold_events_from(u64::MAX);
        store
            .commit(
                &Batch {
                    trim_events_below: Some(8),
                    ..Batch::default()
                },
                Flush::Fsync,
            )
            .unwrap();
        assert_eq!(store.read_events(0, 100, 100).unwrap()[0].0, 8);
    }
}
