//! The coverage-guided (libFuzzer) targets' entry points: each takes one input of raw bytes, as
//! libFuzzer hands it over. Where a check has a knob (a member size limit, a crop, which index
//! block), the input's leading bytes choose it, so libFuzzer's mutations explore the knobs too.
//! The binaries in `fuzz/fuzz_targets` are one line each: `Target::X.run(data)`.

use std::cell::RefCell;

use super::{checks, seeds};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The tar reader: headers, PAX and GNU long names, sizes, padding.
    Tar,
    /// Sample grouping over the tar reader, plain and through gzip.
    Group,
    /// Image probing and decoding: the JPEG raw-plane path with crops, PNG, WebP; and our JPEG
    /// entropy decoder against libjpeg-turbo's on the same bytes.
    Image,
    /// The index: manifest, detail blocks (raw, and behind their checksum and gzip), JSON v1.
    Index,
}

/// How the `Index` target's first byte picks what the rest is.
const INDEX_MANIFEST: u8 = 0;
const INDEX_MANIFEST_RECORDS: u8 = 1;
const INDEX_DETAIL_RECORDS: u8 = 2;
const INDEX_DETAIL: u8 = 3;
const INDEX_JSON_V1: u8 = 4;
const INDEX_KINDS: u8 = 5;

impl Target {
    pub const ALL: [Target; 4] = [Target::Tar, Target::Group, Target::Image, Target::Index];

    pub fn name(self) -> &'static str {
        match self {
            Target::Tar => "tar",
            Target::Group => "group",
            Target::Image => "image",
            Target::Index => "index",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Runs the target's check on one input: true when it parsed cleanly. Panics on a broken
    /// invariant (a finding).
    pub fn run(self, data: &[u8]) -> bool {
        match self {
            Target::Tar => {
                let Some((&knob, rest)) = data.split_first() else {
                    return false;
                };
                let max_member = [1 << 20, 100, 0][knob as usize % 3];
                checks::drain_tar(rest, max_member)
            }
            Target::Group => checks::group(data),
            Target::Image => {
                thread_local! {
                    // One decoder across inputs, as a decode thread has: a failed decode must
                    // leave no state behind that breaks the next.
                    static DECODER: RefCell<crate::image::decode::Decoder> =
                        RefCell::new(crate::image::decode::Decoder::new());
                }
                let (knob, image) = split_knob(data);
                let decoded =
                    DECODER.with(|d| checks::decode_all(&mut d.borrow_mut(), image, knob));
                checks::jpeg_entropy_agrees(image, knob);
                decoded
            }
            Target::Index => {
                let Some((&kind, rest)) = data.split_first() else {
                    return false;
                };
                let layout = seeds::index_layout();
                match kind % INDEX_KINDS {
                    INDEX_MANIFEST => checks::manifest(rest),
                    INDEX_MANIFEST_RECORDS => {
                        let wrap = seeds::wrap_checked(crate::index::manifest::MAGIC);
                        checks::manifest(&wrap(rest.to_vec()))
                    }
                    INDEX_DETAIL_RECORDS | INDEX_DETAIL => {
                        let Some((&which, rest)) = rest.split_first() else {
                            return false;
                        };
                        let block = &layout.details[which as usize % layout.details.len()];
                        let bytes = if kind % INDEX_KINDS == INDEX_DETAIL_RECORDS {
                            seeds::wrap_checked(b"")(rest.to_vec())
                        } else {
                            rest.to_vec()
                        };
                        checks::detail(&bytes, &block.url, block.num_samples)
                    }
                    _ => checks::json_v1(rest),
                }
            }
        }
    }

    /// The seed corpus: the real inputs of [`seeds`], each with the leading knob bytes that
    /// [`Target::run`] reads.
    pub fn seeds(self) -> Vec<Vec<u8>> {
        let prefixed = |prefix: &[u8], body: &[u8]| [prefix, body].concat();
        match self {
            Target::Tar => seeds::tar_bases()
                .iter()
                .flat_map(|b| (0u8..3).map(move |k| prefixed(&[k], b)))
                .collect(),
            Target::Group => {
                let mut out = seeds::tar_bases().clone();
                out.push(seeds::gzip(&seeds::tar_bases()[0]));
                out
            }
            Target::Image => {
                // A whole-image decode, and a crop to 16 px of a part of it.
                let knobs = [0u64, 0x0000_0301_8080_4020];
                seeds::images()
                    .iter()
                    .flat_map(|img| knobs.map(|k| prefixed(&k.to_le_bytes(), img)))
                    .collect()
            }
            Target::Index => {
                let layout = seeds::index_layout();
                let index = seeds::sample_index();
                let mut out = vec![
                    prefixed(&[INDEX_MANIFEST], &layout.manifest),
                    prefixed(
                        &[INDEX_MANIFEST_RECORDS],
                        &seeds::unwrap_checked(
                            &layout.manifest,
                            crate::index::manifest::MAGIC.len(),
                        ),
                    ),
                    prefixed(&[INDEX_JSON_V1], &index.to_json()),
                    prefixed(&[INDEX_JSON_V1], &index.to_json_gz()),
                ];
                for (i, d) in layout.details.iter().enumerate() {
                    let which = i as u8;
                    out.push(prefixed(&[INDEX_DETAIL, which], &d.block));
                    out.push(prefixed(
                        &[INDEX_DETAIL_RECORDS, which],
                        &seeds::unwrap_checked(&d.block, 0),
                    ));
                }
                out
            }
        }
    }
}

/// The first 8 bytes (little-endian, zero-padded) as a knob, and the rest.
fn split_knob(data: &[u8]) -> (u64, &[u8]) {
    let n = data.len().min(8);
    let mut knob = [0u8; 8];
    knob[..n].copy_from_slice(&data[..n]);
    (u64::from_le_bytes(knob), &data[n..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_parses_cleanly_through_its_target() {
        // The seeds are valid inputs: if one stopped parsing, libFuzzer would start from the
        // error paths only.
        for target in Target::ALL {
            let seeds = target.seeds();
            assert!(!seeds.is_empty(), "{target:?} has no seeds");
            for (i, seed) in seeds.iter().enumerate() {
                assert!(
                    target.run(seed),
                    "{target:?} seed {i} does not parse cleanly"
                );
            }
            assert_eq!(Target::from_name(target.name()), Some(target));
        }
    }
}
