#![no_main]
// See shardstream::check::fuzzing::targets::Target::Parquet for what this checks.

/// The standard panic hook in place of libFuzzer's, once: the reader catches the parquet crate's
/// decoder panics on malformed pages and reports the file as corrupt (`read::parquet::rows`),
/// but libFuzzer's hook aborts at the panic itself, before that catch. With the standard hook a
/// caught panic is only printed; one nothing catches still reaches libfuzzer-sys's own catch,
/// which aborts: a finding, as before.
static STANDARD_HOOK: std::sync::Once = std::sync::Once::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    STANDARD_HOOK.call_once(|| drop(std::panic::take_hook()));
    shardstream::check::fuzzing::targets::Target::Parquet.run(data);
});
