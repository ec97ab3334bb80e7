//! The client side of the status socket: one command, one JSON line back.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long the client waits for the daemon's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `command` to the daemon at `path`, returns its JSON line (without the newline).
pub fn query(path: &Path, command: &str) -> io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    s.set_write_timeout(Some(ANSWER_TIMEOUT))?;
    s.write_all(format!("{command}\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.trim_end().to_string())
}
