//! The `geodwell` command line: parse arguments, load configuration, start telemetry, and call
//! the library.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use geodwell::config::{ClockMode, Config, Sources};
use geodwell_core::time::Dur;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "geodwell", version, about = "Geofence dwell-trigger service")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the service.
    Serve(ServeArgs),
    /// Validate a configuration file (and the fences it preloads) and report every error at once.
    CheckConfig {
        /// The configuration file to check.
        file: PathBuf,
    },
    /// Drive a simulated fleet against a running server and report rates and latency.
    Simulate(Box<SimArgs>),
    /// Inspect the state store.
    Store {
        #[command(subcommand)]
        cmd: StoreCmd,
    },
}

/// `geodwell serve`: every flag overrides the configuration file and the environment.
#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (default: the embedded config/geodwell.toml). Relative paths in it
    /// resolve against its directory.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to bind, e.g. 127.0.0.1:7878 (server.listen).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Directory for persistent state (server.data_dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Watermark mode: live (wall clock) or event (data) (time.clock).
    #[arg(long)]
    clock: Option<ClockMode>,
    /// Allowed arrival disorder, e.g. 2s (time.lateness).
    #[arg(long)]
    lateness: Option<String>,
    /// Engine shards, 0 = one per core (server.shards).
    #[arg(long)]
    shards: Option<usize>,
    /// Fences that seed an empty store: a GeoJSON file, "builtin:samples", or "" for none
    /// (fences.fences_file).
    #[arg(long)]
    fences_file: Option<String>,
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Verify a store: schema version, every record decodes, events are contiguous.
    Check {
        /// The data directory holding geodwell.redb.
        #[arg(long)]
        data_dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct SimArgs {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:7878")]
    server: String,
    /// Number of devices.
    #[arg(long, default_value_t = 1000)]
    devices: u32,
    /// Number of generated fence sites (ignored with --fences-file).
    #[arg(long, default_value_t = 100)]
    sites: u32,
    /// Drive between the fences of this GeoJSON file instead of generated ones.
    #[arg(long)]
    fences_file: Option<PathBuf>,
    /// Seed of every random choice: same seed, same trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Transport: http (NDJSON batches) or ws (WebSocket ingest).
    #[arg(long, value_enum, default_value = "http")]
    transport: geodwell_sim::run::Transport,
    /// Parallel connections.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Most fixes per batch (request or frame).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Longest a batch collects, in wall time under the pace, e.g. 10ms.
    #[arg(long, value_parser = parse_dur, default_value = "10ms")]
    linger: Dur,
    /// Send this many fixes per second (event time runs as fast as needed).
    #[arg(long, conflicts_with_all = ["replay_speed", "max"])]
    rate: Option<f64>,
    /// Event time runs this many times faster than the wall clock (default 1: real time).
    #[arg(long, conflicts_with = "max")]
    replay_speed: Option<f64>,
    /// Send as fast as the server answers.
    #[arg(long)]
    max: bool,
    /// Stop after this long (wall time), e.g. 30s.
    #[arg(long, value_parser = parse_dur, default_value = "30s")]
    duration: Dur,
    /// Stop after this many fixes.
    #[arg(long)]
    fixes: Option<u64>,
    /// Shortest per-device reporting interval.
    #[arg(long, value_parser = parse_dur, default_value = "5s")]
    interval_min: Dur,
    /// Longest per-device reporting interval.
    #[arg(long, value_parser = parse_dur, default_value = "30s")]
    interval_max: Dur,
    /// Bound on delivery disorder (event time); the server's lateness should be at least this.
    #[arg(long, value_parser = parse_dur, default_value = "0ms")]
    disorder: Dur,
    /// Event time of the first fix (RFC 3339 or Unix ms; default: now, or past the server's
    /// watermark).
    #[arg(long)]
    start: Option<String>,
    /// Do not post the fences first (they are already loaded).
    #[arg(long)]
    no_upload: bool,
    /// Do not subscribe to events (no latency figures).
    #[arg(long)]
    no_measure: bool,
    /// Longest wait for trailing events after the last send.
    #[arg(long, value_parser = parse_dur, default_value = "5s")]
    drain: Dur,
    /// WebSocket frames in flight per connection.
    #[arg(long, default_value_t = 8)]
    ws_window: usize,
    /// Share of devices (0..=1) that start parked inside a fence for hours (live pairs).
    #[arg(long, default_value_t = 0.0)]
    parked: f64,
    /// Write the report as JSON to this file too.
    #[arg(long)]
    report: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Write the trace (fences.geojson, fixes.ndjson) to this directory instead of sending it.
    #[arg(long)]
    write_trace: Option<PathBuf>,
}

fn parse_dur(s: &str) -> Result<Dur, String> {
    Dur::parse(s).map_err(|e| e.to_string())
}

/// Loads the configuration: `file` (relative paths in it resolve against its directory) over the
/// embedded defaults, then the environment, then `cli` overrides (key, flag, value).
fn load(
    file: Option<&PathBuf>,
    cli: Vec<(&'static str, &'static str, String)>,
) -> anyhow::Result<Config> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let text = match file {
        Some(p) => Some((
            p.display().to_string(),
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
            p.parent().map(PathBuf::from),
        )),
        None => None,
    };
    Config::load_sources(&Sources {
        file: text
            .as_ref()
            .map(|(name, text, dir)| (name.as_str(), text.as_str(), dir.as_deref())),
        env: Config::env_overrides(),
        cli,
        cores,
    })
    .map_err(|e| anyhow::anyhow!("{e}"))
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The message is the report (config errors list every problem); no backtrace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    geodwell::telemetry::init_tracing();
    match cli.cmd {
        Cmd::CheckConfig { file } => {
            let cfg = load(Some(&file), Vec::new())?;
            let fences = geodwell::boot::load_preload(&cfg)?;
            println!(
                "{}: ok ({} shards, clock {}, listen {}, {} preloaded fences)",
                file.display(),
                cfg.shards,
                cfg.clock,
                cfg.listen,
                fences.len()
            );
            Ok(())
        }
        Cmd::Simulate(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(simulate(*args))
        }
        Cmd::Store {
            cmd: StoreCmd::Check { data_dir },
        } => {
            let report = geodwell::store::check(&data_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{report}");
            Ok(())
        }
        Cmd::Serve(args) => {
            let mut cli = Vec::new();
            if let Some(v) = args.listen {
                cli.push(("listen", "--listen", v.to_string()));
            }
            if let Some(v) = &args.data_dir {
                cli.push(("data_dir", "--data-dir", v.display().to_string()));
            }
            if let Some(v) = args.clock {
                cli.push(("clock", "--clock", v.to_string()));
            }
            if let Some(v) = args.lateness {
                cli.push(("lateness", "--lateness", v));
            }
            if let Some(v) = args.shards {
                cli.push(("shards", "--shards", v.to_string()));
            }
            if let Some(v) = args.fences_file {
                cli.push(("fences_file", "--fences-file", v));
            }
            let cfg = load(args.config.as_ref(), cli)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(serve(cfg))
        }
    }
}

async fn simulate(a: SimArgs) -> anyhow::Result<()> {
    use geodwell_sim::fleet::{FleetSpec, LayoutSpec, generate_fences};
    use geodwell_sim::run::{Pace, SimOptions};
    use std::sync::Arc;

    let fences: Vec<Arc<geodwell_core::fences::Fence>> = match &a.fences_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            geodwell_core::fences::parse_fences_str(&text, &Default::default())
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
                .into_iter()
                .map(Arc::new)
                .collect()
        }
        None => generate_fences(&LayoutSpec {
            seed: a.seed,
            sites: a.sites,
            ..LayoutSpec::default()
        })
        .into_iter()
        .map(Arc::new)
        .collect(),
    };
    let mut spec = FleetSpec {
        seed: a.seed,
        devices: a.devices,
        interval_min: a.interval_min,
        interval_max: a.interval_max,
        disorder: a.disorder,
        parked: a.parked,
        ..FleetSpec::default()
    };
    if !(0.0..=1.0).contains(&a.parked) {
        anyhow::bail!("--parked must be between 0 and 1, got {}", a.parked);
    }
    let explicit_start = match &a.start {
        Some(s) => Some(match s.parse::<i64>() {
            Ok(ms) => geodwell_core::time::Ts(ms),
            Err(_) => geodwell_core::time::Ts::parse_rfc3339(s)
                .map_err(|e| anyhow::anyhow!("--start: {e}"))?,
        }),
        None => None,
    };
    if let Some(dir) = &a.write_trace {
        spec.start = explicit_start.unwrap_or(spec.start);
        return write_trace(dir, spec, &fences, a.fixes.unwrap_or(100_000));
    }
    spec.start = explicit_start
        .unwrap_or_else(|| geodwell_core::time::Ts(chrono::Utc::now().timestamp_millis()));
    let pace = match (a.max, a.rate, a.replay_speed) {
        (true, _, _) => Pace::Max,
        (_, Some(r), _) if r > 0.0 => Pace::Rate(r),
        (_, Some(r), _) => anyhow::bail!("--rate must be positive, got {r}"),
        (_, _, Some(s)) if s > 0.0 => Pace::Replay(s),
        (_, _, Some(s)) => anyhow::bail!("--replay-speed must be positive, got {s}"),
        _ => Pace::Replay(1.0),
    };
    let opts = SimOptions {
        server: a.server,
        transport: a.transport,
        connections: a.connections,
        batch: a.batch,
        linger: std::time::Duration::from_millis(a.linger.0.max(0) as u64),
        pace,
        duration: Some(std::time::Duration::from_millis(a.duration.0.max(0) as u64)),
        max_fixes: a.fixes,
        upload_fences: !a.no_upload,
        measure: !a.no_measure,
        drain: std::time::Duration::from_millis(a.drain.0.max(0) as u64),
        progress: !a.quiet,
        ws_window: a.ws_window,
    };
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        trigger.cancel();
    });
    let report = geodwell_sim::run::run(&opts, spec, fences, cancel).await?;
    print!("{}", report.render());
    if let Some(p) = &a.report {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

/// Writes `fences.geojson` and `fixes.ndjson` (the first `n` fixes) into `dir`.
fn write_trace(
    dir: &std::path::Path,
    spec: geodwell_sim::fleet::FleetSpec,
    fences: &[std::sync::Arc<geodwell_core::fences::Fence>],
    n: u64,
) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let fc = geodwell_sim::fleet::feature_collection(fences);
    std::fs::write(dir.join("fences.geojson"), serde_json::to_vec(&fc)?)?;
    let prefix = spec.prefix.clone();
    let fleet = geodwell_sim::fleet::Fleet::new(spec, fences)?;
    let file = std::fs::File::create(dir.join("fixes.ndjson"))?;
    let mut out = std::io::BufWriter::new(file);
    let mut line = Vec::with_capacity(128);
    for fix in fleet.take(n as usize) {
        line.clear();
        fix.write_json(&prefix, &mut line);
        line.push(b'\n');
        out.write_all(&line)?;
    }
    out.flush()?;
    println!(
        "wrote {} fences and {n} fixes to {}",
        fences.len(),
        dir.display()
    );
    Ok(())
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot bind {}", cfg.listen))?;
    let grace = std::time::Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64);
    let service = geodwell::Service::spawn(cfg, listener).await?;
    wait_for_signal().await;
    tracing::info!("shutdown signal received; draining");
    service.shutdown(grace).await?;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
