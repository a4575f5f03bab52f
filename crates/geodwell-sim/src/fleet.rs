//! The fleet generator: a seeded, deterministic stream of fixes from devices driving between
//! fences, with the behaviour that makes dwell detection hard in practice.
//!
//! Owns: the per-device movement model and the global merge of all devices' reports into one
//! stream ([`Fleet`]). The fences it drives between come from anywhere; generated ones from
//! [`crate::layout`] (re-exported here, where callers have always found them).
//!
//! Why the rest stays in one file: the movement model (`Site` stop points, `Leg`s, silences,
//! GPS noise) and the merge (the due heap, the disorder heap) share `Fleet`'s state and its
//! per-device PRNG draw order, which the determinism invariant depends on; split, each half
//! would need the other's private fields.
//!
//! Invariants:
//! - Pure: no clock, no I/O. The same [`FleetSpec`] and fences give the same fixes, in the same
//!   order, on every run; each device draws from its own PRNG stream, so a device's trace does
//!   not depend on how many other devices there are.
//! - Without disorder, fixes come out in (ts, device) order. With `disorder = D`, every fix
//!   comes out after all fixes with `ts < its ts - D` ... and before any fix with
//!   `ts > its ts + D`: arrival disorder is bounded by D, so a server with `lateness >= D`
//!   applies them all.
//! - One device never reports twice at the same millisecond.
//!
//! The model (numbers are per device and drawn from its stream):
//! - A device reports every `interval` (drawn once per device in the spec's range, then ±10 %
//!   per report).
//! - It alternates legs: drive in a straight line at 6-22 m/s to a target, then stop. 80 % of
//!   targets are fences: 75 % of those stops are well inside, 25 % are at the fence's edge
//!   (where GPS noise makes the point cross the boundary back and forth). The rest are
//!   roadside stops outside any fence.
//! - Stop lengths: 55 % 20 s-4 min, 25 % 4-15 min, 15 % 15-75 min, 5 % 75 min-4 h; so most
//!   visits end before a 10 min threshold and some pass an hour.
//! - 5 % of stops contain a silence of 16-60 min (longer than the default 15 min
//!   `stale_after`); 1 % of drives contain a 30 s-3 min silence (a tunnel).
//! - GPS noise: normal, sigma 3 m, reported accuracy 3 m + |N(0, 4 m)|; 1 % of fixes are
//!   outliers with sigma 40 m and accuracy 60-150 m.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::rng::Rng;
use geodwell_core::fences::Fence;
use geodwell_core::fix::{DEFAULT_MAX_DEVICE_LEN, Fix, FixError};
use geodwell_core::time::{Dur, Ts};

pub use crate::layout::{LayoutSpec, feature_collection, generate_fences};

const M_PER_DEG: f64 = Fence::M_PER_DEG;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSpec {
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of devices.
    pub devices: u32,
    /// Event time of the first report window.
    pub start: Ts,
    /// Shortest per-device reporting interval.
    pub interval_min: Dur,
    /// Longest per-device reporting interval.
    pub interval_max: Dur,
    /// Bound on arrival disorder (0 = fixes in event-time order).
    pub disorder: Dur,
    /// Device id prefix; device `i` is `{prefix}{i}`.
    pub prefix: String,
    /// Share of devices (0..=1) that start parked well inside a fence for 4-8 hours: a
    /// standing population of live pairs, for memory measurements.
    pub parked: f64,
}

impl Default for FleetSpec {
    /// 1,000 devices reporting every 5-30 s from 2026-01-01T00:00:00Z, in order.
    fn default() -> FleetSpec {
        FleetSpec {
            seed: 1,
            devices: 1000,
            start: Ts(1_767_225_600_000),
            interval_min: Dur(5_000),
            interval_max: Dur(30_000),
            disorder: Dur(0),
            prefix: "sim-".to_string(),
            parked: 0.0,
        }
    }
}

/// One generated position report. Coordinates are multiples of 1e-7 degrees and accuracy and
/// speed of 0.1, exactly as [`SimFix::write_json`] writes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimFix {
    /// Device number; its id is `{prefix}{device}`.
    pub device: u32,
    /// Event time.
    pub ts: Ts,
    /// Longitude, degrees.
    pub lon: f64,
    /// Latitude, degrees.
    pub lat: f64,
    /// Reported accuracy, metres (0.1 m steps).
    pub accuracy: f64,
    /// Speed over ground, m/s (0.1 m/s steps).
    pub speed: f64,
}

impl SimFix {
    /// The fix as a server with the default `max_device_len` reads it (device id
    /// `{prefix}{device}`), e.g. to run the reference implementation on a generated trace.
    pub fn to_fix(&self, prefix: &str) -> Result<Fix, FixError> {
        Fix::new(
            &format!("{prefix}{}", self.device),
            self.ts,
            self.lat,
            self.lon,
            Some(self.accuracy),
            DEFAULT_MAX_DEVICE_LEN,
        )
    }

    /// Appends the fix as one JSON object (no newline) in the shape `POST /v1/fixes` takes.
    pub fn write_json(&self, prefix: &str, out: &mut Vec<u8>) {
        use std::io::Write;
        // Writing to a Vec cannot fail.
        let _ = write!(
            out,
            "{{\"device\":\"{prefix}{}\",\"ts\":{},\"lat\":{:.7},\"lon\":{:.7},\"accuracy\":{:.1},\"speed\":{:.1}}}",
            self.device, self.ts.0, self.lat, self.lon, self.accuracy, self.speed
        );
    }
}

/// A place devices stop at: a fence with sampled interior and edge points.
#[derive(Debug, Clone)]
struct Site {
    fence: Arc<Fence>,
    env: [f64; 4],
    /// An interior point found at set-up (fallback for the rejection sampler).
    inner: (f64, f64),
    /// Exterior boundary vertices (a sample), for edge stops.
    edge: Vec<(f64, f64)>,
}

impl Site {
    fn new(fence: Arc<Fence>, rng: &mut Rng) -> Option<Site> {
        let env = fence.envelopes().into_iter().reduce(|a, b| {
            [
                a[0].min(b[0]),
                a[1].min(b[1]),
                a[2].max(b[2]),
                a[3].max(b[3]),
            ]
        })?;
        let mut edge = Vec::new();
        let feature = fence.to_feature();
        let geometry = feature.geometry.as_ref()?;
        match &geometry.value {
            geojson::GeometryValue::Point { coordinates } => {
                // A circle: points on the radius, from the envelope's half-widths.
                let (lon, lat) = (coordinates[0], coordinates[1]);
                let (rx, ry) = ((env[2] - env[0]) / 2.0, (env[3] - env[1]) / 2.0);
                for k in 0..16 {
                    let a = k as f64 / 16.0 * std::f64::consts::TAU;
                    edge.push((lon + rx * a.cos(), lat + ry * a.sin()));
                }
            }
            geojson::GeometryValue::Polygon { coordinates } => {
                if let Some(ring) = coordinates.first() {
                    let step = (ring.len() / 64).max(1);
                    edge.extend(ring.iter().step_by(step).map(|p| (p[0], p[1])));
                }
            }
            geojson::GeometryValue::MultiPolygon { coordinates } => {
                for poly in coordinates {
                    if let Some(ring) = poly.first() {
                        let step = (ring.len() / 16).max(1);
                        edge.extend(ring.iter().step_by(step).map(|p| (p[0], p[1])));
                    }
                }
            }
            _ => return None,
        }
        let mut inner = None;
        for _ in 0..2000 {
            let p = (rng.range(env[0], env[2]), rng.range(env[1], env[3]));
            if fence.contains(p.0, p.1) {
                inner = Some(p);
                break;
            }
        }
        Some(Site {
            inner: inner.or_else(|| edge.first().copied())?,
            fence,
            env,
            edge,
        })
    }

    /// A point well inside (rejection-sampled, at most 20 tries, else the set-up point).
    fn interior(&self, rng: &mut Rng) -> (f64, f64) {
        for _ in 0..20 {
            let p = (
                rng.range(self.env[0], self.env[2]),
                rng.range(self.env[1], self.env[3]),
            );
            if self.fence.contains(p.0, p.1) {
                return p;
            }
        }
        self.inner
    }

    fn edge_point(&self, rng: &mut Rng) -> (f64, f64) {
        *rng.pick(&self.edge)
    }
}

#[derive(Debug, Clone, Copy)]
enum Leg {
    Drive {
        from: (f64, f64),
        to: (f64, f64),
        t0: i64,
        t1: i64,
    },
    Stop {
        at: (f64, f64),
        until: i64,
    },
}

#[derive(Debug, Clone)]
struct Dev {
    rng: Rng,
    interval: i64,
    leg: Leg,
    /// Reports inside [from, to) are not sent.
    silence: (i64, i64),
}

/// The fleet: an iterator over every device's fixes, merged into one stream.
#[derive(Debug)]
pub struct Fleet {
    spec: FleetSpec,
    sites: Vec<Site>,
    /// Bounding box of the area devices roam, [min lon, min lat, max lon, max lat].
    area: [f64; 4],
    devs: Vec<Dev>,
    /// Next report time per device.
    due: BinaryHeap<Reverse<(i64, u32)>>,
    /// Delayed fixes: (release key, generation order, fix).
    delayed: BinaryHeap<Reverse<(i64, u64, FixOrd)>>,
    generated: u64,
    delay_rng: Rng,
}

/// [`SimFix`] ordered by generation number only (the heap key carries the order).
#[derive(Debug, Clone, Copy)]
struct FixOrd(SimFix);
impl PartialEq for FixOrd {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for FixOrd {}
impl PartialOrd for FixOrd {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for FixOrd {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// Why a fleet cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FleetError {
    /// No fence yields a usable stop point.
    #[error("no usable fences: a fleet needs at least one fence to drive to")]
    NoFences,
    /// The reporting interval range is empty or not positive.
    #[error("reporting interval must satisfy 0 < min <= max (got {0} .. {1})")]
    BadInterval(Dur, Dur),
}

impl Fleet {
    /// A fleet driving between `fences`.
    pub fn new(spec: FleetSpec, fences: &[Arc<Fence>]) -> Result<Fleet, FleetError> {
        if spec.interval_min.0 <= 0 || spec.interval_max < spec.interval_min {
            return Err(FleetError::BadInterval(
                spec.interval_min,
                spec.interval_max,
            ));
        }
        let mut rng = Rng::new(spec.seed ^ 0x517E5);
        let sites: Vec<Site> = fences
            .iter()
            .filter_map(|f| Site::new(f.clone(), &mut rng))
            .collect();
        if sites.is_empty() {
            return Err(FleetError::NoFences);
        }
        // The roaming area: every site's envelope grown by 1 km.
        let mut area = sites[0].env;
        for s in &sites {
            area = [
                area[0].min(s.env[0]),
                area[1].min(s.env[1]),
                area[2].max(s.env[2]),
                area[3].max(s.env[3]),
            ];
        }
        let mid_lat = (area[1] + area[3]) / 2.0;
        let (dx, dy) = (
            1000.0 / (M_PER_DEG * mid_lat.to_radians().cos()),
            1000.0 / M_PER_DEG,
        );
        area = [area[0] - dx, area[1] - dy, area[2] + dx, area[3] + dy];
        let mut fleet = Fleet {
            devs: Vec::with_capacity(spec.devices as usize),
            due: BinaryHeap::with_capacity(spec.devices as usize),
            delayed: BinaryHeap::new(),
            generated: 0,
            delay_rng: Rng::new(spec.seed ^ 0xD15_0DE5),
            sites,
            area,
            spec,
        };
        let start = fleet.spec.start.0;
        for d in 0..fleet.spec.devices {
            let mut rng = Rng::stream(fleet.spec.seed, d as u64);
            let interval = rng.between(fleet.spec.interval_min.0, fleet.spec.interval_max.0);
            let first = start + rng.below(interval as u64) as i64;
            let here = fleet.random_point(&mut rng);
            let mut dev = Dev {
                rng,
                interval,
                leg: Leg::Stop {
                    at: here,
                    until: first,
                },
                silence: (0, 0),
            };
            // No draw when nobody parks, so that traces without parking stay as they were.
            if fleet.spec.parked > 0.0 && dev.rng.chance(fleet.spec.parked) {
                let site = dev.rng.pick(&fleet.sites);
                dev.leg = Leg::Stop {
                    at: site.interior(&mut dev.rng),
                    until: first + dev.rng.between(4 * 3_600_000, 8 * 3_600_000),
                };
            } else if dev.rng.chance(0.5) {
                // Start mid-stop at a site.
                let at = fleet.pick_place(&mut dev.rng);
                let until = Fleet::stop_until(&mut dev, first);
                let elapsed = dev.rng.below((until - first).max(1) as u64) as i64;
                dev.leg = Leg::Stop {
                    at,
                    until: until - elapsed,
                };
            }
            fleet.devs.push(dev);
            fleet.due.push(Reverse((first, d)));
        }
        Ok(fleet)
    }

    /// The spec this fleet was built from.
    pub fn spec(&self) -> &FleetSpec {
        &self.spec
    }

    /// Fixes generated so far (including ones still held back for disorder).
    pub fn generated(&self) -> u64 {
        self.generated
    }

    fn random_point(&self, rng: &mut Rng) -> (f64, f64) {
        (
            rng.range(self.area[0], self.area[2]),
            rng.range(self.area[1], self.area[3]),
        )
    }

    /// Picks where the next stop is: a fence's interior or edge, or a roadside point.
    fn pick_place(&self, rng: &mut Rng) -> (f64, f64) {
        if rng.chance(0.8) {
            let site = rng.pick(&self.sites);
            if rng.chance(0.25) {
                site.edge_point(rng)
            } else {
                site.interior(rng)
            }
        } else {
            self.random_point(rng)
        }
    }

    /// Picks when a stop starting at `t` ends, and maybe a silence in it.
    fn stop_until(dev: &mut Dev, t: i64) -> i64 {
        let rng = &mut dev.rng;
        let u = rng.unit();
        let dur = if u < 0.55 {
            rng.between(20_000, 240_000)
        } else if u < 0.80 {
            rng.between(240_000, 900_000)
        } else if u < 0.95 {
            rng.between(900_000, 4_500_000)
        } else {
            rng.between(4_500_000, 14_400_000)
        };
        let mut until = t + dur;
        if rng.chance(0.05) {
            let s0 = t + rng.below((dur / 2).max(1) as u64) as i64;
            let s1 = s0 + rng.between(960_000, 3_600_000);
            dev.silence = (s0, s1);
            until = until.max(s1 + 2 * dev.interval);
        }
        until
    }

    /// Advances device `d` to time `t` and returns its report there, if not silent.
    fn report(&mut self, d: u32, t: i64) -> Option<SimFix> {
        let mut dev = self.devs[d as usize].clone();
        loop {
            match dev.leg {
                Leg::Drive { to, t1, .. } if t >= t1 => {
                    let until = Fleet::stop_until(&mut dev, t1);
                    dev.leg = Leg::Stop { at: to, until };
                }
                Leg::Stop { at, until } if t >= until => {
                    let to = self.pick_place(&mut dev.rng);
                    let speed = dev.rng.range(6.0, 22.0);
                    let dist = distance_m(at, to);
                    let t1 = until + ((dist / speed) * 1000.0).ceil() as i64 + 1;
                    if dev.rng.chance(0.01) {
                        let s0 = until + dev.rng.below((t1 - until).max(1) as u64) as i64;
                        dev.silence = (s0, s0 + dev.rng.between(30_000, 180_000));
                    }
                    dev.leg = Leg::Drive {
                        from: at,
                        to,
                        t0: until,
                        t1,
                    };
                }
                _ => break,
            }
        }
        let (p, speed) = match dev.leg {
            Leg::Drive { from, to, t0, t1 } => {
                let f = (t - t0) as f64 / (t1 - t0).max(1) as f64;
                let p = (from.0 + (to.0 - from.0) * f, from.1 + (to.1 - from.1) * f);
                let v = distance_m(from, to) / ((t1 - t0).max(1) as f64 / 1000.0);
                (p, v)
            }
            Leg::Stop { at, .. } => (at, 0.0),
        };
        let silent = t >= dev.silence.0 && t < dev.silence.1;
        let rng = &mut dev.rng;
        let (sigma, accuracy) = if rng.chance(0.01) {
            (40.0, rng.range(60.0, 150.0))
        } else {
            (3.0, 3.0 + (rng.normal() * 4.0).abs())
        };
        let kx = M_PER_DEG * p.1.to_radians().cos();
        let lon = p.0 + rng.normal() * sigma / kx;
        let lat = p.1 + rng.normal() * sigma / M_PER_DEG;
        let next = t + (dev.interval as f64 * rng.range(0.9, 1.1)).round().max(1.0) as i64;
        self.devs[d as usize] = dev;
        self.due.push(Reverse((next, d)));
        // Quantized to what the JSON carries, so that a fix read back from the wire equals the
        // generated one (tests compare the server with the reference on these values).
        let q = |x: f64, k: f64| (x * k).round() / k;
        (!silent).then_some(SimFix {
            device: d,
            ts: Ts(t),
            lon: q(lon.clamp(-180.0, 180.0), 1e7),
            lat: q(lat.clamp(-90.0, 90.0), 1e7),
            accuracy: q(accuracy, 10.0),
            speed: q(speed, 10.0),
        })
    }

    /// The earliest report time still to be generated.
    fn frontier(&self) -> i64 {
        self.due.peek().map_or(i64::MAX, |Reverse((t, _))| *t)
    }
}

impl Iterator for Fleet {
    type Item = SimFix;

    fn next(&mut self) -> Option<SimFix> {
        loop {
            if let Some(Reverse((key, _, _))) = self.delayed.peek()
                && *key <= self.frontier()
            {
                return self.delayed.pop().map(|Reverse((_, _, f))| f.0);
            }
            let Reverse((t, d)) = self.due.pop()?;
            let Some(fix) = self.report(d, t) else {
                continue;
            };
            self.generated += 1;
            let disorder = self.spec.disorder.0;
            if disorder <= 0 {
                return Some(fix);
            }
            // A stream of its own, so that disorder reorders the same fixes.
            let key = t + self.delay_rng.below(disorder as u64 + 1) as i64;
            self.delayed
                .push(Reverse((key, self.generated, FixOrd(fix))));
        }
    }
}

/// Metres between two (lon, lat) points on a local equirectangular projection.
fn distance_m(a: (f64, f64), b: (f64, f64)) -> f64 {
    let kx = M_PER_DEG * ((a.1 + b.1) / 2.0).to_radians().cos();
    ((b.0 - a.0) * kx).hypot((b.1 - a.1) * M_PER_DEG)
}

#[cfg(test)]
mod tests;
