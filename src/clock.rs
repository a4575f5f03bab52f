//! Time for the shell: the wall clock, and the watermark every ingested fix is stamped with.
//!
//! Invariants:
//! - [`WallClock`] is derived from one (SystemTime, Instant) origin: it never goes back, and a
//!   wall-clock deadline maps onto an exact monotonic [`Instant`] (so sleeps never drift).
//! - [`Watermark`] in `live` mode is `wall - lateness`; in `event` mode it is `max ts seen -
//!   lateness`, where "seen" counts every fix stamped so far, and the value shards are told about
//!   ([`Watermark::publish`]) only moves forward and only to stamps of batches already sent to
//!   them (so a shard never moves past fixes it has not received yet).
//!
//! The core never reads a clock: these values are the arguments the shell passes it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use geodwell_core::time::{Dur, Ts};
use std::fmt;

use tokio::sync::watch;

/// How the watermark moves (`/readyz` shows it as `live` or `event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClockMode {
    /// `W = wall clock - lateness`.
    Live,
    /// `W = max ts seen - lateness`.
    Event,
}

impl std::str::FromStr for ClockMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "live" => Ok(ClockMode::Live),
            "event" => Ok(ClockMode::Event),
            _ => Err(format!("expected \"live\" or \"event\", got {s:?}")),
        }
    }
}

impl fmt::Display for ClockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClockMode::Live => "live",
            ClockMode::Event => "event",
        })
    }
}

/// Wall time derived from one (SystemTime, Instant) origin: monotonic, so it never jumps back and
/// a deadline in wall time maps onto an exact `Instant`.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    origin: Instant,
    origin_ms: i64,
}

impl WallClock {
    /// Captures the origin now.
    pub fn start() -> WallClock {
        let origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        WallClock {
            origin: Instant::now(),
            origin_ms,
        }
    }

    /// The current wall time.
    pub fn now(&self) -> Ts {
        Ts(self.origin_ms + self.origin.elapsed().as_millis() as i64)
    }

    /// A stamp for `at` (microseconds since the origin, plus one: 0 means "none"), small enough
    /// to travel with a fix through the engine ([`geodwell_core::engine::Engine::set_arrival`]).
    pub fn stamp_of(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_micros() as u64 + 1
    }

    /// The instant of a stamp from [`WallClock::stamp_of`] (`None` for 0).
    pub fn instant_of(&self, stamp: u64) -> Option<Instant> {
        (stamp > 0).then(|| self.origin + Duration::from_micros(stamp - 1))
    }

    /// The monotonic instant at which the wall clock reads `t`.
    pub fn instant_at(&self, t: Ts) -> Instant {
        let ms = (t.0 - self.origin_ms).max(0) as u64;
        self.origin + Duration::from_millis(ms)
    }
}

/// The service's watermark: how fixes are stamped at ingest and what shards advance to.
#[derive(Debug)]
pub struct Watermark {
    mode: ClockMode,
    lateness: Dur,
    wall: WallClock,
    /// event mode: the largest `ts` stamped so far (Unix ms), `i64::MIN` before any.
    max_seen: AtomicI64,
    /// event mode: the watermark published to the shards.
    published: watch::Sender<Option<Ts>>,
    /// A cluster node: the published watermark is the cluster's ([`Watermark::observe_cluster`]),
    /// never this node's own stamps.
    external: std::sync::atomic::AtomicBool,
    /// event mode: when the published watermark last moved ([`WallClock::stamp_of`]).
    moved_at: std::sync::atomic::AtomicU64,
}

impl Watermark {
    /// A watermark in `mode`, restored from `max_seen` (the largest fix time a previous run
    /// committed; event mode) and starting at `restored` (what shards resume from).
    pub fn new(
        mode: ClockMode,
        lateness: Dur,
        wall: WallClock,
        max_seen: Option<i64>,
        restored: Option<Ts>,
    ) -> Watermark {
        let (published, _) = watch::channel(match mode {
            ClockMode::Event => restored,
            ClockMode::Live => None,
        });
        Watermark {
            mode,
            lateness,
            wall,
            max_seen: AtomicI64::new(max_seen.unwrap_or(i64::MIN)),
            published,
            external: std::sync::atomic::AtomicBool::new(false),
            moved_at: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Makes this a cluster node's watermark: in event mode, what is published is the cluster's
    /// watermark as the node learns it ([`Watermark::observe_cluster`]), never a stamp of a
    /// batch this node has merely sent (its parts may not be in their partitions' input yet).
    pub fn set_external(&self) {
        self.external
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// event mode, cluster node: the largest fix time the cluster's input holds is `max_seen`
    /// (the newest of every node's acknowledged batches): stamps count it, and the published
    /// watermark moves to `max_seen - lateness`.
    pub fn observe_cluster(&self, max_seen: i64) {
        if self.mode != ClockMode::Event {
            return;
        }
        self.max_seen.fetch_max(max_seen, Ordering::AcqRel);
        let w = Ts(max_seen).minus(self.lateness);
        self.raise(w);
    }

    /// Publishes `w` if it is ahead of the published watermark, noting when.
    fn raise(&self, w: Ts) {
        let moved = self.published.send_if_modified(|cur| {
            if cur.is_none_or(|c| c < w) {
                *cur = Some(w);
                true
            } else {
                false
            }
        });
        if moved {
            self.moved_at.store(
                self.wall.stamp_of(Instant::now()),
                std::sync::atomic::Ordering::Release,
            );
        }
    }

    /// event mode: when the published watermark last moved (now if it never did).
    pub fn moved_at(&self) -> Instant {
        self.wall
            .instant_of(self.moved_at.load(std::sync::atomic::Ordering::Acquire))
            .unwrap_or_else(Instant::now)
    }

    /// The clock mode.
    pub fn mode(&self) -> ClockMode {
        self.mode
    }

    /// The configured lateness.
    pub fn lateness(&self) -> Dur {
        self.lateness
    }

    /// The wall clock.
    pub fn wall(&self) -> WallClock {
        self.wall
    }

    /// The watermark a fix at `ts` arriving now is judged against: live, `wall - lateness`;
    /// event, the largest `ts` stamped so far (this one included) minus lateness.
    pub fn stamp(&self, ts: Ts, wall_now: Ts) -> Ts {
        match self.mode {
            ClockMode::Live => wall_now.minus(self.lateness),
            ClockMode::Event => {
                let prev = self.max_seen.fetch_max(ts.0, Ordering::AcqRel);
                Ts(prev.max(ts.0)).minus(self.lateness)
            }
        }
    }

    /// A stamper for one batch: [`Stamper::stamp`] judges each fix like [`Watermark::stamp`],
    /// the batch's earlier fixes included. On a cluster node the batch's fixes stay out of the
    /// shared maximum: the cluster's watermark moves only once the whole batch is stored
    /// (`cluster::ingest`), so a batch refused halfway and sent again is stamped as it was the
    /// first time, not against a watermark its own first attempt moved.
    pub fn stamper(&self) -> Stamper<'_> {
        let external = self.external.load(std::sync::atomic::Ordering::Acquire);
        Stamper {
            wm: self,
            local: external.then(|| self.max_seen.load(Ordering::Acquire)),
        }
    }

    /// event mode: tells every shard about `w`, the largest stamp of a batch that has just been
    /// sent to them (no-op in live mode, or when `w` is not ahead). Publishing the batch's own
    /// stamp rather than the global maximum matters: another batch may have been stamped higher
    /// and not be sent yet, and a shard that moved past its fixes first would find them late.
    pub fn publish(&self, w: Option<Ts>) {
        if self.mode != ClockMode::Event || self.external.load(std::sync::atomic::Ordering::Acquire)
        {
            return;
        }
        if let Some(w) = w {
            self.raise(w);
        }
    }

    /// event mode: moves the watermark to `to` by hand (the end of a backfill): stamps from now
    /// on are at least `to`, and unless this is a cluster node (whose watermark is the
    /// cluster's) the shards are told at once. Returns the watermark before; refuses (with the
    /// current one) a `to` behind it. Moving to the current value is a no-op that succeeds.
    pub fn advance_to(&self, to: Ts) -> Result<Option<Ts>, Ts> {
        let current = self.current();
        if let Some(c) = current
            && to < c
        {
            return Err(c);
        }
        self.max_seen
            .fetch_max(to.plus(self.lateness).0, Ordering::AcqRel);
        if !self.external.load(std::sync::atomic::Ordering::Acquire) {
            self.raise(to);
        }
        Ok(current)
    }

    /// event mode: a receiver of the published watermark, for a shard.
    pub fn subscribe(&self) -> watch::Receiver<Option<Ts>> {
        self.published.subscribe()
    }

    /// The current watermark: live = wall - lateness; event = the published one (`None` before
    /// the first fix).
    pub fn current(&self) -> Option<Ts> {
        match self.mode {
            ClockMode::Live => Some(self.wall.now().minus(self.lateness)),
            ClockMode::Event => *self.published.borrow(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_batch_is_stamped_progressively_without_moving_the_shared_maximum() {
        let w = Watermark::new(
            ClockMode::Event,
            Dur::from_secs(2),
            WallClock::start(),
            Some(10_000),
            None,
        );
        w.set_external();
        let now = Ts(0);
        let mut st = w.stamper();
        assert_eq!(st.stamp(Ts(9_000), now), Ts(8_000));
        assert_eq!(st.stamp(Ts(15_000), now), Ts(13_000));
        assert_eq!(
            st.stamp(Ts(12_000), now),
            Ts(13_000),
            "earlier fixes of the batch count"
        );
        // Sent again (the first attempt was refused): stamped as the first time.
        let mut again = w.stamper();
        assert_eq!(again.stamp(Ts(9_000), now), Ts(8_000));
        // Once stored, the cluster's maximum moves.
        w.observe_cluster(15_000);
        assert_eq!(w.stamper().stamp(Ts(9_000), now), Ts(13_000));
    }

    #[test]
    fn event_stamps_follow_the_largest_ts_and_publish_only_moves_forward() {
        let w = Watermark::new(
            ClockMode::Event,
            Dur::from_secs(2),
            WallClock::start(),
            None,
            None,
        );
        let now = Ts(0);
        assert_eq!(w.stamp(Ts(10_000), now), Ts(8_000));
        assert_eq!(
            w.stamp(Ts(5_000), now),
            Ts(8_000),
            "an older fix keeps the max"
        );
        assert_eq!(w.current(), None, "nothing published yet");
        w.publish(Some(Ts(8_000)));
        w.publish(Some(Ts(7_000)));
        assert_eq!(w.current(), Some(Ts(8_000)));
    }

    #[test]
    fn live_stamps_are_wall_minus_lateness() {
        let w = Watermark::new(
            ClockMode::Live,
            Dur::from_secs(2),
            WallClock::start(),
            None,
            None,
        );
        assert_eq!(w.stamp(Ts(1), Ts(10_000)), Ts(8_000));
        w.publish(Some(Ts(99_999_999)));
        let now = WallClock::start().now();
        let cur = w.current().unwrap();
        assert!(
            cur <= now.minus(Dur::from_secs(2)) && cur > now.minus(Dur::from_secs(60)),
            "live: wall - lateness, whatever was published ({cur})"
        );
    }
}

/// Stamps the fixes of one batch (see [`Watermark::stamper`]).
#[derive(Debug)]
pub struct Stamper<'a> {
    wm: &'a Watermark,
    /// A cluster node: the largest time seen, this batch's fixes so far included (not shared).
    local: Option<i64>,
}

impl Stamper<'_> {
    /// The watermark the fix at `ts`, arriving at `wall_now`, is judged against.
    pub fn stamp(&mut self, ts: Ts, wall_now: Ts) -> Ts {
        match (&mut self.local, self.wm.mode) {
            (Some(local), ClockMode::Event) => {
                *local = (*local).max(ts.0);
                Ts(*local).minus(self.wm.lateness)
            }
            _ => self.wm.stamp(ts, wall_now),
        }
    }
}
