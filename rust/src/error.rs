//! Why a sample or a shard was rejected: one closed list of reasons, each with a stable name
//! that appears in stats, validation reports and exception messages.

use std::fmt;

/// What a reader does with a fault (`on_error`): skip the sample or shard and count it, or end
/// the stream with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// Count the fault and go on.
    Skip,
    /// End the stream with the fault.
    Raise,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The tar stream ended inside a header or a member.
    TruncatedTar,
    /// A tar header is malformed (bad checksum, bad size field) where a member was expected.
    CorruptTar,
    /// A member is larger than `max_member_bytes`.
    MemberTooLarge,
    /// Two members of one sample have the same extension.
    DuplicateMember,
    /// The same key appears in more than one sample of a shard.
    DuplicateKey,
    /// No member with an image extension.
    MissingImage,
    /// No caption member (or the configured JSON field is absent).
    MissingCaption,
    /// The caption is not valid UTF-8 (or the JSON is malformed).
    BadUtf8,
    /// The image bytes do not decode.
    CorruptImage,
    /// The image is in a format we do not decode.
    UnsupportedFormat,
    /// width x height exceeds `max_pixels` (checked from the header, before allocating).
    TooManyPixels,
    /// The shard could not be fetched (after the retry budget) or opened.
    Unreadable,
    /// A Parquet file's footer, a page or a row group does not decode (or holds other row
    /// counts than its footer says).
    CorruptParquet,
    /// A Parquet file has no column of that name (an image or caption column).
    MissingColumn,
    /// A Parquet column has a type that cannot be that member (an image column of numbers).
    WrongType,
    /// A Parquet row's image column is null.
    NullImage,
    /// A bug in shardstream (a panic while decoding a sample or reading a shard), reported
    /// (the sample counted, the pass failed) rather than ending the pass early unnoticed.
    Internal,
    /// A text kind's document has no text where the spec says (the member, column or field).
    MissingText,
    /// A NaFlex image's patch grid under `max_num_patches` has fewer patches than
    /// `min_num_patches` (an extreme aspect ratio: one side is held at one patch).
    TooFewPatches,
    /// A JSONL line that is not one JSON object (malformed JSON, an array or a scalar, or more
    /// after the object), or a text kind's JSON member that does not parse.
    BadJson,
    /// A compressed file's stream (a JSONL `.gz` or `.zst`) is truncated or does not decode.
    CorruptStream,
    /// An interleaved document whose `texts` and `images` lists differ in length, or hold a
    /// value at the same position (or neither).
    MisalignedDocument,
    /// An interleaved document's image given only as a URL: nothing is fetched from it.
    ImageUrlOnly,
    /// An interleaved document with more images than `max_images_per_document`.
    TooManyImages,
    /// An image whose run of image tokens is longer than a row (`seq_len`).
    ImageOverRow,
    /// A video whose container does not open or parse, is cut short, holds fewer frames than
    /// were sampled, or has a packet that does not decode (the whole clip is dropped).
    CorruptVideo,
    /// A file read as a video that holds no video stream (audio only, or not a video).
    NoVideoStream,
    /// A video stream whose codec the loaded FFmpeg has no decoder for (named in the detail).
    UnsupportedCodec,
    /// A video longer than `max_seconds` (from its header, before decoding).
    VideoTooLong,
    /// A video-text sample with no member of the video extensions (`video_keys`).
    MissingVideo,
    /// A video in a document whose run of video tokens is longer than a row (`seq_len`), or
    /// whose patches are more than a batch holds (`max_patches_per_batch`).
    VideoOverRow,
}

impl Reason {
    // New reasons go at the end, so that every existing one keeps its position.
    pub const ALL: [Reason; 31] = [
        Reason::TruncatedTar,
        Reason::CorruptTar,
        Reason::MemberTooLarge,
        Reason::DuplicateMember,
        Reason::DuplicateKey,
        Reason::MissingImage,
        Reason::MissingCaption,
        Reason::BadUtf8,
        Reason::CorruptImage,
        Reason::UnsupportedFormat,
        Reason::TooManyPixels,
        Reason::Unreadable,
        Reason::CorruptParquet,
        Reason::MissingColumn,
        Reason::WrongType,
        Reason::NullImage,
        Reason::Internal,
        Reason::MissingText,
        Reason::TooFewPatches,
        Reason::BadJson,
        Reason::CorruptStream,
        Reason::MisalignedDocument,
        Reason::ImageUrlOnly,
        Reason::TooManyImages,
        Reason::ImageOverRow,
        Reason::CorruptVideo,
        Reason::NoVideoStream,
        Reason::UnsupportedCodec,
        Reason::VideoTooLong,
        Reason::MissingVideo,
        Reason::VideoOverRow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TruncatedTar => "truncated_tar",
            Reason::CorruptTar => "corrupt_tar",
            Reason::MemberTooLarge => "member_too_large",
            Reason::DuplicateMember => "duplicate_member",
            Reason::DuplicateKey => "duplicate_key",
            Reason::MissingImage => "missing_image",
            Reason::MissingCaption => "missing_caption",
            Reason::BadUtf8 => "bad_utf8",
            Reason::CorruptImage => "corrupt_image",
            Reason::UnsupportedFormat => "unsupported_format",
            Reason::TooManyPixels => "too_many_pixels",
            Reason::Unreadable => "unreadable",
            Reason::CorruptParquet => "corrupt_parquet",
            Reason::MissingColumn => "missing_column",
            Reason::WrongType => "wrong_type",
            Reason::NullImage => "null_image",
            Reason::Internal => "internal_error",
            Reason::MissingText => "missing_text",
            Reason::TooFewPatches => "too_few_patches",
            Reason::BadJson => "bad_json",
            Reason::CorruptStream => "corrupt_stream",
            Reason::MisalignedDocument => "misaligned_document",
            Reason::ImageUrlOnly => "image_url_only",
            Reason::TooManyImages => "too_many_images",
            Reason::ImageOverRow => "image_over_row",
            Reason::CorruptVideo => "corrupt_video",
            Reason::NoVideoStream => "no_video_stream",
            Reason::UnsupportedCodec => "unsupported_codec",
            Reason::VideoTooLong => "video_too_long",
            Reason::MissingVideo => "missing_video",
            Reason::VideoOverRow => "video_over_row",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which kind of source failure made a shard `unreadable`. It decides the exception class users
/// catch (`shardstream.errors`: one table there), so it travels as a kind, never as wording.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// Any other failure to fetch (timeouts, 5xx after the retry budget, a changed object).
    #[default]
    Other,
    /// No such file, bucket or object.
    NotFound,
    /// Missing, wrong or expired credentials, or access denied.
    Credentials,
    /// A URL we refuse to open.
    BadUrl,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Other => "other",
            SourceKind::NotFound => "not_found",
            SourceKind::Credentials => "credentials",
            SourceKind::BadUrl => "bad_url",
        }
    }

    pub fn is_other(&self) -> bool {
        *self == SourceKind::Other
    }
}

/// The most bytes of another library's error text a fault's detail keeps.
pub const MAX_DETAIL_BYTES: usize = 512;

/// `detail` cut to [`MAX_DETAIL_BYTES`] (at a character boundary), saying how much was cut: a
/// detail names what went wrong and where (file, row, byte offset), never the data, and a
/// library's error text that quotes a value (the parquet crate's once listed a whole document's
/// bytes) must not put megabytes into an exception and a log line.
pub fn capped_detail(detail: String) -> String {
    if detail.len() <= MAX_DETAIL_BYTES {
        return detail;
    }
    let mut end = MAX_DETAIL_BYTES;
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes cut)", &detail[..end], detail.len() - end)
}

/// A rejected sample (or shard, when `key` is empty): what, where and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fault {
    pub reason: Reason,
    /// The shard URL, already redacted.
    pub url: String,
    pub key: String,
    pub detail: String,
    /// For an `unreadable` shard: what kind of source failure it was.
    #[serde(default, skip_serializing_if = "SourceKind::is_other")]
    pub kind: SourceKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{} in {}: {}", self.reason, self.url, self.detail)
        } else {
            write!(
                f,
                "{} in {} (key {:?}): {}",
                self.reason, self.url, self.key, self.detail
            )
        }
    }
}

impl std::error::Error for Fault {}

/// The text a panic carries (a `&str` or `String` payload).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_detail_is_capped_at_a_character_boundary_and_says_so() {
        assert_eq!(capped_detail("short".into()), "short");
        let long = format!(
            "{}é{}",
            "a".repeat(MAX_DETAIL_BYTES - 1),
            "b".repeat(1 << 20)
        );
        let capped = capped_detail(long.clone());
        assert!(capped.len() < MAX_DETAIL_BYTES + 40, "{}", capped.len());
        assert!(capped.starts_with(&"a".repeat(MAX_DETAIL_BYTES - 1)));
        assert!(capped.ends_with(&format!(
            "... ({} bytes cut)",
            long.len() - (MAX_DETAIL_BYTES - 1)
        )));
    }
}
