//! The event log: one per instance, fed by every shard, read by every subscriber.
//!
//! Invariants: `seq` starts at 1 and is gap-free and strictly increasing across shards (assigned
//! under the log's lock at append); retention drops from the front only (by count, then by age),
//! so the log always holds one contiguous range `first_seq..next_seq`. Each event is serialized to
//! JSON once, at append, and shared by every reader. Readers never block writers for longer than
//! a copy of `Arc` pointers; subscribers learn about new events through a `watch` channel carrying
//! `next_seq`, so a slow subscriber costs the log nothing (it falls behind and is told so).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::core::event::Event;
use crate::core::time::{Dur, Ts};

/// An event as stored: stamped with `seq` and `emitted_at`, plus its JSON text.
#[derive(Debug)]
pub struct LoggedEvent {
    /// The stamped event, without its `tags` (they are in `json`).
    pub event: Event,
    /// `serde_json` text of the whole event, tags included: what subscribers receive.
    pub json: Arc<str>,
}

impl LoggedEvent {
    /// Serializes `event` and keeps what filters and cursors need; the fence tags live only in
    /// the JSON (a second parsed copy per logged event cost ~150 bytes x the log's capacity).
    pub fn new(mut event: Event) -> LoggedEvent {
        let json: Arc<str> = serde_json::to_string(&event)
            .unwrap_or_else(|_| "{}".to_string())
            .into();
        event.tags = Arc::new(serde_json::Value::Null);
        LoggedEvent { event, json }
    }
}

/// What a read returned.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Events with `seq >= max(from_seq, first_seq)`, at most `limit`.
    pub events: Vec<Arc<LoggedEvent>>,
    /// Oldest `seq` still held (equal to `next_seq` when empty).
    pub first_seq: u64,
    /// The `seq` the next appended event will get.
    pub next_seq: u64,
}

#[derive(Debug)]
struct Inner {
    buf: VecDeque<Arc<LoggedEvent>>,
    next_seq: u64,
}

/// The in-memory event log, bounded by count and age.
#[derive(Debug)]
pub struct EventLog {
    inner: Mutex<Inner>,
    capacity: usize,
    max_age: Dur,
    head: watch::Sender<u64>,
}

impl EventLog {
    /// An empty log whose first event will get `seq` = `first_seq`.
    pub fn new(capacity: usize, max_age: Dur, first_seq: u64) -> EventLog {
        let (head, _) = watch::channel(first_seq);
        EventLog {
            inner: Mutex::new(Inner {
                buf: VecDeque::new(),
                next_seq: first_seq,
            }),
            capacity: capacity.max(1),
            max_age,
            head,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave Inner inconsistent (every mutation is a
        // push or pop), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stamps `seq` and `emitted_at` on `events` in order and appends them; returns the stored
    /// events.
    pub fn append(&self, events: Vec<Event>, wall_now: Ts) -> Vec<Arc<LoggedEvent>> {
        if events.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(events.len());
        let next = {
            let mut g = self.lock();
            for mut e in events {
                e.seq = g.next_seq;
                e.emitted_at = Some(wall_now);
                g.next_seq += 1;
                let le = Arc::new(LoggedEvent::new(e));
                g.buf.push_back(le.clone());
                out.push(le);
            }
            self.trim(&mut g, Some(wall_now));
            g.next_seq
        };
        self.head.send_replace(next);
        out
    }

    /// Appends events already stamped by the publisher (their `seq` must continue the log's).
    pub fn append_stamped(&self, events: Vec<Arc<LoggedEvent>>) {
        if events.is_empty() {
            return;
        }
        let next = {
            let mut g = self.lock();
            let now = events.last().and_then(|e| e.event.emitted_at);
            for e in events {
                debug_assert_eq!(e.event.seq, g.next_seq, "seq must be gap-free");
                g.next_seq = e.event.seq + 1;
                g.buf.push_back(e);
            }
            self.trim(&mut g, now);
            g.next_seq
        };
        self.head.send_replace(next);
    }

    fn trim(&self, g: &mut Inner, now: Option<Ts>) {
        let horizon = now.map(|n| n.minus(self.max_age));
        while g.buf.len() > self.capacity
            || g.buf.front().is_some_and(
                |f| matches!((f.event.emitted_at, horizon), (Some(t), Some(h)) if t < h),
            )
        {
            g.buf.pop_front();
        }
    }

    /// Reads up to `limit` events from `from_seq` on.
    pub fn read(&self, from_seq: u64, limit: usize) -> ReadResult {
        let g = self.lock();
        let first_seq = g.buf.front().map_or(g.next_seq, |f| f.event.seq);
        let start = from_seq.max(first_seq);
        let skip = (start - first_seq) as usize;
        let events = g.buf.iter().skip(skip).take(limit).cloned().collect();
        ReadResult {
            events,
            first_seq,
            next_seq: g.next_seq,
        }
    }

    /// The `seq` the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.lock().next_seq
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.lock().buf.len()
    }

    /// Whether the log holds no event.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A receiver that changes whenever events are appended (its value is `next_seq`).
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.head.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::time::Ts;

    fn ev(n: i64) -> Event {
        let f: Arc<str> = Arc::from("f");
        Event::enter("d", &f, Ts(n), &Arc::new(serde_json::json!({})))
    }

    #[test]
    fn seq_is_gap_free_and_retention_drops_from_the_front() {
        let log = EventLog::new(3, Dur::from_secs(60), 1);
        log.append(vec![ev(1), ev(2)], Ts(1000));
        log.append(vec![ev(3), ev(4)], Ts(2000));
        let r = log.read(0, 10);
        assert_eq!(r.first_seq, 2);
        assert_eq!(r.next_seq, 5);
        let seqs: Vec<u64> = r.events.iter().map(|e| e.event.seq).collect();
        assert_eq!(seqs, vec![2, 3, 4]);
        assert_eq!(log.read(4, 10).events.len(), 1);
        assert_eq!(log.read(5, 10).events.len(), 0);
        // Age: everything emitted before now - 60 s goes.
        log.append(vec![ev(5)], Ts(63_000));
        let r = log.read(0, 10);
        assert_eq!(
            r.events.iter().map(|e| e.event.seq).collect::<Vec<_>>(),
            vec![5]
        );
        assert!(r.events[0].json.contains("\"seq\":5"));
    }
}
