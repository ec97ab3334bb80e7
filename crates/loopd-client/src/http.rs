//! HTTP/1.1 over a `UnixStream`: one request per connection, `Connection: close`, every step
//! under a deadline.
//!
//! [`request`] connects and writes one request within one deadline (a Unix connect blocks
//! while the listener's backlog is full, a write while the server does not read). [`Response`]
//! reads the status line and headers (at most [`HEAD_CAP`], 16 KiB) with `http-nostd`, then
//! offers the body piece by piece, whether chunked, content-length or read-to-close, or
//! collected into a [`BODY_CAP`] (4 MiB) heap buffer, all within the call's deadline: a server
//! that trickles one byte at a time cannot hold it longer. Errors are this module's own
//! ([`SendError`], [`ReadError`]); the client maps them. No TCP here: loopd reaches the model
//! only through inferproxy's socket.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use http_nostd::{BodyBuffer, Event, HttpError, ResponseReader, Status};
use socket2::{Domain, SockAddr, Socket, Type};

pub use http_nostd::{BODY_CAP, HEAD_CAP};

use crate::cancel::Cancel;

/// Bytes read from the socket at a time.
pub const READ_CHUNK: usize = 16 * 1024;

/// The longest a blocked connect or write goes without looking at its cancel token.
pub const CANCEL_TICK: Duration = Duration::from_millis(20);

/// Why a request could not be sent.
#[derive(Debug)]
pub enum SendError {
    /// Connecting or writing failed.
    Io(io::Error),
    /// The deadline passed first.
    TimedOut,
    /// The cancel token was set.
    Cancelled,
}

/// Why reading a response stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The call's deadline passed.
    Timeout,
    /// The cancel token was set.
    Cancelled,
    /// The connection ended before the response was complete.
    Closed,
    /// Reading failed.
    Io(io::Error),
    /// The bytes are not a valid response, or broke a cap.
    Http(HttpError),
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Time left until `deadline`, in slices of at most [`CANCEL_TICK`]; `None` once it passed.
fn slice(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.min(CANCEL_TICK))
}

/// Connects to `socket` before `deadline`. A full backlog makes a Unix connect wait; the wait is
/// bounded by the socket's send timeout (Linux), set to a slice of what is left each time.
/// (`socket2`'s `connect_timeout` does not serve here: a non-blocking Unix connect to a full
/// backlog fails at once with `EAGAIN`, and its poll then reports "no error set after
/// POLLHUP" within microseconds instead of waiting.)
pub fn connect(socket: &Path, deadline: Instant, cancel: &Cancel) -> Result<UnixStream, SendError> {
    let addr = SockAddr::unix(socket).map_err(SendError::Io)?;
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(SendError::Io)?;
    loop {
        if cancel.is_cancelled() {
            return Err(SendError::Cancelled);
        }
        let Some(wait) = slice(deadline) else {
            return Err(SendError::TimedOut);
        };
        sock.set_write_timeout(Some(wait)).map_err(SendError::Io)?;
        match sock.connect(&addr) {
            Ok(()) => return Ok(UnixStream::from(std::os::fd::OwnedFd::from(sock))),
            Err(e) if timed_out(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SendError::Io(e)),
        }
    }
}

/// [`connect`] with the deadline `timeout` from now (socket deadlines are read here).
pub fn connect_within(
    socket: &Path,
    timeout: Duration,
    cancel: &Cancel,
) -> Result<UnixStream, SendError> {
    connect(socket, Instant::now() + timeout, cancel)
}

/// Writes all of `bytes` before `deadline`.
pub fn send(
    stream: &mut UnixStream,
    mut bytes: &[u8],
    deadline: Instant,
    cancel: &Cancel,
) -> Result<(), SendError> {
    while !bytes.is_empty() {
        if cancel.is_cancelled() {
            return Err(SendError::Cancelled);
        }
        let Some(wait) = slice(deadline) else {
            return Err(SendError::TimedOut);
        };
        stream
            .set_write_timeout(Some(wait))
            .map_err(SendError::Io)?;
        match stream.write(bytes) {
            Ok(0) => return Err(SendError::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if timed_out(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SendError::Io(e)),
        }
    }
    Ok(())
}

/// The bytes of one request; `body` goes out as `application/json`.
pub fn render(method: &str, target: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: */*\r\n"
    );
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    bytes
}

/// Connects to `socket` and sends one request, both within `timeout`.
pub fn request(
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
    timeout: Duration,
    cancel: &Cancel,
) -> Result<UnixStream, SendError> {
    let deadline = Instant::now() + timeout;
    let mut stream = connect(socket, deadline, cancel)?;
    // One write for small requests, so the server sees the request whole.
    send(&mut stream, &render(method, target, body), deadline, cancel)?;
    Ok(stream)
}

/// The response of one request, read as it arrives, all of it before a deadline.
pub struct Response {
    stream: UnixStream,
    reader: ResponseReader<Box<[u8; HEAD_CAP]>, HEAD_CAP>,
    buf: Box<[u8; READ_CHUNK]>,
    pos: usize,
    len: usize,
    received: u64,
    eof: bool,
    has_head: bool,
    deadline: Instant,
    cancel: Cancel,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Response {
    /// [`Response::new`] with the deadline `timeout` from now: the clock is read here, in the
    /// socket layer, so its callers never read it.
    pub fn within(stream: UnixStream, timeout: Duration, cancel: &Cancel) -> Response {
        Response::new(stream, Instant::now() + timeout, cancel)
    }

    /// Reads the response to a request already written on `stream`, all of it by `deadline`,
    /// unless `cancel` is set first (it is looked at every [`CANCEL_TICK`]).
    pub fn new(stream: UnixStream, deadline: Instant, cancel: &Cancel) -> Response {
        Response {
            stream,
            reader: ResponseReader::new(crate::heap::array::<HEAD_CAP>()),
            buf: crate::heap::array::<READ_CHUNK>(),
            pos: 0,
            len: 0,
            received: 0,
            eof: false,
            has_head: false,
            deadline,
            cancel: cancel.clone(),
        }
    }

    /// Bytes received from the socket so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Reads from the socket once: `Ok(false)` at the end of the stream.
    fn fill(&mut self) -> Result<bool, ReadError> {
        loop {
            if self.cancel.is_cancelled() {
                return Err(ReadError::Cancelled);
            }
            let Some(wait) = slice(self.deadline) else {
                return Err(ReadError::Timeout);
            };
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(ReadError::Io)?;
            match self.stream.read(&mut self.buf[..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.pos = 0;
                    self.len = n;
                    self.received += n as u64;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted || timed_out(&e) => {}
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }

    /// Reads until the status line and headers are complete; returns the status.
    pub fn head(&mut self) -> Result<u16, ReadError> {
        while !self.has_head {
            if self.pos == self.len && (self.eof || !self.fill()?) {
                return Err(self.ended());
            }
            let (used, event) = self
                .reader
                .feed(&self.buf[self.pos..self.len])
                .map_err(ReadError::Http)?;
            self.pos += used;
            match event {
                Status::Complete(Event::Head) => self.has_head = true,
                Status::Partial => {}
                // The reader reports the head before any body byte or the end.
                Status::Complete(Event::Body(_)) | Status::Complete(Event::End) => {
                    unreachable!("body before head")
                }
            }
        }
        Ok(self.status())
    }

    /// The status, once [`head`](Self::head) returned.
    pub fn status(&self) -> u16 {
        self.reader.head().map_or(0, |h| h.status())
    }

    /// The value of a response header, once the head is read.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.reader.head()?.header(name)
    }

    /// The next piece of decoded body, `None` once the body is complete. Reads the head first
    /// if needed.
    pub fn next_body(&mut self) -> Result<Option<&[u8]>, ReadError> {
        if !self.has_head {
            self.head()?;
        }
        loop {
            if self.reader.is_done() {
                return Ok(None);
            }
            if self.pos == self.len && (self.eof || !self.fill()?) {
                return match self.reader.finish() {
                    Ok(()) => Ok(None),
                    Err(HttpError::Truncated | HttpError::IncompleteHead) => Err(ReadError::Closed),
                    Err(e) => Err(ReadError::Http(e)),
                };
            }
            let (used, event) = self
                .reader
                .feed(&self.buf[self.pos..self.len])
                .map_err(ReadError::Http)?;
            let start = self.pos;
            self.pos += used;
            match event {
                Status::Complete(Event::Body(piece)) => {
                    // `piece` lies inside what was just consumed; return it from our buffer.
                    let offset = piece.as_ptr() as usize - self.buf[start..].as_ptr() as usize;
                    return Ok(Some(
                        &self.buf[start + offset..start + offset + piece.len()],
                    ));
                }
                Status::Complete(Event::End) => return Ok(None),
                Status::Partial | Status::Complete(Event::Head) => {}
            }
        }
    }

    /// Collects the whole body into a [`BODY_CAP`] heap buffer; over the cap is an error.
    pub fn read_body(&mut self) -> Result<BodyBuffer<Box<[u8; BODY_CAP]>, BODY_CAP>, ReadError> {
        if !self.has_head {
            self.head()?;
        }
        let mut body = BodyBuffer::new(crate::heap::array::<BODY_CAP>());
        if let Some(Ok(n)) = self
            .header("content-length")
            .map(|v| std::str::from_utf8(v).unwrap_or("").parse::<u64>())
        {
            // Refuse at once rather than read 4 MiB and then fail.
            if n > BODY_CAP as u64 {
                return Err(ReadError::Http(HttpError::BodyTooLarge));
            }
        }
        while let Some(piece) = self.next_body()? {
            body.push(piece).map_err(ReadError::Http)?;
        }
        Ok(body)
    }

    /// The status and the first `cap` bytes of the body of an error response; a body that
    /// breaks off or runs past the deadline keeps what arrived (the rest is not read).
    pub fn error_body(&mut self, cap: usize) -> Result<(u16, Vec<u8>), ReadError> {
        let status = self.head()?;
        let mut kept = Vec::new();
        while kept.len() < cap {
            match self.next_body() {
                Ok(Some(piece)) => {
                    kept.extend_from_slice(&piece[..piece.len().min(cap - kept.len())])
                }
                _ => break,
            }
        }
        Ok((status, kept))
    }

    fn ended(&mut self) -> ReadError {
        match self.reader.finish() {
            Err(HttpError::IncompleteHead | HttpError::Truncated) | Ok(()) => ReadError::Closed,
            Err(e) => ReadError::Http(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    /// A response over a socket pair, the server side written in `pieces`.
    fn response(pieces: &[&[u8]]) -> Response {
        let (client, mut server) = UnixStream::pair().unwrap();
        for p in pieces {
            server.write_all(p).unwrap();
        }
        drop(server);
        Response::new(client, later(), &Cancel::new())
    }

    fn body_of(r: &mut Response) -> Result<Vec<u8>, ReadError> {
        let mut out = Vec::new();
        while let Some(p) = r.next_body()? {
            out.extend_from_slice(p);
        }
        Ok(out)
    }

    #[test]
    fn content_length_body() {
        let mut r = response(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"]);
        assert_eq!(r.head().unwrap(), 200);
        assert_eq!(body_of(&mut r).unwrap(), b"hello");
        assert_eq!(r.received(), 43);
    }

    #[test]
    fn chunked_body_split_anywhere() {
        let mut r = response(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab",
            b"c\r\n2\r\nde\r\n0\r\n\r\n",
        ]);
        assert_eq!(body_of(&mut r).unwrap(), b"abcde");
    }

    #[test]
    fn read_to_close_body() {
        let mut r = response(&[b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"the end"]);
        assert_eq!(body_of(&mut r).unwrap(), b"until the end");
    }

    #[test]
    fn truncated_bodies_are_closed() {
        let mut r = response(&[b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello"]);
        assert!(matches!(body_of(&mut r), Err(ReadError::Closed)));
        let mut r = response(&[b"HTTP/1.1 200 OK\r\nContent-"]);
        assert!(matches!(r.head(), Err(ReadError::Closed)));
        let mut r = response(&[]);
        assert!(matches!(r.head(), Err(ReadError::Closed)));
    }

    #[test]
    fn head_cap_is_16_kib() {
        let head = |len: usize| {
            let fixed = "HTTP/1.1 200 OK\r\nX: \r\nContent-Length: 0\r\n\r\n".len();
            format!(
                "HTTP/1.1 200 OK\r\nX: {}\r\nContent-Length: 0\r\n\r\n",
                "a".repeat(len - fixed)
            )
        };
        let (client, mut server) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || server.write_all(head(HEAD_CAP).as_bytes()));
        assert_eq!(
            Response::new(client, later(), &Cancel::new())
                .head()
                .unwrap(),
            200
        );
        writer.join().unwrap().unwrap();
        let (client, mut server) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || server.write_all(head(HEAD_CAP + 1).as_bytes()));
        let e = Response::new(client, later(), &Cancel::new())
            .head()
            .unwrap_err();
        assert!(
            matches!(e, ReadError::Http(HttpError::HeadersTooLarge)),
            "{e:?}"
        );
        let _ = writer.join().unwrap();
    }

    #[test]
    fn body_cap_is_4_mib() {
        let at = format!("HTTP/1.1 200 OK\r\nContent-Length: {BODY_CAP}\r\n\r\n");
        let (client, mut server) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            server.write_all(at.as_bytes())?;
            server.write_all(&vec![b'x'; BODY_CAP])
        });
        assert_eq!(
            Response::new(client, later(), &Cancel::new())
                .read_body()
                .unwrap()
                .len(),
            BODY_CAP
        );
        writer.join().unwrap().unwrap();
        let over = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            BODY_CAP + 1
        );
        let mut r = response(&[over.as_bytes()]);
        assert!(matches!(
            r.read_body(),
            Err(ReadError::Http(HttpError::BodyTooLarge))
        ));
        // Without a length the cap is found by counting.
        let (client, mut server) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            server.write_all(b"HTTP/1.1 200 OK\r\n\r\n")?;
            server.write_all(&vec![b'x'; BODY_CAP + 1])
        });
        let mut r = Response::new(client, later(), &Cancel::new());
        let e = r.read_body().map(|b| b.len());
        assert!(
            matches!(e, Err(ReadError::Http(HttpError::BodyTooLarge))),
            "{e:?}"
        );
        drop(r);
        let _ = writer.join().unwrap();
    }

    #[test]
    fn error_body_is_cut_at_the_cap() {
        let long = format!("HTTP/1.1 400 Bad Request\r\n\r\n{}", "e".repeat(10_000));
        let (status, body) = response(&[long.as_bytes()]).error_body(4096).unwrap();
        assert_eq!((status, body.len()), (400, 4096));
        let short = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nloading";
        let got = response(&[short]).error_body(4096).unwrap();
        assert_eq!(got, (503, b"loading".to_vec()));
    }

    #[test]
    fn a_trickled_response_times_out_at_its_deadline_keeping_what_came() {
        let (client, mut server) = UnixStream::pair().unwrap();
        // The head at once (a loaded box must not miss the deadline before it), then the
        // body a byte at a time, never all of it.
        let writer = std::thread::spawn(move || {
            if server
                .write_all(b"HTTP/1.1 500 Oops\r\nContent-Length: 50\r\n\r\n")
                .is_err()
            {
                return;
            }
            for b in b"slow and steady" {
                if server.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(1_500));
        });
        let start = Instant::now();
        let mut r = Response::new(client, start + Duration::from_millis(600), &Cancel::new());
        let (status, kept) = r.error_body(4096).unwrap();
        let took = start.elapsed();
        assert_eq!(status, 500);
        assert!(b"slow and steady".starts_with(&kept), "{kept:?}");
        assert!(
            took >= Duration::from_millis(600) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(matches!(r.next_body(), Err(ReadError::Timeout)));
        drop(r);
        writer.join().unwrap();
        // Silence before the head is the same deadline.
        let (client, _server) = UnixStream::pair().unwrap();
        let mut r = Response::new(
            client,
            Instant::now() + Duration::from_millis(30),
            &Cancel::new(),
        );
        assert!(matches!(r.head(), Err(ReadError::Timeout)));
    }

    #[test]
    fn request_is_one_write_with_connection_close() {
        let dir = llama_harness::temp_dir("loopd-http");
        let path = dir.join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let never = Cancel::new();
        let r = request(
            &path,
            "POST",
            "/x?y=1",
            Some(b"{}"),
            Duration::from_secs(5),
            &never,
        )
        .unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        drop(r);
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "POST /x?y=1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: */*\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
        let missing = request(
            &dir.join("none.sock"),
            "GET",
            "/",
            None,
            Duration::from_secs(5),
            &never,
        );
        assert!(
            matches!(missing, Err(SendError::Io(ref e)) if e.kind() == io::ErrorKind::NotFound),
            "{missing:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// What one timed read of a response stream brought ([`read_within`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRead {
    /// This many bytes, at the start of the buffer.
    Bytes(usize),
    /// The server closed the stream, or reset it (the server going away, like a close).
    Eof,
    /// Nothing within the wait.
    TimedOut,
    /// A signal interrupted the read; try again.
    Interrupted,
}

/// One read of what `stream` already holds into `buf`, without waiting: `TimedOut` when it
/// holds nothing. The socket is blocking again when it returns.
pub fn read_now(stream: &mut UnixStream, buf: &mut [u8]) -> StreamRead {
    use std::io::Read as _;
    let read = stream.set_nonblocking(true).and_then(|()| stream.read(buf));
    let restored = stream.set_nonblocking(false);
    match (read, restored) {
        // A socket that cannot be made blocking again is no use to its next read.
        (_, Err(_)) | (Ok(0), _) => StreamRead::Eof,
        (Ok(n), Ok(())) => StreamRead::Bytes(n),
        (Err(e), Ok(())) if e.kind() == io::ErrorKind::WouldBlock => StreamRead::TimedOut,
        (Err(e), Ok(())) if e.kind() == io::ErrorKind::Interrupted => StreamRead::Interrupted,
        (Err(_), Ok(())) => StreamRead::Eof,
    }
}

/// One read of `stream` into `buf`, waiting at most about `wait`: the read timeout set last is
/// kept in `timeout` and set again only when it must shrink or would wake far too early (a
/// timeout a little under the one wanted only wakes the caller early, whose machine ignores a
/// timer that is not due). While a stream flows the wait is the same each time and the system
/// call is saved. The drivers of `ChatExchange` and `AgentRequest` both read this way.
pub fn read_within(
    stream: &mut UnixStream,
    buf: &mut [u8],
    wait: Duration,
    timeout: &mut Option<Duration>,
) -> StreamRead {
    use std::io::Read as _;
    let set = match *timeout {
        Some(t) if t <= wait && t >= wait / 2 => Ok(()),
        _ => stream
            .set_read_timeout(Some(wait))
            .map(|()| *timeout = Some(wait)),
    };
    match set.and_then(|()| stream.read(buf)) {
        Ok(0) => StreamRead::Eof,
        Ok(n) => StreamRead::Bytes(n),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            StreamRead::TimedOut
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => StreamRead::Interrupted,
        Err(_) => StreamRead::Eof,
    }
}
