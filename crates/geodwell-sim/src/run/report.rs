//! The run's outcome: the [`SimReport`] built from the counters and the tracker at the end, its
//! text form, what in it counts as refused, and the live progress line drawn meanwhile.
//!
//! Invariants:
//! - The report is built once, at the end: after every sender has finished and the
//!   subscription has been told to stop, so the fix counts are final.
//! - [`SimReport::render`] is what `geodwell simulate` prints; readers of the README and of
//!   benchmark logs rely on its lines and their order, so change them deliberately.
//! - Rates are per `elapsed_s`, from the first send to the last answer (0 when nothing was
//!   answered).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::counters::Counters;
use super::{Pace, SimOptions, Transport};
use crate::error::SimError;
use crate::track::{LatencySummary, Tracker};
use geodwell_core::time::Ts;

/// What happened.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Transport used.
    pub transport: Transport,
    /// Connections used.
    pub connections: usize,
    /// Largest batch.
    pub batch: usize,
    /// Pacing.
    pub pace: Pace,
    /// The server's clock mode.
    pub server_clock: String,
    /// The server's lateness, ms.
    pub server_lateness_ms: i64,
    /// Devices simulated.
    pub devices: u32,
    /// Fences driven between.
    pub fences: usize,
    /// Event time of the first fix.
    pub start: Ts,
    /// Seconds from the first send to the last answer.
    pub elapsed_s: f64,
    /// Fixes sent (retries not counted twice).
    pub sent: u64,
    /// Fixes the server accepted.
    pub accepted: u64,
    /// Fixes it called late.
    pub late: u64,
    /// Fixes it called duplicates.
    pub duplicate: u64,
    /// Fixes it rejected item by item.
    pub rejected: u64,
    /// Accepted fixes per second over `elapsed_s`.
    pub accepted_per_s: f64,
    /// Fixes lost to whole-batch errors, by HTTP status or WebSocket error code.
    pub errors: BTreeMap<String, u64>,
    /// Batches re-sent after 429 / 503.
    pub retries: u64,
    /// Largest delay of a batch behind its schedule, ms (a run that keeps up stays near 0).
    pub max_slip_ms: f64,
    /// Events received, by type.
    pub events: BTreeMap<String, u64>,
    /// Events per second over `elapsed_s`, by type.
    pub events_per_s: BTreeMap<String, f64>,
    /// Subscriber `lagged` / `gap` frames seen.
    pub subscriber_lagged: u64,
    /// Subscriber gap frames seen.
    pub subscriber_gaps: u64,
    /// Ingest-to-event latency by type (`enter`, `exit`, `dwell`) and over `all`.
    pub latency: BTreeMap<String, LatencySummary>,
    /// Event clock: the watermark the run moved the server to at the end (`POST
    /// /v1/watermark`, the last fix's time), so the deadlines up to it were judged.
    pub finished_watermark: Option<Ts>,
    /// With `--cleanup`: what the run deleted afterwards.
    pub cleanup: Option<Cleanup>,
}

/// What `--cleanup` deleted.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Cleanup {
    /// Fences the run had created, deleted (fences it replaced are left as they are).
    pub fences: u64,
    /// Devices of the run, deleted (those the server no longer held are not counted).
    pub devices: u64,
    /// Deletions that failed (other than "not found"), by status.
    pub failed: BTreeMap<String, u64>,
}

/// The report of a finished run.
#[allow(clippy::too_many_arguments)]
pub(super) fn report(
    opts: &SimOptions,
    clock: &str,
    lateness_ms: i64,
    devices: u32,
    fences: usize,
    start: Ts,
    c: &Counters,
    tracker: &Tracker,
) -> SimReport {
    let first = c.first_send_us.load(Relaxed);
    let last = c.last_answer_us.load(Relaxed);
    let elapsed_s = (last.saturating_sub(first.saturating_sub(1))) as f64 / 1e6;
    let per_s = |n: u64| {
        if elapsed_s > 0.0 {
            n as f64 / elapsed_s
        } else {
            0.0
        }
    };
    let names = ["enter", "exit", "dwell"];
    let (by_type, all) = tracker.summaries();
    let mut latency: BTreeMap<String, LatencySummary> = names
        .iter()
        .zip(by_type)
        .map(|(n, s)| (n.to_string(), s))
        .collect();
    latency.insert("all".into(), all);
    let accepted = c.accepted.load(Relaxed);
    SimReport {
        transport: opts.transport,
        connections: opts.connections,
        batch: opts.batch,
        pace: opts.pace,
        server_clock: clock.to_string(),
        server_lateness_ms: lateness_ms,
        devices,
        fences,
        start,
        elapsed_s,
        sent: c.sent.load(Relaxed),
        accepted,
        late: c.late.load(Relaxed),
        duplicate: c.duplicate.load(Relaxed),
        rejected: c.rejected.load(Relaxed),
        accepted_per_s: per_s(accepted),
        errors: c.errors(),
        retries: c.retries.load(Relaxed),
        max_slip_ms: c.max_slip_us.load(Relaxed) as f64 / 1000.0,
        events: names
            .iter()
            .zip(&c.events)
            .map(|(n, e)| (n.to_string(), e.load(Relaxed)))
            .collect(),
        events_per_s: names
            .iter()
            .zip(&c.events)
            .map(|(n, e)| (n.to_string(), per_s(e.load(Relaxed))))
            .collect(),
        subscriber_lagged: c.lagged.load(Relaxed),
        subscriber_gaps: c.gaps.load(Relaxed),
        latency,
        finished_watermark: None,
        cleanup: None,
    }
}

impl SimReport {
    /// A human-readable summary.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "geodwell simulate: {} devices, {} fences, {:?} x{} batch {}, pace {:?}; server clock {} lateness {} ms",
            self.devices,
            self.fences,
            self.transport,
            self.connections,
            self.batch,
            self.pace,
            self.server_clock,
            self.server_lateness_ms
        );
        let _ = writeln!(
            s,
            "fixes: sent {} accepted {} late {} duplicate {} rejected {} in {:.2} s = {:.0} accepted/s (max slip {:.1} ms, retries {})",
            self.sent,
            self.accepted,
            self.late,
            self.duplicate,
            self.rejected,
            self.elapsed_s,
            self.accepted_per_s,
            self.max_slip_ms,
            self.retries
        );
        if !self.errors.is_empty() {
            let _ = writeln!(s, "errors (fixes): {:?}", self.errors);
        }
        let _ = writeln!(
            s,
            "events: {}",
            self.events
                .iter()
                .map(|(k, v)| format!(
                    "{k} {v} ({:.0}/s)",
                    self.events_per_s.get(k).unwrap_or(&0.0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if self.subscriber_lagged + self.subscriber_gaps > 0 {
            let _ = writeln!(
                s,
                "subscriber: lagged {} gaps {}",
                self.subscriber_lagged, self.subscriber_gaps
            );
        }
        let _ = writeln!(
            s,
            "ingest-to-event latency (ms):   count      p50      p99    p99.9      max  unmatched"
        );
        for (k, l) in &self.latency {
            let _ = writeln!(
                s,
                "  {k:<28} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10}",
                l.count,
                l.p50_us as f64 / 1000.0,
                l.p99_us as f64 / 1000.0,
                l.p999_us as f64 / 1000.0,
                l.max_us as f64 / 1000.0,
                l.unmatched
            );
        }
        if let Some(w) = self.finished_watermark {
            let _ = writeln!(s, "watermark moved to the last fix's time: {w}");
        }
        if let Some(c) = &self.cleanup {
            let _ = writeln!(
                s,
                "cleanup: deleted {} fences and {} devices{}",
                c.fences,
                c.devices,
                if c.failed.is_empty() {
                    String::new()
                } else {
                    format!("; failed: {:?}", c.failed)
                }
            );
        }
        s
    }

    /// Fixes the server did not take: rejected item by item, or lost with a whole batch (an
    /// error status after the 429 / 503 retries, an error frame, no answer). Late and duplicate
    /// fixes are answers, not refusals.
    pub fn refused(&self) -> u64 {
        self.rejected + self.errors.values().sum::<u64>()
    }

    /// [`SimError::FixesRefused`] when [`SimReport::refused`] is not 0 or any error was
    /// counted (a WebSocket connection that failed loses no fix but is an error); `None` for a
    /// clean run.
    pub fn refusal(&self) -> Option<SimError> {
        let refused = self.refused();
        (refused > 0 || !self.errors.is_empty()).then(|| SimError::FixesRefused {
            refused,
            sent: self.sent,
            rejected: self.rejected,
            errors: self.errors.clone(),
        })
    }
}

/// The progress line on stderr, refreshed every 250 ms (`None` when disabled).
pub(super) fn progress_bar(
    enabled: bool,
    counters: Arc<Counters>,
    tracker: Arc<Tracker>,
) -> Option<indicatif::ProgressBar> {
    if !enabled {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
        bar.set_style(style);
    }
    let b = bar.clone();
    tokio::spawn(async move {
        let mut last = (0u64, Instant::now());
        while !b.is_finished() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let accepted = counters.accepted.load(Relaxed);
            let rate = (accepted - last.0) as f64 / last.1.elapsed().as_secs_f64();
            last = (accepted, Instant::now());
            let ev: Vec<u64> = counters.events.iter().map(|e| e.load(Relaxed)).collect();
            let (_, all) = tracker.summaries();
            b.set_message(format!(
                "sent {} accepted {} ({:.0}/s) late {} | enter {} exit {} dwell {} | p99 {:.2} ms",
                counters.sent.load(Relaxed),
                accepted,
                rate,
                counters.late.load(Relaxed),
                ev[0],
                ev[1],
                ev[2],
                all.p99_us as f64 / 1000.0
            ));
            b.tick();
        }
    });
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> SimReport {
        SimReport {
            transport: Transport::Http,
            connections: 1,
            batch: 1000,
            pace: Pace::Max,
            server_clock: "event".into(),
            server_lateness_ms: 0,
            devices: 10,
            fences: 3,
            start: Ts(0),
            elapsed_s: 1.0,
            sent: 100,
            accepted: 90,
            late: 6,
            duplicate: 4,
            rejected: 0,
            accepted_per_s: 90.0,
            errors: BTreeMap::new(),
            retries: 3,
            max_slip_ms: 0.0,
            events: BTreeMap::new(),
            events_per_s: BTreeMap::new(),
            subscriber_lagged: 0,
            subscriber_gaps: 0,
            latency: BTreeMap::new(),
            finished_watermark: None,
            cleanup: None,
        }
    }

    #[test]
    fn only_rejected_and_lost_fixes_are_refusals() {
        // Late, duplicate and retried fixes were answered.
        assert!(clean().refusal().is_none());
        let r = SimReport {
            rejected: 2,
            ..clean()
        };
        assert_eq!(r.refused(), 2);
        assert!(matches!(
            r.refusal(),
            Some(SimError::FixesRefused {
                refused: 2,
                sent: 100,
                ..
            })
        ));
        let mut r = clean();
        r.errors.insert("503".into(), 10);
        r.errors.insert("ws connect: refused".into(), 0);
        assert_eq!(r.refused(), 10);
        assert!(r.refusal().is_some());
        // A connection that failed loses no fix but is not a clean run.
        let mut r = clean();
        r.errors.insert("ws connect: refused".into(), 0);
        assert!(r.refusal().is_some());
    }
}
