//! First impressions: the real binary as someone trying it out runs it, from a directory of their
//! own (a fresh, empty temp dir, not the repository) with nothing in the environment: `serve`
//! with no config file starts with the built-in sample fences and stops on SIGTERM with exit 0;
//! `check-config` resolves a config file's relative `fences_file` against the file's directory
//! and, when that file is missing, says which file once and how to fix it; a start that fails
//! creates nothing; `--fences-file ""` starts without fences.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{BIN, Proc, listening_addr, temp_dir};

/// `geodwell ARGS` run in `cwd` with no `GEODWELL_*` variable from the test's environment.
fn geodwell(cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).current_dir(cwd);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GEODWELL_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// `geodwell serve --listen 127.0.0.1:0 ARGS` in `cwd`, once it listens: the process, its base
/// URL and the rest of its log.
fn serve(cwd: &Path, args: &[&str]) -> (Proc, String, Receiver<String>) {
    let child = geodwell(
        cwd,
        &[&["serve", "--listen", "127.0.0.1:0"][..], args].concat(),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("binary starts");
    let mut child = Proc(child);
    let (tx, log) = std::sync::mpsc::channel();
    let addr = listening_addr(&mut child, Some(tx));
    (child, format!("http://{addr}"), log)
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{base}{path}")).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// SIGTERM, then the exit status (within 20 s).
async fn terminate(child: &mut Proc) -> std::process::ExitStatus {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let started = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_a_config_file_starts_with_the_sample_fences_and_stops_on_sigterm() {
    let cwd = temp_dir();
    let (mut child, base, log) = serve(cwd.path(), &[]);
    let (s, ready) = get(&base, "/readyz").await;
    assert_eq!(s, 200, "{ready}");
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["fences"], 4, "the built-in sample fences: {ready}");
    let (s, fences) = get(&base, "/v1/fences").await;
    assert_eq!(s, 200, "{fences}");
    assert_eq!(
        fences["features"].as_array().map(Vec::len),
        Some(4),
        "{fences}"
    );
    let code = terminate(&mut child).await;
    let rest: Vec<String> = log.iter().collect();
    assert!(code.success(), "exit status {code:?}; log: {rest:#?}");
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:#?}");
}

#[test]
fn check_config_resolves_fences_file_against_the_config_files_directory() {
    let conf = temp_dir();
    let file = conf.path().join("geodwell.toml");
    std::fs::write(&file, "[fences]\nfences_file = \"f.geojson\"\n").unwrap();
    let geojson = conf.path().join("f.geojson");
    let fence = json!({"type": "FeatureCollection", "features": [crate::common::square("depot", json!({}))]});
    std::fs::write(&geojson, fence.to_string()).unwrap();
    // Run from somewhere else: the relative name must not resolve against the working directory.
    let elsewhere = temp_dir();
    let out = geodwell(elsewhere.path(), &["check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 preloaded fences"), "{said}");

    // Without the GeoJSON: an error that names the full path once, the OS reason once, and the
    // way out.
    std::fs::remove_file(&geojson).unwrap();
    let out = geodwell(elsewhere.path(), &["check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a missing fences file is an error");
    let err = stderr(&out);
    let full = geojson.to_str().unwrap();
    assert_eq!(err.matches(full).count(), 1, "the path, once: {err}");
    assert!(
        err.matches("os error").count() <= 1
            && err.matches("No such file or directory").count() == 1,
        "the OS reason, once: {err}"
    );
    assert!(
        err.contains("relative paths in a config file resolve against the file's directory"),
        "{err}"
    );
    assert!(err.contains("fences_file = \"\""), "the hint: {err}");
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).unwrap().count(),
        0,
        "check-config writes nothing"
    );
}

#[test]
fn a_failed_start_creates_nothing() {
    let cwd = temp_dir();
    let data = cwd.path().join("d");
    let out = geodwell(
        cwd.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--fences-file",
            "/nonexistent.geojson",
        ],
    )
    .arg("--data-dir")
    .arg(&data)
    .output()
    .unwrap();
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent.geojson"),
        "fails for the fences file: {}",
        stderr(&out)
    );
    assert!(!data.exists(), "{} was created", data.display());
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "a failed start left {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_fences_file_starts_without_fences() {
    let cwd = temp_dir();
    let (mut child, base, log) = serve(cwd.path(), &["--fences-file", ""]);
    let (s, ready) = get(&base, "/readyz").await;
    assert_eq!(s, 200, "{ready}");
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["fences"], 0, "{ready}");
    let (s, fences) = get(&base, "/v1/fences").await;
    assert_eq!(
        (s, fences["features"].clone()),
        (200, json!([])),
        "{fences}"
    );
    let code = terminate(&mut child).await;
    let rest: Vec<String> = log.iter().collect();
    assert!(code.success(), "exit status {code:?}; log: {rest:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_has_one_deadline_and_says_what_it_aborted() {
    use std::io::Write;
    let cwd = temp_dir();
    let child = geodwell(
        cwd.path(),
        &["serve", "--listen", "127.0.0.1:0", "--fences-file", ""],
    )
    .env("GEODWELL_SHUTDOWN_GRACE", "1s")
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("binary starts");
    let mut child = Proc(child);
    let (tx, log) = std::sync::mpsc::channel();
    let addr = listening_addr(&mut child, Some(tx));
    // A client that never finishes its request keeps axum's graceful shutdown waiting: the one
    // deadline (shutdown_grace, 1 s here) must end the stop anyway, and the log must say what it
    // cut short.
    let mut stuck = std::net::TcpStream::connect(&addr).unwrap();
    stuck
        .write_all(b"POST /v1/fixes HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let code = terminate(&mut child).await;
    let took = started.elapsed();
    let rest: Vec<String> = log.iter().collect();
    assert!(code.success(), "exit status {code:?}; log: {rest:#?}");
    assert!(
        took < Duration::from_secs(8),
        "one deadline (1 s) for the whole stop, took {took:?}"
    );
    let line = rest
        .iter()
        .find(|l| l.contains("shutdown deadline"))
        .unwrap_or_else(|| panic!("no deadline line: {rest:#?}"));
    assert!(line.contains("in-flight HTTP requests"), "{line}");
    drop(stuck);
}
