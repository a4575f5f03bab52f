//! Pacing and batching: the generator thread cuts the fleet's fixes into batches with release
//! times, and the senders take each batch when its time has come.
//!
//! Owns: [`Batch`], [`generate`] (the generator thread) and [`SendCtx`] (what every sender
//! shares: the batch queue, the release clock, and the bookkeeping done as a batch goes out).
//!
//! Invariants:
//! - Release times are fixed here, by the generator, from the pace and the fixes alone; a
//!   sender that takes a batch late sends it at once and the delay is kept as the slip.
//! - A batch is cut at `batch` fixes (under `--rate`, also at what the linger holds at that
//!   rate), at `limit` fixes in all, or when its event-time span reaches the linger times the
//!   replay speed; its body is NDJSON (HTTP) or one JSON array (WebSocket).
//! - [`SendCtx::sent`] runs before the batch's first byte is written, so the tracker's send
//!   time precedes every answer and event it causes.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use super::counters::Counters;
use super::{Pace, SimOptions, Transport};
use crate::fleet::Fleet;
use crate::track::Tracker;

/// One batch on its way.
#[derive(Debug)]
pub(super) struct Batch {
    /// Sequence number, for latency attribution.
    pub(super) id: u64,
    /// The request body or frame text.
    pub(super) body: Bytes,
    /// Fixes in it.
    pub(super) n: u64,
    /// Largest `ts` in it.
    pub(super) max_ts: i64,
    /// When it is due, from the run's start.
    pub(super) release: Duration,
    /// (device, ts, accuracy) of each fix, for latency attribution (empty when not measuring).
    pub(super) fixes: Vec<(u32, i64, f32)>,
}

/// The generator thread: cuts the fleet's fixes into batches with release times.
pub(super) fn generate(
    mut fleet: Fleet,
    opts: &SimOptions,
    tx: mpsc::Sender<Batch>,
    stop: &CancellationToken,
    start: i64,
) {
    let prefix = fleet.spec().prefix.clone();
    let measure = opts.measure;
    let max_batch = match opts.pace {
        Pace::Rate(r) => ((r * opts.linger.as_secs_f64()).ceil() as usize).clamp(1, opts.batch),
        _ => opts.batch,
    };
    let span_ms = match opts.pace {
        Pace::Replay(s) => (opts.linger.as_secs_f64() * 1000.0 * s).max(1.0) as i64,
        _ => i64::MAX,
    };
    let ws = opts.transport == Transport::Ws;
    let mut total = 0u64;
    let mut id = 0u64;
    let limit = opts.max_fixes.unwrap_or(u64::MAX);
    let mut pending = fleet.next();
    while let Some(first) = pending {
        if stop.is_cancelled() || total >= limit {
            return;
        }
        let mut body = Vec::with_capacity(max_batch * 110 + 2);
        if ws {
            body.push(b'[');
        }
        let mut n = 0u64;
        let mut max_ts = i64::MIN;
        let mut fixes = Vec::with_capacity(if measure { max_batch } else { 0 });
        let mut fix = Some(first);
        while let Some(f) = fix {
            if n as usize >= max_batch || total >= limit || f.ts.0 - first.ts.0 >= span_ms {
                break;
            }
            if n > 0 {
                body.push(if ws { b',' } else { b'\n' });
            }
            f.write_json(&prefix, &mut body);
            if measure {
                fixes.push((f.device, f.ts.0, f.accuracy as f32));
            }
            max_ts = max_ts.max(f.ts.0);
            n += 1;
            total += 1;
            fix = fleet.next();
        }
        body.push(if ws { b']' } else { b'\n' });
        pending = fix;
        let release = match opts.pace {
            Pace::Max => Duration::ZERO,
            Pace::Rate(r) => Duration::from_secs_f64(total as f64 / r),
            Pace::Replay(s) => {
                Duration::from_secs_f64(((max_ts - start).max(0) as f64 / 1000.0) / s)
            }
        };
        if opts.duration.is_some_and(|d| release > d) {
            return;
        }
        let batch = Batch {
            id,
            body: Bytes::from(body),
            n,
            max_ts,
            release,
            fixes,
        };
        id += 1;
        if tx.blocking_send(batch).is_err() {
            return;
        }
    }
}

/// What every sender task shares.
pub(super) struct SendCtx {
    /// The generator's batches, taken by whichever sender is free.
    pub(super) rx: Arc<Mutex<mpsc::Receiver<Batch>>>,
    /// Latency bookkeeping.
    pub(super) tracker: Arc<Tracker>,
    /// Tallies.
    pub(super) counters: Arc<Counters>,
    /// Cancelled at the end of the run (duration, signal, refusal).
    pub(super) stop: CancellationToken,
    /// The run's start: release times count from here.
    pub(super) t0: Instant,
}

impl SendCtx {
    /// The next batch once its release time has come; `None` when done or stopped.
    pub(super) async fn next(&self) -> Option<Batch> {
        let b = tokio::select! {
            _ = self.stop.cancelled() => return None,
            b = async { self.rx.lock().await.recv().await } => b?,
        };
        let at = self.t0 + b.release;
        tokio::select! {
            _ = self.stop.cancelled() => return None,
            _ = tokio::time::sleep_until(at.into()) => {}
        }
        let slip = Instant::now().saturating_duration_since(at).as_micros() as u64;
        self.counters.max_slip_us.fetch_max(slip, Relaxed);
        Some(b)
    }

    /// Records that `b` is going out now: its fixes for attribution, its send time, and the
    /// sent count.
    pub(super) fn sent(&self, b: &Batch) {
        for &(d, ts, acc) in &b.fixes {
            self.tracker.note_fix(d, ts, b.id, acc);
        }
        let us = self.tracker.note_send(b.id, b.max_ts);
        let c = &self.counters;
        c.sent.fetch_add(b.n, Relaxed);
        let _ = c
            .first_send_us
            .compare_exchange(0, us.max(1), Relaxed, Relaxed);
    }
}
