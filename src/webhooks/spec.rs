//! Webhook sink definitions: the validated [`SinkSpec`] (shared by `[[webhooks]]` in the config
//! and `POST /v1/webhooks`), the event filter, the Standard Webhooks signature and the retry
//! schedule. Pure: no I/O, no clock, no tokio.
//!
//! Invariants:
//! - A [`SinkSpec`] is only built by [`SinkSpec::from_json`], which checks every field and reports
//!   every problem at once (like the config loader), so a running sink never meets a bad URL,
//!   secret or limit.
//! - A [`Secret`] never prints: its `Debug` is redacted and the API never serializes it; only
//!   [`SinkSpec::to_stored_json`] (the store's copy of an API sink) writes it out.
//! - [`sign`] follows Standard Webhooks v1: `v1,` + base64(HMAC-SHA256(key,
//!   "{webhook-id}.{webhook-timestamp}.{body}")), the key being the base64 after `whsec_`.

use std::fmt;
use std::time::Duration;

use crate::events::EventFilter;
use crate::webhooks::template::check_template;
pub use crate::webhooks::template::{PLACEHOLDERS, SinkKind, destination_template, fill_template};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use geodwell_core::event::EventKind;
use geodwell_core::time::Dur;

/// Default attempts per event before it is dead-lettered.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// Default per-request timeout (Standard Webhooks recommends 15-30 s).
pub const DEFAULT_TIMEOUT: Dur = Dur::from_secs(15);
/// Default first retry delay bound.
pub const DEFAULT_BACKOFF_BASE: Dur = Dur::from_secs(1);
/// Default largest retry delay.
pub const DEFAULT_BACKOFF_MAX: Dur = Dur::from_mins(5);
/// Default dead letters kept per sink (oldest dropped first).
pub const DEFAULT_MAX_DEAD_LETTERS: usize = 1000;
/// Default events the store keeps for a lagging sink beyond the event log's own retention.
pub const DEFAULT_MAX_BACKLOG: u64 = 1_000_000;
/// Longest sink id.
pub const MAX_ID_LEN: usize = 64;

/// The keys a sink definition may have (config and API alike).
pub const KEYS: &[&str] = &[
    "id",
    "url",
    "secret",
    "types",
    "fences",
    "max_attempts",
    "timeout",
    "backoff_base",
    "backoff_max",
    "max_dead_letters",
    "max_backlog",
];

/// A Standard Webhooks signing secret: `whsec_` + base64 of 24..=64 random bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    text: String,
    key: Vec<u8>,
}

impl Secret {
    /// Parses `whsec_<base64>`; the decoded key must be 24 to 64 bytes (the spec's range).
    pub fn parse(text: &str) -> Result<Secret, String> {
        let Some(b64) = text.strip_prefix("whsec_") else {
            return Err(
                "must be \"whsec_\" followed by base64 of 24 to 64 random bytes \
                 (e.g. `echo whsec_$(head -c 32 /dev/urandom | base64)`)"
                    .into(),
            );
        };
        let key = B64
            .decode(b64.trim())
            .map_err(|e| format!("the part after \"whsec_\" is not base64: {e}"))?;
        if !(24..=64).contains(&key.len()) {
            return Err(format!(
                "the key must be 24 to 64 bytes, this one is {} bytes",
                key.len()
            ));
        }
        Ok(Secret {
            text: text.to_string(),
            key,
        })
    }

    /// The HMAC key (the decoded base64).
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One validated sink definition (webhook, MQTT or NATS). Its `Debug` shows the URL without
/// credentials, as logs must.
#[derive(Clone, PartialEq)]
pub struct SinkSpec {
    /// Unique id: 1..=64 of `A-Z a-z 0-9 _ . -`.
    pub id: String,
    /// Where events go: an http(s) receiver, or an MQTT or NATS server and topic template.
    pub url: String,
    /// Signing secret: required for http(s), not used (and refused) for MQTT and NATS.
    pub secret: Option<Secret>,
    /// Event types delivered; empty = every type.
    pub types: Vec<EventKind>,
    /// Fence id glob patterns (`*`, `?`); an event is delivered when its fence matches one;
    /// empty = every fence.
    pub fences: Vec<String>,
    /// Attempts per event (the first included) before it is dead-lettered.
    pub max_attempts: u32,
    /// Per-request timeout (connect + response).
    pub timeout: Dur,
    /// Retry delay bound after the first failure; doubles per failure.
    pub backoff_base: Dur,
    /// Largest retry delay bound.
    pub backoff_max: Dur,
    /// Dead letters kept (oldest dropped first).
    pub max_dead_letters: usize,
    /// Events the store keeps for this sink beyond the event log's retention while it lags.
    pub max_backlog: u64,
}

impl fmt::Debug for SinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkSpec")
            .field("id", &self.id)
            .field("url", &self.public_url())
            .field("secret", &self.secret)
            .field("types", &self.types)
            .field("fences", &self.fences)
            .field("max_attempts", &self.max_attempts)
            .field("timeout", &self.timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("max_dead_letters", &self.max_dead_letters)
            .field("max_backlog", &self.max_backlog)
            .finish()
    }
}

/// One problem with a sink definition: the field and what is wrong.
pub type FieldIssue = (String, String);

fn get_dur(obj: &Map<String, Value>, key: &str, issues: &mut Vec<FieldIssue>) -> Option<Dur> {
    let v = obj.get(key)?;
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => {
            issues.push((
                key.into(),
                format!("expected a duration string, got {other}"),
            ));
            return None;
        }
    };
    match Dur::parse(&text) {
        Ok(d) if d == Dur::ZERO => {
            issues.push((key.into(), "must be greater than zero".into()));
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            issues.push((key.into(), e.to_string()));
            None
        }
    }
}

fn get_int(
    obj: &Map<String, Value>,
    key: &str,
    min: u64,
    max: u64,
    issues: &mut Vec<FieldIssue>,
) -> Option<u64> {
    let v = obj.get(key)?;
    match v.as_u64() {
        Some(n) if (min..=max).contains(&n) => Some(n),
        _ => {
            issues.push((
                key.into(),
                format!("must be an integer in {min}..={max}, got {v}"),
            ));
            None
        }
    }
}

fn get_list(obj: &Map<String, Value>, key: &str, issues: &mut Vec<FieldIssue>) -> Vec<String> {
    let Some(v) = obj.get(key) else {
        return Vec::new();
    };
    let Some(items) = v.as_array() else {
        issues.push((key.into(), format!("expected an array of strings, got {v}")));
        return Vec::new();
    };
    if items.is_empty() {
        issues.push((
            key.into(),
            "must not be empty (omit it to match everything)".into(),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item.as_str() {
            Some(s) if !s.trim().is_empty() => out.push(s.to_string()),
            _ => issues.push((
                key.into(),
                format!("expected non-empty strings, got {item}"),
            )),
        }
    }
    out
}

fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("must be 1 to {MAX_ID_LEN} characters"));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(format!(
            "may only contain A-Z, a-z, 0-9, '_', '.' and '-', got {id:?}"
        ));
    }
    Ok(())
}

/// Checks a sink URL and tells its kind: absolute http(s) with a host and no credentials or
/// fragment; or `mqtt://`, `mqtts://`, `nats://` with a host and a topic (subject) template as
/// its path, credentials allowed (`user:password@`, the broker's own authentication).
pub fn check_url(url: &str) -> Result<SinkKind, String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("not a URL ({e}): {url:?}"))?;
    let kind = match u.scheme() {
        "http" | "https" => SinkKind::Http,
        "mqtt" | "mqtts" => SinkKind::Mqtt,
        "nats" => SinkKind::Nats,
        _ => {
            return Err(format!(
                "must be http://, https://, mqtt://, mqtts:// or nats://, got {url:?}"
            ));
        }
    };
    if u.host_str().is_none_or(str::is_empty) {
        return Err(format!("must name a host, got {url:?}"));
    }
    if u.fragment().is_some() {
        return Err(format!("must not have a #fragment, got {url:?}"));
    }
    match kind {
        SinkKind::Http => {
            if !u.username().is_empty() || u.password().is_some() {
                return Err(
                    "must not carry credentials (user:password@); the signature authenticates \
                    the sender"
                        .into(),
                );
            }
        }
        SinkKind::Mqtt | SinkKind::Nats => {
            if u.query().is_some() {
                return Err(format!("must not have a ?query, got {url:?}"));
            }
            check_template(kind, &destination_template(&u))?;
        }
    }
    Ok(kind)
}

impl SinkSpec {
    /// Validates a sink definition given as a JSON object with the keys in [`KEYS`] (plus
    /// `allow_extra`, which the caller handles). Every problem is reported, with its field.
    pub fn from_json(v: &Value, allow_extra: &[&str]) -> Result<SinkSpec, Vec<FieldIssue>> {
        let Some(obj) = v.as_object() else {
            return Err(vec![(
                "(body)".into(),
                format!("expected an object with keys {}, got {v}", KEYS.join(", ")),
            )]);
        };
        let mut issues = Vec::new();
        for k in obj.keys() {
            if !KEYS.contains(&k.as_str()) && !allow_extra.contains(&k.as_str()) {
                issues.push((
                    k.clone(),
                    format!("unknown key; known: {}", KEYS.join(", ")),
                ));
            }
        }
        let text = |key: &str, issues: &mut Vec<FieldIssue>| match obj.get(key) {
            None => {
                issues.push((key.into(), "is required".into()));
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                issues.push((key.into(), format!("expected a string, got {other}")));
                None
            }
        };
        let id = text("id", &mut issues);
        let url = text("url", &mut issues);
        let secret = match obj.get("secret") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                issues.push(("secret".into(), format!("expected a string, got {other}")));
                None
            }
        };
        if let Some(id) = &id
            && let Err(e) = check_id(id)
        {
            issues.push(("id".into(), e));
        }
        let kind = url.as_deref().and_then(|u| {
            check_url(u)
                .map_err(|e| issues.push(("url".into(), e)))
                .ok()
        });
        let secret = match (kind, secret) {
            (Some(SinkKind::Mqtt | SinkKind::Nats), Some(_)) => {
                issues.push((
                    "secret".into(),
                    "MQTT and NATS sinks are not signed (the broker authenticates the \
                     publisher); leave it out"
                        .into(),
                ));
                None
            }
            (Some(SinkKind::Mqtt | SinkKind::Nats), None) => None,
            (Some(SinkKind::Http), None) => {
                issues.push(("secret".into(), "is required for an http(s) sink".into()));
                None
            }
            (_, Some(s)) => Secret::parse(&s)
                .map_err(|e| issues.push(("secret".into(), e)))
                .ok(),
            (None, None) => None,
        };
        let mut types = Vec::new();
        for t in get_list(obj, "types", &mut issues) {
            match EventKind::parse(t.trim()) {
                Some(k) if !types.contains(&k) => types.push(k),
                Some(_) => {}
                None => issues.push((
                    "types".into(),
                    format!("unknown event type {t:?}; known: enter, exit, dwell"),
                )),
            }
        }
        let fences = get_list(obj, "fences", &mut issues);
        if let Some(g) = fences
            .iter()
            .find(|g| g.len() > crate::events::filter::MAX_GLOB_BYTES)
        {
            issues.push((
                "fences".into(),
                format!(
                    "a fence glob is at most {} bytes, got {}",
                    crate::events::filter::MAX_GLOB_BYTES,
                    g.len()
                ),
            ));
        }
        let max_attempts = get_int(obj, "max_attempts", 1, 100, &mut issues)
            .map_or(DEFAULT_MAX_ATTEMPTS, |n| n as u32);
        let timeout = get_dur(obj, "timeout", &mut issues).unwrap_or(DEFAULT_TIMEOUT);
        if timeout > Dur::from_mins(5) {
            issues.push(("timeout".into(), "must be at most 5m".into()));
        }
        let backoff_base =
            get_dur(obj, "backoff_base", &mut issues).unwrap_or(DEFAULT_BACKOFF_BASE);
        let backoff_max = get_dur(obj, "backoff_max", &mut issues).unwrap_or(DEFAULT_BACKOFF_MAX);
        if backoff_max < backoff_base {
            issues.push((
                "backoff_max".into(),
                format!("must be at least backoff_base ({backoff_base})"),
            ));
        }
        if backoff_max > Dur::from_secs(86_400) {
            issues.push(("backoff_max".into(), "must be at most 1d".into()));
        }
        let max_dead_letters = get_int(obj, "max_dead_letters", 1, 1_000_000, &mut issues)
            .map_or(DEFAULT_MAX_DEAD_LETTERS, |n| n as usize);
        let max_backlog = get_int(obj, "max_backlog", 1, 1_000_000_000, &mut issues)
            .unwrap_or(DEFAULT_MAX_BACKLOG);
        match (id, url) {
            (Some(id), Some(url)) if issues.is_empty() => Ok(SinkSpec {
                id,
                url,
                secret,
                types,
                fences,
                max_attempts,
                timeout,
                backoff_base,
                backoff_max,
                max_dead_letters,
                max_backlog,
            }),
            _ => Err(issues),
        }
    }

    /// The sink's kind, from its URL (checked when the spec was built).
    pub fn kind(&self) -> SinkKind {
        check_url(&self.url).unwrap_or(SinkKind::Http)
    }

    /// The URL as the API shows it: its user name and password (MQTT, NATS) replaced by `***`.
    pub fn public_url(&self) -> String {
        crate::outbound::redact_credentials(&self.url)
    }

    /// The definition as the API shows it: every field but the secret (and a URL's credentials).
    pub fn public_json(&self) -> Value {
        json!({
            "id": self.id,
            "url": self.public_url(),
            "types": (!self.types.is_empty()).then(|| self.types.iter().map(|t| t.as_str()).collect::<Vec<_>>()),
            "fences": (!self.fences.is_empty()).then(|| self.fences.clone()),
            "max_attempts": self.max_attempts,
            "timeout": self.timeout.to_human(),
            "backoff_base": self.backoff_base.to_human(),
            "backoff_max": self.backoff_max.to_human(),
            "max_dead_letters": self.max_dead_letters,
            "max_backlog": self.max_backlog,
        })
    }

    /// The definition as the store keeps it (secret included); [`SinkSpec::from_json`] reads
    /// it back.
    pub fn to_stored_json(&self) -> String {
        let mut v = self.public_json();
        if let Some(o) = v.as_object_mut() {
            o.retain(|_, v| !v.is_null());
            o.insert("url".into(), Value::String(self.url.clone()));
            if let Some(secret) = &self.secret {
                o.insert("secret".into(), Value::String(secret.text.clone()));
            }
        }
        v.to_string()
    }

    /// The compiled event filter.
    pub fn filter(&self) -> EventFilter {
        EventFilter::new(self.types.clone(), &self.fences, None)
    }
}

/// The Standard Webhooks v1 signature of one request: `v1,` + base64(HMAC-SHA256(key,
/// "{id}.{timestamp}.{body}")).
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

/// The retry delay bound after `failures` failed attempts (1 = after the first):
/// `min(max, base * 2^(failures-1))`.
pub fn backoff_cap(base: Dur, max: Dur, failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(40);
    let ms = (base.millis().max(0) as u128) << shift;
    Duration::from_millis(ms.min(max.millis().max(0) as u128) as u64)
}

/// "Full jitter": a uniform delay in `[0, cap]`, from 64 random bits.
pub fn full_jitter(cap: Duration, random: u64) -> Duration {
    let ms = cap.as_millis() as u64;
    Duration::from_millis(((random as u128 * (ms as u128 + 1)) >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn base() -> Value {
        json!({"id": "ops", "url": "https://example.com/hook", "secret": SECRET})
    }

    #[test]
    fn signature_matches_the_standard_webhooks_test_vector() {
        // From the Standard Webhooks reference libraries' tests (libraries/rust/src/lib.rs,
        // test_sign): same secret, id, timestamp and payload.
        let secret = Secret::parse(SECRET).unwrap();
        assert_eq!(secret.key().len(), 24);
        let sig = sign(
            secret.key(),
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            br#"{"email":"test@example.com","username":"test_user"}"#,
        );
        assert_eq!(sig, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
        // Any change to id, timestamp or body changes it.
        assert_ne!(
            sig,
            sign(
                secret.key(),
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1649367554,
                br#"{"email":"test@example.com","username":"test_user"}"#,
            )
        );
    }

    #[test]
    fn secrets_are_checked_and_never_printed() {
        assert!(Secret::parse("C2FVsBQIhrscChlQIMV+b5sSYspob7oD").is_err());
        assert!(Secret::parse("whsec_!!!").is_err());
        assert!(
            Secret::parse("whsec_c2hvcnQ=").is_err(),
            "5 bytes is too short"
        );
        let spec = SinkSpec::from_json(&base(), &[]).unwrap();
        let shown = format!("{spec:?} {}", spec.public_json());
        assert!(!shown.contains("C2FVsBQ"), "{shown}");
        // The stored form reads back to the same spec.
        let stored: Value = serde_json::from_str(&spec.to_stored_json()).unwrap();
        assert_eq!(SinkSpec::from_json(&stored, &[]).unwrap(), spec);
    }

    #[test]
    fn broker_credentials_are_never_shown() {
        // A token as the user name (ThingsBoard, flespi) is as secret as a password.
        for (url, hidden) in [
            (
                "nats://tok3nSECRET@broker.example:4222/ev",
                &["tok3nSECRET"][..],
            ),
            (
                "mqtt://alice:pa55word@broker.example/ev",
                &["alice", "pa55word"][..],
            ),
        ] {
            let spec = SinkSpec::from_json(&json!({"id": "b", "url": url}), &[]).unwrap();
            let shown = format!("{spec:?} {} {}", spec.public_json(), spec.public_url());
            for h in hidden {
                assert!(!shown.contains(h), "{h} in {shown}");
            }
            assert!(spec.public_url().contains("***@broker.example"), "{shown}");
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let v = json!({
            "id": "bad id!",
            "url": "ftp://example.com",
            "secret": "nope",
            "types": ["enter", "teleport"],
            "fences": [],
            "max_attempts": 0,
            "timeout": "soon",
            "backoff_base": "10s",
            "backoff_max": "1s",
            "colour": "blue",
        });
        let errs = SinkSpec::from_json(&v, &[]).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        for f in [
            "id",
            "url",
            "secret",
            "types",
            "fences",
            "max_attempts",
            "timeout",
            "backoff_max",
            "colour",
        ] {
            assert!(fields.contains(&f), "{f} missing from {errs:?}");
        }
        let missing = SinkSpec::from_json(&json!({}), &[]).unwrap_err();
        // Whether a secret is needed depends on the URL's scheme, so with no URL only the id
        // and the URL are reported missing.
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(SinkSpec::from_json(&json!([1]), &[]).is_err());
    }

    #[test]
    fn defaults_and_url_rules() {
        let s = SinkSpec::from_json(&base(), &[]).unwrap();
        assert_eq!(
            (s.max_attempts, s.timeout, s.backoff_base, s.backoff_max),
            (8, Dur::from_secs(15), Dur::from_secs(1), Dur::from_mins(5))
        );
        for bad in [
            "http://",
            "mailto:a@b.c",
            "http://user:pw@example.com/",
            "http://example.com/#x",
            "example.com/hook",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        for good in ["http://127.0.0.1:9000/x?y=1", "https://hooks.example.com"] {
            assert!(check_url(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn broker_sinks_have_a_checked_template_and_no_secret() {
        let ok = |url: &str| SinkSpec::from_json(&json!({"id": "b", "url": url}), &[]);
        let s = ok("mqtt://u:p%40ss@broker:1883/geodwell/{fence}/{type}").unwrap();
        assert_eq!(s.kind(), SinkKind::Mqtt);
        assert!(s.secret.is_none());
        assert_eq!(
            s.public_url(),
            "mqtt://***:***@broker:1883/geodwell/%7Bfence%7D/%7Btype%7D"
        );
        assert!(
            s.to_stored_json().contains("p%40ss"),
            "the store keeps the password"
        );
        assert_eq!(
            ok("nats://n:4222/ev.{device}").unwrap().kind(),
            SinkKind::Nats
        );
        for bad in [
            "mqtt://broker",
            "mqtt://broker/a/+/b",
            "mqtt://broker/a/#",
            "mqtt://broker/{nope}",
            "mqtt://broker/{fence",
            "nats://n/a..b",
            "nats://n/a.*",
            "nats://n/a.>",
            "nats://n/a?x=1",
            "ftp://h/x",
        ] {
            assert!(ok(bad).is_err(), "{bad}");
        }
        let e = SinkSpec::from_json(
            &json!({"id": "b", "url": "nats://n/x", "secret": SECRET}),
            &[],
        )
        .unwrap_err();
        assert_eq!(e[0].0, "secret");
        let e = SinkSpec::from_json(&json!({"id": "h", "url": "https://h/x"}), &[]).unwrap_err();
        assert_eq!(e[0].0, "secret", "an http sink needs its secret");
    }

    #[test]
    fn templates_make_one_level_or_token_per_placeholder() {
        let t = "geo/{fence}/{type}/{device}";
        assert_eq!(
            fill_template(SinkKind::Mqtt, t, "a/b", "enter", "x+y#"),
            "geo/a_b/enter/x_y_"
        );
        assert_eq!(
            fill_template(
                SinkKind::Nats,
                "geo.{fence}.{device}",
                "depot.1",
                "dwell",
                "t 1>*"
            ),
            "geo.depot_1.t_1__"
        );
        assert_eq!(
            fill_template(SinkKind::Nats, "g.{device}", "f", "exit", ""),
            "g._"
        );
        // A value is never expanded again, whatever placeholder text it holds.
        assert_eq!(
            fill_template(SinkKind::Mqtt, t, "zone{device}", "enter", "normal-1"),
            "geo/zone{device}/enter/normal-1"
        );
        assert_eq!(
            fill_template(SinkKind::Mqtt, t, "{type}", "exit", "{fence}"),
            "geo/{type}/exit/{fence}"
        );
        // Characters a broker refuses in a topic (an id stored before they were refused).
        assert_eq!(
            fill_template(SinkKind::Mqtt, t, "f\u{ffff}", "enter", "d\u{10ffff}\u{0}x"),
            "geo/f_/enter/d__x"
        );
        assert_eq!(
            fill_template(SinkKind::Nats, "g.{device}", "f", "exit", "a\u{fffe}"),
            "g.a_"
        );
    }

    #[test]
    fn filter_matches_types_and_fence_globs() {
        let mut v = base();
        v["types"] = json!(["enter", "dwell"]);
        v["fences"] = json!(["depot-*", "hq"]);
        let f = SinkSpec::from_json(&v, &[]).unwrap().filter();
        assert!(f.matches(EventKind::Enter, "depot-3", "any-device"));
        assert!(f.matches(EventKind::Dwell, "hq", "any-device"));
        assert!(
            !f.matches(EventKind::Exit, "depot-3", "any-device"),
            "type not listed"
        );
        assert!(
            !f.matches(EventKind::Enter, "hq-2", "any-device"),
            "fence matches no pattern"
        );
        let all = SinkSpec::from_json(&base(), &[]).unwrap().filter();
        assert!(all.matches(EventKind::Exit, "anything", "any-device"));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_stays_within_it() {
        let (b, m) = (Dur::from_millis(100), Dur::from_secs(1));
        let caps: Vec<u128> = (1..=6).map(|n| backoff_cap(b, m, n).as_millis()).collect();
        assert_eq!(caps, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff_cap(b, m, 1000).as_millis(), 1000, "no overflow");
        let cap = Duration::from_millis(400);
        assert_eq!(full_jitter(cap, 0), Duration::ZERO);
        assert_eq!(full_jitter(cap, u64::MAX), cap);
        use rand_xoshiro::rand_core::{RngCore, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
        let draws: Vec<Duration> = (0..1000)
            .map(|_| full_jitter(cap, rng.next_u64()))
            .collect();
        assert!(draws.iter().all(|d| *d <= cap));
        let mean = draws.iter().map(|d| d.as_millis()).sum::<u128>() / 1000;
        assert!(
            (150..=250).contains(&mean),
            "uniform on [0, 400]: mean {mean}"
        );
    }
}
