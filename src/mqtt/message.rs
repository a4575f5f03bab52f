//! One MQTT message as ingest items: pure (no I/O, no clock), so every rule is unit-tested.
//!
//! Invariants:
//! - A message under `owntracks/<user>/<device>[/...]` is an OwnTracks message: a `location`
//!   becomes one fix of device `<user>/<device>` (the OwnTracks booklet's MQTT mode, and the same
//!   id its HTTP mode gives with `X-Limit-U` / `X-Limit-D`); any other `_type` is no fix.
//! - Any other topic carries fixes as `POST /v1/fixes` takes them: one object or an array.
//! - A message that cannot be read is one rejected item (counted like a rejected HTTP fix), never
//!   an error of the connection: it is acknowledged, so a bad message cannot come back forever.

use serde_json::Value;

use crate::wire::trackers::{OwnTracksIdentity, OwnTracksMessage, TrackerFix, owntracks_from_json};
use crate::wire::{BatchShapeError, FixLimits, Item, ItemError, read_batch};
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

/// What one message holds.
#[derive(Debug)]
pub enum Parsed {
    /// Generic fixes, to be validated by [`crate::ingest::Ingest::parse`].
    Items(Vec<Item>),
    /// An OwnTracks location, mapped (or why not).
    Tracker(Result<TrackerFix, ItemError>),
    /// Nothing to ingest (an OwnTracks message other than a location, an empty payload: the app
    /// clears a retained message with one).
    Nothing(&'static str),
    /// The whole message is unreadable: one rejected item.
    Bad(ItemError),
}

/// Reads one message. `max_bytes` bounds the payload (`ingest.max_body_bytes`).
pub fn parse(topic: &str, payload: &[u8], max_bytes: usize) -> Parsed {
    if payload.is_empty() {
        return Parsed::Nothing("empty");
    }
    if payload.len() > max_bytes {
        return Parsed::Bad(ItemError::InvalidFix(format!(
            "the message is {} bytes; the limit is {max_bytes} (ingest.max_body_bytes)",
            payload.len()
        )));
    }
    let Ok(text) = std::str::from_utf8(payload) else {
        return Parsed::Bad(ItemError::MalformedJson("the message is not UTF-8".into()));
    };
    let mut levels = topic.split('/');
    if levels.next() == Some("owntracks") {
        let user = levels.next().filter(|s| !s.is_empty());
        let device = levels.next().filter(|s| !s.is_empty());
        let (Some(user), Some(device)) = (user, device) else {
            return Parsed::Bad(ItemError::MissingField(format!(
                "an OwnTracks topic is owntracks/<user>/<device>, got {topic:?}"
            )));
        };
        let v: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return Parsed::Bad(ItemError::MalformedJson(format!(
                    "the message is not JSON: {e}"
                )));
            }
        };
        let ident = OwnTracksIdentity {
            user: Some(user.to_string()),
            device: Some(device.to_string()),
        };
        return match owntracks_from_json(&v, &ident) {
            Ok(OwnTracksMessage::Location(fix)) => Parsed::Tracker(fix),
            Ok(OwnTracksMessage::Ignored(_)) => Parsed::Nothing("not a location"),
            Err(e) => Parsed::Bad(ItemError::InvalidFix(e.message)),
        };
    }
    match read_batch(text) {
        Ok(items) if items.is_empty() => Parsed::Nothing("an empty array"),
        Ok(items) => Parsed::Items(items),
        Err(BatchShapeError::NotJson(e)) => Parsed::Bad(ItemError::MalformedJson(format!(
            "the message is not JSON: {e}"
        ))),
        Err(BatchShapeError::NotFixOrArray(kind)) => Parsed::Bad(ItemError::InvalidFix(format!(
            "expected a fix object or an array of fixes, got {kind}"
        ))),
    }
}

/// An OwnTracks location as a validated fix (or why it is not one).
pub fn tracker_fix(
    fix: Result<TrackerFix, ItemError>,
    limits: &FixLimits,
    now: Ts,
) -> Result<Fix, ItemError> {
    fix.and_then(|f| f.into_fix(limits, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn booklet_location() -> &'static str {
        // The OwnTracks booklet's example location message (MQTT mode).
        r#"{"_type":"location","acc":12,"alt":0,"batt":76,"bs":1,"conn":"w","created_at":1700000000,"lat":53.5413,"lon":9.9840,"m":1,"t":"u","tid":"jp","tst":1700000000,"vac":0,"vel":36}"#
    }

    #[test]
    fn owntracks_topics_name_the_device() {
        match parse(
            "owntracks/jane/phone",
            booklet_location().as_bytes(),
            1 << 20,
        ) {
            Parsed::Tracker(Ok(f)) => {
                assert_eq!(f.device, "jane/phone");
                assert_eq!(f.ts, Ts(1_700_000_000_000));
            }
            other => panic!("{other:?}"),
        }
        // Messages other than locations (transitions on .../event, LWT, cards) are no fix.
        let lwt = r#"{"_type":"lwt","tst":1700000000}"#;
        assert!(matches!(
            parse("owntracks/jane/phone", lwt.as_bytes(), 1 << 20),
            Parsed::Nothing(_)
        ));
        // The app clears its retained message with an empty payload.
        assert!(matches!(
            parse("owntracks/jane/phone", b"", 1 << 20),
            Parsed::Nothing(_)
        ));
        assert!(matches!(
            parse("owntracks/jane", booklet_location().as_bytes(), 1 << 20),
            Parsed::Bad(ItemError::MissingField(_))
        ));
        let enc = r#"{"_type":"encrypted","data":"abc"}"#;
        assert!(matches!(
            parse("owntracks/jane/phone", enc.as_bytes(), 1 << 20),
            Parsed::Bad(_)
        ));
    }

    #[test]
    fn other_topics_carry_fixes_like_post_v1_fixes() {
        let one = r#"{"device":"t1","lat":1,"lon":2,"ts":"2026-01-01T00:00:00Z"}"#;
        match parse("fleet/t1", one.as_bytes(), 1 << 20) {
            Parsed::Items(v) => assert_eq!(v.len(), 1),
            other => panic!("{other:?}"),
        }
        let many = format!("[{one},{one}]");
        match parse("fleet/t1", many.as_bytes(), 1 << 20) {
            Parsed::Items(v) => assert_eq!(v.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse("fleet/t1", b"not json", 1 << 20),
            Parsed::Bad(ItemError::MalformedJson(_))
        ));
        assert!(matches!(
            parse("fleet/t1", b"42", 1 << 20),
            Parsed::Bad(ItemError::InvalidFix(_))
        ));
        assert!(matches!(
            parse("fleet/t1", &[0xff, 0xfe], 1 << 20),
            Parsed::Bad(ItemError::MalformedJson(_))
        ));
        assert!(matches!(
            parse("fleet/t1", one.as_bytes(), 10),
            Parsed::Bad(ItemError::InvalidFix(_))
        ));
    }
}
