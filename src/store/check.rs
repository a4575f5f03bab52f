//! `geodwell store check`: offline verification of a store.

use std::fmt;
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable};

use super::checkpoint::{CHECKPOINT_FILE, DEVICES, FENCES, read_ck_meta};
use super::events::{EVENT_PAGES, decode_page};
use super::tables::{CURSORS, FENCE_CHANGES, FILE_NAME, INPUT};
use super::{StoreError, codec, db_err, guarded_open, read_meta};
use geodwell_core::event::Event;
use geodwell_core::fences::{Fence, FenceLimits};
use geodwell_core::partition::Input;
use geodwell_core::partition::record::{decode, decode_fence_change};

/// Most problems listed in a report; the rest are only counted.
const MAX_LISTED_PROBLEMS: usize = 100;

/// What [`check`] found. `problems` empty means the store is sound.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckReport {
    /// The store file.
    pub path: PathBuf,
    /// File size in bytes.
    pub file_bytes: u64,
    /// Whether the file was not cleanly closed and was repaired by opening it for writing
    /// (a read-only open refuses such a file).
    pub repaired: bool,
    /// The schema version (always [`super::SCHEMA_VERSION`]: another is an error).
    pub schema_version: u32,
    /// Stored watermark, Unix ms.
    pub watermark: Option<i64>,
    /// Stored highest fix time seen, Unix ms.
    pub max_seen: Option<i64>,
    /// Stored next event seq.
    pub next_seq: u64,
    /// The checkpoint: its round, the shard count, the fence change covered and per shard the
    /// last input `seq` covered.
    pub checkpoint_round: u64,
    /// Shards at the checkpoint (0: any).
    pub checkpoint_shards: u32,
    /// Per shard, the last input `seq` the checkpoint covers.
    pub checkpoint_positions: Vec<u64>,
    /// The checkpoint file's size in bytes.
    pub checkpoint_bytes: u64,
    /// Input records, and their bytes.
    pub inputs: u64,
    /// Bytes of input records.
    pub input_bytes: u64,
    /// Fixes in the input records.
    pub input_fixes: u64,
    /// Fence changes held in the log.
    pub fence_changes: u64,
    /// Fence records.
    pub fences: u64,
    /// Device records.
    pub devices: u64,
    /// Pair records over all devices.
    pub pairs: u64,
    /// Buffered fixes over all devices.
    pub buffered_fixes: u64,
    /// Event records.
    pub events: u64,
    /// Lowest and highest stored event seq.
    pub event_seqs: Option<(u64, u64)>,
    /// Delivery cursors.
    pub cursors: Vec<(String, u64)>,
    /// The last journal commit the live file holds.
    pub journal_applied: u64,
    /// Journal segments, records and bytes on disk.
    pub journal_segments: u64,
    /// Records in the journal.
    pub journal_records: u64,
    /// Bytes of the journal.
    pub journal_bytes: u64,
    /// Journal records not yet in the live file (the next start writes them there).
    pub journal_pending: u64,
    /// A torn record at the end of the newest segment (a crash during an append; never
    /// acknowledged, cut at the next start).
    pub journal_torn: Option<String>,
    /// Every problem found (at most 100 listed).
    pub problems: Vec<String>,
    /// Problems found beyond those listed.
    pub more_problems: u64,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_LISTED_PROBLEMS {
            self.problems.push(p);
        } else {
            self.more_problems += 1;
        }
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "store:          {} ({} bytes)",
            self.path.display(),
            self.file_bytes
        )?;
        writeln!(f, "schema version: {}", self.schema_version)?;
        if self.repaired {
            writeln!(f, "repaired:       yes (the store was not closed cleanly)")?;
        }
        let time = |v: Option<i64>| {
            v.map_or_else(
                || "none".to_string(),
                |ms| format!("{} ({ms} ms)", geodwell_core::time::Ts(ms)),
            )
        };
        writeln!(f, "watermark:      {}", time(self.watermark))?;
        writeln!(f, "max_seen:       {}", time(self.max_seen))?;
        writeln!(f, "next_seq:       {}", self.next_seq)?;
        writeln!(
            f,
            "checkpoint:     round {}, {} shards, covers {:?} ({} bytes)",
            self.checkpoint_round,
            self.checkpoint_shards,
            self.checkpoint_positions,
            self.checkpoint_bytes
        )?;
        writeln!(
            f,
            "input log:      {} records, {} fixes, {} bytes; {} fence changes",
            self.inputs, self.input_fixes, self.input_bytes, self.fence_changes
        )?;
        writeln!(
            f,
            "journal:        {} segments, {} records, {} bytes; live file holds commits up to {}, {} to write at the next start",
            self.journal_segments,
            self.journal_records,
            self.journal_bytes,
            self.journal_applied,
            self.journal_pending
        )?;
        if let Some(t) = &self.journal_torn {
            writeln!(f, "journal tail:   {t} (cut at the next start)")?;
        }
        writeln!(f, "fences:         {}", self.fences)?;
        writeln!(
            f,
            "devices:        {} ({} pairs, {} buffered fixes)",
            self.devices, self.pairs, self.buffered_fixes
        )?;
        match self.event_seqs {
            Some((lo, hi)) => writeln!(f, "events:         {} (seq {lo}..={hi})", self.events)?,
            None => writeln!(f, "events:         0")?,
        }
        writeln!(f, "cursors:        {}", self.cursors.len())?;
        for (name, at) in &self.cursors {
            writeln!(f, "  {name}: {at}")?;
        }
        if self.is_ok() {
            write!(f, "result:         ok")
        } else {
            writeln!(
                f,
                "result:         {} problem(s)",
                self.problems.len() as u64 + self.more_problems
            )?;
            for p in &self.problems {
                writeln!(f, "  - {p}")?;
            }
            if self.more_problems > 0 {
                writeln!(f, "  ... and {} more", self.more_problems)?;
            }
            Ok(())
        }
    }
}

/// Verifies the store in `dir`: opens it read-only (or, if it was not closed cleanly, for
/// writing, which repairs it as a service start would, verifying every page checksum), checks
/// the schema version, decodes every fence (as a valid fence with the key as its id), device
/// and event record (whose `seq` must equal its key), and checks that event seqs are contiguous
/// and below `next_seq`. Errors are for a store that cannot be opened or read at all; record
/// level problems are listed in the report.
pub fn check(dir: &Path) -> Result<CheckReport, StoreError> {
    let path = dir.join(FILE_NAME);
    let meta = std::fs::metadata(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            StoreError::Missing { path: path.clone() }
        } else {
            StoreError::DataDir {
                dir: dir.to_path_buf(),
                source: e,
            }
        }
    })?;
    let mut report = CheckReport {
        path: path.clone(),
        file_bytes: meta.len(),
        ..CheckReport::default()
    };
    match guarded_open(&path, || redb::ReadOnlyDatabase::open(&path)) {
        Ok(db) => scan(&db, &path, &mut report)?,
        Err(StoreError::Db { source, .. }) if matches!(*source, redb::Error::RepairAborted) => {
            let mut db = guarded_open(&path, || {
                redb::Database::builder()
                    .set_check_integrity_on_open(true)
                    .open(&path)
            })?;
            report.repaired = true;
            if !db
                .check_integrity()
                .map_err(|e| db_err(&path, "check integrity", e))?
            {
                report.problem("redb integrity check repaired damage".into());
            }
            scan(&db, &path, &mut report)?;
        }
        Err(e) => return Err(e),
    }
    let journal = super::journal::scan(dir, report.journal_applied)?;
    report.journal_segments = journal.segments.len() as u64;
    report.journal_records = journal.segments.iter().map(|s| s.records).sum();
    report.journal_bytes = journal.bytes;
    report.journal_pending = journal.records.len() as u64;
    if let Some(s) = journal.segments.last()
        && let Some(why) = &s.bad
    {
        report.journal_torn = Some(format!("{}: {why}", s.path.display()));
    }
    for p in journal.problems {
        report.problem(format!("journal: {p}"));
    }
    if let Some(&(n, _)) = journal.records.first()
        && n != report.journal_applied + 1
    {
        report.problem(format!(
            "journal: resumes at commit {n}, the live file holds commits up to {}",
            report.journal_applied
        ));
    }
    for (n, bytes) in &journal.records {
        if let Err(e) = super::Batch::decode(bytes) {
            report.problem(format!("journal: commit {n} does not decode: {}", e.0));
        }
    }
    let ck_path = dir.join(CHECKPOINT_FILE);
    report.checkpoint_bytes = std::fs::metadata(&ck_path).map_or(0, |m| m.len());
    match guarded_open(&ck_path, || redb::ReadOnlyDatabase::open(&ck_path)) {
        Ok(db) => scan_checkpoint(&db, &ck_path, &mut report)?,
        Err(StoreError::Db { source, .. }) if matches!(*source, redb::Error::RepairAborted) => {
            let db = guarded_open(&ck_path, || {
                redb::Database::builder()
                    .set_check_integrity_on_open(true)
                    .open(&ck_path)
            })?;
            report.repaired = true;
            scan_checkpoint(&db, &ck_path, &mut report)?;
        }
        Err(e) => return Err(e),
    }
    Ok(report)
}

fn scan_checkpoint(
    db: &impl ReadableDatabase,
    path: &Path,
    report: &mut CheckReport,
) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(|e| db_err(path, "begin read", e))?;
    let meta = read_ck_meta(&txn, path)?;
    report.checkpoint_round = meta.round;
    report.checkpoint_shards = meta.shards;
    report.checkpoint_positions = meta.shards_at.iter().map(|p| p.seq).collect();
    let err = |e: redb::Error| db_err(path, "check", e);
    let limits = FenceLimits::stored();
    {
        let t = txn.open_table(FENCES).map_err(|e| err(e.into()))?;
        for r in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = r.map_err(|e| err(e.into()))?;
            report.fences += 1;
            let id = k.value();
            let ok = v
                .value()
                .parse::<geojson::Feature>()
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    Fence::from_feature(&f, Some(id), &limits).map_err(|e| e.to_string())
                });
            if let Err(e) = ok {
                report.problem(format!("checkpoint fences {id:?}: {e}"));
            }
        }
    }
    {
        let t = txn.open_table(DEVICES).map_err(|e| err(e.into()))?;
        for r in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = r.map_err(|e| err(e.into()))?;
            report.devices += 1;
            match codec::decode_device(k.value(), v.value()) {
                Ok(d) => {
                    report.pairs += d.pairs.len() as u64;
                    report.buffered_fixes += d.buffer.len() as u64;
                }
                Err(e) => report.problem(format!("checkpoint devices {:?}: {}", k.value(), e.0)),
            }
        }
    }
    Ok(())
}

fn scan(
    db: &impl ReadableDatabase,
    path: &Path,
    report: &mut CheckReport,
) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(|e| db_err(path, "begin read", e))?;
    let meta = read_meta(&txn, path)?;
    report.schema_version = meta.schema_version;
    report.watermark = meta.watermark;
    report.max_seen = meta.max_seen;
    report.next_seq = meta.next_seq;
    report.journal_applied = meta.journal_applied;
    let err = |e: redb::Error| db_err(path, "check", e);
    {
        let t = txn.open_table(INPUT).map_err(|e| err(e.into()))?;
        let mut prev: Option<(u16, u64)> = None;
        for r in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = r.map_err(|e| err(e.into()))?;
            let (shard, seq) = k.value();
            report.inputs += 1;
            report.input_bytes += v.value().len() as u64;
            if let Some((ps, pseq)) = prev
                && ps == shard
                && seq != pseq + 1
            {
                report.problem(format!(
                    "input log: shard {shard}: seq {pseq} is followed by {seq}"
                ));
            }
            prev = Some((shard, seq));
            match decode(v.value(), usize::MAX) {
                Ok(Input::Fixes { fixes, .. }) => report.input_fixes += fixes.len() as u64,
                Ok(_) => {}
                Err(e) => report.problem(format!("input log ({shard}, {seq}): {}", e.0)),
            }
        }
    }
    {
        let t = txn.open_table(FENCE_CHANGES).map_err(|e| err(e.into()))?;
        for r in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = r.map_err(|e| err(e.into()))?;
            report.fence_changes += 1;
            if let Err(e) = decode_fence_change(v.value()) {
                report.problem(format!("fence change {}: {}", k.value(), e.0));
            }
        }
    }
    {
        let t = txn.open_table(EVENT_PAGES).map_err(|e| err(e.into()))?;
        let mut prev: Option<u64> = None;
        for r in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = r.map_err(|e| err(e.into()))?;
            let first = k.value();
            let page = match decode_page(first, v.value()) {
                Ok(p) => p,
                Err(e) => {
                    report.problem(format!("event page {first}: {}", e.0));
                    continue;
                }
            };
            for (seq, json) in page {
                report.events += 1;
                if let Some(p) = prev
                    && seq != p + 1
                {
                    report.problem(format!("events: gap, seq {p} is followed by {seq}"));
                }
                prev = Some(seq);
                match serde_json::from_str::<Event>(json) {
                    Ok(e) if e.seq == seq => {}
                    Ok(e) => report.problem(format!("events {seq}: record says seq {}", e.seq)),
                    Err(e) => report.problem(format!("events {seq}: not an event: {e}")),
                }
                report.event_seqs = Some((report.event_seqs.map_or(seq, |(lo, _)| lo), seq));
            }
        }
        if let Some((_, hi)) = report.event_seqs
            && hi >= meta.next_seq
        {
            report.problem(format!(
                "meta next_seq {} is not above the last stored event seq {hi}",
                meta.next_seq
            ));
        }
    }
    {
        let t = txn.open_table(CURSORS).map_err(|e| err(e.into()))?;
        for r in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = r.map_err(|e| err(e.into()))?;
            report.cursors.push((k.value().to_string(), v.value()));
        }
    }
    Ok(())
}
