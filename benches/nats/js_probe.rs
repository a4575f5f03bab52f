//! The NATS side of `benches/cluster.sh`'s NATS-server kill: a bare JetStream publisher beside
//! geodwell, and what the streams and the events stream did meanwhile, all on one clock.
//!
//! - Prints `{"leader": NAME}`, the server that leads `GEODWELL_IN`, on a line of its own (the
//!   bench kills it).
//! - Then, for `--seconds`: publishes 1 KiB messages one after another to the same stream, on
//!   subject `geodwell.in.bench` (no partition's; nothing reads it), each waiting for its PubAck
//!   up to 5 s (geodwell's own timeout), and logs `[start, end, ok]` (Unix seconds): a bare
//!   publisher through the very leader election geodwell's ingest goes through; polls the
//!   leaders of `GEODWELL_IN`, `GEODWELL_EVENTS` and the lease bucket's stream every 100 ms;
//!   and, once the time is up, reads every event the events stream stored from the start on,
//!   with its store time (a consumer made at the start could have died with the killed server).
//! - Prints one JSON object: `bare`, `leaders` (per stream `[t, leader or ""]`), `events` (per
//!   partition, the store times).
//!
//!   cargo run --release --example js_probe -- --servers nats://127.0.0.1:4222,... --seconds 30

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use serde_json::json;

/// The input and events streams, and the lease bucket's stream (an owner publishes only while
/// it can renew its lease).
const FOLLOWED: [&str; 3] = ["GEODWELL_IN", "GEODWELL_EVENTS", "KV_geodwell_leases"];
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn leader(js: &jetstream::Context, name: &str) -> String {
    let info = tokio::time::timeout(Duration::from_secs(1), js.get_stream(name)).await;
    match info {
        Ok(Ok(s)) => s
            .cached_info()
            .cluster
            .as_ref()
            .and_then(|c| c.leader.clone())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The leader of `GEODWELL_IN`, once it has one.
async fn input_leader(js: &jetstream::Context) -> String {
    for _ in 0..100 {
        let l = leader(js, "GEODWELL_IN").await;
        if !l.is_empty() {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("GEODWELL_IN has no leader");
}

async fn publish(js: jetstream::Context, until: Instant) -> Vec<(f64, f64, bool)> {
    let payload = bytes::Bytes::from(vec![b'x'; 1024]);
    let mut log = Vec::new();
    while Instant::now() < until {
        let s = now();
        let ok = match js.publish("geodwell.in.bench", payload.clone()).await {
            Ok(ack) => matches!(tokio::time::timeout(ACK_TIMEOUT, ack).await, Ok(Ok(_))),
            Err(_) => false,
        };
        log.push((s, now(), ok));
        if !ok {
            // An error that comes back at once (no responders) would spin.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    log
}

async fn leaders(
    js: jetstream::Context,
    until: Instant,
) -> BTreeMap<&'static str, Vec<(f64, String)>> {
    let mut out: BTreeMap<&str, Vec<(f64, String)>> = BTreeMap::new();
    while Instant::now() < until {
        for name in FOLLOWED {
            let l = leader(&js, name).await;
            out.entry(name).or_default().push((now(), l));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    out
}

/// Every event stored after the stream's last sequence at the start, by partition, with the
/// time the stream stored it. Read after `until` with a consumer made then: a consumer made at
/// the start lives on one server, and the server killed may be that one.
async fn events(js: jetstream::Context, until: Instant) -> BTreeMap<u16, Vec<f64>> {
    let mut out: BTreeMap<u16, Vec<f64>> = BTreeMap::new();
    let mut stream = js
        .get_stream("GEODWELL_EVENTS")
        .await
        .expect("events stream");
    let first = stream
        .info()
        .await
        .expect("events stream info")
        .state
        .last_sequence
        + 1;
    tokio::time::sleep_until(until.into()).await;
    let mut msgs = loop {
        let made = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: first,
                },
                ..Default::default()
            })
            .await;
        match made {
            Ok(c) => match c.messages().await {
                Ok(m) => break m,
                Err(e) => eprintln!("events consumer: {e}; again"),
            },
            Err(e) => eprintln!("events consumer: {e}; again"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Reads until it has caught up with the stream (or 5 s without an event).
    loop {
        match tokio::time::timeout(Duration::from_secs(5), msgs.next()).await {
            Ok(Some(Ok(m))) => {
                let p = m.subject.rsplit('.').next().and_then(|p| p.parse().ok());
                let Ok(info) = m.info() else { continue };
                if let Some(p) = p {
                    let t = info.published.unix_timestamp_nanos() as f64 / 1e9;
                    out.entry(p).or_default().push(t);
                }
                if info.pending == 0 {
                    break;
                }
            }
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    out
}

#[tokio::main]
async fn main() {
    let servers: Vec<async_nats::ServerAddr> = arg("--servers")
        .expect("--servers")
        .split(',')
        .map(|u| u.parse().expect("a server URL"))
        .collect();
    let seconds: u64 = arg("--seconds").map_or(30, |s| s.parse().expect("seconds"));
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(ACK_TIMEOUT))
        .connect(servers)
        .await
        .expect("connects");
    let js = jetstream::new(client);
    let target = input_leader(&js).await;
    println!("{}", json!({ "leader": target }));
    let since = now();
    let until = Instant::now() + Duration::from_secs(seconds);
    let (bare, leaders, events) = tokio::join!(
        publish(js.clone(), until),
        leaders(js.clone(), until),
        events(js.clone(), until),
    );
    println!(
        "{}",
        json!({ "since": since, "bare": bare, "leaders": leaders, "events": events })
    );
}
