//! Device queries across nodes: `GET /v1/devices/{id}` and the device listing, asked of the
//! partition's owner by request/reply on `geodwell.q.<p>` (core NATS, not stored). The wire
//! forms here mirror the engine's views; the owner encodes, the asking node decodes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use geodwell_core::engine::{DeviceSummary, DeviceView};
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

/// Encodes the answer to a device query.
pub fn encode_device(d: Option<DeviceView>) -> Vec<u8> {
    let device = d.map(|d| WireDevice {
        id: d.id.to_string(),
        last_fix_at: d.last_fix_at.map(|t| t.0),
        last_position: d.last_position,
        buffered: d.buffered,
        pairs: d
            .pairs
            .into_iter()
            .map(|(fence, p)| WirePair {
                fence: fence.to_string(),
                inside: p.inside,
                entered_at: p.entered_at.0,
                votes: p.votes,
                fired_ms: p.fired.iter().map(|d| d.millis()).collect(),
                waiting_stale_ms: p.waiting_stale.iter().map(|d| d.millis()).collect(),
                next_due: p.next_due.map(|t| t.0),
            })
            .collect(),
    });
    serde_json::to_vec(&WireDeviceAnswer { device }).unwrap_or_default()
}

/// Decodes the answer to a device query (`Err`: not one).
pub fn decode_device(b: &[u8]) -> Result<Option<DeviceView>, String> {
    let a: WireDeviceAnswer = serde_json::from_slice(b).map_err(|e| e.to_string())?;
    Ok(a.device.map(|d| DeviceView {
        id: Arc::from(d.id.as_str()),
        last_fix_at: d.last_fix_at.map(Ts),
        last_position: d.last_position,
        buffered: d.buffered,
        pairs: d
            .pairs
            .into_iter()
            .map(|p| {
                (
                    Arc::from(p.fence.as_str()),
                    PairView {
                        inside: p.inside,
                        entered_at: Ts(p.entered_at),
                        votes: p.votes,
                        fired: p.fired_ms.into_iter().map(Dur).collect(),
                        waiting_stale: p.waiting_stale_ms.into_iter().map(Dur).collect(),
                        next_due: p.next_due.map(Ts),
                    },
                )
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
pub fn decode_page(b: &[u8]) -> Result<(Vec<DeviceSummary>, Option<u32>), String> {
    let p: WirePage = serde_json::from_slice(b).map_err(|e| e.to_string())?;
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
        let r = Request::Page { from: 3, limit: 9 };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        assert_eq!(Request::decode(b"{\"op\":\"x\"}"), None);
    }
}
