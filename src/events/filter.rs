//! The one event filter: which events a subscriber, a poller or a webhook sink receives.
//!
//! Semantics (the same for every channel): an event passes when its type is listed (or no type
//! is), its fence id matches one of the fence globs (or there are none; `*` and `?` as in a
//! shell, matched in linear time: [`geodwell_core::glob`]), and its device is the one asked for (or none is). Polls and subscriptions may also
//! bound the event time `at`: `since` inclusive, `until` exclusive.

use crate::events::compact::CompactEvent;
use geodwell_core::event::EventKind;
use geodwell_core::glob::Glob;
use geodwell_core::time::Ts;

/// The longest fence glob a filter takes, bytes: twice the longest fence id, so any id can be
/// written with wildcards between its characters, and a match costs at most a few machine words
/// per character of an id.
pub const MAX_GLOB_BYTES: usize = 512;

/// A filter over event type, fence id (globs), device id and event time.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    types: Vec<EventKind>,
    fences: Vec<Glob>,
    device: Option<String>,
    since: Option<Ts>,
    until: Option<Ts>,
}

impl EventFilter {
    /// Every event passes.
    pub fn everything() -> EventFilter {
        EventFilter::default()
    }

    /// Events of `types` (empty: any), for a fence matching one of `fence_globs` (empty: any),
    /// of `device` (`None`: any).
    pub fn new<S: AsRef<str>>(
        types: Vec<EventKind>,
        fence_globs: &[S],
        device: Option<String>,
    ) -> EventFilter {
        EventFilter {
            types,
            fences: fence_globs.iter().map(|g| Glob::new(g.as_ref())).collect(),
            device,
            since: None,
            until: None,
        }
    }

    /// The same filter, keeping only events with `since <= at < until` (either bound optional).
    pub fn between(mut self, since: Option<Ts>, until: Option<Ts>) -> EventFilter {
        self.since = since;
        self.until = until;
        self
    }

    /// Whether a logged event passes (type, fence, device and event time).
    pub fn matches_event(&self, e: &CompactEvent) -> bool {
        let at = e.at();
        self.since.is_none_or(|s| at >= s)
            && self.until.is_none_or(|u| at < u)
            && self.matches(e.kind(), e.fence(), e.device())
    }

    /// Whether an event of `kind` for `fence` and `device` passes (the time bounds aside).
    pub fn matches(&self, kind: EventKind, fence: &str, device: &str) -> bool {
        (self.types.is_empty() || self.types.contains(&kind))
            && (self.fences.is_empty() || self.fences.iter().any(|g| g.matches(fence)))
            && self.device.as_deref().is_none_or(|d| d == device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventKind::{Dwell, Enter, Exit};

    #[test]
    fn types_globs_and_device_combine() {
        let f = EventFilter::new(vec![Enter, Dwell], &["depot-*", "hq"], None);
        assert!(f.matches(Enter, "depot-3", "d"));
        assert!(f.matches(Dwell, "hq", "d"));
        assert!(!f.matches(Exit, "depot-3", "d"), "type not listed");
        assert!(!f.matches(Enter, "hq-2", "d"), "fence matches no pattern");
        let all = EventFilter::everything();
        assert!(all.matches(Exit, "anything", "anyone"));
        let one = EventFilter::new(Vec::new(), &[] as &[&str], Some("truck-17".into()));
        assert!(one.matches(Exit, "x", "truck-17"));
        assert!(
            !one.matches(Exit, "x", "truck-1"),
            "device ids match exactly"
        );
        let q = EventFilter::new(Vec::new(), &["yard-?"], None);
        assert!(q.matches(Enter, "yard-7", "d") && !q.matches(Enter, "yard-17", "d"));
    }
}
