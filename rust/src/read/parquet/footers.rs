//! The last few parsed footers, shared by a process's reader threads: a plan whose units are
//! row groups opens a file once per row group, often one right after another, and each would
//! otherwise fetch and parse the same footer again. Bounded by entries, not by files.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use parquet::file::metadata::ParquetMetaData;

use crate::read::source::Expected;

/// Footers kept: a few per reader thread's current file.
const KEPT: usize = 8;

/// What a footer is known by: the file, its size, and its version: the ETag the file was opened
/// at (the index's, or the source's answer), or a local file's modification time (a file rewritten in place is another footer).
#[derive(Clone, PartialEq, Eq)]
pub(super) struct FooterKey {
    url: String,
    len: u64,
    version: Option<String>,
}

impl FooterKey {
    pub(super) fn of(url: &str, len: u64, expected: &Expected) -> Self {
        let version = expected.etag.clone().or_else(|| {
            let path = url.strip_prefix("file://").unwrap_or(url);
            if path.contains("://") {
                return None;
            }
            let modified = std::fs::metadata(path).ok()?.modified().ok()?;
            Some(format!("{modified:?}"))
        });
        Self {
            url: url.to_string(),
            len,
            version,
        }
    }
}

static FOOTERS: Mutex<VecDeque<(FooterKey, Arc<ParquetMetaData>)>> = Mutex::new(VecDeque::new());

/// The footer of `key` if it is among the last ones parsed (it moves to the front). A file of
/// unknown version is never served from here.
pub(super) fn cached(key: &FooterKey) -> Option<Arc<ParquetMetaData>> {
    key.version.as_ref()?;
    let mut kept = FOOTERS.lock().expect("footer cache");
    let at = kept.iter().position(|(k, _)| k == key)?;
    let entry = kept.remove(at)?;
    let meta = entry.1.clone();
    kept.push_front(entry);
    Some(meta)
}

/// Keeps `meta` as the footer of `key`, forgetting the least recently used beyond [`KEPT`].
pub(super) fn keep(key: FooterKey, meta: Arc<ParquetMetaData>) {
    if key.version.is_none() {
        return;
    }
    let mut kept = FOOTERS.lock().expect("footer cache");
    kept.retain(|(k, _)| *k != key);
    kept.push_front((key, meta));
    kept.truncate(KEPT);
}
