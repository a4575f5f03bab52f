//! One engine shard: a tokio task that owns an [`Engine`] (its devices, pairs and timer wheel).
//!
//! Invariants: the task is the only code that touches its engine; every step (a batch, a fence
//! change, a watermark advance) ends in one publisher step carrying its events, its changed
//! device state and its waiting reply, so nothing a step did is visible before it is durable.
//!
//! The task `select!`s (biased, in this order) over: shutdown, its bounded message channel, and the
//! watermark: in `live` mode a `sleep_until` the wheel's next due time, computed as a monotonic
//! [`Instant`] from one (wall, monotonic) origin taken at start so that sleeps never drift; in
//! `event` mode a `watch` of the data-driven watermark. Messages are handled before watermark
//! changes, so a batch stamped with an older watermark is never judged against a newer one.
//! Nothing here takes a lock on the hot path; events go to the shared [`EventLog`] once per step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{gauge, histogram};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::{FixOutcome, ShardMsg, Shards};
use crate::clock::Watermark;
use crate::config::ClockMode;
use crate::events::publisher::{Publisher, Step, StepReply};
use crate::telemetry as t;
use geodwell_core::engine::Engine;
use geodwell_core::event::Event;
use geodwell_core::time::Ts;

/// What every shard task shares: the watermark, the publisher, persistence and shutdown.
#[derive(Debug, Clone)]
pub struct ShardCtx {
    /// The service's watermark (mode, lateness, wall clock, the published event watermark).
    pub watermark: Arc<Watermark>,
    /// Where steps go to be committed and published.
    pub publisher: Publisher,
    /// Whether device state is persisted (a store is configured).
    pub persist: bool,
    /// Cancelled at shutdown, once ingest has stopped: the shards then drain their queues.
    pub shutdown: CancellationToken,
    /// Batches queued per shard.
    pub queue: usize,
}

/// One task's own view of the context.
struct Ctx {
    id: usize,
    clock: ClockMode,
    shared: ShardCtx,
    event_w: watch::Receiver<Option<Ts>>,
}

/// Starts one task per engine (shard `k` owns `engines[k]`) and returns the handle to them and
/// the tasks, which end after a drain once `ctx.shutdown` is cancelled.
pub fn spawn(engines: Vec<Engine>, ctx: ShardCtx) -> (Shards, Vec<tokio::task::JoinHandle<()>>) {
    let mut senders = Vec::with_capacity(engines.len());
    let mut tasks = Vec::with_capacity(engines.len());
    for (id, engine) in engines.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(ctx.queue.max(1));
        let task_ctx = Ctx {
            id,
            clock: ctx.watermark.mode(),
            event_w: ctx.watermark.subscribe(),
            shared: ctx.clone(),
        };
        senders.push(tx);
        tasks.push(tokio::spawn(run(engine, rx, task_ctx)));
    }
    (
        Shards {
            senders: senders.into(),
        },
        tasks,
    )
}

/// Wheel entries examined by one between-tick sweep (tens of microseconds).
const SWEEP_BUDGET: usize = 4096;

/// A reply waiting for its step to be durable.
struct Waiting {
    reply: oneshot::Sender<StepReply>,
    outcomes: Vec<FixOutcome>,
    arrived: Instant,
    request: (u64, u32),
    max_ts: Option<Ts>,
}

/// Runs a shard until shutdown; drains queued messages before returning.
async fn run(mut engine: Engine, mut rx: mpsc::Receiver<ShardMsg>, mut ctx: Ctx) {
    let label = ctx.id.to_string();
    let mut out: Vec<Event> = Vec::new();
    let mut carried_ticks = 0u32;
    // Warm start: deadlines that passed while the process was down are due now.
    let w0 = match ctx.clock {
        ClockMode::Live => Some(live_w(&ctx)),
        ClockMode::Event => *ctx.event_w.borrow_and_update(),
    };
    if let Some(w) = w0 {
        engine.advance(w, &mut out);
        if !publish(&ctx, &mut engine, &mut out, None).await {
            return;
        }
    }
    report(&engine, &label);
    loop {
        let wake = match ctx.clock {
            ClockMode::Live => engine.next_due().map(|t| {
                let at = ctx
                    .shared
                    .watermark
                    .wall()
                    .instant_at(t.plus(ctx.shared.watermark.lateness()));
                if carried_ticks > 0 {
                    Instant::now()
                } else {
                    at
                }
            }),
            ClockMode::Event => (carried_ticks > 0).then(Instant::now),
        };
        // Idle until the next tick: drop cancelled timers ahead of the wheel in a small slice, so
        // that the tick itself meets live entries (bounded pause; the same total work).
        if wake.is_some_and(|w| w > Instant::now() + Duration::from_millis(5))
            && engine.stats().wheel.tombstones > 0
        {
            engine.sweep(SWEEP_BUDGET);
        }
        let mut waiting: Option<Waiting> = None;
        // One step: the message (if any) and the advance after it fire at most the fire cap
        // together, so a watermark jump over a mass of due work is worked off in slices with
        // new input taken between them.
        engine.begin_step();
        tokio::select! {
            biased;
            _ = ctx.shared.shutdown.cancelled() => break,
            msg = rx.recv() => match msg {
                Some(msg) => waiting = handle(&mut engine, msg, &mut out),
                None => break,
            },
            changed = ctx.event_w.changed(), if ctx.clock == ClockMode::Event => {
                if changed.is_err() {
                    break;
                }
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now).into()), if wake.is_some() => {}
        }
        // After any step, bring the engine up to the current watermark. In event mode, batches
        // already queued here were stamped before the published watermark moved on (a batch is
        // sent before its stamp is published): apply them first, or their fixes would look late.
        // A busy shard still advances, by each fix's own stamp.
        //
        // The order of the two reads matters: the watermark first, then the queue. A published
        // stamp implies its batch was sent before, so once the stamp is seen, that batch is either
        // in the queue (seen by `is_empty`) or already applied. Looking at the queue first left a
        // window (queue empty; the batch arrives and its stamp is published; stamp read) in which
        // a shard moved past fixes it had not received yet: they were judged late (seen in CI,
        // under load, as 110 late fixes of 20,000 sent in order).
        let w = match ctx.clock {
            ClockMode::Live => Some(live_w(&ctx)),
            ClockMode::Event => {
                let w = *ctx.event_w.borrow_and_update();
                if rx.is_empty() { w } else { None }
            }
        };
        if let Some(w) = w {
            let started = Instant::now();
            let adv = engine.advance(w, &mut out);
            histogram!(t::WHEEL_TICK_SECONDS).record(started.elapsed().as_secs_f64());
            if adv.carried {
                carried_ticks += 1;
                if carried_ticks == 100 {
                    tracing::warn!(
                        shard = ctx.id,
                        fire_cap = engine.config().max_fires_per_advance,
                        "due timers have been carried over 100 slices: a large watermark jump, or a fire cap (time.max_fires_per_tick) too low for the load"
                    );
                }
                // Let other tasks run between capped ticks.
                tokio::task::yield_now().await;
            } else {
                carried_ticks = 0;
            }
            gauge!(t::WATERMARK_LAG_SECONDS, "shard" => label.clone())
                .set(ctx.shared.watermark.wall().now().since(w).as_secs_f64());
        }
        engine.end_step();
        if !publish(&ctx, &mut engine, &mut out, waiting).await {
            break;
        }
        report(&engine, &label);
    }
    // Drain: answer what is already queued so no accepted batch is left without a reply.
    rx.close();
    while let Some(msg) = rx.recv().await {
        let waiting = handle(&mut engine, msg, &mut out);
        if !publish(&ctx, &mut engine, &mut out, waiting).await {
            break;
        }
    }
    report(&engine, &label);
}

fn handle(engine: &mut Engine, msg: ShardMsg, out: &mut Vec<Event>) -> Option<Waiting> {
    match msg {
        ShardMsg::Fixes {
            fixes,
            arrived,
            reply,
            request,
        } => {
            let max_ts = fixes.iter().map(|s| s.fix.ts).max();
            let outcomes = fixes
                .into_iter()
                .map(|s| (s.index, engine.ingest(&s.fix, s.w, out)))
                .collect();
            Some(Waiting {
                reply,
                outcomes,
                arrived,
                request,
                max_ts,
            })
        }
        ShardMsg::UpsertFence(f) => {
            engine.upsert_fence(f, out);
            None
        }
        ShardMsg::RemoveFence(id) => {
            engine.remove_fence(&id);
            None
        }
        ShardMsg::Device { id, reply } => {
            let _ = reply.send(engine.device(&id));
            None
        }
        ShardMsg::DevicePage { from, limit, reply } => {
            let _ = reply.send(engine.device_page(from, limit));
            None
        }
    }
}

/// Hands the step's events, changed device state and waiting reply to the publisher, which
/// answers once they are durable. Returns false when the publisher is gone.
async fn publish(
    ctx: &Ctx,
    engine: &mut Engine,
    out: &mut Vec<Event>,
    waiting: Option<Waiting>,
) -> bool {
    let devices = if ctx.shared.persist {
        engine.take_dirty()
    } else {
        Vec::new()
    };
    if out.is_empty() && devices.is_empty() && waiting.is_none() {
        return true;
    }
    let (reply, arrived, request, max_ts) = match waiting {
        Some(w) => (
            Some((w.reply, w.outcomes)),
            Some(w.arrived),
            Some(w.request),
            w.max_ts,
        ),
        None => (None, None, None, None),
    };
    let step = Step {
        events: std::mem::take(out),
        devices,
        watermark: engine.watermark(),
        reply,
        arrived,
        request,
        max_ts,
        ..Step::default()
    };
    ctx.shared.publisher.send(step).await.is_ok()
}

fn report(engine: &Engine, label: &str) {
    let s = engine.stats();
    let l = label.to_string();
    gauge!(t::PAIRS_LIVE, "shard" => l.clone()).set(s.pairs as f64);
    gauge!(t::DEVICES, "shard" => l.clone()).set(s.devices as f64);
    gauge!(t::FIXES_BUFFERED, "shard" => l.clone()).set(s.buffered as f64);
    gauge!(t::WHEEL_TIMERS_LIVE, "shard" => l.clone())
        .set(s.wheel.entries.saturating_sub(s.wheel.tombstones) as f64);
    gauge!(t::WHEEL_TOMBSTONES, "shard" => l.clone()).set(s.wheel.tombstones as f64);
    gauge!(t::WHEEL_CARRY, "shard" => l).set(s.wheel.carry as f64);
}

/// The live-mode watermark now.
fn live_w(ctx: &Ctx) -> Ts {
    let w = &ctx.shared.watermark;
    w.wall().now().minus(w.lateness())
}
