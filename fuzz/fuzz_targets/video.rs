#![no_main]
// See shardstream::check::fuzzing::targets::Target::Video for what this checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardstream::check::fuzzing::targets::Target::Video.run(data);
});
