//! Window queries: whether a fence shares a point with a longitude/latitude rectangle (the
//! API's `bbox=` filter). Exact for polygons (closed sets, boundaries included: a fence that
//! only touches the window counts); circles are tested at the point of the window nearest their
//! centre in longitude and latitude, which is exact for circles that do not reach a pole.

use robust::{Coord, orient2d};

use super::edges::PolyPart;
use super::{Circle, Fence, Shape, haversine_m};

/// A closed rectangle in degrees, `min_lon <= max_lon` (a window across the antimeridian is
/// two of them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rect {
    /// West edge.
    pub min_lon: f64,
    /// South edge.
    pub min_lat: f64,
    /// East edge.
    pub max_lon: f64,
    /// North edge.
    pub max_lat: f64,
}

impl Rect {
    /// The rectangle of one point.
    pub fn point(lon: f64, lat: f64) -> Rect {
        Rect {
            min_lon: lon,
            min_lat: lat,
            max_lon: lon,
            max_lat: lat,
        }
    }

    fn holds(&self, p: [f64; 2]) -> bool {
        (self.min_lon..=self.max_lon).contains(&p[0])
            && (self.min_lat..=self.max_lat).contains(&p[1])
    }

    fn meets_bbox(&self, b: &[f64; 4]) -> bool {
        b[0] <= self.max_lon && b[2] >= self.min_lon && b[1] <= self.max_lat && b[3] >= self.min_lat
    }

    fn corners(&self) -> [[f64; 2]; 4] {
        [
            [self.min_lon, self.min_lat],
            [self.max_lon, self.min_lat],
            [self.max_lon, self.max_lat],
            [self.min_lon, self.max_lat],
        ]
    }
}

fn orient(a: [f64; 2], b: [f64; 2], c: [f64; 2]) -> f64 {
    orient2d(
        Coord { x: a[0], y: a[1] },
        Coord { x: b[0], y: b[1] },
        Coord { x: c[0], y: c[1] },
    )
}

/// `c` on segment `a b`, given that the three are collinear.
fn within(a: [f64; 2], b: [f64; 2], c: [f64; 2]) -> bool {
    c[0] >= a[0].min(b[0])
        && c[0] <= a[0].max(b[0])
        && c[1] >= a[1].min(b[1])
        && c[1] <= a[1].max(b[1])
}

/// Whether the closed segments `p1 p2` and `q1 q2` share a point (exact orientation tests).
fn segments_meet(p1: [f64; 2], p2: [f64; 2], q1: [f64; 2], q2: [f64; 2]) -> bool {
    let d1 = orient(q1, q2, p1);
    let d2 = orient(q1, q2, p2);
    let d3 = orient(p1, p2, q1);
    let d4 = orient(p1, p2, q2);
    if ((d1 > 0.0 && d2 < 0.0) || (d1 < 0.0 && d2 > 0.0))
        && ((d3 > 0.0 && d4 < 0.0) || (d3 < 0.0 && d4 > 0.0))
    {
        return true;
    }
    (d1 == 0.0 && within(q1, q2, p1))
        || (d2 == 0.0 && within(q1, q2, p2))
        || (d3 == 0.0 && within(p1, p2, q1))
        || (d4 == 0.0 && within(p1, p2, q2))
}

fn part_meets(p: &PolyPart, r: &Rect) -> bool {
    if !r.meets_bbox(&p.bbox) {
        return false;
    }
    // Two closed regions meet iff a vertex of one lies in the other or their boundaries cross.
    if p.rings().flatten().any(|v| r.holds(*v)) {
        return true;
    }
    let corners = r.corners();
    if corners.iter().any(|c| p.contains(c[0], c[1])) {
        return true;
    }
    let sides = [
        (corners[0], corners[1]),
        (corners[1], corners[2]),
        (corners[2], corners[3]),
        (corners[3], corners[0]),
    ];
    p.rings().any(|ring| {
        ring.windows(2)
            .any(|e| sides.iter().any(|&(a, b)| segments_meet(e[0], e[1], a, b)))
    })
}

fn circle_meets(c: &Circle, r: &Rect) -> bool {
    let lat = c.lat.clamp(r.min_lat, r.max_lat);
    // The centre's longitude as seen from the window, the short way round.
    [c.lon, c.lon - 360.0, c.lon + 360.0]
        .into_iter()
        .any(|lon| {
            let near = lon.clamp(r.min_lon, r.max_lon);
            haversine_m(c.lon, c.lat, near, lat) <= c.radius_m
        })
}

impl Fence {
    /// Whether the fence and the closed rectangle `r` share a point (module docs: exact for
    /// polygons, boundaries included).
    pub fn meets_rect(&self, r: &Rect) -> bool {
        match &self.shape {
            Shape::Circle(c) => circle_meets(c, r),
            Shape::Polygons { parts, .. } => parts.iter().any(|p| part_meets(p, r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fences::parse_fences_str;

    fn fence(geojson: &str) -> Fence {
        parse_fences_str(geojson, &Default::default())
            .unwrap()
            .remove(0)
    }

    fn rect(a: f64, b: f64, c: f64, d: f64) -> Rect {
        Rect {
            min_lon: a,
            min_lat: b,
            max_lon: c,
            max_lat: d,
        }
    }

    #[test]
    fn polygons_meet_windows_that_overlap_touch_or_hold_them() {
        // A square 0..10 with a hole 4..6.
        let f = fence(
            r#"{"type":"Feature","id":"sq","properties":{},"geometry":{"type":"Polygon","coordinates":[[[0,0],[10,0],[10,10],[0,10],[0,0]],[[4,4],[6,4],[6,6],[4,6],[4,4]]]}}"#,
        );
        assert!(f.meets_rect(&rect(-1.0, -1.0, 1.0, 1.0)), "corner overlap");
        assert!(
            f.meets_rect(&rect(-5.0, -5.0, 15.0, 15.0)),
            "window holds the fence"
        );
        assert!(
            f.meets_rect(&rect(1.0, 1.0, 2.0, 2.0)),
            "fence holds the window"
        );
        assert!(
            f.meets_rect(&rect(-1.0, 3.0, 11.0, 3.5)),
            "a band across, no vertex inside"
        );
        assert!(
            f.meets_rect(&rect(10.0, 2.0, 12.0, 3.0)),
            "touching the east edge"
        );
        assert!(!f.meets_rect(&rect(4.5, 4.5, 5.5, 5.5)), "inside the hole");
        assert!(
            f.meets_rect(&rect(4.5, 4.5, 6.0, 5.5)),
            "touching the hole's edge"
        );
        assert!(!f.meets_rect(&rect(10.5, 0.0, 12.0, 10.0)), "beside it");
    }

    #[test]
    fn circles_meet_windows_within_their_radius_also_across_the_antimeridian() {
        let f = fence(
            r#"{"type":"Feature","id":"c","properties":{"radius_m":1000},"geometry":{"type":"Point","coordinates":[179.999,0]}}"#,
        );
        assert!(f.meets_rect(&rect(179.0, -1.0, 180.0, 1.0)));
        assert!(
            f.meets_rect(&rect(-180.0, -1.0, -179.999, 1.0)),
            "reaches over 180"
        );
        assert!(!f.meets_rect(&rect(-179.9, -1.0, -179.0, 1.0)));
        assert!(
            !f.meets_rect(&rect(179.0, 0.02, 180.0, 1.0)),
            "2 km north is outside"
        );
        assert!(
            f.meets_rect(&rect(179.0, 0.008, 180.0, 1.0)),
            "0.9 km north is inside"
        );
    }

    proptest::proptest! {
        /// The index's window query equals testing every fence, and a fence that contains a
        /// point of the window is always reported (triangles and circles at random).
        #[test]
        fn window_queries_match_brute_force_and_never_miss_a_covered_point(
            shapes in proptest::collection::vec(
                (0u8..2, -20.0f64..20.0, -20.0f64..20.0, 0.01f64..5.0, 0.01f64..5.0), 1..30),
            (w, s, dw, ds) in (-25.0f64..25.0, -25.0f64..25.0, 0.0f64..10.0, 0.0f64..10.0),
        ) {
            use crate::fences::{FenceIndex, FenceSettings};
            let fences: Vec<std::sync::Arc<Fence>> = shapes
                .iter()
                .enumerate()
                .map(|(i, &(kind, x, y, a, b))| {
                    let id = format!("f{i}");
                    let f = if kind == 0 {
                        let ring = vec![[x, y], [x + a, y], [x, y + b], [x, y]];
                        Fence::new_polygon(&id, &[vec![ring]], FenceSettings::default(), &Default::default())
                    } else {
                        Fence::new_circle(&id, x, y, a * 50_000.0, FenceSettings::default(), &Default::default())
                    };
                    std::sync::Arc::new(f.unwrap())
                })
                .collect();
            let index = FenceIndex::from_fences(fences.iter().cloned());
            let r = Rect { min_lon: w, min_lat: s, max_lon: w + dw, max_lat: s + ds };
            let mut got = Vec::new();
            index.meeting(&r, &mut got);
            let mut got: Vec<String> = got.iter().map(|i| index.get(*i).unwrap().id.to_string()).collect();
            got.sort();
            let mut want: Vec<String> = fences.iter().filter(|f| f.meets_rect(&r)).map(|f| f.id.to_string()).collect();
            want.sort();
            proptest::prop_assert_eq!(&got, &want);
            for k in 0..=8 {
                for j in 0..=8 {
                    let (lon, lat) = (w + dw * k as f64 / 8.0, s + ds * j as f64 / 8.0);
                    for f in &fences {
                        if f.contains(lon, lat) {
                            proptest::prop_assert!(f.meets_rect(&r), "{} holds {lon},{lat} of the window", f.id);
                        }
                    }
                }
            }
        }
    }
}
