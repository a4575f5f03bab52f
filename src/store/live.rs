//! The live redb file as commits write it: the handle shared by the store and the applier
//! ([`Live`]), how a commit waits for the disk ([`Flush`]), and how one [`Batch`] becomes rows of
//! the live file's tables.
//!
//! Invariants:
//! - One [`Live::write`] is one write transaction: its batches, and `meta.journal_applied` with
//!   them, are stored entirely or not at all.
//! - A trim never deletes events at or above [`Live::floor`] (held for lagging webhook sinks
//!   and for a replay after the latest checkpoint).
//! - After an I/O error the handle is closed and reopened (and the file verified again) before
//!   the next write, because redb refuses further writes on it until then.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::Database;

use super::batch::Batch;
use super::error::{StoreError, db_err, guarded_open};
use super::events;
use super::meta::init_or_verify;
use super::tables::{
    CURSORS, FENCE_CHANGES, INPUT, K_JOURNAL_APPLIED, K_MAX_SEEN, K_NEXT_SEQ, K_WATERMARK, META,
};

/// Whether a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flush {
    /// fsync'd before the commit returns (redb `Durability::Immediate`).
    Fsync,
    /// Not fsync'd (redb `Durability::None`): visible at once, but lost on a crash or power
    /// loss unless a later [`Flush::Fsync`] commit (or a clean close) persists it.
    Deferred,
}

/// The live redb file and what writing it needs; shared with the applier thread.
pub(crate) struct Live {
    path: PathBuf,
    /// `None` after a failed reopen; the next write tries again.
    db: Mutex<Option<Database>>,
    /// Successful commits (counted by the store, which sees a commit end to end).
    pub(super) commits: AtomicU64,
    /// Failed commits.
    pub(super) failed_commits: AtomicU64,
    /// Times the handle was reopened after a failure.
    pub(super) reopens: AtomicU64,
    /// Commits never trim events at or above this seq (webhook sinks still need them; see
    /// `webhooks.rs`). `u64::MAX`: no hold.
    pub(super) event_floor: AtomicU64,
    /// Commits never trim events at or above this seq either: a replay after the latest
    /// checkpoint may produce them again, and must find them to keep their `seq`.
    pub(super) replay_floor: AtomicU64,
}

impl Live {
    /// The live file at `path`, open as `db` (created or verified), with no commit counted and
    /// no event held.
    pub(super) fn new(path: PathBuf, db: Database) -> Live {
        Live {
            path,
            db: Mutex::new(Some(db)),
            commits: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            reopens: AtomicU64::new(0),
            event_floor: AtomicU64::new(u64::MAX),
            replay_floor: AtomicU64::new(u64::MAX),
        }
    }

    /// The handle, `None` after a failed reopen.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Option<Database>> {
        // A panic while holding the lock leaves at worst an aborted transaction behind.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lowest event `seq` a trim must keep (the lower of the webhook and replay holds).
    pub(super) fn floor(&self) -> u64 {
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

/// Opens (or creates) the live file at `path`.
pub(super) fn open_db(path: &Path) -> Result<Database, StoreError> {
    // The live file is appended to and read back only at start (and by lagging webhook sinks):
    // a small cache is enough, and keeps redb's page cache from growing with the input.
    guarded_open(path, || {
        Database::builder().set_cache_size(4 << 20).create(path)
    })
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
