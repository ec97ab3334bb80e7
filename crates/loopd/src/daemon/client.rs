//! The client side of the daemon's socket: one [`Command`], its reply read into its type, or
//! a `follow` stream of [`WireEvent`]s up to the closing [`ResultReply`]. An error reply is
//! [`ClientError::Refused`] with the daemon's [`ErrorReply`]. Every connect, write and read
//! has a deadline.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read as _, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::protocol::{Command, ErrorReply, FollowReply, ResultReply, WireEvent, MAX_LINE_BYTES};

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
    /// The reply is not the message expected (the line, cut to 200 characters, and why).
    BadReply(String),
    /// The daemon answered with an error.
    Refused(ErrorReply),
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
            ClientError::BadReply(l) => write!(f, "the daemon's reply is not understood: {l}"),
            ClientError::Refused(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ClientError {}

fn open(
    socket: &Path,
    cmd: &Command,
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
    let mut line = cmd.to_line().into_bytes();
    line.push(b'\n');
    (&s).write_all(&line).map_err(ClientError::Io)?;
    Ok(BufReader::new(s))
}

/// One reply line as JSON, and the line itself for a [`ClientError::BadReply`].
fn next_line(r: &mut BufReader<UnixStream>) -> Result<(Value, String), ClientError> {
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
        Ok(v) if v.is_object() => Ok((v, line)),
        Ok(_) => Err(bad(&line, "not a JSON object")),
        Err(e) => Err(bad(&line, e)),
    }
}

fn bad(line: &str, why: impl fmt::Display) -> ClientError {
    let shown: String = line.trim_end().chars().take(200).collect();
    ClientError::BadReply(format!("{shown} ({why})"))
}

/// The reply read into `R`, or the daemon's error.
fn typed<R: DeserializeOwned>((v, line): (Value, String)) -> Result<R, ClientError> {
    if v.get("ok") == Some(&Value::Bool(false)) {
        return Err(serde_json::from_value::<ErrorReply>(v)
            .map_or_else(|e| bad(&line, e), ClientError::Refused));
    }
    serde_json::from_value(v).map_err(|e| bad(&line, e))
}

/// Sends `cmd` and returns the daemon's one reply line read into `R`, each step within
/// `timeout`.
pub fn call<R: DeserializeOwned>(
    socket: &Path,
    cmd: &Command,
    timeout: Duration,
) -> Result<R, ClientError> {
    let mut r = open(socket, cmd, timeout)?;
    typed(next_line(&mut r)?)
}

/// Sends a `follow` (or a `submit` with `follow`): calls `on_reply` with the first reply, then
/// `on_event` with each event, and returns the closing result (an error reply, such as
/// `FOLLOWER_DROPPED`, is [`ClientError::Refused`]). `timeout` bounds each line, so it must
/// exceed the daemon's longest silence.
pub fn follow(
    socket: &Path,
    cmd: &Command,
    timeout: Duration,
    on_reply: &mut dyn FnMut(&FollowReply),
    on_event: &mut dyn FnMut(&WireEvent),
) -> Result<ResultReply, ClientError> {
    let mut r = open(socket, cmd, timeout)?;
    let first: FollowReply = typed(next_line(&mut r)?)?;
    on_reply(&first);
    loop {
        let (v, line) = next_line(&mut r)?;
        if v.get("event").is_some() {
            on_event(&serde_json::from_value(v).map_err(|e| bad(&line, e))?);
        } else {
            return typed((v, line));
        }
    }
}
