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
//! Layout: `DATA_DIR/journal/<first commit number, 20 digits>.wal`, each an 8-byte magic
//! `GDWJRNL1` followed by records:
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
//! - Only the newest segment may end in a torn record (a crash during an append, or an append
//!   that failed and could not be cut back); opening the journal for writing cuts it there.
//!   A bad record anywhere else is corruption, refused at open.
//! - A segment is deleted only once every record in it is durably in redb (`release`).
//! - After a failed append the segment is cut back to its previous length before anything else
//!   is appended; if that fails too, every append fails until it succeeds.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::StoreError;

/// The journal's directory inside the data directory.
pub const DIR: &str = "journal";
const MAGIC: &[u8; 8] = b"GDWJRNL1";
const RECORD_HEADER: usize = 16;
/// A new segment is started once the current one holds this much.
pub const SEGMENT_BYTES: u64 = 64 << 20;
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
    /// The commit number of the next append.
    next: u64,
    /// Bytes of the segments on disk.
    bytes: u64,
    /// A failed append may have left bytes past `len`.
    dirty: bool,
    buf: Vec<u8>,
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
            }
            bytes += s.good_len.max(MAGIC.len() as u64);
            segments.push_back((s.first, s.path.clone()));
        }
        let next = scan.last.max(applied) + 1;
        let (file, path) = new_segment(&dir, next)?;
        segments.push_back((next, path));
        let journal = Journal {
            dir,
            segments,
            file,
            len: MAGIC.len() as u64,
            next,
            bytes: bytes + MAGIC.len() as u64,
            dirty: false,
            buf: Vec::new(),
        };
        Ok((journal, scan.records))
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
        if self.dirty {
            self.file
                .set_len(self.len)
                .map_err(io_err(&path, "cut back a failed journal append"))?;
            self.dirty = false;
        }
        if self.len >= SEGMENT_BYTES {
            let (file, path) = new_segment(&self.dir, self.next)?;
            self.file = file;
            self.segments.push_back((self.next, path));
            self.len = MAGIC.len() as u64;
            self.bytes += MAGIC.len() as u64;
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
            .write_all(&self.buf)
            .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            self.dirty = self.file.set_len(self.len).is_err();
            return Err(io_err(&path, "append to the journal")(e));
        }
        self.len += self.buf.len() as u64;
        self.bytes += self.buf.len() as u64;
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
            self.bytes = self.bytes.saturating_sub(len);
        }
        Ok(())
    }

    /// The commit number of the last append (0: none yet).
    pub fn last(&self) -> u64 {
        self.next - 1
    }

    /// Bytes of the journal's segments on disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Creates segment `first` with its header, durable (the file and its directory entry).
fn new_segment(dir: &Path, first: u64) -> Result<(File, PathBuf), StoreError> {
    let path = dir.join(segment_name(first));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(io_err(&path, "create a journal segment"))?;
    file.write_all(MAGIC)
        .and_then(|()| file.sync_all())
        .map_err(io_err(&path, "create a journal segment"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir, "sync the journal directory"))?;
    Ok((file, path))
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

    fn tempfile_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("geodwell-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
