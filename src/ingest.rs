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
use crate::events::publisher::PublishError;
use crate::shard::{ShardMsg, StampedFix};
use crate::state::AppState;
use crate::telemetry as t;
use geodwell_core::engine::{IngestError, Ingested};
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

/// One rejected item.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ItemError {
    /// Position of the item in the request (line for NDJSON, element for arrays, 0 for one object).
    pub index: usize,
    /// Machine-readable reason.
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

/// The answer to a batch of fixes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
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
pub fn parse_fix(
    item: &RawItem,
    st: &AppState,
    wall_now: Ts,
) -> Result<Fix, (&'static str, String)> {
    let v = match item {
        RawItem::Fast(f) => {
            let ts = match &f.ts {
                FastTs::Ms(ms) => {
                    Ts::from_millis(*ms).map_err(|e| ("invalid_ts", e.to_string()))?
                }
                FastTs::Text(s) => {
                    Ts::parse_rfc3339(s).map_err(|e| ("invalid_ts", e.to_string()))?
                }
            };
            return finish_fix(&f.device, ts, f.lat, f.lon, f.accuracy, st, wall_now);
        }
        RawItem::Json(v) => v,
    };
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
        Some(Value::Number(n)) => match integral(n) {
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
    finish_fix(device, ts, lat, lon, accuracy, st, wall_now)
}

/// The checks shared by both parse paths: the future bound and [`Fix::new`]'s validation.
fn finish_fix(
    device: &str,
    ts: Ts,
    lat: f64,
    lon: f64,
    accuracy: Option<f64>,
    st: &AppState,
    wall_now: Ts,
) -> Result<Fix, (&'static str, String)> {
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

/// How a JSON value is named in error messages ("a string", "an object", ...).
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One item of a batch as read from the wire, or why it could not be read (code, message).
pub type Item = Result<RawItem, (&'static str, String)>;

/// A batch item before validation.
#[derive(Debug, Clone, PartialEq)]
pub enum RawItem {
    /// The common shape, read straight into fields (no `Value` tree: about 10 allocations less
    /// per fix, which made JSON handling the largest cost of ingest).
    Fast(FastFix),
    /// Anything else, kept as JSON so that validation can say exactly what is wrong.
    Json(Value),
}

/// A fix object whose fields all have the expected JSON types. Unknown fields (`attrs`,
/// extensions) are skipped, as the `Value` path ignores them.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct FastFix {
    device: String,
    ts: FastTs,
    lat: f64,
    lon: f64,
    #[serde(default)]
    accuracy: Option<f64>,
    #[serde(default)]
    speed: Option<f64>,
    #[serde(default)]
    heading: Option<f64>,
}

/// `ts` as Unix milliseconds (an integer) or text.
#[derive(Debug, Clone, PartialEq)]
enum FastTs {
    Ms(i64),
    Text(String),
}

impl<'de> serde::Deserialize<'de> for FastTs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FastTs, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = FastTs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("integer milliseconds or an RFC 3339 string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<FastTs, E> {
                Ok(FastTs::Ms(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FastTs, E> {
                i64::try_from(v)
                    .map(FastTs::Ms)
                    .map_err(|_| E::custom("ts out of range"))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<FastTs, E> {
                integral_f64(v)
                    .map(FastTs::Ms)
                    .ok_or_else(|| E::custom("ts is not an integer"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FastTs, E> {
                Ok(FastTs::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON number as an integer, if it is one. JSON (and JSON Schema's `integer`) does not tell
/// `5` from `5.0`, so an integral float is taken too, while it is exact (|x| <= 2^53).
pub fn integral(n: &serde_json::Number) -> Option<i64> {
    n.as_i64().or_else(|| n.as_f64().and_then(integral_f64))
}

fn integral_f64(f: f64) -> Option<i64> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    (f.fract() == 0.0 && f.abs() <= EXACT).then_some(f as i64)
}

/// Reads one JSON text as a batch item: the fast typed path when the text has the common
/// shape, else a `Value` (validation then explains what is wrong), else a `malformed_json` error
/// (`what` names the unit in the message, e.g. "line").
pub fn read_item(text: &str, what: &str) -> Item {
    if let Ok(f) = serde_json::from_str::<FastFix>(text) {
        return Ok(RawItem::Fast(f));
    }
    serde_json::from_str::<Value>(text)
        .map(RawItem::Json)
        .map_err(|e| ("malformed_json", format!("{what} is not JSON: {e}")))
}

/// Reads a JSON array of fixes, element by element through [`read_item`]. `None` when the
/// text is not an array, or an element is not a JSON value serde_json can hold (e.g. `1e999`):
/// the caller then parses the whole body as before and reports it as one error, so a JSON
/// body is taken whole or not at all.
pub fn read_array(text: &str) -> Option<Vec<Item>> {
    let raw: Vec<&serde_json::value::RawValue> = serde_json::from_str(text).ok()?;
    let items: Vec<Item> = raw.iter().map(|r| read_item(r.get(), "item")).collect();
    items.iter().all(|i| i.is_ok()).then_some(items)
}

/// Why a JSON text is not a batch.
#[derive(Debug)]
pub enum BatchShapeError {
    /// Not JSON serde_json can read (syntax, or a number such as `1e999`).
    NotJson(serde_json::Error),
    /// JSON, but neither an object nor an array; names what it is ("a number", ...).
    NotFixOrArray(&'static str),
}

/// Reads a JSON body or frame as a batch: an array of fixes (each element through
/// [`read_item`]) or one fix object. Shared by `POST /v1/fixes` and WebSocket ingest, which
/// only word their errors differently. The common shapes are read once, typed.
pub fn read_batch(text: &str) -> Result<Vec<Item>, BatchShapeError> {
    if let Some(items) = read_array(text) {
        return Ok(items);
    }
    if let Ok(f) = serde_json::from_str::<FastFix>(text) {
        return Ok(vec![Ok(RawItem::Fast(f))]);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => Ok(items.into_iter().map(|v| Ok(RawItem::Json(v))).collect()),
        Ok(v @ Value::Object(_)) => Ok(vec![Ok(RawItem::Json(v))]),
        Ok(other) => Err(BatchShapeError::NotFixOrArray(kind_of(&other))),
        Err(e) => Err(BatchShapeError::NotJson(e)),
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
    items: Vec<Item>,
) -> Result<IngestReport, BatchError> {
    dispatch(st, transport, items)?.wait().await
}

/// One shard's answer to its part of a batch: per item index, the outcome (once committed).
type ShardReply =
    oneshot::Receiver<Result<Vec<(usize, Result<Ingested, IngestError>)>, PublishError>>;

/// A batch handed to its shards, waiting for their (committed) outcomes.
#[derive(Debug)]
pub struct Pending {
    report: IngestReport,
    replies: Vec<ShardReply>,
}

/// The synchronous half of [`submit`]: validates, stamps and sends the batch to its shards, all
/// or nothing. Batches dispatched one after another reach every shard in that order, so a
/// connection may dispatch its next batch before the previous one's answer (pipelining) without
/// reordering anything.
pub fn dispatch(
    st: &AppState,
    transport: &'static str,
    items: Vec<Item>,
) -> Result<Pending, BatchError> {
    let arrived = Instant::now();
    counter!(t::FIXES_RECEIVED, "transport" => transport).increment(items.len() as u64);
    let wall_now = st.wall.now();
    let mut report = IngestReport::default();
    let shards = st.shards.len();
    let mut per_shard: Vec<Vec<StampedFix>> = vec![Vec::new(); shards];
    let mut max_w: Option<Ts> = None;
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
                max_w = max_w.max(Some(w));
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
    st.publish_event_watermark(max_w);
    Ok(Pending { report, replies })
}

impl Pending {
    /// Waits for every shard's outcome and builds the batch's report.
    pub async fn wait(self) -> Result<IngestReport, BatchError> {
        let Pending {
            mut report,
            replies,
        } = self;
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
                    Err(e) => {
                        counter!(t::FIXES_REJECTED, "reason" => e.code()).increment(1);
                        report.errors.push(ItemError {
                            index,
                            code: e.code(),
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
    use crate::events::EventLog;
    use crate::shard::WallClock;
    use geodwell_core::time::Dur;

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
            auth: crate::auth::Keys::new(cfg.api_keys.clone()),
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
            webhooks: crate::webhooks::Webhooks::inert(log.clone()),
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
            .map(|i| {
                Ok(RawItem::Json(
                    json!({"device": format!("d{i}"), "ts": 1000 + i, "lat": 1.0, "lon": 1.0}),
                ))
            })
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
            let slow = parse_fix(&RawItem::Json(v.clone()), &st, wall).unwrap_err();
            assert_eq!(slow.0, code, "{v}");
            // The wire path (typed when the shape allows) gives the same error, word for word.
            let item = read_item(&v.to_string(), "line").unwrap();
            assert_eq!(parse_fix(&item, &st, wall).unwrap_err(), slow, "{v}");
        }
        let ok = json!({"device": "d", "lat": 1.0, "lon": 1.0, "ts": "2026-01-01T00:00:00+01:00", "accuracy": 5, "speed": 3.2, "heading": 90, "attrs": {"x": 1}});
        assert!(parse_fix(&RawItem::Json(ok.clone()), &st, wall).is_ok());
        let fast = read_item(&ok.to_string(), "line").unwrap();
        assert!(
            matches!(fast, RawItem::Fast(_)),
            "the common shape takes the typed path"
        );
        assert_eq!(
            parse_fix(&fast, &st, wall).unwrap(),
            parse_fix(&RawItem::Json(ok), &st, wall).unwrap()
        );
    }

    use proptest::prelude::*;

    proptest::proptest! {
        /// Both parse paths agree on every fix-like object: same fix, or same error.
        #[test]
        fn typed_and_value_paths_agree(
            device in proptest::option::of(proptest::prop_oneof![
                proptest::string::string_regex("[a-z\\\\\"é]{0,6}").unwrap().prop_map(serde_json::Value::String),
                proptest::num::i64::ANY.prop_map(|n| json!(n)),
            ]),
            ts in proptest::option::of(proptest::prop_oneof![
                (-10i64..2_000_000_000_000).prop_map(|n| json!(n)),
                proptest::num::f64::NORMAL.prop_map(|n| json!(n)),
                proptest::sample::select(vec!["2026-01-01T00:00:00Z", "x", ""]).prop_map(|s| json!(s)),
                proptest::num::u64::ANY.prop_map(|n| json!(n)),
            ]),
            lat in proptest::option::of(proptest::prop_oneof![(-100.0f64..100.0).prop_map(|n| json!(n)), (-100i64..100).prop_map(|n| json!(n)), proptest::strategy::Just(json!(null)), proptest::strategy::Just(json!("1"))]),
            lon in proptest::option::of((-200.0f64..200.0).prop_map(|n| json!(n))),
            accuracy in proptest::option::of(proptest::prop_oneof![(-5.0f64..100.0).prop_map(|n| json!(n)), proptest::strategy::Just(json!(null)), proptest::strategy::Just(json!(true))]),
            extra in proptest::bool::ANY,
        ) {
            let mut m = serde_json::Map::new();
            for (k, v) in [("device", device), ("ts", ts), ("lat", lat), ("lon", lon), ("accuracy", accuracy)] {
                if let Some(v) = v {
                    m.insert(k.to_string(), v);
                }
            }
            if extra {
                m.insert("attrs".into(), json!({"a": [1, 2]}));
            }
            let v = serde_json::Value::Object(m);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let _guard = rt.enter();
            let (st, _rx) = state(1);
            let wall = st.wall.now();
            // Both read the same text (serde_json's float parsing is not a bit-exact round trip
            // of an in-memory f64, so the reference is parsed from the text too).
            let text = v.to_string();
            let reparsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            let slow = parse_fix(&RawItem::Json(reparsed), &st, wall);
            let item = read_item(&text, "line").unwrap();
            let fast = parse_fix(&item, &st, wall);
            prop_assert_eq!(fast, slow);
        }
    }
}
