//! Byte sources: open a shard URL at a byte offset and stream it sequentially.
//!
//! - local paths and `file://`: a buffered file;
//! - `http://` / `https://`: [`http::HttpReader`], which retries with backoff and resumes a
//!   broken stream with a Range request at the exact byte where it stopped, refusing to splice
//!   two versions of an object;
//! - `hf://` (Hugging Face Hub): the Python side's [`Signer`] turns it into the resolve URL at a
//!   pinned commit plus an `Authorization` header, read like `s3://` (ureq drops that header on
//!   every redirect, so the storage host never sees the token);
//! - `s3://`: presigned by the [`Signer`] the Python side lends (boto3 and its credential chain)
//!   each time the object is opened, then read over HTTPS. Signing at open time, not when the
//!   URL list is made, keeps a run alive past the life of any one signature (temporary
//!   credentials from an instance role or SSO expire after hours; an epoch can take days);
//! - optionally through [`cache::ShardCache`], a size-bounded on-disk cache shared by the
//!   processes of one machine.
//!
//! Every message that leaves this module names the URL through [`redact_url`]: presigned URLs
//! carry credentials in their query string.

mod backoff;
pub mod cache;
pub mod http;
mod retry_after;
#[cfg(test)]
pub(crate) mod testserver;

use crate::defaults;
use crate::error::SourceKind;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Buffer size for local files and for the HTTP body: large sequential reads keep syscalls and
/// per-read overhead negligible next to decoding.
pub const READ_BUFFER_BYTES: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// Limit for TCP connect (and TLS handshake) of each attempt.
    pub connect_timeout: Duration,
    /// Limit for each single socket read: a stall longer than this breaks the stream, which is
    /// then resumed. It is not a limit on the whole body (a 2 GB shard may take minutes).
    pub read_timeout: Duration,
    /// Consecutive failed attempts (without a byte of progress) before a stream gives up.
    pub max_retries: u32,
    /// First backoff delay; doubles per consecutive failure, with jitter, up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// The longest server `Retry-After` waited for (in full, plus jitter; not capped at
    /// `backoff_max`); a longer one fails the read with [`SourceError::Throttled`].
    pub retry_after_max: Duration,
    /// Optional on-disk shard cache for remote URLs (local files are never cached).
    pub cache: Option<CacheOptions>,
    /// PEM file of root certificates to trust for HTTPS instead of the built-in Mozilla roots
    /// (an S3-compatible store behind a private CA).
    pub ca_bundle: Option<PathBuf>,
    /// Presigns `s3://` (and resolves `hf://`) URLs; without one they cannot be opened.
    pub signer: Option<Signer>,
    /// Extra request headers for every HTTP request of a stream (a Hub bearer token, set from
    /// the signer's answer). Never printed: values are secrets.
    pub headers: RequestHeaders,
}

/// Request headers whose values are never shown (`Debug` prints only the names).
#[derive(Clone, Default)]
pub struct RequestHeaders(pub Vec<(String, String)>);

impl std::fmt::Debug for RequestHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|(k, _)| k.as_str()).collect();
        write!(f, "RequestHeaders({names:?}, values redacted)")
    }
}

/// What a signer answers: the URL to GET now and headers to send with it (and with every
/// reconnection of that stream).
#[derive(Clone, Default)]
pub struct Signed {
    pub url: String,
    pub headers: Vec<(String, String)>,
}

impl From<String> for Signed {
    fn from(url: String) -> Self {
        Self {
            url,
            headers: Vec::new(),
        }
    }
}

/// Turns an `s3://bucket/key` (or `hf://`) URL into an HTTPS URL for GET, with any headers it
/// needs, or says why it cannot (the message must not contain secrets).
#[derive(Clone)]
pub struct Signer(pub Arc<SignFn>);

pub type SignFn = dyn Fn(&str) -> Result<Signed, String> + Send + Sync;

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer")
    }
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            connect_timeout: defaults::CONNECT_TIMEOUT,
            read_timeout: defaults::READ_TIMEOUT,
            max_retries: defaults::MAX_RETRIES,
            backoff_initial: defaults::BACKOFF_INITIAL,
            backoff_max: defaults::BACKOFF_MAX,
            retry_after_max: defaults::RETRY_AFTER_MAX,
            cache: None,
            ca_bundle: None,
            signer: None,
            headers: RequestHeaders::default(),
        }
    }
}

/// Where the shard cache lives and how large it may grow (least recently used shards go first).
#[derive(Clone, Debug)]
pub struct CacheOptions {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// Counters shared by every stream of one pipeline.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Bytes handed to readers (from any source, cache included).
    pub bytes: AtomicU64,
    /// Failed attempts that were retried (connect errors, resets, 5xx, throttling, stalls).
    pub retries: AtomicU64,
    /// Retries that waited for a server's `Retry-After` (429/503 throttling; a subset of
    /// `retries`).
    pub throttled: AtomicU64,
    /// Retries that continued a broken body with a Range request (a subset of `retries`).
    pub resumes: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Shards read without the cache because the cache directory could not be used (full,
    /// read-only, not creatable): the bytes are still delivered, straight from the source.
    pub cache_errors: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("not found: {url}")]
    NotFound { url: String },
    /// 401/403: missing, wrong or expired credentials (a presigned URL past its expiry).
    #[error(
        "access denied to {url} (HTTP {status}): check credentials, or the presigned URL expired"
    )]
    Denied { url: String, status: u16 },
    /// The object was replaced while we were reading it; resuming would splice two versions.
    #[error("{url} changed while it was being read (at byte {offset}): {message}")]
    Changed {
        url: String,
        offset: u64,
        message: String,
    },
    /// Still failing after the whole retry budget.
    #[error("{url} unavailable at byte {offset} after {attempts} attempts: {message}")]
    Unavailable {
        url: String,
        offset: u64,
        attempts: u32,
        message: String,
    },
    /// The server (429/503) asked to wait longer than `retry_after_max`.
    #[error(
        "{url} throttled at byte {offset}: the server asks to retry after {retry_after_secs} s, \
         over the {max_secs} s this reader waits ({message})"
    )]
    Throttled {
        url: String,
        offset: u64,
        retry_after_secs: u64,
        max_secs: u64,
        message: String,
    },
    #[error("cannot open {url}: {message}")]
    Open { url: String, message: String },
    #[error("unsupported URL {url}: {message}")]
    BadUrl { url: String, message: String },
    /// The signer refused (no credentials, an expired session): a credentials problem.
    #[error("access denied to {url}: cannot sign the request: {message}")]
    Unsigned { url: String, message: String },
}

impl SourceError {
    /// The kind users' exceptions are chosen by.
    pub fn kind(&self) -> SourceKind {
        match self {
            SourceError::NotFound { .. } => SourceKind::NotFound,
            SourceError::Denied { .. } | SourceError::Unsigned { .. } => SourceKind::Credentials,
            SourceError::BadUrl { .. } => SourceKind::BadUrl,
            SourceError::Changed { .. }
            | SourceError::Unavailable { .. }
            | SourceError::Throttled { .. }
            | SourceError::Open { .. } => SourceKind::Other,
        }
    }

    /// The kind of an `io::Error` from a source's `Read`: the `SourceError` inside it, or a
    /// missing file.
    pub fn kind_of_io(e: &io::Error) -> SourceKind {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<SourceError>())
        {
            Some(source) => source.kind(),
            None if e.kind() == io::ErrorKind::NotFound => SourceKind::NotFound,
            None => SourceKind::Other,
        }
    }

    /// The matching `io::ErrorKind`, for errors that surface through `Read::read`.
    fn io_kind(&self) -> io::ErrorKind {
        match self {
            SourceError::NotFound { .. } => io::ErrorKind::NotFound,
            SourceError::Denied { .. } | SourceError::Unsigned { .. } => {
                io::ErrorKind::PermissionDenied
            }
            SourceError::Unavailable { .. } | SourceError::Throttled { .. } => {
                io::ErrorKind::TimedOut
            }
            SourceError::BadUrl { .. } => io::ErrorKind::InvalidInput,
            SourceError::Changed { .. } | SourceError::Open { .. } => io::ErrorKind::Other,
        }
    }

    /// Wraps into an `io::Error` that keeps this error inside (`get_ref()` + `downcast_ref`), so
    /// a pipeline can tell "shard unavailable" from "tar truncated" after a failed `read`.
    pub fn into_io(self) -> io::Error {
        io::Error::new(self.io_kind(), self)
    }

    /// The same error naming `url` (the `s3://` URL users know) instead of the presigned one.
    fn naming(self, url: &str) -> SourceError {
        let url = url.to_string();
        match self {
            SourceError::NotFound { .. } => SourceError::NotFound { url },
            SourceError::Denied { status, .. } => SourceError::Denied { url, status },
            SourceError::Changed {
                offset, message, ..
            } => SourceError::Changed {
                url,
                offset,
                message,
            },
            SourceError::Unavailable {
                offset,
                attempts,
                message,
                ..
            } => SourceError::Unavailable {
                url,
                offset,
                attempts,
                message,
            },
            SourceError::Throttled {
                offset,
                retry_after_secs,
                max_secs,
                message,
                ..
            } => SourceError::Throttled {
                url,
                offset,
                retry_after_secs,
                max_secs,
                message,
            },
            SourceError::Open { message, .. } => SourceError::Open { url, message },
            SourceError::BadUrl { message, .. } => SourceError::BadUrl { url, message },
            SourceError::Unsigned { message, .. } => SourceError::Unsigned { url, message },
        }
    }
}

/// Removes what must never be printed: the query string (presigned URLs carry signatures there)
/// and user:password in the authority.
pub fn redact_url(url: &str) -> String {
    let (without_query, had_query) = match url.find(['?', '#']) {
        Some(i) => (&url[..i], true),
        None => (url, false),
    };
    let mut out = match without_query.find("://") {
        Some(scheme_end) => {
            let rest = &without_query[scheme_end + 3..];
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{}://***@{}", &without_query[..scheme_end], &rest[at + 1..]),
                None => without_query.to_string(),
            }
        }
        None => without_query.to_string(),
    };
    if had_query {
        out.push_str("?<redacted>");
    }
    out
}

/// Replaces any copy of `url` (or of its secret parts) inside a third-party message, because
/// library errors may quote the URL they were given.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    let mut out = message.replace(url, &redact_url(url));
    if let Some(i) = url.find(['?', '#']) {
        let secret = &url[i + 1..];
        if !secret.is_empty() {
            out = out.replace(secret, "<redacted>");
        }
    }
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if let Some(at) = authority.rfind('@') {
            out = out.replace(&authority[..at], "***");
        }
    }
    out
}

pub(crate) struct CountingReader<R> {
    inner: R,
    stats: Arc<SourceStats>,
}

impl<R> CountingReader<R> {
    pub(crate) fn new(inner: R, stats: &Arc<SourceStats>) -> Self {
        Self {
            inner,
            stats: stats.clone(),
        }
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// What a URL string refers to.
enum Location<'a> {
    Local(&'a str),
    Http,
    S3,
}

fn locate(url: &str) -> Result<Location<'_>, SourceError> {
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(Location::Local(path));
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Ok(Location::Http);
    }
    let bad = |message: &str| {
        Err(SourceError::BadUrl {
            url: redact_url(url),
            message: message.to_string(),
        })
    };
    if url.starts_with("pipe:") {
        return bad("pipe: URLs run shell commands and are refused");
    }
    if url.starts_with("s3://") || url.starts_with("hf://") {
        return Ok(Location::S3);
    }
    if let Some(scheme_end) = url.find("://") {
        let scheme = &url[..scheme_end];
        if !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        {
            return bad(
                "unknown scheme (supported: local paths, file://, http://, https://, s3://)",
            );
        }
    }
    Ok(Location::Local(url))
}

/// What an index recorded of a shard's content. A reader refuses another version (a shard
/// replaced since it was indexed), so stale offsets never splice the wrong bytes into samples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// The object's size in bytes.
    pub size: Option<u64>,
    /// Its strong ETag (HTTP and S3): sent as `If-Match` with the first request.
    pub etag: Option<String>,
}

impl Expected {
    /// From an index's identity string: `etag:<ETag>` (the rest of the string is the ETag), or
    /// comma-separated `key:value` fields of which `size` is used (`mtime_ns` and
    /// `last-modified` say when, which a size check alone cannot; they are not compared).
    pub fn from_identity(identity: Option<&str>) -> Self {
        let Some(identity) = identity else {
            return Self::default();
        };
        if let Some(etag) = identity.strip_prefix("etag:") {
            return Self {
                size: None,
                etag: (!etag.is_empty() && !etag.starts_with("W/")).then(|| etag.to_string()),
            };
        }
        let size = identity
            .split(',')
            .find_map(|field| field.strip_prefix("size:"))
            .and_then(|v| v.trim().parse().ok());
        Self { size, etag: None }
    }

    pub fn is_empty(&self) -> bool {
        self.size.is_none() && self.etag.is_none()
    }
}

/// Opens `url` positioned at byte `start`, reading to its end.
pub fn open(
    url: &str,
    start: u64,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    open_range(url, start, None, opts, stats)
}

/// [`open`], refusing a version of the object other than `expected` (an index's record).
pub fn open_expecting(
    url: &str,
    start: u64,
    expected: &Expected,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    open_range_checked(url, start, None, expected, true, opts, stats)
}

/// An `http(s)://` object, through the shard cache when there is one (which checks the cached
/// copy against `expected` too).
fn open_http(
    url: &str,
    start: u64,
    end: Option<u64>,
    expected: &Expected,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    match &opts.cache {
        Some(cache) => {
            cache::ShardCache::new(cache.clone()).open(url, start, end, expected, opts, stats)
        }
        None => Ok(buffered(
            http::HttpReader::open_expecting(url, None, start, end, expected, opts, stats)?,
            stats,
        )),
    }
}

/// The version of the object at `url` that is there now (refusing one other than `expected`):
/// its size in bytes (the file's, or what the server reports for a one-byte range) and, for HTTP
/// and S3, its strong ETag. Readers that start at the end (a Parquet footer) need the size first,
/// and their later range reads pass this version to [`open_range_expecting`], so that an object
/// replaced between two of them is refused rather than spliced.
pub fn object_version(
    url: &str,
    expected: &Expected,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Expected, SourceError> {
    let unknown = || SourceError::Open {
        url: redact_url(url),
        message: "the server did not say how large the object is (no Content-Range)".into(),
    };
    let seen = match locate(url)? {
        Location::Local(path) => open_local_version(url, path, expected).map(|(_, seen)| seen),
        Location::Http => {
            Ok(
                http::HttpReader::open_expecting(url, None, 0, Some(1), expected, opts, stats)?
                    .seen_version(),
            )
        }
        Location::S3 => {
            let signer = opts.signer.as_ref().ok_or_else(|| SourceError::BadUrl {
                url: redact_url(url),
                message: "s3:// URLs need S3 options (shardstream.expand_urls gives them)".into(),
            })?;
            let signed = (signer.0)(url).map_err(|message| SourceError::Unsigned {
                url: redact_url(url),
                message,
            })?;
            let opts = &SourceOptions {
                headers: RequestHeaders(signed.headers),
                ..opts.clone()
            };
            http::HttpReader::open_expecting(&signed.url, None, 0, Some(1), expected, opts, stats)
                .map_err(|e| e.naming(url))
                .map(|reader| reader.seen_version())
        }
    };
    let version = seen?;
    match version.size {
        Some(_) => Ok(version),
        None => Err(unknown()),
    }
}

/// Opens bytes `start..end` of `url` (`end = None`: to the end of the object). Knowing the end
/// lets an HTTP source ask for exactly that span instead of the rest of a large shard.
pub fn open_range(
    url: &str,
    start: u64,
    end: Option<u64>,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    match locate(url)? {
        Location::Local(path) => open_local(url, path, start, end, stats),
        Location::S3 => open_s3(url, start, end, opts, stats),
        Location::Http => open_http(url, start, end, &Expected::default(), opts, stats),
    }
}

/// [`open_range`], refusing a version of the object other than `expected`, the one an earlier
/// read of it saw (a local file by its size; HTTP and S3 by `If-Match` and the size the server
/// reports).
pub fn open_range_expecting(
    url: &str,
    start: u64,
    end: Option<u64>,
    expected: &Expected,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    open_range_checked(url, start, end, expected, false, opts, stats)
}

/// Both of the above: `indexed` says whether `expected` is an index's record (the error then
/// tells the user to index again) or what this process saw when it first opened the object.
fn open_range_checked(
    url: &str,
    start: u64,
    end: Option<u64>,
    expected: &Expected,
    indexed: bool,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    if expected.is_empty() {
        return open_range(url, start, end, opts, stats);
    }
    match locate(url)? {
        Location::Local(path) => {
            if let (Some(size), Ok(meta)) = (expected.size, std::fs::metadata(path)) {
                if meta.len() != size {
                    return Err(size_changed(url, meta.len(), size, start, indexed));
                }
            }
            open_range(url, start, end, opts, stats)
        }
        Location::S3 => open_s3_expecting(url, start, end, expected, opts, stats),
        Location::Http => open_http(url, start, end, expected, opts, stats),
    }
}

/// A local file of `len` bytes where `size` were expected.
fn size_changed(url: &str, len: u64, size: u64, offset: u64, indexed: bool) -> SourceError {
    let message = if indexed {
        format!(
            "it has {len} bytes, the index recorded {size}: the shard was replaced since it was \
             indexed; index it again"
        )
    } else {
        format!("it has {len} bytes, {size} when it was first opened: the shard was replaced")
    };
    SourceError::Changed {
        url: redact_url(url),
        offset,
        message,
    }
}

/// Opens an `s3://` object through a URL the signer presigns now; every reconnection of the
/// stream asks the signer again (the on-disk cache keeps the first: it downloads at once).
fn open_s3(
    url: &str,
    start: u64,
    end: Option<u64>,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    open_s3_expecting(url, start, end, &Expected::default(), opts, stats)
}

fn open_s3_expecting(
    url: &str,
    start: u64,
    end: Option<u64>,
    expected: &Expected,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    let Some(signer) = &opts.signer else {
        return Err(SourceError::BadUrl {
            url: redact_url(url),
            message: "s3:// and hf:// URLs need a signer (shardstream.expand_urls gives one)"
                .into(),
        });
    };
    let sign = {
        let (signer, url) = (signer.clone(), url.to_string());
        move || match (signer.0)(&url) {
            Ok(signed) if matches!(locate(&signed.url), Ok(Location::Http)) => Ok(signed),
            Ok(signed) => Err(format!(
                "the signer gave {}, not an HTTP(S) URL",
                redact_url(&signed.url)
            )),
            Err(message) => Err(message),
        }
    };
    let signed = sign().map_err(|message| SourceError::Unsigned {
        url: redact_url(url),
        message,
    })?;
    // The headers of the first answer serve every reconnection of this stream (a token does
    // not change within one shard's read; a presigned URL does, and is asked for again).
    let opts = &SourceOptions {
        headers: RequestHeaders(signed.headers),
        ..opts.clone()
    };
    let signed = signed.url;
    if opts.cache.is_some() {
        return open_http(&signed, start, end, expected, opts, stats).map_err(|e| e.naming(url));
    }
    let resign = move || sign().map(|s| s.url);
    let reader = http::HttpReader::open_expecting(
        &signed,
        Some(Box::new(resign)),
        start,
        end,
        expected,
        opts,
        stats,
    )
    .map_err(|e| e.naming(url))?;
    Ok(buffered(reader, stats))
}

/// An HTTP stream read in large buffered chunks, its bytes counted.
pub(crate) fn buffered(reader: http::HttpReader, stats: &Arc<SourceStats>) -> Box<dyn Read + Send> {
    Box::new(CountingReader::new(
        io::BufReader::with_capacity(READ_BUFFER_BYTES, reader),
        stats,
    ))
}

fn open_local(
    url: &str,
    path: &str,
    start: u64,
    end: Option<u64>,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    open_file_at(url, open_local_file(url, path)?, start, end, stats)
}

/// The path of a local URL (a plain path or `file://`); None for HTTP, S3 and `hf://`.
pub fn local_path(url: &str) -> Option<&str> {
    match locate(url) {
        Ok(Location::Local(path)) => Some(path),
        _ => None,
    }
}

/// The local file at `path` opened, with its version (the size of what was opened), refused
/// when `expected` recorded another size.
pub fn open_local_version(
    url: &str,
    path: &str,
    expected: &Expected,
) -> Result<(File, Expected), SourceError> {
    let file = open_local_file(url, path)?;
    let len = file
        .metadata()
        .map_err(|e| SourceError::Open {
            url: redact_url(url),
            message: e.to_string(),
        })?
        .len();
    match expected.size {
        Some(size) if size != len => Err(size_changed(url, len, size, 0, true)),
        _ => Ok((
            file,
            Expected {
                size: Some(len),
                etag: None,
            },
        )),
    }
}

/// Opens the local file at `path`, its errors naming `url`.
pub fn open_local_file(url: &str, path: &str) -> Result<File, SourceError> {
    File::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SourceError::NotFound {
            url: redact_url(url),
        },
        _ => SourceError::Open {
            url: redact_url(url),
            message: e.to_string(),
        },
    })
}

/// Seeks `file` to `start` and bounds it at `end`; shared by local files and cached shards.
pub(crate) fn open_file_at(
    url: &str,
    mut file: File,
    start: u64,
    end: Option<u64>,
    stats: &Arc<SourceStats>,
) -> Result<Box<dyn Read + Send>, SourceError> {
    if start > 0 {
        file.seek(SeekFrom::Start(start))
            .map_err(|e| SourceError::Open {
                url: redact_url(url),
                message: e.to_string(),
            })?;
    }
    // Unbuffered: the shard reader above buffers once; a second buffer here only copied.
    Ok(match end {
        Some(end) => Box::new(CountingReader::new(
            file.take(end.saturating_sub(start)),
            stats,
        )),
        None => Box::new(CountingReader::new(file, stats)),
    })
}

#[cfg(test)]
mod tests;
