//! One reply line to a client: what the listener, a connection's handler and a follower all
//! write, and nothing else, so each of them can depend on it and none on another.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;

/// Writes `line` and a newline within the stream's write timeout.
pub(super) fn send(stream: &UnixStream, line: &str) -> io::Result<()> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    (&*stream).write_all(&buf)
}
