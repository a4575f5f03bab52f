//! The events stream, read into this node's event log: every node's `GET /v1/events`, event
//! WebSockets and webhook sinks read the same events in the same order, the stream's.
//!
//! The log starts at most `log_capacity` events before the stream's end and follows it with an
//! ordered consumer. An event's `seq` is its stream sequence: gap-free, because nothing but
//! events goes into the stream and nothing is deleted from its middle.
//!
//! When the events stream elects a leader ([`super::elections`]), the consumer is re-created at
//! once from the log's next `seq` (the old one may have died with its server).
//!
//! Invariant: events enter the log in stream order without a gap; when retention removed events
//! the feed had not read yet (it fell behind by more than the stream keeps), the log continues
//! after the gap ([`EventLog::skip_to`]) and says so.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::hedge;
use super::nats::{Nats, NatsError};
use crate::events::compact::{CompactEvent, Interner};
use crate::events::{EventLog, LoggedEvent};
use crate::telemetry as t;

/// Events appended to the log per batch at most.
const BATCH: usize = 512;

/// The stream's first and last sequence now.
async fn bounds(nats: &Nats) -> Result<(u64, u64), NatsError> {
    let info = nats
        .events
        .get_info()
        .await
        .map_err(|e| NatsError::request("events stream info", e))?;
    Ok((info.state.first_sequence, info.state.last_sequence))
}

/// An event log for this node, positioned at most `capacity` events before the stream's end,
/// and the stream's last sequence now (the feed has caught up once the log passed it).
pub async fn open_log(
    nats: &Nats,
    capacity: usize,
    max_age: geodwell_core::time::Dur,
) -> Result<(Arc<EventLog>, u64), NatsError> {
    let (first, last) = bounds(nats).await?;
    let start = first.max(1).max((last + 1).saturating_sub(capacity as u64));
    Ok((Arc::new(EventLog::new(capacity, max_age, start)), last))
}

/// Follows the events stream into `log` until `stop`; `caught` turns true once the log has
/// reached the stream's end as it was when the feed started.
pub async fn follow(
    nats: Nats,
    log: Arc<EventLog>,
    target: u64,
    caught: watch::Sender<bool>,
    stop: CancellationToken,
) {
    if log.next_seq() > target {
        caught.send_replace(true);
    }
    let mut elected = nats.elections.events();
    let mut backoff = FIRST_BACKOFF;
    while !stop.is_cancelled() {
        let started = std::time::Instant::now();
        match follow_once(&nats, &log, target, &caught, &stop, &mut elected).await {
            Ok(Followed::Stopped) => return,
            // A new leader: a new consumer at once (the old one may have died with its server).
            Ok(Followed::Elected) => backoff = FIRST_BACKOFF,
            Err(e) => {
                tracing::warn!(error = %e, "following the events stream; retrying");
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = FIRST_BACKOFF;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The first wait before following the stream again after an error.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Why one consumer's following ended without an error.
enum Followed {
    /// The node stops.
    Stopped,
    /// The events stream has a new leader.
    Elected,
}

/// The events stream from sequence `from`, through an ordered consumer.
async fn consumer(nats: &Nats, from: u64) -> Result<pull::Ordered, NatsError> {
    let consumer = nats
        .events
        .create_consumer(pull::OrderedConfig {
            filter_subject: "geodwell.ev.*".into(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| NatsError::request("events consumer", e))?;
    consumer
        .messages()
        .await
        .map_err(|e| NatsError::request("events consumer", e))
}

async fn follow_once(
    nats: &Nats,
    log: &EventLog,
    target: u64,
    caught: &watch::Sender<bool>,
    stop: &CancellationToken,
    elected: &mut watch::Receiver<u64>,
) -> Result<Followed, NatsError> {
    let from = log.next_seq();
    let mut messages = hedge::hedged(hedge::IN_FLIGHT, || consumer(nats, from))
        .await
        .map_err(|e| NatsError::hedged("events consumer", e))?;
    let mut interner = Interner::default();
    let mut batch: Vec<LoggedEvent> = Vec::with_capacity(BATCH);
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok(Followed::Stopped),
            Ok(()) = elected.changed() => return Ok(Followed::Elected),
            m = messages.next() => m,
        };
        let mut next = first;
        loop {
            let m = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Err(NatsError::request("events stream", e)),
                None => return Err(NatsError::request("events stream", "consumer ended")),
            };
            let info = m
                .info()
                .map_err(|e| NatsError::request("events stream message", e))?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            let expected = log.next_seq() + batch.len() as u64;
            if seq < expected {
                // Already held (the consumer was re-created).
            } else {
                if seq > expected {
                    append(log, &mut batch);
                    tracing::warn!(
                        from = expected,
                        to = seq,
                        "events the stream no longer holds were skipped (this node fell behind its retention)"
                    );
                    metrics::counter!(t::CLUSTER_FEED_SKIPPED).increment(seq - expected);
                    log.skip_to(seq);
                }
                let text = std::str::from_utf8(&m.payload).unwrap_or("");
                match CompactEvent::from_json(text, &mut interner) {
                    Ok((_, compact)) => batch.push(LoggedEvent::new(seq, compact, None)),
                    Err(e) => {
                        // Written by a geodwell node; a message that is not an event cannot
                        // take a seq in the log without breaking it.
                        tracing::error!(seq, error = %e, "an events stream message is not an event; the log stops here");
                        return Err(NatsError::Corrupt {
                            what: format!("event {seq}"),
                            source: e.into(),
                        });
                    }
                }
            }
            if pending == 0 || batch.len() >= BATCH {
                append(log, &mut batch);
                if log.next_seq() > target {
                    caught.send_if_modified(|c| !std::mem::replace(c, true));
                }
            }
            if pending == 0 {
                break;
            }
            next = match tokio::time::timeout(Duration::from_millis(50), messages.next()).await {
                Ok(m) => m,
                Err(_) => {
                    append(log, &mut batch);
                    break;
                }
            };
        }
    }
}

fn append(log: &EventLog, batch: &mut Vec<LoggedEvent>) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = log.append_stamped(std::mem::take(batch)) {
        tracing::error!(error = %e, "events not appended to the log");
    }
}
