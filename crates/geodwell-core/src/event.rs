//! Events (ENTER, EXIT, DWELL) and their deterministic ids.
//!
//! Invariant: an event's `id` is a pure function of what the event *says* (kind, device, fence,
//! visit start, and the threshold or exit time), never of arrival order, shard, batch split,
//! wall clock or `seq`. Replays and restarts therefore reproduce the same ids, and subscribers can
//! de-duplicate on them. `seq` and `emitted_at` are stamped by whoever publishes the event.

use std::fmt;
use std::sync::Arc;

use compact_str::CompactString;
use serde::{Deserialize, Serialize, Serializer};
use smallvec::SmallVec;

use crate::time::{Dur, Ts};

/// What happened to a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// The device's visit of the fence started (confirmed).
    Enter,
    /// The visit ended (confirmed).
    Exit,
    /// The visit reached one of the fence's dwell thresholds.
    Dwell,
}

impl EventKind {
    /// `"enter"`, `"exit"` or `"dwell"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enter => "enter",
            EventKind::Exit => "exit",
            EventKind::Dwell => "dwell",
        }
    }

    /// Parses `"enter"`, `"exit"` or `"dwell"`.
    pub fn parse(s: &str) -> Option<EventKind> {
        match s {
            "enter" => Some(EventKind::Enter),
            "exit" => Some(EventKind::Exit),
            "dwell" => Some(EventKind::Dwell),
            _ => None,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A 128-bit deterministic event id, shown as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u128);

impl EventId {
    /// Derives the id from the event's identifying content.
    ///
    /// The fields are length-prefixed so that no two different tuples share a byte string.
    pub fn derive(kind: EventKind, device: &str, fence: &str, entered_at: Ts, extra: i64) -> Self {
        // On the stack for usual id lengths: the event log re-derives ids when it renders events,
        // so this runs once per event sent, not just once per event emitted.
        let mut buf: SmallVec<[u8; 128]> = SmallVec::new();
        buf.extend_from_slice(b"geodwell/event/v1\0");
        buf.extend_from_slice(kind.as_str().as_bytes());
        buf.push(0);
        for part in [device.as_bytes(), fence.as_bytes()] {
            buf.extend_from_slice(&(part.len() as u64).to_le_bytes());
            buf.extend_from_slice(part);
        }
        buf.extend_from_slice(&entered_at.0.to_le_bytes());
        buf.extend_from_slice(&extra.to_le_bytes());
        EventId(xxhash_rust::xxh3::xxh3_128(&buf))
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        u128::from_str_radix(&s, 16)
            .map(EventId)
            .map_err(serde::de::Error::custom)
    }
}

/// Seconds as a JSON number: an integer when whole, else a decimal with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Secs(pub Dur);

impl Serialize for Secs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ms = self.0.millis();
        if ms % 1000 == 0 {
            s.serialize_i64(ms / 1000)
        } else {
            s.serialize_f64(ms as f64 / 1000.0)
        }
    }
}

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Ok(Secs(Dur((v * 1000.0).round() as i64)))
    }
}

/// One ENTER, EXIT or DWELL event (`docs/semantics.md` section 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the publishing log (gap-free, monotonic per instance); 0 until stamped.
    pub seq: u64,
    /// Deterministic id.
    pub id: EventId,
    /// Kind.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// Device id (inline up to 24 bytes: building an event allocates nothing for typical ids).
    pub device: CompactString,
    /// Fence id.
    pub fence: Arc<str>,
    /// Event time: ENTER's first inside fix, EXIT's first outside fix, DWELL's deadline.
    pub at: Ts,
    /// When the visit started (equals `at` for ENTER).
    pub entered_at: Ts,
    /// The dwell threshold, for DWELL.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dwell_s: Option<Secs>,
    /// The visit's duration, for EXIT.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub duration_s: Option<Secs>,
    /// Wall-clock publication time; `None` until the shell stamps it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub emitted_at: Option<Ts>,
    /// The fence's tags at emission: the fence's own shared value, not a copy (serialized as the
    /// value itself, so the JSON is the same as for an unshared one).
    pub tags: Arc<serde_json::Value>,
    /// The fence's name at emission, when it has one (shared with the fence).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub name: Option<Arc<str>>,
    /// ENTER and EXIT: the latitude of the fix that decided the event (the fix that completed
    /// its confirmation run; with a confirm count of 1, the fix at `at`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lat: Option<f64>,
    /// ENTER and EXIT: the deciding fix's longitude.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lon: Option<f64>,
    /// ENTER and EXIT: the deciding fix's accuracy in metres, when it reported one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub accuracy: Option<f64>,
    /// ENTER and EXIT: the arrival stamp the shell gave the deciding fix
    /// ([`crate::engine::Engine::set_arrival`]; 0 = unknown). Not part of the event's content:
    /// never serialized, never in the id; the shell measures ingest-to-event latency with it.
    #[serde(skip)]
    pub arrived: u64,
}

impl Event {
    /// An ENTER of the visit starting at `entered_at`.
    pub fn enter(
        device: &str,
        fence: &Arc<str>,
        entered_at: Ts,
        tags: &Arc<serde_json::Value>,
    ) -> Event {
        Event {
            seq: 0,
            id: EventId::derive(EventKind::Enter, device, fence, entered_at, 0),
            kind: EventKind::Enter,
            device: CompactString::from(device),
            fence: fence.clone(),
            at: entered_at,
            entered_at,
            dwell_s: None,
            duration_s: None,
            emitted_at: None,
            tags: tags.clone(),
            name: None,
            lat: None,
            lon: None,
            accuracy: None,
            arrived: 0,
        }
    }

    /// An EXIT at `at` of the visit that started at `entered_at`.
    pub fn exit(
        device: &str,
        fence: &Arc<str>,
        entered_at: Ts,
        at: Ts,
        tags: &Arc<serde_json::Value>,
    ) -> Event {
        Event {
            seq: 0,
            id: EventId::derive(EventKind::Exit, device, fence, entered_at, at.0),
            kind: EventKind::Exit,
            device: CompactString::from(device),
            fence: fence.clone(),
            at,
            entered_at,
            dwell_s: None,
            duration_s: Some(Secs(at.since(entered_at))),
            emitted_at: None,
            tags: tags.clone(),
            name: None,
            lat: None,
            lon: None,
            accuracy: None,
            arrived: 0,
        }
    }

    /// The event with the fence's `name` (any kind; the id does not depend on it).
    pub fn named(mut self, name: Option<&Arc<str>>) -> Event {
        self.name = name.cloned();
        self
    }

    /// The event with the position of the fix that decided it (ENTER and EXIT; the id does not
    /// depend on it).
    pub fn at_fix(mut self, lat: f64, lon: f64, accuracy: Option<f64>) -> Event {
        self.lat = Some(lat);
        self.lon = Some(lon);
        self.accuracy = accuracy;
        self
    }

    /// A DWELL of threshold `threshold` for the visit that started at `entered_at`.
    pub fn dwell(
        device: &str,
        fence: &Arc<str>,
        entered_at: Ts,
        threshold: Dur,
        tags: &Arc<serde_json::Value>,
    ) -> Event {
        Event {
            seq: 0,
            id: EventId::derive(
                EventKind::Dwell,
                device,
                fence,
                entered_at,
                threshold.millis(),
            ),
            kind: EventKind::Dwell,
            device: CompactString::from(device),
            fence: fence.clone(),
            at: entered_at.plus(threshold),
            entered_at,
            dwell_s: Some(Secs(threshold)),
            duration_s: None,
            emitted_at: None,
            tags: tags.clone(),
            name: None,
            lat: None,
            lon: None,
            accuracy: None,
            arrived: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_depend_only_on_content() {
        let d: Arc<str> = Arc::from("truck-17");
        let f: Arc<str> = Arc::from("depot-3");
        let tags = Arc::new(serde_json::json!({}));
        let a = Event::dwell(&d, &f, Ts(1000), Dur::from_mins(10), &tags);
        let b = Event::dwell(
            &d,
            &f,
            Ts(1000),
            Dur::from_mins(10),
            &Arc::new(serde_json::json!({"x": 1})),
        );
        assert_eq!(a.id, b.id);
        assert_ne!(
            a.id,
            Event::dwell(&d, &f, Ts(1000), Dur::from_mins(11), &tags).id
        );
        assert_ne!(a.id, Event::enter(&d, &f, Ts(1000), &tags).id);
        // Length prefixes keep ("ab","c") and ("a","bc") apart.
        let x = EventId::derive(EventKind::Enter, "ab", "c", Ts(0), 0);
        let y = EventId::derive(EventKind::Enter, "a", "bc", Ts(0), 0);
        assert_ne!(x, y);
    }

    #[test]
    fn events_serialize_to_the_documented_json() {
        let d: Arc<str> = Arc::from("truck-17");
        let f: Arc<str> = Arc::from("depot-3");
        let e = Event::exit(
            &d,
            &f,
            Ts(0),
            Ts(90_500),
            &Arc::new(serde_json::json!(["a"])),
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "exit");
        assert_eq!(v["at"], "1970-01-01T00:01:30.500Z");
        assert_eq!(v["duration_s"], 90.5);
        assert!(v.get("dwell_s").is_none());
        assert_eq!(v["id"].as_str().unwrap().len(), 32);
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        // The fence name and the deciding fix are additive: absent when unknown, and the id
        // stays what the same content derived before.
        for k in ["name", "lat", "lon", "accuracy"] {
            assert!(serde_json::to_value(&e).unwrap().get(k).is_none(), "{k}");
        }
        let name: Arc<str> = Arc::from("Depot 3");
        let rich = e.clone().named(Some(&name)).at_fix(53.5, 9.9, Some(12.5));
        assert_eq!(rich.id, e.id);
        let v = serde_json::to_value(&rich).unwrap();
        assert_eq!(
            (
                v["name"].clone(),
                v["lat"].clone(),
                v["lon"].clone(),
                v["accuracy"].clone()
            ),
            (
                serde_json::json!("Depot 3"),
                serde_json::json!(53.5),
                serde_json::json!(9.9),
                serde_json::json!(12.5)
            )
        );
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, rich);
    }
}
