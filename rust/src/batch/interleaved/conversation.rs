//! Multi-image conversations (LLaVA layout) as documents: a tar sample's `KEY.json` holds a
//! `conversations` list of `{"from", "value"}` turns whose `<image>` placeholders stand for the
//! sample's images, named by `image` (one) or `images` (a list) as members of the sample. A
//! Parquet row holds the same turns as a `list<struct<from, value>>` column beside an `image` or
//! `images` column (`parquet_documents`); both are read into a [`Conversation`] and rendered by
//! [`render`].
//!
//! A conversation is rendered by a chat format (ChatML by default, as Qwen2-VL's template
//! renders string contents): an optional default system turn, then per turn
//! `turn_start(role) + value + turn_end + turn_separator`, each placeholder replaced by its image
//! (whose token run the vision spec gives). With `assistant_only`, the text the model learns is
//! each assistant turn's value and its `turn_end`; everything else is context (`Part::Prompt`),
//! its labels masked.

use super::parts::{take_member, Document, DocumentResult, Part};
use crate::batch::kit::sample::Rejection;
use crate::defaults::{IMAGE_KEYS, VIDEO_KEYS};
use crate::error::Reason;
use crate::read::group::RawSample;
use crate::tokenize::DocumentEncoder;

/// How a conversation is rendered and which of its text is learned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatFormat {
    /// The JSON field holding the turns.
    pub field: String,
    /// What stands for an image in a turn's value.
    pub placeholder: String,
    /// What stands for a video in a turn's value (LLaVA-Video's `<video>`).
    pub video_placeholder: String,
    /// A system turn put first when the conversation has none (None: none).
    pub system: Option<String>,
    /// Opens a turn; `{role}` is replaced by the turn's role.
    pub turn_start: String,
    /// Closes a turn (learned with an assistant turn): one token of the vocabulary.
    pub turn_end: String,
    /// Between a turn's end and the next turn (never learned).
    pub turn_separator: String,
    /// A turn's `from` -> the role written in `turn_start`.
    pub roles: Vec<(String, String)>,
    /// Learn only the assistant turns (else every text token).
    pub assistant_only: bool,
}

const ASSISTANT: &str = "assistant";

impl ChatFormat {
    /// What this format cannot run with under `encoder`.
    pub fn validate(&self, encoder: &DocumentEncoder) -> Result<(), String> {
        if encoder.token_id(&self.turn_end).is_none() {
            return Err(format!(
                "conversations: turn_end={:?} is not one token of the tokenizer's vocabulary \
                 (add it as a special token, or name the one the model's chat template uses)",
                self.turn_end
            ));
        }
        if self.placeholder.is_empty() || self.video_placeholder.is_empty() {
            return Err(
                "conversations: placeholder and video_placeholder must not be empty".into(),
            );
        }
        if self.placeholder.contains(&self.video_placeholder)
            || self.video_placeholder.contains(&self.placeholder)
        {
            return Err(format!(
                "conversations: placeholder {:?} and video_placeholder {:?} must not hold one another",
                self.placeholder, self.video_placeholder
            ));
        }
        if !self.roles.iter().any(|(_, role)| role == ASSISTANT) {
            return Err(format!(
                "conversations: no `from` maps to the role {ASSISTANT:?}"
            ));
        }
        Ok(())
    }

    fn role(&self, from: &str) -> Option<&str> {
        self.roles
            .iter()
            .find(|(f, _)| f == from)
            .map(|(_, r)| r.as_str())
    }

    /// The text of turn `role`: learned, or context.
    fn text(&self, role: &str, text: String) -> Part {
        if !self.assistant_only || role == ASSISTANT {
            Part::Text(text)
        } else {
            Part::Prompt(text)
        }
    }

    /// Text that is never learned under `assistant_only` (headers, separators).
    fn frame(&self, text: String) -> Part {
        if self.assistant_only {
            Part::Prompt(text)
        } else {
            Part::Text(text)
        }
    }

    /// The parts of one turn; its placeholders take images from `images` and videos from
    /// `videos`, each in order.
    fn turn(
        &self,
        role: &str,
        value: &str,
        media: &mut Media,
        parts: &mut Vec<Part>,
    ) -> Result<(), Rejection> {
        parts.push(self.frame(self.turn_start.replace("{role}", role)));
        let mut rest = value;
        loop {
            let image = rest.find(self.placeholder.as_str());
            let video = rest.find(self.video_placeholder.as_str());
            let (at, is_video) = match (image, video) {
                (Some(i), Some(v)) if v < i => (v, true),
                (Some(i), _) => (i, false),
                (None, Some(v)) => (v, true),
                (None, None) => break,
            };
            if at > 0 {
                parts.push(self.text(role, rest[..at].to_string()));
            }
            let (part, len) = if is_video {
                (
                    Part::Video(media.next_video(&self.video_placeholder)?),
                    self.video_placeholder.len(),
                )
            } else {
                (
                    Part::Image(media.next_image(&self.placeholder)?),
                    self.placeholder.len(),
                )
            };
            parts.push(part);
            rest = &rest[at + len..];
        }
        if !rest.is_empty() {
            parts.push(self.text(role, rest.to_string()));
        }
        parts.push(self.text(role, self.turn_end.clone()));
        parts.push(self.frame(self.turn_separator.clone()));
        Ok(())
    }
}

/// A conversation's images and videos, taken by its placeholders in order.
struct Media {
    images: std::vec::IntoIter<Vec<u8>>,
    videos: std::vec::IntoIter<Vec<u8>>,
}

impl Media {
    fn next_image(&mut self, placeholder: &str) -> Result<Vec<u8>, Rejection> {
        self.images.next().ok_or_else(|| {
            (
                Reason::MisalignedDocument,
                format!("more {placeholder:?} placeholders than images"),
            )
        })
    }

    fn next_video(&mut self, placeholder: &str) -> Result<Vec<u8>, Rejection> {
        self.videos.next().ok_or_else(|| {
            (
                Reason::MisalignedDocument,
                format!("more {placeholder:?} placeholders than videos"),
            )
        })
    }
}

/// A tar sample's conversation as a document, or why it cannot be one.
pub fn conversation_document(raw: RawSample, format: &ChatFormat) -> DocumentResult {
    let key = raw.key.clone();
    conversation_parts(raw, format)
        .map(|parts| Document {
            key: key.clone(),
            parts,
        })
        .map_err(|r| (key, r))
}

/// A conversation as read, from a tar sample's JSON or a Parquet row (`parquet_documents`),
/// before it is rendered: one renderer, one set of checks and labels for both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Conversation {
    pub turns: Vec<Turn>,
    /// The images, in the order of the placeholders over the whole conversation.
    pub images: Vec<Vec<u8>>,
    /// The videos, in the order of the video placeholders (a tar's `video` or `videos`).
    pub videos: Vec<Vec<u8>>,
}

/// A turn's `from` and `value`; None where it is not a string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Turn {
    pub from: Option<String>,
    pub value: Option<String>,
}

fn conversation_parts(mut raw: RawSample, format: &ChatFormat) -> Result<Vec<Part>, Rejection> {
    if let Some(defect) = raw.defect.take() {
        return Err(defect);
    }
    let bad = |detail: String| (Reason::BadJson, detail);
    let json = raw
        .get("json")
        .ok_or_else(|| (Reason::MissingText, "no json member".to_string()))?;
    let mut value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| bad(format!("json member: {e}")))?;
    let turns = match value.get_mut(&format.field).map(serde_json::Value::take) {
        Some(serde_json::Value::Array(turns)) => turns,
        _ => {
            return Err(bad(format!(
                "the json member has no {:?} list",
                format.field
            )))
        }
    };
    let names = image_names(&value)?;
    let images = take_images(&mut raw, &names)?;
    let videos = take_videos(&mut raw, &video_names(&value)?)?;
    let field = |t: &serde_json::Value, name: &str| {
        t.get(name).and_then(|v| v.as_str()).map(str::to_string)
    };
    let turns = turns
        .iter()
        .map(|t| Turn {
            from: field(t, "from"),
            value: field(t, "value"),
        })
        .collect();
    render(
        Conversation {
            turns,
            images,
            videos,
        },
        format,
    )
}

/// A conversation's parts under `format`, or why it cannot be rendered.
pub(super) fn render(
    conversation: Conversation,
    format: &ChatFormat,
) -> Result<Vec<Part>, Rejection> {
    let Conversation {
        turns,
        images,
        videos,
    } = conversation;
    let bad = |detail: String| (Reason::BadJson, detail);
    let count = |placeholder: &str| -> usize {
        turns
            .iter()
            .filter_map(|t| t.value.as_deref())
            .map(|v| v.matches(placeholder).count())
            .sum()
    };
    for (placeholder, given, what) in [
        (&format.placeholder, images.len(), "images"),
        (&format.video_placeholder, videos.len(), "videos"),
    ] {
        let placeholders = count(placeholder);
        if placeholders != given {
            return Err((
                Reason::MisalignedDocument,
                format!("{placeholders} {placeholder:?} placeholders but {given} {what}"),
            ));
        }
    }
    let mut parts = Vec::with_capacity(4 * turns.len() + images.len() + videos.len() + 4);
    let first_from = turns.first().and_then(|t| t.from.as_deref());
    let starts_with_system = first_from.and_then(|f| format.role(f)) == Some("system");
    if let (Some(system), false) = (&format.system, starts_with_system) {
        parts.push(format.frame(format.turn_start.replace("{role}", "system")));
        parts.push(format.text("system", system.clone()));
        parts.push(format.text("system", format.turn_end.clone()));
        parts.push(format.frame(format.turn_separator.clone()));
    }
    let mut media = Media {
        images: images.into_iter(),
        videos: videos.into_iter(),
    };
    let mut learned = false;
    for (i, turn) in turns.iter().enumerate() {
        let field = |value: &Option<String>, name: &str| {
            value
                .clone()
                .ok_or_else(|| bad(format!("turn {i} has no string {name:?}")))
        };
        let (from, text) = (field(&turn.from, "from")?, field(&turn.value, "value")?);
        let role = format
            .role(&from)
            .ok_or_else(|| bad(format!("turn {i}: unknown role {from:?} (not in roles)")))?;
        learned |= role == ASSISTANT;
        format.turn(role, &text, &mut media, &mut parts)?;
    }
    if format.assistant_only && !learned {
        return Err((
            Reason::MissingText,
            "no assistant turn: with assistant_only it would teach nothing".into(),
        ));
    }
    Ok(parts)
}

/// The names under `image` (one) or `images` (a list); none when neither is there.
fn image_names(value: &serde_json::Value) -> Result<Vec<String>, Rejection> {
    let bad = |detail: &str| (Reason::BadJson, detail.to_string());
    match (value.get("images"), value.get("image")) {
        (Some(serde_json::Value::Array(list)), _) => list
            .iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("an entry of \"images\" is not a string")),
        (Some(serde_json::Value::Null) | None, Some(serde_json::Value::String(name))) => {
            Ok(vec![name.clone()])
        }
        (Some(serde_json::Value::Null) | None, Some(serde_json::Value::Null) | None) => {
            Ok(Vec::new())
        }
        _ => Err(bad(
            "\"image\" must be a string, \"images\" a list of strings",
        )),
    }
}

/// The names under `video` (one) or `videos` (a list), as LLaVA-Video's JSON gives them; none
/// when neither is there.
fn video_names(value: &serde_json::Value) -> Result<Vec<String>, Rejection> {
    let bad = |detail: &str| (Reason::BadJson, detail.to_string());
    match (value.get("videos"), value.get("video")) {
        (Some(serde_json::Value::Array(list)), _) => list
            .iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("an entry of \"videos\" is not a string")),
        (Some(serde_json::Value::Null) | None, Some(serde_json::Value::String(name))) => {
            Ok(vec![name.clone()])
        }
        (Some(serde_json::Value::Null) | None, Some(serde_json::Value::Null) | None) => {
            Ok(Vec::new())
        }
        _ => Err(bad(
            "\"video\" must be a string, \"videos\" a list of strings",
        )),
    }
}

/// The members the video `names` name, in order, each by its extension (`"mp4"` for
/// `KEY.mp4`); one name that names no member takes the sample's only video member
/// (LLaVA-Video's JSON keeps the video's original path). A member the sample lacks is
/// `missing_video`.
fn take_videos(raw: &mut RawSample, names: &[String]) -> Result<Vec<Vec<u8>>, Rejection> {
    let is_video = |ext: &str| {
        let last = ext.rsplit('.').next().unwrap_or(ext);
        VIDEO_KEYS.contains(&last)
    };
    if let [name] = names {
        let named = raw.members.iter().any(|(e, _)| *e == name.to_lowercase());
        if !named {
            let mut videos = raw
                .members
                .iter()
                .enumerate()
                .filter(|(_, (e, _))| is_video(e));
            if let (Some((at, _)), None) = (videos.next(), videos.next()) {
                return Ok(vec![std::mem::take(&mut raw.members[at].1)]);
            }
        }
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            take_member(raw, i, name, names[i + 1..].contains(name)).map_err(|(reason, detail)| {
                match reason {
                    Reason::MissingImage => (
                        Reason::MissingVideo,
                        format!(
                            "video {i} names the member {}.{name}, which the sample lacks",
                            raw.key
                        ),
                    ),
                    _ => (reason, detail.replacen("image", "video", 1)),
                }
            })
        })
        .collect()
}

/// The members `names` name, in order: each by its extension (`"0.jpg"` for `KEY.0.jpg`);
/// one name that names no member takes the sample's only image member (LLaVA JSON keeps the
/// image's original path).
fn take_images(raw: &mut RawSample, names: &[String]) -> Result<Vec<Vec<u8>>, Rejection> {
    let is_image = |ext: &str| {
        let last = ext.rsplit('.').next().unwrap_or(ext);
        IMAGE_KEYS.contains(&last)
    };
    let find = |raw: &RawSample, name: &str| {
        let ext = name.to_lowercase();
        raw.members.iter().position(|(e, _)| *e == ext)
    };
    if let [name] = names {
        if find(raw, name).is_none() {
            let mut images = raw
                .members
                .iter()
                .enumerate()
                .filter(|(_, (e, _))| is_image(e));
            if let (Some((at, _)), None) = (images.next(), images.next()) {
                return Ok(vec![std::mem::take(&mut raw.members[at].1)]);
            }
        }
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| take_member(raw, i, name, names[i + 1..].contains(name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(assistant_only: bool) -> ChatFormat {
        ChatFormat {
            field: "conversations".into(),
            placeholder: "<image>".into(),
            video_placeholder: "<video>".into(),
            system: Some("Be brief.".into()),
            turn_start: "<|im_start|>{role}\n".into(),
            turn_end: "<|im_end|>".into(),
            turn_separator: "\n".into(),
            roles: vec![
                ("human".into(), "user".into()),
                ("gpt".into(), "assistant".into()),
                ("system".into(), "system".into()),
            ],
            assistant_only,
        }
    }

    fn sample(json: &str, members: &[(&str, &[u8])]) -> RawSample {
        let mut all = vec![("json".to_string(), json.as_bytes().to_vec())];
        all.extend(members.iter().map(|(e, b)| (e.to_string(), b.to_vec())));
        RawSample {
            key: "k".into(),
            members: all,
            offset: 0,
            ordinal: 0,
            defect: None,
        }
    }

    fn shown(parts: &[Part]) -> String {
        parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => format!("[{t}]"),
                Part::Prompt(t) => t.clone(),
                Part::Image(b) => format!("<img {}>", String::from_utf8_lossy(b)),
                Part::Video(b) => format!("<vid {}>", String::from_utf8_lossy(b)),
            })
            .collect()
    }

    #[test]
    fn renders_chatml_with_the_images_in_place_and_only_the_answers_learned() {
        let json = r#"{"images": ["0.jpg", "1.jpg"], "conversations": [
            {"from": "human", "value": "<image>\nSee <image>?"},
            {"from": "gpt", "value": "Yes."}]}"#;
        let raw = sample(json, &[("0.jpg", b"A"), ("1.jpg", b"B")]);
        let parts = conversation_parts(raw, &format(true)).unwrap();
        assert_eq!(
            shown(&parts),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<img A>\nSee <img B>?\
             <|im_end|>\n<|im_start|>assistant\n[Yes.][<|im_end|>]\n"
        );
        let raw = sample(json, &[("0.jpg", b"A"), ("1.jpg", b"B")]);
        let parts = conversation_parts(raw, &format(false)).unwrap();
        assert!(parts.iter().all(|p| !matches!(p, Part::Prompt(_))));
    }

    #[test]
    fn an_own_system_turn_replaces_the_default_and_one_unnamed_image_is_the_only_member() {
        let json = r#"{"image": "coco/train2017/1.jpg", "conversations": [
            {"from": "system", "value": "S"}, {"from": "human", "value": "<image>"},
            {"from": "gpt", "value": "x"}]}"#;
        let parts = conversation_parts(sample(json, &[("jpg", b"P")]), &format(true)).unwrap();
        let text = shown(&parts);
        assert!(text.starts_with("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<img P>"));
        assert!(!text.contains("Be brief."));
    }

    #[test]
    fn bad_conversations_are_refused_with_their_reason() {
        let reason = |json: &str, members: &[(&str, &[u8])]| {
            conversation_parts(sample(json, members), &format(true))
                .unwrap_err()
                .0
        };
        let two = r#"{"conversations": [{"from": "human", "value": "<image><image>"},
            {"from": "gpt", "value": "x"}], "images": ["0.jpg"]}"#;
        assert_eq!(reason(two, &[("0.jpg", b"A")]), Reason::MisalignedDocument);
        let missing = r#"{"images": ["0.jpg", "1.jpg"], "conversations": [
            {"from": "human", "value": "<image><image>"}, {"from": "gpt", "value": "x"}]}"#;
        assert_eq!(reason(missing, &[("0.jpg", b"A")]), Reason::MissingImage);
        let role = r#"{"conversations": [{"from": "bot", "value": "x"}]}"#;
        assert_eq!(reason(role, &[]), Reason::BadJson);
        let unlearned = r#"{"conversations": [{"from": "human", "value": "x"}]}"#;
        assert_eq!(reason(unlearned, &[]), Reason::MissingText);
        assert_eq!(reason(r#"{"turns": []}"#, &[]), Reason::BadJson);
    }
}
