//! The live file's layout: its schema version, file name, table definitions and `meta` keys,
//! shared by the code that creates, reads, writes, checks and migrates it.
//!
//! Invariants:
//! - This file depends on nothing else of the store, so every part of it can name the tables
//!   without depending on the [`super::Store`] facade.
//! - A change to a table or to a key's encoding bumps [`SCHEMA_VERSION`]: a store of another
//!   version is refused, never reinterpreted.

use redb::TableDefinition;

/// The layout version this build reads and writes. Bump it on any change to the tables or to an
/// encoding (see `codec.rs`); a store of another version is refused, never reinterpreted.
pub const SCHEMA_VERSION: u32 = 3;

/// The file name of the store inside the data directory.
pub const FILE_NAME: &str = "geodwell.redb";

/// The `meta` table: key -> fixed-width little-endian value (the `K_*` keys below).
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Delivery cursors: sink name -> the next `seq` to deliver.
pub(crate) const CURSORS: TableDefinition<&str, u64> = TableDefinition::new("cursors");
/// The input log: (shard, seq) -> record (`geodwell_core::partition::record`).
pub(crate) const INPUT: TableDefinition<(u16, u64), &[u8]> = TableDefinition::new("input");
/// Fence changes: change number -> change (`geodwell_core::partition::record`).
pub(crate) const FENCE_CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("fence_changes");

/// `meta` key of the schema version (`u32`).
pub(crate) const K_SCHEMA: &str = "schema_version";
/// `meta` key of the stored watermark (`i64`, Unix ms).
pub(crate) const K_WATERMARK: &str = "watermark";
/// `meta` key of the highest fix time seen in event clock mode (`i64`, Unix ms).
pub(crate) const K_MAX_SEEN: &str = "max_seen";
/// `meta` key of the `seq` the next event gets (`u64`).
pub(crate) const K_NEXT_SEQ: &str = "next_seq";
/// The last journal commit the live file holds (absent: 0).
pub(crate) const K_JOURNAL_APPLIED: &str = "journal_applied";
