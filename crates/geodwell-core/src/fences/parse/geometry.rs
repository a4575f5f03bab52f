//! Validation of a Feature's geometry into a [`Shape`]: a Point with `radius_m` becomes a
//! circle, a Polygon or MultiPolygon becomes polygon parts.
//!
//! Invariants of what it returns (`docs/fences.md`): rings are closed, have at least 4 finite
//! positions in range and no edge spanning more than 180° of longitude; a fence has at most
//! [`FenceLimits::max_vertices`] positions; a radius is in `(0, max_radius_m]`.

use std::sync::Arc;

use geojson::{Geometry, GeometryValue, JsonObject, Position};
use serde_json::Value;

use super::super::edges::PolyPart;
use super::super::{Circle, Shape};
use super::FenceLimits;
use super::errors::{Errs, FenceErrorKind};

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

/// Refuses a part whose costliest containment test exceeds the limit.
fn check_cost(part: &PolyPart, path: &str, limits: &FenceLimits, errs: &mut Errs) -> bool {
    let (edges, _) = part.test_cost();
    if edges > limits.max_test_edges {
        errs.push(
            path.to_string(),
            FenceErrorKind::TooCostly {
                edges,
                max: limits.max_test_edges,
            },
        );
        return false;
    }
    true
}

/// Validates the geometry (and `radius_m` for a circle).
pub(super) fn check_geometry(
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
            let part = PolyPart::new(rings, limits.index_threshold);
            if !check_cost(&part, &cpath, limits, errs) {
                return None;
            }
            Some(Shape::Polygons {
                parts: vec![Arc::new(part)],
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
            let mut built = Vec::with_capacity(parts.len());
            for (i, rings) in parts.into_iter().enumerate() {
                let part = PolyPart::new(rings, limits.index_threshold);
                ok &= check_cost(&part, &format!("{cpath}[{i}]"), limits, errs);
                built.push(Arc::new(part));
            }
            ok.then_some(Shape::Polygons {
                parts: built,
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
