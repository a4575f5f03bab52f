//! GeoJSON in and out: validation of fences with every error reported at once, each with the
//! JSON path of the offending value (`features[3].properties.dwell[1]`,
//! `geometry.coordinates[0][5]`), and the normalized GeoJSON a fence is served back as.
//!
//! Rules (bounds, defaults, antimeridian) are listed in `docs/fences.md`; this module is their
//! single implementation, and the typed constructors ([`Fence::new_circle`],
//! [`Fence::new_polygon`]) go through it too so no fence skips validation.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use geojson::feature::Id;
use geojson::{Feature, GeoJson, Geometry, GeometryValue, JsonObject, Position};
use serde_json::Value;
use thiserror::Error;

use super::edges::{EDGE_INDEX_THRESHOLD, PolyPart};
use super::{
    Circle, DEFAULT_CONFIRM_WITHIN, DEFAULT_STALE_AFTER, Fence, FenceSettings, MAX_CONFIRM,
    MAX_ID_BYTES, MAX_NAME_BYTES, MAX_THRESHOLDS, Shape,
};
use crate::time::{Dur, Ts};

/// Property names a fence Feature may carry; any other name is an error.
pub const KNOWN_PROPERTIES: &[&str] = &[
    "dwell",
    "exit_buffer_m",
    "enter_confirm",
    "exit_confirm",
    "confirm_within",
    "stale_after",
    "max_accuracy_m",
    "radius_m",
    "tags",
    "name",
];

/// Size limits applied while validating fences.
#[derive(Debug, Clone, PartialEq)]
pub struct FenceLimits {
    /// Most positions in one fence, over all rings and parts (closing positions included).
    pub max_vertices: usize,
    /// Largest circle radius, metres.
    pub max_radius_m: f64,
    /// Largest `exit_buffer_m`, metres (bounds the edge search of the hysteresis test).
    pub max_exit_buffer_m: f64,
    /// Most errors reported for one call; the rest are summarized by one
    /// [`FenceErrorKind::TooManyErrors`].
    pub max_errors: usize,
    /// Polygon parts with at least this many edges get the edge grid (tests lower it to
    /// exercise the index on small polygons).
    pub index_threshold: usize,
}

impl Default for FenceLimits {
    /// 100,000 vertices, 1,000 km radius, 100 km exit buffer, 100 errors, index from
    /// [`EDGE_INDEX_THRESHOLD`] edges.
    fn default() -> FenceLimits {
        FenceLimits {
            max_vertices: 100_000,
            max_radius_m: 1_000_000.0,
            max_exit_buffer_m: 100_000.0,
            max_errors: 100,
            index_threshold: EDGE_INDEX_THRESHOLD,
        }
    }
}

/// What is wrong with one value of a fence.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FenceErrorKind {
    /// The document is not a Feature or FeatureCollection.
    #[error("expected a GeoJSON Feature or FeatureCollection, found {found}")]
    NotAFeature {
        /// The GeoJSON type found.
        found: String,
    },
    /// The text is not GeoJSON.
    #[error("not valid GeoJSON: {0}")]
    Json(String),
    /// The Feature has no geometry.
    #[error("a fence needs a geometry (Polygon, MultiPolygon, or Point with radius_m)")]
    MissingGeometry,
    /// A geometry type that cannot be a fence.
    #[error(
        "unsupported geometry type {found}: use Polygon, MultiPolygon, or Point with properties.radius_m for a circle"
    )]
    UnsupportedGeometry {
        /// The GeoJSON geometry type.
        found: String,
    },
    /// A Point geometry without `radius_m`.
    #[error("a Point fence is a circle and needs properties.radius_m")]
    MissingRadius,
    /// `radius_m` on a polygon.
    #[error("radius_m applies only to Point (circle) fences")]
    RadiusOnPolygon,
    /// Radius not in `(0, max]`.
    #[error("radius_m must be > 0 and <= {max} m (got {value})")]
    RadiusOutOfRange {
        /// The value given.
        value: f64,
        /// The limit.
        max: f64,
    },
    /// A position with fewer than two numbers.
    #[error("a position needs [lon, lat] (got {len} numbers)")]
    BadPosition {
        /// How many numbers it had.
        len: usize,
    },
    /// NaN or infinite coordinate.
    #[error("coordinate is not a finite number")]
    NonFinite,
    /// Longitude outside [-180, 180].
    #[error("longitude {0} is outside [-180, 180]")]
    LonOutOfRange(f64),
    /// Latitude outside [-90, 90].
    #[error("latitude {0} is outside [-90, 90]")]
    LatOutOfRange(f64),
    /// Fewer than 4 positions in a ring.
    #[error("a ring needs at least 4 positions, first repeated as last (got {len})")]
    RingTooShort {
        /// Positions given.
        len: usize,
    },
    /// First and last positions of a ring differ.
    #[error("ring is not closed: its first and last positions differ")]
    RingNotClosed,
    /// A Polygon without rings or a MultiPolygon without polygons.
    #[error("a polygon needs at least one ring (a MultiPolygon at least one polygon)")]
    EmptyPolygon,
    /// More positions than [`FenceLimits::max_vertices`].
    #[error("{count} positions exceed the limit of {max} per fence")]
    TooManyVertices {
        /// Positions given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An edge spanning more than 180° of longitude (a polygon crossing the antimeridian).
    #[error(
        "edge from longitude {from} to {to} spans more than 180°: polygons may not cross the antimeridian; split the polygon at ±180° into a MultiPolygon (RFC 7946 §3.1.9)"
    )]
    AntimeridianEdge {
        /// Longitude of the edge's start.
        from: f64,
        /// Longitude of the edge's end.
        to: f64,
    },
    /// No id in the Feature and none given.
    #[error("a fence needs an id (Feature id, string or number)")]
    MissingId,
    /// An id that is empty, too long or not printable.
    #[error("bad fence id: {0}")]
    BadId(&'static str),
    /// Feature id differs from the id given by the caller (e.g. the URL of a PUT).
    #[error("Feature id {feature_id:?} does not match the fence id {expected:?}")]
    IdMismatch {
        /// Id in the Feature.
        feature_id: String,
        /// Id given by the caller.
        expected: String,
    },
    /// The same id twice in one collection.
    #[error("duplicate fence id {0:?} in this collection")]
    DuplicateId(String),
    /// A property name that is not in [`KNOWN_PROPERTIES`].
    #[error(
        "unknown property {0:?} (known: dwell, exit_buffer_m, enter_confirm, exit_confirm, confirm_within, stale_after, max_accuracy_m, radius_m, tags, name)"
    )]
    UnknownProperty(String),
    /// A value of the wrong JSON type.
    #[error("expected {0}")]
    WrongType(&'static str),
    /// Not a duration.
    #[error(
        "not a duration (expected e.g. \"90s\", \"10m\", \"1h\", \"2d\" or a number of seconds): {0}"
    )]
    BadDuration(String),
    /// A duration or number that must be positive.
    #[error("must be > 0")]
    NotPositive,
    /// A number outside its bounds.
    #[error("{value} is outside [{min}, {max}]")]
    OutOfRange {
        /// The value given.
        value: f64,
        /// Lower bound (inclusive).
        min: f64,
        /// Upper bound (inclusive).
        max: f64,
    },
    /// More than [`MAX_THRESHOLDS`] dwell thresholds.
    #[error("{count} dwell thresholds exceed the limit of {max}")]
    TooManyThresholds {
        /// Thresholds given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A string longer than allowed.
    #[error("longer than {max} bytes")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// Error reporting stopped at [`FenceLimits::max_errors`].
    #[error("{more} more errors not shown")]
    TooManyErrors {
        /// Errors not listed.
        more: usize,
    },
}

/// One validation error: where (a JSON path; empty for the whole document) and what.
#[derive(Debug, Clone, PartialEq, Error)]
pub struct FenceError {
    /// JSON path of the offending value, e.g. `features[3].properties.dwell[1]`.
    pub path: String,
    /// What is wrong with it.
    pub kind: FenceErrorKind,
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.path, self.kind)
        }
    }
}

/// Every error found in one validation call (never empty).
#[derive(Debug, Clone, PartialEq, Error)]
pub struct FenceErrors(pub Vec<FenceError>);

impl FenceErrors {
    /// The errors, in document order.
    pub fn errors(&self) -> &[FenceError] {
        &self.0
    }
}

impl fmt::Display for FenceErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} fence error{}: ", if n == 1 { "" } else { "s" })?;
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Error collector with a cap, so a 100k-vertex polygon of garbage yields a readable answer.
struct Errs {
    list: Vec<FenceError>,
    max: usize,
    suppressed: usize,
}

impl Errs {
    fn new(max: usize) -> Errs {
        Errs {
            list: Vec::new(),
            max: max.max(1),
            suppressed: 0,
        }
    }

    fn push(&mut self, path: String, kind: FenceErrorKind) {
        if self.list.len() < self.max {
            self.list.push(FenceError { path, kind });
        } else {
            self.suppressed += 1;
        }
    }

    fn count(&self) -> usize {
        self.list.len() + self.suppressed
    }

    fn into_result<T>(mut self, value: Option<T>) -> Result<T, FenceErrors> {
        if self.suppressed > 0 {
            let more = self.suppressed;
            self.push_final(more);
        }
        match value {
            Some(v) if self.list.is_empty() => Ok(v),
            _ => {
                if self.list.is_empty() {
                    // Defensive: a failed build always records why; never return an empty set.
                    self.list.push(FenceError {
                        path: String::new(),
                        kind: FenceErrorKind::MissingGeometry,
                    });
                }
                Err(FenceErrors(self.list))
            }
        }
    }

    fn push_final(&mut self, more: usize) {
        self.list.push(FenceError {
            path: String::new(),
            kind: FenceErrorKind::TooManyErrors { more },
        });
    }
}

/// Validates one ring; returns its positions when valid.
fn check_ring(ring: &[Position], path: &str, errs: &mut Errs) -> Option<Vec<[f64; 2]>> {
    let mut ok = true;
    if ring.len() < 4 {
        errs.push(
            path.to_string(),
            FenceErrorKind::RingTooShort { len: ring.len() },
        );
        ok = false;
    }
    let mut out = Vec::with_capacity(ring.len());
    for (k, pos) in ring.iter().enumerate() {
        let s = pos.as_slice();
        if s.len() < 2 {
            errs.push(
                format!("{path}[{k}]"),
                FenceErrorKind::BadPosition { len: s.len() },
            );
            ok = false;
            continue;
        }
        if let Some(p) = check_lon_lat(s[0], s[1], || format!("{path}[{k}]"), errs) {
            out.push(p);
        } else {
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    if out.first() != out.last() {
        errs.push(path.to_string(), FenceErrorKind::RingNotClosed);
        ok = false;
    }
    for (k, w) in out.windows(2).enumerate() {
        if (w[1][0] - w[0][0]).abs() > 180.0 {
            errs.push(
                format!("{path}[{}]", k + 1),
                FenceErrorKind::AntimeridianEdge {
                    from: w[0][0],
                    to: w[1][0],
                },
            );
            ok = false;
        }
    }
    ok.then_some(out)
}

fn check_lon_lat(
    lon: f64,
    lat: f64,
    path: impl Fn() -> String,
    errs: &mut Errs,
) -> Option<[f64; 2]> {
    if !(lon.is_finite() && lat.is_finite()) {
        errs.push(path(), FenceErrorKind::NonFinite);
        return None;
    }
    let mut ok = true;
    if !(-180.0..=180.0).contains(&lon) {
        errs.push(path(), FenceErrorKind::LonOutOfRange(lon));
        ok = false;
    }
    if !(-90.0..=90.0).contains(&lat) {
        errs.push(path(), FenceErrorKind::LatOutOfRange(lat));
        ok = false;
    }
    ok.then_some([lon, lat])
}

fn check_polygon(
    rings: &[Vec<Position>],
    path: &str,
    errs: &mut Errs,
) -> Option<Vec<Vec<[f64; 2]>>> {
    if rings.is_empty() {
        errs.push(path.to_string(), FenceErrorKind::EmptyPolygon);
        return None;
    }
    let mut out = Vec::with_capacity(rings.len());
    let mut ok = true;
    for (i, r) in rings.iter().enumerate() {
        match check_ring(r, &format!("{path}[{i}]"), errs) {
            Some(r) => out.push(r),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn check_vertex_count(count: usize, path: &str, limits: &FenceLimits, errs: &mut Errs) -> bool {
    if count > limits.max_vertices {
        errs.push(
            path.to_string(),
            FenceErrorKind::TooManyVertices {
                count,
                max: limits.max_vertices,
            },
        );
        return false;
    }
    true
}

/// Validates the geometry (and `radius_m` for a circle).
fn check_geometry(
    geom: Option<&Geometry>,
    props: Option<&JsonObject>,
    prefix: &str,
    limits: &FenceLimits,
    errs: &mut Errs,
) -> Option<Shape> {
    let Some(g) = geom else {
        errs.push(format!("{prefix}geometry"), FenceErrorKind::MissingGeometry);
        return None;
    };
    let cpath = format!("{prefix}geometry.coordinates");
    match &g.value {
        GeometryValue::Point { coordinates } => {
            let s = coordinates.as_slice();
            let center = if s.len() < 2 {
                errs.push(cpath, FenceErrorKind::BadPosition { len: s.len() });
                None
            } else {
                check_lon_lat(s[0], s[1], || cpath.clone(), errs)
            };
            let rpath = format!("{prefix}properties.radius_m");
            let radius = match props.and_then(|p| p.get("radius_m")) {
                None | Some(Value::Null) => {
                    errs.push(format!("{prefix}properties"), FenceErrorKind::MissingRadius);
                    None
                }
                Some(v) => match v.as_f64() {
                    None => {
                        errs.push(rpath, FenceErrorKind::WrongType("a number of metres"));
                        None
                    }
                    Some(r) if r > 0.0 && r <= limits.max_radius_m => Some(r),
                    Some(r) => {
                        errs.push(
                            rpath,
                            FenceErrorKind::RadiusOutOfRange {
                                value: r,
                                max: limits.max_radius_m,
                            },
                        );
                        None
                    }
                },
            };
            let ([lon, lat], radius_m) = (center?, radius?);
            Some(Shape::Circle(Circle { lon, lat, radius_m }))
        }
        GeometryValue::Polygon { coordinates } => {
            let count = coordinates.iter().map(Vec::len).sum();
            if !check_vertex_count(count, &cpath, limits, errs) {
                return None;
            }
            let rings = check_polygon(coordinates, &cpath, errs)?;
            Some(Shape::Polygons {
                parts: vec![Arc::new(PolyPart::new(rings, limits.index_threshold))],
                multi: false,
            })
        }
        GeometryValue::MultiPolygon { coordinates } => {
            let count = coordinates.iter().flatten().map(Vec::len).sum();
            if !check_vertex_count(count, &cpath, limits, errs) {
                return None;
            }
            if coordinates.is_empty() {
                errs.push(cpath, FenceErrorKind::EmptyPolygon);
                return None;
            }
            let mut parts = Vec::with_capacity(coordinates.len());
            let mut ok = true;
            for (i, poly) in coordinates.iter().enumerate() {
                match check_polygon(poly, &format!("{cpath}[{i}]"), errs) {
                    Some(rings) => parts.push(rings),
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Some(Shape::Polygons {
                parts: parts
                    .into_iter()
                    .map(|r| Arc::new(PolyPart::new(r, limits.index_threshold)))
                    .collect(),
                multi: true,
            })
        }
        other => {
            errs.push(
                format!("{prefix}geometry.type"),
                FenceErrorKind::UnsupportedGeometry {
                    found: other.type_name().to_string(),
                },
            );
            None
        }
    }
}

/// Seconds (JSON number) to a duration; `None` if negative, non-finite or out of range.
fn secs_to_dur(secs: f64) -> Option<Dur> {
    let ms = (secs * 1000.0).round();
    (ms.is_finite() && ms >= 0.0 && ms <= Ts::MAX.0 as f64).then_some(Dur(ms as i64))
}

/// A positive duration from a string or a number of seconds.
fn parse_dur(v: &Value, path: &str, errs: &mut Errs) -> Option<Dur> {
    let d = match v {
        Value::String(s) => match Dur::parse(s) {
            Ok(d) => d,
            Err(_) => {
                errs.push(
                    path.to_string(),
                    FenceErrorKind::BadDuration(format!("{s:?}")),
                );
                return None;
            }
        },
        Value::Number(n) => match n.as_f64().and_then(secs_to_dur) {
            Some(d) => d,
            None => {
                errs.push(path.to_string(), FenceErrorKind::BadDuration(n.to_string()));
                return None;
            }
        },
        _ => {
            errs.push(
                path.to_string(),
                FenceErrorKind::WrongType("a duration string like \"10m\" or a number of seconds"),
            );
            return None;
        }
    };
    if d.0 <= 0 {
        errs.push(path.to_string(), FenceErrorKind::NotPositive);
        return None;
    }
    Some(d)
}

fn parse_num(v: &Value, path: &str, min: f64, max: f64, errs: &mut Errs) -> Option<f64> {
    let Some(x) = v.as_f64() else {
        errs.push(path.to_string(), FenceErrorKind::WrongType("a number"));
        return None;
    };
    if !(min..=max).contains(&x) {
        errs.push(
            path.to_string(),
            FenceErrorKind::OutOfRange { value: x, min, max },
        );
        return None;
    }
    Some(x)
}

fn parse_confirm(v: &Value, path: &str, errs: &mut Errs) -> Option<u8> {
    let x = match v.as_f64() {
        Some(x) if x.fract() == 0.0 => x,
        _ => {
            errs.push(path.to_string(), FenceErrorKind::WrongType("an integer"));
            return None;
        }
    };
    if !(1.0..=f64::from(MAX_CONFIRM)).contains(&x) {
        errs.push(
            path.to_string(),
            FenceErrorKind::OutOfRange {
                value: x,
                min: 1.0,
                max: f64::from(MAX_CONFIRM),
            },
        );
        return None;
    }
    Some(x as u8)
}

fn parse_dwell(v: &Value, path: &str, errs: &mut Errs) -> Option<Vec<Dur>> {
    let items: Vec<(String, &Value)> = match v {
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| (format!("{path}[{i}]"), x))
            .collect(),
        Value::String(_) | Value::Number(_) => vec![(path.to_string(), v)],
        _ => {
            errs.push(
                path.to_string(),
                FenceErrorKind::WrongType("a duration or an array of durations"),
            );
            return None;
        }
    };
    let mut ok = true;
    if items.len() > MAX_THRESHOLDS {
        errs.push(
            path.to_string(),
            FenceErrorKind::TooManyThresholds {
                count: items.len(),
                max: MAX_THRESHOLDS,
            },
        );
        ok = false;
    }
    let mut out = Vec::with_capacity(items.len());
    for (p, x) in items {
        match parse_dur(x, &p, errs) {
            Some(d) => out.push(d),
            None => ok = false,
        }
    }
    out.sort_unstable();
    out.dedup();
    ok.then_some(out)
}

/// Parses the properties into settings and name; `None` parts keep defaults (errors recorded).
fn parse_props(
    props: Option<&JsonObject>,
    is_point: bool,
    prefix: &str,
    limits: &FenceLimits,
    errs: &mut Errs,
) -> (FenceSettings, Option<String>) {
    let mut s = FenceSettings::default();
    let mut name = None;
    let Some(props) = props else {
        return (s, name);
    };
    for (k, v) in props {
        let path = format!("{prefix}properties.{k}");
        if !KNOWN_PROPERTIES.contains(&k.as_str()) {
            errs.push(path, FenceErrorKind::UnknownProperty(k.clone()));
            continue;
        }
        if k == "radius_m" {
            // Parsed with the geometry; only its presence on a polygon is an error here.
            if !is_point && !v.is_null() {
                errs.push(path, FenceErrorKind::RadiusOnPolygon);
            }
            continue;
        }
        if v.is_null() {
            // null = absent: the default applies.
            continue;
        }
        let off = v.as_str() == Some("off");
        match k.as_str() {
            "dwell" => s.dwell = parse_dwell(v, &path, errs).unwrap_or_default(),
            "exit_buffer_m" => {
                s.exit_buffer_m =
                    parse_num(v, &path, 0.0, limits.max_exit_buffer_m, errs).unwrap_or_default();
            }
            "enter_confirm" => s.enter_confirm = parse_confirm(v, &path, errs).unwrap_or(1),
            "exit_confirm" => s.exit_confirm = parse_confirm(v, &path, errs).unwrap_or(1),
            "confirm_within" => {
                s.confirm_within = parse_dur(v, &path, errs).unwrap_or(DEFAULT_CONFIRM_WITHIN);
            }
            "stale_after" => {
                s.stale_after = if off {
                    None
                } else {
                    Some(parse_dur(v, &path, errs).unwrap_or(DEFAULT_STALE_AFTER))
                };
            }
            "max_accuracy_m" => {
                s.max_accuracy_m = if off {
                    None
                } else {
                    match v.as_f64() {
                        Some(x) if x > 0.0 && x.is_finite() => Some(x),
                        Some(_) => {
                            errs.push(path, FenceErrorKind::NotPositive);
                            None
                        }
                        None => {
                            errs.push(
                                path,
                                FenceErrorKind::WrongType("a number of metres or \"off\""),
                            );
                            None
                        }
                    }
                };
            }
            "tags" => match v {
                Value::Object(_) | Value::Array(_) => s.tags = Arc::new(v.clone()),
                _ => errs.push(path, FenceErrorKind::WrongType("a JSON object or array")),
            },
            "name" => match v {
                Value::String(n) if n.len() <= MAX_NAME_BYTES => name = Some(n.clone()),
                Value::String(_) => errs.push(
                    path,
                    FenceErrorKind::TooLong {
                        max: MAX_NAME_BYTES,
                    },
                ),
                _ => errs.push(path, FenceErrorKind::WrongType("a string")),
            },
            _ => {}
        }
    }
    (s, name)
}

/// Checks an id's form; records an error at `path` if bad.
fn check_id(id: &str, path: &str, errs: &mut Errs) -> bool {
    let reason = if id.is_empty() {
        "must not be empty"
    } else if id.len() > MAX_ID_BYTES {
        "longer than 256 bytes"
    } else if id.chars().any(char::is_control) {
        "must be printable (no control characters)"
    } else {
        return true;
    };
    errs.push(path.to_string(), FenceErrorKind::BadId(reason));
    false
}

fn resolve_id(
    feature_id: Option<&Id>,
    id_override: Option<&str>,
    prefix: &str,
    errs: &mut Errs,
) -> Option<String> {
    let path = format!("{prefix}id");
    let fid = feature_id.map(|id| match id {
        Id::String(s) => s.clone(),
        Id::Number(n) => n.to_string(),
    });
    match (fid, id_override) {
        (Some(f), Some(o)) => {
            let ok = check_id(o, &path, errs);
            if f != o {
                errs.push(
                    path,
                    FenceErrorKind::IdMismatch {
                        feature_id: f,
                        expected: o.to_string(),
                    },
                );
                return None;
            }
            ok.then(|| o.to_string())
        }
        (None, Some(o)) => check_id(o, &path, errs).then(|| o.to_string()),
        (Some(f), None) => check_id(&f, &path, errs).then_some(f),
        (None, None) => {
            errs.push(path, FenceErrorKind::MissingId);
            None
        }
    }
}

/// Validates one Feature; errors go to `errs` with paths under `prefix`.
fn build(
    f: &Feature,
    id_override: Option<&str>,
    limits: &FenceLimits,
    prefix: &str,
    errs: &mut Errs,
) -> Option<Fence> {
    let before = errs.count();
    let props = f.properties.as_ref();
    let id = resolve_id(f.id.as_ref(), id_override, prefix, errs);
    let is_point = matches!(
        f.geometry.as_ref().map(|g| &g.value),
        Some(GeometryValue::Point { .. })
    );
    let shape = check_geometry(f.geometry.as_ref(), props, prefix, limits, errs);
    let (settings, name) = parse_props(props, is_point, prefix, limits, errs);
    if errs.count() != before {
        return None;
    }
    Some(Fence {
        id: Arc::from(id?),
        settings,
        name,
        shape: shape?,
    })
}

/// A JSON number, or a string for a non-finite value so that it fails validation instead of
/// turning into `null` (= default).
fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(x.to_string()))
}

/// The normalized properties of a fence.
fn props_json(s: &FenceSettings, name: Option<&str>, radius_m: Option<f64>) -> JsonObject {
    let mut p = JsonObject::new();
    p.insert(
        "dwell".into(),
        Value::Array(
            s.dwell
                .iter()
                .map(|d| Value::String(d.to_human()))
                .collect(),
        ),
    );
    p.insert("exit_buffer_m".into(), num(s.exit_buffer_m));
    p.insert("enter_confirm".into(), Value::from(s.enter_confirm));
    p.insert("exit_confirm".into(), Value::from(s.exit_confirm));
    p.insert(
        "confirm_within".into(),
        Value::String(s.confirm_within.to_human()),
    );
    p.insert(
        "stale_after".into(),
        Value::String(
            s.stale_after
                .map_or_else(|| "off".to_string(), Dur::to_human),
        ),
    );
    p.insert(
        "max_accuracy_m".into(),
        s.max_accuracy_m
            .map_or_else(|| Value::String("off".into()), num),
    );
    if let Some(r) = radius_m {
        p.insert("radius_m".into(), num(r));
    }
    p.insert("tags".into(), (*s.tags).clone());
    if let Some(n) = name {
        p.insert("name".into(), Value::String(n.to_string()));
    }
    p
}

fn positions(ring: &[[f64; 2]]) -> Vec<Position> {
    ring.iter().map(|&p| Position::from(p)).collect()
}

impl Fence {
    /// Validates a GeoJSON Feature into a fence. `id_override` is the id the caller addresses
    /// (e.g. `PUT /v1/fences/{id}`): it is used when the Feature has no id and must equal the
    /// Feature's id when it has one. Every problem is reported, with paths relative to the
    /// Feature (`properties.dwell[1]`, `geometry.coordinates[0][5]`, `id`).
    pub fn from_feature(
        feature: &Feature,
        id_override: Option<&str>,
        limits: &FenceLimits,
    ) -> Result<Fence, FenceErrors> {
        let mut errs = Errs::new(limits.max_errors);
        let f = build(feature, id_override, limits, "", &mut errs);
        errs.into_result(f)
    }

    /// A circle fence, validated like a Feature (id, centre, radius and settings bounds).
    pub fn new_circle(
        id: &str,
        lon: f64,
        lat: f64,
        radius_m: f64,
        settings: FenceSettings,
        limits: &FenceLimits,
    ) -> Result<Fence, FenceErrors> {
        let geom = Geometry::new(GeometryValue::Point {
            coordinates: Position::from([lon, lat]),
        });
        Fence::from_parts(id, geom, &settings, Some(radius_m), limits)
    }

    /// A polygon fence from closed rings (`parts[i][0]` the exterior of part `i`, the rest its
    /// holes), validated like a Feature. One part gives a Polygon, several a MultiPolygon.
    pub fn new_polygon(
        id: &str,
        parts: &[Vec<Vec<[f64; 2]>>],
        settings: FenceSettings,
        limits: &FenceLimits,
    ) -> Result<Fence, FenceErrors> {
        let polys: Vec<Vec<Vec<Position>>> = parts
            .iter()
            .map(|rings| rings.iter().map(|r| positions(r)).collect())
            .collect();
        let value = match polys.len() {
            1 => GeometryValue::Polygon {
                coordinates: polys.into_iter().next().unwrap_or_default(),
            },
            _ => GeometryValue::MultiPolygon { coordinates: polys },
        };
        Fence::from_parts(id, Geometry::new(value), &settings, None, limits)
    }

    fn from_parts(
        id: &str,
        geom: Geometry,
        settings: &FenceSettings,
        radius_m: Option<f64>,
        limits: &FenceLimits,
    ) -> Result<Fence, FenceErrors> {
        let feature = Feature {
            bbox: None,
            geometry: Some(geom),
            id: None,
            properties: Some(props_json(settings, None, radius_m)),
            foreign_members: None,
        };
        Fence::from_feature(&feature, Some(id), limits)
    }

    /// The fence as a normalized GeoJSON Feature: its geometry as stored (a circle as a Point),
    /// its id, and every property with its effective value (`dwell` as sorted duration strings,
    /// `stale_after` / `max_accuracy_m` as `"off"` when off). Parsing it back gives an equal
    /// fence.
    pub fn to_feature(&self) -> Feature {
        let (value, radius) = match &self.shape {
            Shape::Circle(c) => (
                GeometryValue::Point {
                    coordinates: Position::from([c.lon, c.lat]),
                },
                Some(c.radius_m),
            ),
            Shape::Polygons { parts, multi } => {
                let polys: Vec<Vec<Vec<Position>>> = parts
                    .iter()
                    .map(|p| p.rings().map(positions).collect())
                    .collect();
                let v = if *multi || polys.len() != 1 {
                    GeometryValue::MultiPolygon { coordinates: polys }
                } else {
                    GeometryValue::Polygon {
                        coordinates: polys.into_iter().next().unwrap_or_default(),
                    }
                };
                (v, None)
            }
        };
        Feature {
            bbox: None,
            geometry: Some(Geometry::new(value)),
            id: Some(Id::String(self.id.to_string())),
            properties: Some(props_json(&self.settings, self.name.as_deref(), radius)),
            foreign_members: None,
        }
    }
}

/// Validates a Feature or FeatureCollection into fences. For a collection, paths start with
/// `features[i].`, and ids must be unique. All errors of all features are reported at once;
/// on any error no fence is returned.
pub fn parse_fences(doc: &GeoJson, limits: &FenceLimits) -> Result<Vec<Fence>, FenceErrors> {
    let mut errs = Errs::new(limits.max_errors);
    let out = match doc {
        GeoJson::Feature(f) => build(f, None, limits, "", &mut errs).map(|f| vec![f]),
        GeoJson::FeatureCollection(fc) => {
            let mut out = Vec::with_capacity(fc.features.len());
            let mut seen = HashSet::new();
            for (i, f) in fc.features.iter().enumerate() {
                let prefix = format!("features[{i}].");
                if let Some(fence) = build(f, None, limits, &prefix, &mut errs) {
                    if seen.insert(fence.id.clone()) {
                        out.push(fence);
                    } else {
                        errs.push(
                            format!("{prefix}id"),
                            FenceErrorKind::DuplicateId(fence.id.to_string()),
                        );
                    }
                }
            }
            Some(out)
        }
        GeoJson::Geometry(g) => {
            errs.push(
                "type".to_string(),
                FenceErrorKind::NotAFeature {
                    found: g.value.type_name().to_string(),
                },
            );
            None
        }
    };
    errs.into_result(out)
}

/// [`parse_fences`] on GeoJSON text; malformed JSON/GeoJSON is one [`FenceErrorKind::Json`].
pub fn parse_fences_str(text: &str, limits: &FenceLimits) -> Result<Vec<Fence>, FenceErrors> {
    match text.parse::<GeoJson>() {
        Ok(doc) => parse_fences(&doc, limits),
        Err(e) => Err(FenceErrors(vec![FenceError {
            path: String::new(),
            kind: FenceErrorKind::Json(e.to_string()),
        }])),
    }
}
