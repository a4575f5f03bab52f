//! `geodwell simulate`: its arguments ([`SimArgs`]) and the command ([`simulate`]): build or
//! load the fences, then either write a trace ([`write_trace`]) or run the fleet against a
//! server ([`crate::run::run`]) and print the report.
//!
//! Invariants (the exit status is honest):
//! - `Ok` only for a clean run: every fix sent was answered with 2xx and none was rejected item
//!   by item (late and duplicate fixes are answers, shown in the report, not failures).
//! - A 401 / 403 stops the run at once: [`SimError::Refused`], no report.
//! - Any other refused or lost fix: the report is printed (and written with `--report`) as for
//!   a clean run, then [`SimError::FixesRefused`] says how many of how many.
//! - The API key is only ever put in the `Authorization` header; it is not printed, and
//!   `--help` does not show the value of `GEODWELL_API_KEY`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::SimError;
use crate::fleet::{Fleet, FleetSpec, LayoutSpec, feature_collection, generate_fences};
use crate::run::{ApiKey, Pace, SimOptions, Transport};
use geodwell_core::fences::Fence;
use geodwell_core::time::{Dur, Ts};

/// The arguments of `geodwell simulate`.
#[derive(clap::Args)]
pub struct SimArgs {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:7878")]
    server: String,
    /// API key, sent as `Authorization: Bearer KEY` with every request. Scopes: ingest (fixes),
    /// read (event subscription), admin (fence upload). Prefer the environment variable: a
    /// command line is visible to other users of the machine.
    #[arg(long, env = "GEODWELL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
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
    transport: Transport,
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
    /// Event time of the first fix (RFC 3339 or Unix ms; default: a week ago on an event-clock
    /// server, now on a live one; moved past the server's watermark).
    #[arg(long)]
    start: Option<String>,
    /// Do not post the fences first (they are already loaded).
    #[arg(long)]
    no_upload: bool,
    /// Drive between the fences the server already holds (read with GET /v1/fences; read
    /// scope) instead of generated ones; nothing is uploaded.
    #[arg(long, conflicts_with_all = ["fences_file", "write_trace"])]
    around_server_fences: bool,
    /// Afterwards, delete the fences the run created (not those it replaced: their ids were on
    /// the server before) and the run's devices (admin scope).
    #[arg(long)]
    cleanup: bool,
    /// On an event-clock server, do not move the watermark to the last fix's time at the end
    /// (by default the run does, with POST /v1/watermark, so that the dwells up to it fire).
    #[arg(long)]
    no_finish: bool,
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

fn std_dur(d: Dur) -> Duration {
    Duration::from_millis(d.0.max(0) as u64)
}

/// Runs `geodwell simulate`; the run stops early (and reports what it did) once `interrupt`
/// completes, e.g. on Ctrl-C. Prints the report on stdout; see the module's invariants for
/// which outcomes are errors.
pub async fn simulate(
    a: SimArgs,
    interrupt: impl Future<Output = ()> + Send + 'static,
) -> Result<(), SimError> {
    let fences: Vec<Arc<Fence>> = match &a.fences_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| SimError::io("read", p, e))?;
            geodwell_core::fences::parse_fences_str(&text, &Default::default())
                .map_err(|e| SimError::Fences {
                    path: p.clone(),
                    message: e.to_string(),
                })?
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
        return Err(SimError::Options(format!(
            "--parked must be between 0 and 1, got {}",
            a.parked
        )));
    }
    let explicit_start = match &a.start {
        Some(s) => Some(match s.parse::<i64>() {
            Ok(ms) => Ts(ms),
            Err(_) => {
                Ts::parse_rfc3339(s).map_err(|e| SimError::Options(format!("--start: {e}")))?
            }
        }),
        None => None,
    };
    if let Some(dir) = &a.write_trace {
        spec.start = explicit_start.unwrap_or(spec.start);
        return write_trace(dir, spec, &fences, a.fixes.unwrap_or(100_000));
    }
    // Without --start, an event-clock server gets a trace that begins a week ago (a live server
    // moves it to its wall clock): the server refuses fixes more than `time.max_future` ahead
    // of its wall clock in both modes, and at full pace event time runs far ahead of the wall.
    spec.start = explicit_start.unwrap_or_else(|| {
        Ts(chrono::Utc::now().timestamp_millis())
            .minus(geodwell_core::time::Dur::from_mins(7 * 24 * 60))
    });
    let pace = match (a.max, a.rate, a.replay_speed) {
        (true, _, _) => Pace::Max,
        (_, Some(r), _) if r > 0.0 => Pace::Rate(r),
        (_, Some(r), _) => {
            return Err(SimError::Options(format!(
                "--rate must be positive, got {r}"
            )));
        }
        (_, _, Some(s)) if s > 0.0 => Pace::Replay(s),
        (_, _, Some(s)) => {
            return Err(SimError::Options(format!(
                "--replay-speed must be positive, got {s}"
            )));
        }
        _ => Pace::Replay(1.0),
    };
    let opts = SimOptions {
        server: a.server,
        transport: a.transport,
        connections: a.connections,
        batch: a.batch,
        linger: std_dur(a.linger),
        pace,
        duration: Some(std_dur(a.duration)),
        max_fixes: a.fixes,
        upload_fences: !a.no_upload,
        measure: !a.no_measure,
        drain: std_dur(a.drain),
        progress: !a.quiet,
        ws_window: a.ws_window,
        // An empty GEODWELL_API_KEY (e.g. `${KEY:-}` in compose files) means none.
        api_key: a.api_key.filter(|k| !k.is_empty()).map(ApiKey::new),
        server_fences: a.around_server_fences,
        finish_watermark: !a.no_finish,
        cleanup: a.cleanup,
    };
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        interrupt.await;
        trigger.cancel();
    });
    let report = crate::run::run(&opts, spec, fences, cancel).await?;
    print!("{}", report.render());
    if let Some(p) = &a.report {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .map_err(|e| SimError::io("write", p, e))?;
    }
    match report.refusal() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Writes `fences.geojson` and `fixes.ndjson` (the first `n` fixes of the fleet `spec` driving
/// between `fences`) into `dir`, creating it, and says so on stdout.
pub fn write_trace(
    dir: &Path,
    spec: FleetSpec,
    fences: &[Arc<Fence>],
    n: u64,
) -> Result<(), SimError> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|e| SimError::io("create", dir, e))?;
    let fc = feature_collection(fences);
    let fences_path = dir.join("fences.geojson");
    std::fs::write(&fences_path, serde_json::to_vec(&fc)?)
        .map_err(|e| SimError::io("write", &fences_path, e))?;
    let prefix = spec.prefix.clone();
    let fleet = Fleet::new(spec, fences)?;
    let fixes_path = dir.join("fixes.ndjson");
    let write_err = |e| SimError::io("write", &fixes_path, e);
    let file = std::fs::File::create(&fixes_path).map_err(write_err)?;
    let mut out = std::io::BufWriter::new(file);
    let mut line = Vec::with_capacity(128);
    for fix in fleet.take(n as usize) {
        line.clear();
        fix.write_json(&prefix, &mut line);
        line.push(b'\n');
        out.write_all(&line).map_err(write_err)?;
    }
    out.flush().map_err(write_err)?;
    println!(
        "wrote {} fences and {n} fixes to {}",
        fences.len(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: SimArgs,
    }

    #[test]
    fn the_api_key_is_a_flag_and_its_env_value_is_not_shown_in_help() {
        let c = Cmd::try_parse_from(["simulate", "--api-key", "k-0123456789abcdef"]).unwrap();
        assert_eq!(c.args.api_key.as_deref(), Some("k-0123456789abcdef"));
        let arg = <Cmd as clap::CommandFactory>::command();
        let key = arg
            .get_arguments()
            .find(|a| a.get_id() == "api_key")
            .unwrap();
        assert_eq!(
            key.get_env().and_then(|e| e.to_str()),
            Some("GEODWELL_API_KEY")
        );
        assert!(key.is_hide_env_values_set());
    }
}
