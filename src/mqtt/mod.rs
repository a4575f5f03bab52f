//! MQTT ingest: fixes from topics of an MQTT broker (OwnTracks' MQTT mode and generic JSON),
//! through the same validation, stamping, durability, batch bound and memory budget as
//! `POST /v1/fixes`.
//!
//! The connection speaks MQTT 5, for two of its rules that bound what a broker may send:
//! - **Maximum Packet Size** (sent in CONNECT as `ingest.max_body_bytes` plus room for the topic):
//!   the broker must not send a larger message to us; it drops it as if delivered (MQTT 5
//!   section 3.1.2.11.4). An oversized message is therefore never read, and never redelivered:
//!   with MQTT 3.1.1 the client could only drop the connection on it, and the broker would send
//!   it again at every reconnect, stalling all ingest for ever.
//! - **Receive Maximum** ([`RECEIVE_MAXIMUM`]): at most that many QoS 1 messages are in flight
//!   to us unacknowledged.
//!
//! Invariants:
//! - A message is acknowledged to the broker (QoS 1 PUBACK, manual acks) only after the batch
//!   holding its fixes was answered by ingest, i.e. once its effects are durable; a message read
//!   but not acknowledged (a crash, a shutdown, a broker gone) is delivered again by the broker,
//!   which keeps the session under the stable client id (`clean_start = false`, a session that
//!   does not expire). A fix seen twice is a duplicate to the engine, so redelivery changes no
//!   event.
//! - Acknowledgements go out in the order the messages came (MQTT asks it of QoS 1).
//! - Every message read holds the ingest memory budget from the moment it is read until it is
//!   acknowledged: its payload, then what its fixes hold ([`crate::ingest::ITEM_HOLD_BYTES`] each;
//!   an OwnTracks payload, parsed into a JSON tree, [`crate::budget::TREE_HOLD_FACTOR`] times
//!   its size). While the budget is full no message is read (TCP backpressure holds the broker).
//! - Messages read but not yet parsed hold at most a quarter of the budget ([`ReadAhead`]), and a
//!   message may hold at most the other three quarters once parsed: so the worker can always
//!   parse the message in front of it once other users of the budget give theirs back, and
//!   never waits for room that only the messages queued behind it hold. A message that could
//!   never fit is rejected.
//! - A batch holds at most `ingest.max_batch` fixes and [`BATCH`] messages; a message holding more
//!   fixes than `ingest.max_batch` is one rejected item, as HTTP answers such a body 413.
//! - A batch refused as a whole (queues full, store unavailable) is retried, not acknowledged
//!   and not dropped; an unreadable or rejected message is counted as a rejected fix and
//!   acknowledged, so it cannot come back.
//! - The connection is retried with doubling backoff (0.5 s to 30 s) for as long as the service
//!   runs; its state is the gauge `geodwell_mqtt_connected`, `GET /readyz`'s `mqtt` and the
//!   counter `geodwell_mqtt_connects_total{outcome}`; `geodwell_mqtt_queued_messages` counts the
//!   messages read and not yet acknowledged.

pub mod message;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{counter, gauge};
use rumqttc::Transport;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, Publish, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::budget::{MemoryBudget, Reservation};
use crate::config::MqttConfig;
use crate::ingest::{BatchError, Charge, Ingest};
use crate::outbound::{mqtt_tls, redact_credentials};
use crate::telemetry as t;
use crate::wire::ItemError;
use crate::wire::trackers::percent_decode;
use geodwell_core::fix::Fix;
use message::Parsed;

/// Messages read from the broker and waiting for the worker (the memory budget is the bound
/// that matters; this one keeps the channel finite).
pub const QUEUE: usize = 1024;
/// Messages per ingest batch at most (fewer when fewer are waiting or `ingest.max_batch` fixes
/// are reached first).
pub const BATCH: usize = 256;
/// QoS 1 messages the broker may have in flight to us unacknowledged (MQTT 5 Receive Maximum).
pub const RECEIVE_MAXIMUM: u16 = 512;
/// Room for the topic and properties above the payload limit, in the Maximum Packet Size.
const PACKET_OVERHEAD: usize = 64 * 1024;
/// MQTT keep-alive.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// The longest wait between two looks at a full memory budget.
const BUDGET_WAIT_MAX: Duration = Duration::from_millis(500);

/// The connection's state, for `/readyz`.
#[derive(Debug, Default)]
pub struct MqttStatus {
    connected: AtomicBool,
    last_error: Mutex<Option<String>>,
}

/// `GET /readyz`'s view of the MQTT connection.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct MqttReady {
    /// Whether the broker connection is up.
    pub connected: bool,
    /// The last connection error, if any.
    #[schema(required = true)]
    pub last_error: Option<String>,
}

impl MqttStatus {
    /// Its state now.
    pub fn ready(&self) -> MqttReady {
        MqttReady {
            connected: self.connected.load(Ordering::Relaxed),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn set(&self, up: bool, error: Option<String>) {
        self.connected.store(up, Ordering::Relaxed);
        gauge!(t::MQTT_CONNECTED).set(if up { 1.0 } else { 0.0 });
        if error.is_some() {
            *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
        }
    }
}

/// What MQTT ingest is bounded by: the service's own ingest limits.
#[derive(Debug, Clone)]
pub struct MqttLimits {
    /// Largest payload (`ingest.max_body_bytes`).
    pub max_bytes: usize,
    /// Most fixes per batch, and per message (`ingest.max_batch`).
    pub max_batch: usize,
    /// The ingest memory budget.
    pub budget: MemoryBudget,
}

/// Messages read and not yet acknowledged, shown as `geodwell_mqtt_queued_messages`.
#[derive(Debug, Clone, Default)]
struct Held(Arc<AtomicUsize>);

impl Held {
    fn add(&self, n: usize) {
        let now = self.0.fetch_add(n, Ordering::Relaxed) + n;
        gauge!(t::MQTT_QUEUED).set(now as f64);
    }

    fn sub(&self, n: usize) {
        let now = self.0.fetch_sub(n, Ordering::Relaxed) - n;
        gauge!(t::MQTT_QUEUED).set(now as f64);
    }
}

/// Payload bytes of messages read but not yet parsed, bounded to a quarter of the budget (see
/// the module docs: the worker's room to parse).
#[derive(Debug, Clone)]
struct ReadAhead {
    queued: Arc<AtomicUsize>,
    cap: usize,
}

impl ReadAhead {
    fn new(budget: &MemoryBudget) -> ReadAhead {
        ReadAhead {
            queued: Arc::new(AtomicUsize::new(0)),
            cap: budget.total() / 4,
        }
    }

    /// Takes `n` bytes when they fit (one message always fits an empty read-ahead).
    fn try_take(&self, n: usize) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q == 0 || q + n <= self.cap).then_some(q + n)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
    }

    /// The most a parsed message may hold: the budget less the read-ahead.
    fn ceiling(&self, budget: &MemoryBudget) -> usize {
        budget.total() - self.cap
    }
}

/// A message read from the broker with the budget it holds.
struct Msg {
    publish: Publish,
    hold: Reservation,
    /// The part of `hold` that stands for the payload.
    payload_share: usize,
    /// Whether its payload could never fit the budget (it is rejected unread).
    too_large: bool,
}

impl Msg {
    /// Back to holding its payload alone (a read that did not fit gives back what it took).
    fn reset(&mut self) {
        let extra = self.hold.bytes().saturating_sub(self.payload_share);
        self.hold.release(extra);
    }

    /// Its fixes are read: the payload goes (the acknowledgement needs only the packet id), and
    /// with it its place in the read-ahead.
    fn drop_payload(&mut self, ahead: &ReadAhead) {
        self.publish.payload = bytes::Bytes::new();
        let share = std::mem::take(&mut self.payload_share);
        self.hold.release(share);
        ahead.give(share);
    }
}

/// Starts reading fixes from the broker of `cfg` into `st`'s ingest until `stop`; the task is
/// tracked by `tasks`, so shutdown waits for its last batch and acknowledgements. `st` is
/// whatever holds the service's ingest (the service's state).
pub fn spawn<S: AsRef<Ingest> + Send + Sync + 'static>(
    cfg: MqttConfig,
    st: Arc<S>,
    limits: MqttLimits,
    tasks: &tokio_util::task::TaskTracker,
    status: Arc<MqttStatus>,
    stop: CancellationToken,
) {
    gauge!(t::MQTT_CONNECTED).set(0.0);
    gauge!(t::MQTT_QUEUED).set(0.0);
    tasks.spawn(run(cfg, st, limits, status, stop));
}

fn options(cfg: &MqttConfig, max_bytes: usize) -> Result<MqttOptions, String> {
    let u = reqwest::Url::parse(&cfg.url).map_err(|e| e.to_string())?;
    let tls = u.scheme() == "mqtts";
    let host = u.host_str().unwrap_or_default().to_string();
    let port = u.port().unwrap_or(if tls { 8883 } else { 1883 });
    let mut o = MqttOptions::new(cfg.client_id.clone(), host, port);
    o.set_keep_alive(KEEP_ALIVE);
    o.set_clean_start(false);
    // The session outlives the connection (MQTT 5's default ends it at disconnect): messages
    // that arrive while geodwell is down wait for it, as MQTT 3.1.1's persistent sessions do.
    o.set_session_expiry_interval(Some(u32::MAX));
    o.set_manual_acks(true);
    o.set_receive_maximum(Some(RECEIVE_MAXIMUM));
    let max_packet = u32::try_from(max_bytes.saturating_add(PACKET_OVERHEAD)).unwrap_or(u32::MAX);
    o.set_max_packet_size(Some(max_packet));
    if !u.username().is_empty() {
        o.set_credentials(
            percent_decode(u.username(), false),
            u.password()
                .map(|p| percent_decode(p, false))
                .unwrap_or_default(),
        );
    }
    if tls {
        o.set_transport(Transport::tls_with_config(mqtt_tls()?));
    }
    Ok(o)
}

async fn run<S: AsRef<Ingest> + Send + Sync + 'static>(
    cfg: MqttConfig,
    st: Arc<S>,
    limits: MqttLimits,
    status: Arc<MqttStatus>,
    stop: CancellationToken,
) {
    let opts = match options(&cfg, limits.max_bytes) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "MQTT ingest cannot start");
            status.set(false, Some(e));
            return;
        }
    };
    // The URL as logs show it (no credentials).
    let shown = redact_credentials(&cfg.url);
    let (client, mut el) = AsyncClient::new(opts, QUEUE);
    let (tx, rx) = mpsc::channel::<Msg>(QUEUE);
    let held = Held::default();
    let budget = limits.budget.clone();
    let ahead = ReadAhead::new(&budget);
    let worker = tokio::spawn(work(
        rx,
        client.clone(),
        st,
        (limits, ahead.clone()),
        held.clone(),
        stop.clone(),
    ));
    let mut tx = Some(tx);
    let mut backoff = Duration::from_millis(500);
    let mut worker = std::pin::pin!(worker);
    loop {
        let ev = tokio::select! {
            // Stopping: no new message is taken; the worker finishes what it holds (its acks
            // need this loop to keep polling), then we disconnect.
            _ = stop.cancelled(), if tx.is_some() => { tx = None; continue; }
            _ = &mut worker => break,
            ev = el.poll() => ev,
        };
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(a))) => {
                counter!(t::MQTT_CONNECTS, "outcome" => "connected").increment(1);
                status.set(true, None);
                backoff = Duration::from_millis(500);
                tracing::info!(url = %shown, session_present = a.session_present, topics = ?cfg.topics, "MQTT connected");
                let filters = cfg
                    .topics
                    .iter()
                    .map(|t| Filter::new(t.clone(), QoS::AtLeastOnce));
                if let Err(e) = client.try_subscribe_many(filters) {
                    tracing::warn!(error = %e, "MQTT subscribe could not be queued");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(a))) => {
                let failed = a
                    .return_codes
                    .iter()
                    .filter(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                    .count();
                if failed > 0 {
                    tracing::error!(failed, topics = ?cfg.topics, codes = ?a.return_codes, "the broker refused MQTT subscriptions (check its ACLs)");
                }
            }
            // A message read after the stop (`tx` gone) is left unacknowledged for the next
            // session.
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let Some(tx_now) = &tx else { continue };
                let Some(msg) = hold(p, &budget, &ahead, &stop).await else {
                    continue;
                };
                held.add(1);
                if tx_now.send(msg).await.is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                let was_up = status.connected.load(Ordering::Relaxed);
                let refused = matches!(e, rumqttc::v5::ConnectionError::ConnectionRefused(_));
                let outcome = if refused { "refused" } else { "failed" };
                counter!(t::MQTT_CONNECTS, "outcome" => outcome).increment(1);
                status.set(false, Some(e.to_string()));
                if refused {
                    tracing::warn!(url = %shown, error = %e, "MQTT connection refused (the broker must speak MQTT 5)");
                } else if was_up {
                    tracing::warn!(url = %shown, error = %e, "MQTT connection lost; reconnecting");
                } else {
                    tracing::debug!(url = %shown, error = %e, retry_in = ?backoff, "MQTT connection failed");
                }
                tokio::select! {
                    _ = &mut worker => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
    disconnect(&client, &mut el).await;
    status.set(false, None);
}

/// The budget share of a payload as read: an OwnTracks payload is parsed into a JSON tree, any
/// other is located in place and its fixes charged as they are read.
fn payload_hold(topic: &[u8], payload_len: usize) -> usize {
    if message::is_owntracks(topic) {
        payload_len.saturating_mul(crate::budget::TREE_HOLD_FACTOR)
    } else {
        payload_len
    }
}

/// Holds a message's share of the budget, waiting (not reading more) while the budget is full.
/// `None` when the service stops first: the message stays unacknowledged for the next session.
async fn hold(
    p: Publish,
    budget: &MemoryBudget,
    ahead: &ReadAhead,
    stop: &CancellationToken,
) -> Option<Msg> {
    let need = payload_hold(&p.topic, p.payload.len());
    if need > ahead.ceiling(budget) {
        return Some(Msg {
            publish: p,
            hold: budget.empty(),
            payload_share: 0,
            too_large: true,
        });
    }
    let mut wait = Duration::from_millis(5);
    loop {
        if ahead.try_take(need) {
            if let Ok(hold) = budget.try_reserve(need) {
                return Some(Msg {
                    publish: p,
                    hold,
                    payload_share: need,
                    too_large: false,
                });
            }
            ahead.give(need);
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(BUDGET_WAIT_MAX);
    }
}

/// Sends the acknowledgements still queued and a DISCONNECT, within a second.
async fn disconnect(client: &AsyncClient, el: &mut EventLoop) {
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            match el.poll().await {
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

type Fixes = Vec<Result<Fix, ItemError>>;

/// A batch being gathered: its messages (to acknowledge) and their fixes.
#[derive(Default)]
struct Batch {
    msgs: Vec<Msg>,
    fixes: Fixes,
}

/// What reading one message gave.
enum Read {
    Fixes(Fixes),
    /// Its fixes do not fit the budget now: try again once the batch before it is answered.
    NoRoom,
}

/// Takes messages in batches, ingests them, and acknowledges them once durable.
async fn work<S: AsRef<Ingest> + Send + Sync + 'static>(
    mut rx: mpsc::Receiver<Msg>,
    client: AsyncClient,
    st: Arc<S>,
    (limits, ahead): (MqttLimits, ReadAhead),
    held: Held,
    stop: CancellationToken,
) {
    // A message read but not taken into the last batch, with its fixes once read (they would
    // have made the batch too large), or without (they did not fit the budget beside it).
    let mut carry: Option<(Msg, Option<Fixes>)> = None;
    loop {
        let first = match carry.take() {
            Some(c) => c,
            None => match rx.recv().await {
                Some(m) => (m, None),
                None => return,
            },
        };
        let mut batch = Batch::default();
        let mut next = Some(first);
        while let Some((mut m, done)) = next.take() {
            let r = match done {
                Some(f) => Read::Fixes(f),
                None => read(&st, &mut m, &limits, &ahead),
            };
            match r {
                // A message alone never holds more than max_batch fixes (`message::parse`).
                Read::Fixes(f)
                    if batch.msgs.is_empty() || batch.fixes.len() + f.len() <= limits.max_batch =>
                {
                    batch.fixes.extend(f);
                    batch.msgs.push(m);
                }
                Read::Fixes(f) => {
                    carry = Some((m, Some(f)));
                    break;
                }
                Read::NoRoom if batch.msgs.is_empty() => {
                    // Nothing of ours holds the budget: wait for others to give it back.
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(BUDGET_WAIT_MAX) => {}
                    }
                    next = Some((m, None));
                    continue;
                }
                Read::NoRoom => {
                    carry = Some((m, None));
                    break;
                }
            }
            if batch.msgs.len() < BATCH {
                next = rx.try_recv().ok().map(|m| (m, None));
            }
        }
        counter!(t::MQTT_MESSAGES).increment(batch.msgs.len() as u64);
        if !batch.fixes.is_empty() && !submit((*st).as_ref(), batch.fixes, &stop).await {
            // Shutting down with this batch not taken: it stays unacknowledged.
            return;
        }
        for m in &batch.msgs {
            if client.ack(&m.publish).await.is_err() {
                return;
            }
        }
        held.sub(batch.msgs.len());
    }
}

/// Reads one message's fixes, charging what they hold to its reservation. A message that
/// cannot be read, holds too many fixes or could never fit the budget is one rejected item.
fn read<S: AsRef<Ingest>>(
    st: &Arc<S>,
    m: &mut Msg,
    limits: &MqttLimits,
    ahead: &ReadAhead,
) -> Read {
    let ingest = (**st).as_ref();
    let topic = String::from_utf8_lossy(&m.publish.topic).into_owned();
    let too_large = || {
        ItemError::InvalidFix(format!(
            "the message is {} bytes; its fixes do not fit the ingest memory budget (ingest.max_queued_bytes)",
            m.publish.payload.len()
        ))
    };
    if m.too_large {
        let e = too_large();
        m.drop_payload(ahead);
        return Read::Fixes(vec![Err(e)]);
    }
    let parsed = message::parse(
        &topic,
        &m.publish.payload,
        limits.max_bytes,
        limits.max_batch,
        |located| {
            // The batch keeps a copy of its fixes, to submit again after a refusal.
            let charge = Charge {
                extra_per_item: std::mem::size_of::<Result<Fix, ItemError>>(),
                ceiling: ahead.ceiling(&limits.budget),
            };
            ingest.read_within(located, &mut m.hold, charge)
        },
        ingest.limits(),
        ingest.now(),
    );
    match parsed {
        Parsed::Fixes(f) => {
            m.drop_payload(ahead);
            Read::Fixes(f)
        }
        Parsed::NoRoom => {
            m.reset();
            Read::NoRoom
        }
        Parsed::Bad(e) => {
            m.drop_payload(ahead);
            Read::Fixes(vec![Err(e)])
        }
        Parsed::Nothing(why) => {
            tracing::trace!(%topic, why, "MQTT message holds no fix");
            m.drop_payload(ahead);
            Read::Fixes(Vec::new())
        }
    }
}

/// Submits until the batch is taken (true) or the service stops (false).
async fn submit(ingest: &Ingest, fixes: Fixes, stop: &CancellationToken) -> bool {
    let mut delay = Duration::from_millis(100);
    loop {
        match ingest.submit("mqtt", fixes.clone()).await {
            Ok(report) => {
                if report.rejected > 0 {
                    tracing::debug!(rejected = report.rejected, first = ?report.errors.first().map(|e| &e.message), "MQTT fixes rejected");
                }
                return true;
            }
            Err(BatchError::ShuttingDown) => return false,
            Err(e) => {
                tracing::warn!(error = ?e, retry_in = ?delay, "MQTT batch not taken; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
