//! Writes a fuzz target's seed corpus (the real inputs of `shardstream::check::fuzzing::seeds`) into a
//! directory, one file per input named by its content hash. scripts/fuzz.sh runs it as
//! `cargo run --release --features fuzzing --example fuzz_seeds -- <target> <dir>`; it is built
//! without the fuzz crate's coverage instrumentation, which needs libFuzzer's runtime.

use std::hash::{Hash, Hasher};
use std::process::ExitCode;

use shardstream::check::fuzzing::targets::Target;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
    let (Some(name), Some(dir)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: fuzz_seeds <{}> <dir>", names.join("|"));
        return ExitCode::from(2);
    };
    let Some(target) = Target::from_name(name) else {
        eprintln!(
            "unknown target {name:?}: expected one of {}",
            names.join(", ")
        );
        return ExitCode::from(2);
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("cannot create {dir}: {e}");
        return ExitCode::FAILURE;
    }
    for seed in target.seeds() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        let path = std::path::Path::new(dir).join(format!("seed-{:016x}", h.finish()));
        if let Err(e) = std::fs::write(&path, &seed) {
            eprintln!("cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
