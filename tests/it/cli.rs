//! The binary as users run it: `geodwell serve` answers, and SIGTERM drains and exits 0;
//! `geodwell check-config` reports every error at once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{BIN, Proc, listening_addr, temp_dir};

#[test]
fn serve_answers_then_exits_zero_on_sigterm() {
    let data = temp_dir();
    let child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--clock",
            "event",
            "--lateness",
            "0s",
            "--shards",
            "2",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("GEODWELL_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("binary starts");
    // Killed and reaped if the test fails half way, before `data` is removed.
    let mut child = Proc(child);
    let (tx, lines) = std::sync::mpsc::channel();
    let addr = listening_addr(&mut child, Some(tx));
    // The default config preloads the built-in sample fences.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fences: serde_json::Value = rt.block_on(async {
        reqwest::get(format!("http://{addr}/v1/fences"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    assert!(
        fences["features"].as_array().unwrap().len() >= 3,
        "{fences}"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "exit status {code:?}");
    // The log after the listening line (the drain thread ends at EOF, once the child exited).
    let rest: Vec<String> = lines.iter().collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}

#[test]
fn check_config_reports_every_error() {
    let dir = temp_dir();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[server]\nlisten = \"x\"\ncolour = 1\n[time]\nclock = \"sundial\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["3 error(s)", "server.listen", "server.colour", "time.clock"] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
    let good = Command::new(BIN)
        .args(["check-config", "config/geodwell.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
}

#[test]
fn serve_help_shows_each_flags_default_and_environment_variable() {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "[default: 127.0.0.1:7878]",
        "[env: GEODWELL_LISTEN]",
        "[default: live]",
        "[env: GEODWELL_LATENESS]",
        "GEODWELL_<KEY>",
    ] {
        assert!(
            help.contains(want),
            "{want} missing from serve --help:\n{help}"
        );
    }
    let out = std::process::Command::new(BIN)
        .args(["check-config", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("CONFIG_FILE"), "{help}");
}
