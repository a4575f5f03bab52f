//! The fence registry: the one place fences are validated and written, and the API's read copy
//! of them ([`FenceMap`]).
//!
//! A write goes through a [`FenceWriter`], the seam with one implementation per deployment:
//! - one process (`local.rs`): under one lock, the check against the fences, the change
//!   numbered and persisted in the input log (through the publisher, so a 2xx means it is
//!   durable), the read copy updated, and the change sent, with its number, to every partition,
//!   which logs a fence marker where it applied it;
//! - a cluster node (`crate::cluster::fences`): a change is a message on one stream, checked by
//!   compare-and-set against the fences it follows, and a marker in every partition's input
//!   says where each partition applies it; the read copy is kept by the node's follower of that
//!   stream.
//!
//! Invariants: writes are serialized, so every partition receives fence changes in the same
//! order and all hold the same fences; the read copy equals what the partitions hold once a
//! write has returned; a write that fails to persist changes nothing.

use std::sync::Arc;

use geodwell_core::fences::{Fence, FenceErrors, FenceLimits, Rect, parse_fences};
use geodwell_core::time::Ts;

mod local;
mod map;
mod writer;

pub use local::LocalFences;
pub use map::{FenceMap, Stored};
pub use writer::{FenceCheck, FenceWrite, FenceWriteError, FenceWriter, Written};

/// The fences of the service.
#[derive(Debug)]
pub struct FenceRegistry {
    map: Arc<FenceMap>,
    limits: FenceLimits,
    max_fences: usize,
    writer: Arc<dyn FenceWriter>,
}

impl FenceRegistry {
    /// A registry whose read copy is `map` (kept by `writer`) and whose writes go to `writer`.
    pub fn new(
        map: Arc<FenceMap>,
        limits: FenceLimits,
        max_fences: usize,
        writer: Arc<dyn FenceWriter>,
    ) -> FenceRegistry {
        FenceRegistry {
            map,
            limits,
            max_fences,
            writer,
        }
    }

    /// What fences are validated against.
    pub fn limits(&self) -> &FenceLimits {
        &self.limits
    }

    /// The fence `id`, with its Feature text.
    pub fn get(&self, id: &str) -> Option<Stored> {
        self.map.get(id)
    }

    /// Every fence, sorted by id.
    pub fn list(&self) -> Vec<Arc<Fence>> {
        self.map.list()
    }

    /// Up to `limit` fences with ids after `after` (from the first without), sorted by id.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Vec<Stored> {
        self.map.page(after, limit)
    }

    /// One page of the fences meeting `windows` that pass `test`, in id order after `after`
    /// ([`FenceMap::filtered_page`]: bounded work per page).
    pub fn filtered_page(
        &self,
        windows: &[Rect],
        after: Option<&str>,
        limit: usize,
        test: impl Fn(&Fence) -> bool,
    ) -> crate::fences::map::FilteredPage {
        self.map.filtered_page(windows, after, limit, test)
    }

    /// How many fences there are.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Validates one GeoJSON Feature as fence `id` (its own `id`, if any, must match).
    pub fn validate_feature(
        &self,
        feature: &geojson::Feature,
        id: &str,
    ) -> Result<Fence, FenceWriteError> {
        let fence = Fence::from_feature(feature, Some(id), &self.limits)
            .map_err(FenceWriteError::Invalid)?;
        check_new_ids(std::slice::from_ref(&fence), false)?;
        Ok(fence)
    }

    /// Validates a Feature or FeatureCollection (every problem reported at once).
    pub fn validate_geojson(
        &self,
        geojson: &geojson::GeoJson,
    ) -> Result<Vec<Fence>, FenceWriteError> {
        let fences = parse_fences(geojson, &self.limits).map_err(FenceWriteError::Invalid)?;
        if fences.is_empty() {
            return Err(FenceWriteError::Empty);
        }
        check_new_ids(
            &fences,
            matches!(geojson, geojson::GeoJson::FeatureCollection(_)),
        )?;
        Ok(fences)
    }

    /// Creates or replaces `fences`, all or nothing.
    ///
    /// A new fence becomes active at the watermark `w` (fixes before it never start a pair
    /// with it, [`Fence::active_since`]); a replaced one keeps the time it became active.
    pub async fn put(&self, fences: Vec<Fence>, w: Option<Ts>) -> Result<Written, FenceWriteError> {
        let fences: Vec<Stored> = fences
            .into_iter()
            .map(|mut f| {
                f.active_since = match self.map.get(&f.id) {
                    Some(s) => s.fence.active_since,
                    None => w,
                };
                Stored::new(Arc::new(f))
            })
            .collect();
        let max = self.max_fences;
        let check = |map: &FenceMap| {
            let created = map.count_new(fences.iter().map(|s| &*s.fence.id));
            if map.len() + created > max {
                return Err(FenceWriteError::TooMany {
                    would: map.len() + created,
                    max,
                });
            }
            Ok(Written {
                created,
                replaced: fences.len() - created,
            })
        };
        let changes = fences.iter().cloned().map(FenceWrite::Put).collect();
        self.writer.write(changes, Box::new(check)).await
    }

    /// Deletes fence `id`: its pairs and their timers are dropped on every shard.
    pub async fn delete(&self, id: &str) -> Result<(), FenceWriteError> {
        let check = |map: &FenceMap| {
            if map.contains(id) {
                Ok(Written {
                    created: 0,
                    replaced: 0,
                })
            } else {
                Err(FenceWriteError::NotFound(id.to_string()))
            }
        };
        self.writer
            .write(vec![FenceWrite::Delete(id.to_string())], Box::new(check))
            .await
            .map(drop)
    }
}

/// Holds new fence ids to what every sink can carry
/// ([`geodwell_core::fix::uncarriable_char`]); fences already stored are not checked again.
fn check_new_ids(fences: &[Fence], in_collection: bool) -> Result<(), FenceWriteError> {
    use geodwell_core::fences::{FenceError, FenceErrorKind};
    let errors: Vec<FenceError> = fences
        .iter()
        .enumerate()
        .filter(|(_, f)| geodwell_core::fix::uncarriable_char(&f.id).is_some())
        .map(|(i, _)| FenceError {
            path: if in_collection {
                format!("features[{i}].id")
            } else {
                "id".into()
            },
            kind: FenceErrorKind::BadId(
                "must not hold control characters or Unicode noncharacters (U+FFFE, U+FFFF, ...), which message brokers refuse in topics",
            ),
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(FenceWriteError::Invalid(FenceErrors(errors)))
    }
}
