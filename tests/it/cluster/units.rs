//! The cluster's parts against one real NATS server: leases (taken once, renewed by their
//! holder, lost to a taker after expiry), the outbox (what a partition already published is
//! not published again; a zombie's publish is refused and it stands down), and a node's
//! checkpoints (a restarted node restores them and replays nothing twice).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::get_value;
use geodwell::cluster::lease::{Leases, Renewed, read_stream};
use geodwell::cluster::nats::{Nats, ev_subject};
use geodwell::cluster::outbox::{Outbox, published_after};
use geodwell::config::{ClusterConfig, Config};
use geodwell_core::event::Event;
use geodwell_core::time::{Dur, Ts};
use serde_json::{Value, json};

use super::harness::NatsCluster;
use crate::common::{fix, square};

fn cluster_cfg(urls: &str, node: &str, ttl_ms: i64) -> ClusterConfig {
    ClusterConfig {
        nats_urls: urls.split(',').map(str::to_string).collect(),
        node_id: node.to_string(),
        partitions: 4,
        replicas: 0,
        lease_ttl: Dur(ttl_ms),
        checkpoint_interval: Dur::from_secs(1),
    }
}

async fn connect(urls: &str, node: &str, ttl_ms: i64) -> Nats {
    Nats::connect(
        &cluster_cfg(urls, node, ttl_ms),
        Duration::from_secs(3600),
        100_000,
    )
    .await
    .expect("connects and sets up the cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_taken_once_renewed_by_their_holder_and_lost_after_they_expire() {
    let _one = super::scenario_env().await;
    let nats = NatsCluster::start(1).await;
    let a = connect(&nats.urls(), "a", 1000).await;
    let b = connect(&nats.urls(), "b", 1000).await;
    let la = Leases::new(a.leases.clone(), "a", a.lease_ttl);
    let lb = Leases::new(b.leases.clone(), "b", b.lease_ttl);
    let held = la
        .take("p.1")
        .await
        .unwrap()
        .expect("a free lease is taken");
    assert!(held.valid());
    assert!(
        lb.take("p.1").await.unwrap().is_none(),
        "a held lease is not taken"
    );
    // Renewals keep it past its time to live.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(la.renew(&held).await, Renewed::Yes);
    }
    assert!(lb.take("p.1").await.unwrap().is_none());
    let holders = lb.holders().await.unwrap();
    assert_eq!(holders["p.1"].node, "a");
    assert_eq!(holders["p.1"].epoch, held.epoch());
    // Without renewals it expires; the holder stops acting on it before the server drops it,
    // another node takes it, and the old holder's next renewal finds it lost.
    let t0 = Instant::now();
    while held.valid() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "invalid before the TTL"
    );
    let taken = loop {
        if let Some(l) = lb.take("p.1").await.unwrap() {
            break l;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(taken.epoch() > held.epoch(), "a new epoch");
    assert_eq!(la.renew(&held).await, Renewed::Lost);
    assert!(held.is_lost() && !held.valid());
    // Released, it is free at once.
    lb.release(&taken).await;
    assert!(la.take("p.1").await.unwrap().is_some());
}

fn event(device: &str, at: i64) -> Event {
    let mut e = Event::enter(device, &Arc::from("depot"), Ts(at), &Arc::new(Value::Null));
    e.emitted_at = Some(Ts(at));
    e
}

async fn stored_ids(nats: &Nats, p: u16) -> Vec<String> {
    read_stream(
        &nats.events,
        &ev_subject(p),
        async_nats::jetstream::consumer::DeliverPolicy::All,
    )
    .await
    .unwrap()
    .iter()
    .map(|m| {
        m.headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .unwrap()
            .as_str()
            .to_string()
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_publishes_each_event_once_and_a_zombie_stands_down() {
    let _one = super::scenario_env().await;
    let nats = NatsCluster::start(1).await;
    let a = connect(&nats.urls(), "a", 1000).await;
    let la = Leases::new(a.leases.clone(), "a", a.lease_ttl);
    let lease = Arc::new(la.take("p.2").await.unwrap().unwrap());
    let evs: Vec<Event> = (0..6).map(|i| event(&format!("d{i}"), 1_000 + i)).collect();
    // A previous owner published the first three.
    let (old, task) = Outbox::spawn(a.clone(), 2, lease.clone(), 0, HashSet::new());
    assert!(old.send(evs[..3].to_vec()).await);
    assert!(old.wait_acked(3).await);
    drop(old);
    task.await.unwrap();
    // The next owner replays from a checkpoint before them: it produces all six again, and
    // suppresses what the subject holds after the checkpoint's mark.
    let (ids, last) = published_after(&a, 2, 0).await.unwrap();
    assert_eq!(ids.len(), 3);
    let (next, task) = Outbox::spawn(a.clone(), 2, lease.clone(), last, ids);
    assert!(next.send(evs.clone()).await);
    assert!(next.wait_acked(6).await);
    drop(next);
    task.await.unwrap();
    let want: Vec<String> = evs.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(stored_ids(&a, 2).await, want, "each event once, in order");

    // A zombie: an owner that stops renewing (paused) while its lease expires and another node
    // takes the partition over and publishes; it wakes believing the subject ends where it
    // last looked.
    let zl = Arc::new(la.take("p.3").await.unwrap().unwrap());
    let (owner, task) = Outbox::spawn(a.clone(), 3, zl.clone(), 0, HashSet::new());
    assert!(owner.send(vec![event("z", 1)]).await && owner.wait_acked(1).await);
    let stale_last = owner.acked().last;
    drop(owner);
    task.await.unwrap();
    let b = connect(&nats.urls(), "b", 1000).await;
    let lb = Leases::new(b.leases.clone(), "b", b.lease_ttl);
    let t0 = Instant::now();
    let taken = loop {
        if let Some(l) = lb.take("p.3").await.unwrap() {
            break Arc::new(l);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !zl.valid(),
        "expired locally before another node could take it"
    );
    let (_, last) = published_after(&b, 3, 0).await.unwrap();
    let (new_owner, task_new) = Outbox::spawn(b.clone(), 3, taken, last, HashSet::new());
    assert!(new_owner.send(vec![event("y", 2)]).await && new_owner.wait_acked(1).await);
    drop(new_owner);
    task_new.await.unwrap();
    let (zombie, task_z) = Outbox::spawn(a.clone(), 3, zl.clone(), stale_last, HashSet::new());
    let _ = zombie.send(vec![event("x", 3)]).await;
    // Its next renewal finds the lease taken: it stands down without publishing.
    assert_eq!(la.renew(&zl).await, Renewed::Lost);
    tokio::time::timeout(Duration::from_secs(10), task_z)
        .await
        .expect("the zombie's outbox ends")
        .unwrap();
    assert_eq!(zombie.acked().count, 0);
    assert!(zombie.acked().stopped);
    assert_eq!(
        stored_ids(&a, 3).await,
        vec![event("z", 1).id.to_string(), event("y", 2).id.to_string()],
        "the zombie published nothing"
    );
}

fn node_config(urls: &str) -> Config {
    let mut cfg = crate::common::config(
        "[time]\nclock = \"event\"\nlateness = \"0s\"\n[cluster]\npartitions = 4\nlease_ttl = \"2s\"\ncheckpoint_interval = \"300ms\"\n",
    )
    .into_parts()
    .0;
    cfg.cluster = Some(cluster_cfg(urls, "solo", 2000));
    if let Some(c) = cfg.cluster.as_mut() {
        c.checkpoint_interval = Dur(300);
    }
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_restores_its_checkpoints_and_repeats_no_event() {
    let _one = super::scenario_env().await;
    let nats = NatsCluster::start(1).await;
    let http = reqwest::Client::new();
    let svc = geodwell::Service::start(node_config(&nats.urls()))
        .await
        .expect("a cluster node starts");
    let base = format!("http://{}", svc.addr());
    wait_ready(&http, &base).await;
    let r = http
        .put(format!("{base}/v1/fences/yard"))
        .json(&square("yard", json!({"dwell": ["1m"]})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    // Time-major: with no lateness, a fix older than one already sent is late.
    let fixes: Vec<Value> = (0..10)
        .flat_map(|s| (0..20).map(move |d| fix(&format!("dev-{d}"), s * 20, true)))
        .collect();
    let r = http
        .post(format!("{base}/v1/fixes"))
        .json(&fixes)
        .send()
        .await
        .unwrap();
    let rep: Value = r.json().await.unwrap();
    assert_eq!(rep["accepted"], 200, "{rep}");
    let before = wait_events(&http, &base, 40).await;
    // Checkpoints are written, then the node stops with a final one.
    tokio::time::sleep(Duration::from_millis(800)).await;
    svc.shutdown(Duration::from_secs(10)).await.unwrap();

    let svc = geodwell::Service::start(node_config(&nats.urls()))
        .await
        .expect("the node starts again");
    let base = format!("http://{}", svc.addr());
    wait_ready(&http, &base).await;
    let view: Value = get_value(&http, format!("{base}/v1/cluster")).await;
    for p in view["partition_owners"].as_array().unwrap() {
        assert_eq!(p["owner"], "solo", "{p}");
        assert_eq!(
            p["status"]["takeover"]["replayed_records"], 0,
            "a graceful stop leaves nothing to replay: {p}"
        );
        assert!(
            p["status"]["checkpoint_position"].as_u64().unwrap() > 0,
            "{p}"
        );
    }
    // The devices are back, and more input goes on from where they were.
    let d: Value = get_value(&http, format!("{base}/v1/devices/dev-3")).await;
    assert_eq!(d["pairs"][0]["fence"], "yard", "{d}");
    let more: Vec<Value> = (0..20)
        .map(|d| fix(&format!("dev-{d}"), 400, false))
        .collect();
    let r = http
        .post(format!("{base}/v1/fixes"))
        .json(&more)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let after = wait_events(&http, &base, before.len() + 20).await;
    let ids: HashSet<&str> = after.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), after.len(), "no event twice");
    assert_eq!(
        after.iter().filter(|e| e["type"] == "exit").count(),
        20,
        "every device exits once"
    );
    svc.shutdown(Duration::from_secs(10)).await.unwrap();
}

async fn wait_ready(http: &reqwest::Client, base: &str) {
    let t0 = Instant::now();
    loop {
        if http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_events(http: &reqwest::Client, base: &str, n: usize) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let v: Value = get_value(http, format!("{base}/v1/events?from_seq=1&limit=10000")).await;
        let evs = v["events"].as_array().cloned().unwrap_or_default();
        if evs.len() >= n || t0.elapsed() > Duration::from_secs(30) {
            return evs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Records the `webhook-id` of every request; answers 204.
async fn id_receiver() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::routing::post;
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let g = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap| {
            let g = g.clone();
            async move {
                let id = headers
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                g.lock().unwrap().push(id);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), got)
}

fn named_node_config(urls: &str, node: &str) -> Config {
    let mut cfg = node_config(urls);
    if let Some(c) = cfg.cluster.as_mut() {
        c.node_id = node.to_string();
    }
    cfg
}

/// Posts fixes of devices `dev-0`..`dev-9` at `secs` to `base`: the ones whose number has
/// parity `inside` inside the yard, the others outside.
async fn post_ten_fixes(http: &reqwest::Client, base: &str, secs: i64, inside: usize) {
    let fixes: Vec<Value> = (0..10)
        .map(|d| fix(&format!("dev-{d}"), secs, d % 2 == inside))
        .collect();
    let r = http
        .post(format!("{base}/v1/fixes"))
        .json(&fixes)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// The nodes whose heartbeat says they deliver sink `id`.
async fn deliverers(http: &reqwest::Client, base: &str, id: &str) -> Vec<String> {
    let v: Value = get_value(http, format!("{base}/v1/cluster")).await;
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["sinks"].as_array().unwrap().iter().any(|s| s == id))
        .map(|n| n["node"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_delivered_by_one_node_and_resumed_by_another_when_it_stops() {
    let _one = super::scenario_env().await;
    let nats = NatsCluster::start(1).await;
    let http = reqwest::Client::new();
    let a = geodwell::Service::start(named_node_config(&nats.urls(), "a"))
        .await
        .expect("node a starts");
    let b = geodwell::Service::start(named_node_config(&nats.urls(), "b"))
        .await
        .expect("node b starts");
    let (ua, ub) = (
        format!("http://{}", a.addr()),
        format!("http://{}", b.addr()),
    );
    wait_ready(&http, &ua).await;
    wait_ready(&http, &ub).await;
    let (url, got) = id_receiver().await;
    let r = http
        .put(format!("{ua}/v1/fences/yard"))
        .json(&square("yard", json!({"dwell": ["1m"]})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    let r = http
        .post(format!("{ua}/v1/webhooks"))
        .json(&json!({
            "id": "hook",
            "url": url,
            "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwZbMA3wnmMvI=",
            "timeout": "2s",
            "from_seq": 1,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    // The definition reaches the other node.
    let t0 = Instant::now();
    loop {
        let v: Value = get_value(&http, format!("{ub}/v1/webhooks")).await;
        if v["webhooks"].as_array().is_some_and(|w| w.len() == 1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "node b never saw the sink: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in 0..5 {
        post_ten_fixes(&http, &ub, s * 30, 0).await;
    }
    let first = wait_events(&http, &ub, 5).await;
    assert!(!first.is_empty());
    let wait_got = |ids: Vec<String>| {
        let got = got.clone();
        async move {
            let t0 = Instant::now();
            loop {
                let have: HashSet<String> = got.lock().unwrap().iter().cloned().collect();
                let missing: Vec<&String> = ids.iter().filter(|i| !have.contains(*i)).collect();
                if missing.is_empty() {
                    return;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "not delivered: {missing:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let ids = |evs: &[Value]| -> Vec<String> {
        evs.iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    wait_got(ids(&first)).await;
    // One node delivers it.
    let t0 = Instant::now();
    let who = loop {
        let d = deliverers(&http, &ua, "hook").await;
        if d.len() == 1 {
            break d[0].clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "deliverers: {d:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // It stops; the other resumes where it stopped.
    let (gone, stay, stay_url) = if who == "a" {
        (a, b, ub.clone())
    } else {
        (b, a, ua.clone())
    };
    gone.shutdown(Duration::from_secs(10)).await.unwrap();
    let before = got.lock().unwrap().len();
    for s in 5..10 {
        post_ten_fixes(&http, &stay_url, s * 30, 1).await;
    }
    let all = wait_events(&http, &stay_url, first.len() + 10).await;
    assert!(all.len() > first.len(), "more events after the stop");
    wait_got(ids(&all)).await;
    let received = got.lock().unwrap().clone();
    let distinct: HashSet<&String> = received.iter().collect();
    assert_eq!(distinct.len(), all.len(), "every event, and only events");
    // A graceful handover writes the cursor first: nothing delivered before it is repeated.
    assert_eq!(
        received.len(),
        all.len(),
        "no event delivered twice across a graceful handover ({before} before the stop)"
    );
    // The heartbeat naming the sinks is written once per membership round, so it may lag the
    // first deliveries after the handover by up to a round.
    let t0 = Instant::now();
    loop {
        let d = deliverers(&http, &stay_url, "hook").await;
        if d.len() == 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "deliverers: {d:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stay.shutdown(Duration::from_secs(10)).await.unwrap();
}
