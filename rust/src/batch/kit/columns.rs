//! Which columns of a Parquet file a sample spec reads, and under which member names.
//!
//! A spec names its image and caption members (`image_keys`, `caption_key`); in a Parquet file
//! they are columns of those names. Hugging Face `datasets` writes `image` and `text` columns,
//! which the defaults (`jpg`... and `txt`) do not name, and records each column's feature in
//! the file's `huggingface` metadata. So when the spec holds a default and the file has no
//! column of the default names, the feature decides: the one `Image` column is the image; the
//! one string `Value` column (the key column aside), else the one of them named `text` or
//! `caption`, is the caption. It is read under the spec's name (the first image key, the
//! caption member), so every later step (validation, decoding, the loader) sees the members it
//! expects. Several candidates and no default is ambiguous: a `missing_column` fault that
//! lists them and names the option that settles it. A name the user gave is never second-guessed.
//!
//! One function, used by the scan (`validate`, `index`) and by the loader's reader alike, per
//! file, from the footer already read: the two choose the same columns for every file.

use crate::batch::kit::sample::{CaptionSource, Rejection, SampleSpec};
use crate::defaults;
use crate::error::Reason;
use crate::read::parquet::{ColumnKind, Feature, FileSchema};

/// What one file's read takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileColumns {
    /// The columns to read (names the file lacks are left out by the projection).
    pub wanted: Vec<String>,
    /// (column, member name): columns read under the name the spec looks for.
    pub renamed: Vec<(String, String)>,
}

/// Text of the caption names `datasets` users give their text column, preferred among several
/// string columns.
const CAPTION_NAMES: [&str; 2] = ["text", "caption"];

/// The columns `spec` reads from a file of `schema`: see the module's documentation.
pub fn resolve(spec: &SampleSpec, schema: &FileSchema) -> Result<FileColumns, Rejection> {
    let mut out = FileColumns {
        wanted: wanted_columns(spec),
        renamed: Vec::new(),
    };
    let default_images = defaults::image_keys();
    if spec.image_keys == default_images
        && !spec.image_keys.iter().any(|k| schema.column(k).is_some())
    {
        let images: Vec<&str> = schema
            .columns
            .iter()
            .filter(|c| c.feature == Some(Feature::Image) && c.kind.holds_image())
            .map(|c| c.name.as_str())
            .collect();
        match images[..] {
            [] => {}
            [image] => out.choose(image, &default_images[0]),
            _ => {
                return Err(ambiguous(
                    "image",
                    &images,
                    "image_keys=[NAME] (CLI: --image-keys NAME)",
                ))
            }
        }
    }
    let default_caption = CaptionSource::parse(defaults::CAPTION_KEY);
    if spec.caption == default_caption && schema.column(defaults::CAPTION_KEY).is_none() {
        let key = schema.key().map(|c| c.name.as_str());
        let texts: Vec<&str> = schema
            .columns
            .iter()
            .filter(|c| c.feature == Some(Feature::String) && c.kind == ColumnKind::Text)
            .map(|c| c.name.as_str())
            .filter(|&name| Some(name) != key)
            .collect();
        let named: Vec<&str> = texts
            .iter()
            .copied()
            .filter(|name| CAPTION_NAMES.contains(name))
            .collect();
        match (&texts[..], &named[..]) {
            ([], _) => {}
            ([text], _) | (_, [text]) => out.choose(text, defaults::CAPTION_KEY),
            _ => {
                return Err(ambiguous(
                    "caption",
                    &texts,
                    "caption_key=NAME (CLI: --caption-key NAME)",
                ))
            }
        }
    }
    Ok(out)
}

/// The Parquet columns a sample spec reads: its image keys and its caption's member.
pub fn wanted_columns(spec: &SampleSpec) -> Vec<String> {
    let mut out = spec.image_keys.clone();
    match &spec.caption {
        CaptionSource::Member(m) | CaptionSource::JsonField { member: m, .. } => {
            out.push(m.clone())
        }
        CaptionSource::None => {}
    }
    out
}

impl FileColumns {
    fn choose(&mut self, column: &str, member: &str) {
        self.wanted.push(column.to_string());
        self.renamed.push((column.to_string(), member.to_string()));
    }
}

fn ambiguous(role: &str, candidates: &[&str], option: &str) -> Rejection {
    (
        Reason::MissingColumn,
        format!(
            "no {role} column of the default names, and its `huggingface` features give {} \
             candidates ({}): name one with {option}",
            candidates.len(),
            candidates.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    use super::*;
    use crate::fixtures::scratch_dir;

    /// The schema of an empty file with these columns and, when given, this `huggingface`
    /// metadata.
    fn schema(message: &str, huggingface: Option<&str>) -> FileSchema {
        // A folder per call: `scratch_dir` empties its folder, and the tests run in parallel.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = scratch_dir(&format!("columns-{call}"));
        let path = dir.join("f.parquet");
        let kv = huggingface.map(|v| vec![KeyValue::new("huggingface".into(), v.to_string())]);
        let props = WriterProperties::builder()
            .set_key_value_metadata(kv)
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let schema = Arc::new(parse_message_type(message).unwrap());
        SerializedFileWriter::new(file, schema, Arc::new(props))
            .unwrap()
            .close()
            .unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        FileSchema::of(reader.metadata())
    }

    const HF_MESSAGE: &str = "message schema { optional binary key (UTF8); \
        optional group image { optional binary bytes; optional binary path (UTF8); } \
        optional binary text (UTF8); }";
    const HF_FEATURES: &str = r#"{"info": {"features": {"key": {"dtype": "string", "_type": "Value"}, "image": {"_type": "Image"}, "text": {"dtype": "string", "_type": "Value"}}}}"#;

    fn renamed(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn datasets_features_choose_the_image_and_text_columns_for_the_defaults() {
        let cols = resolve(
            &SampleSpec::default(),
            &schema(HF_MESSAGE, Some(HF_FEATURES)),
        )
        .unwrap();
        assert_eq!(cols.renamed, renamed(&[("image", "jpg"), ("text", "txt")]));
        assert!(cols.wanted.contains(&"image".to_string()));
        assert!(cols.wanted.contains(&"text".to_string()));
    }

    #[test]
    fn names_the_user_gave_and_files_without_features_are_taken_as_they_are() {
        let spec = SampleSpec {
            image_keys: vec!["image".into()],
            caption: CaptionSource::parse("key"),
            ..SampleSpec::default()
        };
        let hf = schema(HF_MESSAGE, Some(HF_FEATURES));
        assert_eq!(resolve(&spec, &hf).unwrap().renamed, vec![]);
        let plain = schema(HF_MESSAGE, None);
        assert_eq!(
            resolve(&SampleSpec::default(), &plain).unwrap().renamed,
            vec![]
        );
        // A default-named column present wins over the features.
        let with_jpg = schema(
            "message schema { optional binary jpg; optional group image { optional binary bytes; } \
             optional binary txt (UTF8); optional binary text (UTF8); }",
            Some(HF_FEATURES),
        );
        assert_eq!(
            resolve(&SampleSpec::default(), &with_jpg).unwrap().renamed,
            vec![]
        );
    }

    #[test]
    fn several_candidates_are_a_missing_column_listing_them_and_the_option() {
        let two_images = schema(
            "message schema { optional group image { optional binary bytes; } \
             optional group mask { optional binary bytes; } optional binary text (UTF8); }",
            Some(
                r#"{"info": {"features": {"image": {"_type": "Image"}, "mask": {"_type": "Image"},
                "text": {"dtype": "string", "_type": "Value"}}}}"#,
            ),
        );
        let (reason, detail) = resolve(&SampleSpec::default(), &two_images).unwrap_err();
        assert_eq!(reason, Reason::MissingColumn);
        assert!(detail.contains("(image, mask)"), "{detail}");
        assert!(detail.contains("--image-keys"), "{detail}");
        // Two string columns, neither named text or caption: ambiguous; one named caption: taken.
        let with_strings = |a: &str, b: &str| {
            let features = format!(
                r#"{{"info": {{"features": {{"image": {{"_type": "Image"}},
                "{a}": {{"dtype": "string", "_type": "Value"}}, "{b}": {{"dtype": "large_string", "_type": "Value"}}}}}}}}"#
            );
            schema(
                &format!(
                    "message schema {{ optional group image {{ optional binary bytes; }} \
                     optional binary {a} (UTF8); optional binary {b} (UTF8); }}"
                ),
                Some(&features),
            )
        };
        let (reason, detail) =
            resolve(&SampleSpec::default(), &with_strings("title", "alt")).unwrap_err();
        assert_eq!(reason, Reason::MissingColumn);
        assert!(detail.contains("(title, alt)"), "{detail}");
        assert!(detail.contains("--caption-key"), "{detail}");
        let named = with_strings("url", "caption");
        assert_eq!(
            resolve(&SampleSpec::default(), &named).unwrap().renamed,
            renamed(&[("image", "jpg"), ("caption", "txt")])
        );
    }
}
