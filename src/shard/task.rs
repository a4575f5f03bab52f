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
use crate::checkpoint::CkMsg;
use crate::clock::Watermark;
use crate::config::ClockMode;
use crate::events::publisher::{InputRecord, Publisher, Step, StepReply};
use crate::store::input::{Removal, encode_fence_applied, encode_fixes, encode_removal};
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
    /// Whether input is logged and checkpointed (a store is configured).
    pub persist: bool,
    /// Where checkpoint data goes (with a store).
    pub checkpoints: Option<mpsc::Sender<CkMsg>>,
    /// Cancelled at shutdown, once ingest has stopped: the shards then drain their queues.
    pub shutdown: CancellationToken,
    /// Batches queued per shard.
    pub queue: usize,
    /// `devices.idle_ttl`: forget idle devices (`None`: never).
    pub idle: Option<geodwell_core::engine::IdleRule>,
}

/// One task's own view of the context.
struct Ctx {
    id: usize,
    clock: ClockMode,
    shared: ShardCtx,
    event_w: watch::Receiver<Option<Ts>>,
    /// The `seq` of this shard's last input record.
    seq: u64,
    /// The running checkpoint, while devices are still to be handed out: its round, and the
    /// shard's last input `seq` and engine watermark at the freeze.
    checkpoint: Option<Frozen>,
}

/// One shard's starting point: its engine (restored and replayed), the `seq` of its last input
/// record, and the events the replay produced that were never published.
#[derive(Debug)]
pub struct ShardStart {
    /// The engine.
    pub engine: Engine,
    /// The `seq` of the shard's last input record (0: none).
    pub seq: u64,
    /// Events to publish first.
    pub pending: Vec<Event>,
}

/// Starts one task per shard (shard `k` owns `shards[k]`) and returns the handle to them and
/// the tasks, which end after a drain once `ctx.shutdown` is cancelled.
pub fn spawn(shards: Vec<ShardStart>, ctx: ShardCtx) -> (Shards, Vec<tokio::task::JoinHandle<()>>) {
    let mut senders = Vec::with_capacity(shards.len());
    let mut tasks = Vec::with_capacity(shards.len());
    for (id, start) in shards.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(ctx.queue.max(1));
        let task_ctx = Ctx {
            id,
            clock: ctx.watermark.mode(),
            event_w: ctx.watermark.subscribe(),
            shared: ctx.clone(),
            seq: start.seq,
            checkpoint: None,
        };
        senders.push(tx);
        tasks.push(tokio::spawn(run(start.engine, start.pending, rx, task_ctx)));
    }
    (
        Shards {
            senders: senders.into(),
            remote: None,
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

/// What handling one message left to publish: a waiting reply, the step's input record, an
/// acknowledgement waiting for the step to be durable and the fix time it persists.
#[derive(Default)]
struct Handled {
    waiting: Option<Waiting>,
    input: Option<InputRecord>,
    ack: Option<oneshot::Sender<Result<(), crate::events::publisher::PublishError>>>,
    max_ts: Option<Ts>,
}

/// Where a shard froze its state for a checkpoint.
#[derive(Debug, Clone, Copy)]
struct Frozen {
    round: u64,
    seq: u64,
    watermark: Option<Ts>,
}

/// Device slots one idle sweep looks at (tens of microseconds).
const IDLE_SCAN: usize = 8192;
/// How often a shard sweeps for idle devices (with `devices.idle_ttl`).
const IDLE_EVERY: Duration = Duration::from_millis(100);

/// Devices handed to the checkpoint writer per message.
const CHECKPOINT_CHUNK: usize = 2048;

/// Runs a shard until shutdown; drains queued messages before returning.
async fn run(
    mut engine: Engine,
    pending: Vec<Event>,
    mut rx: mpsc::Receiver<ShardMsg>,
    mut ctx: Ctx,
) {
    let label = ctx.id.to_string();
    let mut out: Vec<Event> = pending;
    let mut carried_ticks = 0u32;
    let mut idle_swept = Instant::now();
    // Warm start: deadlines that passed while the process was down are due now.
    let w0 = match ctx.clock {
        ClockMode::Live => Some(live_w(&ctx)),
        ClockMode::Event => *ctx.event_w.borrow_and_update(),
    };
    if let Some(w) = w0 {
        engine.advance(w, &mut out);
    }
    if !publish(&ctx, &mut engine, &mut out, Handled::default()).await {
        return;
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
        let mut handled = Handled::default();
        // One step: the message (if any) and the advance after it fire at most the fire cap
        // together, so a watermark jump over a mass of due work is worked off in slices with
        // new input taken between them.
        engine.begin_step();
        let ck_tx = ctx.shared.checkpoints.clone();
        tokio::select! {
            biased;
            _ = ctx.shared.shutdown.cancelled() => break,
            msg = rx.recv() => match msg {
                Some(msg) => handled = handle(&mut engine, msg, &mut out, &mut ctx),
                None => break,
            },
            changed = ctx.event_w.changed(), if ctx.clock == ClockMode::Event => {
                if changed.is_err() {
                    break;
                }
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now).into()), if wake.is_some() => {}
            // A checkpoint hands its devices out a chunk at a time, whenever the writer has
            // room and nothing else is to be done (devices about to change are copied first).
            permit = async { ck_tx.as_ref()?.reserve().await.ok() }, if ctx.checkpoint.is_some() => {
                if let (Some(permit), Some(f)) = (permit, ctx.checkpoint) {
                    let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
                    let done = engine.checkpoint_next(CHECKPOINT_CHUNK, &mut devices);
                    permit.send(CkMsg::Devices {
                        shard: ctx.id,
                        round: f.round,
                        seq: f.seq,
                        watermark: f.watermark,
                        devices,
                        done,
                    });
                    if done {
                        ctx.checkpoint = None;
                    }
                    // Let the tasks sharing this worker thread run between chunks: a writer
                    // with room takes chunk after chunk, and the budget tokio would make this
                    // task yield by covers a whole checkpoint of 100,000 devices.
                    tokio::task::yield_now().await;
                }
            }
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
        if !publish(&ctx, &mut engine, &mut out, handled).await {
            break;
        }
        if let Some(rule) = ctx.shared.idle
            && idle_swept.elapsed() >= IDLE_EVERY
        {
            idle_swept = Instant::now();
            let h = expire_idle(&mut engine, rule, &mut ctx);
            if h.input.is_some() && !publish(&ctx, &mut engine, &mut out, h).await {
                break;
            }
        }
        report(&engine, &label);
    }
    // Drain: answer what is already queued so no accepted batch is left without a reply.
    rx.close();
    while let Some(msg) = rx.recv().await {
        let handled = handle(&mut engine, msg, &mut out, &mut ctx);
        if !publish(&ctx, &mut engine, &mut out, handled).await {
            break;
        }
    }
    // A checkpoint asked for (the one at shutdown) is handed out whole: no input comes any more.
    if let (Some(f), Some(tx)) = (ctx.checkpoint.take(), ctx.shared.checkpoints.clone()) {
        loop {
            let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
            let done = engine.checkpoint_next(CHECKPOINT_CHUNK, &mut devices);
            let msg = CkMsg::Devices {
                shard: ctx.id,
                round: f.round,
                seq: f.seq,
                watermark: f.watermark,
                devices,
                done,
            };
            if tx.send(msg).await.is_err() || done {
                break;
            }
        }
    }
    report(&engine, &label);
}

fn handle(engine: &mut Engine, msg: ShardMsg, out: &mut Vec<Event>, ctx: &mut Ctx) -> Handled {
    let persist = ctx.shared.persist;
    match msg {
        ShardMsg::Fixes {
            fixes,
            arrived,
            reply,
            request,
        } => {
            let max_ts = fixes.iter().map(|s| s.fix.ts).max();
            // The record says what a replay must do to repeat this step exactly: start from the
            // engine's watermark now, then each fix with the watermark it arrived under.
            let input = persist.then(|| {
                let mut rec = Vec::with_capacity(16 + fixes.len() * 48);
                encode_fixes(
                    engine.watermark(),
                    fixes.len(),
                    fixes.iter().map(|s| (&s.fix, s.w)),
                    &mut rec,
                );
                ctx.seq += 1;
                (ctx.id as u16, ctx.seq, rec)
            });
            engine.set_arrival(ctx.shared.watermark.wall().stamp_of(arrived));
            let outcomes = fixes
                .into_iter()
                .map(|s| (s.index, engine.ingest(&s.fix, s.w, out)))
                .collect();
            engine.set_arrival(0);
            Handled {
                waiting: Some(Waiting {
                    reply,
                    outcomes,
                    arrived,
                    request,
                    max_ts,
                }),
                input,
                ..Handled::default()
            }
        }
        ShardMsg::UpsertFence(f, change) => {
            engine.upsert_fence(f, out);
            fence_applied(ctx, change)
        }
        ShardMsg::RemoveFence(id, change) => {
            engine.remove_fence(&id);
            fence_applied(ctx, change)
        }
        ShardMsg::Device { id, reply } => {
            let _ = reply.send(engine.device(&id));
            Handled::default()
        }
        ShardMsg::DevicePage { from, limit, reply } => {
            let _ = reply.send(engine.device_page(from, limit));
            Handled::default()
        }
        ShardMsg::Occupants {
            fence,
            from,
            limit,
            reply,
        } => {
            let _ = reply.send(engine.fence_occupants(&fence, from, limit, super::OCCUPANCY_SCAN));
            Handled::default()
        }
        ShardMsg::Advance { to, max_seen, ack } => {
            // Nothing to log: the next input record carries the engine's watermark from before
            // it, and a restart resumes from the persisted `max_seen`.
            engine.advance(to, out);
            Handled {
                ack: Some(ack),
                max_ts: Some(max_seen),
                ..Handled::default()
            }
        }
        ShardMsg::RemoveDevice { id, reply, ack } => {
            let w_before = engine.watermark();
            let existed = engine.remove_device(&id);
            let _ = reply.send(existed);
            if !existed {
                return Handled::default();
            }
            metrics::counter!(t::DEVICES_REMOVED, "reason" => "delete").increment(1);
            let rec = Removal {
                w_before,
                idle: None,
                ids: vec![id],
            };
            let mut h = removal_record(ctx, &rec);
            h.ack = Some(ack);
            h
        }
        ShardMsg::Inside { fence, reply } => {
            let _ = reply.send(engine.fence_inside(&fence));
            Handled::default()
        }
        ShardMsg::Checkpoint { round, full } => {
            if ctx.shared.checkpoints.is_some() {
                if full {
                    engine.mark_all_dirty();
                }
                engine.checkpoint_begin();
                ctx.checkpoint = Some(Frozen {
                    round,
                    seq: ctx.seq,
                    watermark: engine.watermark(),
                });
            }
            Handled::default()
        }
    }
}

/// One idle sweep: forgets the idle devices it finds and returns the step's removal record.
fn expire_idle(
    engine: &mut Engine,
    rule: geodwell_core::engine::IdleRule,
    ctx: &mut Ctx,
) -> Handled {
    let Some(w) = engine.watermark() else {
        return Handled::default();
    };
    let ids = engine.expire_idle(rule, w, IDLE_SCAN);
    if ids.is_empty() {
        return Handled::default();
    }
    for id in &ids {
        engine.forget_device(id);
    }
    metrics::counter!(t::DEVICES_REMOVED, "reason" => "idle").increment(ids.len() as u64);
    // Forgotten on replay too: the replay is at the same state, so they are idle there as here.
    let rec = Removal {
        w_before: Some(w),
        idle: Some(rule.ttl),
        ids: ids.iter().map(|s| s.to_string()).collect(),
    };
    removal_record(ctx, &rec)
}

/// The input record of a removal at this point of the shard's input.
fn removal_record(ctx: &mut Ctx, r: &Removal) -> Handled {
    if !ctx.shared.persist {
        return Handled::default();
    }
    let mut rec = Vec::with_capacity(16 + r.ids.iter().map(|i| i.len() + 2).sum::<usize>());
    encode_removal(r, &mut rec);
    ctx.seq += 1;
    Handled {
        input: Some((ctx.id as u16, ctx.seq, rec)),
        ..Handled::default()
    }
}

/// The record of fence change `change` applied at this point of the shard's input.
fn fence_applied(ctx: &mut Ctx, change: u64) -> Handled {
    if !ctx.shared.persist {
        return Handled::default();
    }
    let mut rec = Vec::with_capacity(12);
    encode_fence_applied(change, &mut rec);
    ctx.seq += 1;
    Handled {
        input: Some((ctx.id as u16, ctx.seq, rec)),
        ..Handled::default()
    }
}

/// Hands the step's events, input record and waiting reply to the publisher, which answers
/// once they are durable. Returns false when the publisher is gone.
async fn publish(ctx: &Ctx, engine: &mut Engine, out: &mut Vec<Event>, h: Handled) -> bool {
    let Handled {
        waiting,
        input,
        ack,
        max_ts: step_max_ts,
    } = h;
    if out.is_empty() && input.is_none() && waiting.is_none() && ack.is_none() {
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
    let events = std::mem::take(out);
    let causes = events.iter().map(|e| cause(ctx, e, arrived)).collect();
    let step = Step {
        events,
        causes,
        input,
        watermark: engine.watermark(),
        reply,
        request,
        max_ts: max_ts.max(step_max_ts),
        ack,
        ..Step::default()
    };
    ctx.shared.publisher.send(step).await.is_ok()
}

/// When what made `e` happened, for the ingest-to-event latency: the arrival of the fix that
/// decided it (an ENTER or EXIT carries it, however long the fix waited in the reorder
/// buffer); else the moment the watermark passed its time: live, the wall clock at
/// `at + lateness`; event, the arrival of the batch whose step made it (its stamp moved the
/// watermark) or, in a step of its own, when the published watermark last moved.
fn cause(ctx: &Ctx, e: &Event, batch: Option<Instant>) -> Instant {
    let wm = &ctx.shared.watermark;
    if let Some(at) = wm.wall().instant_of(e.arrived) {
        return at;
    }
    match ctx.clock {
        ClockMode::Live => wm.wall().instant_at(e.at.plus(wm.lateness())),
        ClockMode::Event => batch.unwrap_or_else(|| wm.moved_at()),
    }
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
