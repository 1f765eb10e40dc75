//! A tiny real HTTP/1.1 server on 127.0.0.1 for unit tests: serves one object with Range,
//! ETag and If-Match, and injects one scripted fault per request, in order.
//! (The Python test suite has the full-featured server and fault proxy; this one lets the Rust
//! reader be tested with `cargo test` alone.)

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

#[derive(Clone, Debug)]
pub(crate) enum Fault {
    /// Send the headers (with the full Content-Length) and `n` body bytes, then close.
    CloseAfter(usize),
    /// Send `n` body bytes, then go silent for the duration, then close.
    StallAfter(usize, Duration),
    /// Answer with this status and an S3-style XML error body.
    Status(u16),
    /// Answer 200 with the whole object even when a Range was asked for.
    IgnoreRange,
    /// The object is replaced (new ETag) before this request is answered.
    ChangeEtag,
}

#[derive(Clone, Debug)]
pub(crate) struct Request {
    /// The request line's target (path and query).
    pub target: String,
    pub range: Option<String>,
    pub if_match: Option<String>,
}

struct State {
    data: Vec<u8>,
    etag: String,
    faults: VecDeque<Fault>,
    requests: Vec<Request>,
}

pub(crate) struct TestServer {
    port: u16,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl TestServer {
    pub const ETAG: &'static str = "\"v1\"";

    pub fn start(data: Vec<u8>, faults: Vec<Fault>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            data,
            etag: Self::ETAG.to_string(),
            faults: faults.into(),
            requests: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (state, stop) = (state.clone(), stop.clone());
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let state = state.clone();
                        thread::spawn(move || serve(stream, &state));
                    }
                }
            })
        };
        Self {
            port,
            state,
            stop,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path_and_query)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(handle) = self.acceptor.take() {
            let _ = handle.join();
        }
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(stream.try_clone().expect("clone socket"));
    let mut request = Request {
        target: String::new(),
        range: None,
        if_match: None,
    };
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if first {
            first = false;
            request.target = line.split(' ').nth(1).unwrap_or("").to_string();
            continue;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => request.range = Some(value.trim().to_string()),
                "if-match" => request.if_match = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    let (fault, data, etag) = {
        let mut s = state.lock().unwrap();
        s.requests.push(request.clone());
        let fault = s.faults.pop_front();
        if matches!(fault, Some(Fault::ChangeEtag)) {
            s.etag = "\"v2\"".to_string();
        }
        (fault, s.data.clone(), s.etag.clone())
    };
    let mut out = stream;
    if let Some(Fault::Status(code)) = fault {
        let body = if code == 503 {
            "<Error><Code>SlowDown</Code></Error>"
        } else {
            "<Error><Code>Nope</Code></Error>"
        };
        let _ = write!(
            out,
            "HTTP/1.1 {code} Fault\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    if request.if_match.as_ref().is_some_and(|m| m != &etag) {
        let _ = write!(
            out,
            "HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    }
    let total = data.len();
    let range = match (&fault, &request.range) {
        (Some(Fault::IgnoreRange), _) | (_, None) => None,
        (_, Some(spec)) => parse_range(spec, total),
    };
    let (status, first, last) = match range {
        Some((a, _)) if a >= total => {
            let _ = write!(
                out,
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            return;
        }
        Some((a, b)) => ("206 Partial Content", a, b.min(total - 1)),
        None => ("200 OK", 0, total.saturating_sub(1)),
    };
    let body = if total == 0 {
        &data[..]
    } else {
        &data[first..=last]
    };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {etag}\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("206") {
        head.push_str(&format!("Content-Range: bytes {first}-{last}/{total}\r\n"));
    }
    head.push_str("\r\n");
    if out.write_all(head.as_bytes()).is_err() {
        return;
    }
    match fault {
        Some(Fault::CloseAfter(n)) => {
            let _ = out.write_all(&body[..n.min(body.len())]);
        }
        Some(Fault::StallAfter(n, pause)) => {
            let _ = out.write_all(&body[..n.min(body.len())]);
            let _ = out.flush();
            thread::sleep(pause);
        }
        _ => {
            let _ = out.write_all(body);
        }
    }
}

/// `bytes=a-` or `bytes=a-b` -> (a, b) with b inclusive.
fn parse_range(spec: &str, total: usize) -> Option<(usize, usize)> {
    let (a, b) = spec.strip_prefix("bytes=")?.split_once('-')?;
    let a: usize = a.parse().ok()?;
    let b: usize = if b.is_empty() {
        total.saturating_sub(1)
    } else {
        b.parse().ok()?
    };
    Some((a, b))
}
