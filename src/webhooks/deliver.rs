//! One delivery attempt: POST one event's JSON to a sink with the Standard Webhooks headers (or,
//! for an MQTT or NATS sink, publish it: [`crate::webhooks::brokers`]), and classify the answer.
//!
//! Invariants: the body is exactly the event JSON the event log serialized (the same bytes as the
//! WebSocket feed and the store), and the signature covers exactly that body; only a 2xx answer
//! counts as delivered (redirects are not followed: the client has no redirect policy); only
//! public addresses are connected to unless `server.allow_private_targets` is on
//! ([`crate::outbound`]); every
//! attempt is bounded by the sink's timeout, so a hanging receiver costs at most that per try.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};

pub use super::outcome::Attempt;
use crate::outbound::TargetPolicy;
use crate::webhooks::spec::{SinkKind, SinkSpec, sign};

/// Header carrying the event id (stable across retries: receivers dedupe on it).
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the attempt's Unix time in seconds (signed; receivers reject stale ones).
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying `v1,<base64 HMAC-SHA256>`.
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// The HTTP client every sink shares: no redirects (a 3xx is a failure, per Standard Webhooks),
/// no proxies from the environment, only the targets `policy` allows, pooled connections.
pub fn client(policy: TargetPolicy) -> reqwest::Client {
    policy.http_client(concat!(
        "geodwell/",
        env!("CARGO_PKG_VERSION"),
        " (webhooks)"
    ))
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// An error with its causes, on one line (reqwest's top-level message alone says little).
fn error_chain(e: &reqwest::Error) -> String {
    let mut out = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// One attempt through the sink's transport: a signed POST for http(s), else a publish to its
/// broker over the sink's own connection `conn`.
pub async fn attempt(
    client: &reqwest::Client,
    policy: TargetPolicy,
    conn: &mut crate::webhooks::brokers::Conn,
    spec: &SinkSpec,
    event_id: &str,
    body: &str,
) -> Attempt {
    match spec.kind() {
        SinkKind::Http => post(client, policy, spec, event_id, body).await,
        SinkKind::Mqtt | SinkKind::Nats => {
            crate::webhooks::brokers::send(conn, policy, spec, event_id, body).await
        }
    }
}

/// POSTs `body` (one event's JSON, whose id is `event_id`) to the sink.
pub async fn post(
    client: &reqwest::Client,
    policy: TargetPolicy,
    spec: &SinkSpec,
    event_id: &str,
    body: &str,
) -> Attempt {
    // A host name is checked by the client's resolver at every connection; an address written
    // in the URL never reaches the resolver, so it is checked here.
    if let Ok(url) = reqwest::Url::parse(&spec.url)
        && let Err(e) = policy.check_literal(&url)
    {
        metrics::counter!(crate::telemetry::OUTBOUND_REFUSED).increment(1);
        return Attempt::Failed {
            error: e.to_string(),
            retry_after: None,
        };
    }
    let ts = unix_now();
    // An http(s) sink always has a secret (checked when the spec was built).
    let key = spec.secret.as_ref().map_or(&[][..], |s| s.key());
    let signature = sign(key, event_id, ts, body.as_bytes());
    let timeout = Duration::from_millis(spec.timeout.millis().max(1) as u64);
    let sent = client
        .post(&spec.url)
        .timeout(timeout)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(HEADER_ID, event_id)
        .header(HEADER_TIMESTAMP, ts.to_string())
        .header(HEADER_SIGNATURE, signature)
        .body(body.to_string())
        .send()
        .await;
    match sent {
        Ok(resp) if resp.status().is_success() => Attempt::Delivered,
        Ok(resp) => {
            let retry_after = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            Attempt::Failed {
                error: format!("HTTP {}", resp.status()),
                retry_after,
            }
        }
        Err(e) => Attempt::Failed {
            error: if e.is_timeout() {
                format!("timed out after {}", spec.timeout)
            } else {
                error_chain(&e)
            },
            retry_after: None,
        },
    }
}
