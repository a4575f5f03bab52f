//! The event log: one per instance, fed by every shard, read by every subscriber.
//!
//! Invariants: `seq` starts at 1 and is gap-free and strictly increasing across shards (assigned
//! under the log's lock at append, or checked there for events the publisher stamped); retention
//! drops from the front only (by count, then by age), so the log always holds one contiguous
//! range `first_seq..next_seq` and an entry's `seq` is `first_seq` plus its position (it is not
//! stored).
//!
//! Memory: each entry is a [`CompactEvent`] held inline in the ring buffer (120 bytes, no heap
//! allocation of its own for device ids up to 24 bytes; fence id and tags are the fence's shared
//! `Arc`s), so 200,000 events cost ~16 MB rather than the ~110 MB of a parsed event plus its JSON
//! text per entry. The buffer grows by doubling up to exactly `capacity` entries and is then kept.
//! JSON is rendered on demand, byte-for-byte what `serde_json` gives for the full event
//! ([`CompactEvent::render`]); the text of the newest [`JSON_CACHE`] events (rendered once by
//! whoever appended them) is kept alongside, so live subscribers and webhook sinks, which read at
//! the head, share one rendering instead of each rendering every event. Readers behind that
//! window render what they send, outside the lock.
//!
//! Readers never block writers for longer than a copy of the entries they read (refcount bumps);
//! subscribers learn about new events through a `watch` channel carrying `next_seq`, so a slow
//! subscriber costs the log nothing (it falls behind and is told so).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::events::compact::CompactEvent;
use geodwell_core::time::{Dur, Ts};

/// How many of the newest events keep their rendered JSON: enough for every live reader (they
/// read in chunks of at most 512 behind the head) while bounding the text held to ~1 MB whatever
/// the log's capacity.
pub const JSON_CACHE: usize = 4096;

/// Why events could not be appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// Stamped events do not continue the log's `seq` range without a gap (nothing was appended).
    #[error("event seq {got} does not continue the log (expected {expected}); nothing appended")]
    SeqGap {
        /// The `seq` the log needed.
        expected: u64,
        /// The `seq` it was given.
        got: u64,
    },
}

/// An event read from (or going into) the log: its `seq`, its compact form and, when known, its
/// JSON text.
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    /// Position in the log.
    pub seq: u64,
    /// The event without `seq`.
    pub event: CompactEvent,
    /// Its JSON, when already rendered (appended recently, or rendered by the appender).
    json: Option<Arc<str>>,
}

impl LoggedEvent {
    /// An event stamped with `seq`, with its already rendered JSON if the caller has it (it must
    /// be `event.render(seq)`, or text the log rendered before, as at warm start).
    pub fn new(seq: u64, event: CompactEvent, json: Option<Arc<str>>) -> LoggedEvent {
        LoggedEvent { seq, event, json }
    }

    /// The JSON text subscribers receive: the cached text, or rendered now.
    pub fn json(&self) -> Arc<str> {
        match &self.json {
            Some(j) => j.clone(),
            None => self.event.render(self.seq).into(),
        }
    }
}

/// What a read returned.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Events with `seq >= max(from_seq, first_seq)`, at most `limit`.
    pub events: Vec<LoggedEvent>,
    /// Oldest `seq` still held (equal to `next_seq` when empty).
    pub first_seq: u64,
    /// The `seq` the next appended event will get.
    pub next_seq: u64,
}

#[derive(Debug)]
struct Inner {
    /// The entries, oldest first; entry `i` has `seq` `next_seq - buf.len() + i`.
    buf: VecDeque<CompactEvent>,
    /// The JSON of the newest `json.len()` entries (`json.len() <= min(buf.len(), JSON_CACHE)`).
    json: VecDeque<Arc<str>>,
    next_seq: u64,
}

impl Inner {
    fn first_seq(&self) -> u64 {
        self.next_seq - self.buf.len() as u64
    }
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
                json: VecDeque::new(),
                next_seq: first_seq,
            }),
            capacity: capacity.max(1),
            max_age,
            head,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave Inner inconsistent (every mutation is a
        // push or pop, and the two queues are re-aligned before each read), so a poisoned lock is
        // still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends events already stamped by the publisher: their `seq`s must continue the log's
    /// without a gap, else nothing is appended. Events among the newest [`JSON_CACHE`] without
    /// JSON are rendered here, outside the lock.
    pub fn append_stamped(&self, mut events: Vec<LoggedEvent>) -> Result<(), LogError> {
        if events.is_empty() {
            return Ok(());
        }
        let cached_from = events.len().saturating_sub(JSON_CACHE);
        for e in &mut events[cached_from..] {
            if e.json.is_none() {
                e.json = Some(e.event.render(e.seq).into());
            }
        }
        let next = {
            let mut g = self.lock();
            for (i, e) in events.iter().enumerate() {
                let expected = g.next_seq + i as u64;
                if e.seq != expected {
                    return Err(LogError::SeqGap {
                        expected,
                        got: e.seq,
                    });
                }
            }
            let now = events.last().and_then(|e| e.event.emitted_at());
            for e in &events {
                self.push(&mut g, e);
            }
            self.trim(&mut g, now);
            g.next_seq
        };
        self.head.send_replace(next);
        Ok(())
    }

    /// Appends one entry (its `seq` is `next_seq`), first dropping the oldest when full so the
    /// buffer never needs room for more than `capacity` entries.
    fn push(&self, g: &mut Inner, e: &LoggedEvent) {
        if g.buf.len() >= self.capacity {
            Self::pop_front(g);
        }
        if g.buf.len() == g.buf.capacity() {
            // Doubling as VecDeque would, but capped at `capacity`: its own growth would round
            // 200,000 up to 262,144 slots (+31% of the log's memory, never used).
            let want = (g.buf.capacity().max(8) * 2).min(self.capacity);
            g.buf.reserve_exact(want - g.buf.len());
        }
        g.buf.push_back(e.event.clone());
        g.next_seq += 1;
        match &e.json {
            Some(j) => {
                if g.json.len() >= JSON_CACHE {
                    g.json.pop_front();
                }
                g.json.push_back(j.clone());
            }
            // The cache covers the newest entries only; an entry without text ends it.
            None => g.json.clear(),
        }
    }

    fn pop_front(g: &mut Inner) {
        g.buf.pop_front();
        if g.json.len() > g.buf.len() {
            g.json.pop_front();
        }
    }

    fn trim(&self, g: &mut Inner, now: Option<Ts>) {
        let horizon = now.map(|n| n.minus(self.max_age));
        while g.buf.len() > self.capacity
            || g.buf
                .front()
                .is_some_and(|f| matches!((f.emitted_at(), horizon), (Some(t), Some(h)) if t < h))
        {
            Self::pop_front(g);
        }
    }

    /// Reads up to `limit` events from `from_seq` on.
    pub fn read(&self, from_seq: u64, limit: usize) -> ReadResult {
        let g = self.lock();
        let first_seq = g.first_seq();
        let skip = (from_seq.max(first_seq) - first_seq) as usize;
        let cached_from = g.buf.len() - g.json.len();
        let end = skip.saturating_add(limit).min(g.buf.len());
        let events = (skip.min(end)..end)
            .map(|i| LoggedEvent {
                seq: first_seq + i as u64,
                event: g.buf[i].clone(),
                json: i.checked_sub(cached_from).map(|j| g.json[j].clone()),
            })
            .collect();
        ReadResult {
            events,
            first_seq,
            next_seq: g.next_seq,
        }
    }

    /// Continues the log at `seq`, past a range its source no longer holds (a cluster node's
    /// feed found the events stream's retention ahead of it): what the log holds is dropped,
    /// so it stays one contiguous range. A `seq` not ahead of the log changes nothing.
    pub fn skip_to(&self, seq: u64) {
        let next = {
            let mut g = self.lock();
            if seq <= g.next_seq {
                return;
            }
            g.buf.clear();
            g.json.clear();
            g.next_seq = seq;
            g.next_seq
        };
        self.head.send_replace(next);
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
    use geodwell_core::time::Ts;

    use geodwell_core::event::Event;

    /// Stamps `events` the way the publisher does (next seqs, `emitted_at = now`) and appends
    /// them.
    trait AppendNow {
        fn append(&self, events: Vec<Event>, now: Ts);
    }

    impl AppendNow for EventLog {
        fn append(&self, events: Vec<Event>, now: Ts) {
            let first = self.next_seq();
            let stamped = events
                .into_iter()
                .enumerate()
                .map(|(i, mut e)| {
                    e.seq = first + i as u64;
                    e.emitted_at = Some(now);
                    LoggedEvent::new(e.seq, CompactEvent::from_event(&e).unwrap(), None)
                })
                .collect();
            self.append_stamped(stamped).unwrap();
        }
    }

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
        let seqs: Vec<u64> = r.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![2, 3, 4]);
        assert_eq!(log.read(4, 10).events.len(), 1);
        assert_eq!(log.read(5, 10).events.len(), 0);
        assert_eq!(log.read(99, 10).events.len(), 0);
        // Age: everything emitted before now - 60 s goes.
        log.append(vec![ev(5)], Ts(63_000));
        let r = log.read(0, 10);
        assert_eq!(r.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![5]);
        assert!(r.events[0].json().contains("\"seq\":5"));
        // Everything aged out: the range is empty but still continues.
        log.append(vec![ev(6)], Ts(200_000));
        log.append_stamped(Vec::new()).unwrap();
        let r = log.read(0, 10);
        assert_eq!((r.first_seq, r.next_seq, r.events.len()), (6, 7, 1));
    }

    #[test]
    fn cached_and_rendered_json_agree_and_the_buffer_stops_at_capacity() {
        let cap = JSON_CACHE + 1000;
        let log = EventLog::new(cap, Dur::from_secs(3600), 1);
        for chunk in 0..(cap as i64 * 2 / 100) {
            log.append((0..100).map(|i| ev(chunk * 100 + i)).collect(), Ts(1000));
        }
        let r = log.read(0, usize::MAX);
        assert_eq!(r.events.len(), cap);
        assert_eq!(
            log.lock().buf.capacity(),
            cap,
            "grown to exactly the capacity"
        );
        let cached = r.events.iter().filter(|e| e.json.is_some()).count();
        assert_eq!(cached, JSON_CACHE);
        assert!(
            r.events.last().unwrap().json.is_some(),
            "the newest are the cached ones"
        );
        for e in &r.events {
            assert_eq!(&*e.json(), e.event.render(e.seq));
            assert_eq!(e.event.to_event(e.seq).id, e.event.id());
        }
        assert_eq!(r.events[0].seq, r.first_seq);
        assert_eq!(r.events.last().unwrap().seq + 1, r.next_seq);
    }

    #[test]
    fn stamped_events_must_continue_the_range() {
        let log = EventLog::new(10, Dur::from_secs(60), 5);
        let stamped = |seq: u64| {
            let mut e = ev(seq as i64);
            e.seq = seq;
            e.emitted_at = Some(Ts(1000));
            LoggedEvent::new(seq, CompactEvent::from_event(&e).unwrap(), None)
        };
        assert_eq!(
            log.append_stamped(vec![stamped(5), stamped(7)]),
            Err(LogError::SeqGap {
                expected: 6,
                got: 7
            })
        );
        assert!(log.is_empty(), "nothing of a refused batch is appended");
        log.append_stamped(vec![stamped(5), stamped(6)]).unwrap();
        let r = log.read(0, 10);
        assert_eq!(r.events.len(), 2);
        assert!(
            r.events.iter().all(|e| e.json.is_some()),
            "rendered at append"
        );
        assert!(r.events[1].json().contains("\"seq\":6"));
    }
}
