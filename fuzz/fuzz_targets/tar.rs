#![no_main]
// See shardstream::fuzzing::targets::Target::Tar for what this checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardstream::fuzzing::targets::Target::Tar.run(data);
});
