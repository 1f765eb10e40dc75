//! What the Rust benches share (a module of each, by `#[path]`: a folder, so that cargo does
//! not take it for a bench of its own).

/// The value after `name` on the command line (`--repeat 5`), or `default` when it is absent
/// or does not parse.
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
