//! Durable state in the data directory: two redb files and a journal in front of one.
//!
//! - `journal/`, the journal ([`journal`]): every commit is one append to it, `fdatasync`'d,
//!   and is durable from then on; the applier ([`apply`]) writes the journaled commits into the
//!   live file in the background, and a start applies what it had not.
//! - `geodwell.redb`, the live file: the **input log** (every shard's records and the fence
//!   changes, encoded by `geodwell_core::partition::record`), the event log, the event-mode
//!   watermark source, delivery cursors and webhook state. Appends proportional to the input,
//!   never a rewrite of state.
//! - `checkpoint.redb` ([`checkpoint`]): the engines' state at a point of each shard's log,
//!   written in the background.
//!
//! A warm start is the checkpoint plus a replay of the log after it (`crate::boot`).
//!
//! - [`Store`]: open (create or verify both files), [`Store::load`] everything for a warm start,
//!   and [`Store::commit`] one [`Batch`] in one write transaction of the live file.
//! - [`check`]: offline verification for `geodwell store check`; [`migrate`]: a version-1
//!   store (device state in the live file) converted to this layout.
//! - `webhooks.rs`: webhook sink definitions, cursors and dead letters, and the event-retention
//!   hold for lagging sinks (two tables created on first use; see `docs/webhooks.md`).
//! - `tables.rs`: the live file's layout (tables, `meta` keys, schema version); `live.rs`: the
//!   live file as commits write it ([`Flush`]). The files [`Store`] is built on (the journal,
//!   the applier, `batch.rs`, `meta.rs`) take what they share from those two and `error.rs`,
//!   never from this file, so none of them depends on the facade that depends on them.
//!
//! Invariants:
//! - The live file holds `meta.schema_version == SCHEMA_VERSION`, written in the same
//!   transaction that creates the tables. A file with another version, without one, or that
//!   redb cannot read is refused with a [`StoreError`]: the store is never silently reset; a
//!   version-1 store is converted only by `geodwell store migrate`.
//! - Every commit is one journal record: after a crash the store holds exactly the batches whose
//!   commit returned (with [`Flush::Fsync`]), each entirely or not at all, in order; the live
//!   file holds a prefix of them (`meta.journal_applied`), the journal the rest.
//! - A failed commit changes nothing; the live file's handle is reopened on the next write if
//!   redb refuses further writes after an I/O error.
//! - `events` keys are `seq`s; the stored range is contiguous as long as callers append
//!   contiguous `seq`s and trim only from the front ([`check`] verifies it).
//!
//! See `docs/store.md` for the encodings, durability modes and failure behaviour.

mod apply;
mod batch;
mod check;
pub mod checkpoint;
pub(crate) mod codec;
mod error;
mod events;
pub mod journal;
mod live;
mod meta;
mod migrate;
mod tables;
#[cfg(test)]
mod tests;
mod webhooks;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable};

pub use batch::Batch;
pub use check::{CheckReport, check};
pub use checkpoint::{
    Checkpoint, CheckpointMeta, CheckpointStore, CheckpointWriter, RawDevice, ShardPoint,
};
pub use error::{Behind, StoreError};
pub(crate) use error::{db_err, guarded_open};
pub use geodwell_core::codec::DecodeError;
pub use live::Flush;
use live::{Live, open_db};
use meta::init_or_verify;
pub(crate) use meta::read_meta;
pub use migrate::{Migrated, migrate};
use tables::{CURSORS, FENCE_CHANGES, INPUT};
pub use tables::{FILE_NAME, SCHEMA_VERSION};
pub use webhooks::{WEBHOOK_CURSOR_PREFIX, WebhookBatch, WebhookSnapshot, webhook_cursor_key};

/// Everything a warm start needs: the checkpoint, and the live file's input log after it, event
/// tail and meta (the live file read in one read transaction).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The checkpoint (fences, devices, where each shard's log resumes).
    pub checkpoint: Checkpoint,
    /// Each shard's input records after the checkpoint, in `seq` order: (shard, seq, record).
    pub inputs: Vec<(u16, u64, Vec<u8>)>,
    /// Fence changes after the checkpoint's, in order: (change number, change).
    pub fence_changes: Vec<(u64, Vec<u8>)>,
    /// The stored watermark, Unix ms.
    pub watermark: Option<i64>,
    /// The stored highest fix time seen (event clock mode), Unix ms.
    pub max_seen: Option<i64>,
    /// The `seq` the next event gets (1 for a new store).
    pub next_seq: u64,
    /// The stored events from `min(checkpoint.meta.event_floor, the last events_tail)` on,
    /// ascending by `seq`: (seq, event JSON).
    pub events: Vec<(u64, String)>,
    /// Delivery cursors: (sink name, next seq to deliver), by name.
    pub cursors: Vec<(String, u64)>,
}

/// Counters of a store handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Successful commits.
    pub commits: u64,
    /// Failed commits.
    pub failed_commits: u64,
    /// Times the redb handle was reopened after a failure.
    pub reopens: u64,
    /// The last journal commit the live file holds.
    pub applied: u64,
    /// Bytes of the journal on disk.
    pub journal_bytes: u64,
}

/// An open store. Thread-safe: share it in an `Arc`. Commits are serialized; loads run
/// concurrently with them on a consistent snapshot.
pub struct Store {
    path: PathBuf,
    live: Arc<Live>,
    journal: Arc<Mutex<journal::Journal>>,
    /// Its drop writes what is queued into the live file before the store closes.
    applier: apply::Applier,
    /// The checkpoint file.
    checkpoints: CheckpointStore,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Store {
    /// Opens the store in `dir`, creating the directory and an empty store if missing, and
    /// writes into the live file whatever the journal holds beyond it (commits a crash left
    /// there). Fails with a clear error on a store of another schema version, a damaged or
    /// foreign file, a damaged journal, a directory that cannot be created, read or written, a
    /// full disk, or a store another process has open. Never resets existing data.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let db = open_db(&path)?;
        init_or_verify(&db, &path)?;
        let applied = {
            let txn = db
                .begin_read()
                .map_err(|e| db_err(&path, "begin read", e))?;
            read_meta(&txn, &path)?.journal_applied
        };
        let checkpoints = CheckpointStore::open(dir)?;
        let live = Arc::new(Live::new(path.clone(), db));
        let (mut journal, records) = journal::Journal::open(dir, applied)?;
        let mut applied = applied;
        if let Some(&(last, _)) = records.last() {
            let batches = records
                .iter()
                .map(|(n, bytes)| {
                    Batch::decode(bytes).map_err(|e| StoreError::Decode {
                        path: dir.join(journal::DIR),
                        table: "journal",
                        key: n.to_string(),
                        detail: e.0,
                    })
                })
                .collect::<Result<Vec<Batch>, StoreError>>()?;
            // The trims in them are the ones computed when they were committed (see `commit`).
            live.write(batches.iter(), Some(last), Flush::Fsync)?;
            tracing::info!(
                commits = batches.len(),
                last,
                "store: wrote the journaled commits a stop left outside the store file"
            );
            applied = last;
        }
        journal.release(applied)?;
        journal.keep_spares();
        let journal = Arc::new(Mutex::new(journal));
        let applier = apply::Applier::spawn(live.clone(), journal.clone(), applied);
        Ok(Store {
            path,
            live,
            journal,
            applier,
            checkpoints,
        })
    }

    /// The checkpoint file.
    pub fn checkpoints(&self) -> &CheckpointStore {
        &self.checkpoints
    }

    /// Each shard `k`'s input records after `positions[k]`, and the fence changes after
    /// `fence_change`.
    pub fn read_after(&self, positions: &[u64], fence_change: u64) -> Result<LogTail, StoreError> {
        let txn = self.begin_read("read the input log")?;
        read_after(&txn, &self.path, positions, fence_change)
    }

    /// A read transaction of the live file that sees every commit made so far.
    fn begin_read(&self, op: &'static str) -> Result<redb::ReadTransaction, StoreError> {
        self.applier.barrier()?;
        let g = self.lock();
        let db = g.as_ref().ok_or_else(|| StoreError::Db {
            path: self.path.clone(),
            op,
            source: Box::new(redb::Error::DatabaseClosed),
        })?;
        db.begin_read()
            .map_err(|e| db_err(&self.path, "begin read", e))
    }

    /// Keeps events from `seq` on out of retention trims (the latest checkpoint's replay floor).
    pub fn hold_replay_events_from(&self, seq: u64) {
        self.live.replay_floor.store(seq, Ordering::Release);
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commit counters.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.live.commits.load(Ordering::Relaxed),
            failed_commits: self.live.failed_commits.load(Ordering::Relaxed),
            reopens: self.live.reopens.load(Ordering::Relaxed),
            applied: self.applier.applied(),
            journal_bytes: self
                .journal
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .bytes(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Database>> {
        self.live.lock()
    }

    /// Reads everything a warm start needs: the checkpoint, then in one read transaction of the
    /// live file the input records and fence changes after it, the watermark, `max_seen`,
    /// `next_seq`, the events from the checkpoint's replay floor or the last `events_tail`
    /// (whichever is older) and the cursors.
    pub fn load(&self, events_tail: usize) -> Result<Snapshot, StoreError> {
        let checkpoint = self.checkpoints.load()?;
        let path = &self.path;
        let txn = self.begin_read("load")?;
        let err = |e: redb::Error| db_err(path, "load", e);
        let meta = read_meta(&txn, path)?;
        let mut snap = Snapshot {
            watermark: meta.watermark,
            max_seen: meta.max_seen,
            next_seq: meta.next_seq,
            ..Snapshot::default()
        };
        let positions: Vec<u64> = checkpoint.meta.shards_at.iter().map(|p| p.seq).collect();
        let tail = read_after(&txn, path, &positions, checkpoint.meta.fence_change)?;
        snap.inputs = tail.inputs;
        snap.fence_changes = tail.fence_changes;
        {
            let t = txn
                .open_table(events::EVENT_PAGES)
                .map_err(|e| err(e.into()))?;
            snap.events = events::read_tail(&t, events_tail, checkpoint.meta.event_floor.max(1))
                .map_err(err)?;
        }
        {
            let t = txn.open_table(CURSORS).map_err(|e| err(e.into()))?;
            for r in t.iter().map_err(|e| err(e.into()))? {
                let (k, v) = r.map_err(|e| err(e.into()))?;
                snap.cursors.push((k.value().to_string(), v.value()));
            }
        }
        snap.checkpoint = checkpoint;
        Ok(snap)
    }

    /// Commits `batch` (deletes, then puts; events, then the trim; see [`Batch`]): one journal
    /// append, written into the live file in the background. With [`Flush::Fsync`] the batch is
    /// on disk when this returns. On error nothing of the batch is stored and the caller still
    /// owns it, to retry.
    pub fn commit(&self, batch: &Batch, flush: Flush) -> Result<(), StoreError> {
        let r = self.commit_inner(batch, flush);
        match &r {
            Ok(()) => self.live.commits.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.live.failed_commits.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    fn commit_inner(&self, batch: &Batch, flush: Flush) -> Result<(), StoreError> {
        let mut b = batch.clone();
        // The trim as it would be done now: applied later (or after a crash, before any floor
        // is known again) it deletes nothing a webhook sink or a replay holds at this point.
        if let Some(below) = b.trim_events_below {
            b.trim_events_below = Some(below.min(self.live.floor()));
        }
        let bytes = b.approx_bytes();
        self.applier.admit(bytes)?;
        let mut j = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        let n = j.append_with(flush == Flush::Fsync, |out| b.encode(out))?;
        // Pushed under the journal's lock: the applier gets commits in journal order.
        self.applier.push(n, b, bytes);
        metrics::gauge!(crate::telemetry::STORE_JOURNAL_BYTES).set(j.bytes() as f64);
        Ok(())
    }
}

/// What a shard's log holds after a position: `(shard, seq, record)` in `seq` order per shard,
/// and the fence changes after a change number.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogTail {
    /// Input records.
    pub inputs: Vec<(u16, u64, Vec<u8>)>,
    /// Fence changes: (change number, change).
    pub fence_changes: Vec<(u64, Vec<u8>)>,
}

/// Each shard's input records after its position, and the fence changes after `fence_change`,
/// in one read transaction.
fn read_after(
    txn: &redb::ReadTransaction,
    path: &Path,
    positions: &[u64],
    fence_change: u64,
) -> Result<LogTail, StoreError> {
    let err = |e: redb::Error| db_err(path, "read the input log", e);
    let mut tail = LogTail::default();
    let t = txn.open_table(INPUT).map_err(|e| err(e.into()))?;
    for r in t.iter().map_err(|e| err(e.into()))? {
        let (k, v) = r.map_err(|e| err(e.into()))?;
        let (shard, seq) = k.value();
        if seq > positions.get(shard as usize).copied().unwrap_or(0) {
            tail.inputs.push((shard, seq, v.value().to_vec()));
        }
    }
    let t = txn.open_table(FENCE_CHANGES).map_err(|e| err(e.into()))?;
    for r in t
        .range(fence_change.saturating_add(1)..)
        .map_err(|e| err(e.into()))?
    {
        let (k, v) = r.map_err(|e| err(e.into()))?;
        tail.fence_changes.push((k.value(), v.value().to_vec()));
    }
    Ok(tail)
}
