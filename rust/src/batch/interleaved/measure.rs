//! A document measured for packing: its text segments tokenized, its images' grids read from
//! their headers and its videos' from their containers (nothing decoded), each part's run of
//! tokens known. The count pass and the
//! loader measure the same bytes with the same rules, so both pack the same batches.

use super::parts::{Document, Part};
use super::qwen_vl::Grid;
use super::videos::VideoMeasure;
use super::vision::VisionSpec;
use crate::batch::kit::sample::{probe_capped, Rejection};
use crate::error::Reason;
use crate::image::decode::Decoder;
use crate::tokenize::DocumentEncoder;

/// One part of a measured document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// Text the model learns: its tokens are labels.
    Text(Vec<u32>),
    /// Text the model is given, not taught (a conversation's prompts): labels masked.
    Context(Vec<u32>),
    /// An image: its bytes (empty in the count pass, which never decodes), grid and tokens.
    Image {
        bytes: Vec<u8>,
        grid: Grid,
        tokens: usize,
    },
    /// A video (`videos`): its bytes (empty in the count pass), grid, tokens, the frame
    /// numbers sampled (`grid.t * temporal_patch_size` of them) and each temporal patch's
    /// M-RoPE temporal position.
    Video {
        bytes: Vec<u8>,
        grid: Grid,
        tokens: usize,
        indices: Vec<u32>,
        t_positions: Vec<u32>,
    },
}

impl Item {
    pub fn tokens(&self) -> usize {
        match self {
            Item::Text(ids) | Item::Context(ids) => ids.len(),
            Item::Image { tokens, .. } | Item::Video { tokens, .. } => *tokens,
        }
    }

    pub fn patches(&self) -> u64 {
        match self {
            Item::Text(_) | Item::Context(_) => 0,
            Item::Image { grid, .. } | Item::Video { grid, .. } => grid.patches(),
        }
    }
}

/// A document ready to pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measured {
    pub key: String,
    pub items: Vec<Item>,
    /// Tokens of all its items (its EOS included).
    pub tokens: usize,
    pub patches: u64,
}

/// How documents are measured.
pub struct Measure<'a> {
    pub encoder: &'a DocumentEncoder,
    pub vision: &'a VisionSpec,
    /// An image of more pixels (by its header) is refused before it is decoded.
    pub max_pixels: u64,
    pub seq_len: usize,
    /// Patches a batch holds: a video's must fit.
    pub max_patches: u64,
    /// Keep the images' bytes (the loader); the count pass drops them.
    pub keep_bytes: bool,
}

impl Measure<'_> {
    /// `doc` measured: its segments tokenized, EOS after the last part; Err when an image's
    /// header does not parse, is a pixel bomb, has no grid, or its tokens exceed a row.
    pub fn measure(&self, doc: Document, decoder: &mut Decoder) -> Result<Measured, Rejection> {
        let mut items = Vec::with_capacity(doc.parts.len() + 1);
        // Adjacent text parts are one piece, as the processor tokenizes the joined string.
        let mut text = Joined::default();
        // Whether the document's last text part is learned: its EOS is learned as that part is.
        let mut eos_learned = true;
        for (i, part) in doc.parts.into_iter().enumerate() {
            match part {
                Part::Text(t) => {
                    eos_learned = true;
                    text.push(&t, true)
                }
                Part::Prompt(t) => {
                    eos_learned = false;
                    text.push(&t, false)
                }
                Part::Image(bytes) => {
                    self.flush(&mut text, &mut items)?;
                    let probe = probe_capped(decoder, &bytes, self.max_pixels)
                        .map_err(|(r, d)| (r, format!("image {i}: {d}")))?;
                    let (width, height) = probe.oriented_size();
                    let grid = self
                        .vision
                        .grid(height, width)
                        .map_err(|(r, d)| (r, format!("image {i}: {d}")))?;
                    let tokens = self.vision.tokens(grid);
                    if tokens > self.seq_len {
                        return Err((
                            Reason::ImageOverRow,
                            format!(
                                "image {i}: {width}x{height} takes {tokens} tokens, more than seq_len={}",
                                self.seq_len
                            ),
                        ));
                    }
                    let bytes = if self.keep_bytes { bytes } else { Vec::new() };
                    items.push(Item::Image {
                        bytes,
                        grid,
                        tokens,
                    });
                }
                Part::Video(bytes) => {
                    self.flush(&mut text, &mut items)?;
                    let VisionSpec::Qwen(qwen) = self.vision else {
                        return Err((
                            Reason::MisalignedDocument,
                            format!("video {i}: the NaFlex vision spec reads no video"),
                        ));
                    };
                    let videos = VideoMeasure {
                        qwen,
                        max_pixels: self.max_pixels,
                        seq_len: self.seq_len,
                        max_patches: self.max_patches,
                    };
                    let run = videos.run(i, &bytes)?;
                    items.push(Item::Video {
                        bytes: if self.keep_bytes { bytes } else { Vec::new() },
                        grid: run.grid,
                        tokens: run.tokens,
                        indices: run.indices,
                        t_positions: run.t_positions,
                    });
                }
            }
        }
        self.flush(&mut text, &mut items)?;
        // The EOS is learned as the last text part is (after a conversation's closing
        // separator: not), whatever tokens that part gave.
        let eos = self.encoder.eos;
        match (items.last_mut(), eos_learned) {
            (Some(Item::Text(ids)), true) | (Some(Item::Context(ids)), false) => ids.push(eos),
            (_, true) => items.push(Item::Text(vec![eos])),
            (_, false) => items.push(Item::Context(vec![eos])),
        }
        Ok(Measured {
            key: doc.key,
            tokens: items.iter().map(Item::tokens).sum(),
            patches: items.iter().map(Item::patches).sum(),
            items,
        })
    }

    /// The joined text's tokens as items: one `Text` item when all of it is learned (one
    /// `Context` item when none is), else runs of `Text` and `Context` as each token overlaps
    /// learned text or not (the rule of transformers' `return_assistant_tokens_mask`: a token
    /// overlapping a learned span is learned; an empty span never is).
    fn flush(&self, text: &mut Joined, items: &mut Vec<Item>) -> Result<(), Rejection> {
        if text.text.is_empty() {
            return Ok(());
        }
        let failed = |e: String| (Reason::Internal, format!("the tokenizer failed: {e}"));
        let all = text.learned.len() == 1 && text.learned[0] == (0, text.text.len());
        if all || text.learned.is_empty() {
            let mut ids = Vec::with_capacity(text.text.len() / 3 + 1);
            self.encoder
                .encode_into(&text.text, &mut ids)
                .map_err(failed)?;
            if !ids.is_empty() {
                items.push(if all {
                    Item::Text(ids)
                } else {
                    Item::Context(ids)
                });
            }
        } else {
            let (ids, spans) = self.encoder.encode_with_spans(&text.text).map_err(failed)?;
            let learned =
                |&(s, e): &(usize, usize)| text.learned.iter().any(|&(a, b)| s < b && e > a);
            let mut at = 0;
            while at < ids.len() {
                let kind = learned(&spans[at]);
                let run = spans[at..]
                    .iter()
                    .take_while(|s| learned(s) == kind)
                    .count();
                let run_ids = ids[at..at + run].to_vec();
                items.push(if kind {
                    Item::Text(run_ids)
                } else {
                    Item::Context(run_ids)
                });
                at += run;
            }
        }
        text.text.clear();
        text.learned.clear();
        Ok(())
    }
}

/// Text parts joined since the last image, and the byte spans of those the model learns.
#[derive(Default)]
struct Joined {
    text: String,
    /// Learned spans, adjacent ones merged.
    learned: Vec<(usize, usize)>,
}

impl Joined {
    fn push(&mut self, text: &str, learned: bool) {
        let start = self.text.len();
        self.text.push_str(text);
        let end = self.text.len();
        if !learned || start == end {
            return;
        }
        match self.learned.last_mut() {
            Some((_, last_end)) if *last_end == start => *last_end = end,
            _ => self.learned.push((start, end)),
        }
    }
}
