//! The daemon side of the status socket (created by [`crate::listen`]): one command per
//! connection.
//!
//! Protocol (the crate `worker-proto`, which loopd's runner uses too): the client writes one
//! line, `status`, `start`, `stop`, `stall` or `metrics`; the daemon answers one JSON line
//! (`metrics`: the Prometheus text, ending with `# EOF\n`) and closes. `start` is how a failed
//! worker is started again.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::Duration;

use worker_proto::{error_reply, Command, StallAnswer};

use crate::clock::SharedClock;
use crate::policy::StallVerdict;
use crate::worker::WorkerHandle;

pub use worker_proto::MAX_COMMAND_BYTES;

/// How long a socket client may take to send its command or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers one command line: the bytes to write back, newline included.
pub fn answer<C: SharedClock>(handle: &WorkerHandle<C>, command: &str) -> String {
    let json = match Command::parse(command) {
        // Many lines, the last `# EOF\n`: written as they are.
        Some(Command::Metrics) => return handle.metrics(),
        Some(Command::Status) => handle.status().to_json(),
        Some(Command::Start) => {
            handle.start();
            handle.status().to_json()
        }
        Some(Command::Stop) => {
            handle.stop();
            handle.status().to_json()
        }
        Some(Command::Stall) => match handle.report_stall() {
            StallVerdict::Restarting => StallAnswer::Restarting,
            StallVerdict::NotReady => StallAnswer::NotReady,
            StallVerdict::NotStalled { since_progress } => StallAnswer::NotStalled {
                since_progress_ms: u64::try_from(since_progress.as_millis()).unwrap_or(u64::MAX),
            },
        }
        .to_json(),
        None => error_reply("unknown command; use status, start, stop, stall or metrics"),
    };
    format!("{json}\n")
}

fn serve_one<C: SharedClock>(handle: &WorkerHandle<C>, stream: UnixStream) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_COMMAND_BYTES as u64 + 1)).read_line(&mut line)?;
    let reply = if line.len() > MAX_COMMAND_BYTES {
        format!("{}\n", error_reply("command too long"))
    } else {
        answer(handle, &line)
    };
    (&stream).write_all(reply.as_bytes())
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
