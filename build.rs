//! Compiles the small C shim over libjpeg's raw-data API (rust/csrc/jpeg_raw.c) and its baseline
//! Huffman decoder (rust/csrc/jpeg_huffman.c) against the libjpeg-turbo that turbojpeg-sys builds
//! and links statically: same headers, same library.

fn main() {
    for file in ["jpeg_raw.c", "jpeg_huffman.c", "jpeg_huffman.h"] {
        println!("cargo:rerun-if-changed=rust/csrc/{file}");
    }
    let include = std::env::var("DEP_TURBOJPEG_INCLUDE")
        .expect("turbojpeg-sys reports the include directory of the libjpeg-turbo it built");
    let mut build = cc::Build::new();
    for dir in include.split(',').filter(|d| !d.is_empty()) {
        build.include(dir);
    }
    build
        .file("rust/csrc/jpeg_raw.c")
        .file("rust/csrc/jpeg_huffman.c")
        .include("rust/csrc")
        .warnings(true)
        .compile("shardstream_jpeg_raw");
}
