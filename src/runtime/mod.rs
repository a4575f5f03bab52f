//! The partition runtime: whatever the deployment, each partition is one tokio task ([`run`])
//! driving the core's sans-IO [`Driver`] with a [`Backend`] that feeds it and carries its output.
//!
//! The driver is the only code that applies input, fires timers, works off carried timers,
//! sweeps idle devices and cuts checkpoint chunks; the task is the only code that drives it (the
//! clock, the order of work, yielding between slices). What differs between a single process and
//! a cluster node lives behind [`Backend`], with one implementation each:
//!
//! | seam | one process (`crate::shard`) | cluster node (`crate::cluster::partition`) |
//! | --- | --- | --- |
//! | the partition's log: records in order, with positions | the shard's queue, numbered by the shard; records are committed with the step's events by the publisher | the partition's subject of the input stream, read by an ordered consumer |
//! | ticks and records the partition makes (idle removals) | applied at once; the next record carries the watermark reached | written to the input stream, applied when they come back |
//! | who waits for a record's outcome | the request, answered once the step is durable | the ingesting node, sent the outcomes on NATS |
//! | where events go (the event sink) | the publisher: `seq` stamped, group commit, then the event log | the outbox: the events stream, whose sequence is the public `seq` |
//! | checkpoints ([`CheckpointStorage`]) | the checkpoint writer (`checkpoint.redb`), every partition in one round | one object per partition, and its pointer |
//! | ownership ([`Ownership`]) | always owned ([`Always`]) | a lease; the task ends when it is lost |
//!
//! Invariants of the task: records are applied in the order the backend delivers them (log
//! order); after every piece of work the engine is brought up to the clock's watermark through
//! [`Backend::tick`], whose backend decides whether that is an advance or a record; carried
//! timers are worked off one slice at a time with a yield between slices, so input is taken in
//! between; nothing the driver produced is dropped: events go to [`Backend::flush`] after every
//! step.

mod task;

use std::time::Instant;

use geodwell_core::engine::{DeviceState, Engine};
use geodwell_core::partition::{Applied, Driver, FenceSource, Frozen, Input};
use geodwell_core::time::Ts;

pub(crate) use task::sleep_until;
pub use task::{CHECKPOINT_CHUNK, IDLE_EVERY, PartitionCtx, run};

/// What a partition task is given to do next.
pub enum Work<T> {
    /// A record of the partition's log, at position `pos`, with whoever waits for what it did.
    Record {
        /// Its position in the log.
        pos: u64,
        /// The record.
        input: Input,
        /// The arrival token events decided by its fixes carry (0: none).
        arrival: u64,
        /// The backend's note of who waits (given back with the outcome).
        ticket: T,
    },
    /// A read of the engine, answered at once.
    Query(Query),
    /// Freeze the state for a checkpoint: every device (`full`) or those changed since the last.
    Checkpoint {
        /// Every device.
        full: bool,
    },
    /// The checkpoint storage has room for the next chunk of the running freeze.
    CheckpointRoom,
    /// Nothing to apply; look at the clock and the carried timers again.
    Wake,
    /// Go on from this driver instead (the partition was rebuilt from its durable log).
    Reset(Box<Driver>),
    /// The partition stops: its log is closed (shutdown, after what was queued) or the
    /// partition is no longer this node's.
    Stop(Stop),
}

/// A read of a partition's engine: a closure given the engine (it answers its asker itself).
pub type Query = Box<dyn FnOnce(&Engine) + Send>;

/// Why a partition task stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Asked to (shutdown, or a handover): a final checkpoint is in order.
    Asked,
    /// The partition is no longer this node's (its lease was lost, or its sink stopped): stand
    /// down at once.
    Lost,
    /// A fence marker names changes this node's fence log does not hold.
    Failed(geodwell_core::partition::MissingFences),
}

/// What a deployment provides a partition task: its log, its event sink, its checkpoint
/// storage and its ownership, in its own terms (see the module's table).
pub trait Backend: Send {
    /// Who waits for a record's outcome.
    type Ticket: Send;
    /// How the task ended, as the backend reports it.
    type Ended: Send;
    /// Where the partition's checkpoints go.
    type Checkpoints: CheckpointStorage;
    /// Whether this node still owns the partition.
    type Owner: Ownership;

    /// The next piece of work (records in log order; queries; checkpoint room; the end).
    fn next(&mut self, driver: &Driver) -> impl Future<Output = Work<Self::Ticket>> + Send;

    /// Where the log's fence markers resolve.
    fn fences(&self) -> &dyn FenceSource;

    /// The driver applied `input` (`w_before`: its watermark just before); answers the ticket
    /// and hands the step's events on. False once the partition must stop (its sink is gone).
    fn applied(
        &mut self,
        driver: &mut Driver,
        step: AppliedStep<'_, Self::Ticket>,
    ) -> impl Future<Output = bool> + Send;

    /// Hands on the events the driver produced outside a record (advances, carried slices).
    /// False once the partition must stop.
    fn flush(&mut self, driver: &mut Driver) -> impl Future<Output = bool> + Send;

    /// The clock's watermark is `w`: advance the driver now, or write a tick record to apply
    /// when it comes back, or neither (the backend knows whether it may yet).
    fn tick(&mut self, driver: &mut Driver, w: Ts) -> impl Future<Output = ()> + Send;

    /// A record the partition made itself (an idle removal): into the log, to be delivered by
    /// [`Backend::next`] in its turn.
    fn append(&mut self, driver: &Driver, input: Input) -> impl Future<Output = ()> + Send;

    /// The partition's checkpoint storage.
    fn checkpoints(&mut self) -> &mut Self::Checkpoints;

    /// The partition's ownership (a handle, watched beside [`Backend::next`]).
    fn owner(&self) -> Self::Owner;

    /// Every few hundred milliseconds: the backend's upkeep (gauges, a finished checkpoint's
    /// pointer, fence markers to write).
    fn housekeeping(&mut self, driver: &Driver) -> impl Future<Output = ()> + Send;

    /// The task ends: what the backend does last (a final checkpoint) and how it reports it.
    fn finish(self, driver: Driver, stop: Stop) -> impl Future<Output = Self::Ended> + Send;
}

/// Where a partition's checkpoints go. The driver decides what a checkpoint holds (a freeze of
/// every device, or of those changed since the last) and cuts it into chunks, one at a time
/// between other work, when the backend's [`Backend::next`] says the storage has room
/// ([`Work::CheckpointRoom`]); the storage only keeps them: one checkpoint path, two places
/// to keep it (`checkpoint.redb` through the checkpoint writer in one process, an object and
/// its pointer in a cluster).
pub trait CheckpointStorage: Send {
    /// A freeze began at `at`.
    fn frozen(&mut self, at: Frozen);

    /// A chunk of the running freeze's devices (`done`: the last).
    fn chunk(&mut self, at: Frozen, devices: Vec<DeviceState>, done: bool);
}

/// Whether this node owns the partition: in one process always ([`Always`]), on a cluster node
/// while its lease holds. The task stops at once ([`Stop::Lost`]) when it is gone, whatever
/// the backend was waiting for.
pub trait Ownership: Send + Sync + Clone + 'static {
    /// Resolves once the partition is no longer this node's (never, for [`Always`]).
    fn gone(&self) -> impl Future<Output = ()> + Send;
}

/// The ownership of a partition in one process: always owned.
#[derive(Debug, Clone, Copy)]
pub struct Always;

impl Ownership for Always {
    async fn gone(&self) {
        std::future::pending::<()>().await;
    }
}

/// One record as the driver applied it, for [`Backend::applied`].
pub struct AppliedStep<'a, T> {
    /// Its position.
    pub pos: u64,
    /// The record.
    pub input: &'a Input,
    /// The engine's watermark just before it.
    pub w_before: Option<Ts>,
    /// What it did.
    pub applied: Applied,
    /// Who waits.
    pub ticket: T,
    /// When the task took it (for the latency metrics).
    pub taken: Instant,
}
