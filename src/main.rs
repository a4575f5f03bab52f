//! The `geodwell` command line: parse arguments, load configuration, start telemetry, and call
//! the library.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use geodwell::config::{ClockMode, Config, Sources};

#[derive(Parser)]
#[command(name = "geodwell", version, about = "Geofence dwell-trigger service")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the service.
    #[command(
        after_help = "Every setting of the configuration file (docs in config/geodwell.toml) can also be set \
by an environment variable GEODWELL_<KEY>, e.g. GEODWELL_MAX_BATCH=5000 or GEODWELL_API_KEYS. \
Precedence: flags > environment > --config file > embedded defaults. \
`geodwell check-config FILE` validates a file and reports every error at once."
    )]
    Serve(ServeArgs),
    /// Validate a configuration file (and the fences it preloads) and report every error at once.
    CheckConfig {
        /// The configuration file to check (TOML, as config/geodwell.toml).
        #[arg(value_name = "CONFIG_FILE")]
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

/// `geodwell serve`: every flag overrides the configuration file and the environment.
#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (default: the embedded config/geodwell.toml). Relative paths in it
    /// resolve against its directory.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to bind (server.listen) [default: 127.0.0.1:7878] [env: GEODWELL_LISTEN]
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Directory for persistent state (server.data_dir) [default: data] [env:
    /// GEODWELL_DATA_DIR]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Watermark mode: live (wall clock) or event (data) (time.clock) [default: live] [env:
    /// GEODWELL_CLOCK]
    #[arg(long)]
    clock: Option<ClockMode>,
    /// Allowed arrival disorder (time.lateness) [default: 2s] [env: GEODWELL_LATENESS]
    #[arg(long)]
    lateness: Option<String>,
    /// Engine shards, 0 = one per core (server.shards) [default: 0] [env: GEODWELL_SHARDS]
    #[arg(long)]
    shards: Option<usize>,
    /// Fences that seed an empty store: a GeoJSON file, "builtin:samples", or "" for none
    /// (fences.fences_file) [default: builtin:samples] [env: GEODWELL_FENCES_FILE]
    #[arg(long)]
    fences_file: Option<String>,
    /// Run as a cluster node on NATS JetStream: the servers' URLs, comma-separated
    /// (cluster.nats_urls; docs/cluster.md) [default: none, one process] [env:
    /// GEODWELL_NATS_URLS]
    #[arg(long, value_name = "URL[,URL...]")]
    nats: Option<String>,
    /// This node's id in the cluster (cluster.node_id) [env: GEODWELL_NODE_ID]
    #[arg(long, value_name = "ID")]
    node: Option<String>,
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Verify a store (the service stopped): schema versions, every input record, event and
    /// checkpoint record decodes, input and event seqs are contiguous.
    Check {
        /// The data directory holding geodwell.redb and checkpoint.redb.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Convert a version-1 store (device state in geodwell.redb) to the input-log layout (the
    /// service stopped); a current store is left as it is.
    Migrate {
        /// The data directory holding geodwell.redb.
        #[arg(long)]
        data_dir: PathBuf,
    },
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
            // Absolute, so that messages name the full path of what a relative one resolved to.
            std::path::absolute(p)
                .ok()
                .and_then(|a| a.parent().map(PathBuf::from)),
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
            Ok(rt.block_on(geodwell_sim::cli::simulate(*args, wait_for_signal()))?)
        }
        Cmd::Store {
            cmd: StoreCmd::Check { data_dir },
        } => {
            let report = geodwell::store::check(&data_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{report}");
            Ok(())
        }
        Cmd::Store {
            cmd: StoreCmd::Migrate { data_dir },
        } => {
            match geodwell::store::migrate(&data_dir).map_err(|e| anyhow::anyhow!("{e}"))? {
                geodwell::store::Migrated::AlreadyCurrent => println!(
                    "{}: already version {}; nothing to do",
                    data_dir.display(),
                    geodwell::store::SCHEMA_VERSION
                ),
                geodwell::store::Migrated::FromV2 => println!(
                    "{}: migrated from version 2 to {} (the same tables; commits now go through a journal)",
                    data_dir.display(),
                    geodwell::store::SCHEMA_VERSION
                ),
                geodwell::store::Migrated::FromV1 { fences, devices } => println!(
                    "{}: migrated from version 1 to {}: {fences} fences and {devices} devices are the first checkpoint",
                    data_dir.display(),
                    geodwell::store::SCHEMA_VERSION
                ),
            }
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
            if let Some(v) = args.nats {
                cli.push(("nats_urls", "--nats", v));
            }
            if let Some(v) = args.node {
                cli.push(("node_id", "--node", v));
            }
            let cfg = load(args.config.as_ref(), cli.clone())?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            // A reload reads the same sources again: the file, the environment, the flags.
            let config = args.config.clone();
            rt.block_on(serve(cfg, move || load(config.as_ref(), cli.clone())))
        }
    }
}

async fn serve(cfg: Config, reload: impl Fn() -> anyhow::Result<Config>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot bind {}", cfg.listen))?;
    let grace = std::time::Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64);
    let service = geodwell::Service::spawn(cfg, listener).await?;
    let stop = wait_for_signal();
    tokio::pin!(stop);
    let mut hup = Hangups::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = hup.next() => {
                // The API keys, the configured sinks and the TLS certificate take effect without
                // a restart; other settings need one.
                match reload() {
                    Ok(new) => {
                        reload_tls(&service, new.tls_cert.as_deref(), new.tls_key.as_deref());
                        let n = service.reload_keys(new.api_keys);
                        tracing::info!(keys = n, "SIGHUP: configuration reloaded; API keys replaced");
                        match service.reload_sinks(&new.webhooks).await {
                            Ok(r) if r.restart_needed => tracing::warn!("SIGHUP: on a cluster node [[webhooks]] changes take effect at the next restart"),
                            Ok(r) => {
                                tracing::info!(added = ?r.added, changed = ?r.changed, removed = ?r.removed, "SIGHUP: configured sinks reloaded");
                                for (id, why) in r.skipped {
                                    tracing::error!(webhook = %id, reason = %why, "SIGHUP: configured sink not applied");
                                }
                            }
                            Err(e) => tracing::error!(error = %e, "SIGHUP: configured sinks not reloaded"),
                        }
                    }
                    Err(e) => tracing::error!("SIGHUP: the configuration is not valid; keeping the running one:\n{e:#}"),
                }
            }
        }
    }
    tracing::info!("shutdown signal received; draining");
    service.shutdown(grace).await?;
    Ok(())
}

/// Applies a reloaded configuration's `server.tls_cert` / `server.tls_key`: the files it names
/// are read (a changed path included); a certificate that cannot be used is logged and the
/// running one kept. TLS cannot be switched on or off without a restart.
fn reload_tls(
    service: &geodwell::Service,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
) {
    match (service.has_tls(), cert.zip(key)) {
        (true, Some((cert, key))) => match service.reload_tls(cert, key) {
            Ok(Some(i)) => tracing::info!(
                cert = %i.cert.display(),
                not_after = %chrono::DateTime::from_timestamp(i.not_after, 0).map_or_else(String::new, |t| t.to_rfc3339()),
                "SIGHUP: TLS certificate and key read"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: TLS certificate not usable; keeping the running one")
            }
        },
        (false, None) => {}
        (on, _) => tracing::warn!(
            tls_now = on,
            "SIGHUP: switching TLS on or off takes a restart; the server keeps its current setting"
        ),
    }
}

/// SIGHUPs, from the moment it is made (none where there are no such signals).
struct Hangups {
    #[cfg(unix)]
    inner: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn new() -> Hangups {
        Hangups {
            #[cfg(unix)]
            inner: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(s) = self.inner.as_mut() {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await
    }
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
