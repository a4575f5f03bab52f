//! A partition's outbox: publishes the events its engine produces to the events stream, once
//! each, in order, and only while this node holds the partition.
//!
//! Each event is published with `Nats-Msg-Id` = its id (the stream drops a copy it has seen in
//! its duplicate window) and `Nats-Expected-Last-Subject-Sequence` = the sequence of the last
//! event on the partition's subject as this owner knows it (the stream refuses the publish when
//! anyone else published there since). So:
//! - a zombie (an owner paused past its lease, whose partition moved on) that wakes and publishes
//!   finds the subject moved on, checks its lease, finds it lost and stands down;
//! - the new owner, which suppresses by id every event the partition already published after
//!   its checkpoint (read at takeover), re-reads the subject when a publish is refused while
//!   it holds the lease, suppresses what it finds there, and goes on;
//! - an event whose publish timed out is published again with the same id and expectation: it
//!   is stored once;
//! - when the events stream elects a leader ([`super::elections`]), a publish waiting for its
//!   acknowledgement (or a retry waiting out its backoff) is sent again at once, not after the
//!   acknowledgement's 5 s timeout.
//!
//! The outbox publishes one event at a time per partition (the expectation needs the previous
//! event's sequence); partitions publish in parallel.
//!
//! Invariants: `acked` counts events handed in that are known to be in the stream (published,
//! or found there); [`Outbox::last`] is the subject's last sequence this owner knows; nothing is
//! published while the lease is not [`Lease::valid`].

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use tokio::sync::{mpsc, watch};

use super::lease::{Lease, read_stream};
use super::nats::{Nats, NatsError, ev_subject};
use crate::telemetry as t;
use geodwell_core::event::{Event, EventId};

/// Events queued per partition before its engine waits.
pub const QUEUE: usize = 4096;

/// The handle a partition task holds.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Event>,
    produced: Arc<AtomicU64>,
    state: watch::Receiver<Acked>,
}

/// How far the outbox got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acked {
    /// Events handed in that are in the stream.
    pub count: u64,
    /// The partition subject's last sequence as known.
    pub last: u64,
    /// The outbox stopped: the lease was lost (or the node stops).
    pub stopped: bool,
}

/// The events the partition's subject holds after `mark` (their ids), and its last sequence.
pub async fn published_after(
    nats: &Nats,
    p: u16,
    mark: u64,
) -> Result<(HashSet<u128>, u64), NatsError> {
    let msgs = read_stream(
        &nats.events,
        &ev_subject(p),
        DeliverPolicy::ByStartSequence {
            start_sequence: mark + 1,
        },
    )
    .await?;
    let mut last = mark;
    let mut ids = HashSet::with_capacity(msgs.len());
    for m in msgs {
        last = last.max(m.seq);
        if let Some(id) = m
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .and_then(|v| u128::from_str_radix(v.as_str(), 16).ok())
        {
            ids.insert(id);
        }
    }
    Ok((ids, last))
}

/// The last sequence on partition `p`'s events subject (0: none), from the stream leader.
pub async fn subject_last(nats: &Nats, p: u16) -> Result<u64, NatsError> {
    match nats
        .events
        .get_last_raw_message_by_subject(&ev_subject(p))
        .await
    {
        Ok(m) => Ok(m.sequence),
        Err(e)
            if e.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            Ok(0)
        }
        Err(e) => Err(NatsError::request("last event of a partition", e)),
    }
}

impl Outbox {
    /// Starts partition `p`'s outbox: the subject's last sequence is `last`, and `suppress`
    /// holds the ids already published since the checkpoint the engine started from.
    pub fn spawn(
        nats: Nats,
        p: u16,
        lease: Arc<Lease>,
        last: u64,
        suppress: HashSet<u128>,
    ) -> (Outbox, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (state_tx, state) = watch::channel(Acked {
            count: 0,
            last,
            stopped: false,
        });
        let task = tokio::spawn(run(nats, p, lease, rx, state_tx, suppress));
        (
            Outbox {
                tx,
                produced: Arc::new(AtomicU64::new(0)),
                state,
            },
            task,
        )
    }

    /// Queues events (waits while the queue is full). False once the outbox stopped.
    pub async fn send(&self, events: Vec<Event>) -> bool {
        for e in events {
            if self.tx.send(e).await.is_err() {
                return false;
            }
            self.produced.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// Events handed in so far.
    pub fn produced(&self) -> u64 {
        self.produced.load(Ordering::Acquire)
    }

    /// How far publishing got.
    pub fn acked(&self) -> Acked {
        *self.state.borrow()
    }

    /// Waits until `count` events are in the stream (true), or the outbox stopped (false).
    pub async fn wait_acked(&self, count: u64) -> bool {
        let mut rx = self.state.clone();
        let r = rx.wait_for(|a| a.count >= count || a.stopped).await;
        r.is_ok_and(|a| a.count >= count)
    }
}

async fn run(
    nats: Nats,
    p: u16,
    lease: Arc<Lease>,
    mut rx: mpsc::Receiver<Event>,
    state: watch::Sender<Acked>,
    mut suppress: HashSet<u128>,
) {
    let subject = ev_subject(p);
    let label = p.to_string();
    let mut elected = nats.elections.events();
    while let Some(ev) = rx.recv().await {
        let id = ev.id.0;
        if suppress.remove(&id) {
            metrics::counter!(t::CLUSTER_EVENTS_SUPPRESSED).increment(1);
            state.send_modify(|a| a.count += 1);
            continue;
        }
        let body = match serde_json::to_vec(&ev) {
            Ok(b) => bytes::Bytes::from(b),
            Err(e) => {
                // Unreachable for events the engine builds.
                tracing::error!(error = %e, "event not published");
                state.send_modify(|a| a.count += 1);
                continue;
            }
        };
        let msg_id = EventId(id).to_string();
        let mut backoff = Duration::from_millis(50);
        loop {
            if !lease.wait_valid().await {
                stop(&state);
                return;
            }
            let last = state.borrow().last;
            let msg = PublishMessage::build()
                .message_id(&msg_id)
                .expected_last_subject_sequence(last)
                .payload(body.clone());
            let started = std::time::Instant::now();
            let ack = match nats.js.send_publish(subject.clone(), msg).await {
                Ok(f) => tokio::select! {
                    a = std::future::IntoFuture::into_future(f) => Some(a),
                    Ok(()) = elected.changed() => None,
                },
                Err(e) => Some(Err(e)),
            };
            let Some(ack) = ack else {
                // The stream has a new leader: publish again at once, not after the
                // acknowledgement's timeout (a copy the old leader stored is found by the
                // expected last sequence).
                backoff = Duration::from_millis(50);
                continue;
            };
            match ack {
                Ok(a) if !a.duplicate => {
                    metrics::histogram!(t::CLUSTER_PUBLISH_SECONDS)
                        .record(started.elapsed().as_secs_f64());
                    metrics::counter!(t::EVENTS_EMITTED, "type" => ev.kind.as_str()).increment(1);
                    state.send_modify(|s| {
                        s.count += 1;
                        s.last = s.last.max(a.sequence);
                    });
                    break;
                }
                Ok(_) => {
                    // Already in the stream (a retried publish, or another owner's copy).
                    match subject_last(&nats, p).await {
                        Ok(l) => state.send_modify(|s| {
                            s.count += 1;
                            s.last = s.last.max(l);
                        }),
                        Err(_) => state.send_modify(|s| s.count += 1),
                    }
                    break;
                }
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                    // Someone else published on this partition's subject.
                    if !lease.valid() || lease.is_lost() {
                        stop(&state);
                        return;
                    }
                    metrics::counter!(t::CLUSTER_FENCED_PUBLISHES).increment(1);
                    match published_after(&nats, p, last).await {
                        Ok((ids, newest)) => {
                            suppress.extend(ids);
                            state.send_modify(|s| s.last = s.last.max(newest));
                            if suppress.remove(&id) {
                                state.send_modify(|s| s.count += 1);
                                break;
                            }
                        }
                        Err(err) => {
                            tracing::warn!(partition = %label, error = %err, "re-reading a partition's events");
                            tokio::time::sleep(backoff).await;
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(partition = %label, error = %e, "event publish failed; retrying");
                    metrics::counter!(t::CLUSTER_PUBLISH_RETRIES).increment(1);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        Ok(()) = elected.changed() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
    stop(&state);
}

fn stop(state: &watch::Sender<Acked>) {
    state.send_modify(|s| s.stopped = true);
}
