//! Heap cost of the in-memory event log, measured with a counting global allocator.
//!
//! Deterministic (counts bytes requested from the allocator, not RSS or time): fills an
//! `EventLog` of the default capacity (200,000) past full with realistic events (device ids like
//! `dev-0001234`, fence ids and tags shared with their fence, as the engine emits them) and
//! checks the heap held per logged event, everything included: the ring buffer, anything an
//! entry owns, and the JSON kept for the newest events.
//!
//! The bound, 140 B: an entry is 120 B inline with no allocation of its own (asserted at compile
//! time in `events::compact`; the fence name is shared with the fence, the deciding fix's
//! position is inline), the buffer is grown to exactly the capacity, and the JSON cache
//! holds `JSON_CACHE` (4,096) texts of ~300 B plus their slots, ~1.3 MB or ~7 B per event at
//! 200,000. The old layout (a parsed event and its JSON text, each behind an `Arc`) measured
//! 540 B and 3 allocations per event with this same fill (docs/benchmarks.md).
//!
//! One test only: the counters are process-wide, and a second test running in parallel would
//! show up in them.

use std::sync::Arc;

use geodwell::events::{CompactEvent, EventLog, JSON_CACHE, LoggedEvent};
use geodwell_core::event::Event;
use geodwell_core::time::{Dur, Ts};

#[path = "../benches/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{Counting, live_blocks, live_bytes};

#[global_allocator]
static ALLOC: Counting = Counting;

const CAPACITY: usize = 200_000;
const FENCES: usize = 2_000;
const DEVICES: u64 = 150_000;

/// Live heap (bytes, blocks) held by `log`'s events after filling it with `total` events whose
/// device ids `device(n)` gives, per held event.
fn per_event(total: u64, device: impl Fn(u64) -> String) -> (f64, f64, usize) {
    // What the engine shares between events of one fence: its id, its tags and its name.
    let fences: Vec<(Arc<str>, Arc<serde_json::Value>, Arc<str>)> = (0..FENCES)
        .map(|i| {
            (
                Arc::from(format!("site-{i:05}-a")),
                Arc::new(serde_json::json!({"kind": "site", "cluster": i / 3, "zone": "north"})),
                Arc::from(format!("Site {i} north")),
            )
        })
        .collect();
    let log = EventLog::new(CAPACITY, Dur::from_secs(86_400), 1);
    let (bytes0, blocks0) = (live_bytes(), live_blocks());
    let t0: i64 = 1_767_225_600_000; // 2026-01-01
    let mut n = 0u64;
    while n < total {
        let batch: Vec<Event> = (0..256)
            .map(|k| {
                let i = n + k;
                let dev = device(i % DEVICES);
                let (fence, tags, name) = &fences[(i as usize * 7) % FENCES];
                let entered = Ts(t0 + i as i64 * 10);
                let (lat, lon) = (
                    53.5 + (i % 1000) as f64 * 1e-5,
                    9.9 + (i % 777) as f64 * 1e-5,
                );
                match i % 10 {
                    0..=4 => Event::enter(&dev, fence, entered, tags).at_fix(lat, lon, Some(8.0)),
                    5..=7 => Event::dwell(&dev, fence, entered, Dur::from_mins(10), tags),
                    _ => Event::exit(&dev, fence, entered, Ts(entered.0 + 754_250), tags)
                        .at_fix(lat, lon, None),
                }
                .named(Some(name))
            })
            .collect();
        n += batch.len() as u64;
        // Stamped and rendered as the publisher does; only what the log keeps is measured.
        let now = Ts(t0 + n as i64);
        let first = log.next_seq();
        let stamped = batch
            .into_iter()
            .enumerate()
            .map(|(k, mut e)| {
                e.seq = first + k as u64;
                e.emitted_at = Some(now);
                let compact = CompactEvent::from_event(&e).expect("compact form holds it");
                let json = compact.render(e.seq).into();
                LoggedEvent::new(e.seq, compact, Some(json))
            })
            .collect();
        log.append_stamped(stamped).expect("gap-free");
    }
    let held = log.len();
    let bytes = live_bytes() - bytes0;
    let blocks = live_blocks() - blocks0;
    drop(log);
    drop(fences);
    (
        bytes as f64 / held as f64,
        blocks as f64 / held as f64,
        held,
    )
}

#[test]
fn logged_events_cost_under_140_bytes_of_heap_each() {
    // Past full, so the ring has wrapped and retention has run: the steady state.
    let (bytes, blocks, held) = per_event(CAPACITY as u64 + 50_000, |d| format!("dev-{d:07}"));
    println!(
        "event log: {held} events, {bytes:.1} heap bytes and {blocks:.4} allocations per event \
         (device ids of 11 bytes)"
    );
    assert_eq!(held, CAPACITY);
    assert!(bytes <= 140.0, "{bytes:.1} B per logged event (bound: 140)");
    // No allocation per event: the buffer, plus one JSON text (and its slot) per cached event.
    assert!(
        blocks * (held as f64) <= (JSON_CACHE + 16) as f64,
        "{blocks:.4} allocations per event"
    );

    // Device ids over 24 bytes are the uncommon case: one allocation each, measured for the docs.
    let (bytes, blocks, _) = per_event(CAPACITY as u64 + 50_000, |d| {
        format!("fleet-eu-west-vehicle-{d:012}")
    });
    println!(
        "event log: {bytes:.1} heap bytes and {blocks:.4} allocations per event (device ids of \
         34 bytes)"
    );
    assert!(
        bytes <= 180.0,
        "{bytes:.1} B per logged event with long device ids"
    );
}
