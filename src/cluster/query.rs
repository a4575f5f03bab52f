//! Device queries across nodes: `GET /v1/devices/{id}`, the device listing and a fence's
//! occupants and inside count, asked of the
//! partition's owner by request/reply on `geodwell.q.<p>` (core NATS, not stored). The wire
//! forms here mirror the engine's views; the owner encodes, the asking node decodes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use geodwell_core::engine::{DelayedFix, DeviceSummary, DeviceView, Engine, LateReason, Occupant};
use geodwell_core::pairs::PairView;
use geodwell_core::time::{Dur, Ts};

/// Most devices one page request asks of one partition.
pub const MAX_PAGE: usize = 1000;

/// A query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// One device.
    Device {
        /// Its id.
        id: String,
    },
    /// A page of devices from slot `from`.
    Page {
        /// First slot.
        from: u32,
        /// Page length.
        limit: usize,
    },
    /// A page of the devices inside a fence, from pair slot `from`.
    Occupants {
        /// Fence id.
        fence: String,
        /// First pair slot.
        from: u32,
        /// Page length.
        limit: usize,
    },
    /// How many devices are inside a fence.
    Inside {
        /// Fence id.
        fence: String,
    },
}

impl Request {
    /// Encodes the request.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a request (`None`: not one).
    pub fn decode(b: &[u8]) -> Option<Request> {
        serde_json::from_slice(b).ok()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct WirePair {
    fence: String,
    inside: bool,
    entered_at: i64,
    votes: u8,
    fired_ms: Vec<i64>,
    waiting_stale_ms: Vec<i64>,
    next_due: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireDevice {
    id: String,
    last_fix_at: Option<i64>,
    last_position: Option<(f64, f64)>,
    buffered: usize,
    pairs: Vec<WirePair>,
    /// Absent from a node that keeps no frontier.
    #[serde(default)]
    frontier: Option<i64>,
    #[serde(default)]
    hold_until: Option<i64>,
    #[serde(default)]
    delayed: Vec<WireDelayed>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireDelayed {
    ts: i64,
    behind_ms: i64,
    /// `None`: applied; else the late reason.
    late: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireDeviceAnswer {
    device: Option<WireDevice>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireSummary {
    id: String,
    last_fix_at: Option<i64>,
    last_position: Option<(f64, f64)>,
    inside: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WirePage {
    devices: Vec<WireSummary>,
    next: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireOccupant {
    device: String,
    last_fix_at: Option<i64>,
    pair: WirePair,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireOccupants {
    occupants: Vec<WireOccupant>,
    next: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireInside {
    inside: u64,
}

fn wire_pair(fence: &str, p: &PairView) -> WirePair {
    WirePair {
        fence: fence.to_string(),
        inside: p.inside,
        entered_at: p.entered_at.0,
        votes: p.votes,
        fired_ms: p.fired.iter().map(|d| d.millis()).collect(),
        waiting_stale_ms: p.waiting_stale.iter().map(|d| d.millis()).collect(),
        next_due: p.next_due.map(|t| t.0),
    }
}

fn view_of(p: WirePair) -> PairView {
    PairView {
        inside: p.inside,
        entered_at: Ts(p.entered_at),
        votes: p.votes,
        fired: p.fired_ms.into_iter().map(Dur).collect(),
        waiting_stale: p.waiting_stale_ms.into_iter().map(Dur).collect(),
        next_due: p.next_due.map(Ts),
    }
}

/// The owner's answer to any query, encoded (what another node decodes).
pub fn answer(engine: &Engine, req: &Request) -> Vec<u8> {
    match req {
        Request::Device { id } => encode_device(engine.device(id)),
        Request::Page { from, limit } => {
            let (page, next) = engine.device_page(*from, (*limit).min(MAX_PAGE));
            encode_page(&page, next)
        }
        _ => answer_occupancy(engine, req).unwrap_or_default(),
    }
}

/// The owner's answer to an occupancy query (`Occupants` or `Inside`), encoded: the same code
/// answers a query from this node's handle and one from another node. `None` for other
/// requests, which the caller answers with its typed paths.
pub fn answer_occupancy(engine: &Engine, req: &Request) -> Option<Vec<u8>> {
    match req {
        Request::Occupants { fence, from, limit } => {
            let (page, next) = engine.fence_occupants(
                fence,
                *from,
                (*limit).min(MAX_PAGE),
                crate::shard::OCCUPANCY_SCAN,
            );
            let occupants = page
                .iter()
                .map(|o| WireOccupant {
                    device: o.device.to_string(),
                    last_fix_at: o.last_fix_at.map(|t| t.0),
                    pair: wire_pair(fence, &o.pair),
                })
                .collect();
            serde_json::to_vec(&WireOccupants { occupants, next }).ok()
        }
        Request::Inside { fence } => serde_json::to_vec(&WireInside {
            inside: engine.fence_inside(fence),
        })
        .ok(),
        _ => None,
    }
}

/// Decodes the answer to an `Occupants` query.
pub fn decode_occupants(b: &[u8]) -> Result<(Vec<Occupant>, Option<u32>), serde_json::Error> {
    let a: WireOccupants = serde_json::from_slice(b)?;
    Ok((
        a.occupants
            .into_iter()
            .map(|o| Occupant {
                device: Arc::from(o.device.as_str()),
                last_fix_at: o.last_fix_at.map(Ts),
                pair: view_of(o.pair),
            })
            .collect(),
        a.next,
    ))
}

/// Decodes the answer to an `Inside` query.
pub fn decode_inside(b: &[u8]) -> Result<u64, serde_json::Error> {
    let a: WireInside = serde_json::from_slice(b)?;
    Ok(a.inside)
}

/// Encodes the answer to a device query.
pub fn encode_device(d: Option<DeviceView>) -> Vec<u8> {
    let device = d.map(|d| WireDevice {
        id: d.id.to_string(),
        last_fix_at: d.last_fix_at.map(|t| t.0),
        last_position: d.last_position,
        buffered: d.buffered,
        frontier: d.frontier.map(|t| t.0),
        hold_until: d.hold_until.map(|t| t.0),
        delayed: d
            .delayed
            .iter()
            .map(|f| WireDelayed {
                ts: f.ts.0,
                behind_ms: f.behind.millis(),
                late: f.late.map(|r| r.as_str().to_string()),
            })
            .collect(),
        pairs: d
            .pairs
            .into_iter()
            .map(|(fence, p)| wire_pair(&fence, &p))
            .collect(),
    });
    serde_json::to_vec(&WireDeviceAnswer { device }).unwrap_or_default()
}

/// Decodes the answer to a device query (`Err`: not one).
pub fn decode_device(b: &[u8]) -> Result<Option<DeviceView>, serde_json::Error> {
    let a: WireDeviceAnswer = serde_json::from_slice(b)?;
    Ok(a.device.map(|d| DeviceView {
        id: Arc::from(d.id.as_str()),
        last_fix_at: d.last_fix_at.map(Ts),
        last_position: d.last_position,
        buffered: d.buffered,
        pairs: d
            .pairs
            .into_iter()
            .map(|p| (Arc::from(p.fence.as_str()), view_of(p)))
            .collect(),
        frontier: d.frontier.map(Ts),
        hold_until: d.hold_until.map(Ts),
        delayed: d
            .delayed
            .into_iter()
            .map(|f| DelayedFix {
                ts: Ts(f.ts),
                behind: geodwell_core::time::Dur(f.behind_ms),
                late: match f.late.as_deref() {
                    Some("too_old") => Some(LateReason::TooOld),
                    Some(_) => Some(LateReason::BehindDevice),
                    None => None,
                },
            })
            .collect(),
    }))
}

/// Encodes a page of devices.
pub fn encode_page(page: &[DeviceSummary], next: Option<u32>) -> Vec<u8> {
    serde_json::to_vec(&WirePage {
        devices: page
            .iter()
            .map(|d| WireSummary {
                id: d.id.to_string(),
                last_fix_at: d.last_fix_at.map(|t| t.0),
                last_position: d.last_position,
                inside: d.inside.iter().map(|f| f.to_string()).collect(),
            })
            .collect(),
        next,
    })
    .unwrap_or_default()
}

/// Decodes a page of devices.
pub fn decode_page(b: &[u8]) -> Result<(Vec<DeviceSummary>, Option<u32>), serde_json::Error> {
    let p: WirePage = serde_json::from_slice(b)?;
    Ok((
        p.devices
            .into_iter()
            .map(|d| DeviceSummary {
                id: Arc::from(d.id.as_str()),
                last_fix_at: d.last_fix_at.map(Ts),
                last_position: d.last_position,
                inside: d.inside.iter().map(|f| Arc::from(f.as_str())).collect(),
            })
            .collect(),
        p.next,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_survive_the_wire() {
        let view = DeviceView {
            id: Arc::from("truck-17"),
            last_fix_at: Some(Ts(1_700_000_000_000)),
            last_position: Some((53.5, -9.9)),
            buffered: 2,
            frontier: Some(Ts(1_700_000_000_000)),
            hold_until: Some(Ts(1_700_000_005_000)),
            delayed: vec![DelayedFix {
                ts: Ts(1_699_999_990_000),
                behind: Dur::from_secs(12),
                late: Some(LateReason::BehindDevice),
            }],
            pairs: vec![(
                Arc::from("depot-3"),
                PairView {
                    inside: true,
                    entered_at: Ts(1_699_999_000_000),
                    votes: 1,
                    fired: vec![Dur::from_secs(600)],
                    waiting_stale: vec![],
                    next_due: Some(Ts(1_700_000_600_000)),
                },
            )],
        };
        assert_eq!(
            decode_device(&encode_device(Some(view.clone()))).unwrap(),
            Some(view)
        );
        assert_eq!(decode_device(&encode_device(None)).unwrap(), None);
        let page = vec![DeviceSummary {
            id: Arc::from("a"),
            last_fix_at: None,
            last_position: None,
            inside: vec![Arc::from("f")],
        }];
        assert_eq!(
            decode_page(&encode_page(&page, Some(7))).unwrap(),
            (page, Some(7))
        );
        assert!(decode_page(b"nope").is_err());
        let mut engine = Engine::new(Default::default());
        let fence = Arc::new(
            geodwell_core::fences::Fence::from_feature(
                &serde_json::from_value(serde_json::json!({"type": "Feature", "id": "f",
                    "geometry": {"type": "Point", "coordinates": [10.0, 50.0]},
                    "properties": {"radius_m": 100, "dwell": ["1m"]}}))
                .unwrap(),
                None,
                &Default::default(),
            )
            .unwrap(),
        );
        engine.upsert_fence(fence, &mut Vec::new());
        let fix =
            geodwell_core::fix::Fix::new("truck-17", Ts(1_000_000), 50.0, 10.0, None, 64).unwrap();
        engine.ingest(&fix, Ts(1_000_000), &mut Vec::new()).unwrap();
        let want = engine.fence_occupants("f", 0, 10, 100);
        assert_eq!(want.0.len(), 1);
        let req = Request::Occupants {
            fence: "f".into(),
            from: 0,
            limit: 10,
        };
        let body = answer_occupancy(&engine, &Request::decode(&req.encode()).unwrap()).unwrap();
        assert_eq!(decode_occupants(&body).unwrap(), want);
        let body = answer_occupancy(&engine, &Request::Inside { fence: "f".into() }).unwrap();
        assert_eq!(decode_inside(&body).unwrap(), 1);
        assert!(decode_inside(b"{}").is_err());
        let r = Request::Page { from: 3, limit: 9 };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        assert_eq!(Request::decode(b"{\"op\":\"x\"}"), None);
    }
}
