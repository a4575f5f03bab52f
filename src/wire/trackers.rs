//! Tracker protocols mapped onto fixes: OsmAnd / Traccar Client (query or form parameters, or
//! Traccar Client 9+ JSON) and OwnTracks (HTTP-mode JSON messages). See `docs/trackers.md`.
//!
//! Owns the mapping from each protocol's wire shape onto geodwell's fix fields, nothing more:
//! a mapped location becomes a [`Fix`] through [`finish_fix`], the check every transport's
//! fixes go through.
//!
//! Invariants:
//! - A protocol-level mistake in a location (missing id, a number that is not one, a bad
//!   timestamp) is an [`ItemError`] for that item, counted as a rejected fix like a bad item of
//!   `POST /v1/fixes`; only a body that is not the protocol at all (not an object, an encrypted
//!   OwnTracks payload) is a [`BodyError`], refused before ingest.
//! - Units are converted here, once: speeds leave this module in metres per second, headings in
//!   degrees, accuracy in metres, times as Unix milliseconds.

use chrono::NaiveDateTime;
use serde_json::{Map, Value};

use super::{FixLimits, ItemError, finish_fix, integral, kind_of};
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

/// A body that is not the protocol at all: refused as a whole (400) before ingest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BodyError {
    /// The stable error code (`malformed_body`, `encryption_unsupported`).
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

impl BodyError {
    fn new(code: &'static str, message: impl Into<String>) -> BodyError {
        BodyError {
            code,
            message: message.into(),
        }
    }
}

/// Knots to metres per second (1 kn = 1852 m / 3600 s).
pub const MPS_PER_KNOT: f64 = 1852.0 / 3600.0;

/// Kilometres per hour to metres per second.
pub const MPS_PER_KMH: f64 = 1000.0 / 3600.0;

/// One location as read from a tracker protocol, in geodwell's units, before [`Fix`] validation.
///
/// [`Fix`]: geodwell_core::fix::Fix
#[derive(Debug, Clone, PartialEq)]
pub struct TrackerFix {
    /// Device id (see `docs/trackers.md` for how each protocol's id maps onto it).
    pub device: String,
    /// Event time.
    pub ts: Ts,
    /// Latitude, degrees (range checked later by `Fix::new`).
    pub lat: f64,
    /// Longitude, degrees (range checked later by `Fix::new`).
    pub lon: f64,
    /// Horizontal accuracy, metres.
    pub accuracy: Option<f64>,
    /// Speed over ground, metres per second.
    pub speed_mps: Option<f64>,
    /// Course over ground, degrees.
    pub heading_deg: Option<f64>,
}

impl TrackerFix {
    /// The validated fix, checked as every other transport's fixes are ([`finish_fix`]).
    pub fn into_fix(self, limits: &FixLimits, wall_now: Ts) -> Result<Fix, ItemError> {
        finish_fix(
            &self.device,
            self.ts,
            self.lat,
            self.lon,
            self.accuracy,
            limits,
            wall_now,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Wire helpers

/// Decodes `application/x-www-form-urlencoded` text (also a URL query) into pairs, in order:
/// `+` is a space, `%XX` a byte, invalid UTF-8 is replaced. A pair without `=` has an empty value.
pub fn parse_form(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

/// `%XX` escapes decoded (an invalid one is kept as written; invalid UTF-8 is replaced); `+`
/// is a space when `plus_is_space` (form encoding), else itself (a URL's path or user info).
pub fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let escaped = match (b.get(i + 1), b.get(i + 2)) {
            (Some(&h), Some(&l)) if b[i] == b'%' => hex(h).zip(hex(l)).map(|(h, l)| h * 16 + l),
            _ => None,
        };
        match (b[i], escaped) {
            (_, Some(byte)) => {
                out.push(byte);
                i += 2;
            }
            (b'+', None) if plus_is_space => out.push(b' '),
            (c, None) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// Reads a decimal number from text: surrounding whitespace allowed, non-finite values
/// (`NaN`, `inf`, overflow) refused, since a coordinate or speed must be a real number.
fn text_number(field: &str, value: &str) -> Result<f64, ItemError> {
    match value.trim().parse::<f64>() {
        Ok(n) if n.is_finite() => Ok(n),
        _ => Err(ItemError::InvalidFix(format!(
            "{field} must be a finite decimal number, got {value:?}"
        ))),
    }
}

/// Reads an optional JSON number field (`null` counts as absent).
fn json_number(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>, ItemError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(ItemError::InvalidFix(format!(
                "{path} is not a finite number"
            ))),
        },
        Some(other) => Err(ItemError::InvalidFix(format!(
            "{path} must be a number, got {}",
            kind_of(other)
        ))),
    }
}

fn required_json_number(obj: &Map<String, Value>, key: &str, path: &str) -> Result<f64, ItemError> {
    json_number(obj, key, path)?
        .ok_or_else(|| ItemError::MissingField(format!("{path} is required")))
}

// ---------------------------------------------------------------------------------------------
// OsmAnd / Traccar Client

/// Parses an OsmAnd `timestamp` the way Traccar's OsmAnd decoder does: an integer below
/// 2^31 - 1 is Unix seconds, a larger one Unix milliseconds; text with a `T` is ISO 8601 (an
/// offset-less time is UTC); otherwise `YYYY-MM-DD HH:MM:SS` in UTC (Traccar reads that one in
/// the server's time zone; geodwell servers keep UTC).
pub fn parse_osmand_timestamp(value: &str) -> Result<Ts, String> {
    let v = value.trim();
    let bad = |why: String| format!("timestamp {value:?} {why}");
    if let Ok(n) = v.parse::<i64>() {
        let ms = if n < i64::from(i32::MAX) {
            n.checked_mul(1000)
                .ok_or_else(|| bad("is out of range".into()))?
        } else {
            n
        };
        return Ts::from_millis(ms).map_err(|e| bad(format!("is out of range: {e}")));
    }
    let naive = if v.contains('T') {
        if let Ok(ts) = Ts::parse_rfc3339(v) {
            return Ok(ts);
        }
        NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S%.f")
    } else {
        NaiveDateTime::parse_from_str(v, "%Y-%m-%d %H:%M:%S%.f")
    };
    let dt = naive.map_err(|_| {
        bad(
            "is neither Unix seconds, Unix milliseconds, ISO 8601 nor \"YYYY-MM-DD HH:MM:SS\""
                .into(),
        )
    })?;
    Ts::from_millis(dt.and_utc().timestamp_millis())
        .map_err(|e| bad(format!("is out of range: {e}")))
}

/// Maps OsmAnd query or form parameters onto a fix.
///
/// `id` (or `deviceid`) is the device; `lat` and `lon`, or `location=lat,lon`, the position;
/// `timestamp` see [`parse_osmand_timestamp`] (absent: `arrival`, or an error when `None`);
/// `accuracy` metres; `speed` knots (converted to m/s); `bearing` (or `heading`) degrees. Empty
/// values count as absent and other parameters (`altitude`, `batt`, `hdop`, `key`, ...) are
/// ignored, as Traccar does; a repeated parameter's last value wins.
pub fn osmand_from_params(
    params: &[(String, String)],
    arrival: Option<Ts>,
) -> Result<TrackerFix, ItemError> {
    let get = |keys: &[&str]| {
        params
            .iter()
            .rev()
            .find(|(k, v)| keys.contains(&k.as_str()) && !v.trim().is_empty())
            .map(|(k, v)| (k.as_str(), v.as_str()))
    };
    let device = get(&["id", "deviceid"])
        .map(|(_, v)| v.to_string())
        .ok_or_else(|| ItemError::MissingField("id (or deviceid) is required".to_string()))?;
    let (lat, lon) = match (get(&["lat"]), get(&["lon"]), get(&["location"])) {
        (Some((_, la)), Some((_, lo)), _) => (text_number("lat", la)?, text_number("lon", lo)?),
        (None, None, Some((_, loc))) => {
            let (la, lo) = loc.split_once(',').ok_or_else(|| {
                ItemError::InvalidFix(format!("location must be \"lat,lon\", got {loc:?}"))
            })?;
            (
                text_number("location latitude", la)?,
                text_number("location longitude", lo)?,
            )
        }
        (Some(_), None, _) => return Err(ItemError::MissingField("lon is required".into())),
        (None, Some(_), _) => return Err(ItemError::MissingField("lat is required".into())),
        (None, None, None) => {
            return Err(ItemError::MissingField(
                "lat and lon (or location=lat,lon) are required".into(),
            ));
        }
    };
    let ts = match get(&["timestamp"]) {
        Some((_, t)) => parse_osmand_timestamp(t).map_err(ItemError::InvalidTs)?,
        None => arrival.ok_or_else(|| {
            ItemError::MissingField(
                "timestamp is required (the server runs in event-time mode)".to_string(),
            )
        })?,
    };
    let opt = |keys: &[&str]| -> Result<Option<f64>, ItemError> {
        get(keys).map(|(k, v)| text_number(k, v)).transpose()
    };
    Ok(TrackerFix {
        device,
        ts,
        lat,
        lon,
        accuracy: opt(&["accuracy"])?,
        speed_mps: opt(&["speed"])?.map(|kn| kn * MPS_PER_KNOT),
        heading_deg: opt(&["bearing", "heading"])?,
    })
}

/// Maps one location object of Traccar Client's JSON body (version 9 and later) onto a fix.
///
/// `{"device_id": "..", "location": {"timestamp": ISO 8601, "coords": {"latitude",
/// "longitude", "accuracy" m, "speed" m/s, "heading" deg, ..}, ..}}`. A negative `speed`,
/// `heading` or `accuracy` is the SDK's "unknown" and is dropped.
fn osmand_json_location(
    device: &Result<String, ItemError>,
    loc: &Value,
    arrival: Option<Ts>,
) -> Result<TrackerFix, ItemError> {
    let device = device.clone()?;
    let loc = loc.as_object().ok_or_else(|| {
        ItemError::InvalidFix(format!("location must be an object, got {}", kind_of(loc)))
    })?;
    let ts = match loc.get("timestamp") {
        Some(Value::String(s)) => parse_osmand_timestamp(s).map_err(ItemError::InvalidTs)?,
        None | Some(Value::Null) => arrival.ok_or_else(|| {
            ItemError::MissingField(
                "location.timestamp is required (the server runs in event-time mode)".to_string(),
            )
        })?,
        Some(other) => {
            return Err(ItemError::InvalidTs(format!(
                "location.timestamp must be an ISO 8601 string, got {}",
                kind_of(other)
            )));
        }
    };
    let coords = match loc.get("coords") {
        Some(Value::Object(c)) => c,
        None | Some(Value::Null) => {
            return Err(ItemError::MissingField(
                "location.coords is required".into(),
            ));
        }
        Some(other) => {
            return Err(ItemError::InvalidFix(format!(
                "location.coords must be an object, got {}",
                kind_of(other)
            )));
        }
    };
    let known = |x: Option<f64>| x.filter(|v| *v >= 0.0);
    Ok(TrackerFix {
        device,
        ts,
        lat: required_json_number(coords, "latitude", "location.coords.latitude")?,
        lon: required_json_number(coords, "longitude", "location.coords.longitude")?,
        accuracy: known(json_number(coords, "accuracy", "location.coords.accuracy")?),
        speed_mps: known(json_number(coords, "speed", "location.coords.speed")?),
        heading_deg: known(json_number(coords, "heading", "location.coords.heading")?),
    })
}

/// Maps a Traccar Client JSON body onto its fixes: one per `location` (an object, or an array
/// of them as the location SDK sends in batch mode). `Err` when the body is not an object at
/// all (refused before ingest, like a `/v1/fixes` body that is neither object nor array).
pub fn osmand_from_json(
    body: &Value,
    arrival: Option<Ts>,
) -> Result<Vec<Result<TrackerFix, ItemError>>, String> {
    let obj = body
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, got {}", kind_of(body)))?;
    let device = match obj.get("device_id") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(ItemError::MissingField(
            "device_id must be a non-empty string".to_string(),
        )),
        None | Some(Value::Null) => {
            Err(ItemError::MissingField("device_id is required".to_string()))
        }
        Some(other) => Err(ItemError::InvalidFix(format!(
            "device_id must be a string, got {}",
            kind_of(other)
        ))),
    };
    Ok(match obj.get("location") {
        Some(Value::Array(locs)) => locs
            .iter()
            .map(|l| osmand_json_location(&device, l, arrival))
            .collect(),
        Some(loc) => vec![osmand_json_location(&device, loc, arrival)],
        None => {
            vec![
                device
                    .and_then(|_| Err(ItemError::MissingField("location is required".to_string()))),
            ]
        }
    })
}

// ---------------------------------------------------------------------------------------------
// OwnTracks

/// Where an OwnTracks message's device id can come from, in the order they are tried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnTracksIdentity {
    /// `X-Limit-U` header, else the `u` query parameter (the Recorder's user).
    pub user: Option<String>,
    /// `X-Limit-D` header, else the `d` query parameter (the Recorder's device).
    pub device: Option<String>,
}

/// The device id of an OwnTracks location: `user/device` from the Recorder's identification
/// (`X-Limit-U` / `X-Limit-D` headers or `?u=&d=`; either alone is used alone); else the
/// message's `topic` without its `owntracks/` prefix (`owntracks/jane/phone` -> `jane/phone`);
/// else its `tid`.
pub fn owntracks_device(ident: &OwnTracksIdentity, msg: &Map<String, Value>) -> Option<String> {
    fn nonempty(s: &Option<String>) -> Option<&str> {
        s.as_deref().map(str::trim).filter(|s| !s.is_empty())
    }
    match (nonempty(&ident.user), nonempty(&ident.device)) {
        (Some(u), Some(d)) => return Some(format!("{u}/{d}")),
        (Some(one), None) | (None, Some(one)) => return Some(one.to_string()),
        (None, None) => {}
    }
    let text = |k: &str| match msg.get(k) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim()),
        _ => None,
    };
    if let Some(topic) = text("topic") {
        let rest = topic.strip_prefix("owntracks/").unwrap_or(topic);
        if !rest.is_empty() {
            return Some(rest.to_string());
        }
    }
    text("tid").map(str::to_string)
}

/// What an OwnTracks message asks of geodwell.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnTracksMessage {
    /// A `_type: location` message, mapped (or why it cannot be).
    Location(Result<TrackerFix, ItemError>),
    /// Any other `_type` (`transition`, `waypoint`, `lwt`, `status`, `card`, ...), or an empty
    /// body: acknowledged, not a fix.
    Ignored(String),
}

/// Maps one OwnTracks message (the JSON body of one HTTP-mode POST) onto a fix.
///
/// `lat`, `lon` degrees and `tst` Unix seconds are required; `acc` metres; `vel` km/h
/// (converted to m/s); `cog` degrees. `Err` when the body is not an OwnTracks message at all
/// (not an object, no `_type`) or is `encrypted`, which geodwell cannot read.
pub fn owntracks_from_json(
    body: &Value,
    ident: &OwnTracksIdentity,
) -> Result<OwnTracksMessage, BodyError> {
    let obj = body.as_object().ok_or_else(|| {
        BodyError::new(
            "malformed_body",
            format!(
                "expected one OwnTracks message (a JSON object), got {}",
                kind_of(body)
            ),
        )
    })?;
    let kind = match obj.get("_type") {
        Some(Value::String(s)) => s.as_str(),
        _ => {
            return Err(BodyError::new(
                "malformed_body",
                "an OwnTracks message needs a string _type",
            ));
        }
    };
    match kind {
        "location" => {}
        "encrypted" => {
            return Err(BodyError::new(
                "encryption_unsupported",
                "geodwell cannot decrypt OwnTracks payloads; turn off encryption in the app",
            ));
        }
        other => return Ok(OwnTracksMessage::Ignored(other.to_string())),
    }
    Ok(OwnTracksMessage::Location(owntracks_location(obj, ident)))
}

fn owntracks_location(
    obj: &Map<String, Value>,
    ident: &OwnTracksIdentity,
) -> Result<TrackerFix, ItemError> {
    for k in ["tid", "topic"] {
        if let Some(v) = obj.get(k)
            && !v.is_string()
            && !v.is_null()
        {
            return Err(ItemError::InvalidFix(format!(
                "{k} must be a string, got {}",
                kind_of(v)
            )));
        }
    }
    let device = owntracks_device(ident, obj).ok_or_else(|| ItemError::MissingField("no device id: send X-Limit-U/X-Limit-D (set user and device id in the app), or a topic or tid"
            .to_string()))?;
    let ts = match obj.get("tst") {
        None | Some(Value::Null) => return Err(ItemError::MissingField("tst is required".into())),
        Some(Value::Number(n)) => {
            let secs = integral(n).ok_or_else(|| {
                ItemError::InvalidTs(format!("tst must be integer Unix seconds, got {n}"))
            })?;
            secs.checked_mul(1000)
                .ok_or_else(|| ItemError::InvalidTs(format!("tst {secs} is out of range")))
                .and_then(|ms| {
                    Ts::from_millis(ms).map_err(|e| {
                        ItemError::InvalidTs(format!("tst {secs} is out of range: {e}"))
                    })
                })?
        }
        Some(other) => {
            return Err(ItemError::InvalidTs(format!(
                "tst must be integer Unix seconds, got {}",
                kind_of(other)
            )));
        }
    };
    Ok(TrackerFix {
        device,
        ts,
        lat: required_json_number(obj, "lat", "lat")?,
        lon: required_json_number(obj, "lon", "lon")?,
        accuracy: json_number(obj, "acc", "acc")?,
        speed_mps: json_number(obj, "vel", "vel")?.map(|kmh| kmh * MPS_PER_KMH),
        heading_deg: json_number(obj, "cog", "cog")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(q: &str) -> Vec<(String, String)> {
        parse_form(q)
    }

    const T: i64 = 1_377_177_267;

    #[test]
    fn form_decoding_handles_plus_percent_and_bare_keys() {
        assert_eq!(
            parse_form("a=1&b=x+y&c=2016-01-27T18%3A55%3A47Z&flag&&d=%zz%4"),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "2016-01-27T18:55:47Z".into()),
                ("flag".into(), String::new()),
                ("d".into(), "%zz%4".into()),
            ]
        );
        assert_eq!(
            parse_form("k%C3%A9=%C3%A9"),
            vec![("ké".into(), "é".into())]
        );
    }

    #[test]
    fn osmand_timestamps_follow_traccar() {
        let p = |s: &str| parse_osmand_timestamp(s);
        let rfc = |s: &str| Ok(Ts::parse_rfc3339(s).unwrap());
        assert_eq!(p("1377177267"), Ok(Ts(T * 1000)), "seconds");
        assert_eq!(
            p("1442068686579"),
            Ok(Ts(1_442_068_686_579)),
            "milliseconds"
        );
        assert_eq!(
            p("2147483646"),
            Ok(Ts(2_147_483_646_000)),
            "just below 2^31-1 is still seconds"
        );
        assert_eq!(
            p("2147483647"),
            Ok(Ts(2_147_483_647)),
            "from 2^31-1 on, milliseconds"
        );
        assert_eq!(p("2016-01-27T18:55:47Z"), rfc("2016-01-27T18:55:47Z"));
        assert_eq!(
            p("2025-06-15T13:45:12.862+02:00"),
            rfc("2025-06-15T11:45:12.862Z")
        );
        assert_eq!(
            p("2016-01-27T18:55:47"),
            rfc("2016-01-27T18:55:47Z"),
            "no offset: UTC"
        );
        assert_eq!(p("2014-06-04 09:10:11"), rfc("2014-06-04T09:10:11Z"));
        for bad in [
            "yesterday",
            "",
            "12:00",
            "2014-13-04 09:10:11",
            "-5",
            "1.5e9",
            "2016-01-27T",
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains("timestamp"), "{bad}: {e}");
        }
    }

    #[test]
    fn osmand_params_map_every_documented_field() {
        // Traccar Client (Android) ProtocolFormatter's parameter set.
        let f = osmand_from_params(
            &params("id=123456&timestamp=1377177267&lat=60.0&lon=30.0&speed=10.0&bearing=90.5&altitude=12&accuracy=7.5&batt=87&mock=true"),
            None,
        )
        .unwrap();
        assert_eq!(
            f,
            TrackerFix {
                device: "123456".into(),
                ts: Ts(T * 1000),
                lat: 60.0,
                lon: 30.0,
                accuracy: Some(7.5),
                speed_mps: Some(10.0 * 1852.0 / 3600.0),
                heading_deg: Some(90.5),
            }
        );
        assert!((f.speed_mps.unwrap() - 5.144_444).abs() < 1e-6, "10 kn");
        // deviceid, location=lat,lon, heading; no timestamp takes the arrival time.
        let f = osmand_from_params(
            &params("deviceid=abc&location=60.5,-30.25&heading=45&speed="),
            Some(Ts(5)),
        )
        .unwrap();
        assert_eq!(
            (
                f.device.as_str(),
                f.lat,
                f.lon,
                f.ts,
                f.heading_deg,
                f.speed_mps
            ),
            ("abc", 60.5, -30.25, Ts(5), Some(45.0), None)
        );
        // The last of a repeated parameter wins; empty values are absent.
        let f = osmand_from_params(&params("id=a&id=b&id=&lat=1&lon=2&timestamp=7"), None).unwrap();
        assert_eq!(f.device, "b");
        // Out-of-range values pass here: Fix::new is the one place that range-checks.
        assert_eq!(
            osmand_from_params(&params("id=a&lat=91&lon=2&timestamp=7"), None)
                .unwrap()
                .lat,
            91.0
        );
    }

    #[test]
    fn osmand_param_errors_name_the_field() {
        let err = |q: &str, arrival: Option<Ts>| {
            pair(osmand_from_params(&params(q), arrival).unwrap_err())
        };
        assert_eq!(err("lat=1&lon=2&timestamp=1", None).0, "missing_field");
        assert!(err("lat=1&lon=2&timestamp=1", None).1.contains("id"));
        assert_eq!(
            err("id=a&lon=2&timestamp=1", None),
            ("missing_field", "lat is required".into())
        );
        assert_eq!(
            err("id=a&lat=2&timestamp=1", None),
            ("missing_field", "lon is required".into())
        );
        assert_eq!(err("id=a&timestamp=1", None).0, "missing_field");
        let (code, msg) = err("id=a&lat=abc&lon=2&timestamp=1", None);
        assert_eq!(code, "invalid_fix");
        assert!(msg.contains("lat") && msg.contains("abc"), "{msg}");
        for q in [
            "id=a&lat=NaN&lon=2&timestamp=1",
            "id=a&lat=1&lon=inf&timestamp=1",
        ] {
            assert_eq!(err(q, None).0, "invalid_fix", "{q}");
        }
        assert_eq!(
            err("id=a&lat=1&lon=2&timestamp=1&speed=fast", None).0,
            "invalid_fix"
        );
        assert_eq!(err("id=a&location=1;2&timestamp=1", None).0, "invalid_fix");
        assert_eq!(
            err("id=a&lat=1&lon=2&timestamp=yesterday", None).0,
            "invalid_ts"
        );
        // No timestamp in event mode (no arrival time to use).
        let (code, msg) = err("id=a&lat=1&lon=2", None);
        assert_eq!(code, "missing_field");
        assert!(msg.contains("timestamp"), "{msg}");
    }

    #[test]
    fn traccar_client_json_maps_coords_and_drops_unknowns() {
        // Shapes from Traccar's OsmAndProtocolDecoderTest (testDecodeJson).
        let v: Value = serde_json::from_str(r#"{"location":{"event":"motionchange","is_moving":false,"uuid":"0e9a2473-a9a7-4c00-997b-fb97d2154e75","timestamp":"2021-07-21T08:06:34.444Z","odometer":0,"coords":{"latitude":-6.1148096,"longitude":106.6837015,"accuracy":3.8,"speed":18.67,"speed_accuracy":0.26,"heading":63,"heading_accuracy":0.28,"altitude":35.7,"altitude_accuracy":3.8},"activity":{"type":"still","confidence":100},"battery":{"is_charging":false,"level":0.79},"extras":{}},"device_id":"8737767034"}"#).unwrap();
        let fixes = osmand_from_json(&v, None).unwrap();
        assert_eq!(
            fixes,
            vec![Ok(TrackerFix {
                device: "8737767034".into(),
                ts: Ts::parse_rfc3339("2021-07-21T08:06:34.444Z").unwrap(),
                lat: -6.1148096,
                lon: 106.6837015,
                accuracy: Some(3.8),
                speed_mps: Some(18.67),
                heading_deg: Some(63.0),
            })]
        );
        let v: Value = serde_json::from_str(r#"{"location":{"extras":{},"mock":true,"coords":{"speed_accuracy":-1,"speed":-1,"longitude":-122.406417,"ellipsoidal_altitude":0,"floor":null,"heading_accuracy":-1,"latitude":37.785834000000001,"accuracy":5,"altitude_accuracy":-1,"altitude":0,"heading":-1},"is_moving":false,"age":188,"odometer":0,"uuid":"2FB04C65-99CF-42AB-8DD3-EBCB4B108BF8","event":"motionchange","battery":{"level":-1,"is_charging":false},"activity":{"type":"unknown","confidence":100},"timestamp":"2025-05-09T04:11:30.579Z"},"device_id":"658765"}"#).unwrap();
        let f = osmand_from_json(&v, None).unwrap().remove(0).unwrap();
        assert_eq!(
            (f.speed_mps, f.heading_deg, f.accuracy),
            (None, None, Some(5.0))
        );
        // Batch mode: an array of locations, one fix each.
        let v = json!({"device_id": "d", "location": [
            {"timestamp": "2025-01-01T00:00:00Z", "coords": {"latitude": 1.0, "longitude": 2.0}},
            {"timestamp": "2025-01-01T00:00:01Z", "coords": {"latitude": "x", "longitude": 2.0}},
        ]});
        let fixes = osmand_from_json(&v, None).unwrap();
        assert_eq!(fixes.len(), 2);
        assert!(fixes[0].is_ok());
        assert_eq!(
            fixes[1].as_ref().unwrap_err().code().as_str(),
            "invalid_fix"
        );
    }

    #[test]
    fn traccar_client_json_errors() {
        let one = |v: Value| pair(osmand_from_json(&v, None).unwrap().remove(0).unwrap_err());
        let coords = json!({"latitude": 1.0, "longitude": 2.0});
        let loc = json!({"timestamp": "2025-01-01T00:00:00Z", "coords": coords});
        assert_eq!(one(json!({"location": loc})).0, "missing_field");
        assert_eq!(
            one(json!({"device_id": 5, "location": loc})).0,
            "invalid_fix"
        );
        assert_eq!(one(json!({"device_id": "d"})).0, "missing_field");
        assert_eq!(
            one(json!({"device_id": "d", "location": {"coords": coords}})).0,
            "missing_field",
            "no timestamp in event mode"
        );
        assert_eq!(
            one(json!({"device_id": "d", "location": {"timestamp": "soon", "coords": coords}})).0,
            "invalid_ts"
        );
        assert_eq!(
            one(json!({"device_id": "d", "location": {"timestamp": 5, "coords": coords}})).0,
            "invalid_ts"
        );
        assert_eq!(
            one(json!({"device_id": "d", "location": {"timestamp": "2025-01-01T00:00:00Z"}})).0,
            "missing_field"
        );
        let e = one(
            json!({"device_id": "d", "location": {"timestamp": "2025-01-01T00:00:00Z", "coords": {"latitude": 1.0}}}),
        );
        assert_eq!(
            e,
            (
                "missing_field",
                "location.coords.longitude is required".into()
            )
        );
        assert!(osmand_from_json(&json!([1]), None).is_err());
    }

    fn ident(u: Option<&str>, d: Option<&str>) -> OwnTracksIdentity {
        OwnTracksIdentity {
            user: u.map(str::to_string),
            device: d.map(str::to_string),
        }
    }

    #[test]
    fn owntracks_device_id_precedence() {
        let msg = |v: Value| v.as_object().unwrap().clone();
        let full = msg(json!({"topic": "owntracks/jane/phone", "tid": "JJ"}));
        assert_eq!(
            owntracks_device(&ident(Some("bob"), Some("car")), &full).as_deref(),
            Some("bob/car"),
            "the Recorder's user/device first"
        );
        assert_eq!(
            owntracks_device(&ident(Some("bob"), None), &full).as_deref(),
            Some("bob")
        );
        assert_eq!(
            owntracks_device(&ident(None, Some("car")), &full).as_deref(),
            Some("car")
        );
        assert_eq!(
            owntracks_device(&ident(Some(" "), None), &full).as_deref(),
            Some("jane/phone"),
            "then the topic, without owntracks/"
        );
        assert_eq!(
            owntracks_device(
                &ident(None, None),
                &msg(json!({"topic": "fleet/7", "tid": "JJ"}))
            )
            .as_deref(),
            Some("fleet/7")
        );
        assert_eq!(
            owntracks_device(&ident(None, None), &msg(json!({"tid": "JJ"}))).as_deref(),
            Some("JJ"),
            "then the tid"
        );
        assert_eq!(
            owntracks_device(&ident(None, None), &msg(json!({"tid": ""}))),
            None
        );
    }

    #[test]
    fn owntracks_location_maps_units() {
        // The booklet's example location (owntracks.org/booklet/tech/json/), tid only.
        let v = json!({"_type": "location", "acc": 75, "alt": 13, "batt": 80, "cog": 270, "lat": 48.85833, "lon": 2.29513, "tid": "JJ", "tst": 1_376_715_317, "vac": 10, "vel": 54, "conn": "w"});
        let OwnTracksMessage::Location(Ok(f)) =
            owntracks_from_json(&v, &ident(None, None)).unwrap()
        else {
            panic!("a location");
        };
        assert_eq!(
            f,
            TrackerFix {
                device: "JJ".into(),
                ts: Ts(1_376_715_317_000),
                lat: 48.85833,
                lon: 2.29513,
                accuracy: Some(75.0),
                speed_mps: Some(54.0 / 3.6),
                heading_deg: Some(270.0),
            }
        );
        assert!(
            (f.speed_mps.unwrap() - 15.0).abs() < 1e-9,
            "54 km/h = 15 m/s"
        );
    }

    #[test]
    fn owntracks_other_types_are_ignored_and_bad_locations_explained() {
        let id = ident(Some("u"), Some("d"));
        for t in [
            "transition",
            "waypoint",
            "waypoints",
            "lwt",
            "status",
            "card",
            "cmd",
            "beacon",
            "steps",
        ] {
            assert_eq!(
                owntracks_from_json(&json!({"_type": t, "lat": 1.0, "lon": 2.0, "tst": 5}), &id)
                    .unwrap(),
                OwnTracksMessage::Ignored(t.into())
            );
        }
        let loc_err = |v: Value| match owntracks_from_json(&v, &id).unwrap() {
            OwnTracksMessage::Location(Err(e)) => pair(e),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            loc_err(json!({"_type": "location", "lat": 1.0, "lon": 2.0})).0,
            "missing_field"
        );
        assert_eq!(
            loc_err(json!({"_type": "location", "lat": 1.0, "lon": 2.0, "tst": 1.5})).0,
            "invalid_ts"
        );
        assert_eq!(
            loc_err(json!({"_type": "location", "lat": 1.0, "lon": 2.0, "tst": "1"})).0,
            "invalid_ts"
        );
        assert_eq!(
            loc_err(json!({"_type": "location", "lat": 1.0, "lon": 2.0, "tst": -1})).0,
            "invalid_ts"
        );
        assert_eq!(
            loc_err(json!({"_type": "location", "lat": "1", "lon": 2.0, "tst": 1})).0,
            "invalid_fix"
        );
        assert_eq!(
            loc_err(json!({"_type": "location", "lon": 2.0, "tst": 1})),
            ("missing_field", "lat is required".into())
        );
        let no_id = owntracks_from_json(
            &json!({"_type": "location", "lat": 1.0, "lon": 2.0, "tst": 1}),
            &ident(None, None),
        )
        .unwrap();
        assert!(matches!(
            no_id,
            OwnTracksMessage::Location(Err(ItemError::MissingField(_)))
        ));
        // Not OwnTracks at all, or encrypted: refused before ingest.
        for v in [
            json!([]),
            json!({"lat": 1}),
            json!({"_type": 3}),
            json!({"_type": "encrypted", "data": "x"}),
        ] {
            let e = owntracks_from_json(&v, &id).unwrap_err();
            assert!(
                matches!(e.code, "malformed_body" | "encryption_unsupported"),
                "{v}: {e:?}"
            );
        }
    }

    #[test]
    fn into_fix_validates_like_every_transport() {
        let f = TrackerFix {
            device: "d".into(),
            ts: Ts(1_000),
            lat: 1.5,
            lon: 2.5,
            accuracy: None,
            speed_mps: Some(3.0),
            heading_deg: None,
        };
        let limits = FixLimits::default();
        let fix = f.clone().into_fix(&limits, Ts(0)).unwrap();
        assert_eq!((fix.ts, fix.lat, fix.lon), (Ts(1_000), 1.5, 2.5));
        assert_eq!(
            f.clone().into_fix(&limits, Ts(-61_000)).unwrap_err().code(),
            super::super::ItemCode::FutureTs
        );
        let far = TrackerFix { lat: 91.0, ..f };
        assert_eq!(
            far.into_fix(&limits, Ts(0)).unwrap_err().code(),
            super::super::ItemCode::InvalidFix
        );
    }

    /// (code, message): the shape the assertions below were written in.
    fn pair(e: ItemError) -> (&'static str, String) {
        (e.code().as_str(), e.to_string())
    }
}
