//! A Parquet unit's documents, under each layout, read a row group at a time and a row group a
//! piece of rows at a time (`read::parquet::rows`: 1,024 rows, fewer once 16 MiB of the first
//! column's values are in the piece), so what a reader holds never follows a row group's size.
//!
//! - Lists (OBELICS, OmniCorpus): aligned list columns `texts` and `images` (see `documents`).
//! - Conversations: the `field` column, a `list<struct<from: string, value: string>>` (the LLaVA
//!   JSON's turns, as LLaVA-OneVision-Data stores them), or a `list<struct<user: string,
//!   assistant: string>>` (the Cauldron's `texts`: each item a user turn, then an assistant
//!   turn), beside an `images` column (a list of binary or `datasets` Image structs) or an
//!   `image` column (one, null for none), and a `videos` or `video` column likewise (LLaVA-Video's;
//!   binary or `datasets` Video structs). A Cauldron conversation has no placeholders: its
//!   images go at the start of its first user turn, as Idefics2's processor puts them. The row
//!   is read into the same `Conversation` a tar sample is, and rendered by the same code.
//! - Captions (img2dataset, LAION): the first of the `image_keys` columns the file has (binary
//!   or an Image struct) and the `caption_key` column, read as the members of a tar sample are.
//!
//! A document whose values pass `max_document_bytes` as they are read is skipped
//! (`member_too_large`) holding at most that many bytes of it a column.

use std::collections::VecDeque;

use super::captions::caption_document;
use super::conversation::{render, ChatFormat, Conversation, Turn};
use super::document_spec::{aligned, check_caps, DocumentSpec, Layout};
use super::parts::{Document, DocumentResult};
use crate::batch::kit::sample::Rejection;
use crate::error::{Reason, SourceKind};
use crate::read::group::{RawSample, ShardFault};
use crate::read::parquet::lists::{List, ListPiece};
use crate::read::parquet::rows::{ColumnPiece, GroupPieces, Wanted};
use crate::read::parquet::values::Piece;
use crate::read::parquet::{ParquetFile, PIECE_BYTES, PIECE_ROWS};

/// A Parquet unit's row groups, read one at a time, each a piece at a time.
pub(super) struct ParquetRows {
    file: ParquetFile,
    /// The next row group, its first row, and the row the unit ends at (None: the file's end).
    group: usize,
    first_row: u64,
    end_row: Option<u64>,
    /// The row group being read (`group - 1`), and its shape's columns.
    current: Option<GroupPieces>,
    shape: Option<Shape>,
    ready: VecDeque<DocumentResult>,
    /// The file's name, for keys of rows without a key column.
    stem: String,
    /// A fault ended the unit.
    done: bool,
}

/// Which of a piece's columns are what, by the layout (the order of [`Shape::wanted`]).
enum Shape {
    /// Images, texts, then the images' paths when they are structs.
    Lists { paths: bool },
    /// The turns' two fields, then the images when there are any (a list, or one), then the
    /// videos likewise.
    Conversations {
        cauldron: bool,
        images: Option<bool>,
        videos: Option<bool>,
    },
    /// The image columns the file has, then the caption column.
    Captions { names: Vec<String> },
}

impl ParquetRows {
    /// The rows of `file` from `first_row` (a row group's first row) on, `rows` of them (None:
    /// to the file's end); Err when no row group starts there.
    pub(super) fn new(
        file: ParquetFile,
        first_row: u64,
        rows: Option<u64>,
        url: &str,
    ) -> Result<Self, String> {
        let counts = file.row_counts();
        let mut first = 0;
        let group = counts
            .iter()
            .position(|&n| {
                let here = first == first_row;
                first += n;
                here
            })
            .unwrap_or(counts.len());
        if group == counts.len() && first_row > 0 {
            return Err(format!(
                "no row group starts at row {first_row} (the file changed?)"
            ));
        }
        Ok(Self {
            file,
            group,
            first_row,
            end_row: rows.map(|r| first_row + r),
            current: None,
            shape: None,
            ready: VecDeque::new(),
            stem: file_stem(url),
            done: false,
        })
    }

    /// The next document, or the fault that ends the unit.
    pub(super) fn next_document(
        &mut self,
        spec: &DocumentSpec,
    ) -> Option<Result<DocumentResult, ShardFault>> {
        loop {
            if let Some(doc) = self.ready.pop_front() {
                return Some(Ok(doc));
            }
            if self.done {
                return None;
            }
            if let Err(f) = self.read_piece(spec)? {
                self.done = true;
                return Some(Err(f));
            }
        }
    }

    /// Reads the next piece into `ready`; None once the unit is read.
    fn read_piece(&mut self, spec: &DocumentSpec) -> Option<Result<(), ShardFault>> {
        let other = |reason: Reason, detail: String| ShardFault {
            reason,
            kind: SourceKind::Other,
            detail,
            offset: 0,
        };
        if self.current.is_none() {
            let counts = self.file.row_counts();
            let ended = self.end_row.is_some_and(|end| self.first_row >= end);
            if self.group >= counts.len() || ended {
                return None;
            }
            let wanted = match self.wanted(spec) {
                Ok(w) => w,
                Err(detail) => return Some(Err(other(Reason::MissingColumn, detail))),
            };
            let group = self.file.group_pieces(
                self.group,
                &wanted,
                spec.max_document_bytes,
                self.first_row,
            );
            match group {
                Ok(g) => self.current = Some(g),
                Err(f) => return Some(Err(f)),
            }
            self.first_row += counts[self.group];
            self.group += 1;
        }
        let group = self.current.as_mut().expect("a row group open");
        match group.next_piece(&self.file, PIECE_ROWS, PIECE_BYTES) {
            Err(f) => Some(Err(f)),
            Ok(None) => {
                self.current = None;
                Some(Ok(()))
            }
            Ok(Some((first, _, pieces))) => {
                self.documents(first, pieces, spec);
                Some(Ok(()))
            }
        }
    }

    /// The columns the layout reads from this file (the key column last), resolving its shape
    /// the first time: Err names what the file lacks.
    fn wanted(&mut self, spec: &DocumentSpec) -> Result<Vec<Wanted>, String> {
        let list = |name: &str, leaf| Wanted {
            name: name.to_string(),
            leaf,
            list: true,
        };
        let flat = |name: &str, leaf| Wanted {
            name: name.to_string(),
            leaf,
            list: false,
        };
        let file = &self.file;
        let flat_column = |name: &str| {
            let members = file.schema.members(Some(&[name.to_string()]));
            members
                .columns
                .into_iter()
                .find(|c| c.name == name)
                .map(|c| c.leaf)
        };
        let mut wanted = Vec::new();
        let shape = match &spec.layout {
            Layout::Lists => {
                let texts = file.list_column(&spec.texts)?;
                let images = file.list_column(&spec.images)?;
                wanted.push(list(&spec.images, images.values));
                wanted.push(list(&spec.texts, texts.values));
                wanted.extend(images.paths.map(|l| list(&spec.images, l)));
                Shape::Lists {
                    paths: images.paths.is_some(),
                }
            }
            Layout::Conversations(format) => {
                let (fields, cauldron) = match file.list_fields(&format.field, &["from", "value"]) {
                    Ok(f) => (f, false),
                    Err(llava) => match file.list_fields(&format.field, &["user", "assistant"]) {
                        Ok(f) => (f, true),
                        Err(_) => {
                            return Err(format!(
                                "{llava} (nor of structs with strings \"user\" and \"assistant\", \
                                 as the Cauldron's)"
                            ))
                        }
                    },
                };
                wanted.push(list(&format.field, fields[0]));
                wanted.push(list(&format.field, fields[1]));
                // `images` or `image`, then `videos` or `video` (LLaVA-Video's), each a list of
                // binary or `datasets` structs, or one.
                let mut media = |lists: &str, one: &str| -> Result<Option<bool>, String> {
                    Ok(if file.schema.column(lists).is_some() {
                        let column = file.list_column(lists)?;
                        wanted.push(list(lists, column.values));
                        Some(true)
                    } else if let Some(leaf) = flat_column(one) {
                        wanted.push(flat(one, leaf));
                        Some(false)
                    } else {
                        None
                    })
                };
                let images = media("images", "image")?;
                let videos = media("videos", "video")?;
                Shape::Conversations {
                    cauldron,
                    images,
                    videos,
                }
            }
            Layout::Captions(keys) => {
                let mut names = Vec::new();
                for name in &keys.image_keys {
                    if let Some(leaf) = flat_column(name) {
                        wanted.push(flat(name, leaf));
                        names.push(name.clone());
                    }
                }
                if names.is_empty() {
                    return Err(format!(
                        "no image column (looked for {:?}; its columns: {})",
                        keys.image_keys,
                        self.column_names()
                    ));
                }
                let caption = flat_column(&keys.caption_key).ok_or_else(|| {
                    format!(
                        "no caption column {:?} of strings (its columns: {})",
                        keys.caption_key,
                        self.column_names()
                    )
                })?;
                wanted.push(flat(&keys.caption_key, caption));
                names.push(keys.caption_key.clone());
                Shape::Captions { names }
            }
        };
        let key = file.schema.key().map(|k| k.name.clone());
        if let Some(leaf) = key.as_deref().and_then(flat_column) {
            wanted.push(flat(key.as_deref().unwrap_or_default(), leaf));
        }
        self.shape = Some(shape);
        Ok(wanted)
    }

    fn column_names(&self) -> String {
        let names: Vec<&str> = self
            .file
            .schema
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        names.join(", ")
    }

    /// The documents of a piece of rows from file row `first` on.
    fn documents(&mut self, first: u64, pieces: Vec<ColumnPiece>, spec: &DocumentSpec) {
        let shape = self.shape.as_ref().expect("the shape is resolved");
        let columns = match shape {
            Shape::Lists { paths } => 2 + usize::from(*paths),
            Shape::Conversations { images, videos, .. } => {
                2 + usize::from(images.is_some()) + usize::from(videos.is_some())
            }
            Shape::Captions { names } => names.len(),
        };
        let mut pieces = pieces.into_iter();
        let mut columns: Vec<Column> = pieces.by_ref().take(columns).map(Column::of).collect();
        let mut keys = pieces.next().map(Column::of);
        let n = columns.first().map_or(0, Column::len);
        for (i, row) in (0..n).zip(first..) {
            let key = keys
                .as_mut()
                .and_then(|k| k.flat(i).0)
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_else(|| format!("{}/{row}", self.stem));
            let doc = match shape {
                Shape::Lists { .. } => lists_document(&mut columns, i, spec)
                    .map_err(|(reason, detail)| (reason, format!("row {row}: {detail}"))),
                Shape::Conversations {
                    cauldron,
                    images,
                    videos,
                } => {
                    let Layout::Conversations(format) = &spec.layout else {
                        unreachable!("the shape follows the layout")
                    };
                    let media = MediaColumns {
                        cauldron: *cauldron,
                        images: *images,
                        videos: *videos,
                    };
                    conversation_parts(&mut columns, i, media, format, spec)
                }
                Shape::Captions { names } => caption_parts(&mut columns, i, names, &key, spec),
            };
            self.ready.push_back(match doc {
                Ok(parts) => Ok(Document {
                    key: key.clone(),
                    parts,
                }),
                Err(r) => Err((key, r)),
            });
        }
    }
}

/// One column of a piece, its rows taken out one at a time.
enum Column {
    Flat(Piece),
    Lists(ListPiece),
}

impl Column {
    fn of(piece: ColumnPiece) -> Self {
        match piece {
            ColumnPiece::Flat(p) => Column::Flat(p),
            ColumnPiece::Lists(p) => Column::Lists(p),
        }
    }

    fn len(&self) -> usize {
        match self {
            Column::Flat(p) => p.values.len(),
            Column::Lists(p) => p.lists.len(),
        }
    }

    /// Row `i`'s list, and its values' bytes when they passed the cap (then the list holds
    /// them up to the cap, the rest empty).
    fn list(&mut self, i: usize) -> (List, Option<u64>) {
        match self {
            Column::Lists(p) => (
                std::mem::take(&mut p.lists[i]),
                p.too_large.iter().find(|(r, _)| *r == i).map(|(_, b)| *b),
            ),
            Column::Flat(_) => unreachable!("a list column"),
        }
    }

    /// Row `i`'s value, and its length when it was over the cap (then it is empty).
    fn flat(&mut self, i: usize) -> (Option<Vec<u8>>, Option<u64>) {
        match self {
            Column::Flat(p) => (
                std::mem::take(&mut p.values[i]),
                p.too_large.iter().find(|(r, _)| *r == i).map(|(_, b)| *b),
            ),
            Column::Lists(_) => unreachable!("a flat column"),
        }
    }
}

/// The bytes of a list's values.
fn list_bytes(list: &List) -> u64 {
    list.iter()
        .flatten()
        .map(|v| v.as_ref().map_or(0, |b| b.len() as u64))
        .sum()
}

/// Row `i`'s interleaved document from the columns images, texts (and paths).
fn lists_document(
    columns: &mut [Column],
    i: usize,
    spec: &DocumentSpec,
) -> Result<Vec<super::parts::Part>, Rejection> {
    let (images, images_over) = columns[0].list(i);
    let (texts, texts_over) = columns[1].list(i);
    let paths = columns.get_mut(2).map(|c| c.list(i).0).unwrap_or(None);
    let oversized = (images_over.is_some() || texts_over.is_some()).then(|| {
        images_over.unwrap_or_else(|| list_bytes(&images))
            + texts_over.unwrap_or_else(|| list_bytes(&texts))
    });
    aligned(texts, images, paths, spec, oversized)
}

/// A conversation file's shape: the Cauldron's turns or LLaVA's, and whether its images and
/// videos are lists, one a row, or absent.
#[derive(Clone, Copy)]
struct MediaColumns {
    cauldron: bool,
    images: Option<bool>,
    videos: Option<bool>,
}

/// Row `i` of a media column (a list, or one a row), if the file has it.
fn media_of(column: Option<&mut Column>, is_list: Option<bool>, i: usize) -> (List, Option<u64>) {
    match (column, is_list) {
        (Some(c), Some(true)) => c.list(i),
        (Some(c), Some(false)) => {
            let (one, over) = c.flat(i);
            (Some(one.into_iter().map(Some).collect()), over)
        }
        _ => (None, None),
    }
}

/// Row `i`'s conversation, rendered: the turns' two fields, then the images and the videos
/// (each a list, or one).
fn conversation_parts(
    columns: &mut [Column],
    i: usize,
    media: MediaColumns,
    format: &ChatFormat,
    spec: &DocumentSpec,
) -> Result<Vec<super::parts::Part>, Rejection> {
    let MediaColumns {
        cauldron,
        images,
        videos,
    } = media;
    let (firsts, firsts_over) = columns[0].list(i);
    let (seconds, seconds_over) = columns[1].list(i);
    let mut rest = columns[2..].iter_mut();
    let images_column = images.and_then(|_| rest.next());
    let (images, images_over) = media_of(images_column, images, i);
    let videos_column = videos.and_then(|_| rest.next());
    let (videos, videos_over) = media_of(videos_column, videos, i);
    let over: Vec<u64> = [firsts_over, seconds_over, images_over, videos_over]
        .into_iter()
        .flatten()
        .collect();
    if !over.is_empty() {
        let bytes: u64 = over.iter().sum();
        return Err((
            Reason::MemberTooLarge,
            format!(
                "more than {bytes} bytes of turns, images and videos, more than max_document_bytes={}",
                spec.max_document_bytes
            ),
        ));
    }
    let (Some(firsts), Some(seconds)) = (firsts, seconds) else {
        return Err((
            Reason::BadJson,
            format!("the column {:?} is null", format.field),
        ));
    };
    let text = |v: Option<Vec<u8>>| v.and_then(|b| String::from_utf8(b).ok());
    let mut turns = Vec::with_capacity(2 * firsts.len());
    for (first, second) in firsts.into_iter().zip(seconds) {
        if cauldron {
            turns.push(Turn {
                from: Some("user".into()),
                value: text(first),
            });
            turns.push(Turn {
                from: Some("assistant".into()),
                value: text(second),
            });
        } else {
            turns.push(Turn {
                from: text(first),
                value: text(second),
            });
        }
    }
    let images = images
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, image)| image.ok_or_else(|| (Reason::MissingImage, format!("image {j} is null"))))
        .collect::<Result<Vec<_>, _>>()?;
    if cauldron && !images.is_empty() {
        // The Cauldron's turns name no image: they all lead its first user turn.
        let marked = turns
            .iter()
            .filter_map(|t| t.value.as_deref())
            .any(|v| v.contains(format.placeholder.as_str()));
        if let (false, Some(value)) = (marked, turns.first_mut().and_then(|t| t.value.as_mut())) {
            value.insert_str(0, &format.placeholder.repeat(images.len()));
        }
    }
    let videos = videos
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, video)| video.ok_or_else(|| (Reason::MissingVideo, format!("video {j} is null"))))
        .collect::<Result<Vec<_>, _>>()?;
    let parts = render(
        Conversation {
            turns,
            images,
            videos,
        },
        format,
    )?;
    check_caps(&parts, spec)?;
    Ok(parts)
}

/// Row `i`'s image-caption pair, read as a tar sample's members of the columns' names.
fn caption_parts(
    columns: &mut [Column],
    i: usize,
    names: &[String],
    key: &str,
    spec: &DocumentSpec,
) -> Result<Vec<super::parts::Part>, Rejection> {
    let Layout::Captions(keys) = &spec.layout else {
        unreachable!("the shape follows the layout")
    };
    let mut members = Vec::with_capacity(names.len());
    for (column, name) in columns.iter_mut().zip(names) {
        let (value, over) = column.flat(i);
        if let Some(len) = over {
            return Err((
                Reason::MemberTooLarge,
                format!("{name}: {len} bytes > {}", spec.max_document_bytes),
            ));
        }
        members.extend(value.map(|v| (name.clone(), v)));
    }
    let raw = RawSample {
        key: key.to_string(),
        members,
        offset: 0,
        ordinal: 0,
        defect: None,
    };
    let doc = caption_document(raw, keys).map_err(|(_, r)| r)?;
    check_caps(&doc.parts, spec)?;
    Ok(doc.parts)
}

/// The file name without its folder and `.parquet`.
fn file_stem(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".parquet").unwrap_or(name).to_string()
}
