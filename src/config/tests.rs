//! Unit tests of configuration loading.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;

#[test]
fn embedded_defaults_are_valid() {
    let c = Config::defaults(2);
    assert_eq!(c.shards, 2);
    assert_eq!(c.listen, "127.0.0.1:7878".parse().unwrap());
    assert_eq!(c.clock, ClockMode::Live);
    assert_eq!(c.lateness, Dur::from_secs(2));
    assert_eq!(c.max_body_bytes, 8 * 1024 * 1024);
    assert_eq!(c.fences_file, FencePreload::Samples);
}

#[test]
fn every_error_is_reported_at_once() {
    let text = r#"
        [server]
        listen = "nowhere"
        colour = "blue"
        [time]
        clock = "sundial"
        tick = "0s"
        [bogus]
        x = 1
        [ingest]
        max_batch = -5
    "#;
    let err = Config::load(Some(("t.toml", text)), &BTreeMap::new(), 1).unwrap_err();
    let keys: Vec<&str> = err.issues.iter().map(|i| i.key.as_str()).collect();
    for k in [
        "server.colour",
        "bogus",
        "server.listen",
        "time.clock",
        "time.tick",
        "ingest.max_batch",
    ] {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
    assert!(err.to_string().contains("6 error(s)"), "{err}");
}

#[test]
fn env_overrides_win_and_unknown_ones_are_reported() {
    let env: BTreeMap<String, String> = [
        ("GEODWELL_LATENESS".to_string(), "5s".to_string()),
        ("GEODWELL_CLOCK".to_string(), "event".to_string()),
        ("GEODWELL_SHARDS".to_string(), "3".to_string()),
    ]
    .into();
    let c = Config::load(None, &env, 8).unwrap();
    assert_eq!(
        (c.lateness, c.clock, c.shards),
        (Dur::from_secs(5), ClockMode::Event, 3)
    );
    let bad: BTreeMap<String, String> = [("GEODWELL_NOPE".to_string(), "1".to_string())].into();
    assert!(Config::load(None, &bad, 1).is_err());
}

#[test]
fn empty_fences_file_means_none() {
    let c = Config::load(
        Some(("t", "[fences]\nfences_file = \"\"\n")),
        &BTreeMap::new(),
        1,
    )
    .unwrap();
    assert_eq!(c.fences_file, FencePreload::None);
}

#[test]
fn relative_paths_in_a_file_resolve_against_its_directory() {
    let text = "[server]\ndata_dir = \"state\"\n[fences]\nfences_file = \"f.geojson\"\n";
    let src = Sources {
        file: Some(("conf/g.toml", text, Some(Path::new("/etc/geodwell")))),
        env: BTreeMap::new(),
        cli: Vec::new(),
        cores: 1,
    };
    let c = Config::load_sources(&src).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("/etc/geodwell/state"));
    assert_eq!(
        c.fences_file,
        FencePreload::File(PathBuf::from("/etc/geodwell/f.geojson"))
    );
    // Absolute paths stay; the environment and the command line are relative to the working
    // directory; the embedded default's relative data_dir too.
    let text = "[server]\ndata_dir = \"/var/lib/g\"\n";
    let c = Config::load_sources(&Sources {
        file: Some(("g.toml", text, Some(Path::new("/etc/geodwell")))),
        ..src.clone()
    })
    .unwrap();
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/g"));
    let c = Config::load_sources(&Sources {
        env: [("GEODWELL_DATA_DIR".to_string(), "d1".to_string())].into(),
        cli: vec![("fences_file", "--fences-file", "x.geojson".to_string())],
        ..src.clone()
    })
    .unwrap();
    assert_eq!(c.data_dir, PathBuf::from("d1"));
    assert_eq!(
        c.fences_file,
        FencePreload::File(PathBuf::from("x.geojson"))
    );
    assert_eq!(Config::defaults(1).data_dir, PathBuf::from("data"));
}

#[test]
fn flags_win_over_the_environment_and_the_file_and_are_validated_alike() {
    let src = Sources {
        file: Some(("g.toml", "[time]\nlateness = \"1s\"\n", None)),
        env: [("GEODWELL_LATENESS".to_string(), "3s".to_string())].into(),
        cli: vec![
            ("lateness", "--lateness", "5s".to_string()),
            ("shards", "--shards", "0".to_string()),
            ("fences_file", "--fences-file", String::new()),
        ],
        cores: 3,
    };
    let c = Config::load_sources(&src).unwrap();
    assert_eq!(c.lateness, Dur::from_secs(5));
    assert_eq!(
        c.shards, 3,
        "shards = 0 resolves to the cores, in one place"
    );
    assert_eq!(c.fences_file, FencePreload::None);
    let err = Config::load_sources(&Sources {
        cli: vec![("lateness", "--lateness", "soon".to_string())],
        ..src
    })
    .unwrap_err();
    assert_eq!(
        err.issues[0].key, "time.lateness (from --lateness)",
        "{err}"
    );
}
