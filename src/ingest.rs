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
    let mut replies = Vec::new();
    for (k, permit) in permits {
        let (tx, rx) = oneshot::channel();
        permit.send(ShardMsg::Fixes {
            fixes: std::mem::take(&mut per_shard[k]),
            arrived,
            reply: tx,
        });
        replies.push(rx);
    }
    st.publish_event_watermark();
    for rx in replies {
        let outcomes = rx.await.map_err(|_| BatchError::ShuttingDown)?;
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
