//! The OpenAPI 3.1 description served at `/openapi.json`.
//!
//! Paths come from the `#[utoipa::path]` attributes on the handlers, and `http::router` registers
//! every documented handler through `utoipa_axum`'s `routes!`, which takes the route's path and
//! method from that same attribute: a route cannot be served under a path other than the
//! documented one. Every answer's schema is the type its handler returns (`ErrorBody`,
//! `DeviceOut`, `EventsPage`, ...), defined next to the handler, so the compiler keeps the two in
//! step. This module holds the rest:
//!
//! - request bodies, which handlers read by hand (the fast fix reader of [`crate::wire`], the
//!   fence validator, the webhook and tracker readers) to report every problem in their own
//!   words: these types describe those bodies and are never built;
//! - the schemas of served values whose types have none: events (`geodwell_core` has no OpenAPI
//!   types) and GeoJSON fences (the `geojson` crate's);
//! - [`tune`], which writes the running configuration's limits in.
//!
//! `.ci/run` runs schemathesis against a live server, which checks every answer against the
//! document, and `tests/openapi.rs` checks the document's shape.

use serde_json::Value;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Components, RefOr, Required};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::config::Config;

/// The document's fixed parts; paths are added by the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "geodwell",
        description = "Geofence dwell triggers: location fixes in; ENTER, EXIT and DWELL events out. \
            Semantics: docs/semantics.md sections 2-4. Authentication: bearer API keys with scopes \
            ingest, read and admin (off when no keys are configured).",
        license(name = "MIT OR Apache-2.0")
    ),
    // Query parameters' types are referenced, not collected from a body: registered here so
    // the references resolve.
    components(schemas(QueryTime)),
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

// ---------------------------------------------------------------------------------------------
// Request bodies (read by hand, described here) and GeoJSON fences (requests and answers)

/// One location fix.
#[derive(ToSchema, serde::Serialize)]
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
#[serde(untagged)]
pub enum FixTs {
    /// RFC 3339.
    Text(Rfc3339),
    /// Unix milliseconds.
    Millis(UnixMillis),
}

/// A time in a query (`since`, `until`): Unix milliseconds or RFC 3339.
#[derive(ToSchema, serde::Serialize)]
#[serde(untagged)]
pub enum QueryTime {
    /// Unix milliseconds, 1 to 14 digits.
    Millis(MillisText),
    /// RFC 3339, year 1970 or later.
    Text(Rfc3339),
}

/// Unix milliseconds written as digits (a query value is text).
#[derive(ToSchema, serde::Serialize)]
#[schema(value_type = String, pattern = r"^[0-9]{1,14}$")]
pub struct MillisText(String);

/// An RFC 3339 date-time.
#[derive(ToSchema, serde::Serialize)]
#[schema(value_type = String, format = DateTime, pattern = r"^(19[7-9][0-9]|[2-9][0-9]{3})-")]
pub struct Rfc3339(String);

/// Unix milliseconds (non-negative integer).
#[derive(ToSchema, serde::Serialize)]
#[schema(value_type = i64, minimum = 0, maximum = 253_402_300_799_999_i64)]
pub struct UnixMillis(i64);

/// `POST /v1/fixes` body (JSON): one fix or an array.
#[derive(ToSchema, serde::Serialize)]
#[serde(untagged)]
pub enum FixBody {
    /// One fix.
    One(FixIn),
    /// A batch.
    Many(Vec<FixIn>),
}

/// A fence as GeoJSON: a Feature with a Polygon, MultiPolygon or (with `radius_m`) Point
/// geometry. Properties: `dwell` (thresholds such as `"10m"`), `exit_buffer_m`, `enter_confirm`,
/// `exit_confirm`, `confirm_within`, `stale_after`, `max_accuracy_m`, `radius_m`, `tags`, `name`
/// and `devices` (device id globs the fence applies to); any other is refused.
// Schema only: fences are read and answered as the `geojson` crate's `Feature`, which has no
// OpenAPI schema; `http::fences::FenceOut` is served, and documented as this.
#[derive(ToSchema, serde::Serialize)]
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
    /// Devices inside the fence now: answered by `GET /v1/fences/{id}` only, ignored in input.
    #[schema(read_only, minimum = 0)]
    pub inside: Option<u64>,
}

/// A GeoJSON geometry object.
#[derive(ToSchema, serde::Serialize)]
pub struct Geometry {
    /// `Polygon`, `MultiPolygon` or `Point`.
    #[serde(rename = "type")]
    pub kind: GeometryKind,
    /// Positions as GeoJSON nests them (`[lon, lat]`).
    pub coordinates: Vec<Value>,
}

/// Geometry types a fence may have.
#[derive(ToSchema, serde::Serialize)]
pub enum GeometryKind {
    /// Rings.
    Polygon,
    /// Several polygons.
    MultiPolygon,
    /// A circle's centre (needs `radius_m`).
    Point,
}

/// A set of fences.
// Schema only, like `FenceFeature`: `http::fences::FenceCollectionOut` is served as this.
#[derive(ToSchema, serde::Serialize)]
pub struct FenceCollection {
    /// `"FeatureCollection"`.
    #[serde(rename = "type")]
    #[schema(example = "FeatureCollection")]
    pub kind: String,
    /// The fences.
    pub features: Vec<FenceFeature>,
    /// Pass as `after` for the next page; null on the last page.
    #[schema(required = true)]
    pub next_after: Option<String>,
    /// Whether another page may hold fences (false exactly when `next_after` is null). A page
    /// may hold fewer than `limit` fences, even none, while this is true.
    pub has_more: bool,
}

/// `POST /v1/fences` body: one Feature or a FeatureCollection.
#[derive(ToSchema, serde::Serialize)]
#[serde(untagged)]
pub enum FenceBody {
    /// One fence.
    One(FenceFeature),
    /// Several (all or nothing).
    Many(FenceCollectionIn),
}

/// A set of fences to write (at least one).
// At most `max_fences`, which `tune` writes in.
#[derive(ToSchema, serde::Serialize)]
pub struct FenceCollectionIn {
    /// `"FeatureCollection"`.
    #[serde(rename = "type")]
    #[schema(example = "FeatureCollection")]
    pub kind: String,
    /// The fences.
    #[schema(min_items = 1)]
    pub features: Vec<FenceFeature>,
}

/// `POST /v1/webhooks` body: a sink definition. Durations are strings such as `"10s"`.
#[derive(ToSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookIn {
    /// Sink id.
    #[schema(pattern = r"^[A-Za-z0-9_.\-]{1,64}$")]
    pub id: String,
    /// Where events go: an `http(s)://` receiver (a signed POST per event), or
    /// `mqtt://` / `mqtts://[user:password@]host[:port]/<topic template>` (QoS 1) or
    /// `nats://[user:password@]host[:port]/<subject template>` (JetStream when a stream holds
    /// the subject); templates may hold `{fence}`, `{type}`, `{device}`.
    #[schema(example = "https://hooks.example.com/geodwell")]
    pub url: String,
    /// Standard Webhooks secret: `whsec_` and the base64 of 24 to 64 random bytes. Write-only.
    /// Required for http(s) sinks; MQTT and NATS sinks are not signed and refuse it.
    #[schema(pattern = r"^whsec_[A-Za-z0-9+/]{32,88}={0,2}$", nullable = false)]
    pub secret: Option<String>,
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

/// An OwnTracks HTTP-mode message: a location, or any other type (answered `[]`, ignored).
#[derive(ToSchema, serde::Serialize)]
#[serde(untagged)]
pub enum OwnTracksMessage {
    /// `_type: "location"`: applied as a fix.
    Location(OwnTracksLocation),
    /// Every other `_type` (`transition`, `waypoint`, `lwt`, `status`, ...).
    Other(OwnTracksOther),
}

/// An OwnTracks location.
#[derive(ToSchema, serde::Serialize)]
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
#[serde(rename_all = "lowercase")]
pub enum OwnTracksLocationType {
    /// A location.
    Location,
}

/// Any OwnTracks message that is not a location.
#[derive(ToSchema, serde::Serialize)]
pub struct OwnTracksOther {
    /// The message type.
    #[serde(rename = "_type")]
    #[schema(pattern = "^(?!location$)")]
    pub kind: String,
}

// ---------------------------------------------------------------------------------------------
// Served values whose types have no schema

/// An event (`docs/semantics.md` section 4), as polled and as sent on subscriptions.
// Schema only: events are `geodwell_core::event::Event`s (the core crate has no OpenAPI types),
// served as the JSON text the event log rendered once (`http::events::RawEvent`).
#[derive(ToSchema, serde::Serialize)]
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
    /// The fence's name at emission (absent when it has none).
    #[schema(nullable = false)]
    pub name: Option<String>,
    /// ENTER and EXIT: latitude of the fix that decided the event (the fix completing its
    /// confirmation run).
    #[schema(nullable = false, minimum = -90.0, maximum = 90.0)]
    pub lat: Option<f64>,
    /// ENTER and EXIT: longitude of the deciding fix.
    #[schema(nullable = false, minimum = -180.0, maximum = 180.0)]
    pub lon: Option<f64>,
    /// ENTER and EXIT: the deciding fix's accuracy in metres, when it reported one.
    #[schema(nullable = false, minimum = 0.0)]
    pub accuracy: Option<f64>,
}

/// Event kinds.
// Schema only: `geodwell_core::event::EventKind` (the core crate has no OpenAPI types).
#[derive(ToSchema, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKindOut {
    /// The device entered the fence.
    Enter,
    /// The device left.
    Exit,
    /// The device has been inside for a threshold.
    Dwell,
}

// ---------------------------------------------------------------------------------------------
// The running configuration's limits

/// Writes the running configuration's limits into the document, so that what it promises is
/// what this server enforces: batch sizes, the poll limit, the device id length, the most fences
/// per collection. Attributes cannot say these (they are fixed when the code is compiled; these
/// come from the configuration); every other constraint is an attribute on its type or
/// parameter, but for two that utoipa cannot express, commented below.
pub fn tune(doc: &mut utoipa::openapi::OpenApi, cfg: &Config) {
    let schemas = &mut doc.components.get_or_insert_with(Components::new).schemas;
    if let Some(RefOr::T(Schema::OneOf(body))) = schemas.get_mut(&*FixBody::name()) {
        for item in &mut body.items {
            if let RefOr::T(Schema::Array(batch)) = item {
                // `minItems` too: utoipa takes no validation attribute on the field of an enum
                // variant, and a newtype inlined there (which could carry one) comes out as an
                // `allOf` with the variant's description typed `object`, which no array matches.
                batch.min_items = Some(1);
                batch.max_items = Some(cfg.max_batch);
            }
        }
    }
    if let Some(RefOr::T(Schema::Object(fix))) = schemas.get_mut(&*FixIn::name())
        && let Some(RefOr::T(Schema::Object(device))) = fix.properties.get_mut("device")
    {
        device.max_length = Some(cfg.max_device_len);
    }
    if let Some(RefOr::T(Schema::Object(fences))) = schemas.get_mut(&*FenceCollectionIn::name())
        && let Some(RefOr::T(Schema::Array(features))) = fences.properties.get_mut("features")
    {
        features.max_items = Some(cfg.max_fences);
    }
    for path in ["/v1/events", "/v1/webhooks/{id}/dead-letters"] {
        let Some(params) = doc
            .paths
            .paths
            .get_mut(path)
            .and_then(|p| p.get.as_mut())
            .and_then(|op| op.parameters.as_mut())
        else {
            continue;
        };
        for p in params.iter_mut() {
            if let RefOr::T(p) = p
                && p.name == "limit"
                && let Some(RefOr::T(Schema::Object(limit))) = p.schema.as_mut()
            {
                limit.maximum = Some(cfg.max_poll_limit.into());
            }
        }
    }
    // OwnTracks posts an empty body when a friend is deleted and expects 200. utoipa reads an
    // optional body only from an `Option<T>` content type, whose schema then also admits a JSON
    // `null`, which is not a message (and is answered 400).
    if let Some(RefOr::T(body)) = doc
        .paths
        .paths
        .get_mut("/v1/trackers/owntracks")
        .and_then(|p| p.post.as_mut())
        .and_then(|op| op.request_body.as_mut())
    {
        body.required = Some(Required::False);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tuned(cfg: &Config) -> Value {
        let mut doc = crate::http::openapi();
        tune(&mut doc, cfg);
        serde_json::to_value(&doc).unwrap()
    }

    #[test]
    fn tune_writes_every_limit_of_the_configuration() {
        let mut cfg = Config::defaults(1);
        (cfg.max_batch, cfg.max_device_len) = (17, 23);
        (cfg.max_fences, cfg.max_poll_limit) = (29, 31);
        let d = tuned(&cfg);
        let s = &d["components"]["schemas"];
        let batch = &s["FixBody"]["oneOf"][1];
        assert_eq!(batch["type"], "array", "{batch}");
        assert_eq!(
            (&batch["minItems"], &batch["maxItems"]),
            (&json!(1), &json!(17))
        );
        assert_eq!(s["FixIn"]["properties"]["device"]["maxLength"], 23);
        let features = &s["FenceCollectionIn"]["properties"]["features"];
        assert_eq!(
            (&features["minItems"], &features["maxItems"]),
            (&json!(1), &json!(29))
        );
        for path in ["/v1/events", "/v1/webhooks/{id}/dead-letters"] {
            let params = d["paths"][path]["get"]["parameters"].as_array().unwrap();
            let limit = params.iter().find(|p| p["name"] == "limit").unwrap();
            assert_eq!(limit["schema"]["maximum"], 31, "{path}");
        }
        let owntracks = &d["paths"]["/v1/trackers/owntracks"]["post"]["requestBody"];
        assert_eq!(owntracks["required"], false);
        assert_eq!(
            owntracks["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/OwnTracksMessage"
        );
    }

    #[test]
    fn constraints_that_attributes_say_are_in_the_document() {
        let d = tuned(&Config::defaults(1));
        let param = |path: &str, name: &str| {
            d["paths"][path]["get"]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap()["schema"]
                .clone()
        };
        for path in ["/v1/events", "/v1/events/ws"] {
            assert_eq!(
                param(path, "from_seq")["maximum"],
                json!(i64::MAX),
                "{path}"
            );
        }
        assert_eq!(
            param("/v1/devices", "after")["pattern"],
            "^[0-9]{1,9}\\.[0-9]{1,18}$"
        );
        for (name, minimum) in [("accuracy", Some(0.0)), ("speed", None)] {
            let any_of = &param("/v1/trackers/osmand", name)["anyOf"];
            assert_eq!(any_of[0]["type"], "number", "{name}");
            assert_eq!(any_of[0]["minimum"].as_f64(), minimum, "{name}");
            assert_eq!(any_of[1]["type"], "string", "{name}");
            assert!(any_of[1]["pattern"].as_str().unwrap().contains("\\u3000"));
        }
    }

    #[test]
    fn the_description_points_at_the_repositorys_semantics() {
        let d = tuned(&Config::defaults(1));
        let text = d["info"]["description"].as_str().unwrap();
        assert!(text.contains("docs/semantics.md"), "{text}");
        assert!(!d.to_string().contains("DESIGN"));
    }
}
