//! Fences: the model, its validation from GeoJSON, the exact geometric tests and the index
//! (R-tree + point grid) that finds candidate fences for a fix.
//!
//! Owns everything the engine needs to answer "which fences contain this point, and how far is
//! it from this one". Pure: no I/O, no clock, no panics on user input.
//!
//! - [`Fence`] is one validated fence: an id, its [`FenceSettings`] and a shape (polygon parts
//!   or a circle). A `Fence` can only be built through validation ([`Fence::from_feature`],
//!   [`parse_fences`], [`Fence::new_circle`], [`Fence::new_polygon`]), so every stored shape
//!   holds the invariants of `docs/fences.md`: closed rings of >= 4 finite positions in range,
//!   no edge spanning more than 180° of longitude, a positive bounded radius.
//! - [`Fence::contains`] is boundary inclusive (holes excluded, their boundary inside);
//!   polygon parts with at least [`EDGE_INDEX_THRESHOLD`] edges answer through an edge grid
//!   that gives exactly the plain test's answer ([`Fence::contains_unindexed`]).
//! - [`FenceIndex`] maps ids to stable [`FenceIdx`] slots and keeps an R-tree of part
//!   envelopes, updated incrementally on upsert and remove, plus a flat point grid derived from
//!   it that answers the point queries.
//!
//! Submodules: `parse` (GeoJSON in and out, errors, limits), `edges` (polygon storage, exact
//! tests, distances, and the edge grid in `edges::grid`), `index` (the R-tree, and the point
//! grid in `index::point_grid`), `window` (whether a fence meets a rectangle).

use std::sync::Arc;

use crate::time::Dur;

mod edges;
mod index;
mod parse;
#[cfg(test)]
mod tests;
mod window;

pub use edges::{EARTH_RADIUS_M, EDGE_INDEX_THRESHOLD};
pub use index::FenceIndex;
pub use parse::{
    DEFAULT_MAX_TEST_EDGES, FenceError, FenceErrorKind, FenceErrors, FenceLimits, KNOWN_PROPERTIES,
    parse_fences, parse_fences_str,
};

pub use window::Rect;

use edges::{M_PER_DEG, PolyPart};

/// Dense index of a fence inside one [`FenceIndex`]; stable while the fence exists (a replace with
/// the same id keeps it), reusable after removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceIdx(pub u32);

/// Per-fence tuning of the pair state machine (`docs/semantics.md` section 3).
#[derive(Debug, Clone, PartialEq)]
pub struct FenceSettings {
    /// Dwell thresholds, ascending, distinct, at most [`MAX_THRESHOLDS`].
    pub dwell: Vec<Dur>,
    /// Hysteresis: metres outside the fence before a fix counts as outside for an INSIDE pair.
    pub exit_buffer_m: f64,
    /// Consecutive inside fixes needed for ENTER (>= 1).
    pub enter_confirm: u8,
    /// Consecutive outside fixes needed for EXIT (>= 1).
    pub exit_confirm: u8,
    /// Largest event-time gap between two fixes of one confirmation run.
    pub confirm_within: Dur,
    /// A device whose latest fix at a deadline is older than this is STALE; `None` = off.
    pub stale_after: Option<Dur>,
    /// Fixes less accurate than this (metres) are ignored for this fence; `None` = off.
    pub max_accuracy_m: Option<f64>,
    /// Free-form tags copied onto every event of this fence (JSON object or array). Shared, not
    /// cloned: every event of the fence (and every entry of the event log) points at this one
    /// value, which is what keeps a logged event small.
    pub tags: Arc<serde_json::Value>,
    /// The devices the fence applies to (`properties.devices`); default every device.
    pub devices: DeviceScope,
}

/// Most patterns one fence's `devices` may list.
pub const MAX_DEVICE_PATTERNS: usize = 64;

/// Which devices a fence applies to: glob patterns on the device id (`*` any run of characters,
/// `?` one character, as in the API's event filters); a device matching any of them is in
/// scope. No patterns: every device. A device out of a fence's scope forms no pair with it, and
/// a fix of a device with an open visit that the scope no longer covers counts as outside (the
/// scope changed like a geometry would).
#[derive(Debug, Clone, Default)]
pub struct DeviceScope {
    patterns: Arc<[String]>,
    globs: Arc<[crate::glob::Glob]>,
}

impl PartialEq for DeviceScope {
    fn eq(&self, other: &DeviceScope) -> bool {
        self.patterns == other.patterns
    }
}

impl DeviceScope {
    /// A scope of `patterns` (none: every device).
    pub fn new(patterns: Vec<String>) -> DeviceScope {
        let globs = patterns.iter().map(|p| crate::glob::Glob::new(p)).collect();
        DeviceScope {
            patterns: patterns.into(),
            globs,
        }
    }

    /// Whether every device is in scope.
    #[inline]
    pub fn is_all(&self) -> bool {
        self.globs.is_empty()
    }

    /// Whether `device` is in scope.
    #[inline]
    pub fn matches(&self, device: &str) -> bool {
        self.is_all() || self.globs.iter().any(|g| g.matches(device))
    }

    /// The patterns as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

impl Default for FenceSettings {
    /// The documented defaults: no dwell thresholds, no exit buffer, confirm counts 1,
    /// `confirm_within` 5 min, `stale_after` 15 min, no accuracy filter, empty tags, every
    /// device.
    fn default() -> FenceSettings {
        FenceSettings {
            dwell: Vec::new(),
            exit_buffer_m: 0.0,
            enter_confirm: 1,
            exit_confirm: 1,
            confirm_within: DEFAULT_CONFIRM_WITHIN,
            stale_after: Some(DEFAULT_STALE_AFTER),
            max_accuracy_m: None,
            tags: Arc::new(serde_json::Value::Object(serde_json::Map::new())),
            devices: DeviceScope::default(),
        }
    }
}

/// Most dwell thresholds one fence may carry.
pub const MAX_THRESHOLDS: usize = 16;

/// Largest accepted `enter_confirm` / `exit_confirm`.
pub const MAX_CONFIRM: u8 = 100;

/// Default `confirm_within` (`docs/semantics.md` section 3.4).
pub const DEFAULT_CONFIRM_WITHIN: Dur = Dur::from_mins(5);

/// Default `stale_after` (`docs/semantics.md` section 3.7).
pub const DEFAULT_STALE_AFTER: Dur = Dur::from_mins(15);

/// Longest accepted fence id, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Longest accepted `name`, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// A circle: haversine distance from the centre at most `radius_m`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Circle {
    pub(crate) lon: f64,
    pub(crate) lat: f64,
    pub(crate) radius_m: f64,
}

/// The geometry of a fence.
#[derive(Debug, Clone)]
pub(crate) enum Shape {
    /// Point geometry with `radius_m`.
    Circle(Circle),
    /// Polygon (`multi == false`, one part) or MultiPolygon.
    Polygons {
        /// Shared with the index's entries, so the hot path reaches a part in one hop.
        parts: Vec<Arc<PolyPart>>,
        multi: bool,
    },
}

/// One validated fence.
#[derive(Debug, Clone)]
pub struct Fence {
    /// The fence id.
    pub id: Arc<str>,
    /// Its tuning.
    pub settings: FenceSettings,
    /// Optional human-readable name (`properties.name`), kept, served back and carried by
    /// every event of the fence (shared, not copied, by each event).
    pub name: Option<Arc<str>>,
    /// The watermark when the fence was created: a fix before it never starts a pair with the
    /// fence (a delayed fix applied after the fence exists makes no ENTER from before it
    /// existed). `None`: every fix counts (fences from a preload or created before any
    /// watermark). Set by the service, kept across replacements; served and stored as the
    /// Feature's foreign member `active_since`.
    pub active_since: Option<crate::time::Ts>,
    pub(crate) shape: Shape,
}

/// Great-circle distance in metres between two (lon, lat) points on the sphere of
/// [`EARTH_RADIUS_M`] (haversine; `docs/semantics.md` section 3.1).
pub fn haversine_m(lon1: f64, lat1: f64, lon2: f64, lat2: f64) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let s1 = (dp * 0.5).sin();
    let s2 = (dl * 0.5).sin();
    let a = s1 * s1 + p1.cos() * p2.cos() * s2 * s2;
    2.0 * EARTH_RADIUS_M * a.clamp(0.0, 1.0).sqrt().asin()
}

impl Circle {
    /// Lon/lat envelopes `[min_lon, min_lat, max_lon, max_lat]` covering the cap: one, or two
    /// when it crosses the antimeridian, or the full longitude band when it holds a pole.
    pub(crate) fn envelopes(&self) -> Vec<[f64; 4]> {
        let delta = self.radius_m / EARTH_RADIUS_M; // angular radius, radians
        // A hair of slack so that rounding in the trigonometry never drops a boundary point.
        let pad = 1e-9;
        let ddeg = delta.to_degrees() * (1.0 + 1e-9) + pad;
        let (lat_lo, lat_hi) = (self.lat - ddeg, self.lat + ddeg);
        if lat_hi >= 90.0 || lat_lo <= -90.0 {
            return vec![[-180.0, lat_lo.max(-90.0), 180.0, lat_hi.min(90.0)]];
        }
        // Widest longitude reach of a spherical cap not holding a pole.
        let s = (delta.sin() / self.lat.to_radians().cos()).min(1.0);
        let dlon = s.asin().to_degrees() * (1.0 + 1e-9) + pad;
        let (lo, hi) = (self.lon - dlon, self.lon + dlon);
        if hi - lo >= 360.0 {
            vec![[-180.0, lat_lo, 180.0, lat_hi]]
        } else if lo < -180.0 {
            vec![
                [lo + 360.0, lat_lo, 180.0, lat_hi],
                [-180.0, lat_lo, hi, lat_hi],
            ]
        } else if hi > 180.0 {
            vec![
                [lo, lat_lo, 180.0, lat_hi],
                [-180.0, lat_lo, hi - 360.0, lat_hi],
            ]
        } else {
            vec![[lo, lat_lo, hi, lat_hi]]
        }
    }
}

/// What one containment test of a fence costs, in edges examined ([`Fence::test_cost`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TestCost {
    /// Most edges examined for any point of the fence's area.
    pub worst: usize,
    /// Edges examined on average for a point uniform in the bounding box.
    pub mean: f64,
}

impl Fence {
    /// Boundary-inclusive containment of (lon, lat): polygons include their boundary and their
    /// holes' boundaries; circles include points at exactly `radius_m`. Longitudes ±180 are the
    /// same meridian. Non-finite input is outside.
    pub fn contains(&self, lon: f64, lat: f64) -> bool {
        self.contains_with(lon, lat, false)
    }

    /// Same answer as [`Fence::contains`], always by the plain scan of every edge (no edge
    /// grid). The reference the indexed path is tested and benchmarked against.
    pub fn contains_unindexed(&self, lon: f64, lat: f64) -> bool {
        self.contains_with(lon, lat, true)
    }

    /// Containment in one envelope's piece of the fence (polygon part `part`; a circle is one
    /// piece whatever its envelopes), without the ±180 aliasing: the index's hot path, which
    /// already knows which envelope the point fell in.
    #[inline]
    pub(crate) fn contains_piece(&self, part: usize, lon: f64, lat: f64) -> bool {
        match &self.shape {
            Shape::Circle(c) => haversine_m(c.lon, c.lat, lon, lat) <= c.radius_m,
            Shape::Polygons { parts, .. } => parts.get(part).is_some_and(|p| p.contains(lon, lat)),
        }
    }

    fn contains_with(&self, lon: f64, lat: f64, plain: bool) -> bool {
        match &self.shape {
            Shape::Circle(c) => {
                lat.is_finite() && lon.is_finite() && {
                    haversine_m(c.lon, c.lat, lon, lat) <= c.radius_m
                }
            }
            Shape::Polygons { parts, .. } => {
                let test = |x: f64| {
                    parts.iter().any(|p| {
                        if plain {
                            p.contains_plain(x, lat)
                        } else {
                            p.contains(x, lat)
                        }
                    })
                };
                // ±180 is one meridian: a fence split there (RFC 7946 §3.1.9) may touch it on
                // either side.
                test(lon) || (lon.abs() == 180.0 && test(-lon))
            }
        }
    }

    /// Metres from (lon, lat) to the fence; 0 inside. Polygons: distance to the nearest edge of
    /// any ring on the local equirectangular projection at the fix's latitude
    /// (`x = Δlon·cos(lat)·R·π/180`, `y = Δlat·R·π/180`, `R` = [`EARTH_RADIUS_M`]), measured the
    /// short way round the antimeridian. Circles: haversine distance minus the radius, at least 0.
    /// Non-finite input gives infinity.
    pub fn distance_m(&self, lon: f64, lat: f64) -> f64 {
        self.distance_with(lon, lat, f64::NEG_INFINITY, false)
    }

    /// [`Fence::distance_m`] by the plain scan of every edge (reference for tests).
    pub fn distance_m_unindexed(&self, lon: f64, lat: f64) -> f64 {
        self.distance_with(lon, lat, f64::NEG_INFINITY, true)
    }

    /// Whether (lon, lat) is inside the fence or at most `buffer_m` metres from it: the
    /// hysteresis test for an INSIDE pair (a fix counts as outside only when this is false).
    /// Faster than comparing [`Fence::distance_m`], as the edge search stops at the first edge
    /// within the buffer.
    pub fn within_m(&self, lon: f64, lat: f64, buffer_m: f64) -> bool {
        if self.contains(lon, lat) {
            return true;
        }
        if buffer_m.is_nan() || buffer_m < 0.0 {
            return false;
        }
        self.distance_with(lon, lat, buffer_m, false) <= buffer_m
    }

    fn distance_with(&self, lon: f64, lat: f64, stop_m: f64, plain: bool) -> f64 {
        if !(lon.is_finite() && lat.is_finite()) {
            return f64::INFINITY;
        }
        if self.contains_with(lon, lat, plain) {
            return 0.0;
        }
        match &self.shape {
            Shape::Circle(c) => (haversine_m(c.lon, c.lat, lon, lat) - c.radius_m).max(0.0),
            Shape::Polygons { parts, .. } => {
                let stop2 = if stop_m >= 0.0 { stop_m * stop_m } else { -1.0 };
                let mut best = f64::INFINITY;
                for p in parts {
                    best = best.min(p.boundary_dist2(lon, lat, stop2, plain));
                    if best <= stop2 {
                        break;
                    }
                }
                best.sqrt()
            }
        }
    }

    /// Number of stored positions over all rings and parts (closing positions included); 1 for
    /// a circle.
    pub fn vertex_count(&self) -> usize {
        match &self.shape {
            Shape::Circle(_) => 1,
            Shape::Polygons { parts, .. } => parts.iter().map(|p| p.vertex_count()).sum(),
        }
    }

    /// Approximate heap bytes held by the fence's geometry (coordinates and edge grides), for
    /// memory accounting; settings, tags and id are not counted.
    pub fn heap_bytes(&self) -> usize {
        match &self.shape {
            Shape::Circle(_) => 0,
            Shape::Polygons { parts, .. } => parts
                .iter()
                .map(|p| p.heap_bytes() + std::mem::size_of::<PolyPart>())
                .sum::<usize>(),
        }
    }

    /// The cost of one exact containment test, in polygon edges examined: the worst case over
    /// the fence's area and the mean for a point uniform in a part's bounding box (of the
    /// costliest part). A circle costs 1.
    pub fn test_cost(&self) -> TestCost {
        match &self.shape {
            Shape::Circle(_) => TestCost {
                worst: 1,
                mean: 1.0,
            },
            Shape::Polygons { parts, .. } => parts
                .iter()
                .map(|p| {
                    let (worst, mean) = p.test_cost();
                    TestCost { worst, mean }
                })
                .max_by_key(|c| c.worst)
                .unwrap_or(TestCost {
                    worst: 0,
                    mean: 0.0,
                }),
        }
    }

    /// Whether the fence is a circle (Point + `radius_m`).
    pub fn is_circle(&self) -> bool {
        matches!(self.shape, Shape::Circle(_))
    }

    /// Number of polygon parts that answer through the edge grid (0 for circles and small
    /// polygons).
    pub fn indexed_parts(&self) -> usize {
        match &self.shape {
            Shape::Circle(_) => 0,
            Shape::Polygons { parts, .. } => parts.iter().filter(|p| p.is_indexed()).count(),
        }
    }

    /// The lon/lat envelopes `[min_lon, min_lat, max_lon, max_lat]` the index files this fence
    /// under: one per polygon part; one or two (antimeridian) or a full longitude band (pole)
    /// for a circle.
    pub fn envelopes(&self) -> Vec<[f64; 4]> {
        match &self.shape {
            Shape::Circle(c) => c.envelopes(),
            Shape::Polygons { parts, .. } => parts.iter().map(|p| p.bbox).collect(),
        }
    }

    /// Metres per degree of latitude on the sphere of [`EARTH_RADIUS_M`] (the `y` scale of
    /// [`Fence::distance_m`]).
    pub const M_PER_DEG: f64 = M_PER_DEG;
}
