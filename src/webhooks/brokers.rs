//! Delivery to message brokers: one event as one MQTT QoS 1 PUBLISH, or one NATS message
//! (a JetStream publish with `Nats-Msg-Id` = the event id when a stream holds the subject).
//!
//! Invariants:
//! - An attempt counts as delivered only when the broker has taken responsibility for the
//!   message: MQTT's PUBACK for our packet id; JetStream's publish ack (a `duplicate: true` ack
//!   also counts: the stream already holds the event); for a subject no stream holds, the core
//!   publish flushed to the server (NATS core promises no more than that).
//! - Each sink task owns its [`Conn`]: one connection per sink, made at its first event and made
//!   again after any failure, to the address the target policy checked
//!   ([`crate::outbound::TargetPolicy::resolve`]), never to a second lookup of the name.
//! - Every wait is bounded by the sink's timeout; the MQTT connection's keep-alive runs in a
//!   task of its own (aborted with the [`Conn`]) so an idle sink stays connected.
//! - The body is exactly the event's JSON, as for webhooks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use metrics::gauge;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS, Transport};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::outbound::{TargetPolicy, mqtt_tls};
use crate::telemetry as t;
use crate::webhooks::outcome::Attempt;
use crate::webhooks::spec::{SinkKind, SinkSpec, destination_template, fill_template};
use crate::wire::trackers::percent_decode;

/// Subjects remembered as in a stream or not, per NATS connection (bounded; cleared when full).
const SUBJECT_CACHE: usize = 1024;
/// How long a subject's stream lookup is trusted (a stream created later is seen after this).
const SUBJECT_TTL: Duration = Duration::from_secs(30);
/// MQTT keep-alive of sink connections.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// A sink's open broker connection, if any.
#[derive(Default)]
pub struct Conn {
    inner: Option<Open>,
}

enum Open {
    Mqtt(MqttConn),
    Nats(Box<NatsConn>),
}

struct MqttConn {
    client: AsyncClient,
    events: mpsc::Receiver<MqttNote>,
    task: JoinHandle<()>,
}

impl Drop for MqttConn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the MQTT event loop task reports to the delivering task.
enum MqttNote {
    /// Our PUBLISH went out with this packet id.
    Sent(u16),
    /// The broker acknowledged this packet id.
    Acked(u16),
    /// The connection failed (the task stops; the next attempt reconnects).
    Down(String),
}

struct NatsConn {
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    /// Subject -> (a stream holds it, when that was looked up); at most [`SUBJECT_CACHE`]
    /// entries, shown as `geodwell_webhook_subject_cache_entries{sink}`.
    in_stream: HashMap<String, (bool, Instant)>,
    /// The sink's id, the gauge's label.
    sink: String,
}

impl NatsConn {
    /// Moves the sink's gauge by `delta` entries. Moved, not set: during a reload the sink's old
    /// and new connections overlap, and each accounts only for its own entries.
    fn count_cache(&self, delta: f64) {
        gauge!(t::WEBHOOK_SUBJECT_CACHE, "sink" => self.sink.clone()).increment(delta);
    }

    fn clear_cache(&mut self) {
        self.count_cache(-(self.in_stream.len() as f64));
        self.in_stream.clear();
    }
}

impl Drop for NatsConn {
    fn drop(&mut self) {
        // The connection goes (a failure, a reload, a stop), and its lookups with it.
        self.clear_cache();
    }
}

/// The parts of an event a template uses.
#[derive(serde::Deserialize)]
struct Parts<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    fence: &'a str,
    #[serde(borrow)]
    device: &'a str,
}

/// Sends `body` (the JSON of event `event_id`) to an MQTT or NATS sink, connecting first if
/// needed. A failure drops the connection, so the next attempt starts afresh.
pub async fn send(
    conn: &mut Conn,
    policy: TargetPolicy,
    spec: &SinkSpec,
    event_id: &str,
    body: &str,
) -> Attempt {
    let res = tokio::time::timeout(
        timeout(spec),
        send_inner(conn, policy, spec, event_id, body),
    )
    .await;
    let error = match res {
        Ok(Ok(())) => return Attempt::Delivered,
        Ok(Err(e)) => e,
        Err(_) => format!("timed out after {}", spec.timeout),
    };
    conn.inner = None;
    Attempt::Failed {
        error,
        retry_after: None,
    }
}

async fn send_inner(
    conn: &mut Conn,
    policy: TargetPolicy,
    spec: &SinkSpec,
    event_id: &str,
    body: &str,
) -> Result<(), String> {
    let url = reqwest::Url::parse(&spec.url).map_err(|e| e.to_string())?;
    let kind = spec.kind();
    let parts: Parts<'_> = serde_json::from_str(body).map_err(|e| format!("event JSON: {e}"))?;
    let dest = fill_template(
        kind,
        &destination_template(&url),
        parts.fence,
        parts.kind,
        parts.device,
    );
    if conn.inner.is_none() {
        conn.inner = Some(connect(kind, &url, policy, &spec.id, timeout(spec)).await?);
    }
    match conn.inner.as_mut() {
        Some(Open::Mqtt(m)) => mqtt_publish(m, &dest, body).await,
        Some(Open::Nats(n)) => nats_publish(n, &dest, event_id, body).await,
        None => Err("not connected".into()),
    }
}

async fn connect(
    kind: SinkKind,
    url: &reqwest::Url,
    policy: TargetPolicy,
    sink_id: &str,
    timeout: Duration,
) -> Result<Open, String> {
    let host = url.host_str().unwrap_or_default();
    let tls = url.scheme() == "mqtts";
    let port = url.port().unwrap_or(match (kind, tls) {
        (SinkKind::Mqtt, false) => 1883,
        (SinkKind::Mqtt, true) => 8883,
        _ => 4222,
    });
    let addr = policy.resolve(host, port).await.map_err(|e| {
        if matches!(e, crate::outbound::ResolveError::Refused(_)) {
            metrics::counter!(t::OUTBOUND_REFUSED).increment(1);
        }
        e.to_string()
    })?;
    let user = (!url.username().is_empty()).then(|| percent_decode(url.username(), false));
    let pass = url.password().map(|p| percent_decode(p, false));
    match kind {
        SinkKind::Mqtt => {
            // A fresh id per connection: two connections with one id would take each other's
            // session down; the sink keeps its own cursor, so no broker session is needed.
            let client_id = format!("geodwell-sink-{sink_id}-{:08x}", rand_u32());
            let mut opts = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
            opts.set_keep_alive(KEEP_ALIVE);
            opts.set_clean_session(true);
            opts.set_max_packet_size(1 << 20, 1 << 20);
            if let Some(u) = user {
                opts.set_credentials(u, pass.unwrap_or_default());
            }
            if tls {
                opts.set_transport(Transport::tls_with_config(mqtt_tls()?));
            }
            let (client, mut el) = AsyncClient::new(opts, 16);
            let (tx, rx) = mpsc::channel(64);
            let task = tokio::spawn(async move {
                loop {
                    let note = match el.poll().await {
                        Ok(Event::Outgoing(Outgoing::Publish(pkid))) => MqttNote::Sent(pkid),
                        Ok(Event::Incoming(Packet::PubAck(a))) => MqttNote::Acked(a.pkid),
                        Ok(Event::Incoming(Packet::ConnAck(a)))
                            if a.code != rumqttc::ConnectReturnCode::Success =>
                        {
                            MqttNote::Down(format!("broker refused the connection: {:?}", a.code))
                        }
                        Ok(_) => continue,
                        Err(e) => MqttNote::Down(format!("MQTT connection: {e}")),
                    };
                    let down = matches!(note, MqttNote::Down(_));
                    if tx.send(note).await.is_err() || down {
                        return;
                    }
                }
            });
            Ok(Open::Mqtt(MqttConn {
                client,
                events: rx,
                task,
            }))
        }
        SinkKind::Nats | SinkKind::Http => {
            // The client may connect only to the address checked above: servers a NATS server
            // advertises (`connect_urls` in its INFO) are ignored, since they were never put to
            // the target policy and would receive the sink's credentials. It makes one attempt
            // now and at most one reconnect after a drop, then its connection task ends: the
            // sink reconnects at its next attempt, and a dropped connection leaves nothing
            // running (the client's background reconnect loop never checks whether anyone
            // still holds the client).
            let mut opts = async_nats::ConnectOptions::new()
                .name(format!("geodwell sink {sink_id}"))
                .ignore_discovered_servers()
                .max_reconnects(1)
                .connection_timeout(timeout);
            if let Some(u) = user {
                opts = opts.user_and_password(u, pass.unwrap_or_default());
            }
            let client = tokio::time::timeout(
                timeout,
                async_nats::ConnectOptions::connect(opts, format!("nats://{addr}")),
            )
            .await
            .map_err(|_| format!("cannot connect to nats://{addr} within {timeout:?}"))?
            .map_err(|e| format!("cannot connect to nats://{addr}: {e}"))?;
            let js = async_nats::jetstream::new(client.clone());
            Ok(Open::Nats(Box::new(NatsConn {
                client,
                js,
                in_stream: HashMap::new(),
                sink: sink_id.to_string(),
            })))
        }
    }
}

async fn mqtt_publish(m: &mut MqttConn, topic: &str, body: &str) -> Result<(), String> {
    m.client
        .publish(topic, QoS::AtLeastOnce, false, body.as_bytes().to_vec())
        .await
        .map_err(|e| format!("MQTT publish: {e}"))?;
    let mut ours = None;
    loop {
        match m.events.recv().await {
            Some(MqttNote::Sent(pkid)) if ours.is_none() => ours = Some(pkid),
            Some(MqttNote::Acked(pkid)) if Some(pkid) == ours => return Ok(()),
            Some(MqttNote::Down(e)) => return Err(e),
            Some(_) => {}
            None => return Err("MQTT connection closed".into()),
        }
    }
}

async fn nats_publish(
    n: &mut NatsConn,
    subject: &str,
    event_id: &str,
    body: &str,
) -> Result<(), String> {
    let now = Instant::now();
    let cached = n
        .in_stream
        .get(subject)
        .filter(|(_, at)| now.duration_since(*at) < SUBJECT_TTL)
        .map(|(b, _)| *b);
    let in_stream = match cached {
        Some(b) => b,
        None => {
            let b = match n.js.stream_by_subject(subject).await {
                Ok(_) => true,
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::context::GetStreamByNameErrorKind::NotFound =>
                {
                    false
                }
                // A server without JetStream has nobody to answer the lookup.
                Err(e) if format!("{e:?}").contains("NoResponders") => false,
                Err(e) => return Err(format!("looking up the stream of {subject}: {e}")),
            };
            if n.in_stream.len() >= SUBJECT_CACHE {
                n.clear_cache();
            }
            if n.in_stream.insert(subject.to_string(), (b, now)).is_none() {
                n.count_cache(1.0);
            }
            b
        }
    };
    let payload = bytes::Bytes::copy_from_slice(body.as_bytes());
    if in_stream {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, event_id);
        n.js.publish_with_headers(subject.to_string(), headers, payload)
            .await
            .map_err(|e| format!("JetStream publish to {subject}: {e}"))?
            .await
            .map_err(|e| format!("JetStream ack for {subject}: {e}"))?;
    } else {
        n.client
            .publish(subject.to_string(), payload)
            .await
            .map_err(|e| format!("NATS publish to {subject}: {e}"))?;
        n.client
            .flush()
            .await
            .map_err(|e| format!("NATS flush: {e}"))?;
    }
    Ok(())
}

/// The sink's per-attempt timeout.
fn timeout(spec: &SinkSpec) -> Duration {
    Duration::from_millis(spec.timeout.millis().max(1) as u64)
}

/// A few random bits for connection ids (not security-relevant).
fn rand_u32() -> u32 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(Instant::now()) as u32
}

/// Kept for the sink's `Debug` output.
impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.inner {
            None => "closed",
            Some(Open::Mqtt(_)) => "mqtt",
            Some(Open::Nats(_)) => "nats",
        };
        f.write_str(what)
    }
}
