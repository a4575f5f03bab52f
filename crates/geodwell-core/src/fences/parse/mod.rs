//! GeoJSON in and out: validation of fences with every error reported at once, each with the
//! JSON path of the offending value (`features[3].properties.dwell[1]`,
//! `geometry.coordinates[0][5]`), and the normalized GeoJSON a fence is served back as.
//!
//! Rules (bounds, defaults, antimeridian) are listed in `docs/fences.md`; this module is their
//! single implementation, and the typed constructors ([`Fence::new_circle`],
//! [`Fence::new_polygon`]) go through it too so no fence skips validation.
//!
//! This module holds the entry points, the limits and the id rules; `errors` the error types
//! and their collector, `geometry` and `properties` the validation of the two halves of a
//! Feature, `serialize` the way back out ([`Fence::to_feature`]).

use std::collections::HashSet;
use std::sync::Arc;

use geojson::feature::Id;
use geojson::{Feature, GeoJson, Geometry, GeometryValue, Position};

use super::edges::EDGE_INDEX_THRESHOLD;
use super::{Fence, FenceSettings, MAX_ID_BYTES};

mod errors;
mod geometry;
mod properties;
mod serialize;

pub use errors::{FenceError, FenceErrorKind, FenceErrors};
pub use properties::KNOWN_PROPERTIES;

use errors::Errs;
use geometry::check_geometry;
use properties::parse_props;
use serialize::{positions, props_json};

/// Default of [`FenceLimits::max_test_edges`]. An entry costs about 2 ns when its latitude
/// range lets the test skip it and about 25 ns when it needs the exact predicates (long edges
/// crossing the cell), so this bounds a test at roughly 50 µs on this project's benchmark
/// machine (`docs/bench-fences.md`); ragged 10k-80k-vertex coastlines need at most 82.
pub const DEFAULT_MAX_TEST_EDGES: usize = 2048;

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
    /// Largest `tags` value, in bytes of compact JSON (tags are copied into every event).
    pub max_tags_bytes: usize,
    /// Most polygon edges one containment test may examine, at the worst point of a part
    /// ([`Fence::test_cost`](crate::fences::Fence::test_cost)): bounds the work a fix costs
    /// inside a crafted polygon (long spikes or teeth crossing the whole shape).
    pub max_test_edges: usize,
    /// Polygon parts with at least this many edges get the edge grid (tests lower it to
    /// exercise the index on small polygons).
    pub index_threshold: usize,
}

impl FenceLimits {
    /// Limits for fences read back from a store or a shared log: they were validated by their
    /// writer, so a node with tighter limits (or a newer build with a new limit) must still
    /// apply them, the same way on every replay. Only the index threshold stays as it is.
    pub fn stored() -> FenceLimits {
        FenceLimits {
            max_vertices: usize::MAX,
            max_radius_m: f64::MAX,
            max_exit_buffer_m: f64::MAX,
            max_tags_bytes: usize::MAX,
            max_test_edges: usize::MAX,
            ..FenceLimits::default()
        }
    }
}

impl Default for FenceLimits {
    /// 100,000 vertices, 1,000 km radius, 100 km exit buffer, 100 errors, 4 KiB of tags,
    /// [`DEFAULT_MAX_TEST_EDGES`] edges per containment test, index
    /// from [`EDGE_INDEX_THRESHOLD`] edges.
    fn default() -> FenceLimits {
        FenceLimits {
            max_vertices: 100_000,
            max_radius_m: 1_000_000.0,
            max_exit_buffer_m: 100_000.0,
            max_errors: 100,
            max_tags_bytes: 4096,
            max_test_edges: DEFAULT_MAX_TEST_EDGES,
            index_threshold: EDGE_INDEX_THRESHOLD,
        }
    }
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
        name: name.map(Arc::from),
        active_since: active_since(f),
        shape: shape?,
    })
}

/// The foreign member `active_since` (RFC 3339) of a stored Feature; anything else is none.
fn active_since(f: &Feature) -> Option<crate::time::Ts> {
    let v = f.foreign_members.as_ref()?.get(ACTIVE_SINCE)?.as_str()?;
    crate::time::Ts::parse_rfc3339(v).ok()
}

/// The Feature member that carries [`Fence::active_since`].
pub const ACTIVE_SINCE: &str = "active_since";

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
