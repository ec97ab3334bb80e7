//! The client side of the status socket, for the `status|start|stop|stall` commands: the
//! protocol crate's client with the command line's patience.

use std::io;
use std::path::Path;
use std::time::Duration;

use worker_proto::{call_line, WorkerError};

/// How long the client waits for the daemon's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `command` to the daemon at `path`, returns its JSON line (without the newline).
pub fn query(path: &Path, command: &str) -> io::Result<String> {
    // Any line goes: the daemon answers one that is not a command with its own error.
    call_line(path, command, ANSWER_TIMEOUT).map_err(|e| match e {
        WorkerError::Io(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    })
}
