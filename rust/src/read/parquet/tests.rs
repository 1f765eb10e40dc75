//! Files written here with the parquet crate's own writer: footers, reads from a given row, the
//! footer cache, and a damaged footer's typed fault.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::*;
use crate::fixtures::scratch_dir;

/// img2dataset's layout (key, caption, binary jpg), with row groups of these sizes; row r holds
/// key `k{r:03}`, image bytes `image {r}` and caption `caption {r}`.
fn write(path: &std::path::Path, groups: &[u64]) {
    write_sized(path, groups, 0);
}

/// [`write`], with `image_bytes` bytes of noise as each image when it is not 0 (noise, so that
/// no codec shrinks the chunk).
fn write_sized(path: &std::path::Path, groups: &[u64], image_bytes: usize) {
    let schema = parse_message_type(
        "message s { required binary key (UTF8); required binary caption (UTF8); \
         required binary jpg; }",
    )
    .unwrap();
    let props = Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
    let mut row = 0;
    for &n in groups {
        let mut group = writer.next_row_group().unwrap();
        for column in ["k", "caption ", "image "] {
            let values: Vec<ByteArray> = (row..row + n)
                .map(|r| {
                    if column == "image " && image_bytes > 0 {
                        let mut rng = crate::rng::SplitMix64::new(r);
                        let noise: Vec<u8> =
                            (0..image_bytes).map(|_| rng.next_u64() as u8).collect();
                        return ByteArray::from(noise);
                    }
                    let text = if column == "k" {
                        format!("k{r:03}")
                    } else {
                        format!("{column}{r}")
                    };
                    ByteArray::from(text.into_bytes())
                })
                .collect();
            let mut c = group.next_column().unwrap().unwrap();
            c.typed::<ByteArrayType>()
                .write_batch(&values, None, None)
                .unwrap();
            c.close().unwrap();
        }
        group.close().unwrap();
        row += n;
    }
    writer.close().unwrap();
}

fn open(path: &std::path::Path, stats: &Arc<SourceStats>) -> Result<ParquetFile, ShardFault> {
    ParquetFile::open(
        path.to_str().unwrap(),
        &Expected::default(),
        &SourceOptions::default(),
        stats,
    )
}

#[test]
fn the_footer_gives_row_groups_and_columns_and_reads_start_at_any_row() {
    let dir = scratch_dir("parquet-footer");
    let path = dir.join("part-00.parquet");
    write(&path, &[3, 4, 2]);
    let stats = Arc::new(SourceStats::default());
    let file = open(&path, &stats).unwrap();
    assert_eq!(file.row_counts(), [3, 4, 2]);
    assert_eq!(file.num_rows(), 9);
    let kinds: Vec<(&str, ColumnKind)> = file
        .schema
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("key", ColumnKind::Text),
            ("caption", ColumnKind::Text),
            ("jpg", ColumnKind::Binary)
        ]
    );
    // From row 5 (the middle of row group 1): rows 5..9, their keys from the key column.
    let wanted = ["jpg".to_string(), "caption".to_string()];
    let samples: Vec<RawSample> = file
        .samples(5, Some(&wanted))
        .collect::<Result<_, _>>()
        .unwrap();
    let got: Vec<(u64, &str)> = samples
        .iter()
        .map(|s| (s.ordinal, s.key.as_str()))
        .collect();
    assert_eq!(got, [(5, "k005"), (6, "k006"), (7, "k007"), (8, "k008")]);
    assert_eq!(samples[0].get("jpg").unwrap(), b"image 5");
    assert_eq!(samples[3].get("caption").unwrap(), b"caption 8");
    assert!(samples
        .iter()
        .all(|s| s.defect.is_none() && s.members.len() == 2));
}

#[test]
fn a_file_opened_again_is_not_asked_for_its_footer_again() {
    let dir = scratch_dir("parquet-footer-cache");
    let path = dir.join("cached.parquet");
    write(&path, &[2, 2]);
    let first = Arc::new(SourceStats::default());
    open(&path, &first).unwrap();
    assert!(
        first.bytes.load(Ordering::Relaxed) > 0,
        "the footer was read"
    );
    let again = Arc::new(SourceStats::default());
    let file = open(&path, &again).unwrap();
    assert_eq!(
        again.bytes.load(Ordering::Relaxed),
        0,
        "served from the cache"
    );
    let rows: Vec<u64> = file.samples(2, None).map(|s| s.unwrap().ordinal).collect();
    assert_eq!(rows, [2, 3]);
    // Rewritten in place (another modification time), it is read afresh.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(&path, &[4]);
    let rewritten = Arc::new(SourceStats::default());
    assert_eq!(open(&path, &rewritten).unwrap().row_counts(), [4]);
}

#[test]
fn a_damaged_footer_is_a_corrupt_parquet_fault_naming_the_file() {
    let dir = scratch_dir("parquet-bad-footer");
    let path = dir.join("bad.parquet");
    write(&path, &[3, 3]);
    let mut bytes = std::fs::read(&path).unwrap();
    // The footer's length and the closing magic stay; the footer itself is garbage.
    let n = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    for b in &mut bytes[n - 8 - footer_len..n - 8] {
        *b = 0xff;
    }
    std::fs::write(&path, &bytes).unwrap();
    let stats = Arc::new(SourceStats::default());
    let fault = open(&path, &stats).err().expect("a damaged footer");
    assert_eq!(fault.reason, Reason::CorruptParquet);
    assert!(
        fault.detail.contains("bad.parquet") && fault.detail.contains("footer"),
        "{}",
        fault.detail
    );
    // A file cut short has no footer at all: the same reason.
    std::fs::write(&path, &bytes[..n / 2]).unwrap();
    let fault = open(&path, &stats).err().expect("a truncated file");
    assert_eq!(fault.reason, Reason::CorruptParquet);
}

#[test]
fn a_column_chunk_larger_than_its_rows_can_take_is_refused_before_it_is_fetched() {
    let dir = scratch_dir("parquet-chunk-limit");
    let path = dir.join("limit.parquet");
    // Two row groups of 3 images of 100 KB: each image chunk is about 300 KB.
    write_sized(&path, &[3, 3], 100_000);
    let stats = Arc::new(SourceStats::default());
    let wanted = ["jpg".to_string()];
    let rows: Vec<_> = open(&path, &stats)
        .unwrap()
        .samples(0, Some(&wanted))
        .with_max_member_bytes(256 << 10)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 6, "chunks within the bound read as before");
    assert!(rows.iter().all(|r| r.get("jpg").unwrap().len() == 100_000));
    // A 90 KB limit lets the chunk in (3 rows could take it) but not its 100 KB members.
    let over: Vec<_> = open(&path, &stats)
        .unwrap()
        .samples(0, Some(&wanted))
        .with_max_member_bytes(90_000)
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(over
        .iter()
        .all(|r| matches!(&r.defect, Some((Reason::MemberTooLarge, d)) if d.contains("jpg: 100000 bytes"))));
    // With a 10 KB member limit, 3 rows can take about 100 KB: the 300 KB chunk is refused.
    let limited = Arc::new(SourceStats::default());
    let file = open(&path, &limited).unwrap();
    let footer_bytes = limited.bytes.load(Ordering::Relaxed);
    let mut samples = file.samples(0, Some(&wanted)).with_max_member_bytes(10_000);
    let fault = samples.next().unwrap().unwrap_err();
    assert_eq!(fault.reason, Reason::MemberTooLarge, "{}", fault.detail);
    assert!(fault.detail.contains("row group 0") && fault.detail.contains("limit.parquet"));
    // Only the small key chunk may have been read (the footer came from the cache).
    let fetched = limited.bytes.load(Ordering::Relaxed) - footer_bytes;
    assert!(
        fetched < 1_000,
        "the image chunk was fetched: {fetched} bytes"
    );
}

#[test]
fn the_chunk_bound_grows_with_rows_and_the_member_limit_and_never_overflows() {
    assert_eq!(chunk_limit(0, 600), chunk_limit(1, 600));
    assert!(chunk_limit(200, 256 << 20) > 200 * (256 << 20));
    assert!(chunk_limit(201, 1000) > chunk_limit(200, 1000));
    assert_eq!(chunk_limit(u64::MAX, u64::MAX), u64::MAX);
}

#[test]
fn a_local_file_renamed_over_after_its_footer_is_not_read_in_place_of_the_one_opened() {
    let dir = scratch_dir("parquet-renamed-over");
    let path = dir.join("part.parquet");
    // Larger than the footer's first read, so that the captions are read from the file later.
    write_sized(&path, &[2, 2], 40_000);
    assert!(std::fs::metadata(&path).unwrap().len() > 2 * FOOTER_GUESS);
    // The same size and layout, other captions: only the bytes a row group reads differ.
    let original = std::fs::read(&path).unwrap();
    let needle = b"caption ";
    let mut other = original.clone();
    for at in 0..other.len() - needle.len() {
        if &other[at..at + needle.len()] == needle {
            other[at..at + needle.len()].copy_from_slice(b"CAPTION ");
        }
    }
    assert_ne!(other, original);
    let stats = Arc::new(SourceStats::default());
    let file = open(&path, &stats).unwrap();
    let replacement = dir.join("part.parquet.new");
    std::fs::write(&replacement, &other).unwrap();
    std::fs::rename(&replacement, &path).unwrap();
    let wanted = ["caption".to_string()];
    let captions: Vec<Vec<u8>> = file
        .samples(0, Some(&wanted))
        .map(|s| s.unwrap().get("caption").unwrap().to_vec())
        .collect();
    assert_eq!(
        captions,
        ["caption 0", "caption 1", "caption 2", "caption 3"].map(|c| c.as_bytes().to_vec())
    );
}

#[test]
fn a_row_group_s_chunks_come_in_one_range_request_over_http() {
    let dir = scratch_dir("parquet-coalesced");
    let path = dir.join("part.parquet");
    write_sized(&path, &[2, 3], 40_000);
    let server =
        crate::read::source::testserver::TestServer::start(std::fs::read(&path).unwrap(), vec![]);
    let url = server.url("/part.parquet");
    let stats = Arc::new(SourceStats::default());
    let file = ParquetFile::open(
        &url,
        &Expected::default(),
        &SourceOptions::default(),
        &stats,
    )
    .unwrap();
    let before = server.requests().len();
    let wanted = ["jpg".to_string(), "caption".to_string()];
    let keys: Vec<String> = file
        .samples(0, Some(&wanted))
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(keys, ["k000", "k001", "k002", "k003", "k004"]);
    // key, caption and jpg lie side by side: one request per row group, not one per column
    assert_eq!(
        server.requests().len() - before,
        2,
        "{:?}",
        server.requests()
    );
}

#[test]
fn ranges_merge_where_they_overlap_or_lie_within_the_gap() {
    use super::chunks::coalesce;
    assert_eq!(coalesce(vec![], 10), []);
    assert_eq!(
        coalesce(vec![(50, 60), (0, 10), (15, 20)], 5),
        [(0, 20), (50, 60)]
    );
    assert_eq!(coalesce(vec![(0, 10), (5, 8), (9, 30)], 0), [(0, 30)]);
    assert_eq!(coalesce(vec![(0, 10), (11, 12)], 0), [(0, 10), (11, 12)]);
    assert_eq!(
        coalesce(vec![(0, u64::MAX), (3, 4)], u64::MAX),
        [(0, u64::MAX)]
    );
}

pub(crate) use crate::check::fuzzing::reader_seeds::real_captions;

/// A FineWeb-style text file: a `text` string column (UTF-8 by its schema) holding `docs` as
/// they are, whatever their bytes, in row groups of `rows_per_group`.
pub(crate) fn write_text(path: &std::path::Path, docs: &[Vec<u8>], rows_per_group: usize) {
    let schema = parse_message_type("message schema { optional binary text (STRING); }").unwrap();
    let props = Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
    for group_docs in docs.chunks(rows_per_group) {
        let mut group = writer.next_row_group().unwrap();
        let values: Vec<ByteArray> = group_docs
            .iter()
            .map(|d| ByteArray::from(d.clone()))
            .collect();
        let defs = vec![1; values.len()];
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        group.close().unwrap();
    }
    writer.close().unwrap();
}

/// 100 real captions in row groups of 50, the one at row 37 with an invalid byte at byte 5.
pub(crate) fn write_one_bad_document(path: &std::path::Path) -> Vec<Vec<u8>> {
    let mut docs: Vec<Vec<u8>> = real_captions(100)
        .into_iter()
        .map(String::into_bytes)
        .collect();
    docs[37].insert(5, 0xff);
    write_text(path, &docs, 50);
    docs
}

#[test]
fn one_value_of_invalid_utf8_is_its_rows_bytes_and_the_rest_of_its_row_group_reads() {
    let dir = scratch_dir("parquet-bad-utf8");
    let path = dir.join("docs.parquet");
    let docs = write_one_bad_document(&path);
    let stats = Arc::new(SourceStats::default());
    let file = open(&path, &stats).unwrap();
    assert_eq!(file.row_counts(), [50, 50]);
    assert_eq!(file.schema.columns[0].kind, ColumnKind::Text);
    let wanted = ["text".to_string()];
    let samples: Vec<RawSample> = file
        .samples(0, Some(&wanted))
        .collect::<Result<_, _>>()
        .expect("no row group fails");
    assert_eq!(samples.len(), 100);
    for (row, (sample, doc)) in samples.iter().zip(&docs).enumerate() {
        assert_eq!(sample.ordinal, row as u64);
        assert_eq!(sample.key, format!("docs/{row}"));
        assert!(sample.defect.is_none());
        assert_eq!(sample.get("text").unwrap(), &doc[..], "row {row}");
    }
}

#[test]
fn an_integer_key_an_image_struct_and_its_nulls_read_column_by_column() {
    use parquet::data_type::Int64Type;
    let dir = scratch_dir("parquet-struct");
    let path = dir.join("hf.parquet");
    // `datasets`' Image feature beside an integer key: row 0 has an image whose `path` is not
    // UTF-8 (never read: only `bytes` is), row 1 a null image struct and a null caption.
    let schema = parse_message_type(
        "message schema { required int64 key; \
         optional group image { optional binary bytes; optional binary path (UTF8); } \
         optional binary caption (UTF8); }",
    )
    .unwrap();
    let props = Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let mut c = group.next_column().unwrap().unwrap();
    c.typed::<Int64Type>()
        .write_batch(&[7, 8], None, None)
        .unwrap();
    c.close().unwrap();
    let columns: [(&[u8], [i16; 2]); 3] =
        [(b"jpeg", [2, 0]), (b"\xff.jpg", [2, 0]), (b"a cat", [1, 0])];
    for (value, defs) in columns {
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&[ByteArray::from(value.to_vec())], Some(&defs), None)
            .unwrap();
        c.close().unwrap();
    }
    group.close().unwrap();
    writer.close().unwrap();

    let stats = Arc::new(SourceStats::default());
    let file = open(&path, &stats).unwrap();
    assert_eq!(file.schema.columns[1].kind, ColumnKind::ImageStruct);
    let samples: Vec<RawSample> = file
        .samples(0, None)
        .collect::<Result<_, _>>()
        .expect("the path's bytes are never read");
    let keys: Vec<&str> = samples.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["7", "8"]);
    assert_eq!(samples[0].get("image").unwrap(), b"jpeg");
    assert_eq!(samples[0].get("caption").unwrap(), b"a cat");
    assert!(samples[0].defect.is_none());
    assert!(samples[1].members.is_empty());
    assert!(matches!(&samples[1].defect, Some((Reason::NullImage, d)) if d.contains("row 1")));
}

/// [`write_text`] with nulls (None) and the writer's properties given: its codec, dictionary
/// and page sizes.
fn write_text_with(
    path: &std::path::Path,
    docs: &[Option<Vec<u8>>],
    rows_per_group: usize,
    props: WriterProperties,
) {
    let schema = parse_message_type("message schema { optional binary text (STRING); }").unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
    for group_docs in docs.chunks(rows_per_group) {
        let mut group = writer.next_row_group().unwrap();
        let values: Vec<ByteArray> = group_docs
            .iter()
            .flatten()
            .map(|d| ByteArray::from(d.clone()))
            .collect();
        let defs: Vec<i16> = group_docs.iter().map(|d| d.is_some() as i16).collect();
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        group.close().unwrap();
    }
    writer.close().unwrap();
}

/// Real captions, every seventh row null and every eleventh a long document (`long` bytes of
/// them repeated).
fn captions_with_long_ones(n: usize, long: usize) -> Vec<Option<Vec<u8>>> {
    let captions = real_captions(n);
    let all = captions.join(" ").into_bytes();
    (0..n)
        .map(|i| match i {
            _ if i % 7 == 3 => None,
            _ if i % 11 == 5 => Some(all.iter().cycle().skip(i).take(long).copied().collect()),
            _ => Some(captions[i].clone().into_bytes()),
        })
        .collect()
}

/// Each sample as (key, ordinal, members, defect): what a read yields, to compare two reads.
type Seen = Vec<(
    String,
    u64,
    Vec<(String, Vec<u8>)>,
    Option<(Reason, String)>,
)>;

fn read_all(path: &std::path::Path, first: u64, cap: u64, piece: Option<(usize, usize)>) -> Seen {
    let stats = Arc::new(SourceStats::default());
    let wanted = ["text".to_string()];
    let samples = open(path, &stats)
        .unwrap()
        .samples(first, Some(&wanted))
        .with_max_member_bytes(cap);
    let samples = match piece {
        Some((rows, bytes)) => samples.with_piece(rows, bytes),
        None => samples,
    };
    samples
        .map(|s| {
            let s = s.expect("no fault");
            (s.key, s.ordinal, s.members, s.defect)
        })
        .collect()
}

#[test]
fn a_row_group_read_in_pieces_of_any_size_yields_the_same_samples() {
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterVersion;
    let dir = scratch_dir("parquet-pieces");
    let docs = captions_with_long_ones(300, 200_000);
    let layouts = [
        ("snappy-dict", WriterProperties::builder().build()),
        (
            "zstd-plain-v2",
            WriterProperties::builder()
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .set_dictionary_enabled(false)
                .set_writer_version(WriterVersion::PARQUET_2_0)
                .set_data_page_size_limit(64 << 10)
                .build(),
        ),
    ];
    for (name, props) in layouts {
        let path = dir.join(format!("{name}.parquet"));
        write_text_with(&path, &docs, 120, props);
        let whole = read_all(&path, 0, 1 << 30, None);
        assert_eq!(whole.len(), 300, "{name}");
        for (i, (_, ordinal, members, defect)) in whole.iter().enumerate() {
            assert_eq!(*ordinal, i as u64);
            assert!(defect.is_none());
            let got = members.first().map(|(_, v)| v.clone());
            assert_eq!(got, docs[i], "{name}: row {i}");
        }
        for piece in [(1, 1), (7, 100), (1000, 50_000)] {
            assert_eq!(
                read_all(&path, 0, 1 << 30, Some(piece)),
                whole,
                "{name} {piece:?}"
            );
            assert_eq!(
                read_all(&path, 130, 1 << 30, Some(piece)),
                whole[130..],
                "{name} {piece:?} from row 130"
            );
        }
    }
}

#[test]
fn a_page_over_its_bound_is_streamed_and_values_over_the_cap_are_skipped_by_reason() {
    use parquet::basic::{Compression, Encoding, GzipLevel, ZstdLevel};
    use parquet::file::properties::WriterVersion;
    let dir = scratch_dir("parquet-stream-pages");
    // Long documents of 3 MiB over a 1 MiB cap, in pages far over the 2 MiB a page may take.
    let cap = 1 << 20;
    let docs = captions_with_long_ones(200, 3 << 20);
    for (name, codec, version) in [
        (
            "zstd-v1",
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_1_0,
        ),
        (
            "gzip-v2",
            Compression::GZIP(GzipLevel::default()),
            WriterVersion::PARQUET_2_0,
        ),
    ] {
        let path = dir.join(format!("{name}.parquet"));
        let props = WriterProperties::builder()
            .set_compression(codec)
            .set_dictionary_enabled(false)
            .set_writer_version(version)
            .set_data_page_size_limit(1 << 30)
            .set_write_batch_size(1 << 20)
            .set_data_page_row_count_limit(1 << 20)
            // Plain, as pyarrow writes a string column without a dictionary (this writer's v2
            // default is DELTA_BYTE_ARRAY, which is not read as a stream: below).
            .set_encoding(Encoding::PLAIN)
            .build();
        write_text_with(&path, &docs, 200, props);
        let whole = read_all(&path, 0, 1 << 30, None);
        let capped = read_all(&path, 0, cap, None);
        assert_eq!(capped.len(), 200, "{name}: every row is yielded");
        for (i, (got, all)) in capped.iter().zip(&whole).enumerate() {
            assert_eq!((&got.0, got.1), (&all.0, all.1));
            match &docs[i] {
                Some(d) if d.len() as u64 > cap => assert_eq!(
                    got.3,
                    Some((
                        Reason::MemberTooLarge,
                        format!("text: {} bytes > {cap}", d.len())
                    )),
                    "{name}: row {i}"
                ),
                _ => assert_eq!(got, all, "{name}: row {i}"),
            }
        }
        assert_eq!(read_all(&path, 0, cap, Some((3, 10))), capped, "{name}");
    }
    // A DELTA page over the bound cannot be read as a stream: its row group ends as too large,
    // and nothing over the bound is decompressed.
    let path = dir.join("delta.parquet");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_dictionary_enabled(false)
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_data_page_size_limit(1 << 30)
        .set_write_batch_size(1 << 20)
        .set_data_page_row_count_limit(1 << 20)
        .build();
    write_text_with(&path, &docs, 200, props);
    let stats = Arc::new(SourceStats::default());
    let wanted = ["text".to_string()];
    let fault = open(&path, &stats)
        .unwrap()
        .samples(0, Some(&wanted))
        .with_max_member_bytes(cap)
        .find_map(Result::err)
        .expect("the row group ends");
    assert_eq!(fault.reason, Reason::MemberTooLarge, "{}", fault.detail);
    assert!(
        fault.detail.contains("DELTA_BYTE_ARRAY page of 200 values"),
        "{}",
        fault.detail
    );
}

/// Lists of real captions, as an interleaved document's `texts`: every 13th row a null list,
/// every 17th an empty one, every fifth element null, and the first element of every 11th row
/// `long` bytes of captions.
fn caption_lists(n: usize, long: usize) -> Vec<lists::List> {
    let captions = real_captions(n + 4);
    let all = captions.join(" ").into_bytes();
    (0..n)
        .map(|i| match i {
            _ if i % 13 == 4 => None,
            _ if i % 17 == 2 => Some(Vec::new()),
            _ => Some(
                (0..1 + i % 4)
                    .map(|j| match j {
                        _ if (i + j) % 5 == 0 => None,
                        0 if i % 11 == 5 => Some(all.iter().cycle().take(long).copied().collect()),
                        _ => Some(captions[i + j].clone().into_bytes()),
                    })
                    .collect(),
            ),
        })
        .collect()
}

fn write_lists(
    path: &std::path::Path,
    rows: &[lists::List],
    per_group: usize,
    props: WriterProperties,
) {
    let schema = parse_message_type(
        "message s { optional group texts (LIST) { repeated group list { \
         optional binary element (STRING); } } }",
    )
    .unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
    for group_rows in rows.chunks(per_group) {
        let (mut values, mut defs, mut reps) = (Vec::new(), Vec::new(), Vec::new());
        for row in group_rows {
            match row.as_deref() {
                // A null list, and an empty one: one level each.
                None | Some([]) => {
                    defs.push(row.is_some() as i16);
                    reps.push(0);
                }
                Some(list) => {
                    for (j, element) in list.iter().enumerate() {
                        reps.push((j > 0) as i16);
                        defs.push(if element.is_some() { 3 } else { 2 });
                        values.extend(element.clone().map(ByteArray::from));
                    }
                }
            }
        }
        let mut group = writer.next_row_group().unwrap();
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), Some(&reps))
            .unwrap();
        c.close().unwrap();
        group.close().unwrap();
    }
    writer.close().unwrap();
}

/// Every row's list of `path`'s `texts`, read in pieces of `rows` rows and `bytes` bytes under
/// the cap, and the rows over it (file row, bytes).
fn read_lists(
    path: &std::path::Path,
    cap: u64,
    (rows, bytes): (usize, usize),
) -> (Vec<lists::List>, Vec<(usize, u64)>) {
    let stats = Arc::new(SourceStats::default());
    let file = open(path, &stats).unwrap();
    let leaf = file.list_column("texts").unwrap().values;
    let wanted = [rows::Wanted {
        name: "texts".into(),
        leaf,
        list: true,
    }];
    let (mut out, mut over, mut first) = (Vec::new(), Vec::new(), 0);
    for (group, n) in file.row_counts().into_iter().enumerate() {
        let mut pieces = file.group_pieces(group, &wanted, cap, first).unwrap();
        while let Some((at, _, mut piece)) = pieces.next_piece(&file, rows, bytes).unwrap() {
            let rows::ColumnPiece::Lists(piece) = piece.remove(0) else {
                panic!("a list piece")
            };
            over.extend(piece.too_large.iter().map(|&(r, b)| (at as usize + r, b)));
            out.extend(piece.lists);
        }
        first += n;
    }
    (out, over)
}

#[test]
fn list_rows_read_in_pieces_of_any_size_and_a_row_over_the_cap_is_skipped_past() {
    use parquet::basic::{Compression, Encoding, GzipLevel, ZstdLevel};
    use parquet::file::properties::WriterVersion;
    let dir = scratch_dir("parquet-list-pieces");
    // Rows of 3 MiB over a 1 MiB cap, in pages far over the 2 MiB a page may take: streamed.
    let cap = 1 << 20;
    let rows = caption_lists(150, 3 << 20);
    let bytes = |list: &lists::List| -> u64 {
        list.iter()
            .flatten()
            .flatten()
            .map(|v| v.len() as u64)
            .sum()
    };
    for (name, codec, version, page) in [
        (
            "snappy-v1-small-pages",
            Compression::SNAPPY,
            WriterVersion::PARQUET_1_0,
            64 << 10,
        ),
        (
            "zstd-v1",
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_1_0,
            1 << 30,
        ),
        (
            "gzip-v2",
            Compression::GZIP(GzipLevel::default()),
            WriterVersion::PARQUET_2_0,
            1 << 30,
        ),
    ] {
        let path = dir.join(format!("{name}.parquet"));
        let props = WriterProperties::builder()
            .set_compression(codec)
            .set_dictionary_enabled(false)
            .set_writer_version(version)
            .set_data_page_size_limit(page)
            .set_write_batch_size(1 << 20)
            .set_data_page_row_count_limit(1 << 20)
            .set_encoding(Encoding::PLAIN)
            .build();
        write_lists(&path, &rows, 70, props);
        let (whole, none) = read_lists(&path, 1 << 30, (1024, 16 << 20));
        assert_eq!(
            (whole.as_slice(), none.as_slice()),
            (rows.as_slice(), &[][..]),
            "{name}"
        );
        let (capped, over) = read_lists(&path, cap, (1024, 16 << 20));
        let want: Vec<(usize, u64)> = (0..rows.len())
            .filter(|&i| bytes(&rows[i]) > cap)
            .map(|i| (i, bytes(&rows[i])))
            .collect();
        assert!(!want.is_empty());
        assert_eq!(
            over, want,
            "{name}: the rows over the cap, with their bytes"
        );
        for (i, (got, all)) in capped.iter().zip(&rows).enumerate() {
            if bytes(all) > cap {
                assert!(bytes(got) <= cap, "{name}: row {i} holds at most the cap");
                assert_eq!(got.as_ref().map(Vec::len), all.as_ref().map(Vec::len));
            } else {
                assert_eq!(got, all, "{name}: row {i}");
            }
        }
        for piece in [(1, 1), (7, 100), (1000, 50_000)] {
            assert_eq!(
                read_lists(&path, cap, piece),
                (capped.clone(), over.clone()),
                "{name} {piece:?}"
            );
        }
    }
}

/// Decompression bombs in the codecs the streaming test above leaves out (issue 52): snappy,
/// lz4 (hadoop framing, as this writer and Spark write it) and lz4_raw pages of 3 MiB documents,
/// read under a 1 MiB cap. Snappy's page is decompressed whole within its format's bound and
/// each long document is skipped as `member_too_large`; an lz4 page is never decompressed past
/// its bound: its row group ends as `member_too_large` naming the page.
#[test]
fn snappy_and_lz4_pages_over_the_cap_are_skipped_by_reason() {
    use parquet::basic::{Compression, Encoding};
    let dir = scratch_dir("parquet-codec-bombs");
    let cap = 1 << 20;
    let docs = captions_with_long_ones(200, 3 << 20);
    for (name, codec) in [
        ("snappy", Compression::SNAPPY),
        ("lz4", Compression::LZ4),
        ("lz4-raw", Compression::LZ4_RAW),
    ] {
        let path = dir.join(format!("{name}.parquet"));
        let props = WriterProperties::builder()
            .set_compression(codec)
            .set_dictionary_enabled(false)
            .set_data_page_size_limit(1 << 30)
            .set_write_batch_size(1 << 20)
            .set_data_page_row_count_limit(1 << 20)
            .set_encoding(Encoding::PLAIN)
            .build();
        write_text_with(&path, &docs, 200, props);
        let stats = Arc::new(SourceStats::default());
        let wanted = ["text".to_string()];
        let read: Vec<_> = open(&path, &stats)
            .unwrap()
            .samples(0, Some(&wanted))
            .with_max_member_bytes(cap)
            .collect();
        if codec == Compression::SNAPPY {
            assert_eq!(read.len(), 200, "{name}: every row is yielded");
            for (i, sample) in read.into_iter().enumerate() {
                let sample = sample.expect("no fault");
                match &docs[i] {
                    Some(d) if d.len() as u64 > cap => assert_eq!(
                        sample.defect,
                        Some((
                            Reason::MemberTooLarge,
                            format!("text: {} bytes > {cap}", d.len())
                        )),
                        "{name}: row {i}"
                    ),
                    Some(d) => assert_eq!(sample.get("text"), Some(&d[..]), "{name}: row {i}"),
                    None => assert!(sample.members.is_empty(), "{name}: row {i}"),
                }
            }
        } else {
            let [Err(fault)] = &read[..] else {
                panic!(
                    "{name}: the row group ends at once, got {} items",
                    read.len()
                );
            };
            assert_eq!(
                fault.reason,
                Reason::MemberTooLarge,
                "{name}: {}",
                fault.detail
            );
            assert!(
                fault.detail.contains("lz4") && fault.detail.contains("over the"),
                "{name}: {}",
                fault.detail
            );
        }
    }
}

/// Regression (fuzzing, the `parquet` target's first minutes): a footer claiming a column chunk
/// at a negative offset made the parquet crate's `byte_range` panic; it is a corrupt file.
#[test]
fn a_column_chunk_at_a_negative_offset_is_corrupt_not_a_panic() {
    let fault = first_fault_of_found(
        include_bytes!("../../check/fuzzing/regressions/parquet-negative-chunk-offset"),
        "parquet-negative-chunk",
        Some("text"),
        u64::MAX,
    );
    assert_eq!(fault.reason, Reason::CorruptParquet, "{}", fault.detail);
    assert!(fault.detail.contains("column chunk"), "{}", fault.detail);
}

/// Regression (fuzzing, the `parquet` target): a dictionary page of byte arrays claiming more
/// values than its bytes hold made the parquet crate's plain decoder panic; it is a corrupt file.
#[test]
fn a_dictionary_page_shorter_than_its_values_is_corrupt_not_a_panic() {
    let fault = first_fault_of_found(
        include_bytes!("../../check/fuzzing/regressions/parquet-short-dictionary-page"),
        "parquet-short-dictionary",
        None,
        1 << 16,
    );
    assert_eq!(fault.reason, Reason::CorruptParquet, "{}", fault.detail);
    assert!(fault.detail.contains("dictionary page"), "{}", fault.detail);
}

/// Regression (fuzzing, the `parquet` target): a DELTA_LENGTH_BYTE_ARRAY page whose lengths run
/// negative made the parquet crate's decoder slice past its buffer and panic. The file is
/// corrupt: today the piece reader meets the corruption first; were the decoder to panic again,
/// the reader catches it (`rows`) and reports the same.
#[test]
fn a_delta_page_with_negative_lengths_is_corrupt_not_a_panic() {
    let fault = first_fault_of_found(
        include_bytes!("../../check/fuzzing/regressions/parquet-delta-length-overflow"),
        "parquet-delta-lengths",
        None,
        1 << 16,
    );
    assert_eq!(fault.reason, Reason::CorruptParquet, "{}", fault.detail);
}

/// Regression (fuzzing, the `parquet` target after the piece reader): a footer placing a column
/// chunk past the file's end made the length of the read underflow (a panic with overflow
/// checks, a read of the whole rest of the file without); the file is short, and says so.
#[test]
fn a_column_chunk_past_the_files_end_is_a_short_file_not_an_underflow() {
    let fault = first_fault_of_found(
        include_bytes!("../../check/fuzzing/regressions/parquet-chunk-past-the-end"),
        "parquet-chunk-past-the-end",
        None,
        1 << 16,
    );
    assert!(
        fault.detail.contains("bytes before a read at byte"),
        "{}",
        fault.detail
    );
}

/// The first fault of a fuzzing finding (its first byte the target's knob, the rest the file)
/// read as image-text samples of column `wanted` (None: every column) under `cap`.
fn first_fault_of_found(input: &[u8], name: &str, wanted: Option<&str>, cap: u64) -> ShardFault {
    let dir = scratch_dir(name);
    let path = dir.join("found.parquet");
    std::fs::write(&path, &input[1..]).unwrap();
    let stats = Arc::new(SourceStats::default());
    let wanted = wanted.map(|w| vec![w.to_string()]);
    let samples = open(&path, &stats).unwrap().samples(0, wanted.as_deref());
    let mut samples = if cap == u64::MAX {
        samples
    } else {
        samples.with_max_member_bytes(cap)
    };
    samples.find_map(Result::err).expect("a fault")
}
