//! Reading request bodies, the one way every handler that takes a body reads it: the content
//! type is checked first (415), the body is read within `ingest.max_body_bytes` (413) and
//! `server.body_timeout` from the first byte to the last (408), and every byte read is held in
//! the ingest memory budget (503 + `Retry-After` when it is full, decided before the bytes are
//! read whenever the client sent `Content-Length`).
//!
//! The reservation comes back with the bytes: a handler keeps it until its answer is sent, so a
//! batch waiting for the shards still counts. It holds [`HOLD_FACTOR`] times the body, because
//! the parsed form of a batch lives beside the body for a while.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;

use crate::budget::{MemoryBudget, Reservation};
use crate::http::error::ApiError;
use crate::state::AppState;

/// Bytes of budget held per byte of body: the body and its parsed items side by side.
pub const HOLD_FACTOR: usize = 2;

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
}

impl BodyLimits {
    /// The service's: `ingest.max_body_bytes`, `server.body_timeout`, its memory budget.
    pub fn of(st: &AppState) -> BodyLimits {
        BodyLimits {
            max_bytes: st.config().max_body_bytes,
            timeout: Duration::from_millis(st.config().body_timeout.millis().max(1) as u64),
            budget: st.budget().clone(),
        }
    }
}

/// A body read whole, with the budget it holds.
#[derive(Debug)]
pub struct ReadBody {
    /// The bytes.
    pub bytes: Bytes,
    /// Held until dropped (keep it until the answer is sent).
    pub reservation: Reservation,
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
    let too_large = || {
        ApiError::too_large(
            "body_too_large",
            format!("request body is larger than {} bytes", limits.max_bytes),
        )
    };
    let mut reservation = limits.budget.empty();
    if let Some(n) = declared {
        if n > limits.max_bytes as u64 {
            return Err(too_large());
        }
        if reservation.grow(n as usize * HOLD_FACTOR).is_err() {
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
            if buf.len() + data.len() > limits.max_bytes {
                return Err(too_large());
            }
            let need = (buf.len() + data.len()) * HOLD_FACTOR;
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
    Ok(ReadBody {
        bytes: Bytes::from(buf),
        reservation,
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
        assert_eq!(l.budget.in_use(), 4 * HOLD_FACTOR);
        drop(r);
        assert_eq!(l.budget.in_use(), 0);
        // Without a content-length (chunked), the budget grows as the bytes come.
        let mut h = headers(Some("application/json"), None);
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let r = read(&h, Body::from("12345"), Accept::Json, &l)
            .await
            .unwrap();
        assert_eq!(r.reservation.bytes(), 5 * HOLD_FACTOR);
    }

    #[tokio::test]
    async fn too_large_over_budget_and_wrong_type_are_refused_before_reading() {
        let l = limits(100, 150);
        let e = read(
            &headers(Some("application/json"), Some(101)),
            Body::empty(),
            Accept::Json,
            &l,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
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
        assert_eq!(l.budget.in_use(), 0);
        // No body declared: nothing to check, an empty body comes back.
        let r = read(&headers(None, None), Body::empty(), Accept::Json, &l)
            .await
            .unwrap();
        assert!(r.bytes.is_empty());
    }
}
