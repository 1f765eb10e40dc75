//! Real inputs for the crate's unit tests: JPEGs encoded here, tar shards written the way
//! webdataset writers write them, and a scratch directory per test. Test support for every stage
//! (read, image, tokenize, batch), so it stands below all of them.

use std::path::PathBuf;

use crate::read::group::RawSample;

/// A sample as grouping yields it, keyed `key`, holding `members` (extension, bytes).
pub fn raw(key: &str, members: &[(&str, &[u8])]) -> RawSample {
    RawSample {
        key: key.into(),
        members: members
            .iter()
            .map(|(e, d)| (e.to_string(), d.to_vec()))
            .collect(),
        offset: 0,
        ordinal: 0,
        defect: None,
    }
}

/// A `w` x `h` baseline JPEG of a colour gradient, encoded by the `image` crate.
pub fn jpeg(w: u32, h: u32) -> Vec<u8> {
    let img = ::image::RgbImage::from_fn(w, h, |x, y| {
        ::image::Rgb([
            (x * 255 / w) as u8,
            (y * 255 / h) as u8,
            ((x + y) % 256) as u8,
        ])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, ::image::ImageFormat::Jpeg).unwrap();
    out.into_inner()
}

/// An uncompressed ustar archive of these members, with its end-of-archive blocks.
pub fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        let mut header = [0u8; 512];
        header[..name.len()].copy_from_slice(name.as_bytes());
        header[100..107].copy_from_slice(b"0000644");
        header[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = b'0';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].fill(b' ');
        let sum: u32 = header.iter().map(|&b| b as u32).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// An empty directory of its own for one test (`name` tells the tests apart).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ss-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
