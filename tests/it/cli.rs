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

/// SIGHUP reloads the API keys from the configuration file: a key added works without a
/// restart, a removed one is refused; a file that is not valid keeps the running keys and the
/// log names every error in it.
#[test]
fn sighup_reloads_the_api_keys_and_an_invalid_file_keeps_the_old_ones() {
    const OLD: &str = "old-read-key-0123456789";
    const NEW: &str = "new-read-key-0123456789";
    let dir = temp_dir();
    let file = dir.path().join("geodwell.toml");
    let keys = |key: &str| {
        format!(
            "[store]\ndurability = \"none\"\n[fences]\nfences_file = \"\"\n[auth]\napi_keys = [\n  {{ name = \"dash\", scopes = [\"read\"], key = \"{key}\" }},\n]\n"
        )
    };
    std::fs::write(&file, keys(OLD)).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("GEODWELL_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("binary starts");
    let mut child = Proc(child);
    let (tx, lines) = std::sync::mpsc::channel();
    let addr = listening_addr(&mut child, Some(tx));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = |key: &str| {
        rt.block_on(async {
            reqwest::Client::new()
                .get(format!("http://{addr}/v1/events"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let hup = || {
        let ok = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    let until = |key: &str, want: u16| {
        let t = Instant::now();
        while status(key) != want {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{key} never got {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!((status(OLD), status(NEW)), (200, 401));
    std::fs::write(&file, keys(NEW)).unwrap();
    hup();
    until(NEW, 200);
    assert_eq!(status(OLD), 401, "the removed key is refused");
    // Not valid: a scope that does not exist and a key too short, both reported; NEW stays.
    std::fs::write(
        &file,
        "[auth]\napi_keys = [\n  { name = \"a\", scopes = [\"wizard\"], key = \"short\" },\n]\n",
    )
    .unwrap();
    hup();
    let t = Instant::now();
    let mut log = String::new();
    while !(log.contains("wizard") && log.contains("at least 16 characters")) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no reload error logged:\n{log}"
        );
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(100)) {
            log.push_str(&l);
            log.push('\n');
        }
    }
    assert!(log.contains("keeping the running one"), "{log}");
    assert_eq!(
        (status(NEW), status(OLD)),
        (200, 401),
        "the running keys stay"
    );
    drop(child);
}
