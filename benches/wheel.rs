//! Side-by-side benchmark of dwell-timer structures on the service's seed workload.
//!
//! `cargo bench --bench wheel [-- --pairs N --warmup S --seconds S]`. Every approach runs the
//! same workload in this one process, one after the other; see `docs/bench-wheel.md` for the
//! method. Prints a markdown table and writes `target/bench/wheel.json`.

use std::collections::{BTreeMap, BinaryHeap};
use std::hint::black_box;
use std::time::{Duration, Instant};

use geodwell_core::time::Tick;
use geodwell_core::wheel::{Fired, TimerKey, Wheel};
use serde_json::json;

#[path = "common/out.rs"]
mod benchout;

// Allocation counting: live heap bytes, so "bytes per timer" includes every Vec's slack.
#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{Counting, live_bytes};

#[global_allocator]
static ALLOC: Counting = Counting;

// ---------------------------------------------------------------------------------------------
// The workload.

/// Dwell threshold in ticks (10 min of 1 s ticks).
const DWELL: u64 = 600;
/// A cancelled visit ends 1..=CANCEL_MAX ticks after its dwell started; the mean (263 s) makes
/// steady-state churn about 12,000 schedule+cancel per second at 1.9M live pairs.
const CANCEL_MAX: u64 = 525;
const SEED: u64 = 0x6765_6f64_7765_6c6c;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A visit's plan, a pure function of (pair, tick) so that every approach gets the same one
/// whatever order its timers fire in: 8 of 9 visits end (cancel) before the dwell, 1 fires.
fn plan(pair: u32, t: u64) -> (u64, Option<u64>) {
    let h = mix((u64::from(pair) << 32) ^ t ^ SEED);
    let cancel = (!h.is_multiple_of(9)).then(|| t + 1 + (h >> 8) % CANCEL_MAX);
    (t + DWELL, cancel)
}

/// The initial population: visits already under way, due 1..=DWELL ticks from now.
fn initial_plan(pair: u32) -> (u64, Option<u64>) {
    let h = mix(u64::from(pair) ^ SEED.rotate_left(17));
    let due = 1 + (h >> 8) % DWELL;
    let cancel =
        (!h.is_multiple_of(9) && due > 1).then(|| 1 + (h >> 32) % (due - 1).min(CANCEL_MAX));
    (due, cancel)
}

// ---------------------------------------------------------------------------------------------
// The approaches. Each owns its per-pair record array (what it must remember per pair to cancel:
// a generation, a handle, a key or a due tick) so that every operation includes locating it.

trait Approach {
    /// Arms `pair`'s timer at `due` (> the last tick); the pair has none outstanding.
    fn schedule(&mut self, pair: u32, due: u64);
    /// Cancels `pair`'s outstanding timer.
    fn cancel(&mut self, pair: u32);
    /// Processes tick `now` (the previous call processed `now - 1`): appends the fired pairs.
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>);
    /// Between ticks: drops up to `budget` entries' worth of tombstones ahead of the next tick,
    /// returning the entries examined; `None` for approaches that do no such thing.
    fn sweep(&mut self, _budget: usize) -> Option<usize> {
        None
    }
}

struct Spec {
    name: &'static str,
    ours: bool,
    note: String,
}

/// geodwell's wheel: record = generation; cancel = bump + `cancelled()`; optionally a budgeted
/// `sweep` between ticks.
struct Ours {
    gens: Vec<u32>,
    wheel: Wheel,
    out: Vec<Fired>,
    sweeping: bool,
}

impl Ours {
    fn new(n: usize, sweeping: bool) -> Ours {
        Ours {
            gens: vec![0; n],
            wheel: Wheel::new(Tick(0)),
            out: Vec::new(),
            sweeping,
        }
    }
}

impl Approach for Ours {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let g = &mut self.gens[pair as usize];
        *g = g.wrapping_add(1);
        let key = TimerKey {
            slot: pair,
            generation: *g,
        };
        self.wheel.schedule(key, Tick(due));
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        let g = &mut self.gens[pair as usize];
        *g = g.wrapping_add(1);
        self.wheel.cancelled();
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        self.out.clear();
        let gens = &self.gens;
        self.wheel.advance(
            Tick(now),
            usize::MAX,
            |k| gens[k.slot as usize] == k.generation,
            &mut self.out,
        );
        fired.extend(self.out.iter().map(|f| f.key.slot));
    }
    fn sweep(&mut self, budget: usize) -> Option<usize> {
        let gens = &self.gens;
        self.sweeping.then(|| {
            self.wheel
                .sweep(budget, |k| gens[k.slot as usize] == k.generation)
        })
    }
}

/// Not a timer: touches the record like `Ours` and does nothing else. Its schedule and cancel
/// figures are the floor set by the harness loop and the random record access that every approach
/// pays; it fires nothing.
struct Floor {
    gens: Vec<u32>,
}

impl Approach for Floor {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let g = &mut self.gens[pair as usize];
        *g = g.wrapping_add(1);
        black_box(due);
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        let g = &mut self.gens[pair as usize];
        *g = g.wrapping_add(1);
    }
    fn tick(&mut self, now: u64, _fired: &mut Vec<u32>) {
        black_box(now);
    }
}

/// `BinaryHeap` min-heap of (due, pair, generation) with lazy deletion by generation.
struct Heap {
    gens: Vec<u32>,
    heap: BinaryHeap<std::cmp::Reverse<(u64, u32, u32)>>,
}

impl Approach for Heap {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let g = &mut self.gens[pair as usize];
        *g = g.wrapping_add(1);
        self.heap.push(std::cmp::Reverse((due, pair, *g)));
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        let g = &mut self.gens[pair as usize];
        *g = g.wrapping_add(1);
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        while let Some(&std::cmp::Reverse((due, pair, g))) = self.heap.peek() {
            if due > now {
                break;
            }
            self.heap.pop();
            if self.gens[pair as usize] == g {
                fired.push(pair);
            }
        }
    }
}

/// `BTreeMap<(due, pair), ()>`, eager removal; record = the due tick (to rebuild the key).
struct BTree {
    dues: Vec<u64>,
    map: BTreeMap<(u64, u32), ()>,
}

impl Approach for BTree {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        self.dues[pair as usize] = due;
        self.map.insert((due, pair), ());
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        let due = self.dues[pair as usize];
        self.map.remove(&(due, pair));
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        while let Some(e) = self.map.first_entry() {
            if e.key().0 > now {
                break;
            }
            fired.push(e.key().1);
            e.remove();
        }
    }
}

/// Hashed wheel with eager cancel: 4096 one-tick buckets of `(pair, due)` entries; record = (due,
/// position in bucket), both `u32` (a 4096-tick wheel only needs the low bits of the due tick,
/// as ours keeps only its low 32); cancel finds the entry through the record and swap-removes it.
/// The tick reads the due tick from the entry itself, so it touches no record for what fires:
/// the fired pair's record is rewritten by its next schedule anyway.
struct EagerWheel {
    recs: Vec<(u32, u32)>,
    buckets: Vec<Vec<(u32, u32)>>,
}

const EAGER_MASK: u64 = 4095;

impl Approach for EagerWheel {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let b = &mut self.buckets[(due & EAGER_MASK) as usize];
        self.recs[pair as usize] = (due as u32, b.len() as u32);
        b.push((pair, due as u32));
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        let (due, pos) = self.recs[pair as usize];
        let b = &mut self.buckets[(u64::from(due) & EAGER_MASK) as usize];
        b.swap_remove(pos as usize);
        if let Some(&(moved, _)) = b.get(pos as usize) {
            self.recs[moved as usize].1 = pos;
        }
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        let b = &mut self.buckets[(now & EAGER_MASK) as usize];
        let now32 = now as u32;
        let mut i = 0;
        while i < b.len() {
            let (pair, due) = b[i];
            // Due at or before `now` (wrapping compare: deadlines are < 2^31 ticks ahead).
            if now32.wrapping_sub(due) < 1 << 31 {
                fired.push(pair);
                b.swap_remove(i);
                if let Some(&(moved, _)) = b.get(i) {
                    self.recs[moved as usize].1 = i as u32;
                }
            } else {
                i += 1;
            }
        }
    }
}

/// `tokio_util::time::DelayQueue` (one tokio-style timer per pair) on a paused current-thread
/// runtime; record = `Option<Key>`. The tick advances tokio's clock by one second (not timed)
/// and then drains `poll_expired` (timed).
struct Tokio {
    rt: &'static tokio::runtime::Runtime,
    keys: Vec<Option<tokio_util::time::delay_queue::Key>>,
    q: tokio_util::time::DelayQueue<u32>,
    start: tokio::time::Instant,
    last_tick_ns: u64,
}

impl Approach for Tokio {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let k = self
            .q
            .insert_at(pair, self.start + Duration::from_secs(due));
        self.keys[pair as usize] = Some(k);
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        if let Some(k) = self.keys[pair as usize].take() {
            black_box(self.q.remove(&k));
        }
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        let (q, keys) = (&mut self.q, &mut self.keys);
        let target = self.start + Duration::from_secs(now);
        self.last_tick_ns = self.rt.block_on(async {
            let behind = target.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::advance(behind).await;
            let t0 = Instant::now();
            // Unconstrained: tokio's cooperative budget would otherwise stop the drain after
            // 128 entries and make the rest fire a tick late.
            tokio::task::unconstrained(std::future::poll_fn(|cx| {
                loop {
                    match q.poll_expired(cx) {
                        std::task::Poll::Ready(Some(e)) => {
                            let pair = e.into_inner();
                            keys[pair as usize] = None;
                            fired.push(pair);
                        }
                        _ => return std::task::Poll::Ready(()),
                    }
                }
            }))
            .await;
            t0.elapsed().as_nanos() as u64
        });
    }
}

/// `bitwheel` 0.6 `BitWheelWithFailover`: 2 gears of 64 slots, 1024 entries per slot, 4 probes,
/// BTreeMap failover checked every tick; a tick is mapped to 1024 ms (resolution must be a power
/// of two in ms). Record = `Option<TimerHandle>`.
struct Bit {
    handles: Vec<Option<bitwheel::timer::TimerHandle>>,
    wheel: Box<bitwheel::timer::BitWheelWithFailover<PairTimer, 2, 1024, 1024, 4, 1>>,
    epoch: Instant,
    ctx: Vec<u32>,
}

struct PairTimer(u32);

impl bitwheel::timer::Timer for PairTimer {
    type Context = Vec<u32>;
    fn fire(&mut self, ctx: &mut Vec<u32>) {
        ctx.push(self.0);
    }
}

impl Bit {
    fn at(&self, t: u64) -> Instant {
        self.epoch + Duration::from_millis(t * 1024)
    }
}

impl Approach for Bit {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let h = self.wheel.insert(self.at(due), PairTimer(pair));
        self.handles[pair as usize] = Some(h);
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        if let Some(h) = self.handles[pair as usize].take() {
            black_box(self.wheel.cancel(h));
        }
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        self.ctx.clear();
        let at = self.at(now);
        self.wheel.poll(at, &mut self.ctx);
        for &p in &self.ctx {
            self.handles[p as usize] = None;
            fired.push(p);
        }
    }
}

/// `hierarchical_hash_wheel_timer` 1.4 cancellable `QuadWheelWithOverflow`; one wheel time unit
/// per tick; timers are cancelled by id (the pair id), so there is no record array.
struct Hhwt {
    wheel: hierarchical_hash_wheel_timer::wheels::cancellable::QuadWheelWithOverflow<HEntry>,
    now: u64,
}

#[derive(Debug)]
struct HEntry {
    id: u32,
    delay: Duration,
}

impl hierarchical_hash_wheel_timer::wheels::cancellable::CancellableTimerEntry for HEntry {
    type Id = u32;
    fn id(&self) -> &u32 {
        &self.id
    }
}

impl hierarchical_hash_wheel_timer::wheels::TimerEntryWithDelay for HEntry {
    fn delay(&self) -> Duration {
        self.delay
    }
}

impl Approach for Hhwt {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let delay = Duration::from_millis(due - self.now);
        let r = self.wheel.insert(HEntry { id: pair, delay });
        debug_assert!(r.is_ok());
        black_box(r.is_ok());
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        black_box(self.wheel.cancel(&pair).is_ok());
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        while self.now < now {
            self.now += 1;
            for e in self.wheel.tick() {
                fired.push(e.id);
            }
        }
    }
}

/// `nexus-timer` 1.5 `Wheel` (1 s ticks, defaults otherwise), `poll_and_rebalance`;
/// record = `Option<TimerHandle>`, freed on fire.
struct Nexus {
    handles: Vec<Option<nexus_timer::TimerHandle<u32>>>,
    wheel: nexus_timer::Wheel<u32>,
    epoch: Instant,
    buf: Vec<u32>,
}

impl Approach for Nexus {
    #[inline]
    fn schedule(&mut self, pair: u32, due: u64) {
        let h = self
            .wheel
            .schedule(self.epoch + Duration::from_secs(due), pair);
        self.handles[pair as usize] = Some(h);
    }
    #[inline]
    fn cancel(&mut self, pair: u32) {
        if let Some(h) = self.handles[pair as usize].take() {
            black_box(self.wheel.cancel(h));
        }
    }
    fn tick(&mut self, now: u64, fired: &mut Vec<u32>) {
        self.buf.clear();
        let at = self.epoch + Duration::from_secs(now);
        self.wheel.poll_and_rebalance(at, &mut self.buf);
        for &p in &self.buf {
            if let Some(h) = self.handles[p as usize].take() {
                self.wheel.free(h);
            }
            fired.push(p);
        }
    }
}

impl Drop for Nexus {
    fn drop(&mut self) {
        // Handles must be handed back before the wheel goes.
        for h in self.handles.iter_mut().filter_map(Option::take) {
            self.wheel.free(h);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The driver: identical for every approach.

struct Args {
    pairs: u32,
    warmup: u64,
    seconds: u64,
    only: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        pairs: 1_900_000,
        warmup: 600,
        seconds: 1_200,
        only: None,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = v.get(i + 1).cloned();
        match (v[i].as_str(), next) {
            ("--pairs", Some(n)) => a.pairs = n.parse().expect("--pairs N"),
            ("--warmup", Some(n)) => a.warmup = n.parse().expect("--warmup S"),
            ("--seconds", Some(n)) => a.seconds = n.parse().expect("--seconds S"),
            ("--only", Some(n)) => a.only = Some(n),
            // Anything else (e.g. `--bench`, which cargo passes) is ignored.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

#[derive(Default)]
struct Row {
    name: String,
    ours: bool,
    note: String,
    load_ns: f64,
    schedule_ns: f64,
    cancel_ns: f64,
    expire_ns: f64,
    bytes: f64,
    bytes_after: f64,
    ticks: Vec<u64>,
    /// Whether the approach swept between ticks; then the time of each sweep call (measured
    /// window), their total, and the entries they examined.
    sweeping: bool,
    sweep_calls: Vec<u64>,
    sweep_ns: u128,
    swept: u64,
    fires: u64,
    cancels: u64,
    schedules: u64,
    early: u64,
    late: u64,
}

impl Row {
    fn pct(&self, p: f64) -> f64 {
        pct_us(&self.ticks, p)
    }
    /// Sweep time per simulated second, µs (NaN without sweeping).
    fn sweep_us_per_s(&self, seconds: u64) -> f64 {
        if self.sweeping {
            self.sweep_ns as f64 / seconds as f64 / 1000.0
        } else {
            f64::NAN
        }
    }
    fn cost_per_fire(&self) -> f64 {
        9.0 * self.schedule_ns + 8.0 * self.cancel_ns + self.expire_ns
    }
}

/// Percentile `p` of nanosecond samples, in µs (NaN if none).
fn pct_us(samples: &[u64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut t = samples.to_vec();
    t.sort_unstable();
    let i = ((t.len() as f64 * p).ceil() as usize).clamp(1, t.len()) - 1;
    t[i] as f64 / 1000.0
}

/// Sweep calls per simulated second, for approaches that sweep: the second's budget (the number
/// of timers ever scheduled for the next tick, i.e. what that tick's bucket holds, live or dead;
/// the driver counts its own schedules per due tick) is split into this many calls.
const SWEEP_SLICES: usize = 8;

/// Runs the workload against `make()`'s approach. `tick_ns` lets an approach report its own tick
/// time (tokio: excluding the clock advance); otherwise the tick call is timed here.
fn run<A: Approach>(
    a: &Args,
    spec: Spec,
    make: impl FnOnce(usize) -> A,
    tick_ns: impl Fn(&A) -> Option<u64>,
) -> Row {
    let n = a.pairs as usize;
    let mut row = Row {
        name: spec.name.to_string(),
        ours: spec.ours,
        note: spec.note,
        ..Row::default()
    };
    // Harness state (not timed): each pair's current due tick and visit number, and the cancel
    // plan as a ring of per-tick lists of (pair, visit).
    let mut due_of = vec![0u64; n];
    let mut visit = vec![0u32; n];
    let mut ring: Vec<Vec<(u32, u32)>> = (0..DWELL).map(|_| Vec::new()).collect();
    let mut batch: Vec<(u32, u64)> = Vec::with_capacity(n);
    let mut cancels: Vec<u32> = Vec::new();
    let mut fired: Vec<u32> = Vec::new();
    // Timers scheduled per due tick (ring by due % DWELL): the next tick's work, to size sweeps.
    let mut due_count = vec![0usize; DWELL as usize];
    for p in 0..a.pairs {
        let (due, cancel) = initial_plan(p);
        due_count[(due % DWELL) as usize] += 1;
        due_of[p as usize] = due;
        if let Some(c) = cancel {
            ring[(c % DWELL) as usize].push((p, 0));
        }
        batch.push((p, due));
    }

    // The harness's own buffers grow during the churn; their growth is subtracted below.
    row.ticks.reserve(a.seconds as usize);
    row.sweep_calls.reserve(a.seconds as usize * SWEEP_SLICES);
    let harness = |ring: &Vec<Vec<(u32, u32)>>, b: &Vec<(u32, u64)>, c: &Vec<u32>, f: &Vec<u32>| {
        (ring.iter().map(Vec::capacity).sum::<usize>() * 8
            + b.capacity() * 16
            + c.capacity() * 4
            + f.capacity() * 4) as isize
    };
    let before = live_bytes();
    let harness_before = harness(&ring, &batch, &cancels, &fired);
    let mut ap = make(n);
    let t0 = Instant::now();
    for &(p, due) in &batch {
        ap.schedule(p, due);
    }
    row.load_ns = t0.elapsed().as_nanos() as f64 / n as f64;
    row.bytes = (live_bytes() - before) as f64 / n as f64;

    let (mut sched_ns, mut cancel_ns, mut tick_total) = (0u128, 0u128, 0u128);
    let end = a.warmup + a.seconds;
    for t in 1..=end {
        let measured = t > a.warmup;
        // Visits that end this second: cancel, then start the next visit of the same pair.
        cancels.clear();
        batch.clear();
        for (p, v) in ring[(t % DWELL) as usize].drain(..) {
            // A timer that already fired (early, in an imprecise approach) has a newer visit.
            if visit[p as usize] == v {
                cancels.push(p);
            }
        }
        let c0 = Instant::now();
        for &p in &cancels {
            ap.cancel(p);
        }
        let c1 = c0.elapsed().as_nanos();

        // The tick.
        fired.clear();
        let k0 = Instant::now();
        ap.tick(t, &mut fired);
        let k1 = tick_ns(&ap).unwrap_or_else(|| k0.elapsed().as_nanos() as u64);

        for &p in &fired {
            let d = due_of[p as usize];
            if d > t {
                row.early += 1;
            } else if d < t {
                row.late += 1;
            }
        }
        // Next visits for the cancelled and the fired pairs.
        due_count[(t % DWELL) as usize] = 0;
        for &p in cancels.iter().chain(fired.iter()) {
            let v = visit[p as usize].wrapping_add(1);
            visit[p as usize] = v;
            let (due, cancel) = plan(p, t);
            due_of[p as usize] = due;
            due_count[(due % DWELL) as usize] += 1;
            if let Some(c) = cancel {
                ring[(c % DWELL) as usize].push((p, v));
            }
            batch.push((p, due));
        }
        let s0 = Instant::now();
        for &(p, due) in &batch {
            ap.schedule(p, due);
        }
        let s1 = s0.elapsed().as_nanos();

        // Between ticks (sweeping approaches only): drop the next tick's tombstones in slices.
        let slice = due_count[((t + 1) % DWELL) as usize].div_ceil(SWEEP_SLICES);
        for _ in 0..SWEEP_SLICES {
            let w0 = Instant::now();
            let Some(n) = ap.sweep(slice) else {
                break;
            };
            let w1 = w0.elapsed().as_nanos();
            row.sweeping = true;
            if measured {
                row.sweep_calls.push(w1 as u64);
                row.sweep_ns += w1;
                row.swept += n as u64;
            }
        }

        if measured {
            cancel_ns += c1;
            sched_ns += s1;
            tick_total += u128::from(k1);
            row.ticks.push(k1);
            row.fires += fired.len() as u64;
            row.cancels += cancels.len() as u64;
            row.schedules += batch.len() as u64;
        }
    }
    row.schedule_ns = sched_ns as f64 / row.schedules.max(1) as f64;
    row.cancel_ns = cancel_ns as f64 / row.cancels.max(1) as f64;
    if row.fires == 0 {
        // Nothing fired (the floor reference): tick and expire figures would mean nothing.
        row.expire_ns = f64::NAN;
        row.ticks.clear();
    } else {
        // Sweeping moves tick work between ticks: it is counted here too.
        row.expire_ns = (tick_total + row.sweep_ns) as f64 / row.fires as f64;
    }
    let harness_growth = harness(&ring, &batch, &cancels, &fired) - harness_before;
    row.bytes_after = (live_bytes() - before - harness_growth) as f64 / n as f64;
    drop(black_box(ap));
    eprintln!(
        "{:<34} done: {} fires, {} cancels, {} schedules in {} s; early {} late {}",
        row.name, row.fires, row.cancels, row.schedules, a.seconds, row.early, row.late
    );
    row
}

fn main() {
    let a = args();
    let want = |name: &str| a.only.as_deref().is_none_or(|o| name.contains(o));
    eprintln!(
        "wheel bench: {} pairs, dwell {DWELL} ticks, warm-up {} s, measured {} s",
        a.pairs, a.warmup, a.seconds
    );
    let mut rows = Vec::new();

    if want("geodwell") {
        rows.push(run(
            &a,
            Spec {
                name: "geodwell Wheel (ours, no sweep)",
                ours: true,
                note: "record: u32 generation; cancel = bump + cancelled(); no fire cap".into(),
            },
            |n| Ours::new(n, false),
            |_| None,
        ));
        rows.push(run(
            &a,
            Spec {
                name: "geodwell Wheel (ours, sweep between ticks)",
                ours: true,
                note: format!(
                    "as above, plus after each second's schedules {SWEEP_SLICES} sweep() calls sharing a budget of the next tick's timer count (live and dead); expire includes the sweep time"
                ),
            },
            |n| Ours::new(n, true),
            |_| None,
        ));
    }
    if want("floor") {
        rows.push(run(
            &a,
            Spec {
                name: "floor: record access only",
                ours: false,
                note:
                    "no timer at all: the u32 record bump alone, same loop; a reference, not a peer"
                        .into(),
            },
            |n| Floor { gens: vec![0; n] },
            |_| None,
        ));
    }
    if want("BinaryHeap") {
        rows.push(run(
            &a,
            Spec {
                name: "BinaryHeap, lazy deletion",
                ours: false,
                note: "record: u32 generation; dead entries stay until their due tick".into(),
            },
            |n| Heap {
                gens: vec![0; n],
                heap: BinaryHeap::new(),
            },
            |_| None,
        ));
    }
    if want("BTreeMap") {
        rows.push(run(
            &a,
            Spec {
                name: "BTreeMap, eager removal",
                ours: false,
                note: "record: u64 due".into(),
            },
            |n| BTree {
                dues: vec![0; n],
                map: BTreeMap::new(),
            },
            |_| None,
        ));
    }
    if want("eager") {
        rows.push(run(
            &a,
            Spec {
                name: "hashed wheel, eager cancel",
                ours: false,
                note: "record: (u32 due, u32 position); entries (pair, u32 due); cancel = swap_remove in bucket".into(),
            },
            |n| EagerWheel {
                recs: vec![(0, 0); n],
                buckets: (0..=EAGER_MASK).map(|_| Vec::new()).collect(),
            },
            |_| None,
        ));
    }
    if want("DelayQueue") {
        let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("tokio runtime"),
        ));
        let _guard = rt.enter();
        rows.push(run(
            &a,
            Spec {
                name: "tokio-util DelayQueue",
                ours: false,
                note: format!(
                    "record: Option<Key> ({} B); paused clock, tick = drain poll_expired (clock advance not timed)",
                    std::mem::size_of::<Option<tokio_util::time::delay_queue::Key>>()
                ),
            },
            |n| Tokio {
                rt,
                keys: vec![None; n],
                q: tokio_util::time::DelayQueue::new(),
                start: tokio::time::Instant::now(),
                last_tick_ns: 0,
            },
            |t: &Tokio| Some(t.last_tick_ns),
        ));
    }
    if want("bitwheel") {
        rows.push(run(
            &a,
            Spec {
                name: "bitwheel 0.6 (with failover)",
                ours: false,
                note: format!(
                    "record: Option<TimerHandle> ({} B); fixed slot capacity (2 gears x 64 slots x 1024): the rest goes to its BTreeMap failover; gear-1 timers fire at 64-tick slot granularity, i.e. early",
                    std::mem::size_of::<Option<bitwheel::timer::TimerHandle>>()
                ),
            },
            |n| {
                let mut handles = Vec::with_capacity(n);
                handles.resize_with(n, || None);
                let epoch = Instant::now();
                Bit {
                    handles,
                    wheel: bitwheel::timer::BitWheelWithFailover::boxed_with_epoch(epoch),
                    epoch,
                    ctx: Vec::new(),
                }
            },
            |_| None,
        ));
    }
    if want("hierarchical") {
        rows.push(run(
            &a,
            Spec {
                name: "hierarchical_hash_wheel_timer 1.4",
                ours: false,
                note: "cancellable QuadWheelWithOverflow: Rc per timer + FxHashMap by id (no record); tick() returns a fresh Vec".into(),
            },
            |_| Hhwt {
                wheel: Default::default(),
                now: 0,
            },
            |_| None,
        ));
    }
    if want("nexus") {
        rows.push(run(
            &a,
            Spec {
                name: "nexus-timer 1.5 Wheel",
                ours: false,
                note: format!(
                    "record: Option<TimerHandle> ({} B); poll_and_rebalance; fired handles freed in the tick",
                    std::mem::size_of::<Option<nexus_timer::TimerHandle<u32>>>()
                ),
            },
            |n| {
                let mut handles = Vec::with_capacity(n);
                handles.resize_with(n, || None);
                let epoch = Instant::now();
                Nexus {
                    handles,
                    wheel: nexus_timer::WheelBuilder::default()
                        .tick_duration(Duration::from_secs(1))
                        .unbounded(4096)
                        .build(epoch)
                        .expect("nexus wheel"),
                    epoch,
                    buf: Vec::new(),
                }
            },
            |_| None,
        ));
    }

    report(&a, &rows);
}

fn report(a: &Args, rows: &[Row]) {
    println!(
        "\n{} live pairs, dwell {DWELL} ticks of 1 s, {} s measured after {} s warm-up\n",
        a.pairs, a.seconds, a.warmup
    );
    println!(
        "| approach | schedule ns/op | cancel ns/op | expire ns/entry | bytes/timer (loaded) | bytes/timer (after churn) | tick p50 µs | p99 µs | p99.9 µs | max µs | sweep µs/s | sweep call p99.9 µs | cost/fire ns | early/late fires |"
    );
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {}/{} |",
            if r.ours {
                format!("**{}**", r.name)
            } else {
                r.name.clone()
            },
            r.schedule_ns,
            r.cancel_ns,
            r.expire_ns,
            r.bytes,
            r.bytes_after,
            r.pct(0.50),
            r.pct(0.99),
            r.pct(0.999),
            r.ticks
                .iter()
                .max()
                .map_or(f64::NAN, |&m| m as f64 / 1000.0),
            r.sweep_us_per_s(a.seconds),
            pct_us(&r.sweep_calls, 0.999),
            r.cost_per_fire(),
            r.early,
            r.late,
        );
    }
    println!();
    for r in rows {
        println!(
            "- {}: {} (load: {:.1} ns/schedule; measured window: {} schedules, {} cancels, {} fires)",
            r.name, r.note, r.load_ns, r.schedules, r.cancels, r.fires
        );
        if r.sweeping {
            println!(
                "  sweep: {} calls, {} entries examined ({:.0}/s), {:.1} µs/s; per call p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs",
                r.sweep_calls.len(),
                r.swept,
                r.swept as f64 / a.seconds as f64,
                r.sweep_us_per_s(a.seconds),
                pct_us(&r.sweep_calls, 0.50),
                pct_us(&r.sweep_calls, 0.99),
                pct_us(&r.sweep_calls, 0.999),
                r.sweep_calls
                    .iter()
                    .max()
                    .map_or(f64::NAN, |&m| m as f64 / 1000.0),
            );
        }
    }
    for ours in rows.iter().filter(|r| r.ours) {
        let best = rows
            .iter()
            .filter(|r| !r.ours && !r.name.starts_with("floor"))
            .min_by(|x, y| x.cost_per_fire().total_cmp(&y.cost_per_fire()));
        println!(
            "\ncost per fire (9 schedules + 8 cancels + 1 expire): {} {:.0} ns",
            ours.name,
            ours.cost_per_fire()
        );
        if let Some(b) = best {
            println!(
                "best peer: {} at {:.0} ns -> ratio {:.2}x",
                b.name,
                b.cost_per_fire(),
                b.cost_per_fire() / ours.cost_per_fire()
            );
        }
        println!(
            "goals: schedule <= 20 ns: {:.1} | cancel <= 5 ns: {:.1} | <= 24 B/timer: {:.1} | tick p99.9 <= 50 µs: {:.1}",
            ours.schedule_ns,
            ours.cancel_ns,
            ours.bytes,
            ours.pct(0.999)
        );
    }

    let json: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "ours": r.ours,
                "schedule_ns": r.schedule_ns,
                "cancel_ns": r.cancel_ns,
                "expire_ns": r.expire_ns,
                "bytes_per_timer": r.bytes,
                "tick_p50_us": r.pct(0.50),
                "tick_p99_us": r.pct(0.99),
                "tick_p999_us": r.pct(0.999),
                "tick_max_us": r.ticks.iter().max().map(|&m| m as f64 / 1000.0),
                "sweep_us_per_s": r.sweeping.then(|| r.sweep_us_per_s(a.seconds)),
                "sweep_call_p999_us": r.sweeping.then(|| pct_us(&r.sweep_calls, 0.999)),
                "sweep_calls": r.sweep_calls.len(),
                "swept_entries": r.swept,
                "bytes_per_timer_after_churn": r.bytes_after,
                "cost_per_fire_ns": r.cost_per_fire(),
                "early_fires": r.early,
                "late_fires": r.late,
                "pairs": a.pairs,
                "note": r.note,
            })
        })
        .collect();
    let path = benchout::write_json("wheel", &json).expect("write target/bench/wheel.json");
    eprintln!("wrote {}", path.display());
}
