//! Why a warm start failed.

use std::path::PathBuf;

use thiserror::Error;

use crate::store::StoreError;
use geodwell_core::fences::FenceErrors;

/// Why the service could not start.
#[derive(Debug, Error)]
pub enum BootError {
    /// A partition was to be rebuilt from the store, and the store is closed.
    #[error("the state store is closed")]
    NoStore,
    /// The fences file could not be read.
    #[error(
        "cannot read the fences file {path} (relative paths in a config file resolve against \
         the file's directory; set [fences] fences_file = \"\" to start without fences)"
    )]
    FencesRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The fences file is not valid.
    #[error("fences file {path} is invalid: {errors}")]
    FencesInvalid {
        /// The file.
        path: PathBuf,
        /// Every problem.
        errors: FenceErrors,
    },
    /// Too many fences in the preload.
    #[error("{source_name} holds {count} fences, more than max_fences = {max}")]
    TooManyFences {
        /// The file, or the built-in samples.
        source_name: String,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The state store cannot be opened or read.
    #[error("state store")]
    Store(#[from] StoreError),
    /// The stored state is inconsistent.
    #[error("state store is inconsistent: {0}")]
    Corrupt(String),
    /// The shard count differs from the checkpoint's while the input log after it still holds
    /// records of the old layout.
    #[error(
        "the store was last written with {stored} shards and has input after its latest checkpoint; \
         start once with server.shards = {stored} (a clean stop writes a checkpoint covering \
         everything), then change the shard count"
    )]
    ShardsChanged {
        /// The stored layout's shard count.
        stored: u32,
    },
}
