//! `geodwell simulate` against the real server: the simulator's seeded fleet, sent over HTTP
//! NDJSON and WebSocket ingest with bounded disorder, gives exactly the events the reference
//! implementation of docs/semantics.md sections 2-4 computes for the same trace; every event reaches the
//! simulator's subscription and gets a latency; the CLI writes deterministic traces and reports
//! an unreachable server clearly; it sends its API key on every request, and its exit status is
//! non-zero (with a message saying why) when the server refuses the key or any fixes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::start;
use geodwell_core::fences::Fence;
use geodwell_core::fix::Fix;
use geodwell_core::reference::expected_events;
use geodwell_core::time::{Dur, Ts};
use geodwell_sim::fleet::{Fleet, FleetSpec, LayoutSpec, generate_fences};
use geodwell_sim::run::{Pace, SimOptions, Transport, run};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Generated fences as the server stores them: through their GeoJSON form.
fn fences(sites: u32) -> Vec<Arc<Fence>> {
    generate_fences(&LayoutSpec {
        sites,
        seed: 11,
        ..LayoutSpec::default()
    })
    .into_iter()
    .map(|f| Arc::new(Fence::from_feature(&f.to_feature(), None, &Default::default()).unwrap()))
    .collect()
}

/// Every event in the server's log, paging through it.
async fn all_events(srv: &crate::common::Srv) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 0u64;
    loop {
        let (status, v) = srv
            .get(&format!("/v1/events?from_seq={from}&limit=5000"))
            .await;
        assert_eq!(status, 200);
        let evs = v["events"].as_array().cloned().unwrap_or_default();
        if evs.is_empty() {
            return out;
        }
        from = v["next_seq"].as_u64().unwrap();
        out.extend(evs);
    }
}

/// Polls until the log stops growing for 300 ms.
async fn settled_events(srv: &crate::common::Srv) -> Vec<Value> {
    let mut last = all_events(srv).await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = all_events(srv).await;
        if now.len() == last.len() {
            return now;
        }
        last = now;
    }
}

fn key(kind: &str, device: &str, fence: &str, at: Ts) -> String {
    format!("{kind} {device} {fence} {}", at.to_rfc3339())
}

async fn check_against_reference(
    transport: Transport,
    connections: usize,
    disorder_ms: i64,
    lateness: &str,
) {
    let srv = start(&format!(
        "[time]\nclock = \"event\"\nlateness = \"{lateness}\"\n"
    ))
    .await;
    let fences = fences(30);
    let spec = FleetSpec {
        seed: 5,
        devices: 300,
        disorder: Dur(disorder_ms),
        ..FleetSpec::default()
    };
    let opts = SimOptions {
        server: srv.base.clone(),
        transport,
        connections,
        batch: 100,
        pace: Pace::Max,
        duration: Some(Duration::from_secs(120)),
        max_fixes: Some(20_000),
        progress: false,
        drain: Duration::from_secs(3),
        ..SimOptions::default()
    };
    let report = run(
        &opts,
        spec.clone(),
        fences.clone(),
        CancellationToken::new(),
    )
    .await
    .expect("simulation runs");
    assert_eq!(report.sent, 20_000, "{}", report.render());
    assert_eq!(report.accepted, 20_000, "{}", report.render());
    assert_eq!(report.late + report.duplicate + report.rejected, 0);
    assert!(report.errors.is_empty(), "{:?}", report.errors);

    // The same trace, regenerated from the spec and the start the run used.
    let trace: Vec<Fix> = Fleet::new(
        FleetSpec {
            start: report.start,
            ..spec
        },
        &fences,
    )
    .unwrap()
    .take(20_000)
    .map(|f| f.to_fix("sim-").unwrap())
    .collect();
    // The run ends the input by moving the watermark to the last fix's time.
    let last = trace.iter().map(|f| f.ts.0).max().unwrap();
    assert_eq!(
        report.finished_watermark,
        Some(Ts(last)),
        "{}",
        report.render()
    );
    let w_final = Ts(last);
    let expected: BTreeSet<String> = expected_events(&fences, &trace, w_final)
        .iter()
        .map(|e| key(e.kind.as_str(), &e.device, &e.fence, e.at))
        .collect();
    let got_events = settled_events(&srv).await;
    let got: BTreeSet<String> = got_events
        .iter()
        .map(|e| {
            key(
                e["type"].as_str().unwrap(),
                e["device"].as_str().unwrap(),
                e["fence"].as_str().unwrap(),
                Ts::parse_rfc3339(e["at"].as_str().unwrap()).unwrap(),
            )
        })
        .collect();
    assert_eq!(got.len(), got_events.len(), "no event twice");
    let missing: Vec<_> = expected.difference(&got).take(5).collect();
    let extra: Vec<_> = got.difference(&expected).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "server vs reference: {} vs {} events; missing {missing:?}; extra {extra:?}",
        got.len(),
        expected.len()
    );
    let kinds = |k: &str| got_events.iter().filter(|e| e["type"] == k).count() as u64;
    assert!(
        kinds("enter") > 100 && kinds("exit") > 50 && kinds("dwell") > 10,
        "{}",
        report.render()
    );

    // The subscription saw every event, and each got a latency or is counted as unmatched
    // (sent as fast as possible, a small fleet's devices report many times before a late
    // event arrives, so their remembered fixes are overwritten: expected here).
    for k in ["enter", "exit", "dwell"] {
        assert_eq!(report.events[k], kinds(k), "{k}: {}", report.render());
    }
    let all = &report.latency["all"];
    assert_eq!(all.count + all.unmatched, got_events.len() as u64);
    assert!(all.count > 0, "{}", report.render());
    assert!(all.p50_us > 0 && all.p50_us <= all.p99_us && all.p99_us <= all.max_us);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_ndjson_with_disorder_gives_the_reference_events() {
    // Three connections in flight add their own disorder (up to a few batches' event-time
    // span): the lateness covers both.
    check_against_reference(Transport::Http, 3, 3_000, "2m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_ingest_in_order_gives_the_reference_events() {
    check_against_reference(Transport::Ws, 1, 0, "0ms").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_server_takes_real_time_only() {
    let srv = start("").await;
    let opts = SimOptions {
        server: srv.base.clone(),
        pace: Pace::Rate(1000.0),
        progress: false,
        ..SimOptions::default()
    };
    let err = run(
        &opts,
        FleetSpec::default(),
        fences(3),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("--replay-speed 1"), "{err}");
    // In real time it works: a short run with the live clock's default lateness.
    let opts = SimOptions {
        pace: Pace::Replay(1.0),
        duration: Some(Duration::from_millis(1500)),
        drain: Duration::from_millis(500),
        ..opts
    };
    let spec = FleetSpec {
        devices: 2000,
        ..FleetSpec::default()
    };
    let report = run(&opts, spec, fences(3), CancellationToken::new())
        .await
        .unwrap();
    assert!(report.sent > 0, "{}", report.render());
    assert_eq!(report.accepted, report.sent, "{}", report.render());
    assert_eq!(report.server_clock, "live");
    srv.stop().await;
}

#[test]
fn the_cli_writes_deterministic_traces() {
    let bin = env!("CARGO_BIN_EXE_geodwell");
    let dir = crate::common::temp_dir();
    let write = |sub: &str| {
        let out = std::process::Command::new(bin)
            .args([
                "simulate",
                "--devices",
                "50",
                "--sites",
                "5",
                "--fixes",
                "2000",
            ])
            .args(["--start", "2026-03-01T00:00:00Z", "--write-trace"])
            .arg(dir.path().join(sub))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            std::fs::read(dir.path().join(sub).join("fixes.ndjson")).unwrap(),
            std::fs::read(dir.path().join(sub).join("fences.geojson")).unwrap(),
        )
    };
    let (a, fa) = write("a");
    let (b, fb) = write("b");
    assert_eq!(a, b);
    assert_eq!(fa, fb);
    let lines: Vec<Value> = a
        .split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2000);
    // --start 2026-03-01T00:00:00Z: every device reports within its first interval after it.
    assert!(
        lines
            .iter()
            .all(|l| l["ts"].as_i64().unwrap() >= 1_772_323_200_000)
    );
}

#[test]
fn the_cli_reports_an_unreachable_server() {
    let bin = env!("CARGO_BIN_EXE_geodwell");
    // Bind and drop a listener: the port is free and nothing answers there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = std::process::Command::new(bin)
        .args(["simulate", "--quiet", "--server"])
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/readyz"), "{err}");
}

/// One fix per WebSocket frame, in order, lateness 0, two shards: the most publish/read cycles
/// of the event-mode watermark per fix. A shard that read its queue before the published
/// watermark could advance past a batch that arrived between the two reads, and judge its fixes
/// late: before the fix this run found 1 to 8 late fixes of 30,000 on a loaded machine, every
/// time. A race, so a clean run is evidence, not proof; it runs with no store to keep it quick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_frames_of_one_fix_are_never_late() {
    let srv =
        start("[time]\nclock = \"event\"\nlateness = \"0ms\"\n[store]\ndurability = \"none\"\n")
            .await;
    let spec = FleetSpec {
        seed: 9,
        devices: 300,
        disorder: Dur(0),
        ..FleetSpec::default()
    };
    let opts = SimOptions {
        server: srv.base.clone(),
        transport: Transport::Ws,
        connections: 1,
        batch: 1,
        pace: Pace::Max,
        duration: Some(Duration::from_secs(120)),
        max_fixes: Some(30_000),
        progress: false,
        measure: false,
        drain: Duration::from_secs(1),
        ..SimOptions::default()
    };
    let report = run(&opts, spec, fences(30), CancellationToken::new())
        .await
        .expect("simulation runs");
    assert_eq!(report.sent, 30_000, "{}", report.render());
    assert_eq!(report.late, 0, "{}", report.render());
    assert_eq!(report.accepted, 30_000, "{}", report.render());
    srv.stop().await;
}

// ---- the CLI against a server with API keys --------------------------------------------------

/// Scopes ingest (fixes), read (event subscription) and admin (fence upload).
const SIM_KEY: &str = "sim-key-0123456789abcdef";
/// Scope read only.
const READ_KEY: &str = "read-key-0123456789abcdef";

/// An event-clock server with the two keys above.
async fn keyed_server() -> crate::common::Srv {
    start(&format!(
        "[time]\nclock = \"event\"\nlateness = \"0s\"\n[auth]\napi_keys = [\n  \
         {{ name = \"sim\", scopes = [\"ingest\", \"read\", \"admin\"], key = \"{SIM_KEY}\" }},\n  \
         {{ name = \"dash\", scopes = [\"read\"], key = \"{READ_KEY}\" }},\n]\n"
    ))
    .await
}

/// What a `geodwell simulate` process did.
struct SimRun {
    ok: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `geodwell simulate --quiet --server <srv> ARGS` as a process with `env` on top of an
/// environment without `GEODWELL_API_KEY`; fails the test if it takes more than 90 s.
async fn simulate_bin(srv: &crate::common::Srv, args: &[&str], env: &[(&str, &str)]) -> SimRun {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_geodwell"));
    cmd.args(["simulate", "--quiet", "--server", &srv.base])
        .args(args)
        .env_remove("GEODWELL_API_KEY")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let t = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("simulate {args:?} still runs after 90 s"))
        .expect("binary runs");
    SimRun {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t.elapsed(),
    }
}

/// A short run as fast as the server answers.
const QUICK: [&str; 9] = [
    "--devices",
    "200",
    "--sites",
    "10",
    "--max",
    "--fixes",
    "5000",
    "--drain",
    "2s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_with_an_api_key_uploads_sends_and_sees_events() {
    let srv = keyed_server().await;
    let dir = crate::common::temp_dir();
    // HTTP: fence upload, fix batches and the event subscription all carry the key; WebSocket:
    // the ingest upgrade too.
    for transport in ["http", "ws"] {
        let report = dir.path().join(format!("{transport}.json"));
        let run = simulate_bin(
            &srv,
            &[
                &QUICK[..],
                &["--api-key", SIM_KEY, "--transport", transport, "--report"],
                &[report.to_str().unwrap()],
            ]
            .concat(),
            &[],
        )
        .await;
        assert!(run.ok, "{transport}: {}\n{}", run.stdout, run.stderr);
        assert!(!run.stderr.contains(SIM_KEY), "the key is never printed");
        let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert_eq!(r["sent"], 5000, "{transport}: {}", run.stdout);
        assert_eq!(r["accepted"], 5000, "{transport}: {}", run.stdout);
        assert_eq!(r["errors"], serde_json::json!({}), "{}", run.stdout);
        assert!(
            r["events"]["enter"].as_u64().unwrap() > 0,
            "{transport}: {}",
            run.stdout
        );
        assert!(r["latency"]["all"]["count"].as_u64().unwrap() > 0);
    }
    let (status, v) = srv.get("/v1/fences").await;
    assert_eq!(status, 401, "the server does guard its routes: {v}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_without_a_valid_key_stops_at_once_with_the_401() {
    let srv = keyed_server().await;
    // In real time for up to a minute: only stopping at the first refusal ends these quickly.
    let slow = ["--devices", "200", "--sites", "10", "--duration", "60s"];
    let cases: [(&[&str], &str); 5] = [
        (&[], "401 at POST /v1/fences"),
        (&["--no-upload"], "401 at GET /v1/events/ws"),
        // The case that used to exit 0 after every batch was answered 401.
        (&["--no-upload", "--no-measure"], "401 at POST /v1/fixes"),
        (
            &["--no-upload", "--no-measure", "--transport", "ws"],
            "401 at GET /v1/ingest/ws",
        ),
        (
            &[
                "--api-key",
                "wrong-key-0123456789abcdef",
                "--no-upload",
                "--no-measure",
            ],
            "401 at POST /v1/fixes",
        ),
    ];
    for (extra, want) in cases {
        let run = simulate_bin(&srv, &[&slow[..], extra].concat(), &[]).await;
        assert!(!run.ok, "{extra:?} exits non-zero: {}", run.stdout);
        assert!(run.stderr.contains(want), "{extra:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("--api-key") && run.stderr.contains("GEODWELL_API_KEY"),
            "{extra:?} says what to do: {}",
            run.stderr
        );
        assert!(
            run.took < Duration::from_secs(20),
            "{extra:?} took {:?}",
            run.took
        );
        assert!(
            !run.stdout.contains("fixes: sent"),
            "no report: {}",
            run.stdout
        );
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_with_a_read_only_key_is_refused_with_403() {
    let srv = keyed_server().await;
    let slow = ["--devices", "200", "--sites", "10", "--duration", "60s"];
    // The key from the environment; read lets it subscribe, not send fixes or upload fences.
    let env = [("GEODWELL_API_KEY", READ_KEY)];
    for (extra, want) in [
        (&["--no-upload"][..], "403 at POST /v1/fixes"),
        (&[][..], "403 at POST /v1/fences"),
    ] {
        let run = simulate_bin(&srv, &[&slow[..], extra].concat(), &env).await;
        assert!(!run.ok, "{extra:?} exits non-zero: {}", run.stdout);
        assert!(run.stderr.contains(want), "{extra:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("lacks the"),
            "the server's reason: {}",
            run.stderr
        );
        assert!(run.stderr.contains("ingest scope"), "{}", run.stderr);
        assert!(
            run.took < Duration::from_secs(20),
            "{extra:?} took {:?}",
            run.took
        );
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exits_non_zero_after_its_report_when_fixes_are_refused() {
    // Device ids longer than 5 bytes are rejected item by item: sim-0 .. sim-9 pass,
    // sim-10 .. sim-19 do not.
    let srv =
        start("[time]\nclock = \"event\"\nlateness = \"0s\"\n[ingest]\nmax_device_len = 5\n").await;
    let run = simulate_bin(
        &srv,
        &[
            "--devices",
            "20",
            "--sites",
            "5",
            "--max",
            "--fixes",
            "2000",
            "--no-measure",
        ],
        &[],
    )
    .await;
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stdout.contains("fixes: sent 2000 accepted "),
        "the report: {}",
        run.stdout
    );
    let rejected: u64 = run
        .stdout
        .split(" rejected ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a rejected count in {}", run.stdout));
    assert!(rejected > 0 && rejected < 2000, "{}", run.stdout);
    assert!(
        run.stderr.contains(&format!(
            "{rejected} of 2000 fixes sent were refused or lost: {rejected} rejected item by item"
        )),
        "{}",
        run.stderr
    );
    srv.stop().await;
}

/// `--around-server-fences` drives between the fences the server holds (uploading nothing);
/// `--cleanup` deletes what the run made: its devices, and the fences it uploaded, if any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_can_use_the_servers_fences_and_clean_up_after_itself() {
    let srv = start("[time]\nclock = \"event\"\nlateness = \"0s\"\n").await;
    let own = fences(12);
    for f in &own {
        let feature = serde_json::to_value(f.to_feature()).unwrap();
        assert_eq!(srv.put_fence(&f.id, feature).await.status(), 201);
    }
    let fence_ids = |v: &Value| -> BTreeSet<String> {
        v["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, before) = srv.get("/v1/fences").await;
    let spec = FleetSpec {
        seed: 9,
        devices: 40,
        ..FleetSpec::default()
    };
    let opts = SimOptions {
        server: srv.base.clone(),
        batch: 200,
        pace: Pace::Max,
        duration: Some(Duration::from_secs(120)),
        max_fixes: Some(4_000),
        progress: false,
        drain: Duration::from_secs(2),
        server_fences: true,
        cleanup: true,
        ..SimOptions::default()
    };
    // The fences passed in are ignored: the server's are used.
    let report = run(&opts, spec.clone(), fences(50), CancellationToken::new())
        .await
        .expect("simulation runs");
    assert_eq!(
        report.fences,
        fence_ids(&before).len(),
        "{}",
        report.render()
    );
    assert!(report.fences >= 12);
    assert_eq!(report.accepted, 4_000, "{}", report.render());
    assert!(report.events["enter"] > 0, "{}", report.render());
    let cleanup = report.cleanup.clone().unwrap();
    assert_eq!(
        (cleanup.fences, cleanup.devices),
        (0, 40),
        "{}",
        report.render()
    );
    assert!(cleanup.failed.is_empty(), "{cleanup:?}");
    let events = all_events(&srv).await;
    let ours = fence_ids(&before);
    assert!(
        events
            .iter()
            .all(|e| ours.contains(e["fence"].as_str().unwrap())),
        "every event is at one of the server's fences"
    );
    let (_, devices) = srv.get("/v1/devices").await;
    assert_eq!(devices["devices"], serde_json::json!([]), "{devices}");
    let (_, after) = srv.get("/v1/fences").await;
    assert_eq!(fence_ids(&after), ours, "the server's fences stay");

    // Generated fences, uploaded by the run and deleted by it afterwards.
    let opts = SimOptions {
        server_fences: false,
        ..opts
    };
    // Generated with the same seed: some ids are the server's already (replaced, not deleted).
    let generated = fences(30);
    let n = generated.iter().filter(|f| !ours.contains(&*f.id)).count() as u64;
    assert!(n > 0 && n < generated.len() as u64);
    let report = run(
        &opts,
        FleetSpec { seed: 10, ..spec },
        generated,
        CancellationToken::new(),
    )
    .await
    .expect("simulation runs");
    let cleanup = report.cleanup.clone().unwrap();
    assert_eq!(
        (cleanup.fences, cleanup.devices),
        (n, 40),
        "{}",
        report.render()
    );
    let (_, after) = srv.get("/v1/fences").await;
    assert_eq!(
        fence_ids(&after),
        ours,
        "the fences the run created are gone, those it replaced stay"
    );
    srv.stop().await;
}
