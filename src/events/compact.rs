//! The compact form in which the event log holds an event, and its exact re-rendering to JSON.
//!
//! Owns [`CompactEvent`] (what one log entry stores), the conversion from a full [`Event`] and
//! back, and [`Interner`] (sharing fence ids and tags between events decoded from stored JSON).
//!
//! Invariants:
//! - A `CompactEvent` holds only what cannot be derived: the kind, the device, the fence, the visit
//!   start, one kind-specific number (the EXIT time or the DWELL threshold), the publication time,
//!   the fence tags and name, and the deciding fix's position (ENTER and EXIT). `seq` is the entry's position in the log, and `id`, `at`, `dwell_s` and
//!   `duration_s` are recomputed by the same constructors the engine uses ([`Event::enter`],
//!   [`Event::exit`], [`Event::dwell`]).
//! - [`CompactEvent::from_event`] only accepts an event that those constructors rebuild exactly
//!   (it checks), so `to_event(seq)` equals the original event and its JSON, rendered with
//!   `serde_json::to_string`, is byte-for-byte what the original serialized to.
//! - Nothing per event is allocated for a device id of at most 24 bytes (inline
//!   `CompactString`); the fence id and the tags are shared `Arc`s (the engine's own, or the
//!   interner's at warm start), so an entry is 120 bytes whatever the tags hold.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use compact_str::CompactString;
use serde_json::Value;

use geodwell_core::event::{Event, EventId, EventKind};
use geodwell_core::time::{Dur, Ts};

/// `emitted_at` of an event not stamped yet (outside the valid [`Ts`] range, so never a real time).
const NOT_EMITTED: i64 = i64::MIN;

/// Why an event cannot be held in compact form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactError {
    /// The event is not what its kind and content derive (e.g. an `id` or `at` that another
    /// derivation produced, a DWELL without `dwell_s`): re-rendering it would change its JSON.
    #[error("event seq {seq} ({kind}) is not what its content derives: its {field} differs")]
    NotCanonical {
        /// The event's `seq`.
        seq: u64,
        /// The event's kind.
        kind: EventKind,
        /// The first field found to differ.
        field: &'static str,
    },
    /// Stored event text is not an event.
    #[error("stored event does not decode: {0}")]
    Decode(String),
}

/// One event as the log holds it (120 bytes, no `seq`: the log knows it from the position).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactEvent {
    /// Publication time in Unix ms, or [`NOT_EMITTED`].
    emitted_at: i64,
    /// When the visit started.
    entered_at: Ts,
    /// EXIT: the event time (ms); DWELL: the threshold (ms); ENTER: 0. Exactly the `extra` of
    /// [`EventId::derive`].
    extra: i64,
    /// Device id, inline up to 24 bytes.
    device: CompactString,
    /// Fence id, shared with the fence.
    fence: Arc<str>,
    /// Fence tags at emission, shared with the fence.
    tags: Arc<Value>,
    /// Fence name at emission, shared with the fence.
    name: Option<Arc<str>>,
    /// The deciding fix's latitude, longitude and accuracy; NaN for none (a fix's values are
    /// always finite, so NaN is never a real one).
    pos: [f64; 3],
    /// ENTER, EXIT or DWELL.
    kind: EventKind,
}

// The per-event memory budget of the log rests on this size (docs/service.md quotes it).
const _: () = assert!(std::mem::size_of::<CompactEvent>() <= 120);

fn to_nan(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

fn from_nan(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

impl CompactEvent {
    /// The compact form of `event` (its `seq` is not kept); refused when re-rendering would not
    /// give back the same event.
    pub fn from_event(event: &Event) -> Result<CompactEvent, CompactError> {
        let refuse = |field| CompactError::NotCanonical {
            seq: event.seq,
            kind: event.kind,
            field,
        };
        let extra = match event.kind {
            EventKind::Enter => 0,
            EventKind::Exit => event.at.0,
            EventKind::Dwell => event.dwell_s.ok_or_else(|| refuse("dwell_s"))?.0.millis(),
        };
        if event.emitted_at.is_some_and(|t| t.0 == NOT_EMITTED) {
            return Err(refuse("emitted_at"));
        }
        if [event.lat, event.lon, event.accuracy]
            .iter()
            .any(|v| v.is_some_and(f64::is_nan))
        {
            return Err(refuse("position"));
        }
        let compact = CompactEvent {
            emitted_at: event.emitted_at.map_or(NOT_EMITTED, |t| t.0),
            entered_at: event.entered_at,
            extra,
            device: event.device.clone(),
            fence: event.fence.clone(),
            tags: event.tags.clone(),
            name: event.name.clone(),
            pos: [to_nan(event.lat), to_nan(event.lon), to_nan(event.accuracy)],
            kind: event.kind,
        };
        let back = compact.to_event(event.seq);
        // Checked field by field to name the culprit; the remaining fields are copied as they are.
        let field = if back.id != event.id {
            "id"
        } else if back.at != event.at {
            "at"
        } else if back.dwell_s != event.dwell_s {
            "dwell_s"
        } else if back.duration_s != event.duration_s {
            "duration_s"
        } else if (back.lat, back.lon, back.accuracy) != (event.lat, event.lon, event.accuracy) {
            "position"
        } else {
            return Ok(compact);
        };
        Err(refuse(field))
    }

    /// Decodes stored event JSON (as the log rendered it) into its `seq` and compact form,
    /// sharing fence ids and tags through `interner`.
    pub fn from_json(
        text: &str,
        interner: &mut Interner,
    ) -> Result<(u64, CompactEvent), CompactError> {
        let mut event: Event =
            serde_json::from_str(text).map_err(|e| CompactError::Decode(e.to_string()))?;
        let (fence, tags) = interner.intern(&event.fence, &event.tags);
        event.fence = fence;
        event.tags = tags;
        event.name = event.name.map(|n| interner.name(&n));
        Ok((event.seq, CompactEvent::from_event(&event)?))
    }

    /// The full event, with `seq` = `seq`.
    pub fn to_event(&self, seq: u64) -> Event {
        let mut e = match self.kind {
            EventKind::Enter => {
                Event::enter(&self.device, &self.fence, self.entered_at, &self.tags)
            }
            EventKind::Exit => Event::exit(
                &self.device,
                &self.fence,
                self.entered_at,
                Ts(self.extra),
                &self.tags,
            ),
            EventKind::Dwell => Event::dwell(
                &self.device,
                &self.fence,
                self.entered_at,
                Dur(self.extra),
                &self.tags,
            ),
        };
        e.seq = seq;
        e.emitted_at = self.emitted_at();
        e.name = self.name.clone();
        e.lat = from_nan(self.pos[0]);
        e.lon = from_nan(self.pos[1]);
        e.accuracy = from_nan(self.pos[2]);
        e
    }

    /// The event's JSON with `seq` = `seq`: byte-for-byte `serde_json::to_string` of the event it
    /// was made from.
    pub fn render(&self, seq: u64) -> String {
        // Serializing an Event cannot fail (no map with non-string keys, no I/O); "{}" only keeps
        // this total.
        serde_json::to_string(&self.to_event(seq)).unwrap_or_else(|_| "{}".to_string())
    }

    /// ENTER, EXIT or DWELL.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The device id.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The fence id.
    pub fn fence(&self) -> &Arc<str> {
        &self.fence
    }

    /// The fence tags at emission.
    pub fn tags(&self) -> &Arc<Value> {
        &self.tags
    }

    /// When the visit started.
    pub fn entered_at(&self) -> Ts {
        self.entered_at
    }

    /// The event time: the visit start for ENTER, the EXIT time, the DWELL deadline.
    pub fn at(&self) -> Ts {
        match self.kind {
            EventKind::Enter => self.entered_at,
            EventKind::Exit => Ts(self.extra),
            EventKind::Dwell => self.entered_at.plus(Dur(self.extra)),
        }
    }

    /// Wall-clock publication time, once stamped.
    pub fn emitted_at(&self) -> Option<Ts> {
        (self.emitted_at != NOT_EMITTED).then_some(Ts(self.emitted_at))
    }

    /// The deterministic id (recomputed: a hash of a few dozen bytes, cheaper than 16 bytes per
    /// held event).
    pub fn id(&self) -> EventId {
        let extra = match self.kind {
            EventKind::Enter => 0,
            EventKind::Exit | EventKind::Dwell => self.extra,
        };
        EventId::derive(self.kind, &self.device, &self.fence, self.entered_at, extra)
    }
}

/// Shares fence ids and tags between events decoded from JSON, so that a restored log tail costs
/// what a live one does (one `Arc` per fence and tag value, not one per event).
#[derive(Debug, Default)]
pub struct Interner {
    /// Per fence id: its shared id and the distinct tag values seen with it (a fence's tags
    /// change only when the fence is replaced, so the list is short).
    fences: HashMap<Arc<str>, Vec<Arc<Value>>>,
    /// Fence names seen (a fence has one name until it is replaced: few per fence).
    names: std::collections::HashSet<Arc<str>>,
}

impl Interner {
    /// The shared copy of a fence name (stored on first sight).
    pub fn name(&mut self, name: &Arc<str>) -> Arc<str> {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        self.names.insert(name.clone());
        name.clone()
    }

    /// The shared copies of `fence` and `tags` (stored on first sight).
    pub fn intern(&mut self, fence: &Arc<str>, tags: &Arc<Value>) -> (Arc<str>, Arc<Value>) {
        match self.fences.entry(fence.clone()) {
            Entry::Occupied(mut seen) => {
                let id = seen.key().clone();
                let variants = seen.get_mut();
                let tags = match variants.iter().find(|t| **t == *tags) {
                    Some(t) => t.clone(),
                    None => {
                        variants.push(tags.clone());
                        tags.clone()
                    }
                };
                (id, tags)
            }
            Entry::Vacant(new) => {
                let id = new.key().clone();
                new.insert(vec![tags.clone()]);
                (id, tags.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Event> {
        let short: &str = "dev-0001234";
        let long: &str = "a-device-id-well-beyond-twenty-four-bytes-long";
        let fence: Arc<str> = Arc::from("depot-3");
        let no_tags = Arc::new(serde_json::json!({}));
        let tags =
            Arc::new(serde_json::json!({"site": "é \"quoted\"", "n": 1.5, "list": [1, null]}));
        let mut out = Vec::new();
        for device in [short, long] {
            for t in [&no_tags, &tags] {
                out.push(Event::enter(device, &fence, Ts(1_700_000_000_123), t));
                // A whole and a fractional duration (the JSON differs: 90 vs 90.5).
                out.push(Event::exit(
                    device,
                    &fence,
                    Ts(1_700_000_000_000),
                    Ts(1_700_000_090_000),
                    t,
                ));
                out.push(Event::exit(
                    device,
                    &fence,
                    Ts(1_700_000_000_000),
                    Ts(1_700_000_090_500),
                    t,
                ));
                out.push(Event::dwell(
                    device,
                    &fence,
                    Ts(1_700_000_000_000),
                    Dur::from_mins(10),
                    t,
                ));
                out.push(Event::dwell(
                    device,
                    &fence,
                    Ts(1_700_000_000_000),
                    Dur(1_500),
                    t,
                ));
            }
        }
        // The same events with a fence name and, for ENTER and EXIT, the deciding fix (with and
        // without an accuracy).
        let name: Arc<str> = Arc::from("Depot \"3\" ü");
        let rich: Vec<Event> = out
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let e = e.clone().named(Some(&name));
                match e.kind {
                    EventKind::Dwell => e,
                    _ => e.at_fix(53.551_086, -9.993_682, (i % 2 == 0).then_some(4.25)),
                }
            })
            .collect();
        out.extend(rich);
        for (i, e) in out.iter_mut().enumerate() {
            e.seq = 1 + i as u64;
            if i % 3 != 0 {
                e.emitted_at = Some(Ts(1_700_000_100_000 + i as i64));
            }
        }
        out
    }

    #[test]
    fn compact_renders_the_same_json_as_the_event() {
        for e in samples() {
            let c = CompactEvent::from_event(&e).unwrap();
            assert_eq!(c.to_event(e.seq), e);
            assert_eq!(c.render(e.seq), serde_json::to_string(&e).unwrap());
            assert_eq!(c.id(), e.id);
            assert_eq!(c.kind(), e.kind);
            assert_eq!(c.device(), &*e.device);
            assert_eq!(c.emitted_at(), e.emitted_at);
        }
    }

    #[test]
    fn stored_json_round_trips_through_the_compact_form() {
        let mut interner = Interner::default();
        let mut restored = Vec::new();
        for e in samples() {
            let text = serde_json::to_string(&e).unwrap();
            let (seq, c) = CompactEvent::from_json(&text, &mut interner).unwrap();
            assert_eq!(seq, e.seq);
            assert_eq!(c.render(seq), text);
            restored.push(c);
        }
        // Interned: one fence id and one value per distinct tags, whatever the number of events.
        assert!(
            restored
                .iter()
                .all(|c| Arc::ptr_eq(c.fence(), restored[0].fence()))
        );
        let distinct: Vec<*const Value> = restored.iter().map(|c| Arc::as_ptr(c.tags())).collect();
        let mut unique = distinct.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 2);
    }

    #[test]
    fn an_event_that_does_not_re_derive_is_refused() {
        let mut e = samples()[1].clone();
        e.duration_s = None;
        assert!(matches!(
            CompactEvent::from_event(&e),
            Err(CompactError::NotCanonical {
                field: "duration_s",
                ..
            })
        ));
        let mut e = samples()[3].clone();
        e.id = EventId(7);
        assert!(matches!(
            CompactEvent::from_event(&e),
            Err(CompactError::NotCanonical { field: "id", .. })
        ));
        let mut e = samples()[3].clone();
        e.dwell_s = None;
        assert!(CompactEvent::from_event(&e).is_err());
        assert!(matches!(
            CompactEvent::from_json("{\"seq\":1}", &mut Interner::default()),
            Err(CompactError::Decode(_))
        ));
    }
}
