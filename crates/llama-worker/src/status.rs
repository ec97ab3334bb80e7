//! The status a person and the rest of the system read: a JSON object, served by the daemon
//! on a Unix socket (mode 0600), one command per connection.
//!
//! Protocol: the client writes one line, `status`, `start`, `stop` or `stall`; the daemon
//! answers one JSON line and closes. `start` is how a failed worker is started again.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::thread;
use std::time::Duration;

use crate::clock::Clock;
use crate::policy::{RestartCause, StallVerdict, State};
use crate::worker::{ProbeOutcome, WorkerHandle};

/// Longest command line accepted on the socket.
pub const MAX_COMMAND_BYTES: usize = 64;

/// How long a socket client may take to send its command or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// One readiness probe's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessRecord {
    /// When (worker clock).
    pub at: Duration,
    /// The path whose answer this is (the first that failed, or the last).
    pub path: String,
    /// The answer.
    pub outcome: ProbeOutcome,
}

/// A snapshot of the worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Lifecycle state.
    pub state: State,
    /// The server's pid (= its process group id) while one runs.
    pub pid: Option<u32>,
    /// The server's port.
    pub port: u16,
    /// Restarts inside the crash-loop window.
    pub restarts_in_window: usize,
    /// Restarts since the worker began.
    pub total_restarts: u64,
    /// Processes spawned since the worker began.
    pub spawns: u64,
    /// What caused the latest restart or failure.
    pub last_cause: Option<RestartCause>,
    /// The latest CPU-time sample over the group, in clock ticks.
    pub cpu_ticks: Option<u64>,
    /// Time since the group's CPU time last rose.
    pub cpu_progress_age: Option<Duration>,
    /// The latest readiness answer.
    pub last_readiness: Option<ReadinessRecord>,
    /// Time since that answer.
    pub readiness_age: Option<Duration>,
    /// Registered in-flight requests.
    pub inflight: usize,
}

fn opt<T: core::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".into(), |v| v.to_string())
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "null".into(), |d| format!("{:.3}", d.as_secs_f64()))
}

/// A JSON string literal (paths come from the config file, so escape them).
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Status {
    /// One line of JSON, keys in a fixed order.
    pub fn to_json(&self) -> String {
        let readiness = match &self.last_readiness {
            None => "null".to_string(),
            Some(r) => {
                let (ok, answer) = match r.outcome {
                    ProbeOutcome::Status(c) => (c == 200, c.to_string()),
                    ProbeOutcome::Error(e) => (false, json_str(e.as_str())),
                };
                format!(
                    "{{\"ok\":{ok},\"path\":{},\"answer\":{answer},\"age_s\":{}}}",
                    json_str(&r.path),
                    secs(self.readiness_age)
                )
            }
        };
        format!(
            "{{\"state\":\"{}\",\"pid\":{},\"port\":{},\"restarts_in_window\":{},\
             \"total_restarts\":{},\"spawns\":{},\"last_cause\":{},\"cpu_ticks\":{},\
             \"cpu_progress_age_s\":{},\"last_readiness\":{},\"inflight\":{}}}",
            self.state.as_str(),
            opt(self.pid),
            self.port,
            self.restarts_in_window,
            self.total_restarts,
            self.spawns,
            self.last_cause
                .map_or_else(|| "null".into(), |c| json_str(c.as_str())),
            opt(self.cpu_ticks),
            secs(self.cpu_progress_age),
            readiness,
            self.inflight
        )
    }
}

/// Binds the status socket at `path` with mode 0600 from the first moment it is visible:
/// bound under a temporary name, chmod-ed, then renamed into place. A stale socket at `path`
/// is replaced; any other kind of file there is an error (never delete what is not ours).
pub fn bind_status_socket(path: &Path) -> io::Result<UnixListener> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "status socket path exists and is not a socket",
            ));
        }
    }
    let mut staged = path.as_os_str().to_owned();
    staged.push(format!(".{}.tmp", std::process::id()));
    let staged = Path::new(&staged);
    let _ = fs::remove_file(staged);
    let listener = UnixListener::bind(staged)?;
    fs::set_permissions(staged, fs::Permissions::from_mode(0o600))?;
    fs::rename(staged, path)?;
    Ok(listener)
}

/// Answers one command line.
pub fn answer<C: Clock>(handle: &WorkerHandle<C>, command: &str) -> String {
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
        "stall" => match handle.report_stall() {
            StallVerdict::Restarting => "{\"stall\":\"restarting\"}".into(),
            StallVerdict::NotReady => "{\"stall\":\"not_ready\"}".into(),
            StallVerdict::NotStalled { since_progress } => format!(
                "{{\"stall\":\"not_stalled\",\"since_progress_s\":{:.3}}}",
                since_progress.as_secs_f64()
            ),
        },
        _ => "{\"error\":\"unknown command; use status, start, stop or stall\"}".into(),
    }
}

fn serve_one<C: Clock>(handle: &WorkerHandle<C>, stream: UnixStream) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_COMMAND_BYTES as u64 + 1)).read_line(&mut line)?;
    let reply = if line.len() > MAX_COMMAND_BYTES {
        "{\"error\":\"command too long\"}".to_string()
    } else {
        answer(handle, &line)
    };
    (&stream).write_all(format!("{reply}\n").as_bytes())
}

/// Serves the socket on a background thread until the process exits.
pub fn spawn_status_server<C: Clock>(
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

/// Client side: sends `command` to the daemon at `path`, returns its JSON line.
pub fn query(path: &Path, command: &str) -> io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("{command}\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeError;

    #[test]
    fn json_of_a_fresh_and_a_busy_status() {
        let mut s = Status {
            state: State::Stopped,
            pid: None,
            port: 8080,
            restarts_in_window: 0,
            total_restarts: 0,
            spawns: 0,
            last_cause: None,
            cpu_ticks: None,
            cpu_progress_age: None,
            last_readiness: None,
            readiness_age: None,
            inflight: 0,
        };
        assert_eq!(
            s.to_json(),
            "{\"state\":\"stopped\",\"pid\":null,\"port\":8080,\"restarts_in_window\":0,\
             \"total_restarts\":0,\"spawns\":0,\"last_cause\":null,\"cpu_ticks\":null,\
             \"cpu_progress_age_s\":null,\"last_readiness\":null,\"inflight\":0}"
        );
        s.state = State::Restarting;
        s.pid = Some(42);
        s.restarts_in_window = 2;
        s.last_cause = Some(RestartCause::Unready);
        s.cpu_ticks = Some(1234);
        s.cpu_progress_age = Some(Duration::from_millis(1500));
        s.last_readiness = Some(ReadinessRecord {
            at: Duration::ZERO,
            path: "/v1/\"models\"".into(),
            outcome: ProbeOutcome::Error(ProbeError::Timeout),
        });
        s.readiness_age = Some(Duration::from_millis(250));
        assert_eq!(
            s.to_json(),
            "{\"state\":\"restarting\",\"pid\":42,\"port\":8080,\"restarts_in_window\":2,\
             \"total_restarts\":0,\"spawns\":0,\"last_cause\":\"unready\",\"cpu_ticks\":1234,\
             \"cpu_progress_age_s\":1.500,\"last_readiness\":{\"ok\":false,\
             \"path\":\"/v1/\\\"models\\\"\",\"answer\":\"timeout\",\"age_s\":0.250},\"inflight\":0}"
        );
        s.last_readiness.as_mut().unwrap().outcome = ProbeOutcome::Status(200);
        assert!(s
            .to_json()
            .contains("{\"ok\":true,\"path\":\"/v1/\\\"models\\\"\",\"answer\":200,"));
    }
}
