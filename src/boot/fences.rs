//! The fences a store holds, parsed: the checkpoint's set and the fence log after it.
//!
//! Stored fences were validated when they were accepted: they are parsed with the limits of
//! stored fences ([`FenceLimits::stored`]), so a limit lowered since (or added by a newer build)
//! never refuses them, nor makes a replay differ.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::error::BootError;
use geodwell_core::fences::{Fence, FenceLimits, parse_fences_str};
use geodwell_core::partition::record::{FenceChange, decode_fence_change};
use geodwell_core::partition::{ChangeLog, FenceUpdate};

/// The fences of a store.
#[derive(Debug, Default)]
pub(super) struct StoredFences {
    /// The checkpoint's fences.
    pub(super) base: Vec<Arc<Fence>>,
    /// The fence log after the checkpoint, parsed.
    pub(super) changes: ChangeLog,
    /// The fences as of now: the base with every change applied in order.
    pub(super) current: BTreeMap<String, Arc<Fence>>,
    /// Fences changed since the checkpoint, with the number of their latest change.
    pub(super) since_checkpoint: BTreeMap<String, u64>,
    /// The number the next change gets.
    pub(super) next_change: u64,
}

/// One stored fence (exactly one Feature).
pub(super) fn parse_one(text: &str, data_dir: &Path) -> Result<Fence, BootError> {
    let mut parsed = parse_fences_str(text, &FenceLimits::stored()).map_err(|errors| {
        BootError::FencesInvalid {
            path: data_dir.to_path_buf(),
            errors,
        }
    })?;
    match parsed.pop() {
        Some(f) if parsed.is_empty() => Ok(f),
        _ => Err(BootError::Corrupt(
            "a stored fence is not exactly one Feature".into(),
        )),
    }
}

/// Parses the checkpoint's fence texts and the fence log after the checkpoint's last change
/// `fence_change`.
pub(super) fn parse(
    base: Vec<Arc<Fence>>,
    log: &[(u64, Vec<u8>)],
    fence_change: u64,
    data_dir: &Path,
) -> Result<StoredFences, BootError> {
    let mut out = StoredFences {
        current: base.iter().map(|f| (f.id.to_string(), f.clone())).collect(),
        base,
        next_change: fence_change + 1,
        ..StoredFences::default()
    };
    for (n, bytes) in log {
        let c = decode_fence_change(bytes)
            .map_err(|e| BootError::Corrupt(format!("fence change {n}: {e}")))?;
        let (id, update) = match c {
            FenceChange::Put(text) => {
                let f = Arc::new(parse_one(&text, data_dir)?);
                out.current.insert(f.id.to_string(), f.clone());
                (f.id.to_string(), FenceUpdate::Put(f))
            }
            FenceChange::Delete(id) => {
                out.current.remove(&id);
                let update = FenceUpdate::Delete(Arc::from(id.as_str()));
                (id, update)
            }
        };
        out.since_checkpoint.insert(id, *n);
        out.changes.0.insert(*n, update);
        out.next_change = out.next_change.max(n + 1);
    }
    Ok(out)
}
