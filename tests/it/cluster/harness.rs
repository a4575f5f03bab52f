//! Real processes for the cluster tests: a NATS JetStream cluster of the machine's `nats-server`
//! (its own ports and directories, never the system service on 4222) and geodwell nodes of the
//! real binary, each killed and reaped when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::common::{BIN, Proc, free_port, listening_addr, temp_dir};

/// The `nats-server` binary: `TEST_NATS_SERVER`, else the first on `PATH` or in
/// `/usr/sbin` or `/usr/bin`. The cluster tests fail, saying so, when there is none.
pub fn nats_bin() -> String {
    if let Ok(b) = std::env::var("TEST_NATS_SERVER")
        && !b.is_empty()
    {
        return b;
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/sbin".into());
    dirs.push("/usr/bin".into());
    for d in dirs {
        let p = d.join("nats-server");
        if p.is_file() {
            return p.display().to_string();
        }
    }
    panic!(
        "the cluster tests need nats-server (apt-get install nats-server, or set TEST_NATS_SERVER)"
    );
}

/// One NATS server of the test cluster.
struct NatsNode {
    client: u16,
    monitor: u16,
    conf: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

/// Why a NATS cluster did not come up.
enum NotUp {
    /// A server exited: worth starting again on fresh ports.
    Exited(String),
    /// The servers run but JetStream found no leader in time.
    NotReady(String),
}
use NotUp::{Exited, NotReady};

/// A 3-node (or 1-node) NATS JetStream cluster on loopback.
pub struct NatsCluster {
    nodes: Vec<NatsNode>,
    bin: String,
    _dir: TempDir,
}

impl NatsCluster {
    /// Starts `n` servers clustered with each other and waits until JetStream has a leader.
    ///
    /// A server that exits at start (its port taken by another listener between choosing and
    /// binding it) makes the whole cluster start again on fresh ports, up to 3 times.
    pub async fn start(n: usize) -> NatsCluster {
        let mut last = String::new();
        for _ in 0..3 {
            let mut c = NatsCluster::spawn_all(n);
            match c.ready_within(Duration::from_secs(60)).await {
                Ok(()) => return c,
                Err(Exited(why)) => last = why,
                Err(NotReady(why)) => panic!("{why}"),
            }
        }
        panic!("the NATS cluster did not start in 3 attempts; last: {last}");
    }

    /// Writes the configurations of `n` servers on fresh ports and starts them.
    fn spawn_all(n: usize) -> NatsCluster {
        let dir = temp_dir();
        let bin = nats_bin();
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, r, _)| format!("\"nats-route://127.0.0.1:{r}\""))
            .collect();
        // One name per cluster: a route dialling another test process's route port is refused
        // instead of joining the two clusters.
        let name = format!("gdtest_{}_{}", std::process::id(), ports[0].0);
        let mut nodes = Vec::new();
        for (i, (client, route, monitor)) in ports.iter().enumerate() {
            let store = dir.path().join(format!("n{i}"));
            let cluster = if n > 1 {
                format!(
                    "cluster {{\n  name: {name}\n  listen: 127.0.0.1:{route}\n  routes: [{}]\n}}\n",
                    routes.join(", ")
                )
            } else {
                String::new()
            };
            let text = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{client}\nhttp: 127.0.0.1:{monitor}\n\
                 jetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 256MB\n  max_file_store: 4GB\n}}\n{cluster}",
                store.display()
            );
            let conf = dir.path().join(format!("n{i}.conf"));
            std::fs::write(&conf, text).unwrap();
            nodes.push(NatsNode {
                client: *client,
                monitor: *monitor,
                conf,
                log: dir.path().join(format!("n{i}.log")),
                proc: None,
            });
        }
        let mut c = NatsCluster {
            nodes,
            bin,
            _dir: dir,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let log = std::fs::File::create(&node.log).unwrap();
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&node.conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server starts");
        node.proc = Some(Proc(child));
    }

    /// The client URLs, comma-separated.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills server `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].proc = None;
    }

    /// Sends server `i` signal `sig` (SIGSTOP pauses it: it keeps its connections and answers
    /// nothing; SIGCONT resumes it).
    pub fn signal(&self, i: usize, sig: i32) {
        if let Some(p) = &self.nodes[i].proc {
            // SAFETY: kill(2) on a child process id we own and have not reaped.
            unsafe {
                libc::kill(p.id() as i32, sig);
            }
        }
    }

    /// Starts server `i` again on its ports and store.
    pub async fn restart(&mut self, i: usize) {
        self.spawn(i);
        if let Err(Exited(why) | NotReady(why)) = self.ready_within(Duration::from_secs(60)).await {
            panic!("{why}");
        }
    }

    /// Waits until every running server answers its health check (JetStream included); fails
    /// at once when one of them has exited.
    async fn ready_within(&mut self, within: Duration) -> Result<(), NotUp> {
        let http = reqwest::Client::new();
        let t0 = Instant::now();
        'outer: loop {
            let exited = self.nodes.iter_mut().enumerate().find_map(|(i, n)| {
                let status = n.proc.as_mut()?.try_wait().ok()??;
                n.proc = None;
                Some((i, status))
            });
            if let Some((i, status)) = exited {
                return Err(Exited(format!(
                    "nats-server n{i} exited ({status}); logs:\n{}",
                    self.logs()
                )));
            }
            if t0.elapsed() >= within {
                return Err(NotReady(format!(
                    "NATS cluster not healthy within {within:?}; logs:\n{}",
                    self.logs()
                )));
            }
            for n in self.nodes.iter().filter(|n| n.proc.is_some()) {
                let ok = http
                    .get(format!("http://127.0.0.1:{}/healthz", n.monitor))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                let leader = http
                    .get(format!("http://127.0.0.1:{}/jsz", n.monitor))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await;
                let has_leader = match leader {
                    Ok(r) => r.json::<Value>().await.is_ok_and(|v| {
                        self.nodes.len() == 1
                            || v["meta_cluster"]["leader"]
                                .as_str()
                                .is_some_and(|l| !l.is_empty())
                    }),
                    Err(_) => false,
                };
                if !ok || !has_leader {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue 'outer;
                }
            }
            return Ok(());
        }
    }

    /// Every server's log, for a failure message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(&n.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!(
                    "--- {} ---\n{}",
                    n.log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A geodwell node process.
pub struct Node {
    pub id: String,
    pub url: String,
    /// The binary it runs (this build's, or an earlier release's in the upgrade tests).
    bin: String,
    proc: Option<Proc>,
    log: PathBuf,
    env: Vec<(String, String)>,
    args: Vec<String>,
}

impl Node {
    /// Starts node `id` of the cluster at `nats` on geodwell binary `bin` with `args` after
    /// `serve` and `env`; its log goes to `dir/<id>.log`.
    pub fn start_bin(
        bin: &str,
        id: &str,
        nats: &str,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Node {
        let mut n = Node {
            id: id.to_string(),
            url: String::new(),
            bin: bin.to_string(),
            proc: None,
            log: dir.join(format!("{id}.log")),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        n.args.extend(["--nats".to_string(), nats.to_string()]);
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--node", &self.id])
            .args(&self.args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("GEODWELL_FENCES_FILE", "")
            .env("GEODWELL_LOG", "info,async_nats=warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("geodwell starts");
        let mut child = Proc(child);
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let addr = listening_addr(&mut child, Some(tx));
        let log = self.log.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap();
            for line in rx {
                let _ = writeln!(f, "{line}");
            }
        });
        self.url = format!("http://{addr}");
        self.proc = Some(child);
    }

    /// Whether the process runs.
    pub fn is_up(&self) -> bool {
        self.proc.is_some()
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.proc.as_ref().map_or(0, |p| p.id() as i32)
    }

    /// Kills the node (SIGKILL).
    pub fn kill(&mut self) {
        self.proc = None;
    }

    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child process id we own.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Stops the node gracefully (SIGTERM) and waits for it to exit.
    pub async fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        if let Some(mut p) = self.proc.take() {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = p.try_wait() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{} did not stop within 30s", self.id);
        }
    }

    /// Starts the node again (a new port).
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// Starts the node again on this build's binary (an upgrade).
    pub fn restart_upgraded(&mut self) {
        self.bin = BIN.to_string();
        self.spawn();
    }

    /// The node's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
