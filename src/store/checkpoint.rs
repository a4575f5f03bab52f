//! The checkpoint file, `checkpoint.redb`: the engines' state at a point of every shard's input
//! log, written in the background, beside the live file `geodwell.redb` (input log, events,
//! cursors), so that a long checkpoint never holds up the commits that answer ingest.
//!
//! Tables: `fences` (id -> Feature text), `devices` (id -> device record, `codec.rs`), and
//! `ck_meta`: the schema version, the checkpoint's round, the shard count, the fence change
//! covered, the lowest event `seq` a replay after it can produce again, and per shard the last
//! input `seq` covered and the engine's watermark.
//!
//! Invariants: one checkpoint is one write transaction ([`CheckpointWriter`]): its devices (those
//! changed since the previous checkpoint), fence changes and meta commit together or not at all,
//! so the file always holds exactly one complete checkpoint; devices are keyed by id, not by
//! shard, so a checkpoint taken at a clean stop restores under any shard count. A writer writes
//! its device records sorted by id (at most [`SORT_BUFFER_BYTES`] held at a time), and of two
//! records of one id the later is written last, so the result is as if each were written as it
//! came.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::codec::{self, DecodeError};
use super::{StoreError, db_err, guarded_open};
use geodwell_core::engine::DeviceState;

/// The checkpoint file's name inside the data directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.redb";

/// The checkpoint file's layout version.
pub const CHECKPOINT_SCHEMA: u32 = 1;

pub(crate) const CK_META: TableDefinition<&str, &[u8]> = TableDefinition::new("ck_meta");
pub(crate) const FENCES: TableDefinition<&str, &str> = TableDefinition::new("fences");
pub(crate) const DEVICES: TableDefinition<&str, &[u8]> = TableDefinition::new("devices");

const K_SCHEMA: &str = "schema_version";
const K_STATE: &str = "state";

/// Where a checkpoint stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// Checkpoints written so far (0: none yet, the state of an empty service).
    pub round: u64,
    /// Shards at the checkpoint (0: any; the input log after it must be empty to change it).
    pub shards: u32,
    /// The last fence change every shard had applied.
    pub fence_change: u64,
    /// Events with this `seq` or above may be produced again by a replay after the checkpoint.
    pub event_floor: u64,
    /// Where each shard stands, by shard.
    pub shards_at: Vec<ShardPoint>,
}

/// Where one shard's engine stood at a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPoint {
    /// The last input `seq` covered.
    pub seq: u64,
    /// The engine's watermark (Unix ms).
    pub watermark: Option<i64>,
    /// The parts it applied lately, oldest first (`partition::recent`); empty in a checkpoint
    /// written before checkpoints kept them.
    pub recent: Arc<[u64]>,
}

impl ShardPoint {
    /// The start of a shard's log: nothing covered, no watermark.
    pub fn start() -> ShardPoint {
        ShardPoint {
            seq: 0,
            watermark: None,
            recent: Arc::from([]),
        }
    }
}

impl CheckpointMeta {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        codec::put_uv(&mut out, self.round);
        codec::put_uv(&mut out, u64::from(self.shards));
        codec::put_uv(&mut out, self.fence_change);
        codec::put_uv(&mut out, self.event_floor);
        // The layout keeps the positions first and the parts applied lately after them (absent
        // in a checkpoint of an earlier version).
        codec::put_uv(&mut out, self.shards_at.len() as u64);
        for at in &self.shards_at {
            codec::put_uv(&mut out, at.seq);
            match at.watermark {
                Some(w) => {
                    out.push(1);
                    codec::put_zz(&mut out, w);
                }
                None => out.push(0),
            }
        }
        codec::put_uv(&mut out, self.shards_at.len() as u64);
        for at in &self.shards_at {
            codec::put_uv(&mut out, at.recent.len() as u64);
            for h in at.recent.iter() {
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        out
    }

    /// Where shard `k` stood (the start of its log when the checkpoint has no such shard).
    pub fn shard(&self, k: usize) -> ShardPoint {
        self.shards_at
            .get(k)
            .cloned()
            .unwrap_or_else(ShardPoint::start)
    }

    fn decode(b: &[u8]) -> Result<CheckpointMeta, DecodeError> {
        let mut r = codec::Reader { b, at: 0 };
        let round = r.uv()?;
        let shards = u32::try_from(r.uv()?).map_err(|_| r.err("shard count"))?;
        let fence_change = r.uv()?;
        let event_floor = r.uv()?;
        let n = r.count()?;
        let mut shards_at = Vec::with_capacity(n);
        for _ in 0..n {
            let seq = r.uv()?;
            let watermark = if r.bool()? { Some(r.zz()?) } else { None };
            shards_at.push(ShardPoint {
                seq,
                watermark,
                recent: Arc::from([]),
            });
        }
        // Absent in a checkpoint of an earlier version.
        if r.at < b.len() {
            // None at all, or one list per shard.
            let n = r.count()?;
            if n != 0 && n != shards_at.len() {
                return Err(r.err("parts applied lately for another shard count"));
            }
            for at in shards_at.iter_mut().take(n) {
                let n = r.count()?;
                let mut parts = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    parts.push(r.u64_le()?);
                }
                at.recent = Arc::from(parts);
            }
        }
        if r.at != b.len() {
            return Err(r.err("trailing bytes"));
        }
        Ok(CheckpointMeta {
            round,
            shards,
            fence_change,
            event_floor,
            shards_at,
        })
    }
}

/// A checkpoint as loaded for a warm start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    /// Where it stands.
    pub meta: CheckpointMeta,
    /// Every fence as Feature text, in id order.
    pub fences: Vec<String>,
    /// Every device, in id order, still encoded: the warm start decodes them on the shards'
    /// threads, in parallel.
    pub devices: Vec<RawDevice>,
}

/// A device record as stored: its id and its encoding (`codec.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDevice {
    /// The device id.
    pub id: String,
    /// The encoded state.
    pub bytes: Vec<u8>,
}

impl RawDevice {
    /// The device's state.
    pub fn decode(&self) -> Result<DeviceState, DecodeError> {
        codec::decode_device(&self.id, &self.bytes)
    }
}

impl Checkpoint {
    /// Every device decoded (a record that does not decode is `StoreError::Decode`).
    pub fn decode_devices(&self, path: &Path) -> Result<Vec<DeviceState>, StoreError> {
        self.devices
            .iter()
            .map(|d| {
                d.decode().map_err(|e| StoreError::Decode {
                    path: path.to_path_buf(),
                    table: "devices",
                    key: d.id.clone(),
                    detail: e.0,
                })
            })
            .collect()
    }
}

/// The checkpoint file.
pub struct CheckpointStore {
    path: PathBuf,
    db: Database,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore")
            .field("path", &self.path)
            .finish()
    }
}

/// Device records a writer holds before it writes them, sorted by id, into the `devices` table
/// (bytes of ids and encoded records).
///
/// Why: the records come in the order devices changed, which is random in id order. Inserted
/// so, each one lands on a random leaf of the table's B-tree, and once the table outgrows the
/// 8 MiB page cache nearly every insert reads one page from the file and writes another back
/// (measured: the checkpoint thread was 11 % of the server's CPU at 200k fixes/s, most of it in
/// those reads and writes). Sorted, the inserts sweep the tree once, each leaf read and written
/// once per sweep. The buffer is the bound of that memory (a round larger than it is written in
/// several sweeps).
pub const SORT_BUFFER_BYTES: usize = 8 << 20;

/// Room beyond the sort buffer's bound for the record that crosses it (a larger record grows the
/// buffer once).
const SORT_BUFFER_SLACK: usize = 64 << 10;

/// The sort buffer's memory: allocated at its full size once per checkpoint, never grown (a
/// growing `Vec` would double to 16 MiB), and its pages handed back to the kernel when the
/// checkpoint ends: the allocator may keep a freed block this large in the thread's heap,
/// resident, and the memory goal for `sync` is at most 1.2x the RSS of `none`.
///
/// The second field is what this buffer has added to `geodwell_store_checkpoint_sort_buffer_bytes`
/// (its capacity and that of the writer's `starts`, see [`CheckpointWriter::count_memory`]); the
/// drop takes it back, so the gauge is 0 between rounds.
struct SortBuf(Vec<u8>, usize);

impl SortBuf {
    /// A buffer of `bytes` plus the slack for the record that crosses the bound.
    fn with_bound(bytes: usize) -> SortBuf {
        SortBuf(Vec::with_capacity(bytes + SORT_BUFFER_SLACK), 0)
    }
}

impl Drop for SortBuf {
    fn drop(&mut self) {
        metrics::gauge!(crate::telemetry::STORE_CHECKPOINT_SORT_BUFFER_BYTES)
            .decrement(self.1 as f64);
        #[cfg(target_os = "linux")]
        {
            let page = 4096;
            let start = self.0.as_mut_ptr() as usize;
            let (from, to) = (
                start.div_ceil(page) * page,
                (start + self.0.capacity()) / page * page,
            );
            if to > from {
                // SAFETY: [from, to) lies inside this Vec's own allocation, which nothing reads
                // again before it is freed (`MADV_DONTNEED` makes its pages read as zeros); the
                // allocator's own bookkeeping sits outside it or is written after this.
                unsafe {
                    libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED);
                }
            }
        }
    }
}

/// One checkpoint being written; nothing of it is visible until [`CheckpointWriter::commit`].
pub struct CheckpointWriter<'a> {
    store: &'a CheckpointStore,
    txn: redb::WriteTransaction,
    /// Records not yet in the table, in arrival order: per record `u32` id length, the id,
    /// `u32` record length (`u32::MAX`: a removal), the record.
    pending: SortBuf,
    /// Where each pending record starts in `pending`.
    starts: Vec<u32>,
    /// `pending` is written once it holds this many bytes.
    sort_bytes: usize,
    /// Device records written.
    pub devices: u64,
}

/// The pending record at `at`: its id, and its encoding (`None`: a removal).
fn pending_at(pending: &[u8], at: u32) -> (&[u8], Option<&[u8]>) {
    let at = at as usize;
    let word =
        |i: usize| u32::from_le_bytes(pending[i..i + 4].try_into().expect("4 bytes")) as usize;
    let id_len = word(at);
    let id = &pending[at + 4..at + 4 + id_len];
    let rec_at = at + 4 + id_len;
    let rec_len = word(rec_at);
    if rec_len == u32::MAX as usize {
        return (id, None);
    }
    (id, Some(&pending[rec_at + 4..rec_at + 4 + rec_len]))
}

impl CheckpointStore {
    /// Opens (or creates, with an empty checkpoint) `checkpoint.redb` in `dir`.
    pub fn open(dir: &Path) -> Result<CheckpointStore, StoreError> {
        let path = dir.join(CHECKPOINT_FILE);
        let db = guarded_open(&path, || {
            Database::builder()
                // Checkpoints are written once and read at start: keep the cache small.
                .set_cache_size(8 << 20)
                .create(&path)
        })?;
        let s = CheckpointStore { path, db };
        s.init_or_verify()?;
        Ok(s)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn init_or_verify(&self) -> Result<(), StoreError> {
        let path = &self.path;
        let txn = self
            .db
            .begin_read()
            .map_err(|e| db_err(path, "begin read", e))?;
        let empty = txn
            .list_tables()
            .map_err(|e| db_err(path, "list tables", e))?
            .next()
            .is_none();
        if !empty {
            read_ck_meta(&txn, path)?;
            return Ok(());
        }
        drop(txn);
        let txn = self
            .db
            .begin_write()
            .map_err(|e| db_err(path, "begin write", e))?;
        {
            let mut m = txn
                .open_table(CK_META)
                .map_err(|e| db_err(path, "create tables", e))?;
            m.insert(K_SCHEMA, CHECKPOINT_SCHEMA.to_le_bytes().as_slice())
                .map_err(|e| db_err(path, "create tables", e))?;
            m.insert(K_STATE, CheckpointMeta::default().encode().as_slice())
                .map_err(|e| db_err(path, "create tables", e))?;
        }
        let mk = |r: Result<(), redb::TableError>| r.map_err(|e| db_err(path, "create tables", e));
        mk(txn.open_table(FENCES).map(drop))?;
        mk(txn.open_table(DEVICES).map(drop))?;
        txn.commit().map_err(|e| db_err(path, "create tables", e))?;
        Ok(())
    }

    /// Reads the checkpoint.
    pub fn load(&self) -> Result<Checkpoint, StoreError> {
        let path = &self.path;
        let txn = self
            .db
            .begin_read()
            .map_err(|e| db_err(path, "begin read", e))?;
        let err = |e: redb::Error| db_err(path, "load checkpoint", e);
        let meta = read_ck_meta(&txn, path)?;
        let mut ck = Checkpoint {
            meta,
            ..Checkpoint::default()
        };
        {
            let t = txn.open_table(FENCES).map_err(|e| err(e.into()))?;
            for r in t.iter().map_err(|e| err(e.into()))? {
                let (_, v) = r.map_err(|e| err(e.into()))?;
                ck.fences.push(v.value().to_string());
            }
        }
        {
            let t = txn.open_table(DEVICES).map_err(|e| err(e.into()))?;
            ck.devices
                .reserve(t.len().map_err(|e| err(e.into()))? as usize);
            for r in t.iter().map_err(|e| err(e.into()))? {
                let (k, v) = r.map_err(|e| err(e.into()))?;
                ck.devices.push(RawDevice {
                    id: k.value().to_string(),
                    bytes: v.value().to_vec(),
                });
            }
        }
        Ok(ck)
    }

    /// Starts writing the next checkpoint (one write transaction, fsync'd at commit).
    pub fn writer(&self) -> Result<CheckpointWriter<'_>, StoreError> {
        let txn = self
            .db
            .begin_write()
            .map_err(|e| db_err(&self.path, "begin checkpoint", e))?;
        let mut w = CheckpointWriter {
            store: self,
            txn,
            pending: SortBuf::with_bound(SORT_BUFFER_BYTES),
            starts: Vec::new(),
            sort_bytes: SORT_BUFFER_BYTES,
            devices: 0,
        };
        w.count_memory();
        Ok(w)
    }
}

impl CheckpointWriter<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_err(&self.store.path, "write checkpoint", e)
    }

    /// Writes device records (replacing those of the same ids); a blank state (a removed
    /// device, [`DeviceState::is_blank`]) deletes the record.
    /// Records are held (up to [`SORT_BUFFER_BYTES`]) and written sorted by id; of two records
    /// of one id, the later wins, as if each were written when it came.
    pub fn devices(&mut self, devices: &[DeviceState]) -> Result<(), StoreError> {
        for d in devices {
            if self.pending.0.len() >= self.sort_bytes {
                self.flush()?;
            }
            let at = u32::try_from(self.pending.0.len()).expect("the buffer stays far below 4 GiB");
            self.starts.push(at);
            self.pending
                .0
                .extend_from_slice(&(d.id.len() as u32).to_le_bytes());
            self.pending.0.extend_from_slice(d.id.as_bytes());
            if d.is_blank() {
                self.pending.0.extend_from_slice(&u32::MAX.to_le_bytes());
                continue;
            }
            let len_at = self.pending.0.len();
            self.pending.0.extend_from_slice(&[0; 4]);
            codec::encode_device(d, &mut self.pending.0);
            let len = (self.pending.0.len() - len_at - 4) as u32;
            self.pending.0[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        }
        self.devices += devices.len() as u64;
        self.count_memory();
        Ok(())
    }

    /// What this writer counts in `geodwell_store_checkpoint_sort_buffer_bytes` now.
    #[cfg(test)]
    pub(super) fn memory_counted(&self) -> usize {
        self.pending.1
    }

    /// Brings `geodwell_store_checkpoint_sort_buffer_bytes` up to the buffer's memory now: its
    /// capacity (allocated once, grown only by a record larger than the slack) and that of the
    /// record offsets, which a round of small records (removals) makes the larger part.
    fn count_memory(&mut self) {
        let now = self.pending.0.capacity() + self.starts.capacity() * size_of::<u32>();
        if now != self.pending.1 {
            metrics::gauge!(crate::telemetry::STORE_CHECKPOINT_SORT_BUFFER_BYTES)
                .increment(now as f64 - self.pending.1 as f64);
            self.pending.1 = now;
        }
    }

    /// Holds at most `bytes` of records before writing them sorted (0: each record is written
    /// as it comes, in the order of [`CheckpointWriter::devices`]); [`SORT_BUFFER_BYTES`] unless
    /// set. The durability benchmark compares the two.
    pub fn with_sort_buffer(mut self, bytes: usize) -> Self {
        self.sort_bytes = bytes;
        if self.pending.0.is_empty() {
            self.pending = SortBuf::with_bound(bytes);
            self.count_memory();
        }
        self
    }

    /// Writes the pending records into the table in id order (a stable sort: of two records of
    /// one id, the later is written last).
    fn flush(&mut self) -> Result<(), StoreError> {
        if self.starts.is_empty() {
            return Ok(());
        }
        let pending = &self.pending.0;
        self.starts
            .sort_by(|&a, &b| pending_at(pending, a).0.cmp(pending_at(pending, b).0));
        {
            let mut t = self.txn.open_table(DEVICES).map_err(|e| self.err(e))?;
            for &at in &self.starts {
                let (id, rec) = pending_at(pending, at);
                // Ids came in as `String`s, so they are UTF-8.
                let id = std::str::from_utf8(id).expect("ids are UTF-8");
                match rec {
                    Some(rec) => t.insert(id, rec).map(drop),
                    None => t.remove(id).map(drop),
                }
                .map_err(|e| self.err(e))?;
            }
        }
        self.pending.0.clear();
        self.starts.clear();
        Ok(())
    }

    /// Writes fence changes: `(id, Some(Feature text))` puts, `(id, None)` deletes.
    pub fn fences(&mut self, changes: &[(String, Option<String>)]) -> Result<(), StoreError> {
        let mut t = self.txn.open_table(FENCES).map_err(|e| self.err(e))?;
        for (id, text) in changes {
            match text {
                Some(text) => t.insert(id.as_str(), text.as_str()).map(drop),
                None => t.remove(id.as_str()).map(drop),
            }
            .map_err(|e| db_err(&self.store.path, "write checkpoint", e))?;
        }
        Ok(())
    }

    /// Commits the checkpoint with its meta (fsync'd when this returns).
    pub fn commit(mut self, meta: &CheckpointMeta) -> Result<(), StoreError> {
        self.flush()?;
        let path = self.store.path.clone();
        {
            let mut m = self
                .txn
                .open_table(CK_META)
                .map_err(|e| db_err(&path, "write checkpoint", e))?;
            m.insert(K_STATE, meta.encode().as_slice())
                .map_err(|e| db_err(&path, "write checkpoint", e))?;
        }
        self.txn
            .commit()
            .map_err(|e| db_err(&path, "commit checkpoint", e))
    }
}

/// Reads and verifies `ck_meta`.
pub(crate) fn read_ck_meta(
    txn: &redb::ReadTransaction,
    path: &Path,
) -> Result<CheckpointMeta, StoreError> {
    let t = txn.open_table(CK_META).map_err(|e| match e {
        redb::TableError::TableDoesNotExist(_) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: "no ck_meta table: not a geodwell checkpoint file".into(),
        },
        e => db_err(path, "read checkpoint meta", e),
    })?;
    let get = |k: &str| -> Result<Option<Vec<u8>>, StoreError> {
        Ok(t.get(k)
            .map_err(|e| db_err(path, "read checkpoint meta", e))?
            .map(|v| v.value().to_vec()))
    };
    let bad = |k: &str, detail: String| StoreError::Decode {
        path: path.to_path_buf(),
        table: "ck_meta",
        key: k.to_string(),
        detail,
    };
    let v = get(K_SCHEMA)?.ok_or_else(|| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: "ck_meta has no schema_version".into(),
    })?;
    let version =
        u32::from_le_bytes(codec::meta_array(K_SCHEMA, &v).map_err(|e| bad(K_SCHEMA, e.0))?);
    if version != CHECKPOINT_SCHEMA {
        return Err(StoreError::SchemaMismatch {
            path: path.to_path_buf(),
            found: version,
            expected: CHECKPOINT_SCHEMA,
        });
    }
    let v = get(K_STATE)?.ok_or_else(|| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: "ck_meta has no state".into(),
    })?;
    CheckpointMeta::decode(&v).map_err(|e| bad(K_STATE, e.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(shards_at: Vec<ShardPoint>) -> CheckpointMeta {
        CheckpointMeta {
            round: 3,
            shards: shards_at.len() as u32,
            fence_change: 5,
            event_floor: 8,
            shards_at,
        }
    }

    #[test]
    fn the_meta_round_trips_and_reads_every_earlier_layout() {
        let m = meta(vec![
            ShardPoint {
                seq: 4,
                watermark: Some(-2),
                recent: Arc::from([1u64, 2]),
            },
            ShardPoint::start(),
        ]);
        assert_eq!(CheckpointMeta::decode(&m.encode()).unwrap(), m);
        // Without parts applied lately: an earlier version (no section), or a first checkpoint
        // written with none (a count of 0).
        let bare = meta(vec![
            ShardPoint {
                recent: Arc::from([]),
                ..m.shards_at[0].clone()
            },
            ShardPoint::start(),
        ]);
        let mut none = bare.encode();
        let cut = none.len() - 3; // the count of lists and two empty lists
        none.truncate(cut);
        assert_eq!(CheckpointMeta::decode(&none).unwrap(), bare);
        none.push(0);
        assert_eq!(CheckpointMeta::decode(&none).unwrap(), bare);
        none.pop();
        none.push(1);
        assert!(
            CheckpointMeta::decode(&none).is_err(),
            "lists for another shard count"
        );
        assert_eq!(bare.shard(7), ShardPoint::start());
    }
}
