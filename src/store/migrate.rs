//! `geodwell store migrate`: converts a version-1 store, which rewrote every device's state in
//! the live file, to this layout (the state as the first checkpoint in `checkpoint.redb`, an
//! empty input log in the live file); a version-2 store (no journal) only gets its version
//! number, since version 3 adds the journal beside the same tables and a version-2 build must
//! not open a store whose newest commits may be in a journal it does not know.
//!
//! Order, so that a crash at any point leaves a store the next `migrate` finishes: the
//! checkpoint is written (and fsync'd) first, from the version-1 tables; only then is the live
//! file converted, in one write transaction that drops the old tables, creates the new ones and
//! sets the schema version. Events are rewritten as pages (`events.rs`); cursors and webhook
//! state stay where they are.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::checkpoint::{CheckpointMeta, CheckpointStore};
use super::events::{EVENT_PAGES, encode_page};
use super::tables::{FENCE_CHANGES, FILE_NAME, INPUT, K_SCHEMA, META, SCHEMA_VERSION};
use super::{StoreError, codec, db_err, guarded_open, read_meta};

const V1_FENCES: TableDefinition<&str, &str> = TableDefinition::new("fences");
const V1_EVENTS: TableDefinition<u64, &str> = TableDefinition::new("events");
const V1_DEVICES: TableDefinition<&str, &[u8]> = TableDefinition::new("devices");

/// What a migration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrated {
    /// The store already had this version; nothing was changed.
    AlreadyCurrent,
    /// A version-2 store was marked version 3 (same tables; the journal is new).
    FromV2,
    /// A version-1 store was converted: its fences and devices are the first checkpoint.
    FromV1 {
        /// Fences moved.
        fences: u64,
        /// Devices moved.
        devices: u64,
    },
}

/// Converts the store in `dir` to [`SCHEMA_VERSION`] if it is version 1 or 2.
pub fn migrate(dir: &Path) -> Result<Migrated, StoreError> {
    let path = dir.join(FILE_NAME);
    if !path.exists() {
        return Err(StoreError::Missing { path });
    }
    let db = guarded_open(&path, || Database::builder().create(&path))?;
    let version = {
        let txn = db
            .begin_read()
            .map_err(|e| db_err(&path, "begin read", e))?;
        match read_meta(&txn, &path) {
            Ok(_) => return Ok(Migrated::AlreadyCurrent),
            Err(StoreError::SchemaMismatch { found, .. }) => found,
            Err(e) => return Err(e),
        }
    };
    if version == 2 {
        let txn = db
            .begin_write()
            .map_err(|e| db_err(&path, "begin write", e))?;
        {
            let mut m = txn
                .open_table(META)
                .map_err(|e| db_err(&path, "write meta", e))?;
            m.insert(K_SCHEMA, SCHEMA_VERSION.to_le_bytes().as_slice())
                .map_err(|e| db_err(&path, "write meta", e))?;
        }
        txn.commit().map_err(|e| db_err(&path, "commit", e))?;
        return Ok(Migrated::FromV2);
    }
    if version != 1 {
        return Err(StoreError::SchemaMismatch {
            path,
            found: version,
            expected: SCHEMA_VERSION,
        });
    }
    // 1. The checkpoint, from the version-1 tables.
    let next_seq = {
        let txn = db
            .begin_read()
            .map_err(|e| db_err(&path, "begin read", e))?;
        let m = txn
            .open_table(META)
            .map_err(|e| db_err(&path, "read meta", e))?;
        m.get("next_seq")
            .map_err(|e| db_err(&path, "read meta", e))?
            .and_then(|v| codec::meta_array::<8>("next_seq", v.value()).ok())
            .map_or(1, u64::from_le_bytes)
    };
    let ck = CheckpointStore::open(dir)?;
    let (fences, devices) = {
        let txn = db
            .begin_read()
            .map_err(|e| db_err(&path, "begin read", e))?;
        let mut w = ck.writer()?;
        let mut fences = Vec::new();
        {
            let t = txn
                .open_table(V1_FENCES)
                .map_err(|e| db_err(&path, "read fences", e))?;
            for r in t.iter().map_err(|e| db_err(&path, "read fences", e))? {
                let (k, v) = r.map_err(|e| db_err(&path, "read fences", e))?;
                fences.push((k.value().to_string(), Some(v.value().to_string())));
            }
        }
        w.fences(&fences)?;
        let mut devices = Vec::new();
        let mut moved = 0u64;
        {
            let t = txn
                .open_table(V1_DEVICES)
                .map_err(|e| db_err(&path, "read devices", e))?;
            for r in t.iter().map_err(|e| db_err(&path, "read devices", e))? {
                let (k, v) = r.map_err(|e| db_err(&path, "read devices", e))?;
                let d =
                    codec::decode_device(k.value(), v.value()).map_err(|e| StoreError::Decode {
                        path: path.clone(),
                        table: "devices",
                        key: k.value().to_string(),
                        detail: e.0,
                    })?;
                devices.push(d);
                if devices.len() == 10_000 {
                    moved += devices.len() as u64;
                    w.devices(&devices)?;
                    devices.clear();
                }
            }
        }
        moved += devices.len() as u64;
        w.devices(&devices)?;
        w.commit(&CheckpointMeta {
            round: 1,
            shards: 0,
            fence_change: 0,
            event_floor: next_seq,
            shards_at: Vec::new(),
        })?;
        (fences.len() as u64, moved)
    };
    // 2. The live file, in one transaction.
    let txn = db
        .begin_write()
        .map_err(|e| db_err(&path, "begin write", e))?;
    {
        // Events: one row per event becomes pages of consecutive events.
        let old: Vec<(u64, std::sync::Arc<str>)> = {
            let t = txn
                .open_table(V1_EVENTS)
                .map_err(|e| db_err(&path, "migrate", e))?;
            t.iter()
                .map_err(|e| db_err(&path, "migrate", e))?
                .map(|r| {
                    r.map(|(k, v)| (k.value(), std::sync::Arc::from(v.value())))
                        .map_err(|e| db_err(&path, "migrate", e))
                })
                .collect::<Result<_, _>>()?
        };
        {
            let mut pages = txn
                .open_table(EVENT_PAGES)
                .map_err(|e| db_err(&path, "migrate", e))?;
            for chunk in old.chunk_by(|a, b| b.0 == a.0 + 1) {
                for page in chunk.chunks(1000) {
                    pages
                        .insert(page[0].0, encode_page(page).as_slice())
                        .map_err(|e| db_err(&path, "migrate", e))?;
                }
            }
        }
        txn.delete_table(V1_EVENTS)
            .map_err(|e| db_err(&path, "migrate", e))?;
        txn.delete_table(V1_FENCES)
            .map_err(|e| db_err(&path, "migrate", e))?;
        txn.delete_table(V1_DEVICES)
            .map_err(|e| db_err(&path, "migrate", e))?;
        txn.open_table(INPUT)
            .map_err(|e| db_err(&path, "migrate", e))?;
        txn.open_table(FENCE_CHANGES)
            .map_err(|e| db_err(&path, "migrate", e))?;
        let mut m = txn
            .open_table(META)
            .map_err(|e| db_err(&path, "migrate", e))?;
        m.insert(K_SCHEMA, SCHEMA_VERSION.to_le_bytes().as_slice())
            .map_err(|e| db_err(&path, "migrate", e))?;
    }
    txn.commit().map_err(|e| db_err(&path, "migrate", e))?;
    Ok(Migrated::FromV1 { fences, devices })
}
