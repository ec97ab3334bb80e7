//! llama-worker's status socket protocol, written once for both ends: the daemon
//! (`llama-worker`'s `serve.rs`) and its clients (`llama-worker status|start|stop|stall` and
//! loopd's request runner).
//!
//! One command per connection: the client writes one line ([`Command`], at most
//! [`MAX_COMMAND_BYTES`]), the daemon answers one JSON line (at most [`MAX_ANSWER_BYTES`]) and
//! closes. `status`, `start` and `stop` answer the status object (its `state` is a [`State`],
//! its `last_cause` a [`RestartCause`], by their wire names); `stall` answers a
//! [`StallAnswer`]; anything else answers `{"error": "..."}` ([`error_reply`]). The client
//! ([`call`], [`status`], [`report_stall`], [`metrics`]) has a deadline on every step.
//!
//! `metrics` is the one command whose answer is not one JSON line: it is the worker's
//! counters in the Prometheus text format (OpenMetrics 1.0 text), many lines, the last one
//! [`METRICS_END`] (`# EOF\n`); then the daemon closes. A client reads to the end of the stream
//! (at most [`MAX_METRICS_BYTES`]) and an answer that does not end with [`METRICS_END`] was cut
//! short.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest command line the daemon accepts.
pub const MAX_COMMAND_BYTES: usize = 64;

/// Longest answer line a client reads.
pub const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// Longest `metrics` answer a client reads.
pub const MAX_METRICS_BYTES: u64 = 64 * 1024;

/// The last line of a `metrics` answer, as in OpenMetrics.
pub const METRICS_END: &str = "# EOF\n";

/// A command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Read the status.
    Status,
    /// Start again after `failed` or `stop` (clears the restart window).
    Start,
    /// Stop the server but keep the daemon.
    Stop,
    /// A request saw no progress: restart if the worker saw none either.
    Stall,
    /// The counters in the Prometheus text format, ending with [`METRICS_END`].
    Metrics,
}

impl Command {
    /// Every command, in the order the usage text names them.
    pub const ALL: [Command; 5] = [
        Command::Status,
        Command::Start,
        Command::Stop,
        Command::Stall,
        Command::Metrics,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Status => "status",
            Command::Start => "start",
            Command::Stop => "stop",
            Command::Stall => "stall",
            Command::Metrics => "metrics",
        }
    }

    /// The command a line names (surrounding white space ignored).
    pub fn parse(line: &str) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.as_str() == line.trim())
    }
}

/// The worker's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not running, and not meant to be (initially, and after `stop`).
    Stopped,
    /// First start: spawned or spawning, waiting for readiness.
    Starting,
    /// The server answers readiness probes; requests may be sent.
    Ready,
    /// A restart is under way: killing, backing off, spawning or waiting for readiness.
    Restarting,
    /// Crash-loop protection tripped; stays so until `start` is called again.
    Failed,
}

impl State {
    const ALL: [State; 5] = [
        State::Stopped,
        State::Starting,
        State::Ready,
        State::Restarting,
        State::Failed,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Stopped => "stopped",
            State::Starting => "starting",
            State::Ready => "ready",
            State::Restarting => "restarting",
            State::Failed => "failed",
        }
    }

    /// The state a wire name names.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// What triggered a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartCause {
    /// The process exited (or could not be spawned) while it was meant to run.
    Exited,
    /// Not ready by the startup deadline.
    StartupTimeout,
    /// Readiness probes failed while ready, with flat CPU time, beyond the threshold.
    Unready,
    /// A stall was reported and there was no progress within `stall_timeout`.
    Stall,
    /// A model instance behind the router exited (failed to load, or died while serving),
    /// as the router's per-model status said: the same crash-loop event as a server exit.
    ModelExited,
    /// A local RPC server of the unit exited: the same crash-loop event as a server exit.
    RpcExited,
    /// A local RPC server did not accept connections by the startup deadline.
    RpcStartupTimeout,
}

impl RestartCause {
    /// Every cause, in the order the metrics list them.
    pub const ALL: [RestartCause; 7] = [
        RestartCause::Exited,
        RestartCause::StartupTimeout,
        RestartCause::Unready,
        RestartCause::Stall,
        RestartCause::ModelExited,
        RestartCause::RpcExited,
        RestartCause::RpcStartupTimeout,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartCause::Exited => "exited",
            RestartCause::StartupTimeout => "startup_timeout",
            RestartCause::Unready => "unready",
            RestartCause::Stall => "stall",
            RestartCause::ModelExited => "model_exited",
            RestartCause::RpcExited => "rpc_exited",
            RestartCause::RpcStartupTimeout => "rpc_startup_timeout",
        }
    }
}

/// The worker's answer to `stall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallAnswer {
    /// No progress within its own stall timeout: the worker is restarting the server.
    Restarting,
    /// The worker was not ready; nothing was done.
    NotReady,
    /// The worker saw progress (CPU time) this long ago: no restart.
    NotStalled {
        /// Time since the worker's last evidence of progress, in milliseconds.
        since_progress_ms: u64,
    },
}

/// Seconds with millisecond precision, as every duration on the wire.
pub fn secs(d: Duration) -> f64 {
    // Exact: a u128 of milliseconds below 2^53 converts without rounding.
    d.as_millis() as f64 / 1000.0
}

#[derive(Serialize, Deserialize)]
struct StallJson<'a> {
    stall: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    since_progress_s: Option<f64>,
}

impl StallAnswer {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StallAnswer::Restarting => "restarting",
            StallAnswer::NotReady => "not_ready",
            StallAnswer::NotStalled { .. } => "not_stalled",
        }
    }

    /// The answer line (without its newline).
    pub fn to_json(self) -> String {
        let since_progress_s = match self {
            StallAnswer::NotStalled { since_progress_ms } => {
                Some(secs(Duration::from_millis(since_progress_ms)))
            }
            _ => None,
        };
        let json = StallJson {
            stall: self.as_str(),
            since_progress_s,
        };
        // A string and a number: serializing cannot fail.
        serde_json::to_string(&json).unwrap_or_default()
    }

    /// Parses an answer line.
    pub fn parse(line: &str) -> Result<StallAnswer, WorkerError> {
        let raw: StallJson<'_> = serde_json::from_str(line).map_err(|_| bad(line))?;
        match raw.stall {
            "restarting" => Ok(StallAnswer::Restarting),
            "not_ready" => Ok(StallAnswer::NotReady),
            "not_stalled" => {
                let s = raw.since_progress_s.unwrap_or(0.0);
                let ms = if s.is_finite() && s > 0.0 {
                    (s * 1000.0).round().min(u64::MAX as f64) as u64
                } else {
                    0
                };
                Ok(StallAnswer::NotStalled {
                    since_progress_ms: ms,
                })
            }
            _ => Err(bad(line)),
        }
    }
}

/// The answer to a line that is not a command, or is too long.
pub fn error_reply(what: &str) -> String {
    #[derive(Serialize)]
    struct ErrorJson<'a> {
        error: &'a str,
    }
    serde_json::to_string(&ErrorJson { error: what }).unwrap_or_default()
}

/// The part of the status object a client acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStatus {
    /// The lifecycle state.
    pub state: State,
    /// Servers spawned since the worker began: a request admitted under one spawn that sees
    /// another was cut by a restart.
    pub spawns: u64,
    /// The wire name of what caused the latest restart (a [`RestartCause`], kept as text so
    /// that a cause added later still parses).
    pub last_cause: Option<String>,
    /// While failed: the worker's one-sentence reason (the cause, the model and its exit
    /// status, the server log).
    pub reason: Option<String>,
}

impl WorkerStatus {
    /// Whether the latest restart was the server, or a model instance behind it, dying on its
    /// own.
    pub fn server_died(&self) -> bool {
        [RestartCause::Exited, RestartCause::ModelExited]
            .iter()
            .any(|c| self.last_cause.as_deref() == Some(c.as_str()))
    }

    /// Parses a status answer line (other keys are read past).
    pub fn parse(line: &str) -> Result<WorkerStatus, WorkerError> {
        #[derive(Deserialize)]
        struct Raw {
            state: String,
            spawns: u64,
            last_cause: Option<String>,
            #[serde(default)]
            reason: Option<String>,
        }
        let raw: Raw = serde_json::from_str(line).map_err(|_| bad(line))?;
        let state = State::parse(&raw.state).ok_or_else(|| bad(line))?;
        Ok(WorkerStatus {
            state,
            spawns: raw.spawns,
            last_cause: raw.last_cause,
            reason: raw.reason,
        })
    }
}

/// Why a call to the status socket failed.
#[derive(Debug)]
pub enum WorkerError {
    /// Connecting, writing or reading failed or ran out of time.
    Io(std::io::Error),
    /// The answer was not the JSON the protocol says (its first 200 characters).
    BadAnswer(String),
}

fn bad(line: &str) -> WorkerError {
    WorkerError::BadAnswer(line.chars().take(200).collect())
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::Io(e) => write!(f, "llama-worker status socket: {e}"),
            WorkerError::BadAnswer(a) => write!(f, "llama-worker status socket answered: {a}"),
        }
    }
}

impl std::error::Error for WorkerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkerError::Io(e) => Some(e),
            WorkerError::BadAnswer(_) => None,
        }
    }
}

/// Sends `command` to the daemon at `socket` and returns its answer line (without the
/// newline), connecting, writing and reading each within `timeout`.
pub fn call(socket: &Path, command: Command, timeout: Duration) -> Result<String, WorkerError> {
    call_line(socket, command.as_str(), timeout)
}

/// [`call`] with any line, for a caller that wants the daemon's own answer to a line that is
/// not a command (its `{"error": ...}`).
pub fn call_line(socket: &Path, line: &str, timeout: Duration) -> Result<String, WorkerError> {
    let mut s = UnixStream::connect(socket).map_err(WorkerError::Io)?;
    s.set_read_timeout(Some(timeout)).map_err(WorkerError::Io)?;
    s.set_write_timeout(Some(timeout))
        .map_err(WorkerError::Io)?;
    s.write_all(format!("{line}\n").as_bytes())
        .map_err(WorkerError::Io)?;
    let mut answer = String::new();
    BufReader::new(s.take(MAX_ANSWER_BYTES))
        .read_line(&mut answer)
        .map_err(WorkerError::Io)?;
    Ok(answer.trim_end().to_owned())
}

/// Reads the worker's counters: the text up to and with its [`METRICS_END`] line. An answer
/// longer than [`MAX_METRICS_BYTES`] or without that line is a [`WorkerError::BadAnswer`].
pub fn metrics(socket: &Path, timeout: Duration) -> Result<String, WorkerError> {
    let mut s = UnixStream::connect(socket).map_err(WorkerError::Io)?;
    s.set_read_timeout(Some(timeout)).map_err(WorkerError::Io)?;
    s.set_write_timeout(Some(timeout))
        .map_err(WorkerError::Io)?;
    s.write_all(format!("{}\n", Command::Metrics.as_str()).as_bytes())
        .map_err(WorkerError::Io)?;
    let mut text = String::new();
    s.take(MAX_METRICS_BYTES)
        .read_to_string(&mut text)
        .map_err(WorkerError::Io)?;
    if text.ends_with(METRICS_END) {
        Ok(text)
    } else {
        Err(bad(&text))
    }
}

/// Reads the worker's status.
pub fn status(socket: &Path, timeout: Duration) -> Result<WorkerStatus, WorkerError> {
    WorkerStatus::parse(&call(socket, Command::Status, timeout)?)
}

/// Reports a stall and returns the worker's verdict.
pub fn report_stall(socket: &Path, timeout: Duration) -> Result<StallAnswer, WorkerError> {
    StallAnswer::parse(&call(socket, Command::Stall, timeout)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_states_and_causes_by_their_wire_names() {
        for c in Command::ALL {
            assert_eq!(Command::parse(&format!(" {}\n", c.as_str())), Some(c));
        }
        assert_eq!(Command::parse("restart"), None);
        assert_eq!(Command::parse("metrics\n"), Some(Command::Metrics));
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert_eq!(State::parse("dancing"), None);
        assert_eq!(RestartCause::StartupTimeout.as_str(), "startup_timeout");
    }

    #[test]
    fn status_lines_as_the_daemon_writes_them() {
        let line = "{\"state\":\"restarting\",\"pid\":42,\"pgid\":41,\"port\":8080,\
             \"consecutive_restarts\":2,\"total_restarts\":0,\"spawns\":3,\"last_cause\":\"exited\",\
             \"cpu_ticks\":1234,\"cpu_progress_age_s\":1.500,\"last_readiness\":null,\"inflight\":0}";
        let s = WorkerStatus::parse(line).unwrap();
        assert_eq!(
            s,
            WorkerStatus {
                state: State::Restarting,
                spawns: 3,
                last_cause: Some("exited".into()),
                reason: None,
            }
        );
        assert!(s.server_died());
        // A failed worker's line, as llama-worker writes it since issue 20.
        let line = "{\"state\":\"failed\",\"spawns\":6,\"last_cause\":\"model_exited\",\
             \"reason\":\"crash-loop protection: 6 failures in a row (5 restarts) without 600 s \
             ready, the last because model m failed to load: its instance exited with status 1; \
             server log: /x.log\"}";
        let s = WorkerStatus::parse(line).unwrap();
        assert!(s.server_died());
        assert!(s
            .reason
            .unwrap()
            .ends_with("exited with status 1; server log: /x.log"));
        for bad in ["", "{}", "{\"state\":\"dancing\",\"spawns\":0}", "not json"] {
            assert!(
                matches!(WorkerStatus::parse(bad), Err(WorkerError::BadAnswer(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn stall_answers_round_trip() {
        let answers = [
            StallAnswer::Restarting,
            StallAnswer::NotReady,
            StallAnswer::NotStalled {
                since_progress_ms: 1_250,
            },
        ];
        let lines: Vec<String> = answers.iter().map(|a| a.to_json()).collect();
        assert_eq!(
            lines,
            [
                "{\"stall\":\"restarting\"}",
                "{\"stall\":\"not_ready\"}",
                "{\"stall\":\"not_stalled\",\"since_progress_s\":1.25}"
            ]
        );
        for (a, l) in answers.iter().zip(&lines) {
            assert_eq!(StallAnswer::parse(l).unwrap(), *a);
        }
        assert!(StallAnswer::parse("{\"error\":\"unknown command\"}").is_err());
        assert!(StallAnswer::parse("{\"stall\":\"maybe\"}").is_err());
        assert_eq!(
            error_reply("command too long"),
            "{\"error\":\"command too long\"}"
        );
    }

    #[test]
    fn a_socket_that_is_not_there_is_an_io_error() {
        let e = status(
            Path::new("/nonexistent/worker.sock"),
            Duration::from_millis(50),
        );
        assert!(matches!(e, Err(WorkerError::Io(_))));
    }
}
