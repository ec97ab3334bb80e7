//! The readiness probe's IO: one HTTP/1.1 GET with a deadline, answering the status code (or,
//! for the router's model list, the status and the body).
//!
//! Deliberately tiny: connect, send a fixed request, read until the response head is complete
//! (httparse tokenizes the status line) and ignore the body; or, with [`http_get_body`], read
//! the whole response through `http-nostd` (any framing) into a capped buffer. The deadline
//! covers connect to the last byte needed.
//! A probe in progress checks every [`CANCEL_CHECK`] whether its caller cancelled it, so a stop
//! never waits for a probe's whole timeout.

use core::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Largest response head read; `/health` and `/v1/models` heads are a few hundred bytes.
pub const MAX_HEAD_BYTES: usize = 8192;

/// Most response headers accepted.
const MAX_HEADERS: usize = 32;

/// How often a probe in progress asks whether it was cancelled (connect and read wait at most
/// this long at a time).
pub const CANCEL_CHECK: Duration = Duration::from_millis(50);

/// What one readiness probe of one path got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// An HTTP answer with this status code (200 is ready).
    Status(u16),
    /// No HTTP answer.
    Error(ProbeError),
}

/// Why a probe did not get a status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeError {
    /// The host name did not resolve.
    Resolve,
    /// The connection was refused (nothing listens).
    Refused,
    /// No complete response head before the deadline.
    Timeout,
    /// The server closed the connection before a complete head.
    Closed,
    /// The head is not HTTP.
    Malformed,
    /// The head is longer than [`MAX_HEAD_BYTES`].
    HeadTooLarge,
    /// The response could not be read as HTTP with a body within its cap (a body read only).
    Http(http_nostd::HttpError),
    /// Another IO error.
    Io(io::ErrorKind),
    /// The caller cancelled the probe (the worker is stopping); not an answer.
    Cancelled,
}

impl ProbeError {
    /// A short name for status output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resolve => "resolve_failed",
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Closed => "closed",
            Self::Malformed => "malformed",
            Self::HeadTooLarge => "head_too_large",
            Self::Http(_) => "bad_response",
            Self::Io(_) => "io_error",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Resolve => f.write_str("probe: host did not resolve"),
            Self::Refused => f.write_str("probe: connection refused"),
            Self::Timeout => f.write_str("probe: no response head before the deadline"),
            Self::Closed => f.write_str("probe: closed before a complete response head"),
            Self::Malformed => f.write_str("probe: response head is not HTTP"),
            Self::HeadTooLarge => write!(f, "probe: response head over {MAX_HEAD_BYTES} bytes"),
            Self::Http(e) => write!(f, "probe: {e}"),
            Self::Io(k) => write!(f, "probe: {k}"),
            Self::Cancelled => f.write_str("probe: cancelled"),
        }
    }
}

impl core::error::Error for ProbeError {}

fn io_err(e: io::Error) -> ProbeError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ProbeError::Timeout,
        io::ErrorKind::ConnectionRefused => ProbeError::Refused,
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => ProbeError::Closed,
        k => ProbeError::Io(k),
    }
}

/// Parses a response head; `Ok(None)` while incomplete.
pub fn parse_status(head: &[u8]) -> Result<Option<u16>, ProbeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(_)) => Ok(resp.code),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(ProbeError::Malformed),
    }
}

/// GET `path` from `host:port`; the status code of the answer, within `timeout`. Gives up with
/// [`ProbeError::Cancelled`] within [`CANCEL_CHECK`] of `cancelled()` turning true.
pub fn http_get_status(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<u16, ProbeError> {
    let mut buf = [0u8; MAX_HEAD_BYTES];
    let mut len = 0;
    let mut code = None;
    exchange(host, port, path, timeout, cancelled, &mut |bytes| {
        if bytes.is_empty() {
            return Err(ProbeError::Closed);
        }
        // Body bytes after the head may come in the same read: keep only what the buffer holds.
        let n = bytes.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
        code = parse_status(&buf[..len])?;
        if code.is_none() && len == buf.len() {
            return Err(ProbeError::HeadTooLarge);
        }
        Ok(code.is_some())
    })?;
    code.ok_or(ProbeError::Closed)
}

/// GET `path` from `host:port`; the status code and the whole body (chunked, content-length
/// or read-to-close, decoded by `http-nostd`), within `timeout`. A body over `N` bytes is
/// [`ProbeError::Http`] with `BodyTooLarge`; cancelling works as for [`http_get_status`].
pub fn http_get_body<const N: usize>(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<(u16, Vec<u8>), ProbeError> {
    use http_nostd::{BodyBuffer, ResponseReader, HEAD_CAP};
    // Heap storage that never passes through the stack.
    let boxed = |n: usize| vec![0u8; n].into_boxed_slice();
    let head: Box<[u8; HEAD_CAP]> = boxed(HEAD_CAP).try_into().map_err(|_| ProbeError::Closed)?;
    let store: Box<[u8; N]> = boxed(N).try_into().map_err(|_| ProbeError::Closed)?;
    let mut reader = ResponseReader::new(head);
    let mut body = BodyBuffer::new(store);
    exchange(host, port, path, timeout, cancelled, &mut |bytes| {
        if bytes.is_empty() {
            reader.finish().map_err(ProbeError::Http)?;
            return Ok(true);
        }
        let (_, fed) = reader
            .feed_into(bytes, &mut body)
            .map_err(ProbeError::Http)?;
        Ok(fed.is_complete())
    })?;
    let status = reader.head().map_or(0, |h| h.status());
    Ok((status, body.as_bytes().to_vec()))
}

/// Connects, sends a `GET path` with `Connection: close`, and hands every read to `take` (an
/// empty slice at the end of the stream) until it says the response is complete; all within
/// `timeout`, checking `cancelled()` every [`CANCEL_CHECK`].
fn exchange(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
    take: &mut dyn FnMut(&[u8]) -> Result<bool, ProbeError>,
) -> Result<(), ProbeError> {
    let deadline = Instant::now() + timeout;
    let addr: SocketAddr = (host, port)
        .to_socket_addrs()
        .map_err(|_| ProbeError::Resolve)?
        .next()
        .ok_or(ProbeError::Resolve)?;
    let left = |d: Instant| {
        d.checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
    };
    let slow = |k: io::ErrorKind| matches!(k, io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
    let mut stream = loop {
        if cancelled() {
            return Err(ProbeError::Cancelled);
        }
        let l = left(deadline).ok_or(ProbeError::Timeout)?;
        match TcpStream::connect_timeout(&addr, l.min(CANCEL_CHECK)) {
            Ok(s) => break s,
            Err(e) if slow(e.kind()) => continue,
            Err(e) => return Err(io_err(e)),
        }
    };
    // A request of a hundred bytes into a fresh connection's empty send buffer: never waits.
    stream
        .set_write_timeout(Some(left(deadline).ok_or(ProbeError::Timeout)?))
        .map_err(io_err)?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).map_err(io_err)?;
    let mut buf = [0u8; 4096];
    loop {
        if cancelled() {
            return Err(ProbeError::Cancelled);
        }
        let l = left(deadline).ok_or(ProbeError::Timeout)?;
        stream
            .set_read_timeout(Some(l.min(CANCEL_CHECK)))
            .map_err(io_err)?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted || slow(e.kind()) => continue,
            Err(e) => return Err(io_err(e)),
        };
        if take(&buf[..n])? || n == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    #[test]
    fn parse_status_cases() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n\r\n"), Ok(Some(200)));
        assert_eq!(
            parse_status(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"),
            Ok(Some(503))
        );
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Ok(None));
        assert_eq!(parse_status(b"HTTP/1.1 2"), Ok(None));
        assert_eq!(
            parse_status(b"SSH-2.0-x\r\n\r\n"),
            Err(ProbeError::Malformed)
        );
    }

    /// A one-shot server answering `reply` after `delay`; returns its port.
    fn serve_once(reply: &'static [u8], delay: Duration) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b);
            thread::sleep(delay);
            let _ = s.write_all(reply);
        });
        port
    }

    #[test]
    fn get_against_a_local_server() {
        let t = Duration::from_secs(5);
        let p = serve_once(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            Duration::ZERO,
        );
        assert_eq!(
            http_get_status("127.0.0.1", p, "/health", t, &|| false),
            Ok(200)
        );
        let p = serve_once(b"HTTP/1.1 503 Loading\r\n\r\n", Duration::ZERO);
        assert_eq!(
            http_get_status("127.0.0.1", p, "/health", t, &|| false),
            Ok(503)
        );
        let p = serve_once(b"HTTP/1.1 200 OK\r\n", Duration::ZERO);
        assert_eq!(
            http_get_status("127.0.0.1", p, "/health", t, &|| false),
            Err(ProbeError::Closed)
        );
        let p = serve_once(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_secs(3));
        assert_eq!(
            http_get_status(
                "127.0.0.1",
                p,
                "/health",
                Duration::from_millis(200),
                &|| false
            ),
            Err(ProbeError::Timeout)
        );
        // A port nobody listens on.
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert_eq!(
            http_get_status("127.0.0.1", free, "/health", t, &|| false),
            Err(ProbeError::Refused)
        );
    }

    #[test]
    fn a_probe_in_progress_ends_soon_after_it_is_cancelled() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // A server that reads the request and answers only after 3 s.
        let p = serve_once(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_secs(3));
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            f.store(true, Ordering::SeqCst);
        });
        let t0 = std::time::Instant::now();
        let r = http_get_status("127.0.0.1", p, "/health", Duration::from_secs(30), &|| {
            flag.load(Ordering::SeqCst)
        });
        let took = t0.elapsed();
        assert_eq!(r, Err(ProbeError::Cancelled));
        assert!(
            took >= Duration::from_millis(200)
                && took < Duration::from_millis(200) + CANCEL_CHECK * 3,
            "{took:?}"
        );
        // Cancelled before it starts: no connection at all.
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        assert_eq!(
            http_get_status("127.0.0.1", port, "/", Duration::from_secs(5), &|| true),
            Err(ProbeError::Cancelled)
        );
    }

    #[test]
    fn a_body_in_each_framing_and_past_its_cap() {
        use http_nostd::HttpError;
        let t = Duration::from_secs(5);
        let get = |reply: &'static [u8]| {
            let p = serve_once(reply, Duration::ZERO);
            http_get_body::<8>("127.0.0.1", p, "/models", t, &|| false)
        };
        let ok = |code: u16, body: &[u8]| Ok((code, body.to_vec()));
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{\"a\":12}"),
            ok(200, b"{\"a\":12}")
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n5\r\n\":12}\r\n0\r\n\r\n"),
            ok(200, b"{\"a\":12}")
        );
        // Read to close: the one-shot server closes after writing.
        assert_eq!(
            get(b"HTTP/1.1 503 Loading\r\n\r\nloading"),
            ok(503, b"loading")
        );
        // The cap (8 here) at the limit above, one past here.
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{\"a\":123}"),
            Err(ProbeError::Http(HttpError::BodyTooLarge))
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\n\r\n123456789"),
            Err(ProbeError::Http(HttpError::BodyTooLarge))
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{\"a\""),
            Err(ProbeError::Http(HttpError::Truncated))
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\n"),
            Err(ProbeError::Http(HttpError::IncompleteHead))
        );
    }

    #[test]
    fn head_at_the_limit_and_one_past() {
        fn head(total: usize) -> &'static [u8] {
            let start = "HTTP/1.1 200 OK\r\nX: ";
            let pad = total - start.len() - 4;
            let s = format!("{start}{}\r\n\r\n", "a".repeat(pad));
            assert_eq!(s.len(), total);
            Box::leak(s.into_bytes().into_boxed_slice())
        }
        let t = Duration::from_secs(5);
        let p = serve_once(head(MAX_HEAD_BYTES), Duration::ZERO);
        assert_eq!(http_get_status("127.0.0.1", p, "/", t, &|| false), Ok(200));
        let p = serve_once(head(MAX_HEAD_BYTES + 1), Duration::ZERO);
        assert_eq!(
            http_get_status("127.0.0.1", p, "/", t, &|| false),
            Err(ProbeError::HeadTooLarge)
        );
    }
}
