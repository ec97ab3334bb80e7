//! The client side of the daemon's socket: one command, its reply line, or a `follow` stream
//! of event lines up to the closing reply. Every connect, write and read has a deadline.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::protocol::MAX_LINE_BYTES;

/// Why a call to the daemon failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// Nothing listens on the socket (or it cannot be reached); the message names the path.
    Connect(io::Error),
    /// Writing the command or reading the reply failed (a timeout included).
    Io(io::Error),
    /// The daemon closed the connection before its reply.
    Closed,
    /// The reply is not a JSON object.
    BadReply(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Connect(e) => write!(
                f,
                "cannot reach the daemon: {e} (is `loopd serve` running?)"
            ),
            ClientError::Io(e) => write!(f, "talking to the daemon: {e}"),
            ClientError::Closed => f.write_str("the daemon closed the connection before its reply"),
            ClientError::BadReply(l) => write!(f, "the daemon's reply is not a JSON object: {l}"),
        }
    }
}

impl std::error::Error for ClientError {}

fn open(
    socket: &Path,
    cmd: &Value,
    timeout: Duration,
) -> Result<BufReader<UnixStream>, ClientError> {
    // The path in the error: "No such file or directory" alone does not say which socket.
    let s = UnixStream::connect(socket).map_err(|e| {
        ClientError::Connect(io::Error::new(
            e.kind(),
            format!("{}: {e}", socket.display()),
        ))
    })?;
    s.set_read_timeout(Some(timeout)).map_err(ClientError::Io)?;
    s.set_write_timeout(Some(timeout))
        .map_err(ClientError::Io)?;
    let mut line = cmd.to_string().into_bytes();
    line.push(b'\n');
    (&s).write_all(&line).map_err(ClientError::Io)?;
    Ok(BufReader::new(s))
}

fn next_line(r: &mut BufReader<UnixStream>) -> Result<Value, ClientError> {
    let mut line = String::new();
    // A reply line holds one result: cap it as the daemon caps commands, with room for JSON.
    let n = r
        .by_ref()
        .take(16 * MAX_LINE_BYTES as u64)
        .read_line(&mut line)
        .map_err(ClientError::Io)?;
    if n == 0 {
        return Err(ClientError::Closed);
    }
    match serde_json::from_str::<Value>(&line) {
        Ok(v) if v.is_object() => Ok(v),
        _ => Err(ClientError::BadReply(
            line.trim_end().chars().take(200).collect(),
        )),
    }
}

use std::io::Read as _;

/// Sends `cmd` and returns the daemon's one reply line, each step within `timeout`.
pub fn call(socket: &Path, cmd: &Value, timeout: Duration) -> Result<Value, ClientError> {
    let mut r = open(socket, cmd, timeout)?;
    next_line(&mut r)
}

/// Sends a `follow` (or a `submit` with `follow`): calls `on_reply` with the first reply, then
/// `on_event` with each event line, and returns the closing line (the result, or an error).
/// `timeout` bounds each line, so it must exceed the daemon's longest silence.
pub fn follow(
    socket: &Path,
    cmd: &Value,
    timeout: Duration,
    on_reply: &mut dyn FnMut(&Value),
    on_event: &mut dyn FnMut(&Value),
) -> Result<Value, ClientError> {
    let mut r = open(socket, cmd, timeout)?;
    let first = next_line(&mut r)?;
    if first.get("ok") != Some(&Value::Bool(true)) {
        return Ok(first);
    }
    on_reply(&first);
    loop {
        let v = next_line(&mut r)?;
        if v.get("event").is_some() {
            on_event(&v);
        } else {
            return Ok(v);
        }
    }
}
