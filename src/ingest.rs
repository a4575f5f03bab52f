//! Ingest shared by every transport: validated fixes (or per-item errors) in, stamped with the
//! watermark, routed to the shards by device, one outcome per item out.
//!
//! Invariants: each fix is stamped with the watermark at its arrival, in request order, and only
//! once its batch has room on every shard it needs (a refused batch moves nothing, not even the
//! event-mode watermark); nothing is sent to any shard unless every shard the batch needs has
//! queue room (so a 503 never means "partly applied"); every item gets exactly one outcome:
//! accepted, late, duplicate, or an error with its index.

use std::sync::Arc;
use std::time::Instant;

use metrics::counter;
use serde::Serialize;

use crate::budget::{Exhausted, Reservation};
use crate::clock::Watermark;
use crate::events::publisher::PublishError;
use crate::shard::{PartReply, SendError, Shards, StampedFix};
use crate::telemetry as t;
use crate::wire::{
    BatchShapeError, FixLimits, Item, ItemCode, ItemError, LOCATED_ITEM_BYTES, Located, parse_fix,
};
use geodwell_core::engine::Ingested;
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

/// One rejected item of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RejectedItem {
    /// Position of the item in the request (line for NDJSON, element for arrays, 0 for one object).
    pub index: usize,
    /// Machine-readable reason.
    pub code: ItemCode,
    /// What was wrong.
    pub message: String,
}

/// One late item of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LateItem {
    /// Position of the item in the request.
    pub index: usize,
    /// Why it is late: `too_old` (more than `time.max_delay` behind the watermark) or
    /// `behind_device` (at or before its device's frontier: something decided for the device
    /// since would be contradicted).
    #[schema(value_type = String, example = "behind_device")]
    pub reason: &'static str,
}

/// The answer to a batch of fixes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct IngestReport {
    /// Fixes buffered or applied.
    pub accepted: usize,
    /// Fixes not applied because they came too late (`late_items` says why, per item).
    pub late: usize,
    /// One entry per late item, in index order; absent when none is late.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(nullable = false)]
    pub late_items: Vec<LateItem>,
    /// Fixes with the timestamp of one already held for their device.
    pub duplicate: usize,
    /// Items rejected (see `errors`).
    pub rejected: usize,
    /// One entry per rejected item, in index order.
    pub errors: Vec<RejectedItem>,
}

/// Why an explicit watermark advance was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
    /// `time.clock = "live"`: the watermark follows the wall clock.
    #[error(
        "the watermark follows the wall clock (time.clock = \"live\"); only an event clock is advanced by hand"
    )]
    LiveClock,
    /// The requested time is behind the current watermark.
    #[error("{to} is behind the current watermark {current}; the watermark never moves back")]
    Behind {
        /// The requested watermark.
        to: Ts,
        /// The current one.
        current: Ts,
    },
    /// The shards (or the cluster) did not take it.
    #[error(transparent)]
    Query(#[from] crate::shard::QueryError),
}

/// Budget bytes each item of a batch holds from the moment it is read until the batch is
/// answered, besides the heap of [`heap_bytes`]: its read form, its stamped copy on its way to
/// its shard, its place in the located list, and the fixed part of its journal record (a tag,
/// two zigzag times, two coordinates and an accuracy: at most 46 bytes).
pub const ITEM_HOLD_BYTES: usize = std::mem::size_of::<Result<Fix, ItemError>>()
    + std::mem::size_of::<StampedFix>()
    + LOCATED_ITEM_BYTES
    + 46;

/// The heap a read batch holds beyond [`ITEM_HOLD_BYTES`] per item: each device id in its journal
/// record, ids too long to be held inline (over 24 bytes) once more, and error messages.
pub fn heap_bytes(items: &[Result<Fix, ItemError>]) -> usize {
    items
        .iter()
        .map(|i| match i {
            Ok(f) => {
                f.device.len()
                    + if f.device.len() > 24 {
                        f.device.len()
                    } else {
                        0
                    }
            }
            Err(e) => e.to_string().len(),
        })
        .sum()
}

/// What a reader charges for the items of a batch beyond [`ITEM_HOLD_BYTES`], and the most its
/// hold may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// Bytes per item the caller keeps besides (a copy of the batch, say).
    pub extra_per_item: usize,
    /// The most the hold may reach (capped at the whole budget).
    pub ceiling: usize,
}

impl Charge {
    /// A request's: nothing extra, up to the whole budget.
    pub const REQUEST: Charge = Charge {
        extra_per_item: 0,
        ceiling: usize::MAX,
    };
}

/// Why a located batch was not read.
#[derive(Debug)]
pub enum ReadError {
    /// The text is not a batch.
    Shape(BatchShapeError),
    /// The memory budget has no room for its items now.
    Budget(Exhausted),
    /// Its items hold more than the budget could ever give it: it can never be taken.
    NeverFits {
        /// Bytes they would hold.
        need: usize,
        /// The most it could hold (the whole budget, or the caller's ceiling).
        total: usize,
    },
}

/// Why a whole batch could not be taken.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// A shard queue is full: retry later.
    #[error("the service is overloaded: a partition's queue is full")]
    Overloaded,
    /// The service is shutting down.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The durable log cannot take it: nothing of this batch is acknowledged; retry later.
    #[error(transparent)]
    StoreUnavailable(crate::events::publisher::LogError),
}

/// Validation, stamping and routing of fixes (one per service; shared by every transport).
#[derive(Debug)]
pub struct Ingest {
    limits: FixLimits,
    watermark: Arc<Watermark>,
    shards: Shards,
}

/// A batch handed to its shards, waiting for their (committed) outcomes.
#[derive(Debug)]
pub struct Dispatched {
    report: IngestReport,
    replies: Vec<PartReply>,
}

impl Ingest {
    /// Ingest validating against `limits`, stamping with `watermark`, routing to `shards`.
    pub fn new(limits: FixLimits, watermark: Arc<Watermark>, shards: Shards) -> Ingest {
        let reasons: Vec<&'static str> = ItemCode::ALL.iter().map(|c| c.as_str()).collect();
        t::export_zero_series(&reasons);
        Ingest {
            limits,
            watermark,
            shards,
        }
    }

    /// What fixes are validated against.
    pub fn limits(&self) -> &FixLimits {
        &self.limits
    }

    /// The wall-clock time fixes arriving now are judged at.
    pub fn now(&self) -> Ts {
        self.watermark.wall().now()
    }

    /// event mode: moves the watermark to `to` by hand (the end of a backfill, so that the
    /// deadlines after the last fix fire). Like any input it is durable before the answer: the
    /// fix time it stands for (`to + lateness`) is committed with the shards' steps, so a
    /// restart resumes from it, and the events it fires are committed before they are
    /// published. Returns the watermark before.
    pub async fn advance_watermark(&self, to: Ts) -> Result<Option<Ts>, AdvanceError> {
        if self.watermark.mode() != crate::config::ClockMode::Event {
            return Err(AdvanceError::LiveClock);
        }
        let before = self
            .watermark
            .advance_to(to)
            .map_err(|current| AdvanceError::Behind { to, current })?;
        self.shards
            .advance(to, to.plus(self.watermark.lateness()))
            .await?;
        Ok(before)
    }

    /// Reads and validates a located batch within the memory budget: [`ITEM_HOLD_BYTES`] per
    /// item (plus `charge.extra_per_item`, for a caller that keeps more of each) are added to
    /// `hold` before anything is read (refused at once when they do not fit), then the heap the
    /// items hold ([`heap_bytes`]). A batch that would take `hold` over `charge.ceiling` bytes
    /// (at most the whole budget) can never be taken. The caller gives back what its text held
    /// once it drops the text.
    pub fn read_within(
        &self,
        located: Located<'_>,
        hold: &mut Reservation,
        charge: Charge,
    ) -> Result<Vec<Result<Fix, ItemError>>, ReadError> {
        let per_item = ITEM_HOLD_BYTES + charge.extra_per_item;
        let need = located.len().saturating_mul(per_item);
        let ceiling = charge.ceiling;
        let ceiling = ceiling.min(hold.budget_total());
        if need.saturating_add(hold.bytes()) > ceiling {
            return Err(ReadError::NeverFits {
                need,
                total: ceiling,
            });
        }
        hold.grow(need).map_err(ReadError::Budget)?;
        let items = located
            .read(&self.limits, self.now())
            .map_err(ReadError::Shape)?;
        hold.grow(heap_bytes(&items)).map_err(ReadError::Budget)?;
        Ok(items)
    }

    /// Parses and validates wire items (the JSON transports).
    pub fn parse(&self, items: Vec<Item>) -> Vec<Result<Fix, ItemError>> {
        let now = self.now();
        items
            .into_iter()
            .map(|item| item.and_then(|raw| parse_fix(&raw, &self.limits, now)))
            .collect()
    }

    /// Validates, stamps and applies a batch; answers once its effects are durable.
    pub async fn submit(
        &self,
        transport: &'static str,
        fixes: Vec<Result<Fix, ItemError>>,
    ) -> Result<IngestReport, BatchError> {
        self.dispatch(transport, fixes)?.wait().await
    }

    /// The synchronous half of [`Ingest::submit`]: stamps the batch and sends it to its shards,
    /// all or nothing. Batches dispatched one after another reach every shard in that order, so
    /// a connection may dispatch its next batch before the previous one's answer (pipelining)
    /// without reordering anything.
    pub fn dispatch(
        &self,
        transport: &'static str,
        fixes: Vec<Result<Fix, ItemError>>,
    ) -> Result<Dispatched, BatchError> {
        let arrived = Instant::now();
        counter!(t::FIXES_RECEIVED, "transport" => transport).increment(fixes.len() as u64);
        let mut report = IngestReport::default();
        let mut parts: Vec<Vec<StampedFix>> = vec![Vec::new(); self.shards.len()];
        // Where each valid fix went, in request order: stamps follow the order of arrival.
        let mut order: Vec<(usize, usize)> = Vec::new();
        for (index, fix) in fixes.into_iter().enumerate() {
            match fix {
                Err(e) => reject(&mut report, index, &e),
                Ok(fix) => {
                    let k = self.shards.of(&fix.device);
                    order.push((k, parts[k].len()));
                    parts[k].push(StampedFix {
                        index,
                        fix,
                        // Stamped below, once the batch is sure to be sent.
                        w: Ts(i64::MIN),
                    });
                }
            }
        }
        let wall_now = self.now();
        if self.watermark.mode() == crate::config::ClockMode::Live {
            for part in &parts {
                for f in part {
                    let delay = wall_now.since(f.fix.ts).millis().max(0);
                    metrics::histogram!(t::FIX_ARRIVAL_DELAY).record(delay as f64 / 1000.0);
                }
            }
        }
        let replies = self.shards.send_batch_with(parts, arrived, |parts| {
            let mut max_w = None;
            let mut stamper = self.watermark.stamper();
            for &(k, i) in &order {
                let s = &mut parts[k][i];
                s.w = stamper.stamp(s.fix.ts, wall_now);
                max_w = max_w.max(Some(s.w));
            }
            max_w
        });
        match replies {
            Ok((replies, max_w)) => {
                self.watermark.publish(max_w);
                Ok(Dispatched { report, replies })
            }
            Err(SendError::Full) => {
                counter!(t::FIXES_REJECTED, "reason" => "overloaded").increment(1);
                Err(BatchError::Overloaded)
            }
            Err(SendError::Closed) => Err(BatchError::ShuttingDown),
            Err(SendError::Unavailable(e)) => {
                counter!(t::FIXES_REJECTED, "reason" => "store_unavailable").increment(1);
                Err(BatchError::StoreUnavailable(e))
            }
        }
    }
}

/// Least time between two warnings about late fixes.
const LATE_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Logs at WARN that late fixes were dropped, at most once per [`LATE_WARN_EVERY`] (the counts
/// are in `geodwell_fixes_late_total{reason}`; the log says it is happening).
fn warn_late(report: &IngestReport) {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_some_and(|t| t.elapsed() < LATE_WARN_EVERY) {
        return;
    }
    *last = Some(Instant::now());
    let count = |r: &str| report.late_items.iter().filter(|i| i.reason == r).count();
    tracing::warn!(
        late = report.late,
        too_old = count("too_old"),
        behind_device = count("behind_device"),
        "late fixes dropped (not applied; see geodwell_fixes_late_total and GET /v1/devices/{{id}}); more are logged at most every 10 s"
    );
}

fn reject(report: &mut IngestReport, index: usize, e: &ItemError) {
    let code = e.code();
    counter!(t::FIXES_REJECTED, "reason" => code.as_str()).increment(1);
    report.errors.push(RejectedItem {
        index,
        code,
        message: e.to_string(),
    });
}

impl Dispatched {
    /// Waits for every shard's outcome and builds the batch's report.
    pub async fn wait(self) -> Result<IngestReport, BatchError> {
        let Dispatched {
            mut report,
            replies,
        } = self;
        for rx in replies {
            let outcomes = match rx.await {
                Ok(Ok(outcomes)) => outcomes,
                Ok(Err(PublishError::Store(e))) => return Err(BatchError::StoreUnavailable(e)),
                Ok(Err(PublishError::Closed)) | Err(_) => return Err(BatchError::ShuttingDown),
            };
            for (index, o) in outcomes {
                match o {
                    Ok(Ingested::Accepted) => report.accepted += 1,
                    Ok(Ingested::Late(reason)) => {
                        counter!(t::FIXES_LATE, "reason" => reason.as_str()).increment(1);
                        report.late += 1;
                        report.late_items.push(LateItem {
                            index,
                            reason: reason.as_str(),
                        });
                    }
                    Ok(Ingested::Duplicate) => {
                        counter!(t::FIXES_DUPLICATE).increment(1);
                        report.duplicate += 1
                    }
                    Err(e) => reject(&mut report, index, &ItemError::Engine(e)),
                }
            }
        }
        report.errors.sort_by_key(|e| e.index);
        report.late_items.sort_by_key(|e| e.index);
        report.rejected = report.errors.len();
        if report.late > 0 {
            warn_late(&report);
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_holds_what_the_docs_say() {
        // docs/security.md gives the figure; a change of the types changes it.
        assert_eq!(ITEM_HOLD_BYTES, 206);
    }
}
