//! Command-line numbers of the benches (`--name N`). Shared through `#[path]`.

/// The number after `name` in `args`, or `default` when absent or not a number.
pub fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
