//! The binary as users run it: `geodwell serve` answers, and SIGTERM drains and exits 0;
//! `geodwell check-config` reports every error at once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{BIN, Proc, listening_addr, serve_cmd, temp_dir};

#[test]
fn serve_answers_then_exits_zero_on_sigterm() {
    let data = temp_dir();
    let child = serve_cmd(data.path())
        .args(["--clock", "event", "--lateness", "0s", "--shards", "2"])
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

/// Sends SIGHUP to the server.
fn sighup(child: &Proc) {
    let ok = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Collects the server's log lines until `done` holds for what was collected (30 s at most).
fn log_until(lines: &std::sync::mpsc::Receiver<String>, done: impl Fn(&str) -> bool) -> String {
    let t = Instant::now();
    let mut log = String::new();
    while !done(&log) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the expected lines were not logged:\n{log}"
        );
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(100)) {
            log.push_str(&l);
            log.push('\n');
        }
    }
    log
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
    let child = serve_cmd(&dir.path().join("data"))
        .arg("--config")
        .arg(&file)
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
    sighup(&child);
    until(NEW, 200);
    assert_eq!(status(OLD), 401, "the removed key is refused");
    // Not valid: a scope that does not exist and a key too short, both reported; NEW stays.
    std::fs::write(
        &file,
        "[auth]\napi_keys = [\n  { name = \"a\", scopes = [\"wizard\"], key = \"short\" },\n]\n",
    )
    .unwrap();
    sighup(&child);
    let log = log_until(&lines, |log| {
        log.contains("wizard") && log.contains("at least 16 characters")
    });
    assert!(log.contains("keeping the running one"), "{log}");
    assert_eq!(
        (status(NEW), status(OLD)),
        (200, 401),
        "the running keys stay"
    );
    drop(child);
}

/// A certificate for 127.0.0.1 signed by a self-signed CA of its own (openssl): (leaf PEM,
/// key PEM, CA PEM). webpki, like browsers, takes no end-entity certificate as its own anchor.
fn self_signed(
    dir: &std::path::Path,
    name: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let p = |ext: &str| dir.join(format!("{name}.{ext}"));
    let run = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(ok.success(), "openssl {args:?}");
    };
    let s = |x: std::path::PathBuf| x.display().to_string();
    std::fs::write(
        p("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let ca_subj = format!("/CN={name}-ca");
    let mut ca = vec!["req", "-x509", "-days", "2", "-subj", &ca_subj];
    ca.extend(ec);
    let (ca_key, ca_crt) = (s(p("ca.key")), s(p("ca.crt")));
    ca.extend(["-keyout", &ca_key, "-out", &ca_crt]);
    run(&ca);
    let subj = format!("/CN={name}");
    let mut csr = vec!["req", "-subj", &subj];
    csr.extend(ec);
    let (key, csr_path, crt, ext) = (s(p("key")), s(p("csr")), s(p("crt")), s(p("ext")));
    csr.extend(["-keyout", &key, "-out", &csr_path]);
    run(&csr);
    run(&[
        "x509",
        "-req",
        "-in",
        &csr_path,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &ext,
        "-out",
        &crt,
    ]);
    (p("crt"), p("key"), p("ca.crt"))
}

/// The DER of the first certificate in a PEM file.
fn leaf_of(cert: &std::path::Path) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// A TLS client trusting either CA: the server's leaf certificate.
async fn tls_connect_any(addr: &str, a: &std::path::Path, b: &std::path::Path) -> ((), Vec<u8>) {
    let both = a.with_extension("both");
    let text = std::fs::read_to_string(a).unwrap() + &std::fs::read_to_string(b).unwrap();
    std::fs::write(&both, text).unwrap();
    let (_, leaf) = tls_connect(addr, &both).await;
    ((), leaf)
}

/// A TLS client that trusts only the CAs in `cert`; returns the stream and the server's leaf
/// certificate.
async fn tls_connect(
    addr: &str,
    cert: &std::path::Path,
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    Vec<u8>,
) {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let leaf = stream.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    (stream, leaf)
}

/// `server.tls_cert` / `server.tls_key`: HTTPS (curl) and WSS (a WebSocket over rustls) with a
/// self-signed certificate; plain HTTP is not answered; SIGHUP reads a renewed certificate,
/// which new connections get.
#[test]
fn tls_serves_https_and_wss_and_a_renewed_certificate_is_read_on_sighup() {
    let dir = temp_dir();
    let (cert, key, ca) = self_signed(dir.path(), "first");
    let child = serve_cmd(&dir.path().join("data"))
        .args(["--clock", "event", "--lateness", "0s"])
        .env("GEODWELL_TLS_CERT", &cert)
        .env("GEODWELL_TLS_KEY", &key)
        .spawn()
        .expect("binary starts");
    let mut child = Proc(child);
    let addr = listening_addr(&mut child, None);
    let curl = |scheme: &str, cacert: &std::path::Path| {
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg("--cacert")
            .arg(cacert)
            .arg(format!("{scheme}://{addr}/readyz"))
            .output()
            .expect("curl runs")
    };
    let out = curl("https", &ca);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    let out = curl("http", &ca);
    assert_ne!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "plain HTTP is not served"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (stream, leaf) = tls_connect(&addr, &ca).await;
        assert_eq!(leaf, leaf_of(&cert));
        let (mut ws, resp) =
            tokio_tungstenite::client_async(format!("wss://{addr}/v1/events/ws"), stream)
                .await
                .expect("WebSocket over TLS");
        assert_eq!(resp.status().as_u16(), 101);
        ws.close(None).await.ok();
    });

    // Renewed in place, then SIGHUP: the next connection gets the new certificate.
    let (cert2, key2, ca2) = self_signed(dir.path(), "second");
    std::fs::copy(&cert2, &cert).unwrap();
    std::fs::copy(&key2, &key).unwrap();
    sighup(&child);
    let second = leaf_of(&cert2);
    let t = Instant::now();
    rt.block_on(async {
        loop {
            let (_, leaf) = tls_connect_any(&addr, &ca, &ca2).await;
            if leaf == second {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the renewed certificate was never served"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    drop(child);
}

/// SIGHUP applies the configured sinks (`[[webhooks]]`) of the file: a sink removed from it
/// stops, a sink added starts at the log head, and a file that is not valid keeps the running
/// sinks and logs its errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_configured_sinks() {
    use axum::routing::post;
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwZbMA3wnmMvI=";
    let got: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let app = {
        let (a, b) = (got.clone(), got.clone());
        axum::Router::new()
            .route(
                "/a",
                post(move |body: String| async move {
                    a.lock()
                        .unwrap()
                        .push(("a".into(), serde_json::from_str(&body).unwrap()));
                }),
            )
            .route(
                "/b",
                post(move |body: String| async move {
                    b.lock()
                        .unwrap()
                        .push(("b".into(), serde_json::from_str(&body).unwrap()));
                }),
            )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rx = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = temp_dir();
    let file = dir.path().join("geodwell.toml");
    let cfg = |sinks: &str| {
        format!(
            "[server]\nallow_private_targets = true\n[time]\nclock = \"event\"\nlateness = \"0s\"\n\
             [fences]\nfences_file = \"\"\n{sinks}"
        )
    };
    let sink = |id: &str| {
        format!("[[webhooks]]\nid = \"{id}\"\nurl = \"http://{rx}/{id}\"\nsecret = \"{SECRET}\"\n")
    };
    std::fs::write(&file, cfg(&sink("a"))).unwrap();
    let child = serve_cmd(&dir.path().join("data"))
        .arg("--config")
        .arg(&file)
        .spawn()
        .expect("binary starts");
    let mut child = Proc(child);
    let (tx, lines) = std::sync::mpsc::channel();
    let base = format!("http://{}", listening_addr(&mut child, Some(tx)));
    let http = reqwest::Client::new();
    let r = http
        .put(format!("{base}/v1/fences/depot"))
        .json(&crate::common::square("depot", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let post_fix = |secs: i64, inside: bool| {
        let http = http.clone();
        let url = format!("{base}/v1/fixes");
        async move {
            let r = http
                .post(url)
                .json(&json!([crate::common::fix("t1", secs, inside)]))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    let wait = |n: usize| {
        let got = got.clone();
        async move {
            let t = Instant::now();
            while got.lock().unwrap().len() < n {
                assert!(t.elapsed() < Duration::from_secs(30), "{:?}", got.lock());
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    };
    let ids = |http: reqwest::Client| {
        let url = format!("{base}/v1/webhooks");
        async move {
            let v: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            v["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    post_fix(0, true).await;
    wait(1).await;
    std::fs::write(&file, cfg(&sink("b"))).unwrap();
    sighup(&child);
    let t = Instant::now();
    while ids(http.clone()).await != ["b"] {
        assert!(t.elapsed() < Duration::from_secs(30), "b never replaced a");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    post_fix(60, false).await;
    wait(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen: Vec<(String, String)> = got
        .lock()
        .unwrap()
        .iter()
        .map(|(s, v)| (s.clone(), v["type"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        seen,
        [("a", "enter"), ("b", "exit")].map(|(a, b)| (a.to_string(), b.to_string())),
        "a stopped; b started at the head"
    );
    // Not valid: the running sinks stay and the error is logged.
    std::fs::write(
        &file,
        cfg("[[webhooks]]\nid = \"c\"\nurl = \"gopher://x\"\nsecret = \"nope\"\n"),
    )
    .unwrap();
    sighup(&child);
    log_until(&lines, |log| {
        log.contains("keeping the running one") && log.contains("gopher")
    });
    assert_eq!(ids(http.clone()).await, ["b"]);
}
