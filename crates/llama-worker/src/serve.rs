//! The daemon side of the status socket (created by [`crate::listen`]): one command per
//! connection.
//!
//! Protocol: the client writes one line, `status`, `start`, `stop` or `stall`; the daemon
//! answers one JSON line and closes. `start` is how a failed worker is started again.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::Duration;

use serde::Serialize;

use crate::clock::SharedClock;
use crate::policy::StallVerdict;
use crate::status::secs;
use crate::worker::WorkerHandle;

/// Longest command line accepted on the socket.
pub const MAX_COMMAND_BYTES: usize = 64;

/// How long a socket client may take to send its command or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The answers that are not a [`crate::Status`].
#[derive(Serialize)]
#[serde(untagged)]
enum Reply {
    Stall {
        stall: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        since_progress_s: Option<f64>,
    },
    Error {
        error: &'static str,
    },
}

impl Reply {
    fn to_json(&self) -> String {
        // Strings and numbers only: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Answers one command line.
pub fn answer<C: SharedClock>(handle: &WorkerHandle<C>, command: &str) -> String {
    match command.trim() {
        "status" => handle.status().to_json(),
        "start" => {
            handle.start();
            handle.status().to_json()
        }
        "stop" => {
            handle.stop();
            handle.status().to_json()
        }
        "stall" => {
            let (stall, since) = match handle.report_stall() {
                StallVerdict::Restarting => ("restarting", None),
                StallVerdict::NotReady => ("not_ready", None),
                StallVerdict::NotStalled { since_progress } => {
                    ("not_stalled", Some(secs(since_progress)))
                }
            };
            Reply::Stall {
                stall,
                since_progress_s: since,
            }
            .to_json()
        }
        _ => Reply::Error {
            error: "unknown command; use status, start, stop or stall",
        }
        .to_json(),
    }
}

fn serve_one<C: SharedClock>(handle: &WorkerHandle<C>, stream: UnixStream) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_COMMAND_BYTES as u64 + 1)).read_line(&mut line)?;
    let reply = if line.len() > MAX_COMMAND_BYTES {
        Reply::Error {
            error: "command too long",
        }
        .to_json()
    } else {
        answer(handle, &line)
    };
    (&stream).write_all(format!("{reply}\n").as_bytes())
}

/// Serves the socket on a background thread until the process exits.
pub fn spawn_status_server<C: SharedClock>(
    listener: UnixListener,
    handle: WorkerHandle<C>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(s) => {
                    let _ = serve_one(&handle, s);
                }
                Err(e) => eprintln!("llama-worker: status socket accept: {e}"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_that_are_not_a_status() {
        let r = Reply::Stall {
            stall: "not_stalled",
            since_progress_s: Some(secs(Duration::from_millis(1250))),
        };
        assert_eq!(
            r.to_json(),
            "{\"stall\":\"not_stalled\",\"since_progress_s\":1.25}"
        );
        let r = Reply::Stall {
            stall: "restarting",
            since_progress_s: None,
        };
        assert_eq!(r.to_json(), "{\"stall\":\"restarting\"}");
        let r = Reply::Error {
            error: "command too long",
        };
        assert_eq!(r.to_json(), "{\"error\":\"command too long\"}");
    }
}
