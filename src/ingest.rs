//! Ingest shared by every transport: parse fix items, validate, stamp with the watermark, route
//! to shards by device hash, and gather one outcome per item.
//!
//! Invariants: a device always maps to the same shard (`xxh3(device) % shards`); each fix is
//! stamped with the watermark at its arrival, in request order; nothing is sent to any shard
//! unless every shard the batch needs has queue room (so a 503 never means "partly applied");
//! every item gets exactly one outcome: accepted, late, duplicate, or an error with its index.

use std::time::Instant;

use metrics::counter;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::config::ClockMode;
use crate::core::engine::{IngestError, Ingested};
use crate::core::fix::Fix;
use crate::core::time::Ts;
use crate::events::publisher::PublishError;
use crate::shard::{ShardMsg, StampedFix};
use crate::state::AppState;
use crate::telemetry as t;

/// One rejected item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemError {
    /// Position of the item in the request (line for NDJSON, element for arrays, 0 for one object).
    pub index: usize,
    /// Machine-readable reason.
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

/// The answer to a batch of fixes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IngestReport {
    /// Fixes buffered or applied.
    pub accepted: usize,
    /// Fixes older than the watermark or than their device's last fix.
    pub late: usize,
    /// Fixes with the timestamp of one already held for their device.
    pub duplicate: usize,
    /// Items rejected (see `errors`).
    pub rejected: usize,
    /// One entry per rejected item, in index order.
    pub errors: Vec<ItemError>,
}

/// Why a whole batch could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// A shard queue is full: retry later.
    Overloaded,
    /// The service is shutting down.
    ShuttingDown,
    /// The state store cannot commit: nothing of this batch is acknowledged; retry later.
    StoreUnavailable(String),
}

/// Parses one JSON item into a validated fix.
pub fn parse_fix(v: &Value, st: &AppState, wall_now: Ts) -> Result<Fix, (&'static str, String)> {
    let obj = v.as_object().ok_or((
        "invalid_fix",
        format!("a fix must be a JSON object, got {}", kind_of(v)),
    ))?;
    let device = match obj.get("device") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err((
                "invalid_fix",
                format!("device must be a string, got {}", kind_of(other)),
            ));
        }
        None => return Err(("missing_field", "device is required".into())),
    };
    let num = |k: &str, required: bool| -> Result<Option<f64>, (&'static str, String)> {
        match obj.get(k) {
            Some(Value::Number(n)) => n
                .as_f64()
                .map(Some)
                .ok_or(("invalid_fix", format!("{k} is not a finite number"))),
            Some(Value::Null) | None if !required => Ok(None),
            None => Err(("missing_field", format!("{k} is required"))),
            Some(other) => Err((
                "invalid_fix",
                format!("{k} must be a number, got {}", kind_of(other)),
            )),
        }
    };
    let lat = num("lat", true)?.unwrap_or(f64::NAN);
    let lon = num("lon", true)?.unwrap_or(f64::NAN);
    let accuracy = num("accuracy", false)?;
    num("speed", false)?;
    num("heading", false)?;
    let ts = match obj.get("ts") {
        None => {
            return Err((
                "missing_field",
                "ts is required (RFC 3339 or Unix milliseconds)".into(),
            ));
        }
        Some(Value::Number(n)) => match n.as_i64() {
            Some(ms) => Ts::from_millis(ms).map_err(|e| ("invalid_ts", e.to_string()))?,
            None => {
                return Err((
                    "invalid_ts",
                    format!("ts must be integer Unix milliseconds, got {n}"),
                ));
            }
        },
        Some(Value::String(s)) => {
            Ts::parse_rfc3339(s).map_err(|e| ("invalid_ts", e.to_string()))?
        }
        Some(other) => {
            return Err((
                "invalid_ts",
                format!(
                    "ts must be an RFC 3339 string or Unix milliseconds, got {}",
                    kind_of(other)
                ),
            ));
        }
    };
    if st.cfg.clock == ClockMode::Live && ts > wall_now.plus(st.cfg.max_future) {
        return Err((
            "future_ts",
            format!(
                "ts {ts} is more than {} ahead of the server clock ({wall_now})",
                st.cfg.max_future
            ),
        ));
    }
    Fix::new(device, ts, lat, lon, accuracy, st.cfg.max_device_len)
        .map_err(|e| ("invalid_fix", e.to_string()))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The shard a device belongs to.
pub fn shard_of(device: &str, shards: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(device.as_bytes()) % shards.max(1) as u64) as usize
}

/// Validates, stamps and applies a batch of already-parsed JSON items (or per-item parse errors).
pub async fn submit(
    st: &AppState,
    transport: &'static str,
    items: Vec<Result<Value, (&'static str, String)>>,
) -> Result<IngestReport, BatchError> {
    let arrived = Instant::now();
    counter!(t::FIXES_RECEIVED, "transport" => transport).increment(items.len() as u64);
    let wall_now = st.wall.now();
    let mut report = IngestReport::default();
    let shards = st.shards.len();
    let mut per_shard: Vec<Vec<StampedFix>> = vec![Vec::new(); shards];
    for (index, item) in items.into_iter().enumerate() {
        let fix = item.and_then(|v| parse_fix(&v, st, wall_now));
        match fix {
            Err((code, message)) => {
                counter!(t::FIXES_REJECTED, "reason" => code).increment(1);
                report.errors.push(ItemError {
                    index,
                    code,
                    message,
                });
            }
            Ok(fix) => {
                let w = match st.cfg.clock {
                    ClockMode::Live => wall_now.minus(st.cfg.lateness),
                    ClockMode::Event => st.observe_event_ts(fix.ts),
                };
                per_shard[shard_of(&fix.device, shards)].push(StampedFix { index, fix, w });
            }
        }
    }
    // Reserve room on every shard needed before sending anything.
    let mut permits = Vec::new();
    for (k, fixes) in per_shard.iter().enumerate() {
        if fixes.is_empty() {
            continue;
        }
        match st.shards[k].try_reserve() {
            Ok(p) => permits.push((k, p)),
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                counter!(t::FIXES_REJECTED, "reason" => "overloaded").increment(1);
                return Err(BatchError::Overloaded);
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                return Err(BatchError::ShuttingDown);
            }
        }
    }
    static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let request = (
        REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        permits.len() as u32,
    );
    let mut replies = Vec::new();
    for (k, permit) in permits {
        let (tx, rx) = oneshot::channel();
        permit.send(ShardMsg::Fixes {
            fixes: std::mem::take(&mut per_shard[k]),
            arrived,
            reply: tx,
            request,
        });
        replies.push(rx);
    }
    st.publish_event_watermark();
    for rx in replies {
        let outcomes = match rx.await {
            Ok(Ok(outcomes)) => outcomes,
            Ok(Err(PublishError::Store(msg))) => return Err(BatchError::StoreUnavailable(msg)),
            Ok(Err(PublishError::Closed)) | Err(_) => return Err(BatchError::ShuttingDown),
        };
        for (index, o) in outcomes {
            match o {
                Ok(Ingested::Accepted) => report.accepted += 1,
                Ok(Ingested::Late) => {
                    counter!(t::FIXES_LATE).increment(1);
                    report.late += 1
                }
                Ok(Ingested::Duplicate) => {
                    counter!(t::FIXES_DUPLICATE).increment(1);
                    report.duplicate += 1
                }
                Err(e @ IngestError::BufferFull { .. }) => {
                    counter!(t::FIXES_REJECTED, "reason" => "buffer_full").increment(1);
                    report.errors.push(ItemError {
                        index,
                        code: "buffer_full",
                        message: e.to_string(),
                    });
                }
            }
        }
    }
    report.errors.sort_by_key(|e| e.index);
    report.rejected = report.errors.len();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicI64;

    use serde_json::json;
    use tokio::sync::{mpsc, watch};
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::config::Config;
    use crate::core::time::Dur;
    use crate::events::EventLog;
    use crate::shard::WallClock;

    fn state(queue: usize) -> (AppState, Vec<mpsc::Receiver<ShardMsg>>) {
        let cfg = Config::load(
            Some((
                "t",
                "[time]\nclock = \"event\"\n[fences]\nfences_file = \"\"\n",
            )),
            &BTreeMap::new(),
            2,
        )
        .unwrap();
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::channel(queue)).unzip();
        let log = Arc::new(EventLog::new(10, Dur::from_secs(60), 1));
        let max_seen = Arc::new(AtomicI64::new(i64::MIN));
        let (publisher, _task) = crate::events::publisher::spawn(
            crate::events::publisher::PublisherCfg {
                store: None,
                commit_interval: std::time::Duration::from_millis(100),
                log_capacity: 10,
                queue: 16,
            },
            log.clone(),
            WallClock::start(),
            max_seen.clone(),
        );
        let st = AppState {
            fence_limits: crate::fence_limits(&cfg),
            cfg,
            shards: senders,
            log: log.clone(),
            publisher,
            fences: Default::default(),
            fence_write: tokio::sync::Mutex::new(()),
            wall: WallClock::start(),
            max_seen,
            event_w: watch::channel(None).0,
            metrics: crate::telemetry::install(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        };
        (st, receivers)
    }

    use std::sync::Arc;

    #[tokio::test]
    async fn a_full_shard_queue_rejects_the_whole_batch_before_sending_anything() {
        let (st, mut rx) = state(1);
        // Fill shard queues: the shards are stalled (nobody reads the receivers).
        for s in &st.shards {
            s.try_send(ShardMsg::RemoveFence(Arc::from("x"))).unwrap();
        }
        let items = (0..20)
            .map(|i| Ok(json!({"device": format!("d{i}"), "ts": 1000 + i, "lat": 1.0, "lon": 1.0})))
            .collect();
        assert_eq!(
            submit(&st, "http", items).await,
            Err(BatchError::Overloaded)
        );
        // Nothing of the batch reached any shard: each queue still holds only the filler.
        for r in &mut rx {
            assert!(matches!(r.try_recv(), Ok(ShardMsg::RemoveFence(_))));
            assert!(r.try_recv().is_err());
        }
        // And the HTTP answer is 503 with Retry-After.
        let resp = axum::response::IntoResponse::into_response(crate::http::error::ApiError::from(
            BatchError::Overloaded,
        ));
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
    }

    #[tokio::test]
    async fn items_are_validated_with_their_index() {
        let (st, _rx) = state(8);
        let wall = st.wall.now();
        let bad = [
            (json!({"lat": 1.0, "lon": 1.0, "ts": 1}), "missing_field"),
            (
                json!({"device": "d", "lat": "1", "lon": 1.0, "ts": 1}),
                "invalid_fix",
            ),
            (
                json!({"device": "d", "lat": 91.0, "lon": 1.0, "ts": 1}),
                "invalid_fix",
            ),
            (
                json!({"device": "d", "lat": 1.0, "lon": 1.0}),
                "missing_field",
            ),
            (
                json!({"device": "d", "lat": 1.0, "lon": 1.0, "ts": "yesterday"}),
                "invalid_ts",
            ),
            (
                json!({"device": "d", "lat": 1.0, "lon": 1.0, "ts": -5}),
                "invalid_ts",
            ),
            (
                json!({"device": "d", "lat": 1.0, "lon": 1.0, "ts": 1.5}),
                "invalid_ts",
            ),
            (
                json!({"device": "", "lat": 1.0, "lon": 1.0, "ts": 1}),
                "invalid_fix",
            ),
            (json!([1]), "invalid_fix"),
        ];
        for (v, code) in bad {
            assert_eq!(parse_fix(&v, &st, wall).unwrap_err().0, code, "{v}");
        }
        let ok = json!({"device": "d", "lat": 1.0, "lon": 1.0, "ts": "2026-01-01T00:00:00+01:00", "accuracy": 5, "speed": 3.2, "heading": 90, "attrs": {"x": 1}});
        assert!(parse_fix(&ok, &st, wall).is_ok());
    }
}
