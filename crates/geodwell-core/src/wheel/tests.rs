//! Unit tests and the model test of the timer wheel.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn key(slot: u32, generation: u32) -> TimerKey {
    TimerKey { slot, generation }
}

/// Advances with every entry live and no cap, returning the fired timers.
fn fire_all(w: &mut Wheel, to: u64) -> Vec<Fired> {
    let mut out = Vec::new();
    w.advance(Tick(to), usize::MAX, |_| true, &mut out);
    out
}

#[test]
fn entries_are_twelve_bytes_and_overflow_entries_sixteen() {
    assert_eq!(mem::size_of::<Entry>(), 12);
    assert_eq!(mem::size_of::<FarEntry>(), 16);
}

#[test]
fn a_timer_fires_at_its_due_tick_not_before() {
    let mut w = Wheel::new(Tick(100));
    w.schedule(key(1, 0), Tick(105));
    assert!(fire_all(&mut w, 104).is_empty());
    assert_eq!(
        fire_all(&mut w, 105),
        vec![Fired {
            key: key(1, 0),
            due: Tick(105)
        }]
    );
    assert!(w.is_empty());
    assert_eq!(w.next_due(), None);
}

#[test]
fn a_past_due_timer_fires_on_the_next_advance_even_without_moving() {
    let mut w = Wheel::new(Tick(50));
    w.schedule(key(1, 0), Tick(50));
    w.schedule(key(2, 0), Tick(3));
    assert_eq!(w.next_due(), Some(Tick(50)));
    assert_eq!(w.stats().carry, 2);
    let fired = fire_all(&mut w, 50);
    assert_eq!(fired.len(), 2);
    assert_eq!(fired[1].due, Tick(3));
    assert_eq!(w.now(), Tick(50));
}

#[test]
fn coarse_and_overflow_deadlines_fire_exactly_on_time() {
    let start = 1_000u64;
    let mut w = Wheel::new(Tick(start));
    let dues = [
        start + 4_095,          // last fine tick
        start + 4_096,          // first coarse delta
        start + 86_400,         // a day: coarse
        start + (1 << 24) - 1,  // last coarse delta
        start + (1 << 24),      // overflow
        start + 40_000_000,     // overflow, several coarse turns away
        start + 3_000_000_000,  // overflow, past the 32-bit range of a level entry
        start + 10_000_000_000, // overflow, beyond u32 from the start
    ];
    for (i, d) in dues.iter().enumerate() {
        w.schedule(key(i as u32, 7), Tick(*d));
    }
    let mut now = start;
    for (i, d) in dues.iter().enumerate() {
        // Arrive in a few uneven steps so buckets are visited in partial ranges, not just jumps.
        for to in [(now + *d) / 2, *d - 4_097, *d - 1] {
            if to > now {
                assert!(fire_all(&mut w, to).is_empty(), "early fire before {d}");
                now = to;
            }
        }
        let fired = fire_all(&mut w, *d);
        assert_eq!(fired.len(), 1, "due {d}");
        assert_eq!(fired[0].key, key(i as u32, 7));
        assert_eq!(fired[0].due, Tick(*d));
        now = *d;
    }
    assert!(w.is_empty());
}

#[test]
fn level_entries_survive_the_32_bit_wrap_of_their_stored_due() {
    let start = u64::from(u32::MAX) - 10;
    let mut w = Wheel::with_geometry(Tick(start), 3, 3);
    for (i, delta) in [5u64, 15, 30, 100, 1_000].into_iter().enumerate() {
        w.schedule(key(i as u32, 0), Tick(start + delta));
    }
    let mut got = Vec::new();
    for to in (start + 1)..=(start + 1_000) {
        for f in fire_all(&mut w, to) {
            assert_eq!(f.due, Tick(to));
            got.push(f.due.0 - start);
        }
    }
    assert_eq!(got, vec![5, 15, 30, 100, 1_000]);
}

#[test]
fn a_jump_of_many_turns_meets_each_entry_once() {
    let mut w = Wheel::new(Tick(0));
    let mut n = 0u32;
    for d in (1..30_000_000u64).step_by(7_919) {
        w.schedule(key(n, 0), Tick(d));
        n += 1;
    }
    let mut calls = 0u32;
    let mut out = Vec::new();
    let fired = w.advance(
        Tick(1 << 40),
        usize::MAX,
        |_| {
            calls += 1;
            true
        },
        &mut out,
    );
    assert_eq!(fired, n as usize);
    assert_eq!(calls, n, "each entry is checked exactly once");
    assert!(out.iter().all(|f| f.due.0 < 30_000_000));
    assert!(w.is_empty());
}

#[test]
fn the_cap_carries_the_rest_and_dead_carried_entries_do_not_count() {
    let mut w = Wheel::new(Tick(0));
    let mut generation = [0u32; 10];
    for slot in 0..10 {
        w.schedule(key(slot, 0), Tick(1));
    }
    let mut out = Vec::new();
    let live = |g: &[u32; 10], k: TimerKey| g[k.slot as usize] == k.generation;
    assert_eq!(w.advance(Tick(1), 3, |k| live(&generation, k), &mut out), 3);
    assert_eq!(w.stats().carry, 7);
    assert_eq!(w.next_due(), Some(Tick(1)));
    // Cancel two of the carried timers.
    let carried: Vec<u32> = (0..10)
        .filter(|s| !out.iter().any(|f| f.key.slot == *s))
        .collect();
    for s in &carried[..2] {
        generation[*s as usize] += 1;
        w.cancelled();
    }
    assert_eq!(w.stats().tombstones, 2);
    out.clear();
    assert_eq!(w.advance(Tick(2), 3, |k| live(&generation, k), &mut out), 3);
    assert!(out.iter().all(|f| !carried[..2].contains(&f.key.slot)));
    assert_eq!(
        w.stats(),
        WheelStats {
            entries: 2,
            tombstones: 0,
            carry: 2
        }
    );
    out.clear();
    assert_eq!(w.advance(Tick(2), 0, |k| live(&generation, k), &mut out), 0);
    assert_eq!(w.advance(Tick(2), 5, |k| live(&generation, k), &mut out), 2);
    assert!(w.is_empty());
}

#[test]
fn tombstones_are_counted_and_gone_after_one_turn() {
    let mut w = Wheel::new(Tick(0));
    let mut generation = vec![0u32; 300];
    for slot in 0..300u32 {
        // Fine, coarse and overflow deadlines.
        let due = 1 + u64::from(slot) * 97_001;
        w.schedule(key(slot, 0), Tick(due));
    }
    for slot in (0..300).step_by(2) {
        generation[slot] += 1;
        w.cancelled();
    }
    assert_eq!(w.stats().tombstones, 150);
    assert_eq!(w.live(), 150);
    let mut out = Vec::new();
    // One turn of the coarse level (and so of the fine level and overflow sweeps).
    w.advance(
        Tick(1 << 24),
        usize::MAX,
        |k| generation[k.slot as usize] == k.generation,
        &mut out,
    );
    let st = w.stats();
    assert_eq!(st.tombstones, 0);
    assert_eq!(st.entries as usize + out.len(), 150);
    assert!(out.iter().all(|f| f.key.slot % 2 == 1));
}

#[test]
fn next_due_is_a_lower_bound_that_lets_the_driver_sleep() {
    let mut w = Wheel::new(Tick(10));
    assert_eq!(w.next_due(), None);
    w.schedule(key(1, 0), Tick(17));
    assert_eq!(w.next_due(), Some(Tick(17)));
    w.schedule(key(2, 0), Tick(10 + 100_000));
    assert_eq!(w.next_due(), Some(Tick(17)));
    assert!(!fire_all(&mut w, 17).is_empty());
    let nd = w.next_due().unwrap();
    assert!(nd.0 > 17 && nd.0 <= 100_010, "{nd:?}");
    // Sleeping until the bound and stepping through bounds never misses the timer.
    let mut steps = 0;
    while let Some(nd) = w.next_due() {
        let fired = fire_all(&mut w, nd.0);
        steps += 1;
        if !fired.is_empty() {
            assert_eq!(fired[0].due, Tick(100_010));
            assert_eq!(nd, Tick(100_010));
        }
    }
    assert!(
        steps <= 3,
        "coarse window start, then the exact tick: {steps}"
    );
}

#[test]
fn the_steady_state_reuses_pooled_chunks() {
    // Every tick schedules a batch 600 ticks ahead and cancels part of an older one, like the
    // service's dwell churn; after one warm-up cycle, the chunk pool grows no more.
    // Ten-bit fine level: 1024 buckets, so the warm-up below touches every one of them.
    let mut w = Wheel::with_geometry(Tick(0), 10, 12);
    let mut generation = vec![0u32; 600 * 50];
    let mut out = Vec::new();
    let mut cycle = |w: &mut Wheel, t: u64, generation: &mut Vec<u32>| {
        out.clear();
        w.advance(
            Tick(t),
            usize::MAX,
            |k| generation[k.slot as usize] == k.generation,
            &mut out,
        );
        // The batch fired now is rescheduled; its slots hold no outstanding entry any more.
        let base = (t % 600) as u32 * 50;
        for i in 0..50 {
            let slot = base + i;
            generation[slot as usize] += 1;
            w.schedule(key(slot, generation[slot as usize]), Tick(t + 600));
        }
        // Cancel part of the batch scheduled 300 ticks ago (due in 300 ticks).
        if t > 300 {
            for i in 0..20 {
                let slot = ((t + 300) % 600) as u32 * 50 + i;
                generation[slot as usize] += 1;
                w.cancelled();
            }
        }
    };
    for t in 1..=1_300 {
        cycle(&mut w, t, &mut generation);
    }
    let bytes = w.heap_bytes();
    for t in 1_301..=3_000 {
        cycle(&mut w, t, &mut generation);
    }
    assert_eq!(w.heap_bytes(), bytes);
    assert!(w.stats().tombstones > 0, "the workload does cancel");
}

#[test]
fn crowded_buckets_keep_and_compact_across_chunks() {
    // Tiny levels (4 fine buckets, 4 coarse) and thousands of timers: buckets span many chunks
    // and hold entries of many turns, so visits keep, drop and fire within the same chains.
    for seed in 0..6u64 {
        let mut w = Wheel::with_geometry(Tick(0), 2, 2);
        let n = 3_000u32;
        let mut generation = vec![0u32; n as usize];
        let mut model: BTreeMap<(u64, u32), ()> = BTreeMap::new();
        for slot in 0..n {
            let due = 1 + (u64::from(slot) * 7_919 + seed * 31) % 400;
            w.schedule(key(slot, 0), Tick(due));
            if (u64::from(slot) + seed).is_multiple_of(3) {
                generation[slot as usize] += 1;
                w.cancelled();
            } else {
                model.insert((due, slot), ());
            }
        }
        let mut now = 0u64;
        let mut out = Vec::new();
        while now < 420 {
            // Mostly single ticks, sometimes a jump of a few turns.
            let step = if (now + seed).is_multiple_of(37) {
                1 + (now % 50)
            } else {
                1
            };
            let to = now + step;
            // Sweeps of varying budgets between advances (stopping mid-chunk, crossing chunks).
            let budget = ((now * 13 + seed * 7) % 150) as usize;
            let before = w.stats();
            let checked = w.sweep(budget, |k| generation[k.slot as usize] == k.generation);
            assert!(checked <= budget);
            let st = w.stats();
            assert_eq!(
                st.entries - st.tombstones,
                before.entries - before.tombstones
            );
            out.clear();
            w.advance(
                Tick(to),
                usize::MAX,
                |k| generation[k.slot as usize] == k.generation,
                &mut out,
            );
            for f in &out {
                assert!(f.due.0 > now && f.due.0 <= to, "{f:?} in ({now}, {to}]");
                assert!(
                    model.remove(&(f.due.0, f.key.slot)).is_some(),
                    "{f:?} twice"
                );
            }
            assert!(model.keys().next().is_none_or(|&(d, _)| d > to));
            let st = w.stats();
            assert_eq!(st.entries - st.tombstones, model.len() as u64);
            now = to;
        }
        assert!(model.is_empty());
        assert_eq!(w.stats(), WheelStats::default());
    }
}

/// The entries of bucket `idx` of level `lvl`, in chain order.
fn bucket_slots(w: &Wheel, lvl: usize, idx: usize) -> Vec<u32> {
    let b = w.levels[lvl].buckets[idx];
    let mut v = Vec::new();
    let mut c = b.head;
    while v.len() < b.len as usize {
        let chunk = &w.pool.chunks[c as usize];
        let n = (b.len as usize - v.len()).min(CHUNK);
        v.extend(chunk.entries[..n].iter().map(|e| e.slot));
        c = w.pool.next[c as usize];
    }
    v
}

#[test]
fn a_visit_compacts_kept_entries_in_order_and_frees_the_rest() {
    // Placement keeps each level within one turn, so public calls rarely keep entries; the
    // compaction is exercised directly here, with chains of several chunks.
    for (n, keep_every) in [
        (1u32, 1u32),
        (64, 2),
        (65, 64),
        (300, 3),
        (300, 1),
        (300, 301),
    ] {
        let mut w = Wheel::with_geometry(Tick(0), 3, 3);
        for slot in 0..n {
            let e = Entry::new(key(slot, 0), 5);
            w.levels[FINE].push(&mut w.pool, 5, e);
        }
        let chunks = w.pool.chunks.len();
        assert_eq!(chunks, (n as usize).div_ceil(CHUNK));
        let mut checked = 0;
        let mut is_live = |_| {
            checked += 1;
            true
        };
        let dead = w.visit(FINE, 5, &mut is_live, |_, e| {
            e.slot.is_multiple_of(keep_every)
        });
        assert_eq!(dead, 0);
        assert_eq!(checked, n);
        let expect: Vec<u32> = (0..n).filter(|s| s.is_multiple_of(keep_every)).collect();
        assert_eq!(bucket_slots(&w, FINE, 5), expect);
        let used = expect.len().div_ceil(CHUNK);
        assert_eq!(
            w.pool.free.len(),
            chunks - used,
            "n={n} keep_every={keep_every}"
        );
        assert_eq!(w.levels[FINE].occ.next_from(0).is_some(), used > 0);
        // The kept chain still takes pushes at its tail.
        w.levels[FINE].push(&mut w.pool, 5, Entry::new(key(999, 0), 5));
        assert_eq!(bucket_slots(&w, FINE, 5).last(), Some(&999));
    }
}

#[test]
fn a_sweep_takes_the_next_buckets_tombstones_out_of_the_tick() {
    let mut w = Wheel::new(Tick(0));
    let mut generation = vec![0u32; 1_000];
    // 200 entries at each of ticks 1..=5; 3 of every 4 cancelled.
    for slot in 0..1_000u32 {
        w.schedule(key(slot, 0), Tick(1 + u64::from(slot) / 200));
        if slot % 4 != 0 {
            generation[slot as usize] += 1;
            w.cancelled();
        }
    }
    let chunks = w.pool.chunks.len();
    assert_eq!(w.stats().tombstones, 750);
    let live = |g: &Vec<u32>, k: TimerKey| g[k.slot as usize] == k.generation;
    // Budget 0 does nothing; a small budget stops in the middle of tick 1's bucket and the next
    // call resumes there, without dropping anything until the bucket is finished.
    assert_eq!(w.sweep(0, |k| live(&generation, k)), 0);
    assert_eq!(w.sweep(70, |k| live(&generation, k)), 70);
    assert_eq!(w.stats().tombstones, 750);
    assert_eq!(w.sweep(130, |k| live(&generation, k)), 130);
    assert_eq!(w.stats().tombstones, 600);
    assert_eq!(w.len(), 850);
    // Tick 1's bucket now holds its 50 live entries, in order, in one chunk.
    let expect: Vec<u32> = (0..200).step_by(4).collect();
    assert_eq!(bucket_slots(&w, FINE, 1), expect);
    assert_eq!(w.pool.free.len(), 3, "emptied chunks went back to the pool");
    // Then tick 2 (in two calls, crossing into tick 3).
    assert_eq!(w.sweep(150, |k| live(&generation, k)), 150);
    assert_eq!(w.sweep(100, |k| live(&generation, k)), 100);
    assert_eq!(w.stats().tombstones, 450);
    // An entry appended to the bucket being swept is swept too, after the others.
    w.schedule(key(999, 0), Tick(3));
    generation[999] += 1;
    w.cancelled();
    // The tick of tick 1 checks only its 50 live entries.
    let mut calls = 0;
    let mut out = Vec::new();
    w.advance(
        Tick(1),
        usize::MAX,
        |k| {
            calls += 1;
            live(&generation, k)
        },
        &mut out,
    );
    assert_eq!((calls, out.len()), (50, 50));
    // The cursor is still in tick 3's bucket: it finishes it (150 + the appended one) and goes on.
    assert_eq!(w.sweep(151, |k| live(&generation, k)), 151);
    assert_eq!(w.stats().tombstones, 300);
    let fired = {
        out.clear();
        w.advance(Tick(3), usize::MAX, |k| live(&generation, k), &mut out);
        out.iter().map(|f| f.key.slot).collect::<Vec<_>>()
    };
    let expect: Vec<u32> = (200..600).step_by(4).collect();
    assert_eq!(fired, expect, "live timers fire in their order, on time");
    // A huge budget sweeps the rest of the fine level and stops.
    assert_eq!(w.sweep(usize::MAX, |k| live(&generation, k)), 400);
    assert_eq!(w.sweep(usize::MAX, |k| live(&generation, k)), 0);
    assert_eq!(w.stats().tombstones, 0);
    assert_eq!(w.len(), 100);
    out.clear();
    w.advance(Tick(10), usize::MAX, |k| live(&generation, k), &mut out);
    assert_eq!(out.len(), 100);
    assert!(w.is_empty());
    assert_eq!(w.pool.free.len(), w.pool.chunks.len());
    assert!(w.pool.chunks.len() <= chunks + 1);
}

#[test]
fn an_advance_into_a_half_swept_bucket_drops_its_dead_and_the_sweep_restarts() {
    let mut w = Wheel::new(Tick(0));
    let mut generation = vec![0u32; 300];
    for slot in 0..300u32 {
        w.schedule(key(slot, 0), Tick(1 + u64::from(slot) / 150));
        if slot % 3 != 0 {
            generation[slot as usize] += 1;
            w.cancelled();
        }
    }
    let live = |g: &Vec<u32>, k: TimerKey| g[k.slot as usize] == k.generation;
    assert_eq!(w.sweep(100, |k| live(&generation, k)), 100);
    let mut out = Vec::new();
    w.advance(Tick(1), usize::MAX, |k| live(&generation, k), &mut out);
    let expect: Vec<u32> = (0..150).step_by(3).collect();
    assert_eq!(out.iter().map(|f| f.key.slot).collect::<Vec<_>>(), expect);
    assert_eq!(w.stats().tombstones, 100);
    // Starts over at tick 2.
    assert_eq!(w.sweep(150, |k| live(&generation, k)), 150);
    assert_eq!(
        w.stats(),
        WheelStats {
            entries: 50,
            tombstones: 0,
            carry: 0
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Model test: the wheel against a BTreeMap of live timers.

#[derive(Debug, Clone)]
enum Op {
    /// (Re)schedule `slot` at `now + delta` (clamped at 0).
    Schedule { slot: u32, delta: i64 },
    /// Cancel `slot`'s outstanding timer, if any.
    Cancel { slot: u32 },
    /// Advance by `step` ticks with an optional cap.
    Advance { step: u64, cap: Option<usize> },
    /// Sweep with this budget.
    Sweep { budget: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let delta = prop_oneof![
        -5i64..=0,
        1i64..10,
        1i64..100,
        1i64..1_000,
        1i64..20_000,
        (1i64 << 24) - 10..(1i64 << 24) + 10,
        1i64..100_000_000,
    ];
    let step = prop_oneof![
        0u64..3,
        0u64..20,
        0u64..300,
        0u64..5_000,
        (1u64 << 24) - 100..(1u64 << 24) + 100,
        1_000_000u64..200_000_000,
    ];
    let cap = prop_oneof![3 => Just(None), 1 => (0usize..4).prop_map(Some)];
    // Mostly small budgets, so that sweeps stop in the middle of buckets that `advance` then
    // reaches half-swept.
    let budget = prop_oneof![
        1 => Just(0usize),
        4 => 1usize..4,
        2 => 1usize..20,
        1 => Just(usize::MAX),
    ];
    prop_oneof![
        4 => (0u32..8, delta).prop_map(|(slot, delta)| Op::Schedule { slot, delta }),
        2 => (0u32..8).prop_map(|slot| Op::Cancel { slot }),
        3 => (step, cap).prop_map(|(step, cap)| Op::Advance { step, cap }),
        3 => budget.prop_map(|budget| Op::Sweep { budget }),
    ]
}

fn geometry() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![(1u32..=4, 1u32..=4), Just((12, 12)), Just((6, 3))]
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..100,
        u64::from(u32::MAX) - 300..u64::from(u32::MAX) + 300,
        Just(1u64 << 40),
    ]
}

/// Owner records of the model test (slots `0..SLOTS`).
const SLOTS: usize = 64;

#[derive(Default, Clone, Copy)]
struct Rec {
    generation: u32,
    outstanding: Option<u64>,
}

fn run_model(geom: (u32, u32), start: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w = Wheel::with_geometry(Tick(start), geom.0, geom.1);
    let span = 1u64 << (geom.0 + geom.1);
    let mut recs = [Rec::default(); SLOTS];
    // Live timers: (due, slot) -> generation.
    let mut model: BTreeMap<(u64, u32), u32> = BTreeMap::new();
    let mut now = start;
    let mut out = Vec::new();

    let cancel =
        |recs: &mut [Rec; SLOTS], model: &mut BTreeMap<(u64, u32), u32>, w: &mut Wheel, s| {
            let r: &mut Rec = &mut recs[s as usize];
            r.generation += 1;
            if let Some(due) = r.outstanding.take() {
                model.remove(&(due, s));
                w.cancelled();
            }
        };

    // A final uncapped jump past every deadline drains the wheel.
    for op in ops.iter().cloned().chain([Op::Advance {
        step: 1 << 40,
        cap: None,
    }]) {
        match op {
            Op::Schedule { slot, delta } => {
                cancel(&mut recs, &mut model, &mut w, slot);
                let due = now.saturating_add_signed(delta);
                let r = &mut recs[slot as usize];
                r.outstanding = Some(due);
                model.insert((due, slot), r.generation);
                w.schedule(key(slot, r.generation), Tick(due));
            }
            Op::Cancel { slot } => cancel(&mut recs, &mut model, &mut w, slot),
            Op::Advance { step, cap } => {
                let nd = w.next_due();
                let st = w.stats();
                prop_assert_eq!(nd.is_none(), st.entries == 0);
                if let (Some(nd), Some((&(min_due, _), _))) = (nd, model.iter().next()) {
                    prop_assert!(nd.0 >= now);
                    prop_assert!(nd.0 <= min_due.max(now), "next_due {nd:?} after {min_due}");
                }
                let to = now + step;
                out.clear();
                let max = cap.unwrap_or(usize::MAX);
                let n = w.advance(
                    Tick(to),
                    max,
                    |k| recs[k.slot as usize].generation == k.generation,
                    &mut out,
                );
                prop_assert_eq!(n, out.len());
                prop_assert!(n <= max);
                for f in &out {
                    prop_assert!(f.due.0 <= to, "early: {f:?} at {to}");
                    let r = &mut recs[f.key.slot as usize];
                    prop_assert_eq!(r.generation, f.key.generation);
                    prop_assert_eq!(r.outstanding, Some(f.due.0));
                    prop_assert_eq!(model.remove(&(f.due.0, f.key.slot)), Some(f.key.generation));
                    r.outstanding = None;
                }
                now = to.max(now);
                prop_assert_eq!(w.now(), Tick(now));
                if n < max {
                    // Nothing due may be left behind: without a cap hit, no timer is late.
                    if let Some((&(d, _), _)) = model.iter().next() {
                        prop_assert!(d > now, "late: {d} still pending at {now}");
                    }
                }
                let st = w.stats();
                prop_assert_eq!(st.entries - st.tombstones, model.len() as u64);
                if cap.is_none() && step >= span {
                    prop_assert_eq!(st.tombstones, 0, "tombstone outlived a turn");
                }
            }
            Op::Sweep { budget } => {
                let before = w.stats();
                let mut calls = 0usize;
                let n = w.sweep(budget, |k| {
                    calls += 1;
                    recs[k.slot as usize].generation == k.generation
                });
                prop_assert_eq!(n, calls, "returns the entries it checked");
                prop_assert!(n <= budget);
                let st = w.stats();
                // Nothing fires, moves time or enters the carry queue; only dead entries go.
                prop_assert_eq!(w.now(), Tick(now));
                prop_assert_eq!(st.carry, before.carry);
                prop_assert!(st.entries <= before.entries);
                prop_assert_eq!(
                    before.entries - st.entries,
                    before.tombstones - st.tombstones,
                    "a dropped entry is a dropped tombstone"
                );
                prop_assert_eq!(st.entries - st.tombstones, model.len() as u64);
            }
        }
    }
    prop_assert!(model.is_empty());
    prop_assert_eq!(w.stats(), WheelStats::default());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_wheel_matches_a_btreemap_model(
        geom in geometry(),
        start in start(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run_model(geom, start, &ops)?;
    }

    /// Sweep-focused: many owners crowding the next few buckets, small budgets and short steps,
    /// so that `advance` often reaches buckets the sweep left half done.
    #[test]
    fn half_swept_buckets_match_the_model(
        geom in prop_oneof![(1u32..=3, 1u32..=3), Just((6, 3))],
        start in start(),
        ops in prop::collection::vec(crowded_op(), 1..200),
    ) {
        run_model(geom, start, &ops)?;
    }
}

fn crowded_op() -> impl Strategy<Value = Op> {
    let budget = prop_oneof![1usize..6, 1usize..40, Just(usize::MAX)];
    prop_oneof![
        6 => (0u32..SLOTS as u32, 1i64..6).prop_map(|(slot, delta)| Op::Schedule { slot, delta }),
        3 => (0u32..SLOTS as u32).prop_map(|slot| Op::Cancel { slot }),
        2 => (0u64..3).prop_map(|step| Op::Advance { step, cap: None }),
        3 => budget.prop_map(|budget| Op::Sweep { budget }),
    ]
}
