//! The fence registry: the one place fences are written, and the API's read copy of them.
//!
//! A write (put or delete) runs the whole protocol, in this order, under one lock: validate
//! (against the configured limits), number the change and persist it in the input log (through
//! the publisher, like every other input, so a 2xx means the change is durable), update the read
//! copy, and send the change, with its number, to every shard, which logs where it applied it.
//!
//! Invariants: writes are serialized, so every shard receives fence changes in the same order
//! and all shards hold the same fences; the read copy equals what the shards hold once a write
//! has returned; a write that fails to persist changes nothing. A checkpoint round starts under
//! the same lock ([`FenceRegistry::checkpoint`]), so every shard freezes with the same fences.
//!
//! In a cluster the same methods write to the cluster's fence log instead
//! (`crate::cluster::fences`): a change is a message on one stream, and a marker in every
//! partition's input says where each partition applies it; the read copy ([`FenceMap`]) is kept
//! by the node's follower of that stream.

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;
use tokio::sync::oneshot;

use crate::events::publisher::{PublishError, Publisher, Step};
use crate::shard::Shards;
use crate::store::input::{FenceChange, encode_fence_change};
use geodwell_core::fences::{Fence, FenceErrors, FenceLimits, Rect, parse_fences};
use geodwell_core::time::Ts;

mod map;

pub use map::{FenceMap, Stored};

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
    /// A cluster node's write met another node's write first (retried internally; seen by
    /// callers only when seeding).
    #[error("another fence write came first")]
    Conflict,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Fences that did not exist before.
    pub created: usize,
    /// Fences that replaced one with the same id.
    pub replaced: usize,
}

/// What the write lock guards besides the order of writes.
#[derive(Debug, Default)]
struct Changes {
    /// The number the next fence change gets.
    next: u64,
    /// Fences changed since the last checkpoint, with the number of their latest change.
    since_checkpoint: BTreeMap<String, u64>,
}

/// Where fence writes go.
#[derive(Debug)]
enum Backend {
    /// One process: numbered, persisted through the publisher, sent to every shard.
    Local {
        write: tokio::sync::Mutex<Changes>,
        publisher: Publisher,
        shards: Shards,
    },
    /// A cluster node: the cluster's fence log.
    Cluster(Arc<dyn SharedFences>),
}

/// A fence check run against the fences a write follows: what the write will report, or why it
/// is refused.
pub type FenceCheck<'a> =
    Box<dyn Fn(&FenceMap) -> Result<Written, FenceWriteError> + Send + Sync + 'a>;

/// A fence log shared by the nodes of a cluster (implemented by `crate::cluster::fences`): the
/// seam a cluster node's registry writes through. Its follower keeps the registry's
/// [`FenceMap`].
pub trait SharedFences: Send + Sync + std::fmt::Debug {
    /// Writes `changes` as one change, all or nothing, once `check` passed against the fences
    /// as of the position the change follows; returns `check`'s answer once the change is
    /// durable, reaches every partition's input, and is in the read copy.
    fn write<'a>(
        &'a self,
        changes: Vec<FenceChange>,
        check: FenceCheck<'a>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Written, FenceWriteError>> + Send + 'a>>;
}

/// The fences of the service.
#[derive(Debug)]
pub struct FenceRegistry {
    map: Arc<FenceMap>,
    limits: FenceLimits,
    max_fences: usize,
    backend: Backend,
}

impl FenceRegistry {
    /// A registry holding `fences` (which the shards already hold), writing through `publisher`
    /// and to `shards`; its next change is number `next_change`, and `since_checkpoint` are the
    /// fences changed (with their latest change number) since the latest checkpoint.
    pub fn new(
        fences: &[Arc<Fence>],
        limits: FenceLimits,
        max_fences: usize,
        publisher: Publisher,
        shards: Shards,
        next_change: u64,
        since_checkpoint: Vec<(String, u64)>,
    ) -> FenceRegistry {
        FenceRegistry {
            map: Arc::new(FenceMap::new(fences)),
            limits,
            max_fences,
            backend: Backend::Local {
                write: tokio::sync::Mutex::new(Changes {
                    next: next_change.max(1),
                    since_checkpoint: since_checkpoint.into_iter().collect(),
                }),
                publisher,
                shards,
            },
        }
    }

    /// A cluster node's registry: `map` is kept by `log`'s follower, writes go to `log`.
    pub fn cluster(
        map: Arc<FenceMap>,
        limits: FenceLimits,
        max_fences: usize,
        log: Arc<dyn SharedFences>,
    ) -> FenceRegistry {
        FenceRegistry {
            map,
            limits,
            max_fences,
            backend: Backend::Cluster(log),
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
        let (write, publisher, shards) = match &self.backend {
            Backend::Cluster(log) => {
                let changes: Vec<FenceChange> = fences
                    .iter()
                    .map(|s| FenceChange::Put(s.json.clone()))
                    .collect();
                return log.write(changes, Box::new(check)).await;
            }
            Backend::Local {
                write,
                publisher,
                shards,
            } => (write, publisher, shards),
        };
        let mut changes = write.lock().await;
        let written = check(&self.map)?;
        let first = changes.next;
        let step = Step {
            fence_changes: fences
                .iter()
                .zip(first..)
                .map(|(s, n)| (n, encode(&FenceChange::Put(s.json.clone()))))
                .collect(),
            ..Step::default()
        };
        persist(publisher, step).await?;
        changes.next = first + fences.len() as u64;
        for (s, change) in fences.into_iter().zip(first..) {
            let f = s.fence.clone();
            changes.since_checkpoint.insert(f.id.to_string(), change);
            self.map.insert(s);
            shards
                .upsert_fence(f, change)
                .await
                .map_err(|_| FenceWriteError::ShuttingDown)?;
        }
        Ok(written)
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
        let (write, publisher, shards) = match &self.backend {
            Backend::Cluster(log) => {
                return log
                    .write(vec![FenceChange::Delete(id.to_string())], Box::new(check))
                    .await
                    .map(drop);
            }
            Backend::Local {
                write,
                publisher,
                shards,
            } => (write, publisher, shards),
        };
        let mut changes = write.lock().await;
        check(&self.map)?;
        let change = changes.next;
        persist(
            publisher,
            Step {
                fence_changes: vec![(change, encode(&FenceChange::Delete(id.to_string())))],
                ..Step::default()
            },
        )
        .await?;
        changes.next = change + 1;
        changes.since_checkpoint.insert(id.to_string(), change);
        self.map.remove(id);
        shards
            .remove_fence(Arc::from(id), change)
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        Ok(())
    }

    /// The parts of a one-process registry (none in a cluster).
    fn local(&self) -> Option<(&tokio::sync::Mutex<Changes>, &Publisher, &Shards)> {
        match &self.backend {
            Backend::Local {
                write,
                publisher,
                shards,
            } => Some((write, publisher, shards)),
            Backend::Cluster(_) => None,
        }
    }

    /// Sends fence changes a shard missed to shard `k`: after a crash, a change whose record was
    /// durable may not have reached every shard's log. `from` is the first change the shard
    /// lacks. The changes go out as the current fences (a fence changed twice is sent once, as it
    /// is now), in change order. (One process only.)
    pub async fn catch_up_shard(&self, k: usize, from: u64) -> Result<(), FenceWriteError> {
        let Some((write, _, shards)) = self.local() else {
            return Ok(());
        };
        let changes = write.lock().await;
        let mut missed: Vec<(u64, &String)> = changes
            .since_checkpoint
            .iter()
            .filter(|(_, n)| **n >= from)
            .map(|(id, n)| (*n, id))
            .collect();
        missed.sort();
        for (change, id) in missed {
            let current = self.get(id);
            shards
                .fence_to(k, current.map(|s| s.fence), id, change)
                .await
                .map_err(|_| FenceWriteError::ShuttingDown)?;
        }
        Ok(())
    }

    /// Starts checkpoint `round` (see `crate::checkpoint`): under the write lock, so that no
    /// fence change is in flight, the writer is sent the fences changed since the last
    /// checkpoint, then every shard is asked to freeze after what is queued on it.
    /// With `full`, every device is written (the previous round failed). Returns the last fence
    /// change the checkpoint covers. (One process only: a cluster checkpoints per partition.)
    pub async fn checkpoint(
        &self,
        round: u64,
        writer: &crate::checkpoint::Checkpointer,
        full: bool,
    ) -> Result<u64, FenceWriteError> {
        let Some((write, publisher, shards)) = self.local() else {
            return Err(FenceWriteError::ShuttingDown);
        };
        let changes = write.lock().await;
        let fences = changes
            .since_checkpoint
            .keys()
            .map(|id| (id.clone(), self.get(id).map(|s| s.json.to_string())))
            .collect();
        writer
            .tx
            .send(crate::checkpoint::CkMsg::Round {
                round,
                shards: shards.len(),
                fences,
                fence_change: changes.next - 1,
                event_floor: publisher.durable().next_seq(),
            })
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        shards
            .checkpoint(round, full)
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        Ok(changes.next - 1)
    }

    /// A checkpoint covering fence changes up to `fence_change` has committed: those changes
    /// need not be written again.
    pub async fn checkpointed(&self, fence_change: u64) {
        if let Some((write, _, _)) = self.local() {
            write
                .lock()
                .await
                .since_checkpoint
                .retain(|_, n| *n > fence_change);
        }
    }
}

/// Makes a fence change durable before it is applied or acknowledged.
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

async fn persist(publisher: &Publisher, mut step: Step) -> Result<(), FenceWriteError> {
    let (tx, rx) = oneshot::channel();
    step.ack = Some(tx);
    publisher
        .send(step)
        .await
        .map_err(|_| FenceWriteError::ShuttingDown)?;
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(PublishError::Store(msg))) => Err(FenceWriteError::Store(msg)),
        Ok(Err(PublishError::Closed)) | Err(_) => Err(FenceWriteError::ShuttingDown),
    }
}

/// A fence change as the input log holds it.
fn encode(c: &FenceChange) -> Vec<u8> {
    let mut out = Vec::new();
    encode_fence_change(c, &mut out);
    out
}
