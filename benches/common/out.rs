//! Where benchmarks write their JSON: `target/bench/<name>.json` (under `$CARGO_TARGET_DIR` when
//! set). Shared by every bench through `#[path]`.

use std::path::PathBuf;

/// Writes `doc` pretty-printed to `target/bench/<name>.json`, creating the directory; returns
/// the path written.
pub fn write_json<T: serde::Serialize + ?Sized>(name: &str, doc: &T) -> std::io::Result<PathBuf> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(doc).map_err(std::io::Error::other)?;
    std::fs::write(&path, text)?;
    Ok(path)
}
