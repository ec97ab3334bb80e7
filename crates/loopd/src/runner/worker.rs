//! llama-worker's status socket, as the runner uses it: `status` (is the server ready, and
//! which spawn of it is running) and `stall` (a request saw no progress).
//!
//! Protocol (llama-worker's `status.rs`): one line in, one JSON line out, one command per
//! connection. Every call has a deadline for connecting, writing and reading.

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Longest answer line read from the worker.
pub const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// The worker's lifecycle state, as its status JSON names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Not running, and not meant to be.
    Stopped,
    /// First start, waiting for readiness.
    Starting,
    /// The server answers; requests may be sent.
    Ready,
    /// A restart is under way.
    Restarting,
    /// Crash-loop protection tripped.
    Failed,
}

impl WorkerState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Stopped => "stopped",
            WorkerState::Starting => "starting",
            WorkerState::Ready => "ready",
            WorkerState::Restarting => "restarting",
            WorkerState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<WorkerState> {
        Some(match s {
            "stopped" => WorkerState::Stopped,
            "starting" => WorkerState::Starting,
            "ready" => WorkerState::Ready,
            "restarting" => WorkerState::Restarting,
            "failed" => WorkerState::Failed,
            _ => return None,
        })
    }
}

/// What `status` said, the part the runner reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStatus {
    /// The lifecycle state.
    pub state: WorkerState,
    /// Servers spawned since the worker began: a request admitted under one spawn that sees
    /// another was cut by a restart.
    pub spawns: u64,
    /// What caused the latest restart (`exited` means the server died on its own,
    /// `model_exited` that a model instance behind the router did).
    pub last_cause: Option<String>,
    /// While failed: the worker's one-sentence reason (the cause, the model and its exit
    /// status, the server log).
    pub reason: Option<String>,
}

impl WorkerStatus {
    /// Whether the latest restart was the server, or a model instance behind it, dying on its
    /// own.
    pub fn server_died(&self) -> bool {
        matches!(self.last_cause.as_deref(), Some("exited" | "model_exited"))
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

/// Why a call to the worker's socket failed.
#[derive(Debug)]
pub enum WorkerError {
    /// Connecting, writing or reading failed or ran out of time.
    Io(std::io::Error),
    /// The answer was not the JSON the protocol says.
    BadAnswer(String),
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

/// Sends one command and reads the answer line, all within `timeout` per step.
fn call(socket: &Path, command: &str, timeout: Duration) -> Result<String, WorkerError> {
    let mut s = UnixStream::connect(socket).map_err(WorkerError::Io)?;
    s.set_read_timeout(Some(timeout)).map_err(WorkerError::Io)?;
    s.set_write_timeout(Some(timeout))
        .map_err(WorkerError::Io)?;
    s.write_all(format!("{command}\n").as_bytes())
        .map_err(WorkerError::Io)?;
    let mut line = String::new();
    BufReader::new(s.take(MAX_ANSWER_BYTES))
        .read_line(&mut line)
        .map_err(WorkerError::Io)?;
    Ok(line.trim_end().to_owned())
}

fn capped(s: &str) -> String {
    s.chars().take(200).collect()
}

/// Reads the worker's status.
pub fn status(socket: &Path, timeout: Duration) -> Result<WorkerStatus, WorkerError> {
    parse_status(&call(socket, "status", timeout)?)
}

/// Parses a `status` answer line.
pub fn parse_status(line: &str) -> Result<WorkerStatus, WorkerError> {
    #[derive(Deserialize)]
    struct Raw {
        state: String,
        spawns: u64,
        last_cause: Option<String>,
        #[serde(default)]
        reason: Option<String>,
    }
    let raw: Raw = serde_json::from_str(line).map_err(|_| WorkerError::BadAnswer(capped(line)))?;
    let state = WorkerState::parse(&raw.state).ok_or(WorkerError::BadAnswer(capped(line)))?;
    Ok(WorkerStatus {
        state,
        spawns: raw.spawns,
        last_cause: raw.last_cause,
        reason: raw.reason,
    })
}

/// Reports a stall and returns the worker's verdict.
pub fn report_stall(socket: &Path, timeout: Duration) -> Result<StallAnswer, WorkerError> {
    parse_stall(&call(socket, "stall", timeout)?)
}

/// Parses a `stall` answer line.
pub fn parse_stall(line: &str) -> Result<StallAnswer, WorkerError> {
    #[derive(Deserialize)]
    struct Raw {
        stall: String,
        since_progress_s: Option<f64>,
    }
    let raw: Raw = serde_json::from_str(line).map_err(|_| WorkerError::BadAnswer(capped(line)))?;
    match raw.stall.as_str() {
        "restarting" => Ok(StallAnswer::Restarting),
        "not_ready" => Ok(StallAnswer::NotReady),
        "not_stalled" => {
            let s = raw.since_progress_s.unwrap_or(0.0);
            let ms = if s.is_finite() && s > 0.0 {
                (s * 1000.0).min(u64::MAX as f64) as u64
            } else {
                0
            };
            Ok(StallAnswer::NotStalled {
                since_progress_ms: ms,
            })
        }
        _ => Err(WorkerError::BadAnswer(capped(line))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_as_llama_worker_writes_them() {
        // Copied from llama-worker's status.rs test of `Status::to_json`.
        let line = "{\"state\":\"restarting\",\"pid\":42,\"port\":8080,\"restarts_in_window\":2,\
             \"total_restarts\":0,\"spawns\":3,\"last_cause\":\"exited\",\"cpu_ticks\":1234,\
             \"cpu_progress_age_s\":1.500,\"last_readiness\":null,\"inflight\":0}";
        let s = parse_status(line).unwrap();
        assert_eq!(
            s,
            WorkerStatus {
                state: WorkerState::Restarting,
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
        let s = parse_status(line).unwrap();
        assert!(s.server_died());
        assert!(s
            .reason
            .unwrap()
            .ends_with("exited with status 1; server log: /x.log"));
        for (name, state) in [
            ("stopped", WorkerState::Stopped),
            ("starting", WorkerState::Starting),
            ("ready", WorkerState::Ready),
            ("failed", WorkerState::Failed),
        ] {
            let line = format!("{{\"state\":\"{name}\",\"spawns\":0,\"last_cause\":null}}");
            assert_eq!(parse_status(&line).unwrap().state, state);
            assert_eq!(state.as_str(), name);
        }
        for bad in ["", "{}", "{\"state\":\"dancing\",\"spawns\":0}", "not json"] {
            assert!(
                matches!(parse_status(bad), Err(WorkerError::BadAnswer(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn stall_answers_as_llama_worker_writes_them() {
        assert_eq!(
            parse_stall("{\"stall\":\"restarting\"}").unwrap(),
            StallAnswer::Restarting
        );
        assert_eq!(
            parse_stall("{\"stall\":\"not_ready\"}").unwrap(),
            StallAnswer::NotReady
        );
        assert_eq!(
            parse_stall("{\"stall\":\"not_stalled\",\"since_progress_s\":1.250}").unwrap(),
            StallAnswer::NotStalled {
                since_progress_ms: 1_250
            }
        );
        assert!(parse_stall("{\"error\":\"unknown command\"}").is_err());
        assert!(parse_stall("{\"stall\":\"maybe\"}").is_err());
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
