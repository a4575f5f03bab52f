//! The live file's `meta` table: reading and verifying it ([`read_meta`]: the schema version
//! first), and creating it in a new file or verifying an existing one ([`init_or_verify`]).
//!
//! Invariant: a file whose `meta` names another schema version, or none, is refused, never
//! reinterpreted or reset.

use std::path::Path;

use redb::{Database, ReadableDatabase, TableHandle};

use super::error::{StoreError, db_err};
use super::tables::{
    CURSORS, FENCE_CHANGES, INPUT, K_JOURNAL_APPLIED, K_MAX_SEEN, K_NEXT_SEQ, K_SCHEMA,
    K_WATERMARK, META, SCHEMA_VERSION,
};
use super::{codec, events};

/// The decoded `meta` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) schema_version: u32,
    pub(crate) watermark: Option<i64>,
    pub(crate) max_seen: Option<i64>,
    pub(crate) next_seq: u64,
    pub(crate) journal_applied: u64,
}

/// Reads and verifies `meta` (schema version included).
pub(crate) fn read_meta(txn: &redb::ReadTransaction, path: &Path) -> Result<Meta, StoreError> {
    let t = txn.open_table(META).map_err(|e| match e {
        redb::TableError::TableDoesNotExist(_) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: "no meta table: not a geodwell store".into(),
        },
        e => db_err(path, "read meta", e),
    })?;
    let get = |k: &'static str| -> Result<Option<Vec<u8>>, StoreError> {
        Ok(t.get(k)
            .map_err(|e| db_err(path, "read meta", e))?
            .map(|v| v.value().to_vec()))
    };
    let bad = |k: &'static str, e: codec::DecodeError| StoreError::Decode {
        path: path.to_path_buf(),
        table: META.name(),
        key: k.to_string(),
        detail: e.0,
    };
    let Some(v) = get(K_SCHEMA)? else {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: "meta table has no schema_version: not a geodwell store".into(),
        });
    };
    let schema_version =
        u32::from_le_bytes(codec::meta_array(K_SCHEMA, &v).map_err(|e| bad(K_SCHEMA, e))?);
    if schema_version != SCHEMA_VERSION {
        return Err(StoreError::SchemaMismatch {
            path: path.to_path_buf(),
            found: schema_version,
            expected: SCHEMA_VERSION,
        });
    }
    let i64_of = |k: &'static str| -> Result<Option<i64>, StoreError> {
        get(k)?
            .map(|v| {
                codec::meta_array(k, &v)
                    .map(i64::from_le_bytes)
                    .map_err(|e| bad(k, e))
            })
            .transpose()
    };
    let next_seq = get(K_NEXT_SEQ)?
        .map(|v| {
            codec::meta_array(K_NEXT_SEQ, &v)
                .map(u64::from_le_bytes)
                .map_err(|e| bad(K_NEXT_SEQ, e))
        })
        .transpose()?
        .unwrap_or(1);
    let journal_applied = get(K_JOURNAL_APPLIED)?
        .map(|v| {
            codec::meta_array(K_JOURNAL_APPLIED, &v)
                .map(u64::from_le_bytes)
                .map_err(|e| bad(K_JOURNAL_APPLIED, e))
        })
        .transpose()?
        .unwrap_or(0);
    Ok(Meta {
        journal_applied,
        schema_version,
        watermark: i64_of(K_WATERMARK)?,
        max_seen: i64_of(K_MAX_SEEN)?,
        next_seq,
    })
}

/// Initializes an empty file (no table at all) or verifies an existing store.
pub(super) fn init_or_verify(db: &Database, path: &Path) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(|e| db_err(path, "begin read", e))?;
    let empty = txn
        .list_tables()
        .map_err(|e| db_err(path, "list tables", e))?
        .next()
        .is_none();
    if !empty {
        read_meta(&txn, path)?;
        return Ok(());
    }
    drop(txn);
    let txn = db
        .begin_write()
        .map_err(|e| db_err(path, "begin write", e))?;
    {
        let mut m = txn
            .open_table(META)
            .map_err(|e| db_err(path, "create tables", e))?;
        m.insert(K_SCHEMA, SCHEMA_VERSION.to_le_bytes().as_slice())
            .map_err(|e| db_err(path, "create tables", e))?;
    }
    let mk = |r: Result<(), redb::TableError>| r.map_err(|e| db_err(path, "create tables", e));
    mk(txn.open_table(INPUT).map(drop))?;
    mk(txn.open_table(FENCE_CHANGES).map(drop))?;
    mk(txn.open_table(events::EVENT_PAGES).map(drop))?;
    mk(txn.open_table(CURSORS).map(drop))?;
    txn.commit().map_err(|e| db_err(path, "create tables", e))?;
    Ok(())
}
