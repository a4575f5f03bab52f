//! Stream leader elections as the NATS servers announce them, so that a reader of a stream
//! re-creates its consumer as soon as the stream has a new leader.
//!
//! A partition reads its input, and every node reads the events stream, through ordered
//! consumers: single-replica consumers that live on one server (the stream leader's when they
//! were made). When that server dies, the client library notices only after two missed idle
//! heartbeats and then retries with a backoff that reaches 10 s, so a partition's events could
//! stop for 10 s and more after JetStream had a new leader. The servers publish
//! `$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.<stream>` in the stream's account when a leader is
//! elected; each node subscribes once and its readers re-create their consumers on it.
//!
//! An advisory sent while this node was disconnected is lost, so a reconnection counts as an
//! election of both streams.
//!
//! Invariant: a stream's count of elections only grows; a reader acts on a change of it (a
//! `watch`), so an election it heard while busy is acted on once, not lost.

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::watch;

use crate::telemetry as t;

/// The subject prefix of the servers' leader-elected advisories.
const ADVISORY: &str = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.";

/// The leader elections heard of the input stream and the events stream.
#[derive(Debug, Clone)]
pub struct Elections {
    input: watch::Receiver<u64>,
    events: watch::Receiver<u64>,
}

/// What announces elections to [`Elections`]: the servers' advisories, and this node's
/// reconnections (an advisory sent while the node was disconnected is lost, so a reconnection
/// counts as an election of both streams).
#[derive(Debug, Clone)]
pub struct Announcer {
    input: Arc<watch::Sender<u64>>,
    events: Arc<watch::Sender<u64>>,
}

/// A pair that announces to, and reads, the same elections.
pub fn channels() -> (Announcer, Elections) {
    let (in_tx, in_rx) = watch::channel(0u64);
    let (ev_tx, ev_rx) = watch::channel(0u64);
    (
        Announcer {
            input: Arc::new(in_tx),
            events: Arc::new(ev_tx),
        },
        Elections {
            input: in_rx,
            events: ev_rx,
        },
    )
}

impl Announcer {
    /// The node's connection to NATS came back: both streams may have new leaders.
    pub fn reconnected(&self) {
        self.input.send_modify(|n| *n += 1);
        self.events.send_modify(|n| *n += 1);
        tracing::info!("connected to NATS (again); stream readers re-create their consumers");
    }

    /// Subscribes to the advisories of streams `input` and `events` (a task counts them until
    /// the connection ends).
    pub async fn follow(
        self,
        client: &async_nats::Client,
        input: &str,
        events: &str,
    ) -> Result<(), async_nats::SubscribeError> {
        let mut sub = client.subscribe(format!("{ADVISORY}*")).await?;
        let (input, events) = (input.to_string(), events.to_string());
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let stream = m.subject.as_str().strip_prefix(ADVISORY).unwrap_or("");
                let (tx, label) = if stream == input {
                    (&self.input, "input")
                } else if stream == events {
                    (&self.events, "events")
                } else {
                    continue;
                };
                tx.send_modify(|n| *n += 1);
                metrics::counter!(t::CLUSTER_LEADER_ELECTIONS, "stream" => label).increment(1);
                tracing::info!(
                    stream,
                    "stream leader elected; its readers re-create their consumers"
                );
            }
        });
        Ok(())
    }
}

impl Elections {
    /// The input stream's elections from now on.
    pub fn input(&self) -> watch::Receiver<u64> {
        fresh(&self.input)
    }

    /// The events stream's elections from now on.
    pub fn events(&self) -> watch::Receiver<u64> {
        fresh(&self.events)
    }
}

fn fresh(rx: &watch::Receiver<u64>) -> watch::Receiver<u64> {
    let mut rx = rx.clone();
    rx.mark_unchanged();
    rx
}
