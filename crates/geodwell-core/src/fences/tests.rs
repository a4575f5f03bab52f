//! Tests of validation, exact tests, distances and the index, plus the property test that the
//! edge grid answers exactly like the plain scan.

use std::sync::Arc;

use geojson::{Feature, GeoJson};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::time::Dur;

fn limits() -> FenceLimits {
    FenceLimits::default()
}

fn feature(v: serde_json::Value) -> Feature {
    serde_json::from_value(v).expect("test feature is valid GeoJSON")
}

fn parse(v: serde_json::Value) -> Result<Fence, FenceErrors> {
    Fence::from_feature(&feature(v), None, &limits())
}

fn errs(v: serde_json::Value) -> Vec<FenceError> {
    match parse(v) {
        Ok(f) => panic!("expected errors, got fence {}", f.id),
        Err(e) => e.0,
    }
}

/// Asserts exactly one error, at `path`, matching `pred`.
fn one_err(v: serde_json::Value, path: &str, pred: impl Fn(&FenceErrorKind) -> bool) {
    let e = errs(v);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].path, path, "{e:?}");
    assert!(pred(&e[0].kind), "{e:?}");
}

fn square(x0: f64, y0: f64, s: f64) -> Vec<[f64; 2]> {
    vec![
        [x0, y0],
        [x0 + s, y0],
        [x0 + s, y0 + s],
        [x0, y0 + s],
        [x0, y0],
    ]
}

fn poly_feature(props: serde_json::Value) -> serde_json::Value {
    json!({"type": "Feature", "id": "f1",
        "geometry": {"type": "Polygon", "coordinates": [square(0.0, 0.0, 1.0)]},
        "properties": props})
}

fn fence_with_hole() -> Fence {
    // 4x4 square with a 2x2 hole in the middle.
    Fence::new_polygon(
        "h",
        &[vec![square(0.0, 0.0, 4.0), square(1.0, 1.0, 2.0)]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid")
}

// ---------------------------------------------------------------- validation

#[test]
fn valid_polygon_gets_defaults() {
    let f = parse(poly_feature(json!({}))).expect("valid");
    assert_eq!(&*f.id, "f1");
    assert_eq!(f.settings, FenceSettings::default());
    assert_eq!(f.settings.confirm_within, Dur::from_mins(5));
    assert_eq!(f.settings.stale_after, Some(Dur::from_mins(15)));
    assert_eq!(f.vertex_count(), 5);
    assert!(!f.is_circle());
}

#[test]
fn all_properties_parse_and_normalize() {
    let f = parse(poly_feature(json!({
        "dwell": ["1h", 600, "10m", "90s"], "exit_buffer_m": 25.5, "enter_confirm": 2,
        "exit_confirm": 3, "confirm_within": "2m", "stale_after": "off",
        "max_accuracy_m": 50, "tags": {"site": "depot"}, "name": "Depot 3"})))
    .expect("valid");
    let s = &f.settings;
    assert_eq!(
        s.dwell,
        vec![Dur::from_secs(90), Dur::from_mins(10), Dur::from_secs(3600)]
    );
    assert_eq!(s.exit_buffer_m, 25.5);
    assert_eq!((s.enter_confirm, s.exit_confirm), (2, 3));
    assert_eq!(s.confirm_within, Dur::from_mins(2));
    assert_eq!(s.stale_after, None);
    assert_eq!(s.max_accuracy_m, Some(50.0));
    assert_eq!(*s.tags, json!({"site": "depot"}));
    assert_eq!(f.name.as_deref(), Some("Depot 3"));
}

#[test]
fn single_dwell_value_and_numeric_id_are_accepted() {
    let mut v = poly_feature(json!({"dwell": "10m", "max_accuracy_m": "off", "tags": [1, 2]}));
    v["id"] = json!(42);
    let f = parse(v).expect("valid");
    assert_eq!(&*f.id, "42");
    assert_eq!(f.settings.dwell, vec![Dur::from_mins(10)]);
    assert_eq!(f.settings.max_accuracy_m, None);
    let f = parse(poly_feature(json!({"dwell": 90}))).expect("valid");
    assert_eq!(f.settings.dwell, vec![Dur::from_secs(90)]);
}

#[test]
fn to_feature_round_trips() {
    let src = poly_feature(
        json!({"dwell": ["1h", "10m"], "exit_buffer_m": 5, "enter_confirm": 2,
        "stale_after": "off", "max_accuracy_m": 30, "tags": {"a": 1}, "name": "n"}),
    );
    let f = parse(src).expect("valid");
    let out = f.to_feature();
    let back = Fence::from_feature(&out, None, &limits()).expect("round trip");
    assert_eq!(back.settings, f.settings);
    assert_eq!(back.name, f.name);
    assert_eq!(back.to_feature(), out);
    let c = Fence::new_circle("c", 10.0, 20.0, 150.0, FenceSettings::default(), &limits())
        .expect("valid");
    let back = Fence::from_feature(&c.to_feature(), None, &limits()).expect("round trip");
    assert!(back.is_circle());
    assert_eq!(back.to_feature(), c.to_feature());
    let j = serde_json::to_value(c.to_feature()).expect("serializes");
    assert_eq!(j["properties"]["radius_m"], json!(150.0));
    assert_eq!(j["geometry"]["type"], json!("Point"));
}

#[test]
fn id_override_must_match() {
    let f = Fence::from_feature(&feature(poly_feature(json!({}))), Some("f1"), &limits());
    assert!(f.is_ok());
    let e = Fence::from_feature(&feature(poly_feature(json!({}))), Some("other"), &limits())
        .expect_err("mismatch");
    assert_eq!(e.0[0].path, "id");
    assert!(matches!(e.0[0].kind, FenceErrorKind::IdMismatch { .. }));
    let mut v = poly_feature(json!({}));
    v.as_object_mut().map(|o| o.remove("id"));
    let f = Fence::from_feature(&feature(v.clone()), Some("from-url"), &limits()).expect("valid");
    assert_eq!(&*f.id, "from-url");
    one_err(v, "id", |k| matches!(k, FenceErrorKind::MissingId));
}

#[test]
fn bad_ids_are_rejected() {
    for (id, _why) in [("", "empty"), ("a\u{7}b", "control")] {
        let mut v = poly_feature(json!({}));
        v["id"] = json!(id);
        one_err(v, "id", |k| matches!(k, FenceErrorKind::BadId(_)));
    }
    let mut v = poly_feature(json!({}));
    v["id"] = json!("x".repeat(257));
    one_err(v, "id", |k| matches!(k, FenceErrorKind::BadId(_)));
}

#[test]
fn every_property_error_is_reported_with_its_path() {
    let e = errs(poly_feature(json!({
        "dwell": ["10m", "soon", 0, -5], "exit_buffer_m": -1, "enter_confirm": 0,
        "exit_confirm": 1.5, "confirm_within": "0s", "stale_after": true,
        "max_accuracy_m": 0, "tags": "x", "name": 7, "colour": "red", "radius_m": 10})));
    let got: Vec<(&str, &FenceErrorKind)> = e.iter().map(|e| (e.path.as_str(), &e.kind)).collect();
    type Check = fn(&FenceErrorKind) -> bool;
    let expect: &[(&str, Check)] = &[
        ("properties.dwell[1]", |k| {
            matches!(k, FenceErrorKind::BadDuration(_))
        }),
        ("properties.dwell[2]", |k| {
            matches!(k, FenceErrorKind::NotPositive)
        }),
        ("properties.dwell[3]", |k| {
            matches!(k, FenceErrorKind::BadDuration(_))
        }),
        ("properties.exit_buffer_m", |k| {
            matches!(k, FenceErrorKind::OutOfRange { .. })
        }),
        ("properties.enter_confirm", |k| {
            matches!(k, FenceErrorKind::OutOfRange { .. })
        }),
        ("properties.exit_confirm", |k| {
            matches!(k, FenceErrorKind::WrongType(_))
        }),
        ("properties.confirm_within", |k| {
            matches!(k, FenceErrorKind::NotPositive)
        }),
        ("properties.stale_after", |k| {
            matches!(k, FenceErrorKind::WrongType(_))
        }),
        ("properties.max_accuracy_m", |k| {
            matches!(k, FenceErrorKind::NotPositive)
        }),
        ("properties.tags", |k| {
            matches!(k, FenceErrorKind::WrongType(_))
        }),
        ("properties.name", |k| {
            matches!(k, FenceErrorKind::WrongType(_))
        }),
        ("properties.colour", |k| {
            matches!(k, FenceErrorKind::UnknownProperty(_))
        }),
        ("properties.radius_m", |k| {
            matches!(k, FenceErrorKind::RadiusOnPolygon)
        }),
    ];
    assert_eq!(got.len(), expect.len(), "{got:?}");
    for (path, pred) in expect {
        assert!(
            got.iter().any(|(p, k)| p == path && pred(k)),
            "missing error at {path}: {got:?}"
        );
    }
}

#[test]
fn too_many_thresholds_and_bounds() {
    let many: Vec<String> = (1..=17).map(|i| format!("{i}m")).collect();
    one_err(
        poly_feature(json!({"dwell": many})),
        "properties.dwell",
        |k| matches!(k, FenceErrorKind::TooManyThresholds { count: 17, .. }),
    );
    let ok: Vec<String> = (1..=16).map(|i| format!("{i}m")).collect();
    assert!(parse(poly_feature(json!({"dwell": ok}))).is_ok());
    one_err(
        poly_feature(json!({"exit_confirm": 101})),
        "properties.exit_confirm",
        |k| matches!(k, FenceErrorKind::OutOfRange { .. }),
    );
    assert!(parse(poly_feature(json!({"exit_confirm": 100}))).is_ok());
    one_err(
        poly_feature(json!({"exit_buffer_m": 1e9})),
        "properties.exit_buffer_m",
        |k| matches!(k, FenceErrorKind::OutOfRange { .. }),
    );
    one_err(
        poly_feature(json!({"name": "n".repeat(300)})),
        "properties.name",
        |k| matches!(k, FenceErrorKind::TooLong { .. }),
    );
    one_err(
        poly_feature(json!({"dwell": {"a": 1}})),
        "properties.dwell",
        |k| matches!(k, FenceErrorKind::WrongType(_)),
    );
}

#[test]
fn geometry_errors_carry_coordinate_paths() {
    let v = json!({"type": "Feature", "id": "g", "properties": {},
        "geometry": {"type": "Polygon", "coordinates": [
            [[0, 0], [1, 0], [1, 1], [0, 0.5]],
            [[0, 0], [181, 0], [1, 95], [0, 0]],
            [[0, 0], [1, 0], [0, 0]]]}});
    let e = errs(v);
    let has = |path: &str, pred: fn(&FenceErrorKind) -> bool| {
        assert!(
            e.iter().any(|x| x.path == path && pred(&x.kind)),
            "no {path} in {e:?}"
        );
    };
    has("geometry.coordinates[0]", |k| {
        matches!(k, FenceErrorKind::RingNotClosed)
    });
    has("geometry.coordinates[1][1]", |k| {
        matches!(k, FenceErrorKind::LonOutOfRange(_))
    });
    has("geometry.coordinates[1][2]", |k| {
        matches!(k, FenceErrorKind::LatOutOfRange(_))
    });
    has("geometry.coordinates[2]", |k| {
        matches!(k, FenceErrorKind::RingTooShort { len: 3 })
    });
    assert_eq!(e.len(), 4, "{e:?}");
}

#[test]
fn bad_positions_and_non_finite_coordinates() {
    let v = json!({"type": "Feature", "id": "g", "properties": {},
        "geometry": {"type": "MultiPolygon", "coordinates": [[[[0, 0], [1], [1, 1], [0, 0]]]]}});
    one_err(v, "geometry.coordinates[0][0][1]", |k| {
        matches!(k, FenceErrorKind::BadPosition { len: 1 })
    });
    let mut ring = square(0.0, 0.0, 1.0);
    ring[2] = [f64::NAN, 1.0];
    let e = Fence::new_polygon("n", &[vec![ring]], FenceSettings::default(), &limits())
        .expect_err("NaN");
    assert_eq!(e.0.len(), 1);
    assert_eq!(e.0[0].path, "geometry.coordinates[0][2]");
    assert!(matches!(e.0[0].kind, FenceErrorKind::NonFinite));
}

#[test]
fn empty_and_unsupported_geometries() {
    let base = |g: serde_json::Value| json!({"type": "Feature", "id": "g", "properties": {}, "geometry": g});
    one_err(
        base(json!({"type": "Polygon", "coordinates": []})),
        "geometry.coordinates",
        |k| matches!(k, FenceErrorKind::EmptyPolygon),
    );
    one_err(
        base(json!({"type": "MultiPolygon", "coordinates": []})),
        "geometry.coordinates",
        |k| matches!(k, FenceErrorKind::EmptyPolygon),
    );
    one_err(
        base(json!({"type": "LineString", "coordinates": [[0, 0], [1, 1]]})),
        "geometry.type",
        |k| matches!(k, FenceErrorKind::UnsupportedGeometry { found } if found == "LineString"),
    );
    one_err(
        base(json!({"type": "GeometryCollection", "geometries": []})),
        "geometry.type",
        |k| matches!(k, FenceErrorKind::UnsupportedGeometry { .. }),
    );
    one_err(
        base(json!({"type": "Point", "coordinates": [0, 0]})),
        "properties",
        |k| matches!(k, FenceErrorKind::MissingRadius),
    );
    one_err(base(serde_json::Value::Null), "geometry", |k| {
        matches!(k, FenceErrorKind::MissingGeometry)
    });
}

#[test]
fn circle_radius_bounds() {
    let c = |r: serde_json::Value| {
        json!({"type": "Feature", "id": "c",
        "geometry": {"type": "Point", "coordinates": [0, 0]}, "properties": {"radius_m": r}})
    };
    for r in [json!(0), json!(-3), json!(1_000_001)] {
        one_err(c(r), "properties.radius_m", |k| {
            matches!(k, FenceErrorKind::RadiusOutOfRange { .. })
        });
    }
    one_err(c(json!("big")), "properties.radius_m", |k| {
        matches!(k, FenceErrorKind::WrongType(_))
    });
    assert!(parse(c(json!(1_000_000))).is_ok());
}

#[test]
fn vertex_limit_and_antimeridian_edges() {
    let small = FenceLimits {
        max_vertices: 4,
        ..limits()
    };
    let e = Fence::new_polygon(
        "v",
        &[vec![square(0.0, 0.0, 1.0)]],
        FenceSettings::default(),
        &small,
    )
    .expect_err("5 > 4");
    assert!(matches!(
        e.0[0].kind,
        FenceErrorKind::TooManyVertices { count: 5, max: 4 }
    ));
    let ring = vec![
        [170.0, 0.0],
        [-170.0, 0.0],
        [-170.0, 1.0],
        [170.0, 1.0],
        [170.0, 0.0],
    ];
    let e = Fence::new_polygon("am", &[vec![ring]], FenceSettings::default(), &limits())
        .expect_err("crosses");
    assert_eq!(e.0.len(), 2, "{e}");
    assert_eq!(e.0[0].path, "geometry.coordinates[0][1]");
    assert!(matches!(
        e.0[0].kind,
        FenceErrorKind::AntimeridianEdge { .. }
    ));
    assert!(e.to_string().contains("MultiPolygon"));
}

#[test]
fn collections_index_errors_by_feature_and_reject_duplicates() {
    let good = poly_feature(json!({}));
    let mut bad = poly_feature(json!({"dwell": ["x"]}));
    bad["id"] = json!("f2");
    let doc: GeoJson = serde_json::from_value(json!({"type": "FeatureCollection",
        "features": [good.clone(), bad, good]}))
    .expect("geojson");
    let e = parse_fences(&doc, &limits()).expect_err("errors");
    let paths: Vec<&str> = e.0.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["features[1].properties.dwell[0]", "features[2].id"]);
    assert!(matches!(e.0[1].kind, FenceErrorKind::DuplicateId(_)));
    let ok: GeoJson = serde_json::from_value(json!({"type": "FeatureCollection",
        "features": [poly_feature(json!({}))]}))
    .expect("geojson");
    assert_eq!(parse_fences(&ok, &limits()).expect("valid").len(), 1);
    let geom: GeoJson =
        serde_json::from_value(json!({"type": "Point", "coordinates": [0, 0]})).expect("geojson");
    let e = parse_fences(&geom, &limits()).expect_err("not a feature");
    assert!(matches!(e.0[0].kind, FenceErrorKind::NotAFeature { .. }));
    let e = parse_fences_str("{not json", &limits()).expect_err("json");
    assert!(matches!(e.0[0].kind, FenceErrorKind::Json(_)));
}

#[test]
fn error_flood_is_capped() {
    let ring: Vec<[f64; 2]> = (0..500).map(|i| [200.0 + i as f64, 0.0]).collect();
    let e = Fence::new_polygon("x", &[vec![ring]], FenceSettings::default(), &limits())
        .expect_err("bad");
    assert_eq!(e.0.len(), limits().max_errors + 1);
    assert!(matches!(
        e.0.last().map(|e| &e.kind),
        Some(FenceErrorKind::TooManyErrors { more: 400 })
    ));
}

// ---------------------------------------------------------------- exact tests

#[test]
fn boundary_is_inclusive_and_holes_excluded() {
    let f = fence_with_hole();
    assert!(f.contains(0.5, 0.5));
    assert!(!f.contains(2.0, 2.0), "hole interior");
    assert!(!f.contains(4.5, 2.0));
    assert!(!f.contains(-0.001, 2.0));
    for (x, y) in [(0.0, 0.0), (4.0, 4.0), (4.0, 0.0), (0.0, 4.0)] {
        assert!(f.contains(x, y), "outer vertex {x},{y}");
    }
    for (x, y) in [(2.0, 0.0), (4.0, 2.0), (0.0, 3.5), (1.25, 4.0)] {
        assert!(f.contains(x, y), "outer edge {x},{y}");
    }
    for (x, y) in [(1.0, 1.0), (3.0, 3.0), (2.0, 1.0), (3.0, 2.5), (1.0, 2.0)] {
        assert!(f.contains(x, y), "hole boundary {x},{y}");
    }
    assert!(!f.contains(f64::NAN, 1.0));
    // A slanted edge: the midpoint of (0,0)-(2,2) of a triangle is exactly representable.
    let t = Fence::new_polygon(
        "t",
        &[vec![vec![[0.0, 0.0], [2.0, 0.0], [2.0, 2.0], [0.0, 0.0]]]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    assert!(t.contains(1.0, 1.0));
    assert!(t.contains(0.5, 0.5));
    assert!(!t.contains(0.5, 0.5 + 1e-12));
}

#[test]
fn multipolygon_parts() {
    let f = Fence::new_polygon(
        "m",
        &[vec![square(0.0, 0.0, 1.0)], vec![square(5.0, 5.0, 1.0)]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    assert!(f.contains(0.5, 0.5));
    assert!(f.contains(5.5, 5.5));
    assert!(!f.contains(3.0, 3.0));
    assert_eq!(f.envelopes().len(), 2);
    let j = serde_json::to_value(f.to_feature()).expect("json");
    assert_eq!(j["geometry"]["type"], json!("MultiPolygon"));
}

#[test]
fn circle_contains_and_distance() {
    let c = Fence::new_circle("c", 10.0, 45.0, 1000.0, FenceSettings::default(), &limits())
        .expect("valid");
    // Due north by exactly 1000 m of arc minus/plus a millimetre.
    let dlat = |m: f64| (m / EARTH_RADIUS_M).to_degrees();
    assert!(c.contains(10.0, 45.0 + dlat(999.999)));
    assert!(!c.contains(10.0, 45.0 + dlat(1000.001)));
    let d = c.distance_m(10.0, 45.0 + dlat(1500.0));
    assert!((d - 500.0).abs() < 1e-6, "{d}");
    assert_eq!(c.distance_m(10.0, 45.0), 0.0);
    assert!(c.within_m(10.0, 45.0 + dlat(1500.0), 500.001));
    assert!(!c.within_m(10.0, 45.0 + dlat(1500.0), 499.999));
}

#[test]
fn circle_across_the_antimeridian() {
    let c = Fence::new_circle(
        "am",
        179.995,
        0.0,
        2000.0,
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    assert_eq!(c.envelopes().len(), 2);
    // 0.015° of longitude at the equator is ~1668 m from the centre, on the other side.
    assert!(c.contains(-179.99, 0.0));
    assert!(c.contains(180.0, 0.0) && c.contains(-180.0, 0.0));
    assert!(!c.contains(-179.97, 0.0));
    let mut idx = FenceIndex::new();
    let (i, _) = idx.upsert(Arc::new(c));
    for lon in [-179.99, 179.99, 180.0, -180.0] {
        let mut out = Vec::new();
        idx.containing(lon, 0.0, &mut out);
        assert_eq!(out, vec![i], "lon {lon}");
    }
}

#[test]
fn circle_near_a_pole() {
    let c = Fence::new_circle(
        "np",
        0.0,
        89.99,
        5000.0,
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    // The cap holds the pole: the envelope is the whole longitude band.
    assert_eq!(
        c.envelopes(),
        vec![[-180.0, c.envelopes()[0][1], 180.0, 90.0]]
    );
    assert!(c.contains(180.0, 89.99)); // ~2.2 km away across the pole
    assert!(c.contains(0.0, 90.0));
    assert!(!c.contains(0.0, 89.9));
    let mut idx = FenceIndex::new();
    idx.upsert(Arc::new(c));
    let mut out = Vec::new();
    idx.containing(-135.0, 89.995, &mut out);
    assert_eq!(out.len(), 1);
}

#[test]
fn polygon_distances_on_the_local_plane() {
    let f = Fence::new_polygon(
        "d",
        &[vec![square(0.0, 0.0, 0.01)]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    let m_per_deg = 6_371_008.8 * std::f64::consts::PI / 180.0;
    let d = f.distance_m(0.02, 0.005);
    assert!(
        (d - 0.01 * m_per_deg * 0.005f64.to_radians().cos()).abs() < 1e-6,
        "{d}"
    );
    let d = f.distance_m(0.005, -0.01);
    assert!((d - 0.01 * m_per_deg).abs() < 1e-6, "{d}");
    assert_eq!(f.distance_m(0.005, 0.005), 0.0);
    assert_eq!(f.distance_m(0.0, 0.0), 0.0);
    // Corner: diagonal distance.
    let d = f.distance_m(0.02, 0.02);
    let kx = m_per_deg * 0.02f64.to_radians().cos();
    assert!(
        (d - (0.01f64 * kx).hypot(0.01 * m_per_deg)).abs() < 1e-6,
        "{d}"
    );
    // At 60° N a degree of longitude is half as long.
    let g = Fence::new_polygon(
        "g",
        &[vec![square(0.0, 59.0, 2.0)]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    let d = g.distance_m(3.0, 60.0);
    assert!((d - m_per_deg * 0.5).abs() < 1e-6, "{d}");
    // Holes count as boundary: inside the hole the distance is to the hole's ring.
    let h = fence_with_hole();
    let d = h.distance_m(2.0, 2.5);
    assert!((d - 0.5 * m_per_deg).abs() < 1e-3, "{d}");
    assert!(h.within_m(2.0, 2.5, 0.6 * m_per_deg));
    assert!(!h.within_m(2.0, 2.5, 0.4 * m_per_deg));
}

#[test]
fn polygon_split_at_the_antimeridian() {
    let east = vec![
        [170.0, -1.0],
        [180.0, -1.0],
        [180.0, 1.0],
        [170.0, 1.0],
        [170.0, -1.0],
    ];
    let west = vec![
        [-180.0, -1.0],
        [-170.0, -1.0],
        [-170.0, 1.0],
        [-180.0, 1.0],
        [-180.0, -1.0],
    ];
    let f = Fence::new_polygon(
        "fiji",
        &[vec![east], vec![west]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    for lon in [175.0, 180.0, -180.0, -175.0] {
        assert!(f.contains(lon, 0.0), "{lon}");
    }
    assert!(!f.contains(0.0, 0.0));
    // The short way round: from -169° to the part whose edge is at -170°, and from 169° too.
    let m = Fence::M_PER_DEG;
    assert!((f.distance_m(-169.0, 0.0) - m).abs() < 1e-6);
    assert!((f.distance_m(169.0, 0.0) - m).abs() < 1e-6);
    let only_east = Fence::new_polygon(
        "e",
        &[vec![vec![
            [170.0, -1.0],
            [180.0, -1.0],
            [180.0, 1.0],
            [170.0, 1.0],
            [170.0, -1.0],
        ]]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    assert!((only_east.distance_m(-179.0, 0.0) - m).abs() < 1e-6);
    let mut idx = FenceIndex::new();
    let (i, _) = idx.upsert(Arc::new(f));
    let mut out = Vec::new();
    idx.candidates(-180.0, 0.0, &mut out);
    assert_eq!(
        out,
        vec![i],
        "one entry per fence even when both parts touch the point"
    );
}

// ---------------------------------------------------------------- index

#[test]
fn index_insert_replace_remove() {
    let mut idx = FenceIndex::new();
    assert!(idx.is_empty());
    let mk = |id: &str, x: f64| {
        Arc::new(
            Fence::new_polygon(
                id,
                &[vec![square(x, 0.0, 1.0)]],
                FenceSettings::default(),
                &limits(),
            )
            .expect("valid"),
        )
    };
    let (a, old) = idx.upsert(mk("a", 0.0));
    assert!(old.is_none());
    let (b, _) = idx.upsert(mk("b", 10.0));
    assert_ne!(a, b);
    assert_eq!(idx.len(), 2);
    assert_eq!(idx.idx_of("b"), Some(b));
    let q = |idx: &FenceIndex, x: f64| {
        let mut out = Vec::new();
        idx.containing(x, 0.5, &mut out);
        out
    };
    assert_eq!(q(&idx, 0.5), vec![a]);
    assert_eq!(q(&idx, 10.5), vec![b]);
    // Replace "a" with a fence elsewhere: same idx, old envelope gone.
    let (a2, old) = idx.upsert(mk("a", 20.0));
    assert_eq!(a2, a);
    assert!(old.is_some_and(|o| o.contains(0.5, 0.5)));
    assert!(q(&idx, 0.5).is_empty());
    assert_eq!(q(&idx, 20.5), vec![a]);
    assert_eq!(idx.envelope_count(), 2);
    // Remove, then the slot is reused.
    let (r, f) = idx.remove("a").expect("present");
    assert_eq!((r, &*f.id), (a, "a"));
    assert!(idx.remove("a").is_none());
    assert!(q(&idx, 20.5).is_empty());
    assert!(idx.get(a).is_none());
    let (c, _) = idx.upsert(mk("c", 30.0));
    assert_eq!(c, a);
    let ids: Vec<&str> = idx.iter().map(|(_, f)| &*f.id).collect();
    assert_eq!(ids, ["c", "b"]);
    // Candidates are envelope hits only: the triangle's empty corner is a candidate, not a hit.
    let tri = Fence::new_polygon(
        "tri",
        &[vec![vec![
            [50.0, 0.0],
            [51.0, 0.0],
            [51.0, 1.0],
            [50.0, 0.0],
        ]]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    let (t, _) = idx.upsert(Arc::new(tri));
    let mut out = vec![FenceIdx(999)];
    idx.candidates(50.1, 0.9, &mut out);
    assert_eq!(out, vec![FenceIdx(999), t], "appends");
    out.clear();
    idx.containing(50.1, 0.9, &mut out);
    assert!(out.is_empty());
    let cloned = idx.clone();
    assert_eq!(cloned.len(), 3);
    assert!(format!("{idx:?}").contains("fences: 3"));
}

#[test]
fn containing_equals_testing_every_fence() {
    // Mixed shapes, including ones touching the antimeridian and a pole, overlapping each other.
    let mut fences = vec![
        Fence::new_circle(
            "c1",
            179.99,
            10.0,
            3000.0,
            FenceSettings::default(),
            &limits(),
        ),
        Fence::new_circle(
            "c2",
            0.0,
            89.99,
            4000.0,
            FenceSettings::default(),
            &limits(),
        ),
        Fence::new_circle(
            "c3",
            0.5,
            0.5,
            40_000.0,
            FenceSettings::default(),
            &limits(),
        ),
        Fence::new_polygon(
            "p1",
            &[vec![square(0.0, 0.0, 1.0)]],
            FenceSettings::default(),
            &limits(),
        ),
        Fence::new_polygon(
            "p2",
            &[
                vec![square(179.5, 9.5, 0.5)],
                vec![square(-180.0, 9.5, 0.5)],
            ],
            FenceSettings::default(),
            &limits(),
        ),
    ];
    fences.push(Fence::new_polygon(
        "big",
        &[ragged(2000, 3)],
        FenceSettings::default(),
        &limits(),
    ));
    let mut idx = FenceIndex::new();
    for f in fences {
        idx.upsert(Arc::new(f.expect("valid")));
    }
    let mut s = 12345u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut probes: Vec<[f64; 2]> = (0..3000)
        .map(|_| [rnd() * 3.0 - 1.5, rnd() * 3.0 - 1.5])
        .collect();
    probes.extend((0..500).map(|_| [179.4 + rnd() * 0.6, 9.4 + rnd() * 0.7]));
    probes.extend((0..500).map(|_| [-180.0 + rnd() * 0.6, 9.4 + rnd() * 0.7]));
    probes.extend((0..300).map(|_| [rnd() * 360.0 - 180.0, 89.9 + rnd() * 0.1]));
    probes.extend([
        [180.0, 10.0],
        [-180.0, 10.0],
        [180.0, 9.7],
        [-180.0, 9.5],
        [0.0, 90.0],
    ]);
    let mut hits = 0;
    for p in probes {
        let mut got = Vec::new();
        idx.containing(p[0], p[1], &mut got);
        got.sort();
        let want: Vec<FenceIdx> = idx
            .iter()
            .filter(|(_, f)| f.contains(p[0], p[1]))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(got, want, "at {p:?}");
        let mut cands = Vec::new();
        idx.candidates(p[0], p[1], &mut cands);
        assert!(
            want.iter().all(|i| cands.contains(i)),
            "candidates miss a fence at {p:?}"
        );
        let mut dedup = cands.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), cands.len(), "duplicate candidates at {p:?}");
        hits += want.len();
    }
    assert!(hits > 1000, "{hits}");
}

#[test]
fn f32_envelopes_never_miss_a_boundary_point() {
    // Coordinates that f32 cannot represent: the envelope is rounded outward, the query to
    // nearest; vertices and points on the bbox edges must still be found.
    let ring = vec![
        [0.1, 0.3],
        [0.7000000000000001, 0.3],
        [0.7000000000000001, 0.9000000000000001],
        [0.1, 0.9000000000000001],
        [0.1, 0.3],
    ];
    let mut idx = FenceIndex::new();
    let (i, _) = idx.upsert(Arc::new(
        Fence::new_polygon(
            "f",
            &[vec![ring.clone()]],
            FenceSettings::default(),
            &limits(),
        )
        .expect("valid"),
    ));
    for p in ring
        .iter()
        .chain(&[[0.4, 0.3], [0.1, 0.6], [0.7000000000000001, 0.5]])
    {
        let mut out = Vec::new();
        idx.containing(p[0], p[1], &mut out);
        assert_eq!(out, vec![i], "{p:?}");
    }
    let mut out = Vec::new();
    idx.containing(0.1 - 1e-12, 0.5, &mut out);
    assert!(
        out.is_empty(),
        "just outside: the exact test rejects the extra candidate"
    );
}

// ---------------------------------------------------------------- edge grid

/// A ragged "coastline": a noisy radial boundary with `n` vertices, with a hole.
fn ragged(n: usize, seed: u64) -> Vec<Vec<[f64; 2]>> {
    let mut s = seed | 1;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut outer: Vec<[f64; 2]> = (0..n)
        .map(|i| {
            let a = i as f64 / n as f64 * std::f64::consts::TAU;
            let r = 1.0 + 0.3 * (a * 7.0).sin() + 0.25 * rnd();
            [r * a.cos(), r * a.sin()]
        })
        .collect();
    outer.push(outer[0]);
    let hole = vec![
        [-0.1, -0.1],
        [-0.1, 0.1],
        [0.1, 0.1],
        [0.1, -0.1],
        [-0.1, -0.1],
    ];
    vec![outer, hole]
}

#[test]
fn large_polygons_use_the_edge_grid_and_agree_with_the_plain_scan() {
    let rings = ragged(5000, 7);
    let f = Fence::new_polygon(
        "big",
        std::slice::from_ref(&rings),
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    assert_eq!(f.indexed_parts(), 1);
    let small = Fence::new_polygon(
        "s",
        &[vec![square(0.0, 0.0, 1.0)]],
        FenceSettings::default(),
        &limits(),
    )
    .expect("valid");
    assert_eq!(small.indexed_parts(), 0);
    let mut inside = 0;
    let mut checked = 0;
    for ring in &rings {
        for w in ring.windows(2) {
            for t in [0.0, 0.5] {
                let (x, y) = (
                    w[0][0] + t * (w[1][0] - w[0][0]),
                    w[0][1] + t * (w[1][1] - w[0][1]),
                );
                for (dx, dy) in [(0.0, 0.0), (1e-9, 0.0), (-1e-9, 1e-9), (0.0, -1e-12)] {
                    let (px, py) = (x + dx, y + dy);
                    let a = f.contains(px, py);
                    assert_eq!(a, f.contains_unindexed(px, py), "at {px},{py}");
                    inside += usize::from(a);
                    checked += 1;
                }
            }
        }
    }
    assert!(
        inside > checked / 10 && inside < checked,
        "{inside}/{checked}"
    );
    for v in &rings[0] {
        assert!(f.contains(v[0], v[1]), "vertex is boundary");
    }
    for (x, y) in [(0.0, 0.0), (0.5, 0.5), (3.0, 0.0), (0.0, 1.0), (-0.9, -0.2)] {
        assert_eq!(f.contains(x, y), f.contains_unindexed(x, y));
        assert_eq!(f.distance_m(x, y), f.distance_m_unindexed(x, y), "{x},{y}");
    }
    assert!(!f.contains(0.0, 0.0), "hole");
    assert!(f.contains(0.5, 0.0));
}

#[test]
fn pathological_shapes_build_a_bounded_grid_and_agree() {
    // Long diagonal edges (a zigzag comb spanning the full height) and an extreme aspect ratio
    // (100° wide, 1e-9° tall): the grid must be coarsened until it fits, and terminate.
    let comb = |n: usize, height: f64| {
        let mut r: Vec<[f64; 2]> = (0..n)
            .map(|i| {
                [
                    i as f64 * 100.0 / n as f64,
                    if i % 2 == 0 { 0.0 } else { height },
                ]
            })
            .collect();
        r.push([100.0, -height]);
        r.push([0.0, -height]);
        r.push(r[0]);
        r
    };
    for (n, height) in [(2000, 1.0), (2000, 1e-9), (600, 80.0)] {
        let ring = comb(n, height);
        let f = Fence::new_polygon(
            "comb",
            &[vec![ring.clone()]],
            FenceSettings::default(),
            &limits(),
        )
        .expect("valid");
        assert_eq!(f.indexed_parts(), 1);
        assert!(f.heap_bytes() < 64 * 1024 * 1024, "{}", f.heap_bytes());
        for k in 0..400 {
            let x = k as f64 * 0.2503;
            for y in [-height * 0.5, 0.0, height * 0.25, height * 0.5, height] {
                assert_eq!(
                    f.contains(x, y),
                    f.contains_unindexed(x, y),
                    "n={n} at {x},{y}"
                );
            }
        }
        for v in &ring {
            assert!(f.contains(v[0], v[1]));
        }
    }
}

fn grid_polygon() -> impl Strategy<Value = (Vec<Vec<[f64; 2]>>, Vec<[f64; 2]>)> {
    // Vertices on a coarse grid make horizontal edges, collinear runs, repeated vertices and
    // self-intersections common: the degenerate cases where an index could disagree.
    let ring = prop::collection::vec((0i32..16, 0i32..16), 3..60);
    let rings = prop::collection::vec(ring, 1..3);
    let pts = prop::collection::vec((0i32..64, 0i32..64, 0u8..3), 1..40);
    (rings, pts).prop_map(|(rings, pts)| {
        let rings: Vec<Vec<[f64; 2]>> = rings
            .into_iter()
            .map(|r| {
                let mut r: Vec<[f64; 2]> = r
                    .into_iter()
                    .map(|(x, y)| [x as f64 * 0.25, y as f64 * 0.25])
                    .collect();
                r.push(r[0]);
                r
            })
            .collect();
        let pts = pts
            .into_iter()
            .map(|(x, y, k)| {
                // Grid points (often exactly on edges/vertices), or slightly off them.
                let off = match k {
                    0 => 0.0,
                    1 => 1e-9,
                    _ => -1e-13,
                };
                [x as f64 * 0.0625 - 0.1 + off, y as f64 * 0.0625 - 0.1 - off]
            })
            .collect();
        (rings, pts)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn edge_grid_equals_plain_scan((rings, pts) in grid_polygon()) {
        let forced = FenceLimits { index_threshold: 1, ..FenceLimits::default() };
        let f = Fence::new_polygon("p", std::slice::from_ref(&rings), FenceSettings::default(), &forced)
            .expect("grid polygons are valid");
        prop_assert_eq!(f.indexed_parts(), 1);
        let mut probes = pts;
        // Every vertex and every edge midpoint, which are exactly on the boundary.
        for r in &rings {
            for w in r.windows(2) {
                probes.push(w[0]);
                probes.push([(w[0][0] + w[1][0]) * 0.5, (w[0][1] + w[1][1]) * 0.5]);
            }
        }
        for p in probes {
            let indexed = f.contains(p[0], p[1]);
            prop_assert_eq!(indexed, f.contains_unindexed(p[0], p[1]), "at {:?}", p);
            if !indexed {
                prop_assert_eq!(f.distance_m(p[0], p[1]), f.distance_m_unindexed(p[0], p[1]));
            }
        }
        for r in &rings {
            for w in r.windows(2) {
                prop_assert!(f.contains(w[0][0], w[0][1]), "vertex {:?} is boundary", w[0]);
            }
        }
    }

    #[test]
    fn ragged_edge_grid_equals_plain_scan(seed in 1u64.., n in 300usize..3000, px in -1.6f64..1.6, py in -1.6f64..1.6) {
        let rings = ragged(n, seed);
        let f = Fence::new_polygon("r", std::slice::from_ref(&rings), FenceSettings::default(), &limits())
            .expect("valid");
        prop_assert_eq!(f.indexed_parts(), 1);
        prop_assert_eq!(f.contains(px, py), f.contains_unindexed(px, py));
        prop_assert_eq!(f.distance_m(px, py), f.distance_m_unindexed(px, py));
        // Points on and next to a pseudo-random edge.
        let k = (seed as usize) % (rings[0].len() - 1);
        let (a, b) = (rings[0][k], rings[0][k + 1]);
        for t in [0.0, 0.25, 0.5, 1.0] {
            for e in [0.0, 1e-10, -1e-10] {
                let (x, y) = (a[0] + t * (b[0] - a[0]) + e, a[1] + t * (b[1] - a[1]));
                prop_assert_eq!(f.contains(x, y), f.contains_unindexed(x, y));
            }
        }
    }
}

#[test]
fn point_grid_candidates_equal_the_rtree_under_changes() {
    // Envelopes over five orders of magnitude (so some are outliers filed in a coarser level or
    // the big list), circles across the antimeridian and around a pole, many upserts, replaces
    // and removes between queries; probes at random and exactly on envelope corners.
    let mut s = 99u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut idx = FenceIndex::new();
    let mut corners: Vec<[f64; 2]> = Vec::new();
    for round in 0..40 {
        for k in 0..25 {
            let id = format!("f{}", (rnd() * 300.0) as usize);
            let (x, y) = (rnd() * 40.0 - 20.0, rnd() * 40.0 - 20.0);
            let size = 1e-4 * 10f64.powf(rnd() * 5.0);
            let f = match k % 7 {
                0 if round % 3 == 0 => idx.remove(&id).map(|_| None).unwrap_or(None),
                1 => Some(Fence::new_circle(
                    &id,
                    if k % 2 == 0 { 179.99 } else { x },
                    if round % 5 == 0 { 89.95 } else { y },
                    size * 50_000.0,
                    FenceSettings::default(),
                    &limits(),
                )),
                _ => Some(Fence::new_polygon(
                    &id,
                    &[vec![square(x, y, size.min(10.0))]],
                    FenceSettings::default(),
                    &limits(),
                )),
            };
            if let Some(f) = f {
                let f = Arc::new(f.expect("valid"));
                for e in f.envelopes() {
                    corners.push([e[0], e[1]]);
                    corners.push([e[2], e[3]]);
                }
                idx.upsert(f);
            }
        }
        let mut probes: Vec<[f64; 2]> = (0..200)
            .map(|_| [rnd() * 44.0 - 22.0, rnd() * 44.0 - 22.0])
            .collect();
        probes.extend(corners.iter().rev().take(100));
        probes.extend([
            [180.0, 89.99],
            [-180.0, 89.97],
            [179.995, 20.0],
            [0.0, 90.0],
        ]);
        for p in probes {
            let mut grid = Vec::new();
            idx.candidates(p[0], p[1], &mut grid);
            let mut tree = Vec::new();
            idx.candidates_rtree(p[0], p[1], &mut tree);
            grid.sort();
            tree.sort();
            assert_eq!(grid, tree, "round {round} at {p:?}");
            let mut got = Vec::new();
            idx.containing(p[0], p[1], &mut got);
            got.sort();
            let want: Vec<FenceIdx> = idx
                .iter()
                .filter(|(_, f)| f.contains(p[0], p[1]))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(got, want, "round {round} at {p:?}");
        }
    }
    // A bulk-loaded copy answers the same.
    let bulk = FenceIndex::from_fences(idx.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>());
    for _ in 0..500 {
        let p = [rnd() * 44.0 - 22.0, rnd() * 44.0 - 22.0];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        bulk.candidates(p[0], p[1], &mut a);
        bulk.candidates_rtree(p[0], p[1], &mut b);
        a.sort();
        b.sort();
        assert_eq!(a, b, "bulk at {p:?}");
    }
}

/// Shapes crafted against a uniform edge grid, each one closed ring of about `n` vertices in
/// the 0.2° box at (10, 50): a star of long spikes, a comb of vertical teeth, the comb turned
/// 45° and a saw of horizontal teeth.
fn crafted(n: usize) -> Vec<(&'static str, Vec<[f64; 2]>)> {
    let (cx, cy, s) = (10.1, 50.1, 0.1);
    let close = |mut r: Vec<[f64; 2]>| {
        r.push(r[0]);
        r
    };
    let star = (0..n)
        .map(|i| {
            let a = i as f64 / n as f64 * std::f64::consts::TAU;
            let rad = if i % 2 == 0 { s } else { s * 0.05 };
            [cx + rad * a.cos(), cy + rad * a.sin()]
        })
        .collect();
    let comb = || {
        let teeth = n / 4;
        let w = 2.0 * s / teeth as f64;
        let (x0, y0) = (cx - s, cy - s);
        let mut r = vec![[x0, y0], [x0 + 2.0 * s, y0]];
        for i in (0..teeth).rev() {
            let xa = x0 + i as f64 * w;
            r.extend([
                [xa + w / 2.0, y0 + 0.1 * s],
                [xa + w / 2.0, y0 + 2.0 * s],
                [xa, y0 + 2.0 * s],
                [xa, y0 + 0.1 * s],
            ]);
        }
        r.pop();
        r
    };
    let h = std::f64::consts::FRAC_1_SQRT_2;
    let turned = comb()
        .into_iter()
        .map(|p| {
            let (dx, dy) = (p[0] - cx, p[1] - cy);
            [cx + (dx - dy) * h, cy + (dx + dy) * h]
        })
        .collect();
    let saw = comb()
        .into_iter()
        .map(|p| [cx + (p[1] - cy), cy + (p[0] - cx)])
        .collect();
    vec![
        ("star", close(star)),
        ("comb", close(comb())),
        ("comb-45", close(turned)),
        ("saw", close(saw)),
    ]
}

#[test]
fn crafted_shapes_are_answered_exactly_and_their_cost_is_bounded_or_refused() {
    let relaxed = FenceLimits {
        max_test_edges: usize::MAX,
        ..limits()
    };
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut unit = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    for (name, ring) in crafted(20_000) {
        let f = Fence::new_polygon(
            name,
            std::slice::from_ref(&vec![ring.clone()]),
            FenceSettings::default(),
            &relaxed,
        )
        .expect("valid");
        assert_eq!(f.indexed_parts(), 1, "{name}");
        let cost = f.test_cost();
        assert!(cost.mean <= cost.worst as f64, "{name}: {cost:?}");
        // Under the default limit: accepted exactly when the costliest test is within it.
        match Fence::new_polygon(
            name,
            std::slice::from_ref(&vec![ring.clone()]),
            FenceSettings::default(),
            &limits(),
        ) {
            Ok(_) => assert!(cost.worst <= DEFAULT_MAX_TEST_EDGES, "{name}: {cost:?}"),
            Err(e) => {
                assert!(cost.worst > DEFAULT_MAX_TEST_EDGES, "{name}: {cost:?}");
                assert!(
                    matches!(e.0[0].kind, FenceErrorKind::TooCostly { edges, max }
                        if edges == cost.worst && max == DEFAULT_MAX_TEST_EDGES),
                    "{name}: {e:?}"
                );
            }
        }
        // The grid answers exactly, at random points, vertices and edge midpoints.
        let b = f.envelopes()[0];
        for _ in 0..3000 {
            let (x, y) = (b[0] + unit() * (b[2] - b[0]), b[1] + unit() * (b[3] - b[1]));
            assert_eq!(
                f.contains(x, y),
                f.contains_unindexed(x, y),
                "{name} at {x},{y}"
            );
        }
        for w in ring.windows(2).step_by(7) {
            let m = [(w[0][0] + w[1][0]) / 2.0, (w[0][1] + w[1][1]) / 2.0];
            for p in [w[0], m] {
                assert_eq!(
                    f.contains(p[0], p[1]),
                    f.contains_unindexed(p[0], p[1]),
                    "{name} at {p:?}"
                );
            }
        }
    }
    // The walk-defeating combs and saw are cheap now; the star of long spikes is what the limit
    // is for.
    let cost = |name: &str| {
        let ring = crafted(20_000).into_iter().find(|s| s.0 == name).unwrap().1;
        Fence::new_polygon(name, &[vec![ring]], FenceSettings::default(), &relaxed)
            .unwrap()
            .test_cost()
            .worst
    };
    assert!(cost("comb") < 1000, "{}", cost("comb"));
    assert!(cost("saw") < 1000, "{}", cost("saw"));
    assert!(cost("star") > DEFAULT_MAX_TEST_EDGES, "{}", cost("star"));
}
