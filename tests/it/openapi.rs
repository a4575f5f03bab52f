//! The OpenAPI document: served at /openapi.json as OpenAPI 3.1, every documented operation is
//! served (never "no such endpoint" or "method not allowed"), and every served route other than
//! the document itself and the map page's assets is documented (the router registers handlers
//! only through their `#[utoipa::path]` attributes; this test holds it to that).

use crate::common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_describes_what_is_served() {
    let srv = start("").await;
    // In process (`App`): request/answer only.
    let app = srv.app();
    let (s, doc) = app.get("/openapi.json").await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], "3.1.0", "{}", doc["openapi"]);
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    // Every reference resolves (a parameter's type that is not in the components would leave
    // clients, and schemathesis, unable to read that part).
    let text = doc.to_string();
    for r in text.split("\"#/components/schemas/").skip(1) {
        let name = r.split('"').next().unwrap();
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "#/components/schemas/{name} is referenced but not defined"
        );
    }
    let paths = doc["paths"].as_object().unwrap();
    let mut ops = 0;
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["responses"].is_object(), "{method} {path} has responses");
            let path_id = path.replace("{id}", "no-such-thing");
            let r = app.call(&method.to_uppercase(), &path_id, &[], None).await;
            let status = r.status;
            let body: Value = r.json();
            assert_ne!(status, 405, "{method} {path} is documented but not served");
            assert_ne!(
                body["error"]["code"], "no_route",
                "{method} {path} is documented but not served"
            );
            ops += 1;
        }
    }
    assert!(ops >= 20, "only {ops} operations documented");
    // The running configuration's limits are in the document.
    let fix_body = &doc["components"]["schemas"]["FixBody"]["oneOf"];
    assert!(
        fix_body
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["maxItems"] == 100_000),
        "{fix_body}"
    );
    srv.stop().await;
}

#[test]
fn every_route_is_registered_through_its_documentation() {
    let src = include_str!("../../src/http/mod.rs");
    let plain: Vec<&str> = src
        .lines()
        .filter(|l| l.trim_start().starts_with(".route("))
        .map(str::trim)
        .collect();
    // The document itself and the map page (HTML and static files, not API operations).
    let allowed = [
        ".route(",
        ".route(\"/\", get(ui::index))",
        ".route(\"/ui/{*path}\", get(ui::asset))",
    ];
    for l in &plain {
        assert!(
            allowed.contains(l),
            "undocumented route in src/http/mod.rs: {l}"
        );
    }
    assert_eq!(plain.len(), 3, "{plain:?}");
    assert!(src.contains("\"/openapi.json\""));
}
