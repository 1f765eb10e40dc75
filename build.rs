//! Compiles the small C shim over libjpeg's raw-data API (rust/csrc/jpeg_raw.c) against the
//! libjpeg-turbo that turbojpeg-sys builds and links statically: same headers, same library.

fn main() {
    println!("cargo:rerun-if-changed=rust/csrc/jpeg_raw.c");
    let include = std::env::var("DEP_TURBOJPEG_INCLUDE")
        .expect("turbojpeg-sys reports the include directory of the libjpeg-turbo it built");
    let mut build = cc::Build::new();
    for dir in include.split(',').filter(|d| !d.is_empty()) {
        build.include(dir);
    }
    build
        .file("rust/csrc/jpeg_raw.c")
        .warnings(true)
        .compile("shardstream_jpeg_raw");
}
