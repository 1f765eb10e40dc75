//! What a Parquet file's top-level columns are, as members: which can be read as a member's
//! bytes, which is the key, the feature Hugging Face `datasets` recorded for each, and the one
//! leaf column each is read from.

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::file::metadata::ParquetMetaData;
use parquet::schema::types::Type;

/// The kind of a top-level column, as far as a sample is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    /// Binary (an image, or any bytes).
    Binary,
    /// UTF-8 text.
    Text,
    /// Hugging Face `datasets`' `Image` feature: a struct with a binary `bytes` field.
    ImageStruct,
    /// A number (a key column may be one).
    Number,
    /// Anything else (lists, other structs, floats): never a member.
    Other,
}

impl ColumnKind {
    /// Whether a column of this kind can hold an image.
    pub fn holds_image(self) -> bool {
        matches!(self, ColumnKind::Binary | ColumnKind::ImageStruct)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ColumnKind::Binary => "binary",
            ColumnKind::Text => "string",
            ColumnKind::ImageStruct => "image struct",
            ColumnKind::Number => "number",
            ColumnKind::Other => "another type",
        }
    }
}

/// The feature Hugging Face `datasets` recorded for a column in the file's `huggingface`
/// key-value metadata (`{"info": {"features": {NAME: {"_type": ...}}}}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// `{"_type": "Image"}`.
    Image,
    /// `{"_type": "Value", "dtype": "string"}` (or `large_string`).
    String,
    /// Any other feature (numbers, lists, `Audio`, ...).
    Other,
}

#[derive(Clone, Debug)]
pub struct Column {
    pub name: String,
    pub kind: ColumnKind,
    /// Its `datasets` feature; None when the file records none for it (no `huggingface`
    /// metadata: pyarrow, img2dataset, Spark).
    pub feature: Option<Feature>,
    /// The leaf column its value is read from: the column itself, or an image struct's
    /// `bytes` field; None for a column that is never a member.
    value_leaf: Option<usize>,
}

/// The top-level columns of a file.
#[derive(Clone, Debug)]
pub struct FileSchema {
    pub columns: Vec<Column>,
}

/// One column a read takes: its name (the member's), its kind and the leaf its value is in.
#[derive(Clone, Debug)]
pub struct MemberColumn {
    pub name: String,
    pub kind: ColumnKind,
    pub leaf: usize,
}

/// What one read takes from a file.
#[derive(Clone, Debug)]
pub struct Members {
    /// The columns read, in the file's order (the key column among them).
    pub columns: Vec<MemberColumn>,
    /// Selected columns that may hold the image (a null there is a null image).
    pub images: Vec<String>,
    pub key: Option<String>,
}

impl FileSchema {
    pub fn of(meta: &ParquetMetaData) -> Self {
        let descr = meta.file_metadata().schema_descr();
        let features = hf_features(meta);
        let mut columns: Vec<Column> = descr
            .root_schema()
            .get_fields()
            .iter()
            .map(|field| Column {
                name: field.name().to_string(),
                kind: kind_of(field),
                feature: features
                    .as_ref()
                    .and_then(|f| f.get(field.name()))
                    .map(feature_of),
                value_leaf: None,
            })
            .collect();
        for leaf in 0..descr.num_columns() {
            let root = descr.get_column_root_idx(leaf);
            let Some(c) = columns.get_mut(root) else {
                continue;
            };
            // A primitive column is its own one leaf; an image struct's value is the leaf at
            // `NAME.bytes` (its `path` is never read).
            let parts = descr.column(leaf).path().parts().len();
            let wanted = match c.kind {
                ColumnKind::Binary | ColumnKind::Text | ColumnKind::Number => parts == 1,
                ColumnKind::ImageStruct => {
                    parts == 2 && descr.column(leaf).path().parts()[1] == "bytes"
                }
                ColumnKind::Other => false,
            };
            if wanted {
                c.value_leaf = Some(leaf);
            }
        }
        Self { columns }
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The key column: `key`, else `__key__`, when it is text or a number.
    pub fn key(&self) -> Option<&Column> {
        ["key", "__key__"].iter().find_map(|name| {
            self.column(name).filter(|c| {
                matches!(
                    c.kind,
                    ColumnKind::Text | ColumnKind::Number | ColumnKind::Binary
                )
            })
        })
    }

    /// What reading `wanted` (None: every column that can be a member) takes, with the key.
    pub fn members(&self, wanted: Option<&[String]>) -> Members {
        let key = self.key().map(|c| c.name.clone());
        let chosen: Vec<&Column> = self
            .columns
            .iter()
            .filter(|c| {
                Some(&c.name) == key.as_ref()
                    || match wanted {
                        Some(names) => names.contains(&c.name),
                        None => !matches!(c.kind, ColumnKind::Number | ColumnKind::Other),
                    }
            })
            .collect();
        Members {
            // A wanted column of another type has no value leaf: it reads as absent (the
            // caller names the column's type before reading, `columns::resolve`).
            columns: chosen
                .iter()
                .filter_map(|c| {
                    Some(MemberColumn {
                        name: c.name.clone(),
                        kind: c.kind,
                        leaf: c.value_leaf?,
                    })
                })
                .collect(),
            images: chosen
                .iter()
                .filter(|c| c.kind.holds_image() && Some(&c.name) != key.as_ref())
                .map(|c| c.name.clone())
                .collect(),
            key,
        }
    }
}

/// The `features` object of the `huggingface` key-value metadata, when the file has one that
/// parses; anything else is no features (the metadata only ever adds a choice).
fn hf_features(meta: &ParquetMetaData) -> Option<serde_json::Map<String, serde_json::Value>> {
    let text = meta
        .file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == "huggingface")?
        .value
        .as_deref()?;
    let mut value: serde_json::Value = serde_json::from_str(text).ok()?;
    match value.get_mut("info")?.get_mut("features")?.take() {
        serde_json::Value::Object(features) => Some(features),
        _ => None,
    }
}

fn feature_of(value: &serde_json::Value) -> Feature {
    let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
    match (text("_type"), text("dtype")) {
        (Some("Image"), _) => Feature::Image,
        (Some("Value"), Some("string" | "large_string")) => Feature::String,
        _ => Feature::Other,
    }
}

fn kind_of(field: &Type) -> ColumnKind {
    if field.is_primitive() {
        let info = field.get_basic_info();
        if info.has_repetition() && info.repetition() == parquet::basic::Repetition::REPEATED {
            return ColumnKind::Other;
        }
        return match field.get_physical_type() {
            PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY => {
                let text = matches!(info.logical_type_ref(), Some(LogicalType::String))
                    || matches!(info.converted_type(), ConvertedType::UTF8);
                if text {
                    ColumnKind::Text
                } else {
                    ColumnKind::Binary
                }
            }
            PhysicalType::INT32 | PhysicalType::INT64 => ColumnKind::Number,
            _ => ColumnKind::Other,
        };
    }
    // A repeated `bytes` is a list, not one image.
    let has_bytes = field.get_fields().iter().any(|f| {
        f.name() == "bytes"
            && f.is_primitive()
            && f.get_physical_type() == PhysicalType::BYTE_ARRAY
            && !(f.get_basic_info().has_repetition()
                && f.get_basic_info().repetition() == parquet::basic::Repetition::REPEATED)
    });
    let info = field.get_basic_info();
    let repeated =
        info.has_repetition() && info.repetition() == parquet::basic::Repetition::REPEATED;
    if has_bytes && !repeated {
        ColumnKind::ImageStruct
    } else {
        ColumnKind::Other
    }
}
