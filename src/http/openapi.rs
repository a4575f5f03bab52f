//! The OpenAPI 3.1 description served at `/openapi.json`.
//!
//! Paths come from the `#[utoipa::path]` attributes on the handlers, and `http::router` registers
//! every documented handler through `utoipa_axum`'s `routes!`, which takes the route's path and
//! method from that same attribute: a route cannot be served under a path other than the
//! documented one. The schemas below describe JSON that handlers build by hand (events, fence
//! features, device views); `.ci/run` runs schemathesis against a live server, which checks every
//! answer against them, and `tests/openapi.rs` checks the document's shape.

use serde_json::{Value, json};

use crate::config::Config;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// The document's fixed parts; paths are added by the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "geodwell",
        description = "Geofence dwell triggers: location fixes in; ENTER, EXIT and DWELL events out. \
            Semantics: DESIGN.md sections 2-4. Authentication: bearer API keys with scopes ingest, \
            read and admin (off when no keys are configured).",
        license(name = "MIT OR Apache-2.0")
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "ingest", description = "Send location fixes."),
        (name = "fences", description = "Create, read, replace and delete fences (GeoJSON)."),
        (name = "devices", description = "Device state."),
        (name = "events", description = "The event log, polled or subscribed to."),
        (name = "webhooks", description = "Webhook sinks: at-least-once, signed delivery of events."),
        (name = "ops", description = "Health, readiness, metrics and this document."),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// Every error answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// An error's code and message.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// Machine-readable code, e.g. `bad_query`, `fence_not_found`, `overloaded`.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// Structured detail (per-item or per-field errors), when there is any.
    #[schema(nullable = false)]
    pub details: Option<Value>,
}

/// The answers of the authentication layer, which every operation but the open ones can give
/// (`http::auth`); listed once here and named in each operation's `responses`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum Refused {
    /// 401.
    #[response(status = 401, description = "No valid API key")]
    Unauthorized(ErrorBody),
    /// 403.
    #[response(status = 403, description = "The key lacks the scope")]
    Forbidden(ErrorBody),
}

/// One location fix.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct FixIn {
    /// Device id (1 to `max_device_len` bytes).
    #[schema(
        min_length = 1,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$",
        example = "truck-17"
    )]
    pub device: String,
    /// Event time: RFC 3339 text or integer Unix milliseconds.
    pub ts: FixTs,
    /// Latitude, degrees.
    #[schema(minimum = -90.0, maximum = 90.0, example = 52.52)]
    pub lat: f64,
    /// Longitude, degrees.
    #[schema(minimum = -180.0, maximum = 180.0, example = 13.40)]
    pub lon: f64,
    /// Horizontal accuracy, metres (fences may ignore fixes worse than their `max_accuracy_m`).
    #[schema(minimum = 0.0)]
    pub accuracy: Option<f64>,
    /// Speed, m/s (accepted, not used).
    pub speed: Option<f64>,
    /// Heading, degrees (accepted, not used).
    pub heading: Option<f64>,
}

/// A fix's time.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum FixTs {
    /// RFC 3339.
    Text(Rfc3339),
    /// Unix milliseconds.
    Millis(UnixMillis),
}

/// An RFC 3339 date-time.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[schema(value_type = String, format = DateTime, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-")]
pub struct Rfc3339(String);

/// Unix milliseconds (non-negative integer).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[schema(value_type = i64, minimum = 0, maximum = 253_402_300_799_999_i64)]
pub struct UnixMillis(i64);

/// `POST /v1/fixes` body (JSON): one fix or an array.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum FixBody {
    /// One fix.
    One(FixIn),
    /// A batch.
    Many(Vec<FixIn>),
}

/// An event (DESIGN section 4), as polled and as sent on subscriptions.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct EventOut {
    /// Position in the log (gap-free, monotonic per instance).
    pub seq: u64,
    /// Deterministic id: the same input gives the same id across restarts and replays.
    pub id: String,
    /// Kind.
    #[serde(rename = "type")]
    pub kind: EventKindOut,
    /// Device id.
    pub device: String,
    /// Fence id.
    pub fence: String,
    /// Event time.
    #[schema(format = DateTime)]
    pub at: String,
    /// Visit start.
    #[schema(format = DateTime)]
    pub entered_at: String,
    /// The dwell threshold, seconds (DWELL only).
    #[schema(nullable = false)]
    pub dwell_s: Option<f64>,
    /// The visit's length, seconds (EXIT only).
    #[schema(nullable = false)]
    pub duration_s: Option<f64>,
    /// Wall-clock publication time.
    #[schema(format = DateTime, nullable = false)]
    pub emitted_at: Option<String>,
    /// The fence's tags at emission.
    pub tags: Value,
}

/// Event kinds.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(rename_all = "lowercase")]
pub enum EventKindOut {
    /// The device entered the fence.
    Enter,
    /// The device left.
    Exit,
    /// The device has been inside for a threshold.
    Dwell,
}

/// `GET /v1/events` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct EventsPage {
    /// Events with `seq >= from_seq`, oldest first.
    pub events: Vec<EventOut>,
    /// Pass as `from_seq` to continue.
    pub next_seq: u64,
    /// Oldest seq the log still holds.
    pub first_seq: u64,
    /// The seq the next event will get.
    pub head_seq: u64,
    /// Whether events between `from_seq` and `first_seq` were dropped by retention.
    pub missed: bool,
}

/// A fence as GeoJSON: a Feature with a Polygon, MultiPolygon or (with `radius_m`) Point
/// geometry. Properties: `dwell` (thresholds such as `"10m"`), `exit_buffer_m`, `enter_confirm`,
/// `exit_confirm`, `confirm_within`, `stale_after`, `max_accuracy_m`, `radius_m`, `tags`, and
/// free-form ones.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct FenceFeature {
    /// `"Feature"`.
    #[serde(rename = "type")]
    #[schema(example = "Feature")]
    pub kind: String,
    /// Fence id (must equal the path's id for `PUT`; may be omitted there).
    #[schema(min_length = 1)]
    pub id: Option<String>,
    /// GeoJSON geometry: Polygon, MultiPolygon, or Point (a circle, with `radius_m`).
    pub geometry: Geometry,
    /// Fence settings and tags.
    pub properties: Option<std::collections::BTreeMap<String, Value>>,
}

/// A GeoJSON geometry object.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Geometry {
    /// `Polygon`, `MultiPolygon` or `Point`.
    #[serde(rename = "type")]
    pub kind: GeometryKind,
    /// Positions as GeoJSON nests them (`[lon, lat]`).
    pub coordinates: Vec<Value>,
}

/// Geometry types a fence may have.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub enum GeometryKind {
    /// Rings.
    Polygon,
    /// Several polygons.
    MultiPolygon,
    /// A circle's centre (needs `radius_m`).
    Point,
}

/// A set of fences.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct FenceCollection {
    /// `"FeatureCollection"`.
    #[serde(rename = "type")]
    #[schema(example = "FeatureCollection")]
    pub kind: String,
    /// The fences.
    pub features: Vec<FenceFeature>,
}

/// `POST /v1/fences` body: one Feature or a FeatureCollection.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum FenceBody {
    /// One fence.
    One(FenceFeature),
    /// Several (all or nothing).
    Many(FenceCollectionIn),
}

/// A set of fences to write (at least one).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct FenceCollectionIn {
    /// `"FeatureCollection"`.
    #[serde(rename = "type")]
    #[schema(example = "FeatureCollection")]
    pub kind: String,
    /// The fences.
    pub features: Vec<FenceFeature>,
}

/// `POST /v1/fences` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct FencesWritten {
    /// Fences that did not exist before.
    pub created: u64,
    /// Fences replaced.
    pub replaced: u64,
    /// The ids written, in request order.
    pub ids: Vec<String>,
}

/// A pair's state in a device view.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct PairOut {
    /// Fence id.
    pub fence: String,
    /// `inside`, `entering` (pending ENTER run) or `exiting` (pending EXIT run).
    pub state: String,
    /// Visit start (or pending run start).
    #[schema(format = DateTime)]
    pub entered_at: String,
    /// Length of the pending run.
    pub votes: u32,
    /// Thresholds emitted in this visit.
    pub dwell_fired: Vec<String>,
    /// Thresholds whose deadline passed while the device was STALE.
    pub dwell_waiting_stale: Vec<String>,
    /// Next internal event time.
    #[schema(format = DateTime)]
    pub next_due: Option<String>,
}

/// A position.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Position {
    /// Latitude.
    pub lat: f64,
    /// Longitude.
    pub lon: f64,
}

/// `GET /v1/devices/{id}` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct DeviceOut {
    /// Device id.
    pub device: String,
    /// Latest applied fix time.
    #[schema(format = DateTime)]
    pub last_fix_at: Option<String>,
    /// Latest applied position.
    pub last_position: Option<Position>,
    /// Fixes waiting for the watermark.
    pub buffered: u64,
    /// Pairs by fence.
    pub pairs: Vec<PairOut>,
}

/// A device in `GET /v1/devices`.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct DeviceSummaryOut {
    /// Device id.
    pub device: String,
    /// Latest applied fix time.
    #[schema(format = DateTime)]
    pub last_fix_at: Option<String>,
    /// Latest applied latitude.
    pub lat: Option<f64>,
    /// Latest applied longitude.
    pub lon: Option<f64>,
    /// Fences the device is inside.
    pub inside: Vec<String>,
}

/// `GET /v1/devices` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct DevicePage {
    /// Devices.
    pub devices: Vec<DeviceSummaryOut>,
    /// Pass as `after` for the next page; null at the end.
    pub next_after: Option<String>,
}

/// `GET /healthz` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Health {
    /// `ok`.
    pub status: String,
}

/// `GET /readyz` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Ready {
    /// `ready` or `not_ready`.
    pub status: String,
    /// Engine shards.
    #[schema(nullable = false)]
    pub shards: Option<u64>,
    /// `live` or `event`.
    #[schema(nullable = false)]
    pub clock: Option<String>,
    /// The current watermark.
    #[schema(format = DateTime)]
    pub watermark: Option<String>,
    /// Configured lateness, ms.
    #[schema(nullable = false)]
    pub lateness_ms: Option<i64>,
    /// Fences held.
    #[schema(nullable = false)]
    pub fences: Option<u64>,
}

/// Writes the running configuration's limits into the document, so that what it promises is
/// what this server enforces: batch sizes, the poll limit, device id length, the device
/// listing's cursor.
pub fn tune(doc: &utoipa::openapi::OpenApi, cfg: &Config) -> Value {
    let mut d = serde_json::to_value(doc).unwrap_or(Value::Null);
    let schemas = &mut d["components"]["schemas"];
    if let Some(one_of) = schemas["FixBody"]["oneOf"].as_array_mut() {
        for v in one_of.iter_mut().filter(|v| v["type"] == "array") {
            v["minItems"] = json!(1);
            v["maxItems"] = json!(cfg.max_batch);
        }
    }
    schemas["FixIn"]["properties"]["device"]["maxLength"] = json!(cfg.max_device_len);
    schemas["FenceCollectionIn"]["properties"]["features"]["minItems"] = json!(1);
    schemas["FenceCollectionIn"]["properties"]["features"]["maxItems"] = json!(cfg.max_fences);
    for (path, name, key, value) in [
        ("/v1/events", "limit", "maximum", json!(cfg.max_poll_limit)),
        ("/v1/events", "from_seq", "maximum", json!(i64::MAX)),
        ("/v1/events/ws", "from_seq", "maximum", json!(i64::MAX)),
        (
            "/v1/devices",
            "after",
            "pattern",
            json!("^[0-9]{1,9}\\.[0-9]{1,18}$"),
        ),
        (
            "/v1/webhooks/{id}/dead-letters",
            "limit",
            "maximum",
            json!(cfg.max_poll_limit),
        ),
    ] {
        if let Some(params) = operation(&mut d, path, "get")
            .and_then(|o| o.get_mut("parameters"))
            .and_then(Value::as_array_mut)
        {
            for p in params.iter_mut().filter(|p| p["name"] == name) {
                p["schema"][key] = value.clone();
            }
        }
    }
    // OsmAnd: an empty optional number (`speed=`, or only white space as Rust's `trim` sees
    // it) means "unknown", as Traccar reads it.
    for method in ["get", "post"] {
        if let Some(params) = operation(&mut d, "/v1/trackers/osmand", method)
            .and_then(|o| o.get_mut("parameters"))
            .and_then(Value::as_array_mut)
        {
            for p in params
                .iter_mut()
                .filter(|p| matches!(p["name"].as_str(), Some("accuracy" | "speed" | "bearing")))
            {
                let number = p["schema"].take();
                let blank = "^[\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]*$";
                p["schema"] = json!({"anyOf": [number, {"type": "string", "pattern": blank}]});
            }
        }
    }
    // OwnTracks posts an empty body when a friend is deleted and expects 200.
    if let Some(body) =
        operation(&mut d, "/v1/trackers/owntracks", "post").and_then(|o| o.get_mut("requestBody"))
    {
        body["required"] = json!(false);
    }
    d
}

/// `POST /v1/webhooks` body: a sink definition. Durations are strings such as `"10s"`.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(deny_unknown_fields)]
pub struct WebhookIn {
    /// Sink id.
    #[schema(pattern = r"^[A-Za-z0-9_.\-]{1,64}$")]
    pub id: String,
    /// Receiver URL (http or https).
    #[schema(example = "https://hooks.example.com/geodwell")]
    pub url: String,
    /// Standard Webhooks secret: `whsec_` and the base64 of 24 to 64 random bytes. Write-only.
    #[schema(pattern = r"^whsec_[A-Za-z0-9+/]{32,88}={0,2}$")]
    pub secret: String,
    /// Event kinds to send (default: all).
    #[schema(nullable = false)]
    pub types: Option<Vec<EventKindOut>>,
    /// Fence id globs to send (default: all).
    #[schema(nullable = false)]
    pub fences: Option<Vec<String>>,
    /// Attempts before an event is dead-lettered.
    #[schema(nullable = false, minimum = 1)]
    pub max_attempts: Option<u32>,
    /// Timeout of one attempt.
    #[schema(nullable = false)]
    pub timeout: Option<String>,
    /// First retry delay (doubles per attempt, full jitter).
    #[schema(nullable = false)]
    pub backoff_base: Option<String>,
    /// Largest retry delay.
    #[schema(nullable = false)]
    pub backoff_max: Option<String>,
    /// Dead letters kept (oldest dropped).
    #[schema(nullable = false, minimum = 1)]
    pub max_dead_letters: Option<u64>,
    /// Events the store keeps for this sink while it lags.
    #[schema(nullable = false, minimum = 1)]
    pub max_backlog: Option<u64>,
    /// First event to send (default: events published from now on).
    #[schema(nullable = false, minimum = 0)]
    pub from_seq: Option<u64>,
}

/// A sink as the API shows it (never its secret).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct WebhookOut {
    /// Sink id.
    pub id: String,
    /// Receiver URL.
    pub url: String,
    /// Event kinds sent (null: all).
    pub types: Option<Vec<EventKindOut>>,
    /// Fence globs (null: all).
    pub fences: Option<Vec<String>>,
    /// Attempts before dead-lettering.
    pub max_attempts: u32,
    /// Attempt timeout.
    pub timeout: String,
    /// First retry delay.
    pub backoff_base: String,
    /// Largest retry delay.
    pub backoff_max: String,
    /// Dead letters kept.
    pub max_dead_letters: u64,
    /// Store hold for a lagging sink, events.
    pub max_backlog: u64,
    /// `config` or `api`.
    pub source: String,
    /// Delivery state and counters.
    pub status: Value,
}

/// `GET /v1/webhooks` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct WebhookList {
    /// The sinks.
    pub webhooks: Vec<WebhookOut>,
}

/// `GET /v1/webhooks/{id}/dead-letters` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct DeadLetters {
    /// Sink id.
    pub webhook: String,
    /// Dead letters held.
    pub count: u64,
    /// The oldest `limit` of them: `seq`, `id`, `type`, `fence`, `attempts`, `last_error`,
    /// `dead_lettered_at`, `event`.
    pub dead_letters: Vec<Value>,
}

/// `POST /v1/webhooks/{id}/dead-letters/retry` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct RetryQueued {
    /// Sink id.
    pub webhook: String,
    /// Dead letters queued for another round.
    pub queued: u64,
}

/// `DELETE /v1/webhooks/{id}/dead-letters` answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Cleared {
    /// Sink id.
    pub webhook: String,
    /// Dead letters dropped.
    pub cleared: u64,
}

/// An OwnTracks HTTP-mode message: a location, or any other type (answered `[]`, ignored).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum OwnTracksMessage {
    /// `_type: "location"`: applied as a fix.
    Location(OwnTracksLocation),
    /// Every other `_type` (`transition`, `waypoint`, `lwt`, `status`, ...).
    Other(OwnTracksOther),
}

/// An OwnTracks location.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct OwnTracksLocation {
    /// `"location"`.
    #[serde(rename = "_type")]
    pub kind: OwnTracksLocationType,
    /// Latitude.
    #[schema(minimum = -90.0, maximum = 90.0)]
    pub lat: f64,
    /// Longitude.
    #[schema(minimum = -180.0, maximum = 180.0)]
    pub lon: f64,
    /// Fix time, Unix seconds.
    #[schema(minimum = 0, maximum = 253_402_300_799_i64)]
    pub tst: i64,
    /// Accuracy, metres.
    #[schema(nullable = false, minimum = 0.0)]
    pub acc: Option<f64>,
    /// Tracker id: the device id when there are no `X-Limit-U`/`X-Limit-D` headers and no topic.
    /// A location needs a device id from the headers, `topic` or `tid` (400 otherwise).
    pub tid: Option<String>,
    /// MQTT-style topic `owntracks/user/device`.
    pub topic: Option<String>,
}

/// The location type tag.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(rename_all = "lowercase")]
pub enum OwnTracksLocationType {
    /// A location.
    Location,
}

/// Any OwnTracks message that is not a location.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct OwnTracksOther {
    /// The message type.
    #[serde(rename = "_type")]
    #[schema(pattern = "^(?!location$)")]
    pub kind: String,
}

/// One operation of the document, if it exists. Indexing a `Value` mutably would insert `null`
/// for a missing path or method, which makes an invalid document instead of a no-op.
fn operation<'a>(d: &'a mut Value, path: &str, method: &str) -> Option<&'a mut Value> {
    d.get_mut("paths")?.get_mut(path)?.get_mut(method)
}
