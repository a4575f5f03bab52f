//! The live map page's serving, over real HTTP: `/` and every file under `assets/ui/` come back
//! byte for byte with the right content type, whatever the page or stylesheets reference exists,
//! unknown assets are 404 JSON, ETags give 304s, `/ui/config.json` reflects the `[ui]` config,
//! and bad tile URLs are configuration errors. (The page's behaviour in a browser is
//! tests/browser/map.mjs, run by scripts/browser-test.sh.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use geodwell::config::Config;
use serde_json::Value;

fn assets_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/ui")
}

/// Every file under `dir`, as paths relative to it with `/` separators.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("readable assets dir") {
            let p = entry.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).expect("under dir");
                out.push(
                    rel.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
    }
    out.sort();
    out
}

fn expected_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        _ => "text/plain; charset=utf-8",
    }
}

/// Values of `attr="..."` in `text`.
fn attr_values(text: &str, attr: &str) -> Vec<String> {
    let needle = format!("{attr}=\"");
    text.match_indices(&needle)
        .filter_map(|(i, _)| {
            let rest = &text[i + needle.len()..];
            rest.find('"').map(|end| rest[..end].to_string())
        })
        .collect()
}

async fn get_raw(srv: &Srv, path: &str) -> reqwest::Response {
    srv.http.get(srv.url(path)).send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn the_page_and_every_asset_are_served_with_their_types() {
    let srv = start("").await;

    let r = get_raw(&srv, "/").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
    let csp = header(&r, "content-security-policy");
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(
        csp.contains("img-src 'self' data:;"),
        "no tile URL, no remote images: {csp}"
    );
    assert_eq!(header(&r, "referrer-policy"), "no-referrer");
    let index = r.text().await.unwrap();
    let disk = std::fs::read_to_string(assets_dir().join("index.html")).unwrap();
    assert_eq!(index, disk, "GET / is assets/ui/index.html");

    // Everything the page references is served, with the type its extension implies.
    let refs: Vec<String> = attr_values(&index, "src")
        .into_iter()
        .chain(attr_values(&index, "href"))
        .filter(|u| u.starts_with("/ui/"))
        .collect();
    assert!(
        refs.iter().any(|u| u == "/ui/app.js")
            && refs.iter().any(|u| u == "/ui/vendor/leaflet/leaflet.js")
            && refs.iter().any(|u| u == "/ui/vendor/leaflet/leaflet.css"),
        "{refs:?}"
    );
    for u in &refs {
        let r = get_raw(&srv, u).await;
        assert_eq!(r.status(), 200, "{u}");
        assert_eq!(header(&r, "content-type"), expected_type(u), "{u}");
    }

    // Every file under assets/ui/ is embedded (none forgotten in src/http/ui.rs) and identical.
    let files = files_under(&assets_dir());
    assert!(files.len() >= 10, "{files:?}");
    for f in &files {
        let r = get_raw(&srv, &format!("/ui/{f}")).await;
        assert_eq!(r.status(), 200, "/ui/{f} is not served");
        assert_eq!(header(&r, "content-type"), expected_type(f), "{f}");
        assert_eq!(header(&r, "x-content-type-options"), "nosniff", "{f}");
        let body = r.bytes().await.unwrap();
        let disk = std::fs::read(assets_dir().join(f)).unwrap();
        assert!(body[..] == disk[..], "/ui/{f} differs from the file");
    }

    // Module imports and stylesheet images resolve to served files too.
    for f in files
        .iter()
        .filter(|f| f.ends_with(".js") && !f.contains("vendor/"))
    {
        let text = std::fs::read_to_string(assets_dir().join(f)).unwrap();
        for (i, _) in text.match_indices("from './") {
            let rest = &text[i + "from './".len()..];
            let name = &rest[..rest.find('\'').unwrap()];
            assert!(
                files.contains(&name.to_string()),
                "{f} imports missing {name}"
            );
        }
    }
    let css = std::fs::read_to_string(assets_dir().join("vendor/leaflet/leaflet.css")).unwrap();
    for (i, _) in css.match_indices("url(") {
        let rest = &css[i + 4..];
        let u = rest[..rest.find(')').unwrap()].trim_matches(['"', '\'']);
        // `data:` URIs and old IE's `behavior: url(#default#VML)` are not files.
        if u.starts_with("data:") || u.starts_with('#') {
            continue;
        }
        let r = get_raw(&srv, &format!("/ui/vendor/leaflet/{u}")).await;
        assert_eq!(r.status(), 200, "leaflet.css needs {u}");
    }
    srv.stop().await;
}

/// Every `[lon, lat]` position under a GeoJSON `coordinates` value.
fn positions(v: &Value, out: &mut Vec<(f64, f64)>) {
    let Some(a) = v.as_array() else { return };
    match (
        a.first().and_then(Value::as_f64),
        a.get(1).and_then(Value::as_f64),
    ) {
        (Some(lon), Some(lat)) if a.len() == 2 => out.push((lon, lat)),
        _ => a.iter().for_each(|x| positions(x, out)),
    }
}

/// The offline base layer (`assets/ui/vendor/world-atlas/`, docs/ui.md "Base layer"): GeoJSON of
/// the shapes the page draws, with valid positions, within the size the docs give, and its
/// README says where it came from.
#[test]
fn the_vendored_base_layer_is_geojson_within_budget() {
    let dir = assets_dir().join("vendor/world-atlas");
    let mut total = 0;
    for (file, kind, min_parts) in [
        ("land.json", "MultiPolygon", 1000),
        ("borders.json", "MultiLineString", 100),
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        total += bytes.len();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["type"], "Feature", "{file}");
        assert_eq!(v["geometry"]["type"], kind, "{file}");
        let parts = v["geometry"]["coordinates"].as_array().unwrap();
        assert!(parts.len() >= min_parts, "{file}: {} parts", parts.len());
        let mut pts = Vec::new();
        positions(&v["geometry"]["coordinates"], &mut pts);
        assert!(pts.len() > 10_000, "{file}: {} positions", pts.len());
        for (lon, lat) in pts {
            assert!(
                (-180.0..=180.0).contains(&lon) && (-90.0..=90.0).contains(&lat),
                "{file}: {lon}, {lat}"
            );
        }
    }
    assert!(total < 1_500_000, "base layer is {total} bytes");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    for needle in [
        "world-atlas",
        "2.0.2",
        "public domain",
        "scripts/vendor-world-atlas.sh",
    ] {
        assert!(readme.contains(needle), "README lacks {needle:?}");
    }
}

/// In process (`App`): the paths reach the router exactly as written. (An HTTP client such as
/// reqwest normalizes `%2e%2e` segments away before sending; a hostile client need not.)
#[tokio::test]
async fn unknown_assets_are_404_json_and_nothing_else_is_reachable() {
    let srv = start("").await;
    let app = srv.app();
    for path in [
        "/ui/nope.js",
        "/ui/vendor/leaflet/leaflet.js.map",
        "/ui/%2e%2e/Cargo.toml",
        "/ui/..%2F..%2FCargo.toml",
        "/ui/%2Fetc%2Fpasswd",
        "/ui/app.js/",
    ] {
        let (status, body) = app.get(path).await;
        assert_eq!(status, 404, "{path}");
        let code = body["error"]["code"].as_str().unwrap_or_default();
        assert!(
            code == "asset_not_found" || code == "no_route",
            "{path}: {body}"
        );
    }
    let (status, body) = app.get("/ui/nope.js").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("asset_not_found"))
    );
    let r = app.call("POST", "/", &[], None).await;
    assert_eq!(r.status, 405);
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");
    srv.stop().await;
}

#[tokio::test]
async fn etags_let_the_browser_revalidate_cheaply() {
    let srv = start("").await;
    let r = get_raw(&srv, "/ui/app.js").await;
    assert_eq!(header(&r, "cache-control"), "no-cache");
    let etag = header(&r, "etag");
    assert!(etag.starts_with('"') && etag.len() > 2, "{etag:?}");
    let other = header(&get_raw(&srv, "/ui/style.css").await, "etag");
    assert_ne!(etag, other, "different bytes, different ETag");

    let r = srv
        .http
        .get(srv.url("/ui/app.js"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    assert_eq!(header(&r, "etag"), etag);
    assert!(r.bytes().await.unwrap().is_empty());

    let r = srv
        .http
        .get(srv.url("/ui/app.js"))
        .header("if-none-match", "\"0000\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.bytes().await.unwrap().is_empty());

    let r = srv.http.head(srv.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
    srv.stop().await;
}

#[tokio::test]
async fn config_json_reports_the_tile_layer() {
    let srv = start("").await;
    let r = get_raw(&srv, "/ui/config.json").await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("application/json"));
    assert_eq!(header(&r, "cache-control"), "no-store");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["tile_url"], Value::Null, "{v}");
    assert_eq!(v["tile_attribution"], Value::Null, "{v}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    srv.stop().await;

    let url = "https://tiles.example.org/{z}/{x}/{y}.png";
    let srv = start(&format!(
        "[ui]\nmap_tile_url = \"{url}\"\nmap_tile_attribution = \"© Example <contributors>\"\n"
    ))
    .await;
    let (status, v) = srv.get("/ui/config.json").await;
    assert_eq!(status, 200);
    assert_eq!(v["tile_url"], url);
    assert_eq!(v["tile_attribution"], "© Example <contributors>");
    let csp = header(&get_raw(&srv, "/").await, "content-security-policy");
    assert!(csp.contains("img-src 'self' data: http: https:"), "{csp}");
    assert!(csp.contains("connect-src 'self' ws: wss:"), "{csp}");
    srv.stop().await;
}

#[tokio::test]
async fn the_page_loads_without_a_key_when_the_api_needs_one() {
    // The page must load before the browser has a key to send; the data behind it must not.
    let key = "map-page-key-0123456789";
    let srv = start(&format!(
        "[auth]\napi_keys = [{{ name = \"map\", scopes = [\"read\"], key = \"{key}\" }}]\n"
    ))
    .await;
    for path in [
        "/",
        "/ui/app.js",
        "/ui/vendor/leaflet/leaflet.js",
        "/ui/config.json",
    ] {
        let r = get_raw(&srv, path).await;
        assert_eq!(r.status(), 200, "{path} without a key");
    }
    let (status, body) = srv.get("/v1/fences").await;
    assert_eq!(status, 401, "{body}");
    let r = srv
        .http
        .get(srv.url("/v1/fences"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the page's read-only key reads fences");
    srv.stop().await;
}

#[test]
fn tile_urls_are_validated_with_the_rest_of_the_config() {
    let load = |text: &str| Config::load(Some(("t.toml", text)), &BTreeMap::new(), 1);
    let ok = load("[ui]\nmap_tile_url = \"http://127.0.0.1:8080/tiles/{z}/{x}/{y}.png\"\n")
        .expect("valid");
    assert_eq!(
        ok.map_tile_url.as_deref(),
        Some("http://127.0.0.1:8080/tiles/{z}/{x}/{y}.png")
    );
    assert_eq!(ok.map_tile_attribution, None);
    let none = load("[ui]\nmap_tile_url = \"\"\n").expect("valid");
    assert_eq!(none.map_tile_url, None);

    for bad in [
        "ftp://tiles.example.org/{z}/{x}/{y}.png",
        "tiles.example.org/{z}/{x}/{y}.png",
        "https:///{z}/{x}/{y}.png",
        "https://tiles.example.org/{z}/{x}.png",
        "https://tiles.example.org/{z}/{x}/{y}.png\" onerror=\"x",
        "https://tiles.example.org/ {z}/{x}/{y}.png",
    ] {
        let text = format!("[ui]\nmap_tile_url = {}\n", toml_str(bad));
        let err = load(&text).expect_err(bad);
        assert!(
            err.issues.iter().any(|i| i.key == "ui.map_tile_url"),
            "{bad}: {err}"
        );
    }
    // Reported together with other problems, and settable from the environment.
    let err =
        load("[ui]\nmap_tile_url = \"nope\"\nmap_tile_attribution = 3\n[time]\ntick = \"0s\"\n")
            .expect_err("three problems");
    assert_eq!(err.issues.len(), 3, "{err}");
    let env: BTreeMap<String, String> = [(
        "GEODWELL_MAP_TILE_URL".to_string(),
        "https://t.example/{z}/{x}/{y}.png".to_string(),
    )]
    .into();
    let c = Config::load(None, &env, 1).expect("valid from env");
    assert_eq!(
        c.map_tile_url.as_deref(),
        Some("https://t.example/{z}/{x}/{y}.png")
    );
}

/// A TOML basic string for `s`.
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
