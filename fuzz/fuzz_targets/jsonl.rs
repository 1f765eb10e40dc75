#![no_main]
// See shardstream::check::fuzzing::targets::Target::Jsonl for what this checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardstream::check::fuzzing::targets::Target::Jsonl.run(data);
});
