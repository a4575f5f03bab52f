//! A fence out as normalized GeoJSON ([`Fence::to_feature`]): its geometry as stored and every
//! property with its effective value.
//!
//! Invariant: parsing the output back gives an equal fence. The typed constructors build their
//! Feature's properties here too ([`props_json`]), so they go through the same validation.

use geojson::feature::Id;
use geojson::{Feature, Geometry, GeometryValue, JsonObject, Position};
use serde_json::Value;

use super::super::{Fence, FenceSettings, Shape};
use crate::time::Dur;

/// A JSON number, or a string for a non-finite value so that it fails validation instead of
/// turning into `null` (= default).
fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(x.to_string()))
}

/// The normalized properties of a fence.
pub(super) fn props_json(
    s: &FenceSettings,
    name: Option<&str>,
    radius_m: Option<f64>,
) -> JsonObject {
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
    // Every device is the default and is written as the property's absence: `[]` is refused.
    if !s.devices.is_all() {
        p.insert(
            "devices".into(),
            Value::Array(
                s.devices
                    .patterns()
                    .iter()
                    .map(|d| Value::String(d.clone()))
                    .collect(),
            ),
        );
    }
    if let Some(n) = name {
        p.insert("name".into(), Value::String(n.to_string()));
    }
    p
}

pub(super) fn positions(ring: &[[f64; 2]]) -> Vec<Position> {
    ring.iter().map(|&p| Position::from(p)).collect()
}

impl Fence {
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
            foreign_members: self.active_since.map(|t| {
                let mut m = serde_json::Map::new();
                m.insert(super::ACTIVE_SINCE.into(), t.to_rfc3339().into());
                m
            }),
        }
    }
}
