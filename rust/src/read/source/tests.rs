//! The source layer's tests: local files, HTTP against the Rust test server, and S3 through a
//! signer.

use super::*;

#[test]
fn a_shard_replaced_since_indexing_is_refused_locally_and_over_http() {
    assert_eq!(
        Expected::from_identity(Some("size:2048,mtime_ns:17")),
        Expected {
            size: Some(2048),
            etag: None
        }
    );
    assert_eq!(
        Expected::from_identity(Some("etag:\"a,b\""))
            .etag
            .as_deref(),
        Some("\"a,b\"")
    );
    assert!(Expected::from_identity(Some("etag:W/\"weak\"")).is_empty());
    assert!(Expected::from_identity(None).is_empty());
    let (opts, stats) = (SourceOptions::default(), Arc::new(SourceStats::default()));
    let path = std::env::temp_dir().join(format!("ss-expect-{}.tar", std::process::id()));
    std::fs::write(&path, vec![7u8; 1024]).unwrap();
    let url = path.display().to_string();
    let same = Expected {
        size: Some(1024),
        etag: None,
    };
    assert!(open_expecting(&url, 0, &same, &opts, &stats).is_ok());
    let other = Expected {
        size: Some(2048),
        etag: None,
    };
    let err = open_expecting(&url, 0, &other, &opts, &stats)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("1024 bytes, the index recorded 2048"), "{err}");
    std::fs::remove_file(&path).unwrap();

    let server = testserver::TestServer::start(vec![1u8; 4096], vec![]);
    let url = server.url("/a.tar");
    let indexed = Expected {
        size: Some(4096),
        etag: Some(testserver::TestServer::ETAG.into()),
    };
    let mut body = Vec::new();
    open_expecting(&url, 100, &indexed, &opts, &stats)
        .unwrap()
        .read_to_end(&mut body)
        .unwrap();
    assert_eq!(body.len(), 3996);
    assert!(server
        .requests()
        .iter()
        .all(|r| r.if_match.as_deref() == Some(testserver::TestServer::ETAG)));
    let stale = Expected {
        size: None,
        etag: Some("\"v0\"".into()),
    };
    let err = open_expecting(&url, 0, &stale, &opts, &stats)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("replaced since it was indexed"), "{err}");
    let resized = Expected {
        size: Some(5000),
        etag: None,
    };
    let err = open_expecting(&url, 0, &resized, &opts, &stats)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("size") && err.contains("index it again"),
        "{err}"
    );
}

#[test]
fn redaction_removes_signatures_and_passwords() {
    assert_eq!(
        redact_url("https://h/b/k.tar?X-Amz-Signature=abc&X-Amz-Credential=AKIA"),
        "https://h/b/k.tar?<redacted>"
    );
    assert_eq!(
        redact_url("http://user:pw@h:9/x.tar"),
        "http://***@h:9/x.tar"
    );
    assert_eq!(redact_url("/data/x.tar"), "/data/x.tar");
}

#[test]
fn scrub_removes_quoted_secrets_from_library_messages() {
    let url = "https://u:pw@h/b/k.tar?X-Amz-Signature=abc";
    let msg = format!("bad uri {url}; query X-Amz-Signature=abc; user u:pw");
    let clean = scrub(&msg, url);
    assert!(!clean.contains("abc") && !clean.contains("pw"), "{clean}");
}

#[test]
fn pipe_and_unknown_schemes_are_refused() {
    let stats = Arc::new(SourceStats::default());
    let opts = SourceOptions::default();
    for url in [
        "pipe:curl http://x/a.tar",
        "gs://b/a.tar",
        "ftp://h/a.tar",
        "s3://b/a.tar", // no signer
    ] {
        match open(url, 0, &opts, &stats) {
            Err(SourceError::BadUrl { .. }) => {}
            Err(other) => panic!("{url}: unexpected error {other}"),
            Ok(_) => panic!("{url}: accepted"),
        }
    }
}

#[test]
fn local_file_opens_at_offset_and_stops_at_end() {
    let dir = std::env::temp_dir().join(format!("ss-src-local-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.tar");
    std::fs::write(&path, b"0123456789").unwrap();
    let stats = Arc::new(SourceStats::default());
    let opts = SourceOptions::default();
    let url = format!("file://{}", path.display());
    let mut out = Vec::new();
    open_range(&url, 3, Some(7), &opts, &stats)
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    assert_eq!(out, b"3456");
    assert_eq!(stats.bytes.load(Ordering::Relaxed), 4);
    match open("/definitely/not/here.tar", 0, &opts, &stats) {
        Err(SourceError::NotFound { url }) => assert_eq!(url, "/definitely/not/here.tar"),
        _ => panic!("expected NotFound"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn s3_urls_are_signed_when_opened_and_errors_name_the_s3_url() {
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    // The first response breaks off mid-body: the resume must carry a fresh signature.
    let server =
        testserver::TestServer::start(data.clone(), vec![testserver::Fault::CloseAfter(20_000)]);
    let base = server.url("");
    let signed = Arc::new(AtomicU64::new(0));
    let count = signed.clone();
    let opts = SourceOptions {
        signer: Some(Signer(Arc::new(move |url: &str| {
            let n = count.fetch_add(1, Ordering::Relaxed);
            let key = url.strip_prefix("s3://bucket/").ok_or("not our bucket")?;
            if key == "refused.tar" {
                return Err("session expired".to_string());
            }
            Ok(format!("{base}/{key}?X-Amz-Signature=secret{n}").into())
        }))),
        ..SourceOptions::default()
    };
    let stats = Arc::new(SourceStats::default());
    for _ in 0..2 {
        let mut out = Vec::new();
        open_range("s3://bucket/a.tar", 10, None, &opts, &stats)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data[10..]);
    }
    // A fresh signature for every request (two opens, one resume), not one per URL list.
    assert_eq!(signed.load(Ordering::Relaxed), 3);
    let requests = server.requests();
    let targets: Vec<_> = requests.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/a.tar?X-Amz-Signature=secret0",
            "/a.tar?X-Amz-Signature=secret1",
            "/a.tar?X-Amz-Signature=secret2"
        ]
    );
    assert_eq!(requests[1].range.as_deref(), Some("bytes=20010-"));

    match open("s3://bucket/refused.tar", 0, &opts, &stats) {
        Err(e @ SourceError::Unsigned { .. }) => {
            let message = e.to_string();
            assert!(message.contains("access denied to s3://bucket/refused.tar"));
            assert!(message.contains("session expired"), "{message}");
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("opened without a signature"),
    }
    let not_http = SourceOptions {
        signer: Some(Signer(Arc::new(|_: &str| {
            Ok("ftp://elsewhere/a.tar".to_string().into())
        }))),
        ..SourceOptions::default()
    };
    assert!(matches!(
        open("s3://bucket/a.tar", 0, &not_http, &stats),
        Err(SourceError::Unsigned { .. })
    ));
}
