//! Event reading: `GET /v1/events` (polling) and `GET /v1/events/ws` (subscription).
//!
//! A subscriber is a cursor into the shared event log, not a copy of it: it reads from the log in
//! chunks when the log's head moves, so its memory is one chunk whatever the event rate. Its
//! queue is the range between its cursor and the log head. Once it has caught up with the head,
//! a queue longer than `subscriber_queue` (or a send that stays blocked for
//! [`SEND_TIMEOUT`]) means it fell behind: it is sent `{"type":"lagged","resume_from":N}` and
//! closed. Replaying a backlog (`from_seq` in the past) is not falling behind: only retention
//! overtaking the cursor ends such a replay. Reconnecting with `from_seq=N` resumes without loss
//! while the log still holds `N`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Query, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use metrics::{counter, gauge};
use serde::Serialize;
use utoipa::ToSchema;

use crate::events::{Chunk, EventFilter, LogCursor};
use crate::http::auth::Refused;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::openapi::EventOut;
use crate::state::AppState;
use crate::telemetry as t;
use geodwell_core::event::EventKind;
use geodwell_core::time::Ts;

/// `GET /v1/events` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    /// Events with `seq >= from_seq`, oldest first.
    #[schema(value_type = Vec<EventOut>)]
    pub events: Vec<RawEvent>,
    /// Pass as `from_seq` to continue.
    pub next_seq: u64,
    /// Oldest seq the log still holds.
    pub first_seq: u64,
    /// The seq the next event will get.
    pub head_seq: u64,
    /// Whether events between `from_seq` and `first_seq` were dropped by retention.
    pub missed: bool,
    /// Whether the log holds events from `next_seq` on (`next_seq < head_seq`). A filtered page
    /// reads a bounded number of events, so it may hold fewer than `limit` matches, even none,
    /// while this is true: keep polling from `next_seq`.
    pub has_more: bool,
}

/// One event's JSON text as the event log rendered it (`LoggedEvent::json`), served as it is:
/// a poll of 10,000 events copies their text instead of parsing or rendering them again.
#[derive(Debug, Clone)]
pub struct RawEvent(pub Arc<str>);

impl Serialize for RawEvent {
    /// As raw JSON. `RawValue` has no constructor that skips checking the text, so this parses
    /// it. The answer to a poll is written without it, by [`EventsPage::to_json`] (same text; a
    /// test holds them to it): for a page of 10,000 events the check took about eight times as
    /// long as writing the whole answer (12 ms against 1.4 ms in a release build).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::value::RawValue::from_string(self.0.to_string())
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl EventsPage {
    /// The answer's text before its events.
    const HEAD: &'static str = "{\"events\":[";

    /// The answer's text after its events: the same fields, in the same order, as serializing
    /// the page gives.
    fn tail(next_seq: u64, first_seq: u64, head_seq: u64, missed: bool) -> String {
        let has_more = next_seq < head_seq;
        format!(
            "],\"next_seq\":{next_seq},\"first_seq\":{first_seq},\"head_seq\":{head_seq},\"missed\":{missed},\"has_more\":{has_more}}}"
        )
    }

    /// `serde_json::to_string(self)`, written the way [`poll`] streams it: the events' text is
    /// copied, not parsed.
    pub fn to_json(&self) -> String {
        let mut body = String::from(Self::HEAD);
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&e.0);
        }
        body.push_str(&Self::tail(
            self.next_seq,
            self.first_seq,
            self.head_seq,
            self.missed,
        ));
        body
    }
}

/// Events read from the log per piece of a streamed poll answer.
const POLL_PIECE: usize = 256;

/// The frames of `GET /v1/events/ws` that are not events. Not in the OpenAPI document, which
/// cannot describe WebSocket messages; `docs/semantics.md` section 4.6 does.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ControlFrame {
    /// First frame when `from_seq` is older than the log holds: events from `missing_from` up
    /// to `resume_from` are gone.
    Gap { missing_from: u64, resume_from: u64 },
    /// Last frame before closing a subscriber that fell behind.
    Lagged { resume_from: u64 },
}

impl ControlFrame {
    fn message(&self) -> Message {
        Message::Text(serde_json::to_string(self).unwrap_or_default().into())
    }
}

const CHUNK: usize = 512;

/// How long one send to a subscriber may block before it counts as fallen behind.
pub const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) fn parse_u64(q: &HashMap<String, String>, key: &str) -> Result<Option<u64>, ApiError> {
    q.get(key)
        .map(|v| {
            // Capped at i64::MAX: seqs never get there, and JSON clients with 64-bit signed
            // integers (the OpenAPI `int64` format) can hold every answer.
            v.parse::<u64>()
                .ok()
                .filter(|n| *n <= i64::MAX as u64)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "bad_query",
                        format!("{key} must be an integer in 0..={}, got {v:?}", i64::MAX),
                    )
                })
        })
        .transpose()
}

/// `GET /v1/events?from_seq=N&limit=M&types=..&device=..&fence=..&since=..&until=..`: events
/// with `seq >= N` (default: the oldest held) that pass the filter.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    description = "Events with seq >= from_seq (default: the oldest held), oldest first, optionally filtered as subscriptions are (types, fence glob, device) and by event time (`since` inclusive, `until` exclusive). A filtered page reads the log from from_seq until it holds `limit` matches, reaches the head, or has examined 20,000 events; `next_seq` is where it stopped reading, so paging with it never skips or repeats an event, and `has_more` says whether the log holds more from there (a page may be short or empty while it is true). Scope: read.",
    params(
        ("from_seq" = Option<u64>, Query, maximum = 9_223_372_036_854_775_807_i64, description = "First seq wanted"),
        ("limit" = Option<u64>, Query, minimum = 1, description = "Most events (default 1000, at most max_poll_limit)"),
        ("types" = Option<String>, Query, pattern = r"^ *(enter|exit|dwell) *(, *(enter|exit|dwell) *)*$", description = "Comma-separated kinds: enter, exit, dwell"),
        ("fence" = Option<String>, Query, pattern = r"[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]", max_length = 512, description = "Fence id glob (`*`, `?`), at most 512 bytes"),
        ("device" = Option<String>, Query, pattern = r"[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]", description = "Device id (exact)"),
        ("since" = Option<crate::http::openapi::QueryTime>, Query, description = "Only events with `at` at or after this time (RFC 3339 or Unix ms)"),
        ("until" = Option<crate::http::openapi::QueryTime>, Query, description = "Only events with `at` before this time (RFC 3339 or Unix ms); at or before `since` matches nothing"),
    ),
    responses(
        (status = 200, description = "A page of events", body = EventsPage),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
    ))]
pub async fn poll(
    State(st): State<Arc<AppState>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let from = parse_u64(&q, "from_seq")?.unwrap_or(0);
    let limit = parse_u64(&q, "limit")?.unwrap_or(1000) as usize;
    if limit == 0 || limit > st.config().max_poll_limit {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be in 1..={}", st.config().max_poll_limit),
        ));
    }
    let filtered = ["types", "fence", "device", "since", "until"]
        .iter()
        .any(|k| q.contains_key(*k));
    let filter = filtered.then(|| parse_filter(&q)).transpose()?;
    let held = st.log().read(from, 0);
    let (first_seq, head_seq) = (held.first_seq, held.next_seq);
    let missed = from < first_seq && from != 0;
    let start = from.max(first_seq);
    match filter {
        None => Ok(stream_page(
            st.log().clone(),
            start,
            limit,
            first_seq,
            head_seq,
            missed,
        )),
        Some(filter) => {
            // A filtered page is read on the scan pool, examining at most `POLL_SCAN` events:
            // a glob that matches nothing in a long log costs one bounded page, not the log.
            let log = st.log().clone();
            let (events, next) =
                crate::http::scan::run(move || scan(&log, &filter, start, head_seq, limit)).await?;
            let page = EventsPage {
                events,
                next_seq: next,
                first_seq,
                head_seq,
                missed,
                has_more: next < head_seq,
            };
            Ok(crate::http::stream::json(Some(page), |p| {
                p.take().map(|p| p.to_json())
            }))
        }
    }
}

/// Events examined at most for one filtered page of `GET /v1/events`.
pub const POLL_SCAN: usize = 20_000;

/// The matches of `filter` from `start` on (up to `head`): at most `limit` of them, examining at
/// most [`POLL_SCAN`] events. Returns them and the seq to continue from. Retention overtaking
/// the scan ends it early (the next poll reports `missed`).
fn scan(
    log: &crate::events::EventLog,
    filter: &EventFilter,
    start: u64,
    head: u64,
    limit: usize,
) -> (Vec<RawEvent>, u64) {
    let mut out = Vec::new();
    let mut next = start;
    let stop = head.min(start.saturating_add(POLL_SCAN as u64));
    while next < stop && out.len() < limit {
        let want = POLL_PIECE.min((stop - next) as usize);
        let r = log.read(next, want);
        if r.events.first().map(|e| e.seq) != Some(next) {
            break;
        }
        for e in &r.events {
            next = e.seq + 1;
            if filter.matches_event(&e.event) {
                out.push(RawEvent(e.json()));
                if out.len() == limit {
                    break;
                }
            }
        }
    }
    (out, next)
}

/// An unfiltered page, streamed: the log is read a piece at a time as the client takes the text
/// (events older than the log's JSON cache are rendered then, outside the log's lock), so a
/// page of any size costs one piece of memory. The page covers the events up to the head seen
/// now; if retention overtakes the page while it is written, the page ends early and its
/// `next_seq` says where to go on (that poll then reports `missed`).
fn stream_page(
    log: Arc<crate::events::EventLog>,
    start: u64,
    limit: usize,
    first_seq: u64,
    head_seq: u64,
    missed: bool,
) -> Response {
    struct Page {
        log: Arc<crate::events::EventLog>,
        next: u64,
        end: u64,
        wrote_any: bool,
        started: bool,
        done: bool,
    }
    let end = start.saturating_add(limit as u64).min(head_seq.max(start));
    let page = Page {
        log,
        next: start,
        end,
        wrote_any: false,
        started: false,
        done: false,
    };
    crate::http::stream::json(page, move |p| {
        if p.done {
            return None;
        }
        let mut piece = String::new();
        if !p.started {
            p.started = true;
            piece.push_str(EventsPage::HEAD);
        }
        while piece.len() < crate::http::stream::PIECE_BYTES && p.next < p.end {
            let want = POLL_PIECE.min((p.end - p.next) as usize);
            let r = p.log.read(p.next, want);
            if r.events.first().map(|e| e.seq) != Some(p.next) {
                break; // retention overtook the page
            }
            for e in &r.events {
                if p.wrote_any {
                    piece.push(',');
                }
                piece.push_str(&e.json());
                p.wrote_any = true;
                p.next = e.seq + 1;
            }
        }
        if piece.len() < crate::http::stream::PIECE_BYTES || p.next >= p.end {
            p.done = true;
            piece.push_str(&EventsPage::tail(p.next, first_seq, head_seq, missed));
        }
        Some(piece)
    })
}

/// Parses `types=enter,dwell`, `fence=<glob>`, `device=<id>`, `since`, `until` into the one
/// event filter.
pub fn parse_filter(q: &HashMap<String, String>) -> Result<EventFilter, ApiError> {
    // Each value is accepted exactly when it matches its pattern in the OpenAPI document.
    let types = q
        .get("types")
        .map(|v| {
            v.split(',')
                .map(|s| {
                    EventKind::parse(s.trim_matches(' ')).ok_or_else(|| {
                        ApiError::bad_request(
                            "bad_query",
                            format!("unknown event type {s:?}; known: enter, exit, dwell"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    for key in ["fence", "device"] {
        if q.get(key).is_some_and(|v| !visible(v)) {
            return Err(ApiError::bad_request(
                "bad_query",
                format!("{key} must hold a visible character (omit it to match everything)"),
            ));
        }
    }
    if let Some(g) = q.get("fence")
        && g.len() > crate::events::filter::MAX_GLOB_BYTES
    {
        return Err(ApiError::bad_request(
            "bad_query",
            format!(
                "fence is a glob of at most {} bytes, got {}",
                crate::events::filter::MAX_GLOB_BYTES,
                g.len()
            ),
        ));
    }
    let fences: Vec<&str> = q.get("fence").map(String::as_str).into_iter().collect();
    // `until` at or before `since` is an empty window: it matches nothing (not an error, so
    // that each bound is valid on its own, as the OpenAPI document can say).
    let (since, until) = (parse_time(q, "since")?, parse_time(q, "until")?);
    Ok(
        EventFilter::new(types.unwrap_or_default(), &fences, q.get("device").cloned())
            .between(since, until),
    )
}

/// Whether `v` holds a character that is neither white space nor a control character (the
/// class the OpenAPI pattern of `fence` and `device` names).
fn visible(v: &str) -> bool {
    v.chars().any(|c| {
        !(c <= '\u{20}'
            || ('\u{7f}'..='\u{a0}').contains(&c)
            || c == '\u{1680}'
            || ('\u{2000}'..='\u{200a}').contains(&c)
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
            ))
    })
}

/// An event-time bound: Unix milliseconds (1 to 14 digits) or RFC 3339 text with a year from
/// 1970 (the two forms of the OpenAPI document's `QueryTime`). A time outside what events can
/// carry (an offset taking it before 1970 or past 9999) is clamped: as a bound it means the same.
fn parse_time(q: &HashMap<String, String>, key: &str) -> Result<Option<Ts>, ApiError> {
    let Some(v) = q.get(key) else { return Ok(None) };
    let bad = |why: String| {
        ApiError::bad_request(
            "bad_query",
            format!(
                "{key} must be Unix milliseconds (1 to 14 digits) or RFC 3339 from year 1970: {why}"
            ),
        )
    };
    if !v.is_empty() && v.len() <= 14 && v.bytes().all(|b| b.is_ascii_digit()) {
        let ms: i64 = v.parse().map_err(|e| bad(format!("{e}")))?;
        return Ok(Some(Ts(ms)));
    }
    let year_ok = v.get(..5).is_some_and(|y| {
        y.ends_with('-') && y[..4].bytes().all(|b| b.is_ascii_digit()) && y[..4] >= *"1970"
    });
    if !year_ok {
        return Err(bad(format!("got {v:?}")));
    }
    let dt = chrono::DateTime::parse_from_rfc3339(v).map_err(|e| bad(format!("{v:?}: {e}")))?;
    Ok(Some(Ts(dt.timestamp_millis().clamp(Ts::MIN.0, Ts::MAX.0))))
}

/// `GET /v1/events/ws?from_seq=N&types=...&fence=...&device=...&since=...&until=...`.
#[utoipa::path(get, path = "/v1/events/ws", tag = "events",
    description = "WebSocket subscription: one event JSON per text frame, from from_seq, filtered. Browsers may pass the key as `access_token`. Scope: read.",
    params(
        ("from_seq" = Option<u64>, Query, maximum = 9_223_372_036_854_775_807_i64, description = "First seq wanted (default: new events only)"),
        ("types" = Option<String>, Query, pattern = r"^ *(enter|exit|dwell) *(, *(enter|exit|dwell) *)*$", description = "Comma-separated kinds: enter, exit, dwell"),
        ("fence" = Option<String>, Query, pattern = r"[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]", max_length = 512, description = "Fence id glob (`*`, `?`), at most 512 bytes"),
        ("device" = Option<String>, Query, pattern = r"[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]", description = "Device id"),
        ("since" = Option<crate::http::openapi::QueryTime>, Query, description = "Only events with `at` at or after this time (RFC 3339 or Unix ms)"),
        ("until" = Option<crate::http::openapi::QueryTime>, Query, description = "Only events with `at` before this time (RFC 3339 or Unix ms); at or before `since` matches nothing"),
    ),
    responses(
        (status = 101, description = "Switching to WebSocket"),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 503, description = "As many subscribers as `events.max_subscribers` allows are connected (Retry-After)", body = ErrorBody),
    ))]
pub async fn subscribe(
    State(st): State<Arc<AppState>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let from = parse_u64(&q, "from_seq")?;
    let filter = parse_filter(&q)?;
    let ws = ws.map_err(ApiError::from)?;
    let slot = st.subscriber_slot().ok_or_else(|| {
        ApiError::unavailable(
            "too_many_subscribers",
            format!(
                "{} event subscribers are connected, the most allowed (events.max_subscribers)",
                st.config().max_subscribers
            ),
        )
    })?;
    // A start older than the log holds is clamped to the oldest event held; when the client
    // asked for a specific seq that is gone, its first frame says which range it missed.
    let held = st.log().read(0, 0);
    let start = from.unwrap_or(held.next_seq).max(held.first_seq);
    let gap = from.filter(|&f| f > 0 && f < held.first_seq);
    let tasks = st.tasks().clone();
    // A subscriber only reads control frames and sends one event at a time: small buffers keep
    // an idle one at a few kB instead of the 128 kB each of tungstenite's defaults.
    let ws = ws
        .read_buffer_size(4 * 1024)
        .write_buffer_size(16 * 1024)
        .max_message_size(64 * 1024);
    Ok(ws.on_upgrade(move |socket| async move {
        let _slot = slot;
        // Tracked so that shutdown waits for the goodbye frame.
        tasks
            .spawn(run_subscriber(
                st,
                socket,
                start,
                from.is_none(),
                gap,
                filter,
            ))
            .await
            .ok();
    }))
}

async fn run_subscriber(
    st: Arc<AppState>,
    socket: WebSocket,
    start: u64,
    mut caught_up: bool,
    gap: Option<u64>,
    filter: EventFilter,
) {
    gauge!(t::SUBSCRIBERS).increment(1.0);
    let mut cursor = LogCursor::at(start);
    let (mut tx, mut rx) = socket.split();
    if let Some(missing_from) = gap {
        let frame = ControlFrame::Gap {
            missing_from,
            resume_from: cursor.next(),
        };
        let _ = tx.send(frame.message()).await;
    }
    let mut head = st.log().watch();
    let close = |code, reason: &'static str| {
        Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from_static(reason),
        }))
    };
    'outer: loop {
        // Send everything available from the cursor on.
        loop {
            let r = cursor.read(st.log(), CHUNK);
            let behind = r.head.saturating_sub(cursor.next());
            let events = match r.chunk {
                Chunk::Events(events)
                    if !(caught_up && behind > st.config().subscriber_queue as u64) =>
                {
                    events
                }
                _ => {
                    counter!(t::SUBSCRIBERS_LAGGED).increment(1);
                    let frame = ControlFrame::Lagged {
                        resume_from: cursor.next(),
                    };
                    let bye = async {
                        tx.send(frame.message()).await?;
                        tx.send(close(close_code::POLICY, "lagged")).await
                    };
                    let _ = tokio::time::timeout(SEND_TIMEOUT, bye).await;
                    break 'outer;
                }
            };
            if events.is_empty() {
                caught_up = true;
                break;
            }
            // Queue the chunk's frames and flush once: a flush per frame (a write syscall per
            // event) capped delivery at a few thousand events/s during bursts of ENTERs.
            let mut queued = 0u64;
            let mut failed = false;
            for e in &events {
                if filter.matches_event(&e.event) {
                    // Cached for events near the head (the live case); rendered for a replay.
                    let fed = tokio::time::timeout(
                        SEND_TIMEOUT,
                        tx.feed(Message::Text(Utf8Bytes::from(&*e.json()))),
                    )
                    .await;
                    match fed {
                        Ok(Ok(())) => queued += 1,
                        Ok(Err(_)) => break 'outer,
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
                cursor.passed(e.seq);
            }
            if !failed && queued > 0 {
                match tokio::time::timeout(SEND_TIMEOUT, tx.flush()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break 'outer,
                    Err(_) => failed = true,
                }
            }
            if failed {
                counter!(t::SUBSCRIBERS_LAGGED).increment(1);
                break 'outer;
            }
            counter!(t::SUBSCRIBER_EVENTS_SENT).increment(queued);
        }
        tokio::select! {
            _ = st.shutdown_token().cancelled() => {
                let _ = tx.send(close(close_code::AWAY, "server shutting down")).await;
                break;
            }
            changed = head.changed() => if changed.is_err() { break },
            msg = rx.next() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {} // pings are answered by axum; other input is ignored
            },
        }
    }
    gauge!(t::SUBSCRIBERS).decrement(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_page_is_written_as_serde_would_write_it() {
        let events = [
            r#"{"seq":7,"id":"ab","type":"exit","device":"d\"1","fence":"f","at":"2026-01-01T08:05:00.000Z","entered_at":"2026-01-01T08:00:00.000Z","duration_s":90.5,"tags":{"k":["\u00e9",null]}}"#,
            r#"{"seq":8,"id":"cd","type":"enter","device":"d2","fence":"f","at":"2026-01-01T08:06:00.000Z","entered_at":"2026-01-01T08:06:00.000Z","tags":[]}"#,
        ];
        for n in 0..=events.len() {
            let page = EventsPage {
                events: events[..n]
                    .iter()
                    .map(|e| RawEvent(Arc::from(*e)))
                    .collect(),
                next_seq: 9,
                first_seq: 3,
                head_seq: 12,
                missed: n == 1,
                has_more: true,
            };
            assert_eq!(page.to_json(), serde_json::to_string(&page).unwrap());
        }
    }

    #[test]
    fn control_frames_keep_their_text() {
        let gap = ControlFrame::Gap {
            missing_from: 3,
            resume_from: 10,
        };
        assert_eq!(
            serde_json::to_string(&gap).unwrap(),
            r#"{"type":"gap","missing_from":3,"resume_from":10}"#
        );
        let lagged = ControlFrame::Lagged { resume_from: 11 };
        assert_eq!(
            serde_json::to_string(&lagged).unwrap(),
            r#"{"type":"lagged","resume_from":11}"#
        );
    }
}
