//! The coverage-guided (libFuzzer) targets' entry points: each takes one input of raw bytes, as
//! libFuzzer hands it over. Where a check has a knob (a member size limit, a crop, which index
//! block), the input's leading bytes choose it, so libFuzzer's mutations explore the knobs too.
//! The binaries in `fuzz/fuzz_targets` are one line each: `Target::X.run(data)`.

use std::cell::RefCell;

use super::{checks, reader_seeds, readers, seeds};

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
    /// A Parquet file read as image-text samples, as text documents and as interleaved list
    /// documents (`readers::parquet`).
    Parquet,
    /// A JSONL text file, plain, gzip and zstd (by name, or sniffed).
    Jsonl,
    /// A WebDataset sample's JSON member as the interleaved kind parses it: MINT-1T lists, LLaVA
    /// conversations; and a caption pair's caption.
    Documents,
    /// A video clip's bytes: the container input (memory I/O, stream choice, header caps), the
    /// demux pass that numbers its frames, and the decoder and converter of a few sampled frames.
    Video,
}

/// How the `Index` target's first byte picks what the rest is.
const INDEX_MANIFEST: u8 = 0;
const INDEX_MANIFEST_RECORDS: u8 = 1;
const INDEX_DETAIL_RECORDS: u8 = 2;
const INDEX_DETAIL: u8 = 3;
const INDEX_JSON_V1: u8 = 4;
const INDEX_KINDS: u8 = 5;

impl Target {
    pub const ALL: [Target; 8] = [
        Target::Tar,
        Target::Group,
        Target::Image,
        Target::Index,
        Target::Parquet,
        Target::Jsonl,
        Target::Documents,
        Target::Video,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Tar => "tar",
            Target::Group => "group",
            Target::Image => "image",
            Target::Index => "index",
            Target::Parquet => "parquet",
            Target::Jsonl => "jsonl",
            Target::Documents => "documents",
            Target::Video => "video",
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
            Target::Parquet => {
                let Some((&knob, file)) = data.split_first() else {
                    return false;
                };
                let layout = PARQUET_LAYOUTS[knob as usize % PARQUET_LAYOUTS.len()];
                readers::parquet(file, layout, CAPS[(knob as usize / 3) % 2])
            }
            Target::Jsonl => {
                let Some((&knob, file)) = data.split_first() else {
                    return false;
                };
                let names = readers::JSONL_NAMES;
                let cap = CAPS[(knob as usize / names.len()) % 2];
                readers::jsonl(file, names[knob as usize % names.len()], cap)
            }
            Target::Documents => {
                let Some((&knob, member)) = data.split_first() else {
                    return false;
                };
                let layout = TAR_LAYOUTS[knob as usize % 3];
                let single = (knob / 3) % 2 == 1;
                readers::tar_document(member, layout, single, CAPS[(knob as usize / 6) % 2])
            }
            Target::Video => {
                let Some((&knob, clip)) = data.split_first() else {
                    return false;
                };
                checks::video(clip, knob as u64)
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
            Target::Parquet => {
                use readers::ParquetLayout::{Lists, Samples, Text};
                let layout = |l| PARQUET_LAYOUTS.iter().position(|&x| x == l).unwrap() as u8;
                let mut out = vec![
                    prefixed(&[layout(Samples)], &reader_seeds::parquet_image_text()),
                    prefixed(&[layout(Samples)], &reader_seeds::parquet_image_struct()),
                    prefixed(&[layout(Lists)], &reader_seeds::parquet_lists()),
                ];
                let texts = reader_seeds::parquet_texts();
                out.push(prefixed(&[layout(Samples)], &texts[0]));
                out.extend(texts.iter().map(|t| prefixed(&[layout(Text)], t)));
                out
            }
            Target::Jsonl => {
                let [plain, gz, zst] = reader_seeds::jsonl_files();
                let name = |n| readers::JSONL_NAMES.iter().position(|&x| x == n).unwrap() as u8;
                vec![
                    prefixed(&[name("jsonl")], &plain),
                    prefixed(&[name("jsonl.gz")], &gz),
                    prefixed(&[name("jsonl.zst")], &zst),
                    prefixed(&[name("ndjson")], &gz),
                    prefixed(&[name("ndjson")], &zst),
                ]
            }
            Target::Documents => {
                use readers::TarLayout::{Captions, Conversations, Lists};
                let knob = |l, single: bool| {
                    TAR_LAYOUTS.iter().position(|&x| x == l).unwrap() as u8 + 3 * single as u8
                };
                vec![
                    prefixed(&[knob(Lists, false)], &reader_seeds::mint_json()),
                    prefixed(&[knob(Conversations, false)], &reader_seeds::llava_json()),
                    prefixed(
                        &[knob(Conversations, true)],
                        &reader_seeds::llava_single_json(),
                    ),
                    prefixed(&[knob(Captions, true)], &reader_seeds::caption_txt()),
                ]
            }
            // Under the generous caps (knob 0), where every seed decodes; mutating the knob
            // reaches the tight ones.
            Target::Video => seeds::video_clips()
                .iter()
                .map(|c| prefixed(&[0], c))
                .collect(),
        }
    }
}

/// The readers' targets' document caps, the knob picks one: the seeds read under the first; the
/// second makes most of their values too large.
const CAPS: [u64; 2] = [1 << 16, 300];

const PARQUET_LAYOUTS: [readers::ParquetLayout; 3] = [
    readers::ParquetLayout::Samples,
    readers::ParquetLayout::Text,
    readers::ParquetLayout::Lists,
];

const TAR_LAYOUTS: [readers::TarLayout; 3] = [
    readers::TarLayout::Lists,
    readers::TarLayout::Conversations,
    readers::TarLayout::Captions,
];

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

    /// The inputs the libFuzzer targets found a bug with, kept in `regressions/` as found
    /// (`<target>-<what>`): each now ends in an error, not a crash.
    #[test]
    fn fuzz_findings_end_in_an_error() {
        let found: [(Target, &[u8]); 5] = [
            (
                Target::Parquet,
                include_bytes!("regressions/parquet-negative-chunk-offset"),
            ),
            (
                Target::Parquet,
                include_bytes!("regressions/parquet-short-dictionary-page"),
            ),
            (
                Target::Parquet,
                include_bytes!("regressions/parquet-delta-length-overflow"),
            ),
            (
                Target::Parquet,
                include_bytes!("regressions/parquet-chunk-past-the-end"),
            ),
            // A page header whose thrift list claims 2^31 elements: slow to skip, bounded.
            (
                Target::Parquet,
                include_bytes!("regressions/parquet-page-header-long-list"),
            ),
        ];
        for (target, input) in found {
            assert!(!target.run(input), "{target:?}");
        }
    }
}
