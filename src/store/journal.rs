//! The journal: the live file's write-ahead log, plain append-only files made durable with
//! `fdatasync`.
//!
//! Why a file of our own in front of redb: a redb commit with fsync costs 1.4-2x a plain
//! append + `fdatasync` at p50 and 4x at p99 (`cargo bench --bench log_backend`, 200 KB: 2.6 ms
//! against 0.65 ms), and that commit sat on the path of every acknowledgement and every event.
//! Now a commit is one append here; the applier (`apply.rs`) writes the same batches into
//! redb in the background, in larger transactions, and a segment is deleted once redb holds all
//! of it durably. redb stays the store of record for everything that is read (warm start,
//! lagging webhook sinks, `store check`).
//!
//! Why segments are preallocated: `fdatasync` after an append that grows a file must also
//! commit the file's new size through the file system's own journal (a second device flush);
//! an append into space already written with zeros flushes only the data. Measured on this
//! machine's ext4 (20 KB appends): p50 0.33 -> 0.17 ms, p99 0.47-0.62 -> 0.24-0.32 ms
//! (docs/store.md). So a thread of its own ([`Journal::keep_spares`]) keeps one zero-filled,
//! synced, segment-sized file (`journal/spare`) ready, and a new segment is that file renamed.
//! Without a spare (the first moments after start, a full disk) a segment is a plain growing
//! file, as correct and slower, and is left for the spare as soon as one is ready.
//!
//! Layout: `DATA_DIR/journal/<first commit number, 20 digits>.wal`, each an 8-byte magic
//! `GDWJRNL1` followed by records, and then possibly zeros up to its preallocated size:
//!
//! ```text
//! u32 LE payload length | u32 LE CRC-32 of (commit number LE, payload) | u64 LE commit number | payload
//! ```
//!
//! The payload is an encoded [`super::Batch`].
//!
//! Invariants:
//! - Commit numbers are gap-free across segments; a segment's first record has the number in
//!   its name.
//! - A segment's records end at its end of file or at a header of zeros (the preallocated
//!   rest). Only the newest segment may end in a torn record (a crash during an append, or an
//!   append that failed and could not be cut back); opening the journal for writing cuts it
//!   there. A bad record anywhere else is corruption, refused at open.
//! - A segment is deleted only once every record in it is durably in redb (`release`).
//! - After a failed append the bytes it may have left are cut off (a growing segment) or
//!   overwritten with zeros (preallocated space) before anything else is appended; if that
//!   fails too, every append fails until it succeeds.
//! - `spare` and `*.tmp` files in the directory are not segments: a spare holds only zeros.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::StoreError;

/// The journal's directory inside the data directory.
pub const DIR: &str = "journal";
const MAGIC: &[u8; 8] = b"GDWJRNL1";
const RECORD_HEADER: usize = 16;
/// A new segment is started once the current one holds this much; a spare is this long.
pub const SEGMENT_BYTES: u64 = 16 << 20;
/// The zero-filled file the next segment is made of.
const SPARE: &str = "spare";
/// A record longer than this is corruption (a batch is bounded far below it).
const MAX_RECORD: u64 = 1 << 30;

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.wal")
}

fn crc(n: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&n.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Journal records: (commit number, payload), in order.
pub type Records = Vec<(u64, Vec<u8>)>;

/// One segment as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentScan {
    /// The commit number in its name.
    pub first: u64,
    /// The file.
    pub path: PathBuf,
    /// Its length on disk.
    pub file_len: u64,
    /// The length up to the end of its last good record (the magic counts).
    pub good_len: u64,
    /// Records in it.
    pub records: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub bad: Option<String>,
}

/// What the journal holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Every segment, oldest first.
    pub segments: Vec<SegmentScan>,
    /// The records numbered above the `after` the scan was asked for: (commit number, payload).
    pub records: Records,
    /// The highest commit number found (0: none).
    pub last: u64,
    /// Bytes on disk.
    pub bytes: u64,
    /// Damage that is not a torn tail of the newest segment (corruption).
    pub problems: Vec<String>,
}

/// Reads every segment in `data_dir/journal` (none if the directory is missing), keeping the
/// payloads of records numbered above `after`. Checks the magic, each record's CRC, and that
/// numbers are gap-free from each segment's name; changes nothing.
pub fn scan(data_dir: &Path, after: u64) -> Result<Scan, StoreError> {
    let dir = data_dir.join(DIR);
    let mut names: Vec<(u64, PathBuf)> = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Scan::default()),
        Err(e) => return Err(io_err(&dir, "read the journal directory")(e)),
    };
    let mut out = Scan::default();
    for e in entries {
        let e = e.map_err(io_err(&dir, "read the journal directory"))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name == SPARE || name.ends_with(".tmp") {
            continue;
        }
        match name
            .strip_suffix(".wal")
            .filter(|s| s.len() == 20)
            .and_then(|s| s.parse::<u64>().ok())
        {
            Some(first) => names.push((first, e.path())),
            None => out
                .problems
                .push(format!("{}: not a journal segment", e.path().display())),
        }
    }
    names.sort();
    let count = names.len();
    let mut expect: Option<u64> = None;
    for (i, (first, path)) in names.into_iter().enumerate() {
        let newest = i + 1 == count;
        let bytes = std::fs::read(&path).map_err(io_err(&path, "read a journal segment"))?;
        out.bytes += bytes.len() as u64;
        let mut seg = SegmentScan {
            first,
            path: path.clone(),
            file_len: bytes.len() as u64,
            good_len: 0,
            records: 0,
            bad: None,
        };
        if let Some(e) = expect
            && e != first
        {
            out.problems.push(format!(
                "{}: starts at commit {first}, the segment before ends at {}",
                path.display(),
                e - 1
            ));
        }
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            seg.bad = Some("no journal header".into());
        } else {
            let mut at = MAGIC.len();
            seg.good_len = at as u64;
            let mut n_expect = first;
            while at < bytes.len() {
                let rest = &bytes[at..bytes.len().min(at + RECORD_HEADER)];
                if rest.iter().all(|&b| b == 0) {
                    // The preallocated rest of the segment: no more records.
                    break;
                }
                let Some(h) = bytes.get(at..at + RECORD_HEADER) else {
                    seg.bad = Some(format!("truncated record header at byte {at}"));
                    break;
                };
                let len = u64::from(u32::from_le_bytes(h[0..4].try_into().expect("4 bytes")));
                let sum = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
                let n = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
                let start = at + RECORD_HEADER;
                let Some(payload) = (len <= MAX_RECORD)
                    .then(|| bytes.get(start..start + len as usize))
                    .flatten()
                else {
                    seg.bad = Some(format!("truncated record at byte {at}"));
                    break;
                };
                if crc(n, payload) != sum {
                    seg.bad = Some(format!("checksum mismatch at byte {at}"));
                    break;
                }
                if n != n_expect {
                    seg.bad = Some(format!(
                        "record at byte {at} is commit {n}, expected {n_expect}"
                    ));
                    break;
                }
                if n > after {
                    out.records.push((n, payload.to_vec()));
                }
                out.last = out.last.max(n);
                seg.records += 1;
                n_expect += 1;
                at = start + len as usize;
                seg.good_len = at as u64;
            }
            expect = Some(n_expect);
        }
        if !newest && let Some(why) = &seg.bad {
            out.problems.push(format!("{}: {why}", path.display()));
        }
        out.segments.push(seg);
    }
    Ok(out)
}

/// The journal, open for appending.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// Every segment's first commit number and path, oldest first; the last is `file`.
    segments: VecDeque<(u64, PathBuf)>,
    file: File,
    /// The current segment's length (good bytes).
    len: u64,
    /// The current segment's preallocated size (0: a growing file).
    cap: u64,
    /// The commit number of the next append.
    next: u64,
    /// Bytes on disk of the segments before the current one.
    closed_bytes: u64,
    /// A failed append of this many bytes may have left some of them past `len`.
    dirty: Option<u64>,
    buf: Vec<u8>,
    /// Set by the spare thread once `spare` is ready.
    spare_ready: Arc<AtomicBool>,
    /// Asks the spare thread for a new spare (absent: no thread, no spares made).
    want_spare: Option<std::sync::mpsc::SyncSender<()>>,
    /// The spare thread, joined on drop.
    spare_thread: Option<std::thread::JoinHandle<()>>,
    /// Tells the spare thread not to start another spare.
    closing: Arc<AtomicBool>,
}

impl Journal {
    /// Opens the journal in `data_dir` (creating it), given that redb holds every commit up to
    /// `applied`. Refuses a damaged journal (anything but a torn tail of the newest segment,
    /// which is cut) and a gap between `applied` and the journal's first record. Returns the
    /// journal, appending to a new segment, and the records after `applied`, in order.
    pub fn open(data_dir: &Path, applied: u64) -> Result<(Journal, Records), StoreError> {
        let dir = data_dir.join(DIR);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::DataDir {
            dir: dir.clone(),
            source,
        })?;
        let scan = scan(data_dir, applied)?;
        if let Some(p) = scan.problems.first() {
            return Err(StoreError::Corrupt {
                path: dir.clone(),
                detail: format!("the journal is damaged: {p}"),
            });
        }
        if let Some(&(n, _)) = scan.records.first()
            && n != applied + 1
        {
            return Err(StoreError::Corrupt {
                path: dir.clone(),
                detail: format!(
                    "the journal resumes at commit {n} but the store holds commits up to {applied} only"
                ),
            });
        }
        // Unfinished spares of an earlier run.
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().ends_with(".tmp") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let mut segments = VecDeque::new();
        let mut bytes = 0;
        for s in &scan.segments {
            if s.records == 0 {
                // An empty newest segment (a crash right after it was started) or the header
                // of one torn: nothing in it.
                std::fs::remove_file(&s.path)
                    .map_err(io_err(&s.path, "remove an empty journal segment"))?;
                continue;
            }
            if s.bad.is_some() {
                // Only the newest segment gets here (anything else was refused above).
                tracing::warn!(
                    path = %s.path.display(),
                    kept = s.good_len,
                    dropped = s.file_len - s.good_len,
                    "journal: cutting a torn record at the end (a crash during an append; it was never acknowledged)"
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(&s.path)
                    .map_err(io_err(&s.path, "open a journal segment"))?;
                f.set_len(s.good_len)
                    .and_then(|()| f.sync_all())
                    .map_err(io_err(&s.path, "cut a torn journal record"))?;
                bytes += s.good_len;
            } else {
                bytes += s.file_len;
            }
            segments.push_back((s.first, s.path.clone()));
        }
        let next = scan.last.max(applied) + 1;
        let (file, path, cap) = new_segment(&dir, next)?;
        segments.push_back((next, path));
        let journal = Journal {
            dir,
            segments,
            file,
            len: MAGIC.len() as u64,
            cap,
            next,
            closed_bytes: bytes,
            dirty: None,
            buf: Vec::new(),
            spare_ready: Arc::new(AtomicBool::new(false)),
            want_spare: None,
            spare_thread: None,
            closing: Arc::new(AtomicBool::new(false)),
        };
        Ok((journal, scan.records))
    }

    /// Starts the thread that keeps a zero-filled spare segment ready (and asks it for one).
    /// Dropping the journal ends it: the drop waits for the spare it is writing, if any, and
    /// no other is started, so nothing writes into the directory once the journal is gone.
    pub fn keep_spares(&mut self) {
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let dir = self.dir.clone();
        let ready = self.spare_ready.clone();
        let closing = self.closing.clone();
        let spawned = std::thread::Builder::new()
            .name("geodwell-journal-spare".into())
            .spawn(move || {
                while rx.recv().is_ok() && !closing.load(Ordering::Acquire) {
                    match prepare_spare(&dir) {
                        Ok(()) => ready.store(true, Ordering::Release),
                        Err(e) => tracing::warn!(
                            dir = %dir.display(),
                            error = %e,
                            "journal: no spare segment (appends go to a growing file, with slower syncs)"
                        ),
                    }
                }
            });
        if let Ok(thread) = spawned {
            let _ = tx.try_send(());
            self.want_spare = Some(tx);
            self.spare_thread = Some(thread);
        }
    }

    /// Whether a spare segment is ready for the next rotation.
    pub fn spare_ready(&self) -> bool {
        self.spare_ready.load(Ordering::Acquire)
    }

    /// Starts the next segment, from the spare if one is ready.
    fn rotate(&mut self) -> Result<(), StoreError> {
        let (first, old) = self.segments.back().expect("a current segment").clone();
        // A segment without records has the next one's name: the new file replaces it.
        let empty = first == self.next;
        // The preallocated rest of the finished segment is given back (if this fails, the
        // zeros stay: a reader stops at them).
        let old_bytes = if empty {
            0
        } else if self.cap > self.len && self.file.set_len(self.len).is_ok() {
            self.len
        } else {
            self.len.max(self.cap)
        };
        let (file, path, cap) = new_segment(&self.dir, self.next)?;
        if empty {
            self.segments.pop_back();
        }
        self.closed_bytes += old_bytes;
        tracing::trace!(from = %old.display(), to = %path.display(), cap, "journal: next segment");
        self.file = file;
        self.segments.push_back((self.next, path));
        self.len = MAGIC.len() as u64;
        self.cap = cap;
        self.dirty = None;
        // Whether the spare was taken or had gone (another journal on this directory in the
        // same process), the next one is asked for.
        self.spare_ready.store(false, Ordering::Release);
        if let Some(tx) = &self.want_spare {
            let _ = tx.try_send(());
        }
        Ok(())
    }

    /// Removes what a failed append of `attempted` bytes may have left past `len`.
    fn clean_failed(&mut self, attempted: u64) -> std::io::Result<()> {
        let keep = self.len.max(self.cap);
        if self.len + attempted > keep {
            self.file.set_len(keep)?;
        }
        let zero_to = (self.len + attempted).min(self.cap);
        if zero_to > self.len {
            let zeros = vec![0u8; (zero_to - self.len) as usize];
            self.file.write_all_at(&zeros, self.len)?;
        }
        Ok(())
    }

    /// Appends one record, `fdatasync`'d when `sync`; returns its commit number. On error
    /// nothing was appended (the segment is cut back, or every later append fails until it is).
    pub fn append(&mut self, payload: &[u8], sync: bool) -> Result<u64, StoreError> {
        self.append_with(sync, |buf| buf.extend_from_slice(payload))
    }

    /// [`Journal::append`] of the payload `fill` writes (saves a copy of it).
    pub fn append_with(
        &mut self,
        sync: bool,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<u64, StoreError> {
        let (_, path) = self.segments.back().expect("a current segment").clone();
        if let Some(attempted) = self.dirty {
            self.clean_failed(attempted)
                .map_err(io_err(&path, "cut back a failed journal append"))?;
            self.dirty = None;
        }
        if self.len >= SEGMENT_BYTES || (self.cap == 0 && self.spare_ready.load(Ordering::Acquire))
        {
            self.rotate()?;
        }
        let (_, path) = self.segments.back().expect("a current segment").clone();
        let n = self.next;
        self.buf.clear();
        self.buf.resize(RECORD_HEADER, 0);
        fill(&mut self.buf);
        let len = self.buf.len() - RECORD_HEADER;
        if len as u64 > MAX_RECORD {
            return Err(StoreError::Io {
                path,
                op: "append to the journal",
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("a record of {len} bytes is over the journal's limit"),
                ),
            });
        }
        let sum = crc(n, &self.buf[RECORD_HEADER..]);
        self.buf[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        self.buf[4..8].copy_from_slice(&sum.to_le_bytes());
        self.buf[8..16].copy_from_slice(&n.to_le_bytes());
        let written = self
            .file
            .write_all_at(&self.buf, self.len)
            .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            let attempted = self.buf.len() as u64;
            self.dirty = self.clean_failed(attempted).err().map(|_| attempted);
            return Err(io_err(&path, "append to the journal")(e));
        }
        self.len += self.buf.len() as u64;
        self.next += 1;
        Ok(n)
    }

    /// Deletes every segment (but the current one) whose records are all numbered at most
    /// `applied`: redb holds them durably.
    pub fn release(&mut self, applied: u64) -> Result<(), StoreError> {
        while self.segments.len() > 1 && self.segments[1].0 <= applied + 1 {
            let (_, path) = self.segments.pop_front().expect("two segments");
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            std::fs::remove_file(&path).map_err(io_err(&path, "remove a journal segment"))?;
            self.closed_bytes = self.closed_bytes.saturating_sub(len);
        }
        Ok(())
    }

    /// The commit number of the last append (0: none yet).
    pub fn last(&self) -> u64 {
        self.next - 1
    }

    /// Bytes of the journal's segments on disk (preallocated space included).
    pub fn bytes(&self) -> u64 {
        self.closed_bytes + self.len.max(self.cap)
    }
}

/// Creates segment `first` with its header, durable (the file and its directory entry): the
/// spare renamed, if there is one, else a new file. Returns the file, its path and its
/// preallocated size (0 for a new file).
fn new_segment(dir: &Path, first: u64) -> Result<(File, PathBuf, u64), StoreError> {
    let path = dir.join(segment_name(first));
    let create = |path: &Path| -> std::io::Result<(File, u64)> {
        match std::fs::rename(dir.join(SPARE), path) {
            Ok(()) => {
                let file = OpenOptions::new().write(true).open(path)?;
                let cap = file.metadata()?.len();
                file.write_all_at(MAGIC, 0)?;
                file.sync_data()?;
                Ok((file, cap))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut file = OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(path)?;
                file.write_all(MAGIC)?;
                file.sync_all()?;
                Ok((file, 0))
            }
            Err(e) => Err(e),
        }
    };
    let (file, cap) = create(&path).map_err(io_err(&path, "create a journal segment"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir, "sync the journal directory"))?;
    Ok((file, path, cap))
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        self.want_spare = None;
        if let Some(thread) = self.spare_thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes a zero-filled, synced file of [`SEGMENT_BYTES`] and renames it to `spare`, unless
/// one is there. Synced a MiB at a time, so that no single flush holds up the appends' syncs
/// for long.
fn prepare_spare(dir: &Path) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let spare = dir.join(SPARE);
    if spare.exists() {
        return Ok(());
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("spare.{}.{n}.tmp", std::process::id()));
    let fill = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&tmp)?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..SEGMENT_BYTES / zeros.len() as u64 {
            f.write_all(&zeros)?;
            f.sync_data()?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, &spare)
    };
    let r = fill();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payloads(records: &[(u64, Vec<u8>)]) -> Vec<(u64, String)> {
        records
            .iter()
            .map(|(n, p)| (*n, String::from_utf8(p.clone()).unwrap()))
            .collect()
    }

    #[test]
    fn records_come_back_after_applied_and_released_segments_go() {
        let dir = tempfile_dir("journal-basic");
        let (mut j, rec) = Journal::open(&dir, 0).unwrap();
        assert!(rec.is_empty());
        for i in 1..=5u64 {
            assert_eq!(j.append(format!("r{i}").as_bytes(), true).unwrap(), i);
        }
        drop(j);
        let (mut j, rec) = Journal::open(&dir, 2).unwrap();
        assert_eq!(
            payloads(&rec),
            vec![(3, "r3".into()), (4, "r4".into()), (5, "r5".into())]
        );
        assert_eq!(j.append(b"r6", false).unwrap(), 6);
        // Two segments now: 1..=5 and 6..; releasing 5 deletes the first.
        assert_eq!(scan(&dir, 0).unwrap().segments.len(), 2);
        j.release(4).unwrap();
        assert_eq!(scan(&dir, 0).unwrap().segments.len(), 2);
        j.release(5).unwrap();
        let s = scan(&dir, 0).unwrap();
        assert_eq!(s.segments.len(), 1);
        assert_eq!(payloads(&s.records), vec![(6, "r6".into())]);
        assert_eq!(s.bytes, j.bytes());
        // Everything applied and the journal gone: numbering continues after `applied`.
        drop(j);
        std::fs::remove_dir_all(dir.join(DIR)).unwrap();
        let (mut j, rec) = Journal::open(&dir, 6).unwrap();
        assert!(rec.is_empty());
        assert_eq!(j.append(b"r7", true).unwrap(), 7);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_tail_is_cut_and_damage_elsewhere_is_refused() {
        let dir = tempfile_dir("journal-torn");
        let (mut j, _) = Journal::open(&dir, 0).unwrap();
        for i in 1..=3u64 {
            j.append(format!("record {i}").as_bytes(), true).unwrap();
        }
        drop(j);
        let seg = scan(&dir, 0).unwrap().segments.last().unwrap().path.clone();
        // Every cut inside the last record drops exactly that record.
        let whole = std::fs::read(&seg).unwrap();
        for cut in [1, 5, 17, 20] {
            std::fs::write(&seg, &whole[..whole.len() - cut]).unwrap();
            let s = scan(&dir, 0).unwrap();
            assert!(s.problems.is_empty(), "{:?}", s.problems);
            assert_eq!(s.last, 2, "cut {cut}");
        }
        // A flipped bit in the last record: a torn tail too (cut at open).
        let mut flipped = whole.clone();
        let at = flipped.len() - 2;
        flipped[at] ^= 1;
        std::fs::write(&seg, &flipped).unwrap();
        let (mut j, rec) = Journal::open(&dir, 0).unwrap();
        assert_eq!(rec.len(), 2);
        assert_eq!(j.append(b"again", true).unwrap(), 3);
        drop(j);
        // The same damage in a segment that is not the newest: refused.
        let s = scan(&dir, 0).unwrap();
        let first = s.segments[0].path.clone();
        let mut bytes = std::fs::read(&first).unwrap();
        let at = bytes.len() - 1;
        bytes[at] ^= 1;
        std::fs::write(&first, &bytes).unwrap();
        let e = Journal::open(&dir, 0).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        // A gap between what redb holds and the journal: refused.
        std::fs::remove_dir_all(dir.join(DIR)).unwrap();
        let (mut j, _) = Journal::open(&dir, 10).unwrap();
        j.append(b"x", true).unwrap();
        drop(j);
        let e = Journal::open(&dir, 5).unwrap_err();
        assert!(e.to_string().contains("resumes at commit 11"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn appends_go_to_the_zero_filled_spare_and_read_back_across_its_zeros() {
        let dir = tempfile_dir("journal-spare");
        let wait_spare = |j: &Journal| {
            let t0 = std::time::Instant::now();
            while !j.spare_ready.load(Ordering::Acquire) {
                assert!(t0.elapsed().as_secs() < 60, "the spare is written");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        // A spare ready before the first append replaces the empty segment of the same name.
        let (mut j, _) = Journal::open(&dir, 0).unwrap();
        j.keep_spares();
        wait_spare(&j);
        assert_eq!(j.append(b"first", true).unwrap(), 1);
        assert_eq!(j.cap, SEGMENT_BYTES);
        assert_eq!(j.segments.len(), 1);
        j.release(1).unwrap();
        assert!(
            j.segments[0].1.exists(),
            "the current segment is never released"
        );
        drop(j);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();

        let (mut j, _) = Journal::open(&dir, 0).unwrap();
        j.append(b"before the spare", true).unwrap();
        assert_eq!(j.cap, 0, "no spare yet: a growing file");
        j.keep_spares();
        wait_spare(&j);
        for i in 2..=4u64 {
            assert_eq!(j.append(format!("r{i}").as_bytes(), true).unwrap(), i);
        }
        assert_eq!(j.cap, SEGMENT_BYTES, "the spare became the segment");
        let s = scan(&dir, 0).unwrap();
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(s.segments.len(), 2);
        let newest = s.segments.last().unwrap();
        assert_eq!(newest.file_len, SEGMENT_BYTES);
        assert_eq!(newest.bad, None, "zeros after the records are not damage");
        assert_eq!(s.bytes, j.bytes());
        drop(j);
        // Reopened: every record is there, nothing is cut, and the zeros stay readable as
        // the end of a segment that is no longer the newest.
        let (mut j, rec) = Journal::open(&dir, 0).unwrap();
        assert_eq!(
            payloads(&rec),
            vec![
                (1, "before the spare".into()),
                (2, "r2".into()),
                (3, "r3".into()),
                (4, "r4".into())
            ]
        );
        assert_eq!(j.append(b"r5", true).unwrap(), 5);
        let s = scan(&dir, 0).unwrap();
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(s.last, 5);
        // A torn record inside preallocated space is still a torn tail, and damage in a
        // preallocated segment that is not the newest is still refused.
        drop(j);
        let seg = &s.segments[1].path;
        let mut bytes = std::fs::read(seg).unwrap();
        let end = s.segments[1].good_len as usize;
        bytes[end - 1] ^= 1;
        std::fs::write(seg, &bytes).unwrap();
        let e = Journal::open(&dir, 0).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("geodwell-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
