//! Validation errors and their collector: every problem of a document is reported at once, each
//! with the JSON path of the offending value, up to a cap.
//!
//! Invariant: a failed validation returns a non-empty [`FenceErrors`]; errors past
//! [`FenceLimits::max_errors`](crate::fences::FenceLimits::max_errors) are only counted, and
//! summarized by one [`FenceErrorKind::TooManyErrors`].

use std::fmt;

use thiserror::Error;

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
    /// More positions than
    /// [`FenceLimits::max_vertices`](crate::fences::FenceLimits::max_vertices).
    #[error("{count} positions exceed the limit of {max} per fence")]
    TooManyVertices {
        /// Positions given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A polygon part whose containment test could examine more than
    /// [`FenceLimits::max_test_edges`](crate::fences::FenceLimits::max_test_edges) edges.
    #[error(
        "a containment test of this polygon could examine {edges} edges at its costliest point, above the limit of {max}: simplify it or split it into smaller polygons (long thin spikes or teeth crossing the whole shape are what make it costly)"
    )]
    TooCostly {
        /// Edges examined at the costliest point.
        edges: usize,
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
    /// A property name that is not in [`KNOWN_PROPERTIES`](crate::fences::KNOWN_PROPERTIES).
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
    /// More than [`MAX_THRESHOLDS`](crate::fences::MAX_THRESHOLDS) dwell thresholds.
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
    /// Error reporting stopped at
    /// [`FenceLimits::max_errors`](crate::fences::FenceLimits::max_errors).
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
pub(super) struct Errs {
    list: Vec<FenceError>,
    max: usize,
    suppressed: usize,
}

impl Errs {
    pub(super) fn new(max: usize) -> Errs {
        Errs {
            list: Vec::new(),
            max: max.max(1),
            suppressed: 0,
        }
    }

    pub(super) fn push(&mut self, path: String, kind: FenceErrorKind) {
        if self.list.len() < self.max {
            self.list.push(FenceError { path, kind });
        } else {
            self.suppressed += 1;
        }
    }

    pub(super) fn count(&self) -> usize {
        self.list.len() + self.suppressed
    }

    pub(super) fn into_result<T>(mut self, value: Option<T>) -> Result<T, FenceErrors> {
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
