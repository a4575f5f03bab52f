//! The one partition task: drives a [`Driver`] with a [`Backend`] until the backend stops it.
//!
//! Each turn: work off one slice of carried timers (yielding after it); between ticks, sweep a
//! slice of cancelled timers; wait for the next piece of work or the clock (biased: work first,
//! so a record stamped under an older watermark is applied before the engine moves past it);
//! do it; bring the engine up to the clock's watermark ([`Backend::tick`]); hand on what was
//! produced; every [`IDLE_EVERY`] look for idle devices.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::gauge;
use tokio::sync::watch;

use super::{AppliedStep, Backend, CheckpointStorage, Ownership, Stop, Work};
use crate::clock::{ClockMode, Watermark};
use crate::telemetry as t;
use geodwell_core::engine::IdleRule;
use geodwell_core::partition::Driver;
use geodwell_core::time::Ts;

/// Wheel entries examined by one between-tick sweep (tens of microseconds).
const SWEEP_BUDGET: usize = 4096;
/// Device slots one idle sweep looks at (tens of microseconds).
const IDLE_SCAN: usize = 8192;
/// How often a partition looks for idle devices.
pub const IDLE_EVERY: Duration = Duration::from_millis(100);
/// Devices handed to the checkpoint storage per chunk.
pub const CHECKPOINT_CHUNK: usize = 2048;
/// How often the backend's upkeep runs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_millis(500);
/// Carried slices in a row after which the task warns (once per run of slices).
const CARRIED_WARN: u32 = 100;

/// What every partition task is given besides its backend.
#[derive(Debug, Clone)]
pub struct PartitionCtx {
    /// The partition's number (its metric label).
    pub partition: usize,
    /// The node's watermark: its mode, lateness and wall clock.
    pub watermark: Arc<Watermark>,
    /// `devices.idle_ttl` (or tombstones only): look for idle devices (`None`: never).
    pub idle: Option<IdleRule>,
}

/// The clock a partition follows: the wall clock minus the lateness (`live`), or the node's
/// published watermark (`event`).
struct Clock {
    watermark: Arc<Watermark>,
    event_w: watch::Receiver<Option<Ts>>,
}

impl Clock {
    fn mode(&self) -> ClockMode {
        self.watermark.mode()
    }

    /// The watermark now.
    fn now(&mut self) -> Option<Ts> {
        match self.mode() {
            ClockMode::Live => Some(self.watermark.wall().now().minus(self.watermark.lateness())),
            ClockMode::Event => *self.event_w.borrow_and_update(),
        }
    }

    /// When the driver's next deadline is due on the wall clock (`live`; `event` moves with the
    /// published watermark instead).
    fn wake_at(&self, driver: &Driver) -> Option<Instant> {
        match self.mode() {
            ClockMode::Live => driver.next_due().map(|t| {
                self.watermark
                    .wall()
                    .instant_at(t.plus(self.watermark.lateness()))
            }),
            ClockMode::Event => None,
        }
    }
}

/// Runs a partition until its backend stops it; returns what the backend reports.
pub async fn run<B: Backend>(mut driver: Driver, mut backend: B, ctx: PartitionCtx) -> B::Ended {
    let label = ctx.partition.to_string();
    let gauges = Gauges::new(&label);
    let mut clock = Clock {
        event_w: ctx.watermark.subscribe(),
        watermark: ctx.watermark.clone(),
    };
    let mut idle_swept = Instant::now();
    let mut housekept = Instant::now();
    // Deadlines that passed while the partition was not running are due now.
    if let Some(w) = clock.now() {
        backend.tick(&mut driver, w).await;
    }
    let stop = loop {
        if !backend.flush(&mut driver).await {
            break Stop::Lost;
        }
        gauges.report(&driver);
        if driver.carried() > 0 {
            work_off(&mut driver, &label);
            if !backend.flush(&mut driver).await {
                break Stop::Lost;
            }
            tokio::task::yield_now().await;
        }
        let wake = clock.wake_at(&driver);
        if driver.carried() == 0
            && wake.is_some_and(|w| w > Instant::now() + Duration::from_millis(5))
        {
            driver.sweep(SWEEP_BUDGET);
        }
        let work = next(&mut backend, &driver, &mut clock, wake).await;
        if let Some(stop) = act(&mut backend, &mut driver, work).await {
            break stop;
        }
        if let Some(w) = clock.now() {
            backend.tick(&mut driver, w).await;
            if let Some(ew) = driver.watermark() {
                gauges
                    .watermark_lag
                    .set(ctx.watermark.wall().now().since(ew).as_secs_f64().max(0.0));
            }
        }
        if let Some(rule) = ctx.idle
            && idle_swept.elapsed() >= IDLE_EVERY
        {
            idle_swept = Instant::now();
            if let Some(r) = driver.idle_removal(rule, IDLE_SCAN) {
                backend
                    .append(&driver, geodwell_core::partition::Input::Removed(r))
                    .await;
            }
        }
        if housekept.elapsed() >= HOUSEKEEPING_EVERY {
            housekept = Instant::now();
            backend.housekeeping(&driver).await;
        }
    };
    gauges.report(&driver);
    backend.finish(driver, stop).await
}

/// The next piece of work, or the clock's turn.
async fn next<B: Backend>(
    backend: &mut B,
    driver: &Driver,
    clock: &mut Clock,
    wake: Option<Instant>,
) -> Work<B::Ticket> {
    let carried = driver.carried() > 0;
    let event = clock.mode() == ClockMode::Event;
    let owner = backend.owner();
    tokio::select! {
        biased;
        () = owner.gone() => Work::Stop(Stop::Lost),
        w = backend.next(driver) => w,
        changed = clock.event_w.changed(), if event && !carried => match changed {
            Ok(()) => Work::Wake,
            Err(_) => Work::Stop(Stop::Asked),
        },
        _ = sleep_until(wake), if wake.is_some() && !carried => Work::Wake,
        // Carried timers are worked off at the top of the next turn, after what is ready now.
        () = std::future::ready(()), if carried => Work::Wake,
    }
}

/// Does one piece of work; `Some` when the partition stops.
async fn act<B: Backend>(
    backend: &mut B,
    driver: &mut Driver,
    work: Work<B::Ticket>,
) -> Option<Stop> {
    match work {
        Work::Record {
            pos,
            input,
            arrival,
            ticket,
        } => {
            let taken = Instant::now();
            let w_before = driver.watermark();
            let applied = match driver.apply(pos, &input, arrival, backend.fences()) {
                Ok(a) => a,
                Err(missing) => return Some(Stop::Failed(missing)),
            };
            let step = AppliedStep {
                pos,
                input: &input,
                w_before,
                applied,
                ticket,
                taken,
            };
            (!backend.applied(driver, step).await).then_some(Stop::Lost)
        }
        Work::Query(q) => {
            q(driver.engine());
            None
        }
        Work::Checkpoint { full } => {
            let f = driver.freeze(full);
            backend.checkpoints().frozen(f);
            None
        }
        Work::CheckpointRoom => {
            if let Some(f) = driver.frozen().cloned() {
                let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
                let done = driver.checkpoint_chunk(CHECKPOINT_CHUNK, &mut devices);
                backend.checkpoints().chunk(f, devices, done);
                // Let the tasks sharing this worker thread run between chunks: storage with room
                // takes chunk after chunk, and tokio's budget covers a whole freeze.
                tokio::task::yield_now().await;
            }
            None
        }
        Work::Wake => None,
        Work::Reset(d) => {
            *driver = *d;
            None
        }
        Work::Stop(s) => Some(s),
    }
}

/// Works off one slice of carried timers, warning when they have been carried for long.
fn work_off(driver: &mut Driver, label: &str) {
    let started = Instant::now();
    driver.work_off();
    metrics::histogram!(t::WHEEL_TICK_SECONDS).record(started.elapsed().as_secs_f64());
    if driver.carried() == CARRIED_WARN {
        tracing::warn!(
            partition = label,
            fire_cap = driver.engine().config().max_fires_per_advance,
            "due timers have been carried over 100 slices: a large watermark jump, or a fire cap (time.max_fires_per_tick) too low for the load"
        );
    }
}

/// Sleeps until `at`; for ever when there is none (a `select!` arm disabled by its guard).
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The partition's gauges.
/// A partition's gauges, looked up once: setting one is then a store, where a lookup by name and
/// label costs an allocation and a registry search at every turn of the loop.
struct Gauges {
    pairs: metrics::Gauge,
    devices: metrics::Gauge,
    buffered: metrics::Gauge,
    timers: metrics::Gauge,
    tombstones: metrics::Gauge,
    carry: metrics::Gauge,
    watermark_lag: metrics::Gauge,
}

impl Gauges {
    fn new(label: &str) -> Gauges {
        let g = |name: &'static str| gauge!(name, "shard" => label.to_string());
        Gauges {
            pairs: g(t::PAIRS_LIVE),
            devices: g(t::DEVICES),
            buffered: g(t::FIXES_BUFFERED),
            timers: g(t::WHEEL_TIMERS_LIVE),
            tombstones: g(t::WHEEL_TOMBSTONES),
            carry: g(t::WHEEL_CARRY),
            watermark_lag: g(t::WATERMARK_LAG_SECONDS),
        }
    }

    fn report(&self, driver: &Driver) {
        let s = driver.engine().stats();
        self.pairs.set(s.pairs as f64);
        self.devices.set(s.devices as f64);
        self.buffered.set(s.buffered as f64);
        self.timers
            .set(s.wheel.entries.saturating_sub(s.wheel.tombstones) as f64);
        self.tombstones.set(s.wheel.tombstones as f64);
        self.carry.set(s.wheel.carry as f64);
    }
}
