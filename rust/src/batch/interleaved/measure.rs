//! A document measured for packing: its text segments tokenized, its images' grids read from
//! their headers (nothing decoded), each part's run of tokens known. The count pass and the
//! loader measure the same bytes with the same rules, so both pack the same batches.

use super::documents::{Document, Part};
use super::spec::{Grid, QwenVlSpec};
use crate::batch::sample::Rejection;
use crate::error::Reason;
use crate::image::decode::Decoder;
use crate::tokenize::DocumentEncoder;

/// One part of a measured document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Text(Vec<u32>),
    /// An image: its bytes (empty in the count pass, which never decodes), grid and tokens.
    Image {
        bytes: Vec<u8>,
        grid: Grid,
        tokens: usize,
    },
}

impl Item {
    pub fn tokens(&self) -> usize {
        match self {
            Item::Text(ids) => ids.len(),
            Item::Image { tokens, .. } => *tokens,
        }
    }

    pub fn patches(&self) -> u64 {
        match self {
            Item::Text(_) => 0,
            Item::Image { grid, .. } => grid.patches(),
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
    pub vision: &'a QwenVlSpec,
    /// An image of more pixels (by its header) is refused before it is decoded.
    pub max_pixels: u64,
    pub seq_len: usize,
    /// Keep the images' bytes (the loader); the count pass drops them.
    pub keep_bytes: bool,
}

impl Measure<'_> {
    /// `doc` measured: its segments tokenized, EOS after the last part; Err when an image's
    /// header does not parse, is a pixel bomb, has no grid, or its tokens exceed a row.
    pub fn measure(&self, doc: Document, decoder: &mut Decoder) -> Result<Measured, Rejection> {
        let mut items = Vec::with_capacity(doc.parts.len() + 1);
        // Adjacent text parts are one piece, as the processor tokenizes the joined string.
        let mut text = String::new();
        let flush = |text: &mut String, items: &mut Vec<Item>| -> Result<(), Rejection> {
            if text.is_empty() {
                return Ok(());
            }
            let mut ids = Vec::with_capacity(text.len() / 3 + 1);
            self.encoder
                .encode_into(text, &mut ids)
                .map_err(|e| (Reason::Internal, format!("the tokenizer failed: {e}")))?;
            text.clear();
            if !ids.is_empty() {
                items.push(Item::Text(ids));
            }
            Ok(())
        };
        for (i, part) in doc.parts.into_iter().enumerate() {
            match part {
                Part::Text(t) => text.push_str(&t),
                Part::Image(bytes) => {
                    flush(&mut text, &mut items)?;
                    let probe = decoder
                        .probe(&bytes)
                        .map_err(|e| (e.reason, format!("image {i}: {}", e.detail)))?;
                    if probe.width as u64 * probe.height as u64 > self.max_pixels {
                        return Err((
                            Reason::TooManyPixels,
                            format!(
                                "image {i}: {}x{} exceeds max_pixels={}",
                                probe.width, probe.height, self.max_pixels
                            ),
                        ));
                    }
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
            }
        }
        flush(&mut text, &mut items)?;
        match items.last_mut() {
            Some(Item::Text(ids)) => ids.push(self.encoder.eos),
            _ => items.push(Item::Text(vec![self.encoder.eos])),
        }
        Ok(Measured {
            key: doc.key,
            tokens: items.iter().map(Item::tokens).sum(),
            patches: items.iter().map(Item::patches).sum(),
            items,
        })
    }
}
