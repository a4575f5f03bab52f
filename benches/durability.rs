//! Durability benchmark (harness = false): warm start from the redb store, and ingest throughput
//! with `durability = "sync"` vs `"async"` vs `"none"`, in one run.
//!
//! `cargo bench --bench durability [-- --pairs N --fixes N --batch N --clients N --rounds N
//! --more-clients N --only warm|ingest]`. Unknown arguments (cargo passes `--bench`) are ignored.
//!
//! 1. **Warm start** (`--pairs`, default 1,900,000 live pairs): deterministic state is built by
//!    running one fix per device through a real [`Engine`] (seeded PRNG, no files): about
//!    `pairs / 1.9` devices spread over clusters of three overlapping fences (a 300 m square, a
//!    120 m circle and a 160 m square, dwell thresholds 10 min and 1 h), each device inside 0
//!    (5%), 1 (30%), 2 (35%) or 3 (30%) of them, every visit open with both thresholds pending;
//!    1% of the devices also hold a fix in their reorder buffer. The exported state, the fences,
//!    the last `log_capacity` ENTER events and the meta values are written to a fresh store with
//!    `Store::commit` (50k devices per commit), and everything is dropped. Then the warm start is
//!    timed: it is the service's own [`geodwell::boot::boot`], which reports its phases
//!    (`Store::open`, `Store::load`, parsing the fences, rebuilding the event log, rebuilding one
//!    engine per shard on parallel threads). Three variants: the whole page cache dropped
//!    (`drop_caches`, only when run as root), the page cache dropped for the store files
//!    (`dd iflag=nocache`), and a warm page cache. After the warm variant the watermark is
//!    advanced past every 10 min deadline to check that each restored pair fires its DWELL
//!    exactly once (not timed).
//! 2. **Ingest**: the real server in-process (`geodwell::Service`, event clock, 2 shards on this
//!    machine), a few fences PUT over HTTP, then `--fixes` fixes (default 200,000) in NDJSON
//!    batches of `--batch` (1,000) from `--clients` (4) concurrent reqwest tasks in the same
//!    tokio runtime (client and server share the cores), per mode, `--rounds` (2) times in
//!    alternating order, then once per mode with `--more-clients` (16; 0 = skip) clients as a
//!    what-if. Reports accepted fixes/s, request latency p50/p99, store commits (from
//!    `/metrics`) and CPU use: cores used by this process and by every other process on the
//!    machine (from `/proc`), since other work on the shared cores skews every figure.
//!
//! 3. **Checkpoint writes** (`--only checkpoint`): a checkpoint file holding the devices of
//!    `--pairs / 10` and of `--pairs` live pairs, then rounds that write every device again
//!    (each with a new `last_applied`) in a shuffled order, in chunks of 2,048 as the shards
//!    hand them out, with the writer's sort buffer (`SORT_BUFFER_BYTES`) and without it (each
//!    record written as it comes), alternated. Reports each round's wall and CPU time.
//!
//! Prints markdown tables and writes `target/bench/durability.json`. See
//! `docs/bench-durability.md`.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use geodwell::config::Config;
use geodwell::shard::shard_of;
use geodwell::store::checkpoint::{CHECKPOINT_FILE, CheckpointStore, SORT_BUFFER_BYTES};
use geodwell::store::{Batch, CheckpointMeta, FILE_NAME, Flush, ShardPoint, Store};
use geodwell_core::engine::{DeviceState, Engine, EngineConfig, Restored};
use geodwell_core::event::Event;
use geodwell_core::fences::{Fence, FenceSettings};
use geodwell_core::fix::Fix;
use geodwell_core::partition::record::encode_fixes;
use geodwell_core::time::{Dur, Ts};
use geodwell_sim::rng::Rng;
use serde_json::{Value, json};

#[path = "common/out.rs"]
mod benchout;

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;
/// Event-time window over which the warm-start devices send their one fix.
const WINDOW_MS: i64 = 300_000;
const M_PER_DEG: f64 = Fence::M_PER_DEG;
const DEVICES_PER_COMMIT: usize = 50_000;
const GOAL_WARM_S: f64 = 3.0;

struct Args {
    pairs: usize,
    fixes: usize,
    batch: usize,
    clients: usize,
    rounds: usize,
    /// Clients of the extra scaling run per mode (0 = none).
    more_clients: usize,
    /// Fixes in the input log after the warm start's checkpoint.
    log_fixes: usize,
    only: Option<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        pairs: 1_900_000,
        fixes: 200_000,
        batch: 1_000,
        clients: 4,
        rounds: 2,
        more_clients: 16,
        log_fixes: 1_500_000,
        only: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let val = argv.get(i + 1);
        let num = val.and_then(|v| v.replace('_', "").parse::<usize>().ok());
        let slot = match argv[i].as_str() {
            "--pairs" => Some(&mut a.pairs),
            "--fixes" => Some(&mut a.fixes),
            "--batch" => Some(&mut a.batch),
            "--clients" => Some(&mut a.clients),
            "--rounds" => Some(&mut a.rounds),
            "--more-clients" => Some(&mut a.more_clients),
            "--log-fixes" => Some(&mut a.log_fixes),
            "--only" => {
                if let Some(v) = val {
                    a.only = Some(v.clone());
                    i += 1;
                }
                None
            }
            _ => None,
        };
        if let (Some(slot), Some(n)) = (slot, num) {
            *slot = n;
            i += 1;
        }
        i += 1;
    }
    for v in [
        &mut a.pairs,
        &mut a.fixes,
        &mut a.batch,
        &mut a.clients,
        &mut a.rounds,
    ] {
        *v = (*v).max(1);
    }
    a
}

/// A store path that does not exist yet (`.0`), inside a fresh temp dir removed (with the
/// store) when this is dropped.
struct TempDir(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let root = tempfile::Builder::new()
            .prefix(&format!("geodwell-bench-{tag}-"))
            .tempdir()
            .expect("a temp dir");
        TempDir(root.path().join("store"), root)
    }
}

/// User + system CPU seconds of this process so far (Linux `/proc/self/stat`, 100 Hz ticks).
fn cpu_secs() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Busy CPU seconds of the whole machine so far (`/proc/stat`: all but idle and iowait).
fn machine_busy_secs() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/stat") else {
        return f64::NAN;
    };
    let v: Vec<f64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    (v.iter().sum::<f64>() - idle) / 100.0
}

/// CPU use over an interval: this process, and every other process on the machine (which
/// competes for the same cores: builds and tests of other sessions).
#[derive(Debug, Clone, Copy)]
struct CpuProbe {
    ours: f64,
    machine: f64,
    at: Instant,
}

impl CpuProbe {
    fn start() -> CpuProbe {
        CpuProbe {
            ours: cpu_secs(),
            machine: machine_busy_secs(),
            at: Instant::now(),
        }
    }
    /// (cores used by this process, cores used by other processes), averaged over the interval.
    fn cores(&self) -> (f64, f64) {
        let wall = self.at.elapsed().as_secs_f64();
        let ours = cpu_secs() - self.ours;
        let all = machine_busy_secs() - self.machine;
        (ours / wall, ((all - ours) / wall).max(0.0))
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn load_config(extra: &str, cores: usize) -> Config {
    let text = format!("[server]\nlisten = \"127.0.0.1:0\"\n[fences]\nfences_file = \"\"\n{extra}");
    Config::load(Some(("bench", &text)), &BTreeMap::new(), cores).expect("bench config is valid")
}

fn ms(d: f64) -> String {
    format!("{:.0} ms", d * 1e3)
}

// ---------------------------------------------------------------------------------------------
// Part 1: warm start
// ---------------------------------------------------------------------------------------------

/// Offsets in metres from a cluster centre to degrees at latitude `lat`.
fn offset(lon: f64, lat: f64, dx_m: f64, dy_m: f64) -> (f64, f64) {
    let kx = M_PER_DEG * lat.to_radians().cos();
    (lon + dx_m / kx, lat + dy_m / M_PER_DEG)
}

fn square(
    id: &str,
    lon: f64,
    lat: f64,
    half_m: f64,
    settings: &FenceSettings,
    limits: &geodwell_core::fences::FenceLimits,
) -> Fence {
    let (w, s) = offset(lon, lat, -half_m, -half_m);
    let (e, n) = offset(lon, lat, half_m, half_m);
    let ring = vec![[w, s], [e, s], [e, n], [w, n], [w, s]];
    Fence::new_polygon(id, &[vec![ring]], settings.clone(), limits).expect("square is valid")
}

/// Three overlapping fences per cluster: A, a 300 m square at the centre; B, a 120 m circle
/// 90 m east; C, a 160 m square 30 m east and 70 m north.
fn cluster_fences(clusters: usize, limits: &geodwell_core::fences::FenceLimits) -> Vec<Fence> {
    let mut out = Vec::with_capacity(clusters * 3);
    for c in 0..clusters {
        let (lon, lat) = cluster_centre(c);
        let settings = FenceSettings {
            dwell: vec![Dur::from_mins(10), Dur::from_mins(60)],
            tags: Arc::new(json!({"kind": "site", "cluster": c})),
            ..FenceSettings::default()
        };
        out.push(square(
            &format!("site-{c:05}-a"),
            lon,
            lat,
            150.0,
            &settings,
            limits,
        ));
        let (blon, blat) = offset(lon, lat, 90.0, 0.0);
        out.push(
            Fence::new_circle(
                &format!("site-{c:05}-b"),
                blon,
                blat,
                120.0,
                settings.clone(),
                limits,
            )
            .expect("circle is valid"),
        );
        let (clon, clat) = offset(lon, lat, 30.0, 70.0);
        out.push(square(
            &format!("site-{c:05}-c"),
            clon,
            clat,
            80.0,
            &settings,
            limits,
        ));
    }
    out
}

fn cluster_centre(c: usize) -> (f64, f64) {
    (10.0 + (c % 60) as f64 * 0.03, 48.0 + (c / 60) as f64 * 0.02)
}

struct Built {
    devices: Vec<DeviceState>,
    /// Each device's position (lon, lat), by device number.
    positions: Vec<(f64, f64)>,
    fences: Vec<Fence>,
    events: Vec<Event>,
    next_seq: u64,
    watermark: i64,
    pairs: u64,
    buffered: u64,
    secs: f64,
}

/// Runs one fix per device through a real engine and exports the state.
fn build_state(target_pairs: usize, cfg: &Config) -> Built {
    let t = Instant::now();
    let limits = geodwell::boot::fence_limits(cfg);
    let n = (target_pairs as u64 * 100 / 190).max(1) as usize;
    let clusters = n.div_ceil(333).max(1);
    let fences = cluster_fences(clusters, &limits);
    let mut engine = Engine::new(EngineConfig {
        tick: cfg.tick,
        ..EngineConfig::default()
    });
    let mut sink = Vec::new();
    for f in &fences {
        engine.upsert_fence(Arc::new(f.clone()), &mut sink);
    }
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut tail: VecDeque<Event> = VecDeque::with_capacity(cfg.log_capacity + 1);
    let mut out = Vec::new();
    // Numbered in emission order, as the service's event log numbers them.
    let mut seq = 0u64;
    let mut keep = |out: &mut Vec<Event>| {
        for mut e in out.drain(..) {
            seq += 1;
            e.seq = seq;
            tail.push_back(e);
            if tail.len() > cfg.log_capacity {
                tail.pop_front();
            }
        }
    };
    let mut positions = Vec::with_capacity(n);
    for i in 0..n {
        let c = (rng.next_u64() % clusters as u64) as usize;
        let class = match rng.unit() {
            x if x < 0.05 => 0,
            x if x < 0.35 => 1,
            x if x < 0.70 => 2,
            _ => 3,
        };
        let (clon, clat) = cluster_centre(c);
        let cf = &fences[3 * c..3 * c + 3];
        let (lon, lat) = loop {
            let (bx, by) = if class == 0 {
                ((-240.0, 240.0), (-240.0, 240.0))
            } else {
                ((-150.0, 210.0), (-150.0, 150.0))
            };
            let (dx, dy) = (rng.range(bx.0, bx.1), rng.range(by.0, by.1));
            let (lon, lat) = offset(clon, clat, dx, dy);
            if cf.iter().filter(|f| f.contains(lon, lat)).count() == class {
                break (lon, lat);
            }
        };
        positions.push((lon, lat));
        let ts = Ts(T0 + i as i64 * WINDOW_MS / n as i64);
        let fix = Fix {
            device: format!("device-{i:07}").into(),
            ts,
            lat,
            lon,
            accuracy: Some(10.0),
        };
        engine.ingest(&fix, ts, &mut out).expect("fix is taken");
        keep(&mut out);
    }
    let w = T0 + WINDOW_MS;
    engine.advance(Ts(w), &mut out);
    keep(&mut out);
    // 1% of the devices have a later fix waiting in their reorder buffer.
    for (i, &(lon, lat)) in positions.iter().enumerate().step_by(100) {
        let fix = Fix {
            device: format!("device-{i:07}").into(),
            ts: Ts(w + 1 + (i as i64 % 1_999)),
            lat,
            lon,
            accuracy: Some(10.0),
        };
        engine.ingest(&fix, Ts(w), &mut out).expect("fix is taken");
        keep(&mut out);
    }
    let stats = engine.stats();
    let next_seq = tail.back().map_or(1, |e| e.seq + 1);
    let devices = engine.export();
    Built {
        devices,
        positions,
        fences,
        events: tail.into_iter().collect(),
        next_seq,
        watermark: w,
        pairs: stats.pairs,
        buffered: stats.buffered,
        secs: t.elapsed().as_secs_f64(),
    }
}

/// Writes the built state to a fresh store as its checkpoint, then `log_fixes` more fixes of
/// the same devices (staying where they are, a second apart in event time per device) as the
/// input log after it, in records of 5,000 fixes per shard: what a crash one checkpoint interval
/// after the checkpoint leaves to replay. Returns seconds taken and the input log's bytes.
fn write_store(dir: &Path, b: Built, cfg: &Config, log_fixes: usize) -> (f64, u64) {
    let t = Instant::now();
    let store = Store::open(dir).expect("store opens");
    let mut w = store.checkpoints().writer().expect("checkpoint writer");
    let fences: Vec<(String, Option<String>)> = b
        .fences
        .iter()
        .map(|f| {
            (
                f.id.to_string(),
                Some(serde_json::to_string(&f.to_feature()).expect("feature serializes")),
            )
        })
        .collect();
    w.fences(&fences).expect("fences");
    for chunk in b.devices.chunks(DEVICES_PER_COMMIT) {
        w.devices(chunk).expect("devices");
    }
    w.commit(&CheckpointMeta {
        round: 1,
        shards: cfg.shards as u32,
        fence_change: 0,
        event_floor: b.next_seq,
        shards_at: vec![
            ShardPoint {
                watermark: Some(b.watermark),
                ..ShardPoint::start()
            };
            cfg.shards
        ],
    })
    .expect("checkpoint commits");
    let emitted = Some(Ts(b.watermark));
    let events = b
        .events
        .into_iter()
        .map(|mut e| {
            e.emitted_at = emitted;
            let json: Arc<str> = serde_json::to_string(&e).expect("event serializes").into();
            (e.seq, json)
        })
        .collect();
    // The log: fixes in time order, each with the event-mode stamp it arrived under.
    let n = b.positions.len().max(1);
    let base = b.watermark + cfg.lateness.0 + 1_000;
    let mut per_shard: Vec<Vec<(Fix, Ts)>> = vec![Vec::new(); cfg.shards];
    let mut seqs = vec![0u64; cfg.shards];
    let mut log_bytes = 0u64;
    let mut max_ts = b.watermark + cfg.lateness.0;
    let mut pending: Vec<(u16, u64, Vec<u8>)> = Vec::new();
    let mut flush_shard =
        |k: usize, fixes: &mut Vec<(Fix, Ts)>, pending: &mut Vec<(u16, u64, Vec<u8>)>| {
            if fixes.is_empty() {
                return;
            }
            let mut rec = Vec::new();
            encode_fixes(
                fixes.first().map(|f| f.1),
                fixes.len(),
                fixes.iter().map(|(f, s)| (f, *s)),
                &mut rec,
            );
            seqs[k] += 1;
            log_bytes += rec.len() as u64;
            pending.push((k as u16, seqs[k], rec));
            fixes.clear();
        };
    for i in 0..log_fixes {
        let d = i % n;
        let (lon, lat) = b.positions[d];
        let ts = base + (i / n) as i64 * 1_000 + (d as i64 * 1_000 / n as i64);
        max_ts = max_ts.max(ts);
        let id = format!("device-{d:07}");
        let k = shard_of(&id, cfg.shards);
        let fix = Fix {
            device: id.into(),
            ts: Ts(ts),
            lat,
            lon,
            accuracy: Some(10.0),
        };
        per_shard[k].push((fix, Ts(max_ts - cfg.lateness.0)));
        if per_shard[k].len() == 5_000 {
            flush_shard(k, &mut per_shard[k], &mut pending);
        }
        if pending.len() >= 64 {
            store
                .commit(
                    &Batch {
                        inputs: std::mem::take(&mut pending),
                        ..Batch::default()
                    },
                    Flush::Deferred,
                )
                .expect("log commit");
        }
    }
    for (k, fixes) in per_shard.iter_mut().enumerate() {
        flush_shard(k, fixes, &mut pending);
    }
    store
        .commit(
            &Batch {
                inputs: pending,
                events,
                watermark: Some(b.watermark),
                max_seen: Some(max_ts),
                next_seq: Some(b.next_seq),
                ..Batch::default()
            },
            Flush::Fsync,
        )
        .expect("final commit");
    drop(store);
    (t.elapsed().as_secs_f64(), log_bytes)
}

#[derive(Debug, Clone, Default)]
struct Warm {
    variant: &'static str,
    open: f64,
    load: f64,
    fences: f64,
    events: f64,
    restore: Vec<f64>,
    restore_wall: f64,
    replay_wall: f64,
    replayed_fixes: u64,
    total: f64,
    restored: Restored,
    fence_count: usize,
    event_count: usize,
    timers: u64,
    dwell_check: Option<(u64, u64)>,
    /// (cores used by this process, by other processes) during the timed warm start.
    cpu: (f64, f64),
}

/// One warm start: [`geodwell::boot::boot`], the service's own, phase by phase.
fn warm_start(dir: &Path, cfg: &Config, variant: &'static str, check: bool) -> Warm {
    let mut cfg = cfg.clone();
    cfg.data_dir = dir.to_path_buf();
    let probe = CpuProbe::start();
    let booted = geodwell::boot::boot(&cfg).expect("warm start");
    let cpu = probe.cores();
    let tm = &booted.timings;
    let secs = |d: Duration| d.as_secs_f64();
    let mut r = Warm {
        variant,
        open: secs(tm.open),
        load: secs(tm.load),
        fences: secs(tm.fences),
        events: secs(tm.events),
        restore: tm.per_shard.iter().map(|d| secs(*d)).collect(),
        restore_wall: secs(tm.restore),
        replay_wall: secs(tm.replay),
        replayed_fixes: booted.summary.replayed_fixes,
        total: secs(booted.took),
        restored: booted.summary.restored,
        fence_count: booted.fences.len(),
        event_count: booted.summary.events,
        timers: booted.summary.timers,
        dwell_check: None,
        cpu,
    };
    if check && let Some(w) = booted.watermark {
        // Every 10 min deadline is at most WINDOW_MS + 10 min after T0; the 1 h ones are later.
        let target = Ts(w.0 + 600_000 + 2_000);
        let mut dwells = 0u64;
        let mut shards = booted.shards;
        // DWELLs the replay already fired count too (they come out as new events at start).
        dwells += shards
            .iter()
            .flat_map(|s| &s.pending)
            .filter(|ev| ev.dwell_s.is_some())
            .count() as u64;
        for d in shards.iter_mut().map(|s| &mut s.driver) {
            let mut carried = d.advance(target);
            loop {
                let out = d.take_events();
                dwells += out.iter().filter(|ev| ev.dwell_s.is_some()).count() as u64;
                if !carried {
                    break;
                }
                carried = d.work_off();
            }
        }
        r.dwell_check = Some((dwells, r.restored.pairs));
    }
    r
}

fn drop_page_cache(file: &Path) -> bool {
    std::process::Command::new("dd")
        .arg(format!("if={}", file.display()))
        .args(["iflag=nocache", "count=0", "status=none"])
        .status()
        .is_ok_and(|s| s.success())
}

/// `sync`, then `echo 3 > /proc/sys/vm/drop_caches`; false (nothing dropped) unless root.
fn drop_all_caches() -> bool {
    std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success())
        && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn print_warm(rows: &[Warm]) {
    println!(
        "| variant | open | load (checkpoint + log) | parse fences | events tail | restore | replay | per shard (restore + replay) | total | goal <= 3 s | cores: ours / other procs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---|---:|---|---|");
    for r in rows {
        let per: Vec<String> = r.restore.iter().map(|s| ms(*s)).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} ({} fixes) | {} | **{}** | {} | {:.2} / {:.2} |",
            r.variant,
            ms(r.open),
            ms(r.load),
            ms(r.fences),
            ms(r.events),
            ms(r.restore_wall),
            ms(r.replay_wall),
            r.replayed_fixes,
            per.join(" + "),
            ms(r.total),
            if r.total <= GOAL_WARM_S {
                "met"
            } else {
                "MISSED"
            },
            r.cpu.0,
            r.cpu.1
        );
    }
}

fn warm_json(r: &Warm) -> Value {
    json!({
        "variant": r.variant, "open_s": r.open, "load_s": r.load, "parse_fences_s": r.fences,
        "events_tail_s": r.events, "restore_wall_s": r.restore_wall,
        "replay_wall_s": r.replay_wall, "replayed_fixes": r.replayed_fixes,
        "restore_per_shard_s": r.restore, "total_s": r.total, "devices": r.restored.devices,
        "pairs": r.restored.pairs, "dropped_pairs": r.restored.dropped_pairs,
        "buffered_fixes": r.restored.buffered, "fences": r.fence_count, "events": r.event_count,
        "wheel_live_timers": r.timers,
        "cores_ours": r.cpu.0, "cores_other_processes": r.cpu.1,
        "dwell_check": r.dwell_check.map(|(fired, pairs)| json!({"dwell_10m_fired": fired, "pairs": pairs})),
    })
}

fn part_warm(args: &Args, cores: usize) -> (Value, bool) {
    let cfg = load_config("", cores);
    println!(
        "\n## Warm start ({} target pairs, {} shards, log_capacity {})\n",
        args.pairs, cfg.shards, cfg.log_capacity
    );
    let built = build_state(args.pairs, &cfg);
    let (devices, pairs, buffered, fences, events) = (
        built.devices.len(),
        built.pairs,
        built.buffered,
        built.fences.len(),
        built.events.len(),
    );
    let build_s = built.secs;
    println!(
        "built: {devices} devices, {pairs} live pairs, {buffered} buffered fixes, {fences} fences, \
         {events} events in the tail, in {build_s:.1} s (engine ingest + export, not timed below)"
    );
    let dir = TempDir::new("warm");
    let (write_s, log_bytes) = write_store(&dir.0, built, &cfg, args.log_fixes);
    let file = dir.0.join(CHECKPOINT_FILE);
    let bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
    let live = dir.0.join(FILE_NAME);
    let live_bytes = std::fs::metadata(&live).map_or(0, |m| m.len());
    println!(
        "wrote the checkpoint in {write_s:.1} s: {:.1} MB ({:.0} bytes per device); an input log of {} fixes to replay: {:.1} MB of records ({:.1} bytes per fix), live file {:.1} MB\n",
        bytes as f64 / 1e6,
        bytes as f64 / devices.max(1) as f64,
        args.log_fixes,
        log_bytes as f64 / 1e6,
        log_bytes as f64 / args.log_fixes.max(1) as f64,
        live_bytes as f64 / 1e6
    );
    let mut rows = Vec::new();
    // The whole page cache dropped (root only): the journal and every other file are read from
    // disk again too, which the per-file variant below leaves cached.
    if drop_all_caches() {
        rows.push(warm_start(
            &dir.0,
            &cfg,
            "whole page cache dropped (drop_caches)",
            false,
        ));
    } else {
        eprintln!(
            "whole page cache not dropped (needs root and a writable /proc/sys): row left out"
        );
    }
    let cold_ok = drop_page_cache(&file) && drop_page_cache(&live);
    rows.push(warm_start(
        &dir.0,
        &cfg,
        if cold_ok {
            "store file not in page cache"
        } else {
            "page cache (dd nocache failed)"
        },
        false,
    ));
    rows.push(warm_start(&dir.0, &cfg, "page cache warm", true));
    print_warm(&rows);
    let main = &rows[rows.len() - 1];
    println!(
        "\nrestored {} devices, {} pairs ({} dropped), {} buffered fixes, {} fences, {} events; \
         wheel live timers after restore: {} (sum over {} shards)",
        main.restored.devices,
        main.restored.pairs,
        main.restored.dropped_pairs,
        main.restored.buffered,
        main.fence_count,
        main.event_count,
        main.timers,
        cfg.shards
    );
    let mut ok = main.restored.pairs == pairs && main.restored.dropped_pairs == 0;
    if let Some((fired, p)) = main.dwell_check {
        println!(
            "check: advancing the restored engines past every 10 min deadline fired {fired} DWELL \
             events for {p} pairs ({})",
            if fired == p { "ok" } else { "MISMATCH" }
        );
        ok &= fired == p;
    }
    let j = json!({
        "target_pairs": args.pairs, "devices": devices, "pairs": pairs, "buffered_fixes": buffered,
        "fences": fences, "events_tail": events, "shards": cfg.shards, "build_s": build_s,
        "write_s": write_s, "checkpoint_file_bytes": bytes, "live_file_bytes": live_bytes,
        "log_fixes": args.log_fixes, "log_record_bytes": log_bytes,
        "goal_total_s": GOAL_WARM_S,
        "runs": rows.iter().map(warm_json).collect::<Vec<_>>(),
    });
    (j, ok)
}

// ---------------------------------------------------------------------------------------------
// Part 2: ingest throughput per durability mode
// ---------------------------------------------------------------------------------------------

const INGEST_FENCES: usize = 50;

fn ingest_fence_centre(h: usize) -> (f64, f64) {
    (10.0 + (h % 10) as f64 * 0.05, 50.0 + (h / 10) as f64 * 0.05)
}

fn ingest_fences() -> Vec<(String, Value)> {
    (0..INGEST_FENCES)
        .map(|h| {
            let (lon, lat) = ingest_fence_centre(h);
            let id = format!("bench-{h:02}");
            let (dx, dy) = (0.0015, 0.001);
            let f = json!({
                "type": "Feature",
                "id": id,
                "geometry": {"type": "Polygon", "coordinates": [[
                    [lon - dx, lat - dy], [lon + dx, lat - dy], [lon + dx, lat + dy],
                    [lon - dx, lat + dy], [lon - dx, lat - dy]
                ]]},
                "properties": {"dwell": ["30s", "2m"], "tags": {"kind": "bench"}},
            });
            (id, f)
        })
        .collect()
}

/// NDJSON bodies: fix `g` is device `g % devices` at `T0 + g` ms; a device is inside its home
/// fence for four fixes out of five (so visits open, reach 30 s DWELL and close).
fn ingest_bodies(fixes: usize, batch: usize) -> (Vec<Bytes>, usize) {
    let devices = (fixes / 10).clamp(1, 20_000);
    let bodies = (0..fixes.div_ceil(batch))
        .map(|k| {
            let mut s = String::with_capacity(batch * 90);
            for g in k * batch..((k + 1) * batch).min(fixes) {
                let d = g % devices;
                let m = g / devices;
                let (clon, clat) = ingest_fence_centre(d % INGEST_FENCES);
                let jitter = ((d * 7919) % 100) as f64 * 1e-5 - 5e-4;
                let (lon, lat) = if !(m + d).is_multiple_of(5) {
                    (clon + jitter, clat + jitter * 0.5)
                } else {
                    (clon + jitter, clat + 0.01)
                };
                s.push_str(&format!(
                    "{{\"device\":\"dev-{d:06}\",\"ts\":{},\"lat\":{lat:.6},\"lon\":{lon:.6}}}\n",
                    T0 + g as i64
                ));
            }
            Bytes::from(s)
        })
        .collect();
    (bodies, devices)
}

#[derive(Debug, Clone, Default)]
struct IngestRun {
    mode: &'static str,
    round: usize,
    clients: usize,
    wall_s: f64,
    accepted: u64,
    late: u64,
    duplicate: u64,
    rejected: u64,
    retries_503: u64,
    errors: u64,
    latencies_ms: Vec<f64>,
    commits: f64,
    commit_s: f64,
    events: f64,
    cpu_s: f64,
    /// Cores used by other processes during the run.
    others: f64,
    file_bytes: u64,
}

impl IngestRun {
    fn rate(&self) -> f64 {
        self.accepted as f64 / self.wall_s
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Sum of the samples of a metric (any labels) in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn ingest_mode(
    mode: &'static str,
    round: usize,
    bodies: &Arc<Vec<Bytes>>,
    clients: usize,
    cores: usize,
) -> IngestRun {
    let dir = TempDir::new(mode);
    let mut cfg = load_config(
        &format!(
            "[time]\nclock = \"event\"\nlateness = \"30s\"\n[store]\ndurability = \"{mode}\"\n"
        ),
        cores,
    );
    cfg.data_dir = dir.0.clone();
    let running = geodwell::Service::start(cfg).await.expect("server starts");
    let base = format!("http://{}", running.addr());
    let http = reqwest::Client::new();
    for (id, f) in ingest_fences() {
        let r = http
            .put(format!("{base}/v1/fences/{id}"))
            .json(&f)
            .send()
            .await
            .expect("fence PUT");
        assert!(r.status().is_success(), "fence PUT: {}", r.status());
    }
    let scrape = || async {
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .unwrap_or_default()
    };
    let m0 = scrape().await;
    let next = Arc::new(AtomicUsize::new(0));
    let cpu0 = cpu_secs();
    let probe = CpuProbe::start();
    let t = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, bodies, next) = (http.clone(), bodies.clone(), next.clone());
            let url = format!("{base}/v1/fixes");
            tokio::spawn(async move {
                let mut r = IngestRun::default();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(k) else { break };
                    loop {
                        let sent = Instant::now();
                        let resp = http
                            .post(&url)
                            .header("content-type", "application/x-ndjson")
                            .body(body.clone())
                            .send()
                            .await;
                        let resp = match resp {
                            Ok(resp) => resp,
                            Err(_) => {
                                r.errors += 1;
                                break;
                            }
                        };
                        let status = resp.status().as_u16();
                        let v: Value = resp.json().await.unwrap_or(Value::Null);
                        if status == 503 {
                            r.retries_503 += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        if status != 200 {
                            r.errors += 1;
                            break;
                        }
                        r.latencies_ms.push(sent.elapsed().as_secs_f64() * 1e3);
                        let n = |k: &str| v[k].as_u64().unwrap_or(0);
                        r.accepted += n("accepted");
                        r.late += n("late");
                        r.duplicate += n("duplicate");
                        r.rejected += n("rejected");
                        break;
                    }
                }
                r
            })
        })
        .collect();
    let mut run = IngestRun {
        mode,
        round,
        clients,
        ..IngestRun::default()
    };
    for task in tasks {
        let r = task.await.expect("client task");
        run.accepted += r.accepted;
        run.late += r.late;
        run.duplicate += r.duplicate;
        run.rejected += r.rejected;
        run.retries_503 += r.retries_503;
        run.errors += r.errors;
        run.latencies_ms.extend(r.latencies_ms);
    }
    run.wall_s = t.elapsed().as_secs_f64();
    run.cpu_s = cpu_secs() - cpu0;
    run.others = probe.cores().1;
    let m1 = scrape().await;
    let commits = "geodwell_store_commits_total";
    let sum = "geodwell_store_commit_duration_seconds_sum";
    run.commits = metric(&m1, commits) - metric(&m0, commits);
    run.commit_s = metric(&m1, sum) - metric(&m0, sum);
    let emitted = "geodwell_events_emitted_total";
    run.events = metric(&m1, emitted) - metric(&m0, emitted);
    run.latencies_ms.sort_by(f64::total_cmp);
    match tokio::time::timeout(
        Duration::from_secs(60),
        running.shutdown(Duration::from_secs(30)),
    )
    .await
    {
        Ok(Ok(())) => {}
        other => eprintln!("{mode}: server did not stop cleanly: {other:?}"),
    }
    run.file_bytes = std::fs::metadata(dir.0.join(FILE_NAME)).map_or(0, |m| m.len());
    run
}

fn part_ingest(args: &Args, cores: usize) -> (Value, bool) {
    let (bodies, devices) = ingest_bodies(args.fixes, args.batch);
    let bodies = Arc::new(bodies);
    let body_bytes: usize = bodies.iter().map(|b| b.len()).sum();
    println!(
        "\n## Ingest ({} fixes in {} NDJSON batches of {}, {} devices, {} fences, {} clients, \
         {} rounds, {} cores shared by client and server)\n",
        args.fixes,
        bodies.len(),
        args.batch,
        devices,
        INGEST_FENCES,
        args.clients,
        args.rounds,
        cores
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let modes = ["none", "async", "sync"];
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        let order: Vec<&'static str> = if round % 2 == 0 {
            modes.to_vec()
        } else {
            modes.iter().rev().copied().collect()
        };
        for mode in order {
            let r = rt.block_on(ingest_mode(mode, round, &bodies, args.clients, cores));
            eprintln!(
                "  round {round} {mode}: {:.0} fixes/s, p50 {:.1} ms, p99 {:.1} ms, {} commits, {} events",
                r.rate(),
                pct(&r.latencies_ms, 0.5),
                pct(&r.latencies_ms, 0.99),
                r.commits,
                r.events
            );
            runs.push(r);
        }
    }
    // What-if: more concurrent clients (group commit can merge more requests per fsync).
    let mut extra = Vec::new();
    if args.more_clients > 0 {
        for mode in modes {
            let r = rt.block_on(ingest_mode(
                mode,
                args.rounds,
                &bodies,
                args.more_clients,
                cores,
            ));
            eprintln!(
                "  {} clients {mode}: {:.0} fixes/s, p50 {:.1} ms, p99 {:.1} ms, {} commits",
                args.more_clients,
                r.rate(),
                pct(&r.latencies_ms, 0.5),
                pct(&r.latencies_ms, 0.99),
                r.commits
            );
            extra.push(r);
        }
    }
    drop(rt);
    println!(
        "| durability | accepted fixes/s (per round) | vs none | request p50 | request p99 | commits | fixes per commit | mean commit | cores: ours / other procs | late / 503 / errors | store file |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    let mut summary = Vec::new();
    let mut ok = true;
    let rate_of = |mode: &str| -> f64 {
        let r: Vec<f64> = runs
            .iter()
            .filter(|r| r.mode == mode)
            .map(IngestRun::rate)
            .collect();
        r.iter().sum::<f64>() / r.len().max(1) as f64
    };
    let base = rate_of("none");
    for mode in modes {
        let rs: Vec<&IngestRun> = runs.iter().filter(|r| r.mode == mode).collect();
        let mut lat: Vec<f64> = rs.iter().flat_map(|r| r.latencies_ms.clone()).collect();
        lat.sort_by(f64::total_cmp);
        let rates: Vec<String> = rs.iter().map(|r| format!("{:.0}", r.rate())).collect();
        let mean = rate_of(mode);
        let accepted: u64 = rs.iter().map(|r| r.accepted).sum();
        let commits: f64 = rs.iter().map(|r| r.commits).sum();
        let commit_s: f64 = rs.iter().map(|r| r.commit_s).sum();
        let wall: f64 = rs.iter().map(|r| r.wall_s).sum();
        let cpu: f64 = rs.iter().map(|r| r.cpu_s).sum();
        let others: f64 = rs.iter().map(|r| r.others * r.wall_s).sum();
        let late: u64 = rs.iter().map(|r| r.late).sum();
        let retries: u64 = rs.iter().map(|r| r.retries_503).sum();
        let errors: u64 = rs.iter().map(|r| r.errors + r.rejected).sum();
        let file = rs.iter().map(|r| r.file_bytes).max().unwrap_or(0);
        ok &= errors == 0 && accepted > 0;
        println!(
            "| {mode} | **{mean:.0}** ({}) | {:.0}% | {:.1} ms | {:.1} ms | {} | {} | {} | {:.2} / {:.2} | {late} / {retries} / {errors} | {} |",
            rates.join(", "),
            100.0 * mean / base,
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            commits,
            if commits > 0.0 {
                format!("{:.0}", accepted as f64 / commits)
            } else {
                "-".into()
            },
            if commits > 0.0 {
                format!("{:.1} ms", 1e3 * commit_s / commits)
            } else {
                "-".into()
            },
            cpu / wall,
            others / wall,
            if file > 0 {
                format!("{:.1} MB", file as f64 / 1e6)
            } else {
                "-".into()
            }
        );
        summary.push(json!({
            "mode": mode, "fixes_per_s_mean": mean,
            "fixes_per_s_rounds": rs.iter().map(|r| r.rate()).collect::<Vec<_>>(),
            "p50_ms": pct(&lat, 0.5), "p99_ms": pct(&lat, 0.99), "max_ms": lat.last().copied(),
            "requests": lat.len(), "accepted": accepted, "late": late, "retries_503": retries,
            "errors": errors, "commits": commits, "commit_seconds": commit_s,
            "cores_ours": cpu / wall, "cores_other_processes": others / wall, "store_file_bytes": file,
        }));
    }
    let (acc, evs) = runs.iter().fold((0.0, 0.0), |(a, e), r| {
        (a + r.accepted as f64, e + r.events)
    });
    println!(
        "\nevents emitted (and, with a store, committed) per accepted fix: {:.2}",
        evs / acc.max(1.0)
    );
    if !extra.is_empty() {
        println!(
            "\nWhat-if, one run per mode with {} clients:\n",
            args.more_clients
        );
        println!(
            "| durability | clients | accepted fixes/s | request p50 | request p99 | commits | fixes per commit | mean commit | cores: ours / other procs |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &extra {
            ok &= r.errors == 0 && r.rejected == 0 && r.accepted > 0;
            println!(
                "| {} | {} | **{:.0}** | {:.1} ms | {:.1} ms | {} | {} | {} | {:.2} / {:.2} |",
                r.mode,
                r.clients,
                r.rate(),
                pct(&r.latencies_ms, 0.5),
                pct(&r.latencies_ms, 0.99),
                r.commits,
                if r.commits > 0.0 {
                    format!("{:.0}", r.accepted as f64 / r.commits)
                } else {
                    "-".into()
                },
                if r.commits > 0.0 {
                    format!("{:.1} ms", 1e3 * r.commit_s / r.commits)
                } else {
                    "-".into()
                },
                r.cpu_s / r.wall_s,
                r.others
            );
        }
    }
    let run_json = |r: &IngestRun| {
        json!({
            "mode": r.mode, "round": r.round, "clients": r.clients, "wall_s": r.wall_s,
            "fixes_per_s": r.rate(), "accepted": r.accepted, "late": r.late,
            "retries_503": r.retries_503, "errors": r.errors + r.rejected,
            "p50_ms": pct(&r.latencies_ms, 0.5), "p99_ms": pct(&r.latencies_ms, 0.99),
            "commits": r.commits, "commit_seconds": r.commit_s, "events": r.events,
            "cpu_s": r.cpu_s,
            "cores_other_processes": r.others,
        })
    };
    let j = json!({
        "fixes": args.fixes, "batch": args.batch, "clients": args.clients, "rounds": args.rounds,
        "devices": devices, "fences": INGEST_FENCES, "body_bytes": body_bytes,
        "cores": cores, "modes": summary,
        "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
        "more_clients_runs": extra.iter().map(run_json).collect::<Vec<_>>(),
    });
    (j, ok)
}

/// Part 3: one checkpoint round of every device, written sorted (the writer's default) and as
/// the records come, side by side.
fn part_checkpoint(args: &Args) -> Value {
    const CHUNK: usize = 2_048;
    let cfg = load_config("", 2);
    let mut rows = Vec::new();
    println!("\n## Checkpoint writes: every device again, in a shuffled order\n");
    println!("| devices | writer | round | wall ms | CPU ms | µs per device | file MiB |");
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut sizes = vec![(args.pairs / 10).max(1_000), args.pairs];
    sizes.dedup();
    for pairs in sizes {
        let b = build_state(pairs, &cfg);
        let mut devices = b.devices;
        let n = devices.len();
        let dir = TempDir::new("ck-bench");
        std::fs::create_dir_all(&dir.0).expect("bench dir");
        let ck = CheckpointStore::open(&dir.0).expect("checkpoint file");
        let meta = |round| CheckpointMeta {
            round,
            shards: 2,
            ..CheckpointMeta::default()
        };
        let mut w = ck.writer().expect("writer");
        w.devices(&devices).expect("devices");
        w.commit(&meta(1)).expect("commit");
        let mut rng = Rng::new(0x5EED_C4EC);
        let mut sums: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        for round in 0..2 * args.rounds.max(2) {
            let (name, sort) = if round % 2 == 0 {
                ("sorted", SORT_BUFFER_BYTES)
            } else {
                ("as they come", 0)
            };
            for i in (1..n).rev() {
                devices.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for d in &mut devices {
                d.last_applied = d.last_applied.map(|t| t + 1_000);
            }
            let (t, cpu) = (Instant::now(), cpu_secs());
            let mut w = ck.writer().expect("writer").with_sort_buffer(sort);
            for chunk in devices.chunks(CHUNK) {
                w.devices(chunk).expect("devices");
            }
            w.commit(&meta(round as u64 + 2)).expect("commit");
            let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - cpu);
            let mib = std::fs::metadata(ck.path()).map_or(0.0, |m| m.len() as f64 / 1048576.0);
            println!(
                "| {n} | {name} | {} | {} | {} | {:.2} | {mib:.0} |",
                round + 1,
                ms(wall),
                ms(cpu),
                wall * 1e6 / n as f64
            );
            sums.entry(name).or_default().push(wall);
            rows.push(json!({"devices": n, "writer": name, "round": round + 1, "wall_s": wall, "cpu_s": cpu, "file_mib": mib}));
        }
        let med = |v: &Vec<f64>| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        if let (Some(a), Some(b)) = (sums.get("sorted"), sums.get("as they come")) {
            println!(
                "| {n} | sorted / as they come (median wall) | | {:.2}x | | | |",
                med(a) / med(b)
            );
        }
    }
    json!(rows)
}

fn main() {
    let args = parse_args();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let want = |part: &str| args.only.as_deref().is_none_or(|o| o == part);
    let mut ok = true;
    let mut out = json!({"cores": cores, "loadavg_start": loadavg()});
    println!("cores: {cores}, load average at start: {}", loadavg());
    if want("warm") {
        let (j, good) = part_warm(&args, cores);
        out["warm_start"] = j;
        ok &= good;
    }
    if want("checkpoint") {
        out["checkpoint"] = part_checkpoint(&args);
    }
    if want("ingest") {
        let (j, good) = part_ingest(&args, cores);
        out["ingest"] = j;
        ok &= good;
    }
    out["run_s"] = json!(started.elapsed().as_secs_f64());
    out["loadavg_end"] = json!(loadavg());
    println!("\nrun took {:.0} s", started.elapsed().as_secs_f64());
    match benchout::write_json("durability", &out) {
        Ok(path) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write target/bench/durability.json: {e}"),
    }
    if !ok {
        eprintln!("FAIL: a check failed (see above)");
        std::process::exit(1);
    }
}
