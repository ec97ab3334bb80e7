//! HTTP/1.1 over a `UnixStream`: one request per connection, `Connection: close`.
//!
//! [`request`] connects and writes one request; [`Response`] reads the status line and headers
//! (at most [`HEAD_CAP`], 16 KiB) with `http-nostd`, then offers the body piece by piece,
//! whether chunked, content-length or read-to-close, or collected into a [`BODY_CAP`] (4 MiB)
//! heap buffer. A socket read timeout surfaces as [`ReadError::Timeout`] and leaves the
//! response readable, so a caller can do something else and read on. No TCP here: loopd
//! reaches the model only through inferproxy's socket.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use http_nostd::{BodyBuffer, Event, HttpError, ResponseReader};

pub use http_nostd::{BODY_CAP, HEAD_CAP};

use crate::llama::{capped_body, InferError, Silence, ERROR_BODY_CAP};

/// Bytes read from the socket at a time.
pub const READ_CHUNK: usize = 16 * 1024;

/// A heap array of `N` zero bytes, made without building it on the stack.
pub fn heap_array<const N: usize>() -> Box<[u8; N]> {
    vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .expect("the vec has exactly N bytes")
}

/// Why reading a response stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The socket's read timeout expired; the response can be read on.
    Timeout,
    /// The connection ended before the response was complete.
    Closed,
    /// Reading failed.
    Io(io::Error),
    /// The bytes are not a valid response, or broke a cap.
    Http(HttpError),
}

impl ReadError {
    /// The client error for this, where a timeout means the server went silent.
    pub fn into_infer(self) -> InferError {
        match self {
            ReadError::Timeout => InferError::Stalled(Silence::Liveness),
            ReadError::Closed => InferError::StreamClosedEarly,
            // A reset mid-response is the server going away, like a close.
            ReadError::Io(_) => InferError::StreamClosedEarly,
            ReadError::Http(e) => InferError::from(e),
        }
    }
}

/// Connects to `socket` and sends one request; `body` goes out as `application/json`.
pub fn request(
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> Result<Response, InferError> {
    let connect = |source| InferError::Connect {
        socket: socket.to_owned(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(connect)?;
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
    // One write for small requests, so the server sees the request whole.
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    stream.write_all(&bytes).map_err(connect)?;
    Ok(Response::new(stream))
}

/// The response of one request, read as it arrives.
pub struct Response {
    stream: UnixStream,
    reader: ResponseReader<Box<[u8; HEAD_CAP]>, HEAD_CAP>,
    buf: Box<[u8; READ_CHUNK]>,
    pos: usize,
    len: usize,
    received: u64,
    eof: bool,
    has_head: bool,
    after_first_byte: Option<Duration>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Response {
    /// Reads the response to a request already written on `stream`.
    pub fn new(stream: UnixStream) -> Response {
        Response {
            stream,
            reader: ResponseReader::new(heap_array::<HEAD_CAP>()),
            buf: heap_array::<READ_CHUNK>(),
            pos: 0,
            len: 0,
            received: 0,
            eof: false,
            has_head: false,
            after_first_byte: None,
        }
    }

    /// Sets the socket read timeout (`None` blocks).
    pub fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Switches the read timeout to `timeout` as soon as the first byte arrives (the wait for
    /// a first byte and the silence allowed after it are different limits).
    pub fn set_timeout_after_first_byte(&mut self, timeout: Duration) {
        self.after_first_byte = Some(timeout);
    }

    /// Bytes received from the socket so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Reads from the socket once: `Ok(false)` at the end of the stream.
    fn fill(&mut self) -> Result<bool, ReadError> {
        loop {
            match self.stream.read(&mut self.buf[..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    if let (0, Some(t)) = (self.received, self.after_first_byte) {
                        self.stream
                            .set_read_timeout(Some(t))
                            .map_err(ReadError::Io)?;
                    }
                    self.pos = 0;
                    self.len = n;
                    self.received += n as u64;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ReadError::Timeout)
                }
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
                Event::Head => self.has_head = true,
                Event::NeedMore => {}
                // The reader reports the head before any body byte or the end.
                Event::Body(_) | Event::End => unreachable!("body before head"),
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
                Event::Body(piece) => {
                    // `piece` lies inside what was just consumed; return it from our buffer.
                    let offset = piece.as_ptr() as usize - self.buf[start..].as_ptr() as usize;
                    return Ok(Some(
                        &self.buf[start + offset..start + offset + piece.len()],
                    ));
                }
                Event::End => return Ok(None),
                Event::NeedMore | Event::Head => {}
            }
        }
    }

    /// Collects the whole body into a [`BODY_CAP`] heap buffer; over the cap is an error.
    pub fn read_body(&mut self) -> Result<BodyBuffer<Box<[u8; BODY_CAP]>, BODY_CAP>, ReadError> {
        if !self.has_head {
            self.head()?;
        }
        let mut body = BodyBuffer::new(heap_array::<BODY_CAP>());
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

    /// The body of an error response as [`InferError::Http`], cut at [`ERROR_BODY_CAP`]
    /// bytes (the rest is not read). A body that breaks off keeps what arrived.
    pub fn into_http_error(mut self) -> InferError {
        if let Err(e) = self.head() {
            return e.into_infer();
        }
        let status = self.status();
        let mut kept = Vec::new();
        while kept.len() < ERROR_BODY_CAP {
            match self.next_body() {
                Ok(Some(piece)) => kept.extend_from_slice(piece),
                _ => break,
            }
        }
        InferError::Http {
            status,
            body: capped_body(&kept),
        }
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

    /// A response over a socket pair, the server side written in `pieces`.
    fn response(pieces: &[&[u8]]) -> Response {
        let (client, mut server) = UnixStream::pair().unwrap();
        for p in pieces {
            server.write_all(p).unwrap();
        }
        drop(server);
        Response::new(client)
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
        assert_eq!(Response::new(client).head().unwrap(), 200);
        writer.join().unwrap().unwrap();
        let (client, mut server) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || server.write_all(head(HEAD_CAP + 1).as_bytes()));
        let e = Response::new(client).head().unwrap_err();
        assert!(
            matches!(e, ReadError::Http(HttpError::HeadersTooLarge)),
            "{e:?}"
        );
        assert!(matches!(e.into_infer(), InferError::Protocol(_)));
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
        assert_eq!(Response::new(client).read_body().unwrap().len(), BODY_CAP);
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
        let mut r = Response::new(client);
        let e = r.read_body().map(|b| b.len());
        assert!(
            matches!(e, Err(ReadError::Http(HttpError::BodyTooLarge))),
            "{e:?}"
        );
        drop(r);
        let _ = writer.join().unwrap();
    }

    #[test]
    fn error_body_is_cut_at_4_kib() {
        let long = format!("HTTP/1.1 400 Bad Request\r\n\r\n{}", "e".repeat(10_000));
        let e = response(&[long.as_bytes()]).into_http_error();
        match e {
            InferError::Http { status, body } => assert_eq!((status, body.len()), (400, 4096)),
            other => panic!("{other:?}"),
        }
        let short = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nloading";
        let e = response(&[short]).into_http_error();
        assert!(matches!(e, InferError::Http { status: 503, ref body } if body == "loading"));
    }

    #[test]
    fn timeout_leaves_the_response_readable() {
        let (client, mut server) = UnixStream::pair().unwrap();
        let mut r = Response::new(client);
        r.set_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(matches!(r.head(), Err(ReadError::Timeout)));
        server
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            .unwrap();
        assert_eq!(r.head().unwrap(), 200);
        assert!(matches!(r.next_body(), Err(ReadError::Timeout)));
        server.write_all(b"ok").unwrap();
        assert_eq!(body_of(&mut r).unwrap(), b"ok");
    }

    #[test]
    fn request_is_one_write_with_connection_close() {
        let dir = std::env::temp_dir().join(format!("loopd-http-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let r = request(&path, "POST", "/x?y=1", Some(b"{}")).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        drop(r);
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "POST /x?y=1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: */*\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
        let missing = request(&dir.join("none.sock"), "GET", "/", None).unwrap_err();
        assert!(
            matches!(missing, InferError::Connect { ref source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
