//! The daemon side of the status socket (created by [`crate::listen`]): one command per
//! connection.
//!
//! Protocol (the crate `worker-proto`, which loopd's runner uses too): the client writes one
//! line, `status`, `start`, `stop`, `stall [<id>]`, `metrics`, `register <slot>`,
//! `progress <id> first_byte|bytes` or `done <id>`; the daemon answers one JSON line
//! (`metrics`: the Prometheus text, ending with `# EOF\n`) and closes. `start` is how a failed
//! worker is started again. `watch` keeps the connection open on a thread of its own and writes
//! one event line per state change and failed generation, and a ping each
//! [`WATCH_KEEPALIVE`] of silence; a write that fails or takes longer than [`CLIENT_TIMEOUT`]
//! ends it. `start` and `stop` are answered only once every open watch has written the state
//! they set (or after [`FLUSH_WITHIN`]), so a client that heard the answer has the new state
//! in its watch socket already.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::RecvTimeoutError;
use std::thread;
use std::time::Duration;

use worker_proto::{
    error_reply, Ack, Command, RegisterAnswer, Request, RequestError, StallAnswer, WatchEvent,
    WATCH_KEEPALIVE,
};

use crate::clock::SharedClock;
use crate::policy::{Refusal, StallVerdict, State};
use crate::worker::{Push, WorkerHandle};

pub use worker_proto::MAX_COMMAND_BYTES;

/// How long a socket client may take to send its command or read the answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the answer to `start` or `stop` waits for the open watches to have written the
/// new state (a watch client that does not read is not waited for longer).
pub const FLUSH_WITHIN: Duration = Duration::from_millis(500);

fn stall_answer(v: StallVerdict) -> String {
    match v {
        StallVerdict::Restarting => StallAnswer::Restarting,
        StallVerdict::NotReady => StallAnswer::NotReady,
        StallVerdict::NotStalled { since_progress } => StallAnswer::NotStalled {
            since_progress_ms: u64::try_from(since_progress.as_millis()).unwrap_or(u64::MAX),
        },
    }
    .to_json()
}

fn ack(known: bool) -> String {
    if known { Ack::Ok } else { Ack::Unknown }.to_json()
}

/// Answers one command line: the bytes to write back, newline included. (`watch` is served
/// by the connection's own thread; here it is answered with an error line.)
pub fn answer<C: SharedClock>(handle: &WorkerHandle<C>, command: &str) -> String {
    let json = match Request::parse(command) {
        // Many lines, the last `# EOF\n`: written as they are.
        Ok(Request::Command(Command::Metrics)) => return handle.metrics(),
        Ok(Request::Command(Command::Status)) => handle.status().to_json(),
        Ok(Request::Command(Command::Start)) => {
            handle.start();
            handle.flush_watches(FLUSH_WITHIN);
            handle.status().to_json()
        }
        Ok(Request::Command(Command::Stop)) => {
            handle.stop();
            handle.flush_watches(FLUSH_WITHIN);
            handle.status().to_json()
        }
        Ok(Request::Command(Command::Stall)) => stall_answer(handle.report_stall()),
        Ok(Request::StallOf { id }) => stall_answer(handle.report_stall_of(id)),
        Ok(Request::Register { slot, watch }) => match handle.register_owned(slot, watch) {
            Ok(id) => RegisterAnswer::Registered(id),
            Err(Refusal::SlotTaken) => RegisterAnswer::SlotTaken,
            Err(r) => RegisterAnswer::Refused(match r {
                Refusal::Failed => State::Failed,
                Refusal::Stopped => State::Stopped,
                _ => handle.state(),
            }),
        }
        .to_json(),
        Ok(Request::Progress { id, kind }) => ack(handle.progress(id, kind)),
        Ok(Request::Done { id }) => ack(handle.done(id)),
        Ok(Request::Watch) => error_reply("watch needs a connection of its own"),
        // The words of the first protocol, answered as before.
        Err(RequestError::Unknown) => {
            error_reply("unknown command; use status, start, stop, stall or metrics")
        }
        Err(e) => error_reply(&e.to_string()),
    };
    format!("{json}\n")
}

/// Serves one `watch` connection until its client goes away or a write times out.
fn serve_watch<C: SharedClock>(handle: &WorkerHandle<C>, stream: &UnixStream) -> io::Result<()> {
    let Some((id, rx)) = handle.watch() else {
        let reply = error_reply(&format!(
            "too many watch connections (at most {})",
            worker_proto::MAX_WATCHERS
        ));
        return (&*stream).write_all(format!("{reply}\n").as_bytes());
    };
    let result = (|| loop {
        let event = match rx.recv_timeout(WATCH_KEEPALIVE) {
            Ok(Push::Event(e)) => e,
            // Everything queued before it is written.
            Ok(Push::Flushed(done)) => {
                let _ = done.send(());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => WatchEvent::Ping,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        (&*stream).write_all(format!("{}\n", event.to_json()).as_bytes())?;
    })();
    drop(rx);
    handle.unwatch(id);
    result
}

fn serve_one<C: SharedClock>(handle: &WorkerHandle<C>, stream: UnixStream) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_COMMAND_BYTES as u64 + 1)).read_line(&mut line)?;
    let reply = if line.len() > MAX_COMMAND_BYTES {
        format!("{}\n", error_reply("command too long"))
    } else if Request::parse(&line) == Ok(Request::Watch) {
        let handle = handle.clone();
        // Open for as long as the client reads: on a thread of its own.
        thread::spawn(move || serve_watch(&handle, &stream));
        return Ok(());
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
