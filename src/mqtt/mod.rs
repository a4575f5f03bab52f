//! MQTT ingest: fixes from topics of an MQTT broker (OwnTracks' MQTT mode and generic JSON),
//! through the same validation, stamping and durability as `POST /v1/fixes`.
//!
//! Invariants:
//! - A message is acknowledged to the broker (QoS 1 PUBACK, manual acks) only after the batch
//!   holding its fixes was answered by ingest, i.e. once its effects are durable; a message read
//!   but not acknowledged (a crash, a shutdown, a broker gone) is delivered again by the broker,
//!   which keeps the session under the stable client id (`clean_session = false`). A fix seen
//!   twice is a duplicate to the engine, so redelivery changes no event.
//! - Acknowledgements go out in the order the messages came (MQTT 3.1.1 asks it of QoS 1).
//! - A batch refused as a whole (queues full, store unavailable) is retried, not acknowledged
//!   and not dropped; an unreadable message is counted as a rejected fix and acknowledged.
//! - The connection is retried with doubling backoff (0.5 s to 30 s) for as long as the service
//!   runs; its state is the gauge `geodwell_mqtt_connected`, `GET /readyz`'s `mqtt` and the
//!   counter `geodwell_mqtt_connects_total{outcome}`.
//! - Bounded: at most [`QUEUE`] messages wait between the connection and ingest (the broker's
//!   in-flight window, 20 for Mosquitto by default, is the real bound), a batch holds at most
//!   [`BATCH`] messages, a message at most `ingest.max_body_bytes`.

pub mod message;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{counter, gauge};
use rumqttc::{
    AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Packet, Publish, QoS, Transport,
};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::MqttConfig;
use crate::ingest::BatchError;
use crate::ingest::Ingest;
use crate::outbound::{mqtt_tls, redact_password};
use crate::telemetry as t;
use crate::wire::trackers::percent_decode;
use message::Parsed;

/// Messages read from the broker and not yet taken into a batch.
pub const QUEUE: usize = 1024;
/// Messages per ingest batch (fewer when fewer are waiting).
pub const BATCH: usize = 256;
/// MQTT keep-alive.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// The largest MQTT packet read (MQTT's own maximum). A larger limit would break the
/// connection on an oversized message, which the broker would then deliver again for ever; a
/// message over `ingest.max_body_bytes` is read and rejected instead.
const MAX_PACKET: usize = 256 * 1024 * 1024;

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

/// Starts reading fixes from the broker of `cfg` into `st`'s ingest until `stop`; the task is
/// tracked by `tasks`, so shutdown waits for its last batch and acknowledgements. `st` is
/// whatever holds the service's ingest (the service's state); messages over `max_bytes` are
/// rejected.
pub fn spawn<S: AsRef<Ingest> + Send + Sync + 'static>(
    cfg: MqttConfig,
    st: Arc<S>,
    max_bytes: usize,
    tasks: &tokio_util::task::TaskTracker,
    status: Arc<MqttStatus>,
    stop: CancellationToken,
) {
    gauge!(t::MQTT_CONNECTED).set(0.0);
    gauge!(t::MQTT_QUEUED).set(0.0);
    tasks.spawn(run(cfg, st, max_bytes, status, stop));
}

fn options(cfg: &MqttConfig) -> Result<MqttOptions, String> {
    let u = reqwest::Url::parse(&cfg.url).map_err(|e| e.to_string())?;
    let tls = u.scheme() == "mqtts";
    let host = u.host_str().unwrap_or_default().to_string();
    let port = u.port().unwrap_or(if tls { 8883 } else { 1883 });
    let mut o = MqttOptions::new(cfg.client_id.clone(), host.clone(), port);
    o.set_keep_alive(KEEP_ALIVE);
    o.set_clean_session(false);
    o.set_manual_acks(true);
    o.set_max_packet_size(MAX_PACKET, 1 << 20);
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
    max_bytes: usize,
    status: Arc<MqttStatus>,
    stop: CancellationToken,
) {
    let opts = match options(&cfg) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "MQTT ingest cannot start");
            status.set(false, Some(e));
            return;
        }
    };
    // The URL as logs show it (no password).
    let shown = redact_password(&cfg.url);
    let (client, mut el) = AsyncClient::new(opts, QUEUE);
    let (tx, rx) = mpsc::channel::<Publish>(QUEUE);
    let worker = tokio::spawn(work(rx, client.clone(), st, max_bytes, stop.clone()));
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
                if a.code != ConnectReturnCode::Success {
                    let e = format!("the broker refused the connection: {:?}", a.code);
                    counter!(t::MQTT_CONNECTS, "outcome" => "refused").increment(1);
                    status.set(false, Some(e.clone()));
                    tracing::warn!(url = %shown, error = %e, "MQTT connection refused");
                    continue;
                }
                counter!(t::MQTT_CONNECTS, "outcome" => "connected").increment(1);
                status.set(true, None);
                backoff = Duration::from_millis(500);
                tracing::info!(url = %shown, session_present = a.session_present, topics = ?cfg.topics, "MQTT connected");
                let filters = cfg
                    .topics
                    .iter()
                    .map(|t| rumqttc::SubscribeFilter::new(t.clone(), QoS::AtLeastOnce));
                if let Err(e) = client.try_subscribe_many(filters) {
                    tracing::warn!(error = %e, "MQTT subscribe could not be queued");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(a))) => {
                let failed = a
                    .return_codes
                    .iter()
                    .filter(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                    .count();
                if failed > 0 {
                    tracing::error!(failed, topics = ?cfg.topics, "the broker refused MQTT subscriptions (check its ACLs)");
                }
            }
            // A message read after the stop (`tx` gone) is left unacknowledged for the next
            // session.
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if let Some(tx) = &tx
                    && tx.send(p).await.is_err()
                {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                let was_up = status.connected.load(Ordering::Relaxed);
                counter!(t::MQTT_CONNECTS, "outcome" => "failed").increment(1);
                status.set(false, Some(e.to_string()));
                if was_up {
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

/// Takes messages in batches, ingests them, and acknowledges them once durable.
async fn work<S: AsRef<Ingest> + Send + Sync + 'static>(
    mut rx: mpsc::Receiver<Publish>,
    client: AsyncClient,
    st: Arc<S>,
    max_bytes: usize,
    stop: CancellationToken,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        counter!(t::MQTT_MESSAGES).increment(batch.len() as u64);
        gauge!(t::MQTT_QUEUED).set(rx.len() as f64);
        let ingest = (*st).as_ref();
        let (limits, now) = (ingest.limits(), ingest.now());
        let mut fixes = Vec::new();
        for p in &batch {
            match message::parse(&p.topic, &p.payload, max_bytes) {
                Parsed::Items(items) => fixes.extend(ingest.parse(items)),
                Parsed::Tracker(f) => fixes.push(message::tracker_fix(f, limits, now)),
                Parsed::Bad(e) => fixes.push(Err(e)),
                Parsed::Nothing(why) => {
                    tracing::trace!(topic = %p.topic, why, "MQTT message holds no fix");
                }
            }
        }
        if !fixes.is_empty() && !submit((*st).as_ref(), fixes, &stop).await {
            // Shutting down with this batch not taken: it stays unacknowledged.
            return;
        }
        for p in &batch {
            if client.ack(p).await.is_err() {
                return;
            }
        }
    }
}

/// Submits until the batch is taken (true) or the service stops (false).
async fn submit(
    ingest: &Ingest,
    fixes: Vec<Result<geodwell_core::fix::Fix, crate::wire::ItemError>>,
    stop: &CancellationToken,
) -> bool {
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
