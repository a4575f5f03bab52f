//! Reading request bodies, the one way every handler that takes a body reads it: the content
//! type is checked first (415), the body is read within `ingest.max_body_bytes` (413) and
//! `server.body_timeout` from the first byte to the last (408), and every byte read is held in
//! the ingest memory budget (503 + `Retry-After` when it is full, decided before the bytes are
//! read whenever the client sent `Content-Length`).
//!
//! The reservation comes back with the bytes: a handler keeps it until its answer is sent, so a
//! batch waiting for the shards still counts. It holds the body's buffer times the route's
//! [`Hold`] factor: 1 where the handler charges what it parses from the body itself (fixes:
//! [`crate::ingest::Ingest::read_within`]), [`TREE_HOLD_FACTOR`] where the body is parsed into
//! a JSON tree. A body whose hold could never fit the budget is 413, not a 503 to retry.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;

use crate::budget::{MemoryBudget, Reservation};
use crate::http::error::ApiError;
use crate::state::AppState;

pub use crate::budget::TREE_HOLD_FACTOR;

/// How much budget a route's body holds per byte read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The bytes alone: the handler charges what it parses as it parses it.
    Bytes,
    /// The bytes and a JSON tree of them ([`TREE_HOLD_FACTOR`]).
    Tree,
}

impl Hold {
    fn factor(self) -> usize {
        match self {
            Hold::Bytes => 1,
            Hold::Tree => TREE_HOLD_FACTOR,
        }
    }
}

/// Which content types a route takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// JSON (`application/json`, `application/*+json`).
    Json,
    /// JSON or NDJSON (`application/x-ndjson`, `application/jsonl`, ...).
    JsonOrNdjson,
    /// A tracker's: JSON, or an HTML form (`application/x-www-form-urlencoded`).
    JsonOrForm,
}

/// What a body is read within.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Largest body.
    pub max_bytes: usize,
    /// Longest time from the first byte to the last.
    pub timeout: Duration,
    /// The ingest memory budget.
    pub budget: MemoryBudget,
    /// Budget held per byte read.
    pub hold: Hold,
}

impl BodyLimits {
    /// The service's: `ingest.max_body_bytes`, `server.body_timeout`, its memory budget, for a
    /// body parsed into a JSON tree ([`Hold::Tree`]).
    pub fn of(st: &AppState) -> BodyLimits {
        BodyLimits {
            max_bytes: st.config().max_body_bytes,
            timeout: Duration::from_millis(st.config().body_timeout.millis().max(1) as u64),
            budget: st.budget().clone(),
            hold: Hold::Tree,
        }
    }

    /// The same limits for a route that charges what it parses itself ([`Hold::Bytes`]).
    pub fn bytes_only(self) -> BodyLimits {
        BodyLimits {
            hold: Hold::Bytes,
            ..self
        }
    }

    /// The largest body whose hold can fit the budget at all.
    fn max_fitting(&self) -> usize {
        (self.budget.total() / self.hold.factor()).min(self.max_bytes)
    }
}

/// A body read whole, with the budget it holds.
#[derive(Debug)]
pub struct ReadBody {
    /// The bytes.
    pub bytes: Bytes,
    /// Held until dropped (keep it until the answer is sent).
    pub reservation: Reservation,
    /// The part of `reservation` that stands for the bytes.
    body_hold: usize,
}

impl ReadBody {
    /// Drops the bytes and gives their share of the budget back (what the handler parsed from
    /// them stays held).
    pub fn release_bytes(&mut self) {
        self.bytes = Bytes::new();
        self.reservation
            .release(std::mem::take(&mut self.body_hold));
    }
}

/// The media type of `headers` (lower case, without parameters), if any.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(
        v.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase(),
    )
}

fn is_json(mt: &str) -> bool {
    mt == "application/json" || (mt.starts_with("application/") && mt.ends_with("+json"))
}

/// Whether the media type is one of the NDJSON names in use.
pub fn is_ndjson(mt: &str) -> bool {
    matches!(
        mt,
        "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
            | "application/jsonlines"
    )
}

/// Checks the content type of a request whose body is not empty: a type the route does not take
/// is 415 (no type at all is read as the route's own). A web page can send a cross-origin
/// `text/plain` or form POST without asking first; a JSON route refusing them is the second line
/// of defence after the origin check (`http::origin`).
pub fn check_content_type(headers: &HeaderMap, accept: Accept) -> Result<(), ApiError> {
    // A body without a type is read as the route's own (many HTTP clients send none). A web
    // page can send one too, but a page's request carries an `Origin`, which `http::origin`
    // refuses for other sites' pages.
    let Some(mt) = media_type(headers) else {
        return Ok(());
    };
    let (ok, wanted) = match accept {
        Accept::Json => (is_json(&mt), "application/json"),
        Accept::JsonOrNdjson => (
            is_json(&mt) || is_ndjson(&mt),
            "application/json or application/x-ndjson",
        ),
        Accept::JsonOrForm => (
            is_json(&mt) || mt == "application/x-www-form-urlencoded",
            "application/json or application/x-www-form-urlencoded",
        ),
    };
    if ok {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("content-type {mt} is not accepted here; send {wanted}"),
    ))
}

/// Whether the request declares a body (a non-zero `Content-Length`, or chunked).
fn declares_body(headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_LENGTH) {
        Some(v) => v.to_str().ok().and_then(|s| s.parse::<u64>().ok()) != Some(0),
        None => headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// Whether the client waits for `100 Continue` before it sends the body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
}

/// Reads the rest of a body and drops it as it comes.
async fn discard(mut body: Body) {
    while let Some(Ok(_)) = body.frame().await {}
}

/// What a route's body is: the content types it takes and how much budget it holds.
pub trait BodyKind: Send {
    /// The content types taken.
    const ACCEPT: Accept;
    /// The budget held per byte read.
    const HOLD: Hold;
}

/// A JSON body parsed into a tree (fences, webhooks, the watermark, OwnTracks).
#[derive(Debug)]
pub struct JsonBody;

impl BodyKind for JsonBody {
    const ACCEPT: Accept = Accept::Json;
    const HOLD: Hold = Hold::Tree;
}

/// A batch of fixes, JSON or NDJSON, charged as it is parsed.
#[derive(Debug)]
pub struct FixesBody;

impl BodyKind for FixesBody {
    const ACCEPT: Accept = Accept::JsonOrNdjson;
    const HOLD: Hold = Hold::Bytes;
}

/// A tracker's body: JSON or an HTML form.
#[derive(Debug)]
pub struct TrackerBody;

impl BodyKind for TrackerBody {
    const ACCEPT: Accept = Accept::JsonOrForm;
    const HOLD: Hold = Hold::Tree;
}

/// The extractor every handler that takes a body uses: the body of kind `K`, read by [`read`]
/// within the service's limits (it must be the handler's last argument).
#[derive(Debug)]
pub struct Read<K>(pub ReadBody, pub std::marker::PhantomData<K>);

impl<K: BodyKind> axum::extract::FromRequest<std::sync::Arc<AppState>> for Read<K> {
    type Rejection = ApiError;

    async fn from_request(
        req: axum::extract::Request,
        st: &std::sync::Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let limits = BodyLimits {
            hold: K::HOLD,
            ..BodyLimits::of(st)
        };
        let read = read(&parts.headers, body, K::ACCEPT, &limits).await?;
        Ok(Read(read, std::marker::PhantomData))
    }
}

/// Reads `body` within `limits`, checking the content type first when it declares a body.
pub async fn read(
    headers: &HeaderMap,
    body: Body,
    accept: Accept,
    limits: &BodyLimits,
) -> Result<ReadBody, ApiError> {
    if declares_body(headers) {
        check_content_type(headers, accept)?;
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    let fitting = limits.max_fitting();
    let too_large = || {
        let why = if fitting < limits.max_bytes {
            format!(
                "request body is larger than {fitting} bytes, the most this route can hold within the memory budget (ingest.max_queued_bytes)"
            )
        } else {
            format!("request body is larger than {} bytes", limits.max_bytes)
        };
        ApiError::too_large("body_too_large", why)
    };
    let factor = limits.hold.factor();
    let mut reservation = limits.budget.empty();
    if let Some(n) = declared {
        if n > fitting as u64 {
            return Err(too_large());
        }
        if reservation.grow(n as usize * factor).is_err() {
            // Refused before a byte is kept. A client that is still sending would see its
            // connection reset and never read the 503, so the body is read and thrown away
            // (nothing of it is held) unless the client waits for `100 Continue`.
            if !expects_continue(headers) {
                let _ = tokio::time::timeout(limits.timeout, discard(body)).await;
            }
            return Err(ApiError::budget_exhausted());
        }
    }
    let read_all = async {
        let mut body = body;
        let mut buf: Vec<u8> = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::bad_request("bad_body", format!("cannot read the body: {e}"))
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() + data.len() > fitting {
                return Err(too_large());
            }
            // The buffer's capacity is what it holds: a body without `Content-Length` grows it
            // by doubling.
            buf.reserve(data.len());
            let need = buf.capacity() * factor;
            if need > reservation.bytes() && reservation.grow(need - reservation.bytes()).is_err() {
                drop(buf);
                discard(body).await;
                return Err(ApiError::budget_exhausted());
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf)
    };
    let buf = match tokio::time::timeout(limits.timeout, read_all).await {
        Ok(r) => r?,
        Err(_) => {
            metrics::counter!(crate::telemetry::HTTP_TIMEOUTS, "kind" => "body").increment(1);
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    limits.timeout.as_secs_f64()
                ),
            ));
        }
    };
    let body_hold = reservation.bytes();
    Ok(ReadBody {
        bytes: Bytes::from(buf),
        reservation,
        body_hold,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(ct: Option<&str>, len: Option<usize>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(ct) = ct {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        }
        if let Some(n) = len {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        h
    }

    fn limits(max: usize, budget: usize) -> BodyLimits {
        BodyLimits {
            max_bytes: max,
            timeout: Duration::from_secs(5),
            budget: MemoryBudget::new(budget),
            hold: Hold::Bytes,
        }
    }

    #[test]
    fn content_types_by_route() {
        let ok = |ct, a| check_content_type(&headers(ct, None), a).is_ok();
        assert!(ok(Some("application/json"), Accept::Json));
        assert!(ok(Some("Application/JSON; charset=utf-8"), Accept::Json));
        assert!(ok(Some("application/geo+json"), Accept::Json));
        assert!(!ok(Some("application/x-ndjson"), Accept::Json));
        assert!(ok(Some("application/x-ndjson"), Accept::JsonOrNdjson));
        assert!(ok(Some("application/jsonl"), Accept::JsonOrNdjson));
        assert!(ok(
            Some("application/x-www-form-urlencoded"),
            Accept::JsonOrForm
        ));
        for bad in [
            Some("text/plain"),
            Some("multipart/form-data; boundary=x"),
            Some("application/x-www-form-urlencoded"),
        ] {
            assert!(!ok(bad, Accept::Json), "{bad:?}");
            assert!(!ok(bad, Accept::JsonOrNdjson), "{bad:?}");
        }
        assert!(!ok(Some("text/plain"), Accept::JsonOrForm));
        // No type: read as the route's own.
        assert!(ok(None, Accept::Json));
        assert!(ok(None, Accept::JsonOrForm));
        let e = check_content_type(&headers(Some("text/plain"), None), Accept::Json).unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(e.code, "unsupported_media_type");
    }

    #[tokio::test]
    async fn a_body_is_held_in_the_budget_until_dropped() {
        let l = limits(1000, 10_000);
        let r = read(
            &headers(Some("application/json"), Some(4)),
            Body::from("[1,]"),
            Accept::Json,
            &l,
        )
        .await
        .unwrap();
        assert_eq!(&r.bytes[..], b"[1,]");
        assert_eq!(l.budget.in_use(), 4);
        drop(r);
        assert_eq!(l.budget.in_use(), 0);
        // A body parsed into a JSON tree holds its tree's share too, and lets it go with the
        // bytes.
        let tree = BodyLimits {
            hold: Hold::Tree,
            ..l.clone()
        };
        let mut r = read(
            &headers(Some("application/json"), Some(4)),
            Body::from("[1,]"),
            Accept::Json,
            &tree,
        )
        .await
        .unwrap();
        assert_eq!(l.budget.in_use(), 4 * TREE_HOLD_FACTOR);
        r.reservation.grow(10).unwrap();
        r.release_bytes();
        assert_eq!((l.budget.in_use(), r.bytes.len()), (10, 0));
        drop(r);
        // Without a content-length (chunked), the budget grows as the bytes come.
        let mut h = headers(Some("application/json"), None);
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let r = read(&h, Body::from("12345"), Accept::Json, &l)
            .await
            .unwrap();
        assert!(r.reservation.bytes() >= 5, "{}", r.reservation.bytes());
    }

    #[tokio::test]
    async fn too_large_over_budget_and_wrong_type_are_refused_before_reading() {
        let l = limits(100, 150);
        // A body that could never fit the budget is 413, not a 503 to retry.
        let tree = BodyLimits {
            hold: Hold::Tree,
            ..l.clone()
        };
        let e = read(
            &headers(Some("application/json"), Some(10)),
            Body::empty(),
            Accept::Json,
            &tree,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(e.message.contains("memory budget"), "{}", e.message);
        let e = read(
            &headers(Some("application/json"), Some(101)),
            Body::empty(),
            Accept::Json,
            &l,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        let _held = l.budget.try_reserve(100).unwrap();
        let e = read(
            &headers(Some("application/json"), Some(100)),
            Body::empty(),
            Accept::Json,
            &l,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(1));
        let e = read(
            &headers(Some("text/plain"), Some(2)),
            Body::from("{}"),
            Accept::Json,
            &l,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        drop(_held);
        assert_eq!(l.budget.in_use(), 0);
        // No body declared: nothing to check, an empty body comes back.
        let r = read(&headers(None, None), Body::empty(), Accept::Json, &l)
            .await
            .unwrap();
        assert!(r.bytes.is_empty());
    }
}
