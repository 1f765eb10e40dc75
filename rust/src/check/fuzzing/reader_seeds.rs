//! Real, valid inputs for the document readers' fuzz targets (`parquet`, `jsonl`, `documents`):
//! Parquet files in each layout the readers take (img2dataset's and `datasets`' image-text
//! columns, a text column, OBELICS list columns) under each codec, JSONL plain / gzip / zstd, and
//! a WebDataset sample's JSON member as MINT-1T and LLaVA write it. The text is the real web
//! captions of img2dataset's test file in the shared data (`SHARDSTREAM_TEST_DATA`, else
//! `/work/shared/data`), the images those of [`super::seeds::images`].

use std::sync::{Arc, OnceLock};

use parquet::basic::{Compression, Encoding, GzipLevel, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::seeds::{gzip, images};

/// The first `n` non-empty captions of img2dataset's test file (1,000 real web alt-texts), read
/// with the parquet crate's own row API.
pub fn real_captions(n: usize) -> Vec<String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let data =
        std::env::var("SHARDSTREAM_TEST_DATA").unwrap_or_else(|_| "/work/shared/data".into());
    let path = format!("{data}/img2dataset-test_1000.parquet");
    let reader = SerializedFileReader::new(std::fs::File::open(&path).expect(&path)).unwrap();
    let mut out = Vec::with_capacity(n);
    for row in reader.get_row_iter(None).unwrap() {
        for (name, field) in row.unwrap().get_column_iter() {
            if let (true, parquet::record::Field::Str(s)) = (name == "TEXT", field) {
                if !s.is_empty() && out.len() < n {
                    out.push(s.clone());
                }
            }
        }
    }
    assert_eq!(out.len(), n, "{path} holds {n} captions");
    out
}

/// The captions the seeds are made of (40 of them: a few KB).
fn captions() -> &'static Vec<String> {
    static CAPTIONS: OnceLock<Vec<String>> = OnceLock::new();
    CAPTIONS.get_or_init(|| real_captions(40))
}

/// One column's values in a row group: (values, definition levels, repetition levels).
type Column = (Vec<ByteArray>, Option<Vec<i16>>, Option<Vec<i16>>);

/// A Parquet file of `schema` whose byte-array columns hold `groups` (one entry a row group, one
/// [`Column`] a byte-array leaf); an `int64` leaf first in the schema takes `int_keys`.
fn parquet_file(
    schema: &str,
    props: WriterProperties,
    int_keys: Option<&[i64]>,
    groups: Vec<Vec<Column>>,
) -> Vec<u8> {
    let schema = Arc::new(parse_message_type(schema).unwrap());
    let mut out = Vec::new();
    let mut writer = SerializedFileWriter::new(&mut out, schema, Arc::new(props)).unwrap();
    for group in groups {
        let mut g = writer.next_row_group().unwrap();
        if let Some(keys) = int_keys {
            let mut c = g.next_column().unwrap().unwrap();
            c.typed::<Int64Type>()
                .write_batch(keys, None, None)
                .unwrap();
            c.close().unwrap();
        }
        for (values, defs, reps) in group {
            let mut c = g.next_column().unwrap().unwrap();
            c.typed::<ByteArrayType>()
                .write_batch(&values, defs.as_deref(), reps.as_deref())
                .unwrap();
            c.close().unwrap();
        }
        g.close().unwrap();
    }
    writer.close().unwrap();
    out
}

fn bytes(b: &[u8]) -> ByteArray {
    ByteArray::from(b.to_vec())
}

fn props(codec: Compression, version: WriterVersion, dictionary: bool) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(codec)
        .set_writer_version(version)
        .set_dictionary_enabled(dictionary)
        .build()
}

/// img2dataset's layout (`key`, `caption`, binary `jpg`), two row groups of 3 rows, snappy.
pub fn parquet_image_text() -> Vec<u8> {
    let caps = captions();
    let groups = (0..2)
        .map(|g| {
            let rows = g * 3..g * 3 + 3;
            vec![
                (
                    rows.clone()
                        .map(|r| bytes(format!("{r:05}").as_bytes()))
                        .collect(),
                    None,
                    None,
                ),
                (
                    rows.clone().map(|r| bytes(caps[r].as_bytes())).collect(),
                    None,
                    None,
                ),
                (rows.map(|r| bytes(&images()[r % 3])).collect(), None, None),
            ]
        })
        .collect();
    parquet_file(
        "message s { required binary key (UTF8); required binary caption (UTF8); \
         required binary jpg; }",
        props(Compression::SNAPPY, WriterVersion::PARQUET_1_0, true),
        None,
        groups,
    )
}

/// `datasets`' `Image` feature (a struct of `bytes` and `path`) beside an integer key and an
/// optional caption, zstd, page version 2: row 1's image path and caption are null.
pub fn parquet_image_struct() -> Vec<u8> {
    let caps = captions();
    let imgs = images();
    let group = vec![
        (
            [0, 1, 2].map(|i| bytes(&imgs[i])).to_vec(),
            Some(vec![2, 2, 2]),
            None,
        ),
        (
            vec![bytes(b"photos/a.jpg"), bytes(b"photos/c.png")],
            Some(vec![2, 1, 2]),
            None,
        ),
        (
            vec![bytes(caps[6].as_bytes()), bytes(caps[7].as_bytes())],
            Some(vec![1, 0, 1]),
            None,
        ),
    ];
    parquet_file(
        "message schema { required int64 key; \
         optional group image { optional binary bytes; optional binary path (UTF8); } \
         optional binary caption (UTF8); }",
        props(
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_2_0,
            false,
        ),
        Some(&[7, 8, 9]),
        vec![group],
    )
}

/// A FineWeb-style `text` string column of real captions (every fifth row null), in row groups of
/// 6, under `codec`; plain-encoded where the dictionary is off.
pub fn parquet_text(codec: Compression, version: WriterVersion, dictionary: bool) -> Vec<u8> {
    let caps = &captions()[..18];
    let groups = caps
        .chunks(6)
        .map(|docs| {
            let defs: Vec<i16> = (0..docs.len()).map(|i| (i % 5 != 4) as i16).collect();
            let values = docs
                .iter()
                .zip(&defs)
                .filter(|(_, &d)| d == 1)
                .map(|(t, _)| bytes(t.as_bytes()))
                .collect();
            vec![(values, Some(defs), None)]
        })
        .collect();
    let mut p = WriterProperties::builder()
        .set_compression(codec)
        .set_writer_version(version)
        .set_dictionary_enabled(dictionary);
    if !dictionary {
        p = p.set_encoding(Encoding::PLAIN);
    }
    parquet_file(
        "message schema { optional binary text (STRING); }",
        p.build(),
        None,
        groups,
    )
}

/// The text files: each codec the reader decompresses, plain and dictionary pages, v1 and v2.
pub fn parquet_texts() -> Vec<Vec<u8>> {
    vec![
        parquet_text(Compression::UNCOMPRESSED, WriterVersion::PARQUET_1_0, false),
        parquet_text(Compression::SNAPPY, WriterVersion::PARQUET_1_0, true),
        parquet_text(
            Compression::GZIP(GzipLevel::default()),
            WriterVersion::PARQUET_2_0,
            false,
        ),
        parquet_text(
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_1_0,
            false,
        ),
        parquet_text(Compression::LZ4_RAW, WriterVersion::PARQUET_2_0, false),
        parquet_text(Compression::LZ4, WriterVersion::PARQUET_1_0, false),
    ]
}

/// One interleaved document: at each position a text or an image.
enum Item<'a> {
    Text(&'a str),
    Image(&'a [u8]),
}

/// OBELICS' layout: aligned `texts: list<string>` and `images: list<binary>` columns, three
/// documents (starting with an image, text only, image and text), zstd.
pub fn parquet_lists() -> Vec<u8> {
    let caps = captions();
    let imgs = images();
    let docs: Vec<Vec<Item>> = vec![
        vec![
            Item::Image(&imgs[0]),
            Item::Text(&caps[10]),
            Item::Image(&imgs[2]),
        ],
        vec![Item::Text(&caps[11]), Item::Text(&caps[12])],
        vec![
            Item::Text(&caps[13]),
            Item::Image(&imgs[1]),
            Item::Text(&caps[14]),
        ],
    ];
    // Levels of an optional list of optional elements: 3 an element, 2 a null one; rep 0 starts
    // a row's list.
    let mut columns: [Column; 2] = Default::default();
    for doc in &docs {
        for (i, item) in doc.iter().enumerate() {
            let (text, image) = match item {
                Item::Text(t) => (Some(t.as_bytes()), None),
                Item::Image(b) => (None, Some(*b)),
            };
            for (column, value) in columns.iter_mut().zip([text, image]) {
                column
                    .1
                    .get_or_insert_with(Vec::new)
                    .push(2 + value.is_some() as i16);
                column.2.get_or_insert_with(Vec::new).push((i > 0) as i16);
                column.0.extend(value.map(bytes));
            }
        }
    }
    parquet_file(
        "message m { \
         optional group texts (LIST) { repeated group list { optional binary element (STRING); } } \
         optional group images (LIST) { repeated group list { optional binary element; } } }",
        props(
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_1_0,
            false,
        ),
        None,
        vec![columns.into()],
    )
}

/// FineWeb's JSONL: a `text` field among metadata fields, one line a caption, the last line
/// ending without a newline.
pub fn jsonl() -> Vec<u8> {
    let mut out = String::new();
    for (i, caption) in captions()[..24].iter().enumerate() {
        let line = serde_json::json!({"id": format!("<urn:uuid:{i:08x}>"), "text": caption,
            "language": "en", "token_count": caption.split(' ').count()});
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out.pop();
    out.into_bytes()
}

/// [`jsonl`] as each reader takes it: plain, gzip, zstd.
pub fn jsonl_files() -> [Vec<u8>; 3] {
    let plain = jsonl();
    let zst = zstd::stream::encode_all(&plain[..], 3).unwrap();
    [plain.clone(), gzip(&plain), zst]
}

/// A MINT-1T sample's `KEY.json`: `texts` and `images` lists, images named as members.
pub fn mint_json() -> Vec<u8> {
    let caps = captions();
    serde_json::json!({
        "texts": [caps[20], null, caps[21], null],
        "images": [null, "0.jpg", null, "1.png"],
        "url": "https://example.com/page",
    })
    .to_string()
    .into_bytes()
}

/// A LLaVA sample's `KEY.json`: two images named in `images`, a follow-up turn.
pub fn llava_json() -> Vec<u8> {
    let caps = captions();
    serde_json::json!({
        "id": "000000033471",
        "images": ["0.jpg", "1.png"],
        "conversations": [
            {"from": "human", "value": "<image>\nDescribe the picture."},
            {"from": "gpt", "value": caps[22]},
            {"from": "human", "value": "And this one? <image>"},
            {"from": "gpt", "value": caps[23]},
        ],
    })
    .to_string()
    .into_bytes()
}

/// A LLaVA sample naming its one image by its original path (no such member: the sample's only
/// image member is taken).
pub fn llava_single_json() -> Vec<u8> {
    serde_json::json!({
        "id": "1",
        "image": "coco/train2017/000000033471.jpg",
        "conversations": [
            {"from": "human", "value": "What is shown in this image?\n<image>"},
            {"from": "gpt", "value": captions()[24]},
        ],
    })
    .to_string()
    .into_bytes()
}

/// A caption pair's caption member.
pub fn caption_txt() -> Vec<u8> {
    captions()[25].clone().into_bytes()
}
