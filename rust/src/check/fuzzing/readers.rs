//! The document readers' checks (issue 52): a Parquet file under each layout the kinds read it
//! in, a JSONL file plain / gzip / zstd, and a WebDataset sample's JSON member under each tar
//! layout of the interleaved kind. The readers open URLs, so each input is written to a scratch
//! file of its own name (a footer cache keyed by name, size and modification time never serves
//! one input's footer for another) and read through the same public entry points the loader
//! uses. Every check asserts what the caps promise: nothing handed out is over
//! `max_document_bytes` (or `max_member_bytes`), a skip or a fault has a reason and a detail,
//! and the number of items is bounded (the check stops after [`MAX_ITEMS`], which a hostile
//! footer's row count or a bomb of blank lines can pass without any bug: that many items is
//! no finding, a hang or an allocation on the way is).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::batch::interleaved::{CaptionKeys, ChatFormat, DocumentSpec, Layout, Part};
use crate::batch::kit::sample::CaptionSource;
use crate::batch::kit::unit::Unit;
use crate::batch::text::TextSpec;
use crate::error::Fault;
use crate::read::parquet::ParquetFile;
use crate::read::source::{Expected, SourceOptions, SourceStats};

/// Items read of one input at most (see the module's doc).
pub const MAX_ITEMS: usize = 1 << 16;

/// An input written to a file named `NAME.ext` in a scratch folder of this process, removed
/// when dropped.
pub struct ScratchFile {
    pub path: PathBuf,
}

impl ScratchFile {
    pub fn new(ext: &str, bytes: &[u8]) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!("shardstream-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("input-{n}.{ext}"));
        std::fs::write(&path, bytes).expect("a scratch file");
        Self { path }
    }

    pub fn url(&self) -> String {
        self.path.to_str().expect("a UTF-8 temp path").to_string()
    }

    fn unit(&self) -> Unit {
        Unit {
            url: self.url(),
            first_row: 0,
            rows: None,
            identity: None,
        }
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn source() -> (SourceOptions, Arc<SourceStats>) {
    (SourceOptions::default(), Arc::new(SourceStats::default()))
}

/// A fault or a skip names its reason's cause.
fn check_fault(f: &Fault) {
    assert!(!f.detail.is_empty(), "a {:?} without a detail", f.reason);
}

/// How a Parquet file is read: the three ways the kinds read one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParquetLayout {
    /// Image-text samples (`ParquetFile::samples`, every column that can be a member).
    Samples,
    /// The packed text kind's documents in the `text` column.
    Text,
    /// The interleaved kind's documents in the `texts` and `images` list columns.
    Lists,
}

/// Reads a Parquet file under `layout` with `cap` as its member / document limit; true when it
/// read to its end with no fault (skips of single rows are fine).
pub fn parquet(bytes: &[u8], layout: ParquetLayout, cap: u64) -> bool {
    let file = ScratchFile::new("parquet", bytes);
    match layout {
        ParquetLayout::Samples => parquet_samples(&file, cap),
        ParquetLayout::Text => text_documents(&file, "text", cap),
        ParquetLayout::Lists => interleaved(&file, Layout::Lists, cap),
    }
}

fn parquet_samples(file: &ScratchFile, cap: u64) -> bool {
    let (opts, stats) = source();
    let Ok(opened) = ParquetFile::open(&file.url(), &Expected::default(), &opts, &stats) else {
        return false;
    };
    let rows = opened.num_rows();
    let mut last = None;
    for item in opened
        .samples(0, None)
        .with_max_member_bytes(cap)
        .take(MAX_ITEMS)
    {
        let sample = match item {
            Ok(s) => s,
            Err(f) => {
                assert!(
                    !f.detail.is_empty(),
                    "a {:?} fault without a detail",
                    f.reason
                );
                return false;
            }
        };
        assert!(
            last.is_none_or(|l| sample.ordinal > l) && sample.ordinal < rows,
            "row {} after {last:?} of {rows}",
            sample.ordinal
        );
        last = Some(sample.ordinal);
        for (name, value) in &sample.members {
            assert!(
                value.len() as u64 <= cap,
                "member {name:?} of {} bytes over the cap {cap}",
                value.len()
            );
        }
        if let Some((reason, detail)) = &sample.defect {
            assert!(!detail.is_empty(), "a {reason:?} defect without a detail");
        }
    }
    true
}

/// The packed text kind's documents of `file` (a Parquet or JSONL unit: its name says which)
/// from `field`; true when it read to its end with no fault.
fn text_documents(file: &ScratchFile, field: &str, cap: u64) -> bool {
    use crate::batch::text::documents::UnitDocuments;
    let (opts, stats) = source();
    let spec = TextSpec {
        source: CaptionSource::Member(field.into()),
        max_document_bytes: cap,
    };
    let mut docs = match UnitDocuments::open(&file.unit(), &spec, &opts, &stats) {
        Ok(d) => d,
        Err(f) => {
            check_fault(&f);
            return false;
        }
    };
    for _ in 0..MAX_ITEMS {
        match docs.next_document() {
            None => return true,
            Some(Err(f)) => {
                check_fault(&f);
                return false;
            }
            Some(Ok(Ok(text))) => assert!(
                text.len() as u64 <= cap,
                "a document of {} bytes over the cap {cap}",
                text.len()
            ),
            Some(Ok(Err(skip))) => {
                check_fault(&skip);
                assert!(
                    !skip.key.is_empty(),
                    "a {:?} skip without a key",
                    skip.reason
                );
            }
        }
    }
    false
}

/// The interleaved kind's documents of `file` under `layout`; true when it read to its end with
/// no fault.
fn interleaved(file: &ScratchFile, layout: Layout, cap: u64) -> bool {
    use crate::batch::interleaved::UnitDocuments;
    let (opts, stats) = source();
    let spec = DocumentSpec {
        texts: "texts".into(),
        images: "images".into(),
        max_images: MAX_IMAGES,
        max_document_bytes: cap,
        layout,
    };
    let mut docs = match UnitDocuments::open(&file.unit(), &spec, &opts, &stats) {
        Ok(d) => d,
        Err(f) => {
            check_fault(&f);
            return false;
        }
    };
    for _ in 0..MAX_ITEMS {
        match docs.next_document() {
            None => return true,
            Some(Err(f)) => {
                check_fault(&f);
                return false;
            }
            Some(Ok(Ok(doc))) => {
                let images = doc
                    .parts
                    .iter()
                    .filter(|p| matches!(p, Part::Image(_)))
                    .count();
                assert!(
                    doc.bytes() as u64 <= cap && images <= MAX_IMAGES as usize,
                    "a document of {} bytes and {images} images over the caps",
                    doc.bytes()
                );
                assert!(!doc.parts.is_empty(), "an empty document {:?}", doc.key);
            }
            Some(Ok(Err((key, (reason, detail))))) => {
                assert!(
                    !detail.is_empty(),
                    "a {reason:?} skip of {key:?} without a detail"
                );
            }
        }
    }
    false
}

/// Images a document may hold in the interleaved checks.
const MAX_IMAGES: u32 = 4;

/// How a JSONL input is named: its compression by name, or plain by name and sniffed by magic.
pub const JSONL_NAMES: [&str; 4] = ["jsonl", "jsonl.gz", "jsonl.zst", "ndjson"];

/// Reads a JSONL file named with `name`'s ending for its `text` field; true when it read to its
/// end with no fault.
pub fn jsonl(bytes: &[u8], name: &str, cap: u64) -> bool {
    text_documents(&ScratchFile::new(name, bytes), "text", cap)
}

/// The sample's members beside its JSON: two images named as MINT-1T and LLaVA's `images` list
/// name them (`0.jpg`, `1.png`), or one as a caption pair and LLaVA's single `image` have it.
pub fn document_members(single: bool) -> Vec<(&'static str, Vec<u8>)> {
    let images = super::seeds::images();
    if single {
        vec![("jpg", images[0].clone())]
    } else {
        vec![("0.jpg", images[0].clone()), ("1.png", images[1].clone())]
    }
}

/// The tar layouts of the interleaved kind, by the JSON member (or the caption member) they
/// parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TarLayout {
    /// `KEY.json` with `texts` and `images` lists (MINT-1T).
    Lists,
    /// `KEY.json` with a LLaVA `conversations` list, rendered as ChatML.
    Conversations,
    /// `KEY.jpg` + `KEY.txt`: the input is the caption.
    Captions,
}

/// A one-sample WebDataset shard of `member` (`KEY.json`, or `KEY.txt` for caption pairs) and
/// [`document_members`], read under `layout`; true when it was read with no fault.
pub fn tar_document(member: &[u8], layout: TarLayout, single: bool, cap: u64) -> bool {
    let ext = match layout {
        TarLayout::Captions => "txt",
        _ => "json",
    };
    let mut tar = Vec::new();
    super::seeds::tar_member(&mut tar, &format!("doc/00000.{ext}"), member, b'0');
    for (name, bytes) in document_members(single) {
        super::seeds::tar_member(&mut tar, &format!("doc/00000.{name}"), &bytes, b'0');
    }
    tar.extend_from_slice(&[0; 2 * super::seeds::BLOCK]);
    let layout = match layout {
        TarLayout::Lists => Layout::Lists,
        TarLayout::Conversations => Layout::Conversations(chatml()),
        TarLayout::Captions => Layout::Captions(CaptionKeys {
            image_keys: vec!["jpg".into(), "png".into(), "webp".into()],
            caption_key: "txt".into(),
        }),
    };
    interleaved(&ScratchFile::new("tar", &tar), layout, cap)
}

/// Qwen2-VL's ChatML, learning only the answers, as the kind's default format.
fn chatml() -> ChatFormat {
    ChatFormat {
        field: "conversations".into(),
        placeholder: "<image>".into(),
        video_placeholder: "<video>".into(),
        system: Some("You are a helpful assistant.".into()),
        turn_start: "<|im_start|>{role}\n".into(),
        turn_end: "<|im_end|>".into(),
        turn_separator: "\n".into(),
        roles: vec![
            ("human".into(), "user".into()),
            ("gpt".into(), "assistant".into()),
            ("system".into(), "system".into()),
        ],
        assistant_only: true,
    }
}
