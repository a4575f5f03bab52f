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

use crate::ingest::ReadError;
use crate::wire::trackers::{OwnTracksIdentity, OwnTracksMessage, TrackerFix, owntracks_from_json};
use crate::wire::{BatchShapeError, FixLimits, ItemError, Located, locate_batch};
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

/// What one message holds.
#[derive(Debug)]
pub enum Parsed {
    /// Its fixes, each validated (or why not).
    Fixes(Vec<Result<Fix, ItemError>>),
    /// Nothing to ingest (an OwnTracks message other than a location, an empty payload: the app
    /// clears a retained message with one).
    Nothing(&'static str),
    /// The whole message is unreadable or too large: one rejected item.
    Bad(ItemError),
    /// Its fixes do not fit the memory budget now (`read` said so): read it again later.
    NoRoom,
}

/// Whether a topic is OwnTracks' (`owntracks/...`).
pub fn is_owntracks(topic: &[u8]) -> bool {
    topic.starts_with(b"owntracks/")
}

/// Reads one message. `max_bytes` bounds the payload (`ingest.max_body_bytes`), `max_batch` its
/// fixes (`ingest.max_batch`); a generic batch's items are read by `read` (which charges what
/// they hold to the message's budget), an OwnTracks location is validated against `limits` at
/// wall time `now`.
pub fn parse(
    topic: &str,
    payload: &[u8],
    max_bytes: usize,
    max_batch: usize,
    read: impl FnOnce(Located<'_>) -> Result<Vec<Result<Fix, ItemError>>, ReadError>,
    limits: &FixLimits,
    now: Ts,
) -> Parsed {
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
    if is_owntracks(topic.as_bytes()) {
        return owntracks(topic, text, limits, now);
    }
    let located = match locate_batch(text) {
        Ok(l) if l.is_empty() => return Parsed::Nothing("an empty array"),
        Ok(l) => l,
        Err(e) => return Parsed::Bad(shape_error(e)),
    };
    if located.len() > max_batch {
        return Parsed::Bad(ItemError::InvalidFix(format!(
            "the message holds {} fixes; the limit is {max_batch} (ingest.max_batch)",
            located.len()
        )));
    }
    match read(located) {
        Ok(fixes) => Parsed::Fixes(fixes),
        Err(ReadError::Shape(e)) => Parsed::Bad(shape_error(e)),
        Err(ReadError::Budget(_)) => Parsed::NoRoom,
        Err(ReadError::NeverFits { need, total }) => Parsed::Bad(ItemError::InvalidFix(format!(
            "the message's fixes hold {need} bytes, more than the whole ingest memory budget of {total} (ingest.max_queued_bytes)"
        ))),
    }
}

fn shape_error(e: BatchShapeError) -> ItemError {
    match e {
        BatchShapeError::NotJson(e) => {
            ItemError::MalformedJson(format!("the message is not JSON: {e}"))
        }
        BatchShapeError::NotFixOrArray(kind) => ItemError::InvalidFix(format!(
            "expected a fix object or an array of fixes, got {kind}"
        )),
    }
}

/// An OwnTracks message under `owntracks/<user>/<device>[/...]`.
fn owntracks(topic: &str, text: &str, limits: &FixLimits, now: Ts) -> Parsed {
    let mut levels = topic.split('/').skip(1);
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
    match owntracks_from_json(&v, &ident) {
        Ok(OwnTracksMessage::Location(fix)) => Parsed::Fixes(vec![tracker_fix(fix, limits, now)]),
        Ok(OwnTracksMessage::Ignored(_)) => Parsed::Nothing("not a location"),
        Err(e) => Parsed::Bad(ItemError::InvalidFix(e.message)),
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

    const NOW: Ts = Ts(1_700_000_030_000);

    fn booklet_location() -> &'static str {
        // The OwnTracks booklet's example location message (MQTT mode).
        r#"{"_type":"location","acc":12,"alt":0,"batt":76,"bs":1,"conn":"w","created_at":1700000000,"lat":53.5413,"lon":9.9840,"m":1,"t":"u","tid":"jp","tst":1700000000,"vac":0,"vel":36}"#
    }

    fn p(topic: &str, payload: &[u8], max_bytes: usize, max_batch: usize) -> Parsed {
        let limits = FixLimits::default();
        parse(
            topic,
            payload,
            max_bytes,
            max_batch,
            |l| l.read(&limits, NOW).map_err(ReadError::Shape),
            &limits,
            NOW,
        )
    }

    #[test]
    fn owntracks_topics_name_the_device() {
        match p(
            "owntracks/jane/phone",
            booklet_location().as_bytes(),
            1 << 20,
            10,
        ) {
            Parsed::Fixes(f) => {
                let f = f[0].as_ref().unwrap();
                assert_eq!(f.device, "jane/phone");
                assert_eq!(f.ts, Ts(1_700_000_000_000));
            }
            other => panic!("{other:?}"),
        }
        // Messages other than locations (transitions on .../event, LWT, cards) are no fix.
        let lwt = r#"{"_type":"lwt","tst":1700000000}"#;
        assert!(matches!(
            p("owntracks/jane/phone", lwt.as_bytes(), 1 << 20, 10),
            Parsed::Nothing(_)
        ));
        // The app clears its retained message with an empty payload.
        assert!(matches!(
            p("owntracks/jane/phone", b"", 1 << 20, 10),
            Parsed::Nothing(_)
        ));
        assert!(matches!(
            p("owntracks/jane", booklet_location().as_bytes(), 1 << 20, 10),
            Parsed::Bad(ItemError::MissingField(_))
        ));
        let enc = r#"{"_type":"encrypted","data":"abc"}"#;
        assert!(matches!(
            p("owntracks/jane/phone", enc.as_bytes(), 1 << 20, 10),
            Parsed::Bad(_)
        ));
    }

    #[test]
    fn other_topics_carry_fixes_like_post_v1_fixes() {
        let one = r#"{"device":"t1","lat":1,"lon":2,"ts":"2023-11-14T22:13:20Z"}"#;
        match p("fleet/t1", one.as_bytes(), 1 << 20, 10) {
            Parsed::Fixes(v) => assert_eq!(v.len(), 1),
            other => panic!("{other:?}"),
        }
        let many = format!("[{one},{one}]");
        match p("fleet/t1", many.as_bytes(), 1 << 20, 10) {
            Parsed::Fixes(v) => assert_eq!(v.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            p("fleet/t1", b"not json", 1 << 20, 10),
            Parsed::Bad(ItemError::MalformedJson(_))
        ));
        assert!(matches!(
            p("fleet/t1", b"42", 1 << 20, 10),
            Parsed::Bad(ItemError::InvalidFix(_))
        ));
        assert!(matches!(
            p("fleet/t1", &[0xff, 0xfe], 1 << 20, 10),
            Parsed::Bad(ItemError::MalformedJson(_))
        ));
        assert!(matches!(
            p("fleet/t1", one.as_bytes(), 10, 10),
            Parsed::Bad(ItemError::InvalidFix(_))
        ));
        assert!(matches!(
            p("fleet/t1", b"[]", 1 << 20, 10),
            Parsed::Nothing(_)
        ));
    }

    #[test]
    fn a_message_is_held_to_max_batch_and_the_budget() {
        let one = r#"{"device":"t1","lat":1,"lon":2,"ts":1700000000000}"#;
        let three = format!("[{one},{one},{one}]");
        match p("fleet/t1", three.as_bytes(), 1 << 20, 2) {
            Parsed::Bad(ItemError::InvalidFix(m)) => {
                assert!(m.contains("3 fixes") && m.contains("max_batch"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let limits = FixLimits::default();
        let no_room = parse(
            "fleet/t1",
            one.as_bytes(),
            1 << 20,
            10,
            |_| Err(ReadError::Budget(crate::budget::Exhausted { total: 1 })),
            &limits,
            NOW,
        );
        assert!(matches!(no_room, Parsed::NoRoom), "{no_room:?}");
    }
}
