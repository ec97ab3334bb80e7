//! One request on one path, timed by the client: from before the connect to the first content
//! byte read (first token) and to the end of the answer (wall).
//!
//! Direct and through inferproxy the bytes written are the same ([`Request::http`], what loopd
//! itself sends); through `loopd serve` they are one `submit` line with `follow`.

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use http_nostd::{Event, HttpError, ResponseReader, Status, HEAD_CAP};

use crate::stream::{DaemonAnswer, SseAnswer, StreamError, Tokens};

/// How long one request may take before the bench gives up on it (a loaded box is slow).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a request goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// llama-server's TCP port.
    Direct(SocketAddr),
    /// inferproxy's Unix socket.
    Proxy(PathBuf),
    /// `loopd serve`'s Unix socket.
    Daemon(PathBuf),
}

/// The bytes a request sends on each kind of path.
#[derive(Debug, Clone)]
pub struct Request {
    /// The whole HTTP request (head and body) for llama-server, direct or through inferproxy.
    pub http: Vec<u8>,
    /// The `submit` line (with its `\n`) for `loopd serve`.
    pub submit: Vec<u8>,
}

/// What one request measured and answered.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the request started (before the connect).
    pub start: Instant,
    /// Start to the read that completed the answer.
    pub wall: Duration,
    /// Start to the read that brought the first content.
    pub first_token: Duration,
    /// The answer's content.
    pub content: String,
    /// The server's token counts.
    pub tokens: Tokens,
    /// `prompt_ms + predicted_ms` of the final chunk (not on the daemon's path: it does not
    /// pass `timings` on).
    pub stream_compute_ms: Option<f64>,
    /// The daemon's request id (only on the daemon's path).
    pub id: Option<u64>,
    /// Start to the read that brought the daemon's `{"ok":true,"id":N}` (only on its path):
    /// its admission, before the request's thread exists.
    pub admitted: Option<Duration>,
}

/// Why a request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RequestError {
    /// Connecting, writing or reading.
    Io(std::io::Error),
    /// The HTTP response could not be read.
    Http(HttpError),
    /// The server answered with a status other than 200 (and this body).
    Status(u16, String),
    /// The stream could not be read as an answer.
    Stream(StreamError),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Io(e) => write!(f, "io: {e}"),
            RequestError::Http(e) => write!(f, "http: {e}"),
            RequestError::Status(s, body) => write!(f, "HTTP {s}: {body}"),
            RequestError::Stream(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RequestError {}

impl From<std::io::Error> for RequestError {
    fn from(e: std::io::Error) -> Self {
        RequestError::Io(e)
    }
}

impl From<StreamError> for RequestError {
    fn from(e: StreamError) -> Self {
        RequestError::Stream(e)
    }
}

/// Sends `req` to `target` and times it.
pub fn run(target: &Target, req: &Request) -> Result<Sample, RequestError> {
    let start = Instant::now();
    match target {
        Target::Direct(addr) => {
            let conn = TcpStream::connect(addr)?;
            conn.set_nodelay(true)?;
            conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
            http(conn, &req.http, start)
        }
        Target::Proxy(socket) => {
            let conn = UnixStream::connect(socket)?;
            conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
            http(conn, &req.http, start)
        }
        Target::Daemon(socket) => {
            let conn = UnixStream::connect(socket)?;
            conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
            daemon(conn, &req.submit, start)
        }
    }
}

fn http(mut conn: impl Read + Write, bytes: &[u8], start: Instant) -> Result<Sample, RequestError> {
    conn.write_all(bytes)?;
    let mut reader = ResponseReader::new(llama_harness::boxed_array::<HEAD_CAP>());
    let mut answer = SseAnswer::default();
    let mut error_body = Vec::new();
    let mut status = 0;
    let mut first = None;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = conn.read(&mut buf)?;
        let now = Instant::now();
        if n == 0 {
            reader.finish().map_err(RequestError::Http)?;
            break;
        }
        let mut input = &buf[..n];
        let mut ended = false;
        while !input.is_empty() && !ended {
            let (used, event) = reader.feed(input).map_err(RequestError::Http)?;
            input = &input[used..];
            match event {
                Status::Complete(Event::Head) => {
                    status = reader.head().map_or(0, |h| h.status());
                }
                Status::Complete(Event::Body(body)) if status != 200 => {
                    error_body.extend_from_slice(body)
                }
                Status::Complete(Event::Body(body)) => {
                    if answer.feed(body)? && first.is_none() {
                        first = Some(now - start);
                    }
                }
                Status::Complete(Event::End) => ended = true,
                Status::Partial => break,
            }
        }
        if ended {
            if status != 200 {
                let body = String::from_utf8_lossy(&error_body).into_owned();
                return Err(RequestError::Status(status, body));
            }
            if !answer.done {
                return Err(StreamError::Truncated.into());
            }
            return Ok(Sample {
                start,
                wall: now - start,
                first_token: first.ok_or(StreamError::Truncated)?,
                content: answer.content,
                tokens: answer.tokens,
                stream_compute_ms: answer.compute_ms,
                id: None,
                admitted: None,
            });
        }
    }
    Err(StreamError::Truncated.into())
}

fn daemon(mut conn: UnixStream, line: &[u8], start: Instant) -> Result<Sample, RequestError> {
    conn.write_all(line)?;
    let mut answer = DaemonAnswer::default();
    let mut first = None;
    let mut admitted = None;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = conn.read(&mut buf)?;
        let now = Instant::now();
        if n == 0 {
            return Err(StreamError::Truncated.into());
        }
        if answer.feed(&buf[..n])? && first.is_none() {
            first = Some(now - start);
        }
        if admitted.is_none() && answer.id.is_some() {
            admitted = Some(now - start);
        }
        if answer.done {
            return Ok(Sample {
                start,
                wall: now - start,
                first_token: first.ok_or(StreamError::Truncated)?,
                content: answer.content,
                tokens: answer.tokens,
                stream_compute_ms: None,
                id: answer.id,
                admitted,
            });
        }
    }
}

/// One command line to `loopd serve` and its one-line reply (`result`, `status`).
pub fn daemon_command(socket: &Path, line: &str) -> Result<serde_json::Value, RequestError> {
    let mut conn = UnixStream::connect(socket)?;
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    conn.write_all(line.as_bytes())?;
    conn.write_all(b"\n")?;
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply)?;
    let first = reply.split(|&b| b == b'\n').next().unwrap_or_default();
    serde_json::from_slice(first)
        .map_err(|_| StreamError::NotJson(String::from_utf8_lossy(&reply).into_owned()).into())
}

/// `GET path` from llama-server; the de-chunked body as text, or the status when not 200.
pub fn get(addr: SocketAddr, path: &str) -> Result<String, RequestError> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    conn.write_all(&loopd_client::http::render("GET", path, None))?;
    let mut reader = ResponseReader::new(llama_harness::boxed_array::<HEAD_CAP>());
    let mut body = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            reader.finish().map_err(RequestError::Http)?;
            break;
        }
        let mut input = &buf[..n];
        while !input.is_empty() {
            let (used, event) = reader.feed(input).map_err(RequestError::Http)?;
            input = &input[used..];
            match event {
                Status::Complete(Event::Body(b)) => body.extend_from_slice(b),
                Status::Complete(Event::End) => input = &[],
                Status::Complete(Event::Head) | Status::Partial => {}
            }
        }
        if reader.is_done() {
            break;
        }
    }
    let status = reader.head().map_or(0, |h| h.status());
    let text = String::from_utf8_lossy(&body).into_owned();
    if status != 200 {
        return Err(RequestError::Status(status, text));
    }
    Ok(text)
}
