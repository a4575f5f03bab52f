//! Durable state in the data directory: two redb files and a journal in front of one.
//!
//! - `journal/`, the journal ([`journal`]): every commit is one append to it, `fdatasync`'d,
//!   and is durable from then on; the applier ([`apply`]) writes the journaled commits into the
//!   live file in the background, and a start applies what it had not.
//! - `geodwell.redb`, the live file: the **input log** (every shard's records, `input.rs`, and
//!   the fence changes), the event log, the event-mode watermark source, delivery cursors and
//!   webhook state. Appends proportional to the input, never a rewrite of state.
//! - `checkpoint.redb` ([`checkpoint`]): the engines' state at a point of each shard's log,
//!   written in the background.
//!
//! A warm start is the checkpoint plus a replay of the log after it (`boot.rs`).
//!
//! - [`Store`]: open (create or verify both files), [`Store::load`] everything for a warm start,
//!   and [`Store::commit`] one [`Batch`] in one write transaction of the live file.
//! - [`check`]: offline verification for `geodwell store check`; [`migrate`]: a version-1
//!   store (device state in the live file) converted to this layout.
//! - `webhooks.rs`: webhook sink definitions, cursors and dead letters, and the event-retention
//!   hold for lagging sinks (two tables created on first use; see `docs/webhooks.md`).
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
pub mod input;
pub mod journal;
mod meta;
mod migrate;
#[cfg(test)]
mod tests;
mod webhooks;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

pub use batch::Batch;
pub use check::{CheckReport, check};
pub use checkpoint::{Checkpoint, CheckpointMeta, CheckpointStore, CheckpointWriter, RawDevice};
pub use codec::DecodeError;
pub use error::StoreError;
pub(crate) use error::{db_err, guarded_open};
use meta::init_or_verify;
pub(crate) use meta::read_meta;
pub use migrate::{Migrated, migrate};
pub use webhooks::{WEBHOOK_CURSOR_PREFIX, WebhookBatch, WebhookSnapshot, webhook_cursor_key};

/// The layout version this build reads and writes. Bump it on any change to the tables or to an
/// encoding (see `codec.rs`); a store of another version is refused, never reinterpreted.
pub const SCHEMA_VERSION: u32 = 3;

/// The file name of the store inside the data directory.
pub const FILE_NAME: &str = "geodwell.redb";

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const CURSORS: TableDefinition<&str, u64> = TableDefinition::new("cursors");
/// The input log: (shard, seq) -> record (`input.rs`).
pub(crate) const INPUT: TableDefinition<(u16, u64), &[u8]> = TableDefinition::new("input");
/// Fence changes: change number -> change (`input.rs`).
pub(crate) const FENCE_CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("fence_changes");

pub(crate) const K_SCHEMA: &str = "schema_version";
pub(crate) const K_WATERMARK: &str = "watermark";
pub(crate) const K_MAX_SEEN: &str = "max_seen";
pub(crate) const K_NEXT_SEQ: &str = "next_seq";
/// The last journal commit the live file holds (absent: 0).
pub(crate) const K_JOURNAL_APPLIED: &str = "journal_applied";

/// Whether a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flush {
    /// fsync'd before the commit returns (redb `Durability::Immediate`).
    Fsync,
    /// Not fsync'd (redb `Durability::None`): visible at once, but lost on a crash or power
    /// loss unless a later [`Flush::Fsync`] commit (or a clean close) persists it.
    Deferred,
}

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

/// The live redb file and what writing it needs; shared with the applier thread.
pub(crate) struct Live {
    path: PathBuf,
    /// `None` after a failed reopen; the next write tries again.
    db: Mutex<Option<Database>>,
    commits: AtomicU64,
    failed_commits: AtomicU64,
    reopens: AtomicU64,
    /// Commits never trim events at or above this seq (webhook sinks still need them; see
    /// `webhooks.rs`). `u64::MAX`: no hold.
    event_floor: AtomicU64,
    /// Commits never trim events at or above this seq either: a replay after the latest
    /// checkpoint may produce them again, and must find them to keep their `seq`.
    replay_floor: AtomicU64,
}

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Database>> {
        // A panic while holding the lock leaves at worst an aborted transaction behind.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn floor(&self) -> u64 {
        self.event_floor
            .load(Ordering::Acquire)
            .min(self.replay_floor.load(Ordering::Acquire))
    }

    /// Writes `batches` in one write transaction (each as [`Batch`] says, in order), and
    /// `meta.journal_applied = applied` with them.
    pub(crate) fn write<'a>(
        &self,
        batches: impl Iterator<Item = &'a Batch>,
        applied: Option<u64>,
        flush: Flush,
    ) -> Result<(), StoreError> {
        let path = &self.path;
        let mut g = self.lock();
        let txn = match g.as_ref().map(|db| db.begin_write()) {
            Some(Ok(txn)) => txn,
            Some(Err(e)) if !needs_reopen(&e) => return Err(db_err(path, "begin write", e)),
            _ => {
                // After an I/O error during a commit redb refuses further writes until the
                // database is closed and reopened (which repairs it).
                if let Some(db) = g.take()
                    && let Err(e) = db.close()
                {
                    tracing::warn!(path = %path.display(), error = %e, "closing the store after a failed commit");
                }
                self.reopens.fetch_add(1, Ordering::Relaxed);
                let db = open_db(path)?;
                init_or_verify(&db, path)?;
                let txn = db
                    .begin_write()
                    .map_err(|e| db_err(path, "begin write", e))?;
                *g = Some(db);
                txn
            }
        };
        let mut txn = txn;
        let err = |op: &'static str| move |e: redb::Error| db_err(path, op, e);
        txn.set_durability(match flush {
            Flush::Fsync => redb::Durability::Immediate,
            Flush::Deferred => redb::Durability::None,
        })
        .map_err(|e| err("set durability")(e.into()))?;
        let floor = self.floor();
        for b in batches {
            write_batch(&txn, b, floor).map_err(err("write"))?;
        }
        if let Some(n) = applied {
            let mut t = txn.open_table(META).map_err(|e| err("write")(e.into()))?;
            t.insert(K_JOURNAL_APPLIED, n.to_le_bytes().as_slice())
                .map_err(|e| err("write")(e.into()))?;
        }
        txn.commit().map_err(|e| err("commit")(e.into()))?;
        Ok(())
    }
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

fn open_db(path: &Path) -> Result<Database, StoreError> {
    // The live file is appended to and read back only at start (and by lagging webhook sinks):
    // a small cache is enough, and keeps redb's page cache from growing with the input.
    guarded_open(path, || {
        Database::builder().set_cache_size(4 << 20).create(path)
    })
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
        let live = Arc::new(Live {
            path: path.clone(),
            db: Mutex::new(Some(db)),
            commits: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            reopens: AtomicU64::new(0),
            event_floor: AtomicU64::new(u64::MAX),
            replay_floor: AtomicU64::new(u64::MAX),
        });
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
        let positions: Vec<u64> = checkpoint.meta.positions.iter().map(|p| p.0).collect();
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

fn needs_reopen(e: &redb::TransactionError) -> bool {
    matches!(
        e,
        redb::TransactionError::Storage(
            redb::StorageError::PreviousIo | redb::StorageError::DatabaseClosed
        )
    )
}

fn write_batch(txn: &redb::WriteTransaction, b: &Batch, floor: u64) -> Result<(), redb::Error> {
    if !b.inputs.is_empty() || !b.truncate_inputs.is_empty() {
        let mut t = txn.open_table(INPUT)?;
        for (shard, seq, rec) in &b.inputs {
            t.insert((*shard, *seq), rec.as_slice())?;
        }
        for &(shard, upto) in &b.truncate_inputs {
            t.retain_in((shard, 0)..=(shard, upto), |_, _| false)?;
        }
    }
    if !b.fence_changes.is_empty() || b.truncate_fence_changes.is_some() {
        let mut t = txn.open_table(FENCE_CHANGES)?;
        for (n, change) in &b.fence_changes {
            t.insert(*n, change.as_slice())?;
        }
        if let Some(upto) = b.truncate_fence_changes {
            t.retain_in(..=upto, |_, _| false)?;
        }
    }
    if !b.events.is_empty() || b.trim_events_below.is_some() {
        let mut t = txn.open_table(events::EVENT_PAGES)?;
        if let Some(first) = b.events.first() {
            t.insert(first.0, events::encode_page(&b.events).as_slice())?;
        }
        if let Some(below) = b.trim_events_below {
            // Events a webhook sink still needs are kept past the log's retention.
            events::trim(&mut t, below.min(floor))?;
        }
    }
    if b.watermark.is_some() || b.max_seen.is_some() || b.next_seq.is_some() {
        let mut t = txn.open_table(META)?;
        if let Some(w) = b.watermark {
            t.insert(K_WATERMARK, w.to_le_bytes().as_slice())?;
        }
        if let Some(m) = b.max_seen {
            t.insert(K_MAX_SEEN, m.to_le_bytes().as_slice())?;
        }
        if let Some(n) = b.next_seq {
            t.insert(K_NEXT_SEQ, n.to_le_bytes().as_slice())?;
        }
    }
    if !b.cursors.is_empty() {
        let mut t = txn.open_table(CURSORS)?;
        for (name, at) in &b.cursors {
            t.insert(name.as_str(), *at)?;
        }
    }
    Ok(())
}
