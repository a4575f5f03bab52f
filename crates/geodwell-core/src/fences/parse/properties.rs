//! Validation of a Feature's properties into [`FenceSettings`] and a name.
//!
//! Invariants of what it returns: every property name is one of [`KNOWN_PROPERTIES`]; `null`
//! means absent (the default applies); dwell thresholds are positive, sorted, distinct and at
//! most [`MAX_THRESHOLDS`]; every number is within its documented bounds (`docs/fences.md`).

use std::sync::Arc;

use geojson::JsonObject;
use serde_json::Value;

use super::super::{
    DEFAULT_CONFIRM_WITHIN, DEFAULT_STALE_AFTER, DeviceScope, FenceSettings, MAX_CONFIRM,
    MAX_DEVICE_PATTERNS, MAX_ID_BYTES, MAX_NAME_BYTES, MAX_THRESHOLDS,
};
use super::FenceLimits;
use super::errors::{Errs, FenceErrorKind};
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
    "devices",
    "tags",
    "name",
];

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

/// The length of `v` as compact JSON, without building the text.
fn compact_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a `Value` to a sink that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Parses the properties into settings and name; `None` parts keep defaults (errors recorded).
pub(super) fn parse_props(
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
                Value::Object(_) | Value::Array(_) if compact_len(v) > limits.max_tags_bytes => {
                    errs.push(
                        path,
                        FenceErrorKind::TooLong {
                            max: limits.max_tags_bytes,
                        },
                    )
                }
                Value::Object(_) | Value::Array(_) => s.tags = Arc::new(v.clone()),
                _ => errs.push(path, FenceErrorKind::WrongType("a JSON object or array")),
            },
            "devices" => match v.as_array() {
                Some(list) if list.is_empty() => errs.push(
                    path,
                    FenceErrorKind::WrongType(
                        "a non-empty array of device id patterns (omit it for every device)",
                    ),
                ),
                Some(list) if list.len() > MAX_DEVICE_PATTERNS => errs.push(
                    path,
                    FenceErrorKind::TooLong {
                        max: MAX_DEVICE_PATTERNS,
                    },
                ),
                Some(list) => {
                    let mut patterns = Vec::with_capacity(list.len());
                    for (i, p) in list.iter().enumerate() {
                        match p.as_str() {
                            Some(t) if !t.is_empty() && t.len() <= MAX_ID_BYTES => {
                                patterns.push(t.to_string())
                            }
                            Some("") => errs.push(
                                format!("{path}[{i}]"),
                                FenceErrorKind::WrongType("a non-empty pattern"),
                            ),
                            Some(_) => errs.push(
                                format!("{path}[{i}]"),
                                FenceErrorKind::TooLong { max: MAX_ID_BYTES },
                            ),
                            None => errs.push(
                                format!("{path}[{i}]"),
                                FenceErrorKind::WrongType("a string"),
                            ),
                        }
                    }
                    s.devices = DeviceScope::new(patterns);
                }
                None => errs.push(
                    path,
                    FenceErrorKind::WrongType("an array of device id patterns"),
                ),
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
