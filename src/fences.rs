//! The fence registry: the one place fences are written, and the API's read copy of them.
//!
//! A write (put or delete) runs the whole protocol, in this order, under one lock: validate
//! (against the configured limits), persist (through the publisher, like every other state
//! change, so a 2xx means the change is durable), update the read copy, and send the change to
//! every shard.
//!
//! Invariants: writes are serialized, so every shard receives fence changes in the same order
//! and all shards hold the same fences; the read copy equals what the shards hold once a write
//! has returned; a write that fails to persist changes nothing.
//!
//! A cluster puts a second implementation behind the same methods (fence changes as markers in
//! every partition's input; see docs/architecture.md).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use thiserror::Error;
use tokio::sync::oneshot;

use crate::events::publisher::{PublishError, Publisher, Step};
use crate::shard::Shards;
use crate::telemetry as t;
use geodwell_core::fences::{Fence, FenceErrors, FenceLimits, parse_fences};

/// Why a fence write was refused or failed.
#[derive(Debug, Error)]
pub enum FenceWriteError {
    /// The GeoJSON is not a valid fence (every problem listed).
    #[error("{0}")]
    Invalid(FenceErrors),
    /// A FeatureCollection without features.
    #[error("the FeatureCollection holds no features")]
    Empty,
    /// The write would hold more fences than allowed.
    #[error("{would} fences would exceed the limit of {max}")]
    TooMany {
        /// Fences after the write.
        would: usize,
        /// The limit.
        max: usize,
    },
    /// No fence with this id.
    #[error("no fence with id {0:?}")]
    NotFound(String),
    /// The store cannot commit; nothing changed.
    #[error("the state store cannot commit: {0}")]
    Store(String),
    /// The service is shutting down.
    #[error("the service is shutting down")]
    ShuttingDown,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Fences that did not exist before.
    pub created: usize,
    /// Fences that replaced one with the same id.
    pub replaced: usize,
}

/// A fence in the read copy, with its normalized GeoJSON Feature text (rendered once, when it is
/// written: listings copy text instead of rendering every fence again for every reader).
#[derive(Debug, Clone)]
pub struct Stored {
    /// The fence.
    pub fence: Arc<Fence>,
    /// `serde_json::to_string(&fence.to_feature())`.
    pub json: Arc<str>,
}

impl Stored {
    fn new(fence: Arc<Fence>) -> Stored {
        let json = serde_json::to_string(&fence.to_feature())
            .unwrap_or_default()
            .into();
        Stored { fence, json }
    }
}

/// The fences of the service.
#[derive(Debug)]
pub struct FenceRegistry {
    read: RwLock<BTreeMap<String, Stored>>,
    write: tokio::sync::Mutex<()>,
    limits: FenceLimits,
    max_fences: usize,
    publisher: Publisher,
    shards: Shards,
}

impl FenceRegistry {
    /// A registry holding `fences` (which the shards already hold), writing through `publisher`
    /// and to `shards`.
    pub fn new(
        fences: &[Arc<Fence>],
        limits: FenceLimits,
        max_fences: usize,
        publisher: Publisher,
        shards: Shards,
    ) -> FenceRegistry {
        let read = fences
            .iter()
            .map(|f| (f.id.to_string(), Stored::new(f.clone())))
            .collect::<BTreeMap<_, _>>();
        metrics::gauge!(t::FENCES).set(read.len() as f64);
        FenceRegistry {
            read: RwLock::new(read),
            write: tokio::sync::Mutex::new(()),
            limits,
            max_fences,
            publisher,
            shards,
        }
    }

    /// What fences are validated against.
    pub fn limits(&self) -> &FenceLimits {
        &self.limits
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Stored>> {
        // A panic while holding the lock cannot leave the map half-written: writers only insert
        // or remove whole entries.
        self.read.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The fence `id`, with its Feature text.
    pub fn get(&self, id: &str) -> Option<Stored> {
        self.read().get(id).cloned()
    }

    /// Every fence, sorted by id.
    pub fn list(&self) -> Vec<Arc<Fence>> {
        self.read().values().map(|s| s.fence.clone()).collect()
    }

    /// Up to `limit` fences with ids after `after` (from the first without), sorted by id.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Vec<Stored> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_string()));
        self.read()
            .range((from, Bound::Unbounded))
            .take(limit)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// How many fences there are.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Validates one GeoJSON Feature as fence `id` (its own `id`, if any, must match).
    pub fn validate_feature(
        &self,
        feature: &geojson::Feature,
        id: &str,
    ) -> Result<Fence, FenceWriteError> {
        Fence::from_feature(feature, Some(id), &self.limits).map_err(FenceWriteError::Invalid)
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
        Ok(fences)
    }

    /// Creates or replaces `fences`, all or nothing.
    pub async fn put(&self, fences: Vec<Fence>) -> Result<Written, FenceWriteError> {
        let _guard = self.write.lock().await;
        let created = {
            let map = self.read();
            let created = fences.iter().filter(|f| !map.contains_key(&*f.id)).count();
            if map.len() + created > self.max_fences {
                return Err(FenceWriteError::TooMany {
                    would: map.len() + created,
                    max: self.max_fences,
                });
            }
            created
        };
        let fences: Vec<Stored> = fences
            .into_iter()
            .map(|f| Stored::new(Arc::new(f)))
            .collect();
        self.persist(put_step(&fences)).await?;
        let n = fences.len();
        for s in fences {
            let f = s.fence.clone();
            self.read
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(f.id.to_string(), s);
            self.shards
                .upsert_fence(f)
                .await
                .map_err(|_| FenceWriteError::ShuttingDown)?;
        }
        metrics::gauge!(t::FENCES).set(self.len() as f64);
        Ok(Written {
            created,
            replaced: n - created,
        })
    }

    /// Deletes fence `id`: its pairs and their timers are dropped on every shard.
    pub async fn delete(&self, id: &str) -> Result<(), FenceWriteError> {
        let _guard = self.write.lock().await;
        if !self.read().contains_key(id) {
            return Err(FenceWriteError::NotFound(id.to_string()));
        }
        self.persist(Step {
            fences_del: vec![id.to_string()],
            ..Step::default()
        })
        .await?;
        self.read
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.shards
            .remove_fence(Arc::from(id))
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        metrics::gauge!(t::FENCES).set(self.len() as f64);
        Ok(())
    }

    /// Persists the fences the registry was built with (a preload seeding an empty store): the
    /// shards and the read copy already hold them.
    pub async fn persist_all(&self) -> Result<(), FenceWriteError> {
        let _guard = self.write.lock().await;
        let fences: Vec<Stored> = self.read().values().cloned().collect();
        if fences.is_empty() {
            return Ok(());
        }
        self.persist(put_step(&fences)).await
    }

    /// Makes a fence change durable before it is applied or acknowledged.
    async fn persist(&self, mut step: Step) -> Result<(), FenceWriteError> {
        let (tx, rx) = oneshot::channel();
        step.ack = Some(tx);
        self.publisher
            .send(step)
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(PublishError::Store(msg))) => Err(FenceWriteError::Store(msg)),
            Ok(Err(PublishError::Closed)) | Err(_) => Err(FenceWriteError::ShuttingDown),
        }
    }
}

/// The publisher step that stores `fences` (as their normalized GeoJSON Feature text).
fn put_step(fences: &[Stored]) -> Step {
    Step {
        fences_put: fences
            .iter()
            .map(|s| (s.fence.id.to_string(), s.json.to_string()))
            .collect(),
        ..Step::default()
    }
}
