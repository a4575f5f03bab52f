//! The one log cursor: a reader's position in the event log, and how the next chunk is read.
//! WebSocket subscribers read from the in-memory log only; webhook sinks fall back to the store
//! for events the log no longer holds.
//!
//! Invariants: a cursor only moves forward; a read returns events with consecutive `seq`s
//! starting exactly at the cursor, or says that the events from the cursor up to some `seq` are
//! gone (retention overtook the reader), never a silent gap.

use std::sync::Arc;

use crate::events::{CompactEvent, EventLog, Interner, LoggedEvent};
use crate::store::{Store, StoreError};

/// What a read at the cursor found.
#[derive(Debug, Clone)]
pub enum Chunk {
    /// Events from the cursor on, in `seq` order (empty: the reader is at the head).
    Events(Vec<LoggedEvent>),
    /// The events from the cursor up to `to` (exclusive) are no longer held anywhere.
    Missed {
        /// The first `seq` still held.
        to: u64,
    },
}

/// A read's events and where the log stood.
#[derive(Debug, Clone)]
pub struct Read {
    /// What was found at the cursor.
    pub chunk: Chunk,
    /// The `seq` the next appended event will get.
    pub head: u64,
    /// Events in the store that did not decode, skipped (store reads only; not expected: the
    /// store holds what the log rendered).
    pub undecodable: Vec<u64>,
}

/// A reader's position: the `seq` of the next event it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCursor {
    next: u64,
}

impl LogCursor {
    /// A cursor at `next`.
    pub fn at(next: u64) -> LogCursor {
        LogCursor { next }
    }

    /// The `seq` of the next event wanted.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Moves past `seq` (a no-op for a `seq` already behind the cursor).
    pub fn passed(&mut self, seq: u64) {
        self.next = self.next.max(seq + 1);
    }

    /// Moves to `seq` (a no-op when the cursor is already there or beyond).
    pub fn skip_to(&mut self, seq: u64) {
        self.next = self.next.max(seq);
    }

    /// Up to `max` events at the cursor from the in-memory log.
    pub fn read(&self, log: &EventLog, max: usize) -> Read {
        let r = log.read(self.next, max);
        let chunk = if self.next < r.first_seq {
            Chunk::Missed { to: r.first_seq }
        } else {
            Chunk::Events(r.events)
        };
        Read {
            chunk,
            head: r.next_seq,
            undecodable: Vec::new(),
        }
    }

    /// Up to `max` events at the cursor, from the in-memory log, or from `store` for the events
    /// the log has dropped.
    pub async fn read_or_store(
        &self,
        log: &EventLog,
        store: Option<&Arc<Store>>,
        max: usize,
    ) -> Result<Read, StoreError> {
        let mut read = self.read(log, max);
        let Chunk::Missed { to: below } = read.chunk else {
            return Ok(read);
        };
        let Some(store) = store.cloned() else {
            return Ok(read);
        };
        let from = self.next;
        let rows = tokio::task::spawn_blocking(move || store.read_events(from, below, max))
            .await
            .map_err(StoreError::Worker)??;
        let first = rows.first().map_or(below, |(s, _)| *s);
        if first > from {
            read.chunk = Chunk::Missed { to: first };
            return Ok(read);
        }
        let mut interner = Interner::default();
        let mut events = Vec::with_capacity(rows.len());
        for (seq, json) in rows {
            match CompactEvent::from_json(&json, &mut interner) {
                Ok((_, event)) => events.push(LoggedEvent::new(seq, event, Some(json.into()))),
                Err(_) => read.undecodable.push(seq),
            }
        }
        read.chunk = Chunk::Events(events);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use geodwell_core::event::Event;
    use geodwell_core::time::{Dur, Ts};

    fn append(log: &EventLog, n: u64) {
        let first = log.next_seq();
        let events = (0..n)
            .map(|i| {
                let mut e = Event::enter(
                    "d",
                    &Arc::from("f"),
                    Ts(1_000 * (first + i) as i64),
                    &Arc::default(),
                );
                e.seq = first + i;
                e.emitted_at = Some(Ts(0));
                LoggedEvent::new(e.seq, CompactEvent::from_event(&e).unwrap(), None)
            })
            .collect();
        log.append_stamped(events).unwrap();
    }

    #[test]
    fn reads_are_contiguous_and_retention_is_reported_not_skipped() {
        let log = EventLog::new(5, Dur::from_secs(3600), 1);
        append(&log, 3);
        let mut c = LogCursor::at(1);
        let r = c.read(&log, 2);
        let Chunk::Events(evs) = r.chunk else {
            panic!("events expected")
        };
        assert_eq!(evs.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(r.head, 4);
        c.passed(2);
        assert_eq!(c.next(), 3);
        c.passed(1);
        assert_eq!(c.next(), 3, "a cursor never moves back");
        append(&log, 10); // seqs 4..=13; the log keeps 9..=13
        let r = c.read(&log, 10);
        assert!(matches!(r.chunk, Chunk::Missed { to: 9 }), "{:?}", r.chunk);
        c.skip_to(9);
        let Chunk::Events(evs) = c.read(&log, 10).chunk else {
            panic!("events expected")
        };
        assert_eq!(evs.first().map(|e| e.seq), Some(9));
        c.passed(13);
        let Chunk::Events(evs) = c.read(&log, 10).chunk else {
            panic!("at the head: no events, not a gap")
        };
        assert!(evs.is_empty());
    }
}
