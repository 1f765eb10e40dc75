#![no_main]
// See shardstream::check::fuzzing::targets::Target::Tar for what this checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardstream::check::fuzzing::targets::Target::Tar.run(data);
});
