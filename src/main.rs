//! The `geodwell` command line: parse arguments, load configuration, start telemetry, and call
//! the library.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use geodwell::config::{ClockMode, Config};
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
    Serve {
        /// Configuration file (default: the embedded config/geodwell.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to bind, e.g. 127.0.0.1:7878.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Directory for persistent state.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Watermark mode: live (wall clock) or event (data).
        #[arg(long)]
        clock: Option<ClockMode>,
        /// Allowed arrival disorder, e.g. 2s.
        #[arg(long, value_parser = parse_dur)]
        lateness: Option<Dur>,
        /// Engine shards (0 = one per core).
        #[arg(long)]
        shards: Option<usize>,
    },
    /// Validate a configuration file and report every error at once.
    CheckConfig {
        /// The file.
        file: PathBuf,
    },
    /// Drive a simulated fleet against a running server and report rates and latency.
    Simulate(Box<geodwell_sim::cli::SimArgs>),
    /// Inspect the state store.
    Store {
        #[command(subcommand)]
        cmd: StoreCmd,
    },
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

fn parse_dur(s: &str) -> Result<Dur, String> {
    Dur::parse(s).map_err(|e| e.to_string())
}

fn load(file: Option<&PathBuf>) -> anyhow::Result<Config> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env: BTreeMap<String, String> = Config::env_overrides();
    let text = match file {
        Some(p) => Some((
            p.display().to_string(),
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        )),
        None => None,
    };
    Config::load(
        text.as_ref().map(|(n, t)| (n.as_str(), t.as_str())),
        &env,
        cores,
    )
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
            let cfg = load(Some(&file))?;
            geodwell::load_fences(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!(
                "{}: ok ({} shards, clock {}, listen {})",
                file.display(),
                cfg.shards,
                cfg.clock,
                cfg.listen
            );
            Ok(())
        }
        Cmd::Simulate(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            Ok(rt.block_on(geodwell_sim::cli::simulate(*args, wait_for_signal()))?)
        }
        Cmd::Store {
            cmd: StoreCmd::Check { data_dir },
        } => {
            let report = geodwell::store::check(&data_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{report}");
            Ok(())
        }
        Cmd::Serve {
            config,
            listen,
            data_dir,
            clock,
            lateness,
            shards,
        } => {
            let mut cfg = load(config.as_ref())?;
            if let Some(v) = listen {
                cfg.listen = v;
            }
            if let Some(v) = data_dir {
                cfg.data_dir = v;
            }
            if let Some(v) = clock {
                cfg.clock = v;
            }
            if let Some(v) = lateness {
                cfg.lateness = v;
            }
            if let Some(v) = shards {
                cfg.shards = if v == 0 {
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                } else {
                    v
                };
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(serve(cfg))
        }
    }
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot bind {}", cfg.listen))?;
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received; draining");
        trigger.cancel();
    });
    geodwell::run(listener, cfg, shutdown).await?;
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
