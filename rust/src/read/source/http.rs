//! HTTP(S) byte stream that survives network faults.
//!
//! One `HttpReader` delivers bytes `start..end` of one object, in order, exactly once:
//! - every attempt has a connect timeout and a per-read timeout (a stall breaks the stream);
//! - resets, timeouts, short bodies, 408/429/5xx (S3 `503 SlowDown`) are retried with
//!   exponential backoff and jitter; a `Retry-After` is waited in full plus jitter (counted as
//!   `throttled`), and one over `retry_after_max` fails the read at once (`Throttled`);
//! - a broken body is resumed with `Range: bytes=<next byte>-` and `If-Match: <ETag>` (or
//!   `If-Unmodified-Since`), and the answer is checked (status 206, `Content-Range` start,
//!   ETag, Last-Modified, total size) so bytes of a replaced object are never spliced in;
//! - a server that ignores Range (200) is followed by discarding the bytes already delivered;
//! - 401/403/404/412 and other client errors are final at once: retrying cannot fix them.
//!
//! The retry budget counts consecutive attempts without progress, so a long shard on a flaky
//! link keeps going while a dead server is given up on after `max_retries` attempts.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ureq::config::RedirectAuthHeaders;
use ureq::http::{HeaderMap, Response, StatusCode};
use ureq::tls::{parse_pem, Certificate, PemItem, RootCerts, TlsConfig};
use ureq::{Agent, Body, BodyReader};

use super::backoff::{Backoff, BackoffRule, Wait};
use super::{redact_url, scrub, Expected, SourceError, SourceOptions, SourceStats};

/// Size of ureq's socket read buffer: large reads keep syscall overhead per byte small.
const SOCKET_BUFFER_BYTES: usize = 512 * 1024;
/// Bytes discarded per read when a server ignored our Range header.
const DISCARD_CHUNK: usize = 256 * 1024;

/// Agents are shared per configuration so connections are pooled across shards (keep-alive
/// matters for S3, where a TLS handshake per shard would dominate small shards).
fn agent_for(opts: &SourceOptions, shown_url: &str) -> Result<Agent, SourceError> {
    type Key = (Duration, Duration, Option<PathBuf>);
    static AGENTS: OnceLock<Mutex<HashMap<Key, Agent>>> = OnceLock::new();
    let key = (
        opts.connect_timeout,
        opts.read_timeout,
        opts.ca_bundle.clone(),
    );
    let mut agents = AGENTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(agent) = agents.get(&key) {
        return Ok(agent.clone());
    }
    let mut config = Agent::config_builder()
        .http_status_as_error(false)
        .timeout_resolve(Some(opts.connect_timeout))
        .timeout_connect(Some(opts.connect_timeout))
        .timeout_send_request(Some(opts.read_timeout))
        .timeout_recv_response(Some(opts.read_timeout))
        .timeout_per_read(Some(opts.read_timeout))
        .timeout_per_write(Some(opts.read_timeout))
        .input_buffer_size(SOCKET_BUFFER_BYTES)
        .max_redirects(5)
        // A Hub token must not follow a redirect to the storage host (another domain). ureq's
        // default is the same today; stated here so that a new default cannot leak it.
        .redirect_auth_headers(RedirectAuthHeaders::Never)
        .user_agent(concat!("shardstream/", env!("CARGO_PKG_VERSION")));
    if let Some(bundle) = &opts.ca_bundle {
        let roots = load_roots(bundle).map_err(|message| SourceError::Open {
            url: shown_url.to_string(),
            message: format!("CA bundle {}: {message}", bundle.display()),
        })?;
        config = config.tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&roots))
                .build(),
        );
    }
    let agent = Agent::new_with_config(config.build());
    agents.insert(key, agent.clone());
    Ok(agent)
}

/// The certificates of a PEM file (other PEM items are ignored).
fn load_roots(path: &Path) -> Result<Vec<Certificate<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut roots = Vec::new();
    for item in parse_pem(&pem) {
        if let PemItem::Certificate(cert) = item.map_err(|e| e.to_string())? {
            roots.push(cert);
        }
    }
    if roots.is_empty() {
        return Err("no certificate in the file".into());
    }
    Ok(roots)
}

/// What identifies one version of the object, taken from the first response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Version {
    etag: Option<String>,
    last_modified: Option<String>,
    total: Option<u64>,
}

/// Why an attempt failed.
enum Failure {
    /// Worth another attempt (after a backoff delay, possibly the server's `Retry-After`).
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help.
    Fatal(SourceError),
}

fn transient(message: impl Into<String>) -> Failure {
    Failure::Transient {
        message: message.into(),
        retry_after: None,
    }
}

/// Makes a fresh presigned URL for the same object (S3): each reconnection asks for one, so a
/// resume long after the first request is not refused for an expired signature.
pub type Resign = Box<dyn Fn() -> Result<String, String> + Send>;

pub struct HttpReader {
    /// The version to compare responses with came from the index, and no response has been
    /// accepted yet (a mismatch then means the shard changed since indexing).
    version_from_index: bool,
    agent: Agent,
    /// The full URL: may hold a signature, never printed (use `shown`).
    url: String,
    resign: Option<Resign>,
    /// Sent with every request of this stream (values are secrets: never printed).
    headers: Vec<(String, String)>,
    shown: String,
    /// Absolute offset of the next byte to hand to the caller.
    pos: u64,
    /// Exclusive end of what the caller asked for, if known.
    end: Option<u64>,
    version: Option<Version>,
    body: Option<BodyReader<'static>>,
    /// Bytes still to discard from the current body (the server ignored our Range).
    skip: u64,
    done: bool,
    /// Consecutive failed attempts without progress.
    failures: u32,
    max_retries: u32,
    backoff: Backoff,
    stats: Arc<SourceStats>,
}

impl HttpReader {
    /// Makes the first request at once (retrying transient failures), so that a missing
    /// object or a credentials problem is reported by `open`, not by the first `read`.
    pub fn open(
        url: &str,
        start: u64,
        end: Option<u64>,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, SourceError> {
        Self::open_signed(url, None, start, end, opts, stats)
    }

    /// [`open`](Self::open) for a presigned `url`; every later connection uses `resign()`.
    pub fn open_signed(
        url: &str,
        resign: Option<Resign>,
        start: u64,
        end: Option<u64>,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, SourceError> {
        Self::open_expecting(url, resign, start, end, &Expected::default(), opts, stats)
    }

    /// [`open_signed`](Self::open_signed), refusing any version of the object but `expected`:
    /// its ETag goes out as `If-Match` from the first request on, and the first response's size
    /// and ETag are compared with it as every later response's are with the first.
    pub fn open_expecting(
        url: &str,
        resign: Option<Resign>,
        start: u64,
        end: Option<u64>,
        expected: &Expected,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, SourceError> {
        let shown = redact_url(url);
        let mut reader = HttpReader {
            agent: agent_for(opts, &shown)?,
            url: url.to_string(),
            resign,
            headers: opts.headers.0.clone(),
            shown,
            pos: start,
            end,
            version: (!expected.is_empty()).then(|| Version {
                etag: expected.etag.clone(),
                last_modified: None,
                total: expected.size,
            }),
            version_from_index: !expected.is_empty(),
            body: None,
            skip: 0,
            done: end.is_some_and(|e| e <= start),
            failures: 0,
            max_retries: opts.max_retries,
            backoff: Backoff::new(BackoffRule {
                initial: opts.backoff_initial,
                max: opts.backoff_max,
                retry_after_max: opts.retry_after_max,
            }),
            stats: stats.clone(),
        };
        if !reader.done {
            reader.connect_with_retries()?;
        }
        Ok(reader)
    }

    /// Size of the whole object, when the server told us.
    pub fn total_size(&self) -> Option<u64> {
        self.version.as_ref().and_then(|v| v.total)
    }

    /// The version the server answered with, as later range reads of it must expect: its size
    /// and strong ETag (a weak one cannot go out as `If-Match`).
    pub fn seen_version(&self) -> Expected {
        let version = self.version.as_ref();
        Expected {
            size: version.and_then(|v| v.total),
            etag: version
                .and_then(|v| v.etag.clone())
                .filter(|etag| !etag.starts_with("W/")),
        }
    }

    fn connect_with_retries(&mut self) -> Result<(), SourceError> {
        loop {
            match self.connect() {
                Ok(()) => return Ok(()),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Transient {
                    message,
                    retry_after,
                }) => self.wait_or_give_up(message, retry_after)?,
            }
        }
    }

    /// Counts a failed attempt; sleeps before the next one, or gives up when the budget is spent.
    fn wait_or_give_up(
        &mut self,
        message: String,
        retry_after: Option<Duration>,
    ) -> Result<(), SourceError> {
        self.failures += 1;
        if self.failures > self.max_retries {
            return Err(SourceError::Unavailable {
                url: self.shown.clone(),
                offset: self.pos,
                attempts: self.failures,
                message,
            });
        }
        let delay = match self.backoff.delay(self.failures, retry_after) {
            Wait::Sleep(delay) => delay,
            // Waiting for hours would look like a hung job; retrying earlier than told would
            // be refused again (and may prolong the ban): fail now, saying what the server asked.
            Wait::TooLong(asked) => {
                return Err(SourceError::Throttled {
                    url: self.shown.clone(),
                    offset: self.pos,
                    retry_after_secs: asked.as_secs(),
                    max_secs: self.backoff.retry_after_max().as_secs(),
                    message,
                })
            }
        };
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        if retry_after.is_some() {
            self.stats.throttled.fetch_add(1, Ordering::Relaxed);
        }
        if self.version.is_some() {
            self.stats.resumes.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(delay);
        Ok(())
    }

    fn connect(&mut self) -> Result<(), Failure> {
        self.body = None;
        self.skip = 0;
        if let (Some(_), Some(resign)) = (&self.version, &self.resign) {
            self.url = resign().map_err(|message| {
                Failure::Fatal(SourceError::Unsigned {
                    url: self.shown.clone(),
                    message,
                })
            })?;
        }
        let mut request = self.agent.get(&self.url);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let ranged = self.pos > 0 || self.end.is_some();
        if ranged {
            let range = match self.end {
                Some(end) => format!("bytes={}-{}", self.pos, end - 1),
                None => format!("bytes={}-", self.pos),
            };
            request = request.header("Range", range);
        }
        if let Some(version) = &self.version {
            match (&version.etag, &version.last_modified) {
                (Some(etag), _) if !etag.starts_with("W/") => {
                    request = request.header("If-Match", etag)
                }
                (_, Some(modified)) => request = request.header("If-Unmodified-Since", modified),
                _ => {}
            }
        }
        let response = request.call().map_err(|e| self.classify_call_error(e))?;
        self.accept(response)
    }

    fn classify_call_error(&self, e: ureq::Error) -> Failure {
        let message = scrub(&e.to_string(), &self.url);
        match e {
            // rustls reports certificate and handshake failures as InvalidData: retrying the
            // same handshake cannot succeed.
            ureq::Error::Io(ref io) if io.kind() == io::ErrorKind::InvalidData => {
                Failure::Fatal(SourceError::Open {
                    url: self.shown.clone(),
                    message: format!("TLS: {message}"),
                })
            }
            ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_) => transient(message),
            _ => Failure::Fatal(SourceError::Open {
                url: self.shown.clone(),
                message,
            }),
        }
    }

    /// Checks a response against what we asked for and what we saw before; keeps its body.
    fn accept(&mut self, response: Response<Body>) -> Result<(), Failure> {
        let status = response.status();
        let headers = response.headers();
        match status.as_u16() {
            200 | 206 => {}
            416 => return self.accept_unsatisfiable_range(headers),
            401 | 403 => {
                return Err(Failure::Fatal(SourceError::Denied {
                    url: self.shown.clone(),
                    status: status.as_u16(),
                }))
            }
            404 | 410 => {
                return Err(Failure::Fatal(SourceError::NotFound {
                    url: self.shown.clone(),
                }))
            }
            412 => return Err(self.changed("the server says the ETag no longer matches (412)")),
            408 | 429 | 500..=599 => {
                let retry_after = retry_after(headers);
                return Err(Failure::Transient {
                    message: format!("HTTP {}{}", status.as_u16(), s3_error_code(response)),
                    retry_after,
                });
            }
            other => {
                return Err(Failure::Fatal(SourceError::Open {
                    url: self.shown.clone(),
                    message: format!("unexpected HTTP status {other}"),
                }))
            }
        }
        let seen = Version {
            etag: header(headers, "etag"),
            last_modified: header(headers, "last-modified"),
            total: None,
        };
        let content_length = header(headers, "content-length").and_then(|v| v.parse::<u64>().ok());
        let (body_start, total) = if status == StatusCode::PARTIAL_CONTENT {
            let Some((first, total)) = header(headers, "content-range")
                .as_deref()
                .and_then(parse_content_range)
            else {
                return Err(transient("206 without a valid Content-Range"));
            };
            (first, total)
        } else {
            // 200: the whole object, whether or not we sent a Range.
            (0, content_length)
        };
        if status == StatusCode::PARTIAL_CONTENT && body_start != self.pos {
            return Err(transient(format!(
                "asked for byte {} but the server sent from {body_start}",
                self.pos
            )));
        }
        let seen = Version { total, ..seen };
        match &self.version {
            None => self.version = Some(seen),
            Some(before) => {
                if before.etag.is_some() && seen.etag.is_some() && before.etag != seen.etag {
                    return Err(self.changed("ETag differs from the first response"));
                }
                if before.last_modified.is_some()
                    && seen.last_modified.is_some()
                    && before.last_modified != seen.last_modified
                {
                    return Err(self.changed("Last-Modified differs from the first response"));
                }
                if before.total.is_some() && seen.total.is_some() && before.total != seen.total {
                    return Err(self.changed("object size differs from the first response"));
                }
                // What the index did not record is taken from the server, so later resumes
                // of this stream are as well guarded as without an expected version.
                let merged = Version {
                    etag: before.etag.clone().or(seen.etag),
                    last_modified: before.last_modified.clone().or(seen.last_modified),
                    total: before.total.or(seen.total),
                };
                self.version = Some(merged);
            }
        }
        self.version_from_index = false;
        self.skip = self.pos - body_start.min(self.pos);
        self.body = Some(response.into_body().into_reader());
        Ok(())
    }

    /// 416: fine when we asked at (or past) the end of the object: there is nothing to read.
    fn accept_unsatisfiable_range(&mut self, headers: &HeaderMap) -> Result<(), Failure> {
        let total = header(headers, "content-range").and_then(|v| {
            v.strip_prefix("bytes */")
                .and_then(|n| n.trim().parse::<u64>().ok())
        });
        match total {
            Some(total) if self.pos >= total => {
                if self.version.is_none() {
                    self.version = Some(Version {
                        total: Some(total),
                        ..Version::default()
                    });
                }
                self.done = true;
                Ok(())
            }
            _ => Err(Failure::Fatal(SourceError::Open {
                url: self.shown.clone(),
                message: format!(
                    "range starting at byte {} not satisfiable (HTTP 416)",
                    self.pos
                ),
            })),
        }
    }

    fn changed(&self, message: &str) -> Failure {
        let message = if self.version_from_index {
            format!(
                "{message} (compared with the version the index recorded: the shard was replaced \
                 since it was indexed; index it again)"
            )
        } else {
            message.to_string()
        };
        Failure::Fatal(SourceError::Changed {
            url: self.shown.clone(),
            offset: self.pos,
            message,
        })
    }

    /// Where the current body should end, to tell a short body from a complete one.
    fn expected_end(&self) -> Option<u64> {
        let total = self.total_size();
        match (self.end, total) {
            (Some(end), Some(total)) => Some(end.min(total)),
            (Some(end), None) => Some(end),
            (None, total) => total,
        }
    }

    /// One read from the current body: `Ok(Some(n))` delivered bytes, `Ok(None)` clean end.
    fn read_body(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Failure> {
        let body = self.body.as_mut().expect("connected");
        while self.skip > 0 {
            let mut scratch = vec![0u8; DISCARD_CHUNK.min(self.skip as usize)];
            match body.read(&mut scratch) {
                Ok(0) => return Err(transient("body ended before the resume offset")),
                Ok(n) => self.skip -= n as u64,
                Err(e) => return Err(transient(scrub(&e.to_string(), &self.url))),
            }
        }
        let want = match self.end {
            Some(end) => buf.len().min((end - self.pos) as usize),
            None => buf.len(),
        };
        match body.read(&mut buf[..want]) {
            Ok(0) => match self.expected_end() {
                Some(expected) if self.pos < expected => Err(transient(format!(
                    "body ended at byte {} of {expected}",
                    self.pos
                ))),
                _ => Ok(None),
            },
            Ok(n) => Ok(Some(n)),
            Err(e) => Err(transient(scrub(&e.to_string(), &self.url))),
        }
    }
}

impl Read for HttpReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.done || self.end.is_some_and(|end| self.pos >= end) {
                self.body = None;
                return Ok(0);
            }
            if self.body.is_none() {
                self.connect_with_retries().map_err(SourceError::into_io)?;
                continue;
            }
            match self.read_body(buf) {
                Ok(Some(n)) => {
                    self.pos += n as u64;
                    self.failures = 0;
                    return Ok(n);
                }
                Ok(None) => {
                    self.done = true;
                }
                Err(Failure::Fatal(e)) => return Err(e.into_io()),
                Err(Failure::Transient {
                    message,
                    retry_after,
                }) => {
                    self.body = None;
                    self.wait_or_give_up(message, retry_after)
                        .map_err(SourceError::into_io)?;
                }
            }
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
}

/// `bytes 100-199/1000` -> (100, Some(1000)); `bytes 100-199/*` -> (100, None).
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let spec = value.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = spec.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last: u64 = last.trim().parse().ok()?;
    if last < first {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        n => Some(n.parse().ok()?),
    };
    Some((first, total))
}

/// The wait a 429/503's `Retry-After` asks for: seconds, or an HTTP-date measured from now.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    header(headers, "retry-after")
        .and_then(|v| super::retry_after::parse_retry_after(&v, std::time::SystemTime::now()))
}

/// For S3-style XML errors, `" (SlowDown)"`: makes throttling visible in the final message.
fn s3_error_code(response: Response<Body>) -> String {
    let mut text = String::new();
    let _ = response
        .into_body()
        .into_reader()
        .take(4096)
        .read_to_string(&mut text);
    match (text.find("<Code>"), text.find("</Code>")) {
        (Some(a), Some(b)) if a + 6 < b => format!(" ({})", &text[a + 6..b]),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testserver::{Fault, TestServer};
    use super::*;

    fn object(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn quick_opts() -> SourceOptions {
        SourceOptions {
            connect_timeout: Duration::from_millis(500),
            read_timeout: Duration::from_millis(300),
            max_retries: 4,
            backoff_initial: Duration::from_millis(5),
            backoff_max: Duration::from_millis(50),
            retry_after_max: Duration::from_secs(2),
            cache: None,
            ca_bundle: None,
            signer: None,
            headers: Default::default(),
        }
    }

    fn read_all(
        url: &str,
        start: u64,
        end: Option<u64>,
        opts: &SourceOptions,
    ) -> (io::Result<Vec<u8>>, Arc<SourceStats>) {
        let stats = Arc::new(SourceStats::default());
        let result = HttpReader::open(url, start, end, opts, &stats)
            .map_err(SourceError::into_io)
            .and_then(|mut r| {
                let mut out = Vec::new();
                // Small reads, as a tar parser does, so faults land in the middle of many reads.
                let mut buf = vec![0u8; 7000];
                loop {
                    let n = r.read(&mut buf)?;
                    if n == 0 {
                        return Ok(out);
                    }
                    out.extend_from_slice(&buf[..n]);
                }
            });
        (result, stats)
    }

    #[test]
    fn content_range_parsing() {
        assert_eq!(
            parse_content_range("bytes 100-199/1000"),
            Some((100, Some(1000)))
        );
        assert_eq!(parse_content_range("bytes 5-5/*"), Some((5, None)));
        assert_eq!(parse_content_range("bytes 9-3/10"), None);
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }

    #[test]
    fn reads_whole_object_and_ranges() {
        let data = object(300_000);
        let server = TestServer::start(data.clone(), vec![]);
        let opts = quick_opts();
        assert_eq!(
            read_all(&server.url("/a.tar"), 0, None, &opts).0.unwrap(),
            data
        );
        assert_eq!(
            read_all(&server.url("/a.tar"), 1234, None, &opts)
                .0
                .unwrap(),
            &data[1234..]
        );
        assert_eq!(
            read_all(&server.url("/a.tar"), 1000, Some(5000), &opts)
                .0
                .unwrap(),
            &data[1000..5000]
        );
        assert_eq!(
            read_all(&server.url("/a.tar"), 300_000, None, &opts)
                .0
                .unwrap(),
            b""
        );
    }

    #[test]
    fn resumes_after_resets_short_bodies_and_stalls_at_the_exact_byte() {
        let data = object(1_000_000);
        let faults = vec![
            Fault::CloseAfter(100_003),
            Fault::Status(503),
            Fault::CloseAfter(50_000),
            Fault::StallAfter(20_000, Duration::from_secs(3)),
        ];
        let server = TestServer::start(data.clone(), faults);
        let (got, stats) = read_all(
            &server.url("/a.tar?X-Amz-Signature=secret"),
            0,
            None,
            &quick_opts(),
        );
        assert_eq!(got.unwrap(), data);
        assert_eq!(stats.retries.load(Ordering::Relaxed), 4);
        let requests = server.requests();
        assert_eq!(requests.len(), 5);
        assert_eq!(requests[0].range, None);
        // Each resume asks for the first byte not yet delivered, and pins the version.
        assert_eq!(requests[1].range.as_deref(), Some("bytes=100003-"));
        assert_eq!(requests[2].range.as_deref(), Some("bytes=100003-"));
        assert_eq!(requests[3].range.as_deref(), Some("bytes=150003-"));
        assert_eq!(requests[4].range.as_deref(), Some("bytes=170003-"));
        assert!(requests[1..]
            .iter()
            .all(|r| r.if_match.as_deref() == Some(TestServer::ETAG)));
    }

    #[test]
    fn follows_a_server_that_ignores_range() {
        let data = object(400_000);
        let server = TestServer::start(
            data.clone(),
            vec![Fault::CloseAfter(123_457), Fault::IgnoreRange],
        );
        assert_eq!(
            read_all(&server.url("/a.tar"), 0, None, &quick_opts())
                .0
                .unwrap(),
            data
        );
    }

    #[test]
    fn object_replaced_mid_stream_is_an_error_not_a_splice() {
        let data = object(200_000);
        let server = TestServer::start(data, vec![Fault::CloseAfter(60_000), Fault::ChangeEtag]);
        let err = read_all(&server.url("/a.tar?sig=s3cr3t"), 0, None, &quick_opts())
            .0
            .unwrap_err();
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<SourceError>());
        assert!(
            matches!(inner, Some(SourceError::Changed { offset: 60_000, .. })),
            "{err}"
        );
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
    }

    #[test]
    fn denied_and_missing_fail_at_once_without_retries() {
        let server = TestServer::start(object(10), vec![Fault::Status(403), Fault::Status(404)]);
        let stats = Arc::new(SourceStats::default());
        let url = server.url("/a.tar?X-Amz-Signature=topsecret");
        let err = HttpReader::open(&url, 0, None, &quick_opts(), &stats)
            .err()
            .unwrap();
        assert!(
            matches!(err, SourceError::Denied { status: 403, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("/a.tar?<redacted>") && !err.to_string().contains("topsecret")
        );
        let err = HttpReader::open(&url, 0, None, &quick_opts(), &stats)
            .err()
            .unwrap();
        assert!(matches!(err, SourceError::NotFound { .. }), "{err}");
        assert_eq!(stats.retries.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn gives_up_after_the_retry_budget_with_a_clear_error() {
        let server = TestServer::start(object(10), vec![Fault::Status(503); 10]);
        let opts = quick_opts();
        let stats = Arc::new(SourceStats::default());
        let started = std::time::Instant::now();
        let err = HttpReader::open(&server.url("/a.tar?sig=x"), 0, None, &opts, &stats)
            .err()
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        match &err {
            SourceError::Unavailable {
                attempts,
                message,
                url,
                ..
            } => {
                assert_eq!(*attempts, opts.max_retries + 1);
                assert!(
                    message.contains("503") && message.contains("SlowDown"),
                    "{message}"
                );
                assert_eq!(url, &format!("{}?<redacted>", server.url("/a.tar")));
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(
            stats.retries.load(Ordering::Relaxed),
            opts.max_retries as u64
        );
    }

    #[test]
    fn connection_refused_is_retried_then_reported() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let opts = SourceOptions {
            max_retries: 2,
            ..quick_opts()
        };
        let stats = Arc::new(SourceStats::default());
        let err = HttpReader::open(
            &format!("http://127.0.0.1:{port}/x.tar"),
            0,
            None,
            &opts,
            &stats,
        )
        .err()
        .unwrap();
        assert!(
            matches!(err, SourceError::Unavailable { attempts: 3, .. }),
            "{err}"
        );
    }
}
