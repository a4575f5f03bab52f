//! The partition driver: the one place that applies a partition's input to its [`Engine`],
//! fires its timers, works off timers the fire cap carried over, sweeps for idle devices and cuts
//! checkpoint chunks. Sans-IO: it reads no clock, does no I/O and knows no deployment; the
//! shell's one partition task hands it records and time and does with its output (events,
//! outcomes, removals to log, checkpoint chunks) what its backend does.
//!
//! Invariants:
//! - Records are applied in log order, each once: a record at or before [`Driver::applied`] is
//!   skipped (a log may deliver a record again after a reconnect); positions may have gaps (a
//!   cluster's partitions share one stream).
//! - A record is applied the same way live and on every replay of it: first the watermark it
//!   carries, then its content; fence markers apply every fence change after the partition's
//!   own fence position up to the marker, in order. So the engine is a pure function of the
//!   checkpoint it started from and the records after it.
//! - What the driver does between records (advances of a log that does not record its ticks,
//!   slices of carried timers) changes when events come out, never which: the next record
//!   carries the watermark the engine reached.
//! - A fixes record identical to one of the last parts applied without a rejection (see
//!   [`super::recent`]) advances the watermark its stamps carry and answers every fix
//!   `duplicate`; applying it fix by fix would change no state either.
//! - A checkpoint is the state at the position of its freeze: the engine copies a device about
//!   to change before changing it while chunks are still to be handed out.

use std::sync::Arc;

use super::recent::{PartHash, RecentParts};
use super::record::{Input, Removal};
use crate::engine::{
    DeviceState, Engine, EngineConfig, IdleRule, IngestError, Ingested, RestoreError, Restored,
};
use crate::event::Event;
use crate::fences::Fence;
use crate::fix::Fix;
use crate::time::Ts;

/// A fence change, resolved to what the engine applies.
#[derive(Debug, Clone)]
pub enum FenceUpdate {
    /// Insert or replace.
    Put(Arc<Fence>),
    /// Delete the fence with this id.
    Delete(Arc<str>),
}

/// Where a partition's fence changes come from: the fence log its backend keeps.
pub trait FenceSource {
    /// The changes after fence position `from` up to and including `to`, in order.
    fn changes(&self, from: u64, to: u64) -> Result<Vec<FenceUpdate>, MissingFences>;
}

/// A fence marker names changes the fence source does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fence changes {from}..={to} are not in the fence log")]
pub struct MissingFences {
    /// The first position missing (exclusive lower end).
    pub from: u64,
    /// The marker's position.
    pub to: u64,
}

/// Fence changes by position, held in memory: a marker applies those after the partition's
/// fence position up to it. A position it does not hold was left out on purpose (a change a
/// later one supersedes), not lost.
#[derive(Debug, Clone, Default)]
pub struct ChangeLog(pub std::collections::BTreeMap<u64, FenceUpdate>);

impl FenceSource for ChangeLog {
    fn changes(&self, from: u64, to: u64) -> Result<Vec<FenceUpdate>, MissingFences> {
        Ok(self
            .0
            .range(from + 1..=to)
            .map(|(_, u)| u.clone())
            .collect())
    }
}

/// No fence changes at all (a partition whose log holds no markers, or a test).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFences;

impl FenceSource for NoFences {
    fn changes(&self, from: u64, to: u64) -> Result<Vec<FenceUpdate>, MissingFences> {
        if to <= from {
            Ok(Vec::new())
        } else {
            Err(MissingFences { from, to })
        }
    }
}

/// What applying one record did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The record is at or before the last one applied: nothing was done.
    Skipped,
    /// Fixes: one outcome per fix, in the record's order.
    Fixes(Vec<Result<Ingested, IngestError>>),
    /// A tick.
    Tick,
    /// A fence marker.
    Fences,
    /// A removal: how many devices it removed.
    Removed(usize),
}

/// Where a partition froze its state for a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frozen {
    /// The last record the checkpoint covers.
    pub position: u64,
    /// The fence position its engine had applied.
    pub fence_pos: u64,
    /// The engine's watermark.
    pub watermark: Option<Ts>,
    /// The parts applied lately, oldest first ([`super::recent`]).
    pub recent: Arc<[u64]>,
}

impl Frozen {
    /// A partition's state at `position` before any part was remembered (an empty partition,
    /// or a checkpoint written before checkpoints kept them).
    pub fn at(position: u64, fence_pos: u64, watermark: Option<Ts>) -> Frozen {
        Frozen {
            position,
            fence_pos,
            watermark,
            recent: Arc::from([]),
        }
    }
}

/// A partition's engine and where it stands in its log.
#[derive(Debug)]
pub struct Driver {
    engine: Engine,
    applied: u64,
    fence_pos: u64,
    /// Slices of carried timers worked off in a row (0: nothing carried).
    carried: u32,
    freeze: Option<Frozen>,
    out: Vec<Event>,
    recent: RecentParts,
}

impl Driver {
    /// A driver for `engine`, whose state covers the log up to `applied` and the fence log up to
    /// `fence_pos`.
    pub fn new(engine: Engine, applied: u64, fence_pos: u64) -> Driver {
        Driver {
            engine,
            applied,
            fence_pos,
            carried: 0,
            freeze: None,
            out: Vec::new(),
            recent: RecentParts::default(),
        }
    }

    /// A partition restored from its checkpoint: an engine with `fences` (the fence set as of
    /// the checkpoint's fence position), then its `devices` at the checkpoint's watermark. The
    /// records after the checkpoint are then applied with [`Driver::apply`], as live: one
    /// restore path for a warm start, a takeover and a rebuild after a failed commit.
    pub fn restore(
        cfg: EngineConfig,
        fences: impl IntoIterator<Item = Arc<Fence>>,
        devices: Vec<DeviceState>,
        at: Frozen,
    ) -> Result<(Driver, Restored), RestoreError> {
        let mut engine = Engine::new(cfg);
        let mut none = Vec::new();
        for f in fences {
            engine.upsert_fence(f, &mut none);
        }
        let restored = engine.restore(devices, at.watermark)?;
        let mut driver = Driver::new(engine, at.position, at.fence_pos);
        driver.recent = RecentParts::from_snapshot(&at.recent);
        Ok((driver, restored))
    }

    /// Keeps only the events produced so far that `keep` accepts (a replay drops those already
    /// published before it).
    pub fn retain_events(&mut self, keep: impl FnMut(&Event) -> bool) {
        self.out.retain(keep);
    }

    /// The engine (for queries).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The last record applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The fence position applied.
    pub fn fence_pos(&self) -> u64 {
        self.fence_pos
    }

    /// The engine's watermark.
    pub fn watermark(&self) -> Option<Ts> {
        self.engine.watermark()
    }

    /// When the next advance may have work (see [`Engine::next_due`]).
    pub fn next_due(&self) -> Option<Ts> {
        self.engine.next_due()
    }

    /// Slices of carried timers worked off in a row; 0 when the fire cap carried nothing.
    pub fn carried(&self) -> u32 {
        self.carried
    }

    /// Events produced and not taken yet.
    pub fn has_events(&self) -> bool {
        !self.out.is_empty()
    }

    /// Takes the events produced so far, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.out)
    }

    /// Applies record `pos`. `arrival` is the arrival token events decided by its fixes carry
    /// (0: none, as on a replay); `fences` resolves a fence marker.
    pub fn apply(
        &mut self,
        pos: u64,
        input: &Input,
        arrival: u64,
        fences: &dyn FenceSource,
    ) -> Result<Applied, MissingFences> {
        if pos <= self.applied {
            return Ok(Applied::Skipped);
        }
        let applied = match input {
            Input::Fixes { w_before, fixes } => {
                Applied::Fixes(self.part(*w_before, fixes, arrival))
            }
            Input::Tick(w) => {
                self.advance(*w);
                Applied::Tick
            }
            Input::Fences(c) => {
                self.fences(*c, fences)?;
                Applied::Fences
            }
            Input::Removed(r) => Applied::Removed(self.remove(r)),
        };
        self.applied = pos;
        Ok(applied)
    }

    /// A fixes record: answered as a whole duplicate when it is a part applied lately, else
    /// applied fix by fix (and remembered if nothing of it was rejected).
    fn part(
        &mut self,
        w_before: Option<Ts>,
        fixes: &[(Fix, Ts)],
        arrival: u64,
    ) -> Vec<Result<Ingested, IngestError>> {
        let hash = PartHash::of(fixes.iter().map(|(f, _)| f));
        if self.recent.contains(hash) {
            let stamp = fixes.iter().map(|(_, s)| *s).max();
            if let Some(w) = w_before.into_iter().chain(stamp).max() {
                self.advance(w);
            }
            return vec![Ok(Ingested::Duplicate); fixes.len()];
        }
        let outcomes = self.fixes(w_before, fixes.iter().map(|(f, s)| (f, *s)), arrival);
        if outcomes.iter().all(Result::is_ok) {
            self.recent.remember(hash);
        }
        outcomes
    }

    fn fixes<'a>(
        &mut self,
        w_before: Option<Ts>,
        fixes: impl Iterator<Item = (&'a Fix, Ts)>,
        arrival: u64,
    ) -> Vec<Result<Ingested, IngestError>> {
        self.engine.begin_step();
        if let Some(w) = w_before {
            self.carry(w);
        }
        self.engine.set_arrival(arrival);
        let outcomes = fixes
            .map(|(fix, stamp)| self.engine.ingest(fix, stamp, &mut self.out))
            .collect();
        self.engine.set_arrival(0);
        self.engine.end_step();
        outcomes
    }

    fn fences(&mut self, c: u64, source: &dyn FenceSource) -> Result<(), MissingFences> {
        if c <= self.fence_pos {
            return Ok(());
        }
        let changes = source.changes(self.fence_pos, c)?;
        self.engine.begin_step();
        for ch in changes {
            match ch {
                FenceUpdate::Put(f) => {
                    self.engine.upsert_fence(f, &mut self.out);
                }
                FenceUpdate::Delete(id) => {
                    self.engine.remove_fence(&id);
                }
            }
        }
        self.engine.end_step();
        self.fence_pos = c;
        Ok(())
    }

    fn remove(&mut self, r: &Removal) -> usize {
        self.engine.begin_step();
        if let Some(w) = r.w_before {
            self.carry(w);
        }
        let w = self.engine.watermark();
        let mut removed = 0;
        for id in &r.ids {
            let gone = match (r.idle, w) {
                // A removal: the device is dropped (a tombstone kept while delayed fixes may
                // still come).
                (None, _) => self.engine.remove_device(id),
                // Idle expiry: forgotten entirely, if still idle.
                (Some(ttl), Some(w)) => {
                    self.engine.is_idle(id, IdleRule { ttl }, w) && self.engine.forget_device(id)
                }
                (Some(_), None) => false,
            };
            removed += usize::from(gone);
        }
        self.engine.end_step();
        removed
    }

    /// Advances the watermark to `w` (between records: a log that does not record its ticks
    /// carries the watermark reached in its next record), firing at most the fire cap; true when
    /// due timers were carried over to [`Driver::work_off`].
    pub fn advance(&mut self, w: Ts) -> bool {
        self.engine.begin_step();
        let carried = self.carry(w);
        self.engine.end_step();
        carried
    }

    /// Works off one more slice of the timers the fire cap carried over; true while some are
    /// still carried.
    pub fn work_off(&mut self) -> bool {
        match self.engine.watermark() {
            Some(w) if self.carried > 0 => self.advance(w),
            _ => {
                self.carried = 0;
                false
            }
        }
    }

    fn carry(&mut self, w: Ts) -> bool {
        let carried = self.engine.advance(w, &mut self.out).carried;
        self.carried = if carried {
            self.carried.saturating_add(1)
        } else {
            0
        };
        carried
    }

    /// Drops cancelled timers ahead of the wheel, looking at `budget` entries at most (between
    /// ticks, so that a tick meets live entries).
    pub fn sweep(&mut self, budget: usize) {
        if self.engine.stats().wheel.tombstones > 0 {
            self.engine.sweep(budget);
        }
    }

    /// The idle devices among the next `scan` device slots under `rule`, as the removal to log
    /// (applied when it comes back: a device that got a fix in between is kept). `None` when
    /// there are none, or no watermark yet.
    pub fn idle_removal(&mut self, rule: IdleRule, scan: usize) -> Option<Removal> {
        let w = self.engine.watermark()?;
        let ids = self.engine.expire_idle(rule, w, scan);
        (!ids.is_empty()).then(|| Removal {
            w_before: None,
            idle: Some(rule.ttl),
            ids: ids.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Freezes the state for a checkpoint at the last record applied: every device (`full`), or
    /// those changed since the last checkpoint. Its devices are then handed out by
    /// [`Driver::checkpoint_chunk`]; a freeze while one is running restarts it (the engine
    /// merges the two).
    pub fn freeze(&mut self, full: bool) -> Frozen {
        if full {
            self.engine.mark_all_dirty();
        }
        self.engine.checkpoint_begin();
        let f = Frozen {
            position: self.applied,
            fence_pos: self.fence_pos,
            watermark: self.engine.watermark(),
            recent: self.recent.snapshot(),
        };
        self.freeze = Some(f.clone());
        f
    }

    /// The running freeze, while devices are still to be handed out.
    pub fn frozen(&self) -> Option<&Frozen> {
        self.freeze.as_ref()
    }

    /// Hands out up to `max` frozen devices into `out`; true once the last was handed out (the
    /// freeze is then over).
    pub fn checkpoint_chunk(&mut self, max: usize, out: &mut Vec<DeviceState>) -> bool {
        let done = self.engine.checkpoint_next(max, out);
        if done {
            self.freeze = None;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fences::{FenceLimits, parse_fences_str};
    use crate::time::Dur;

    fn square() -> Arc<Fence> {
        let text = r#"{"type":"Feature","id":"depot","properties":{"dwell":["1m"]},
            "geometry":{"type":"Polygon","coordinates":[[[0,0],[0,1],[1,1],[1,0],[0,0]]]}}"#;
        Arc::new(
            parse_fences_str(text, &FenceLimits::default())
                .unwrap()
                .remove(0),
        )
    }

    struct One(Arc<Fence>);

    impl FenceSource for One {
        fn changes(&self, from: u64, to: u64) -> Result<Vec<FenceUpdate>, MissingFences> {
            match (from, to) {
                (0, 1) => Ok(vec![FenceUpdate::Put(self.0.clone())]),
                _ => Err(MissingFences { from, to }),
            }
        }
    }

    fn fix(ts: i64, lat: f64) -> Input {
        Input::Fixes {
            w_before: None,
            fixes: vec![(
                Fix::new("truck", Ts(ts), lat, 0.5, None, 64).unwrap(),
                Ts(ts),
            )],
        }
    }

    fn log() -> Vec<Input> {
        vec![
            Input::Fences(1),
            fix(1_000, 0.5),
            fix(2_000, 0.5),
            Input::Tick(Ts(70_000)),
            Input::Removed(Removal {
                w_before: None,
                idle: Some(Dur::from_secs(3600)),
                ids: vec!["truck".into()],
            }),
            fix(80_000, 5.0),
        ]
    }

    fn cfg() -> EngineConfig {
        EngineConfig {
            track_dirty: true,
            ..EngineConfig::default()
        }
    }

    fn run(records: &[Input], from: usize, driver: &mut Driver) -> Vec<Event> {
        let src = One(square());
        for (i, r) in records.iter().enumerate().skip(from) {
            driver.apply(i as u64 + 1, r, 0, &src).unwrap();
        }
        driver.take_events()
    }

    /// Replaying the same records gives the same events, and a record delivered again is
    /// skipped; a checkpoint taken mid-way and the records after it give the same end state.
    #[test]
    fn the_same_records_give_the_same_events_and_state_from_a_checkpoint_too() {
        let records = log();
        let mut a = Driver::new(Engine::new(cfg()), 0, 0);
        let events = run(&records, 0, &mut a);
        assert!(
            events.iter().any(|e| e.kind.as_str() == "dwell"),
            "{events:?}"
        );
        let mut b = Driver::new(Engine::new(cfg()), 0, 0);
        assert_eq!(run(&records, 0, &mut b), events);
        assert_eq!(
            b.apply(2, &records[1], 0, &One(square())),
            Ok(Applied::Skipped),
            "a record applied already is skipped"
        );
        // A checkpoint after three records, restored, then the rest.
        let mut c = Driver::new(Engine::new(cfg()), 0, 0);
        run(&records[..3], 0, &mut c);
        let frozen = c.freeze(true);
        assert_eq!((frozen.position, frozen.fence_pos), (3, 1));
        let mut devices = Vec::new();
        while !c.checkpoint_chunk(1, &mut devices) {}
        assert!(c.frozen().is_none());
        let (mut d, restored) = Driver::restore(cfg(), [square()], devices, frozen).unwrap();
        assert_eq!(restored.devices, 1);
        let tail = run(&records, 3, &mut d);
        assert_eq!(tail, events[events.len() - tail.len()..]);
        assert_eq!(d.engine().device("truck"), a.engine().device("truck"));
    }

    #[test]
    fn a_marker_beyond_the_fence_log_is_refused_and_changes_nothing() {
        let mut d = Driver::new(Engine::new(cfg()), 0, 0);
        assert_eq!(
            d.apply(1, &Input::Fences(2), 0, &One(square())),
            Err(MissingFences { from: 0, to: 2 })
        );
        assert_eq!((d.applied(), d.fence_pos()), (0, 0));
        assert_eq!(
            d.apply(1, &Input::Fences(0), 0, &NoFences),
            Ok(Applied::Fences),
            "a marker at or before the fence position applies nothing"
        );
    }

    /// A log that holds a part twice (a stream that stored a re-sent message again): the second
    /// copy is answered as duplicates and changes nothing; a part with a rejected fix is judged
    /// again when it comes again.
    #[test]
    fn a_part_the_log_holds_twice_is_a_duplicate_and_changes_nothing() {
        let two = |ts: i64| Input::Fixes {
            w_before: None,
            fixes: (0..2)
                .map(|k| {
                    let f = Fix::new("truck", Ts(ts + k), 0.5, 0.5, None, 64).unwrap();
                    (f, Ts(ts + k))
                })
                .collect(),
        };
        let records = [
            Input::Fences(1),
            two(1_000),
            two(5_000),
            Input::Tick(Ts(90_000)),
        ];
        let mut once = Driver::new(Engine::new(cfg()), 0, 0);
        let events = run(&records, 0, &mut once);
        let mut first = Driver::new(Engine::new(cfg()), 0, 0);
        let src = One(square());
        for (i, r) in records[..3].iter().enumerate() {
            first.apply(i as u64 + 1, r, 0, &src).unwrap();
        }
        let before = first.take_events();
        // The memory survives a checkpoint.
        let frozen = first.freeze(true);
        assert_eq!(frozen.recent.len(), 2);
        let mut devices = Vec::new();
        while !first.checkpoint_chunk(1, &mut devices) {}
        let (mut twice, _) = Driver::restore(cfg(), [square()], devices, frozen).unwrap();
        // Without the memory, the copy's fixes would be answered late.
        assert_eq!(
            twice.apply(4, &two(1_000), 0, &src),
            Ok(Applied::Fixes(vec![Ok(Ingested::Duplicate); 2]))
        );
        twice.apply(5, &records[3], 0, &src).unwrap();
        assert_eq!([before, twice.take_events()].concat(), events);
        assert_eq!(
            twice.engine().device("truck"),
            once.engine().device("truck")
        );

        // A device refused for want of room: its part is judged again.
        let full = EngineConfig {
            max_devices: 1,
            ..cfg()
        };
        let mut d = Driver::new(Engine::new(full), 0, 0);
        d.apply(1, &fix(1_000, 0.5), 0, &NoFences).unwrap();
        let other = Input::Fixes {
            w_before: None,
            fixes: vec![(
                Fix::new("van", Ts(2_000), 0.5, 0.5, None, 64).unwrap(),
                Ts(2_000),
            )],
        };
        for pos in [2, 3] {
            let Ok(Applied::Fixes(out)) = d.apply(pos, &other, 0, &NoFences) else {
                panic!("fixes");
            };
            assert!(out[0].is_err(), "refused each time: {out:?}");
        }
    }

    #[test]
    fn an_idle_removal_keeps_a_device_that_got_a_fix_in_between() {
        let mut d = Driver::new(Engine::new(cfg()), 0, 0);
        d.apply(1, &fix(1_000, 0.5), 0, &NoFences).unwrap();
        d.advance(Ts(10_000_000));
        let rule = IdleRule {
            ttl: Dur::from_secs(60),
        };
        let removal = d.idle_removal(rule, 100).expect("idle");
        d.apply(2, &fix(10_000_001, 0.5), 0, &NoFences).unwrap();
        assert_eq!(
            d.apply(3, &Input::Removed(removal.clone()), 0, &NoFences),
            Ok(Applied::Removed(0))
        );
        d.advance(Ts(20_000_000));
        assert_eq!(
            d.apply(4, &Input::Removed(removal), 0, &NoFences),
            Ok(Applied::Removed(1))
        );
    }
}
