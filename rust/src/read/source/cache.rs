//! On-disk shard cache shared by all processes of one machine (the local ranks of a job).
//!
//! - One file per remote object, named by a hash of the URL without its query string (presigned
//!   URLs are re-signed every run; the object they point to is the same).
//! - Filling is serialised per object with an exclusive file lock (`flock`, released by the
//!   kernel if the process dies): when 8 ranks ask for the same shard at once, one downloads it
//!   and the others wait, then read the finished file.
//! - A download is written to a temporary name and renamed into place only when complete, so a
//!   reader never sees a partial shard, even after a crash.
//! - The total size is bounded: after each fill, least recently used shards (by mtime, refreshed
//!   on every hit) are removed until the cache fits. Unlinking a shard another process is still
//!   reading is safe on Unix: its open descriptor keeps the data alive.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use super::http::HttpReader;
use super::{
    open_file_at, redact_url, CacheOptions, Expected, SourceError, SourceOptions, SourceStats,
};
use crate::rng::hash_bytes;

const SHARD_SUFFIX: &str = ".cached";

pub struct ShardCache {
    opts: CacheOptions,
}

/// What identifies the object: the URL without credentials, fragment and the query parameters
/// of a presigned URL (they change every time it is signed); other query parameters may select
/// the object, so they stay (sorted). Only ever hashed, never shown.
fn object_identity(url: &str) -> String {
    let without_fragment = url.split('#').next().unwrap_or(url);
    let (base, query) = without_fragment
        .split_once('?')
        .unwrap_or((without_fragment, ""));
    let mut kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !is_signing_param(p))
        .collect();
    kept.sort_unstable();
    let base = redact_url(base);
    if kept.is_empty() {
        base
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// Query parameters added by URL signing (AWS SigV2/SigV4, GCS V4, boto3's `x-id`).
fn is_signing_param(param: &str) -> bool {
    let name = param
        .split('=')
        .next()
        .unwrap_or(param)
        .to_ascii_lowercase();
    name.starts_with("x-amz-")
        || name.starts_with("x-goog-")
        || matches!(
            name.as_str(),
            "awsaccesskeyid" | "signature" | "expires" | "x-id"
        )
}

/// `<32 hex digits>.<last path component, sanitised>`: unique, and readable in `ls`.
fn cache_stem(url: &str) -> String {
    let identity = object_identity(url);
    let h1 = hash_bytes(identity.as_bytes());
    let h2 = hash_bytes(format!("shardstream-cache\0{identity}").as_bytes());
    // Readable part: the last path component only (a query may hold a token).
    let path = redact_url(url.split(['?', '#']).next().unwrap_or(url));
    let name: String = path
        .rsplit('/')
        .next()
        .unwrap_or("")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    format!("{h1:016x}{h2:016x}.{name}")
}

/// Why filling the cache failed: the source (final, reported as it is), or the cache directory
/// (full, read-only, not creatable: the shard is then read without the cache).
enum FillError {
    Source(SourceError),
    Cache(&'static str, io::Error),
}

impl From<SourceError> for FillError {
    fn from(e: SourceError) -> Self {
        FillError::Source(e)
    }
}

fn cache_failure(what: &'static str) -> impl FnOnce(io::Error) -> FillError {
    move |e| FillError::Cache(what, e)
}

/// Says once per process and cache directory that it cannot be used (a full disk fails every
/// shard the same way: one line, not one per shard).
fn warn_cache_unusable(dir: &Path, what: &str, e: &io::Error, url: &str) {
    static WARNED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let mut warned = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if warned.insert(dir.to_path_buf()) {
        eprintln!(
            "shardstream: shard cache {}: {what}: {e}; reading {} and later shards without the \
             cache while it fails (said once per cache directory)",
            dir.display(),
            redact_url(url)
        );
    }
}

impl ShardCache {
    pub fn new(opts: CacheOptions) -> Self {
        Self { opts }
    }

    /// Path of the cached copy of `url` (whether or not it exists).
    pub fn path_for(&self, url: &str) -> PathBuf {
        self.opts
            .dir
            .join(format!("{}{SHARD_SUFFIX}", cache_stem(url)))
    }

    /// Bytes `start..end` of `url`, from the cache, filling it first if needed. A cached copy
    /// of another size than `expected` is not served (it is another version than the index
    /// describes), and a download must match `expected` (If-Match, size). When the cache
    /// directory cannot be used, the bytes come straight from the source, and a warning
    /// names the directory once.
    pub fn open(
        &self,
        url: &str,
        start: u64,
        end: Option<u64>,
        expected: &Expected,
        source_opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Box<dyn Read + Send>, SourceError> {
        let path = self.path_for(url);
        if let Some(file) = open_and_touch(&path, expected) {
            stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return open_file_at(url, file, start, end, stats);
        }
        match self.open_filling(url, &path, start, end, expected, source_opts, stats) {
            Ok(reader) => Ok(reader),
            Err(FillError::Source(e)) => Err(e),
            Err(FillError::Cache(what, e)) => {
                stats.cache_errors.fetch_add(1, Ordering::Relaxed);
                warn_cache_unusable(&self.opts.dir, what, &e, url);
                let reader = HttpReader::open_expecting(
                    url,
                    None,
                    start,
                    end,
                    expected,
                    source_opts,
                    stats,
                )?;
                Ok(super::buffered(reader, stats))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn open_filling(
        &self,
        url: &str,
        path: &Path,
        start: u64,
        end: Option<u64>,
        expected: &Expected,
        source_opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Box<dyn Read + Send>, FillError> {
        fs::create_dir_all(&self.opts.dir)
            .map_err(cache_failure("cannot create the cache directory"))?;
        let stem = cache_stem(url);
        let lock = lock_exclusive(&self.opts.dir.join(format!("{stem}.lock")))
            .map_err(cache_failure("cannot lock"))?;
        // Someone else may have filled it while we waited for the lock.
        if let Some(file) = open_and_touch(path, expected) {
            drop(lock);
            stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(open_file_at(url, file, start, end, stats)?);
        }
        if path.exists() {
            // Another version than the index describes: it must not be served, or kept.
            fs::remove_file(path).map_err(cache_failure("cannot remove a stale copy"))?;
        }
        stats.cache_misses.fetch_add(1, Ordering::Relaxed);
        let mut source =
            HttpReader::open_expecting(url, None, 0, None, expected, source_opts, stats)?;
        if source
            .total_size()
            .is_none_or(|size| size > self.opts.max_bytes)
        {
            // Larger than the whole cache (or of unknown size): stream it without caching.
            drop(source);
            drop(lock);
            let reader =
                HttpReader::open_expecting(url, None, start, end, expected, source_opts, stats)?;
            return Ok(super::buffered(reader, stats));
        }
        self.fill(url, &stem, path, &mut source)?;
        drop(source);
        self.evict(path);
        let file = File::open(path).map_err(cache_failure("cannot reopen the filled shard"))?;
        drop(lock);
        Ok(open_file_at(url, file, start, end, stats)?)
    }

    /// Downloads into a temporary file and renames it into place once complete.
    fn fill(
        &self,
        url: &str,
        stem: &str,
        path: &Path,
        source: &mut HttpReader,
    ) -> Result<(), FillError> {
        remove_stale_parts(&self.opts.dir, stem);
        static FILL_COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = self.opts.dir.join(format!(
            "{stem}.part-{}-{}",
            std::process::id(),
            FILL_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| -> Result<(), FillError> {
            let file =
                File::create(&tmp).map_err(cache_failure("cannot create a temporary file"))?;
            let mut writer = BufWriter::with_capacity(super::READ_BUFFER_BYTES, file);
            copy_stream(source, &mut writer, url)?;
            let file = writer
                .into_inner()
                .map_err(|e| FillError::Cache("cannot write", e.into_error()))?;
            // Durable before visible: a crash must not leave a renamed but empty shard.
            file.sync_all().map_err(cache_failure("cannot sync"))?;
            fs::rename(&tmp, path).map_err(cache_failure("cannot rename into place"))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Removes least recently used shards until the cache fits in `max_bytes`, never `keep`.
    fn evict(&self, keep: &Path) {
        let Ok(_guard) = lock_exclusive(&self.opts.dir.join(".evict.lock")) else {
            return;
        };
        let Ok(entries) = fs::read_dir(&self.opts.dir) else {
            return;
        };
        let mut shards: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(SHARD_SUFFIX))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = shards.iter().map(|s| s.1).sum();
        shards.sort();
        for (_, len, path) in shards {
            if total <= self.opts.max_bytes {
                break;
            }
            if path != keep && fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// Copies the whole stream; the `HttpReader` has already retried, so an error here is final.
fn copy_stream(
    source: &mut HttpReader,
    writer: &mut impl Write,
    url: &str,
) -> Result<(), FillError> {
    let mut buf = vec![0u8; super::READ_BUFFER_BYTES];
    loop {
        let n = source
            .read(&mut buf)
            .map_err(|e| into_source_error(url, e))?;
        if n == 0 {
            return Ok(());
        }
        writer
            .write_all(&buf[..n])
            .map_err(cache_failure("cannot write"))?;
    }
}

fn into_source_error(url: &str, e: io::Error) -> SourceError {
    let kind = e.kind();
    match e.into_inner().map(|inner| inner.downcast::<SourceError>()) {
        Some(Ok(source_error)) => *source_error,
        Some(Err(other)) => SourceError::Open {
            url: redact_url(url),
            message: other.to_string(),
        },
        None => SourceError::Open {
            url: redact_url(url),
            message: io::Error::from(kind).to_string(),
        },
    }
}

/// Opens a cached shard and marks it recently used; `None` if it is not (or no longer) there,
/// or if it has another size than the index recorded.
fn open_and_touch(path: &Path, expected: &Expected) -> Option<File> {
    let file = File::open(path).ok()?;
    if let Some(size) = expected.size {
        if file.metadata().ok()?.len() != size {
            return None;
        }
    }
    // Best effort: a failed touch only makes eviction order less accurate.
    let _ = file.set_modified(SystemTime::now());
    Some(file)
}

/// Blocks until this process holds an exclusive lock on `path` (created if missing); the lock
/// lasts as long as the returned file is open.
fn lock_exclusive(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.lock()?;
    Ok(file)
}

/// Deletes temporary files of `stem` left by a crashed filler (we hold its lock: none is live).
fn remove_stale_parts(dir: &Path, stem: &str) {
    let prefix = format!("{stem}.part-");
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testserver::{Fault, TestServer};
    use super::*;
    use std::time::Duration;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ss-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn opts(dir: &Path, max_bytes: u64) -> SourceOptions {
        SourceOptions {
            read_timeout: Duration::from_millis(500),
            backoff_initial: Duration::from_millis(5),
            backoff_max: Duration::from_millis(50),
            retry_after_max: Duration::from_secs(2),
            cache: Some(CacheOptions {
                dir: dir.to_path_buf(),
                max_bytes,
            }),
            ..SourceOptions::default()
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn eight_concurrent_readers_download_once() {
        let object = data(3_000_000);
        let server = TestServer::start(object.clone(), vec![Fault::CloseAfter(1_000_000)]);
        let dir = temp_dir("concurrent");
        let opts = opts(&dir, 1 << 30);
        let stats = Arc::new(SourceStats::default());
        // Not hex: a file name holds hashes of the URL, which may spell any hex string.
        let url = server.url("/shard-000.tar?X-Amz-Signature=SECRET-SIGNATURE");
        let readers: Vec<_> = (0..8)
            .map(|i| {
                let (url, opts, stats) = (url.clone(), opts.clone(), stats.clone());
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    super::super::open_range(&url, i * 1000, None, &opts, &stats)
                        .unwrap()
                        .read_to_end(&mut out)
                        .unwrap();
                    out
                })
            })
            .collect();
        for (i, reader) in readers.into_iter().enumerate() {
            assert_eq!(reader.join().unwrap(), &object[i * 1000..]);
        }
        // One full download plus the resume after the injected close: still one object fetch.
        assert_eq!(server.requests().len(), 2);
        assert_eq!(stats.cache_misses.load(Ordering::Relaxed), 1);
        assert_eq!(stats.cache_hits.load(Ordering::Relaxed), 7);
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.contains(".part-") && !n.contains("SIGNATURE")),
            "{names:?}"
        );
        // Re-signed URL, same object: a hit. Other query parameters select other objects.
        let again = ShardCache::new(opts.cache.clone().unwrap());
        let resigned = server.url("/shard-000.tar?X-Amz-Signature=zzz&X-Amz-Date=2&x-id=GetObject");
        assert_eq!(again.path_for(&url), again.path_for(&resigned));
        let (one, two) = (server.url("/get?shard=1"), server.url("/get?shard=2"));
        assert_ne!(again.path_for(&one), again.path_for(&two));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn least_recently_used_shards_are_evicted_to_fit() {
        let object = data(100_000);
        let server = TestServer::start(object.clone(), vec![]);
        let dir = temp_dir("evict");
        let opts = opts(&dir, 250_000);
        let stats = Arc::new(SourceStats::default());
        let read = |name: &str| {
            let mut out = Vec::new();
            super::super::open_range(&server.url(name), 0, None, &opts, &stats)
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out, object);
        };
        read("/a.tar");
        std::thread::sleep(Duration::from_millis(20));
        read("/b.tar");
        std::thread::sleep(Duration::from_millis(20));
        read("/a.tar"); // a becomes the most recently used
        std::thread::sleep(Duration::from_millis(20));
        read("/c.tar"); // over budget: b goes
        let cache = ShardCache::new(opts.cache.clone().unwrap());
        assert!(cache.path_for(&server.url("/a.tar")).exists());
        assert!(!cache.path_for(&server.url("/b.tar")).exists());
        assert!(cache.path_for(&server.url("/c.tar")).exists());
        assert_eq!(server.requests().len(), 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shard_larger_than_the_cache_is_streamed_uncached() {
        let object = data(50_000);
        let server = TestServer::start(object.clone(), vec![]);
        let dir = temp_dir("toolarge");
        let opts = opts(&dir, 10_000);
        let stats = Arc::new(SourceStats::default());
        let mut out = Vec::new();
        super::super::open_range(&server.url("/big.tar"), 10, None, &opts, &stats)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, &object[10..]);
        assert!(!ShardCache::new(opts.cache.clone().unwrap())
            .path_for(&server.url("/big.tar"))
            .exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unusable_cache_directory_reads_from_the_source() {
        // Where the cache directory should be there is a file: nothing can be created in it
        // (as on a read-only or full file system, which tests/test_drills.py mounts for real).
        let object = data(40_000);
        let server = TestServer::start(object.clone(), vec![]);
        let dir = temp_dir("unusable");
        fs::write(&dir, b"not a directory").unwrap();
        let opts = opts(&dir, 1 << 20);
        let stats = Arc::new(SourceStats::default());
        for _ in 0..2 {
            let mut out = Vec::new();
            super::super::open_range(&server.url("/a.tar"), 100, None, &opts, &stats)
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out, &object[100..]);
        }
        assert_eq!(stats.cache_errors.load(Ordering::Relaxed), 2);
        assert_eq!(fs::read(&dir).unwrap(), b"not a directory");
        fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn a_cached_copy_of_another_version_than_the_index_is_not_served() {
        // The index recorded the object at 30,000 bytes; the cache holds a 20,000-byte copy
        // made before the object was replaced (or the other way round).
        let object = data(30_000);
        let server = TestServer::start(object.clone(), vec![]);
        let dir = temp_dir("stale");
        let opts = opts(&dir, 1 << 20);
        let stats = Arc::new(SourceStats::default());
        let url = server.url("/a.tar");
        let cache = ShardCache::new(opts.cache.clone().unwrap());
        fs::create_dir_all(&dir).unwrap();
        fs::write(cache.path_for(&url), vec![9u8; 20_000]).unwrap();
        let indexed = Expected {
            size: Some(30_000),
            etag: None,
        };
        let mut out = Vec::new();
        super::super::open_expecting(&url, 10, &indexed, &opts, &stats)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, &object[10..]);
        assert_eq!(fs::read(cache.path_for(&url)).unwrap(), object, "refilled");
        // The object on the server is not the indexed version either: an error, nothing cached.
        let other = Expected {
            size: Some(50_000),
            etag: None,
        };
        let url2 = server.url("/b.tar");
        let err = super::super::open_expecting(&url2, 0, &other, &opts, &stats)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("index it again"), "{err}");
        assert!(!cache.path_for(&url2).exists());
        let etag = Expected {
            size: None,
            etag: Some("\"v0\"".into()),
        };
        let url3 = server.url("/c.tar");
        let err = super::super::open_expecting(&url3, 0, &etag, &opts, &stats)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("replaced since it was indexed"), "{err}");
        assert!(!cache.path_for(&url3).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_download_leaves_nothing_behind() {
        let server = TestServer::start(data(10), vec![Fault::Status(404)]);
        let dir = temp_dir("fail");
        let opts = opts(&dir, 1 << 20);
        let stats = Arc::new(SourceStats::default());
        let err = super::super::open_range(&server.url("/gone.tar"), 0, None, &opts, &stats)
            .err()
            .unwrap();
        assert!(matches!(err, SourceError::NotFound { .. }), "{err}");
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
