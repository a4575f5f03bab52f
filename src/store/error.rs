//! The store's one error type, [`StoreError`], and the helpers that build it: a redb error with
//! the file and the operation it failed in ([`db_err`]), and an open that turns a panic inside
//! redb into an error ([`guarded_open`]).
//!
//! Invariant: every failure of the store reaches its callers as a [`StoreError`] that names the
//! file and what was being done, with the underlying error as its source where there is one.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why the store could not be opened, read or written.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The blocking task that ran a store call failed (panicked or was cancelled at shutdown).
    #[error("a store call did not finish")]
    Worker(#[source] tokio::task::JoinError),
    /// The data directory could not be created or is not a directory.
    #[error("data dir {dir}: cannot create or use it: {source}")]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No store file where one was expected ([`check`]).
    #[error("store {path} does not exist")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// Another process (or another handle in this one) has the store open.
    #[error(
        "store {path} is in use by another process (is geodwell already running on this data dir?)"
    )]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a readable redb database, or redb found it damaged.
    #[error(
        "store {path} is corrupt or not a geodwell store ({detail}); it was left untouched: \
         restore it from a backup or move it away to start empty"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The store was written with another schema version.
    #[error(
        "store {path} has schema version {found}, this build reads version {expected}; {}",
        schema_hint(*.found, *.expected)
    )]
    SchemaMismatch {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// A record did not decode.
    #[error("store {path}: table {table}, key {key}: record does not decode: {detail}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The table.
        table: &'static str,
        /// The record's key.
        key: String,
        /// Why.
        detail: String,
    },
    /// A file of the journal could not be read or written (a full disk lands here).
    #[error("store {path}: {op} failed: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Journaled commits could not be written to the live file in time (a reader, or a commit
    /// waiting for room in the backlog, gave up).
    #[error("the store is behind: {behind}{}", failing.as_deref().map(|f| format!("; writing to it fails: {f}")).unwrap_or_default())]
    Applying {
        /// How far behind it is.
        behind: Behind,
        /// Why the last write of the backlog failed, while it keeps failing (redb's error, as
        /// the applier thread last saw it).
        failing: Option<String>,
    },
    /// redb failed (I/O errors such as a full disk or a read-only file land here).
    #[error("store {path}: {op} failed: {source}")]
    Db {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The redb error.
        source: Box<redb::Error>,
    },
}

fn schema_hint(found: u32, expected: u32) -> &'static str {
    if (1..expected).contains(&found) {
        "convert it with `geodwell store migrate --data-dir DIR` (the store is never converted \
         or reset automatically)"
    } else {
        "use a matching geodwell build (the store is never converted or reset automatically)"
    }
}

impl StoreError {
    /// Whether this is an out-of-space I/O error.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Db { source, .. } => {
                matches!(&**source, redb::Error::Io(e) if e.kind() == std::io::ErrorKind::StorageFull)
            }
            StoreError::DataDir { source, .. } | StoreError::Io { source, .. } => {
                source.kind() == std::io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

/// Maps a redb error on `path` to a [`StoreError`], singling out the lock and corruption cases.
pub(crate) fn db_err(path: &Path, op: &'static str, e: impl Into<redb::Error>) -> StoreError {
    let e: redb::Error = e.into();
    match e {
        redb::Error::DatabaseAlreadyOpen => StoreError::Locked {
            path: path.to_path_buf(),
        },
        redb::Error::Corrupted(detail) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail,
        },
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: io.to_string(),
            }
        }
        redb::Error::UpgradeRequired(v) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("redb file format {v} is not readable by this redb version"),
        },
        redb::Error::TableTypeMismatch { .. } | redb::Error::TableIsMultimap(_) => {
            StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: e.to_string(),
            }
        }
        e => StoreError::Db {
            path: path.to_path_buf(),
            op,
            source: Box::new(e),
        },
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Runs a redb open, turning a panic (redb may panic on a file damaged outside redb) into
/// [`StoreError::Corrupt`].
pub(crate) fn guarded_open<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, redb::DatabaseError>,
) -> Result<T, StoreError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| db_err(path, "open", e)),
        Err(p) => Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("redb panicked while opening it: {}", panic_text(&*p)),
        }),
    }
}

/// How far the store file is behind its journal, when a commit or a reader gave up waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    /// A commit found no room in the backlog of journaled commits not yet in the store file.
    Backlog {
        /// Bytes of commits waiting.
        bytes: u64,
    },
    /// A reader needed commits up to `target` in the store file.
    Barrier {
        /// The commit the reader needed.
        target: u64,
        /// The last commit in the store file.
        applied: u64,
    },
}

impl std::fmt::Display for Behind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Behind::Backlog { bytes } => {
                write!(
                    f,
                    "{bytes} bytes of commits wait to be written to the store file"
                )
            }
            Behind::Barrier { target, applied } => write!(
                f,
                "commits up to {target} are journaled but not yet in the store file (applied: {applied})"
            ),
        }
    }
}
