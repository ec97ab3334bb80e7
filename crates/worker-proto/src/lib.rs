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
//!
//! Generations: a client registers each generation it sends to the server
//! (`register <slot>`, answered [`RegisterAnswer`]), reports its stream progress
//! (`progress <id> first_byte|bytes`), a stall of it (`stall <id>`, answered [`StallAnswer`]) and
//! its end (`done <id>`), each answered [`Ack`]. The worker judges each registered generation
//! by its own progress (appendix J: CPU time while in prefill, stream bytes after the first) and
//! restarts the server when one has none for `stall_timeout_s`. `watch` is the one connection
//! that stays open: the daemon writes one [`WatchEvent`] line at once (the state), then one per
//! state change and per registered generation it failed (`worker_restarted`, `server_died`,
//! `worker_stopped`), and `{"event":"ping"}` when it had nothing to say for
//! [`WATCH_KEEPALIVE`]; a client that reads nothing for [`WATCH_DEAD_AFTER`] knows the worker
//! is gone ([`Watcher`]). Every line a client may send is a [`Request`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::borrow::Cow;
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

/// The longest a `watch` connection goes without a line from the daemon.
pub const WATCH_KEEPALIVE: Duration = Duration::from_secs(1);

/// A watcher that reads no line for this long takes the worker (or the connection) for dead.
pub const WATCH_DEAD_AFTER: Duration = Duration::from_secs(3);

/// `watch` connections the daemon serves at once; one more is answered with an error line.
pub const MAX_WATCHERS: usize = 16;

/// A bare-word command line (the commands that take no argument and answer one line).
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

/// Why the worker failed registered generations (the `reason` of a `failed` watch event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// The worker restarted a live server (readiness lost, stall, startup deadline).
    WorkerRestarted,
    /// The server process, a model instance behind it or an RPC server died on its own.
    ServerDied,
    /// The worker was stopped.
    WorkerStopped,
}

impl FailReason {
    const ALL: [FailReason; 3] = [
        FailReason::WorkerRestarted,
        FailReason::ServerDied,
        FailReason::WorkerStopped,
    ];

    /// The wire name (`worker_restarted`, `server_died`, `worker_stopped`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WorkerRestarted => "worker_restarted",
            Self::ServerDied => "server_died",
            Self::WorkerStopped => "worker_stopped",
        }
    }

    /// The reason a wire name names.
    pub fn parse(s: &str) -> Option<FailReason> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// What a `progress` line reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressKind {
    /// The first stream byte of the generation arrived: it leaves prefill.
    FirstByte,
    /// More stream bytes arrived (reported at most about once a second).
    Bytes,
}

impl ProgressKind {
    /// The wire name (`first_byte`, `bytes`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FirstByte => "first_byte",
            Self::Bytes => "bytes",
        }
    }
}

/// Where a registered generation is (appendix J).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerationPhase {
    /// No stream byte yet: a rise of the server's CPU time is progress.
    Prefill,
    /// After the first byte: only stream bytes are progress.
    Streaming,
}

impl GenerationPhase {
    /// The wire name (`prefill`, `streaming`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Streaming => "streaming",
        }
    }
}

/// Any line a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A bare-word command.
    Command(Command),
    /// `register <slot> [<watch>]`: a generation was sent to the server on this slot. With
    /// the id of the client's own `watch` connection (its `hello` line), the registration
    /// belongs to that connection: forgotten when it closes, and the slot refused to any other
    /// owner while it is registered (`slot_taken`), so two daemons can share a server.
    Register {
        /// The server slot the client's gate gave it.
        slot: u32,
        /// The owning `watch` connection's id, if the client names one.
        watch: Option<u64>,
    },
    /// `progress <id> first_byte|bytes`.
    Progress {
        /// The id `register` answered.
        id: u64,
        /// What arrived.
        kind: ProgressKind,
    },
    /// `done <id>`: the generation ended (whatever its outcome); the worker forgets it.
    Done {
        /// The id `register` answered.
        id: u64,
    },
    /// `stall <id>`: this generation saw no progress; judged by its own progress.
    StallOf {
        /// The id `register` answered.
        id: u64,
    },
    /// `watch`: keep the connection open for [`WatchEvent`] lines.
    Watch,
}

/// Why a request line was refused (answered as `{"error": "<Display>"}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The first word is no command.
    Unknown,
    /// The command needs this argument.
    Missing(&'static str),
    /// This argument is not a number in range.
    BadNumber(&'static str),
    /// The progress kind is neither `first_byte` nor `bytes`.
    BadProgressKind,
    /// More words than the command takes.
    Extra,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown => f.write_str(
                "unknown command; use status, start, stop, stall, metrics, register, progress, \
                 done or watch",
            ),
            Self::Missing(what) => write!(f, "missing argument: {what}"),
            Self::BadNumber(what) => write!(f, "{what} is not a number in range"),
            Self::BadProgressKind => f.write_str("progress kind must be first_byte or bytes"),
            Self::Extra => f.write_str("too many arguments"),
        }
    }
}

impl std::error::Error for RequestError {}

impl Request {
    /// The request a line names (surrounding white space ignored; words split on white space).
    pub fn parse(line: &str) -> Result<Request, RequestError> {
        let mut words = line.split_whitespace();
        let first = words.next().ok_or(RequestError::Unknown)?;
        fn num<T: core::str::FromStr>(
            w: Option<&str>,
            what: &'static str,
        ) -> Result<T, RequestError> {
            w.ok_or(RequestError::Missing(what))?
                .parse()
                .map_err(|_| RequestError::BadNumber(what))
        }
        let r = match first {
            "register" => Request::Register {
                slot: num(words.next(), "slot")?,
                watch: match words.next() {
                    None => None,
                    w => Some(num(w, "watch")?),
                },
            },
            "progress" => {
                let id = num(words.next(), "id")?;
                let kind = match words.next() {
                    None => return Err(RequestError::Missing("kind")),
                    Some("first_byte") => ProgressKind::FirstByte,
                    Some("bytes") => ProgressKind::Bytes,
                    Some(_) => return Err(RequestError::BadProgressKind),
                };
                Request::Progress { id, kind }
            }
            "done" => Request::Done {
                id: num(words.next(), "id")?,
            },
            "stall" => match words.next() {
                None => Request::Command(Command::Stall),
                w => Request::StallOf { id: num(w, "id")? },
            },
            "watch" => Request::Watch,
            w => Request::Command(Command::parse(w).ok_or(RequestError::Unknown)?),
        };
        match words.next() {
            Some(_) => Err(RequestError::Extra),
            None => Ok(r),
        }
    }

    /// The line (without its newline).
    pub fn to_line(self) -> String {
        match self {
            Request::Command(c) => c.as_str().to_string(),
            Request::Register { slot, watch: None } => format!("register {slot}"),
            Request::Register {
                slot,
                watch: Some(w),
            } => format!("register {slot} {w}"),
            Request::Progress { id, kind } => format!("progress {id} {}", kind.as_str()),
            Request::Done { id } => format!("done {id}"),
            Request::StallOf { id } => format!("stall {id}"),
            Request::Watch => "watch".to_string(),
        }
    }
}

/// The word of [`RegisterAnswer::SlotTaken`].
const SLOT_TAKEN: &str = "slot_taken";

/// The answer to `register`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterAnswer {
    /// `{"registered":7}`: the generation's id (unique per worker process, never 0).
    Registered(u64),
    /// `{"refused":"restarting"}`: the worker is not ready (its state); send nothing.
    Refused(State),
    /// `{"refused":"slot_taken"}`: another `watch` connection's registration holds this slot
    /// (another client is generating on it); send nothing.
    SlotTaken,
}

// Text as `Cow`: borrowed as written, owned when the line escapes a character (`\u0061`).
#[derive(Serialize, Deserialize)]
struct RegisterJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    registered: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", borrow)]
    refused: Option<Cow<'a, str>>,
}

impl RegisterAnswer {
    /// The answer line (without its newline).
    pub fn to_json(self) -> String {
        let j = match self {
            Self::Registered(id) => RegisterJson {
                registered: Some(id),
                refused: None,
            },
            Self::Refused(s) => RegisterJson {
                registered: None,
                refused: Some(s.as_str().into()),
            },
            Self::SlotTaken => RegisterJson {
                registered: None,
                refused: Some(SLOT_TAKEN.into()),
            },
        };
        serde_json::to_string(&j).unwrap_or_default()
    }

    /// Parses an answer line: `registered` or `refused`, never both (a `refused` that names
    /// no state is refused, not read past).
    pub fn parse(line: &str) -> Result<RegisterAnswer, WorkerError> {
        let raw: RegisterJson<'_> = serde_json::from_str(line).map_err(|_| bad(line))?;
        match (raw.registered, raw.refused.as_deref()) {
            (Some(id), None) => Ok(Self::Registered(id)),
            (None, Some(SLOT_TAKEN)) => Ok(Self::SlotTaken),
            (None, Some(s)) => State::parse(s).map(Self::Refused).ok_or_else(|| bad(line)),
            _ => Err(bad(line)),
        }
    }
}

/// The answer to `progress` and `done`: `{"ok":true}`, or `{"ok":false}` when the id is not
/// registered (never was, already done, or already failed by a restart: its `failed` event
/// was pushed to the watchers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// The id was registered.
    Ok,
    /// The id was not registered.
    Unknown,
}

impl Ack {
    /// The answer line (without its newline).
    pub fn to_json(self) -> String {
        match self {
            Ack::Ok => "{\"ok\":true}".to_string(),
            Ack::Unknown => "{\"ok\":false}".to_string(),
        }
    }

    /// Parses an answer line.
    pub fn parse(line: &str) -> Result<Ack, WorkerError> {
        #[derive(Deserialize)]
        struct Raw {
            ok: bool,
        }
        let raw: Raw = serde_json::from_str(line).map_err(|_| bad(line))?;
        Ok(if raw.ok { Ack::Ok } else { Ack::Unknown })
    }
}

/// One line of a `watch` connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// `{"event":"hello","watch":4}`: the first line: this connection's id, which the client
    /// names in `register <slot> <watch>` to own its registrations.
    Hello {
        /// The connection's id (unique per worker process).
        watch: u64,
    },
    /// `{"event":"state","state":"ready","spawns":3}`: the second line, and each state change.
    State {
        /// The new state.
        state: State,
        /// Servers spawned so far (a new spawn under a request means it was cut).
        spawns: u64,
    },
    /// `{"event":"failed","id":7,"reason":"worker_restarted"}`: the worker failed this
    /// registered generation (and forgot it): end it with this reason, keep its output.
    Failed {
        /// The generation's id.
        id: u64,
        /// Why.
        reason: FailReason,
    },
    /// `{"event":"ping"}`: nothing happened for [`WATCH_KEEPALIVE`].
    Ping,
}

#[derive(Serialize, Deserialize)]
struct WatchJson<'a> {
    #[serde(borrow)]
    event: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none", borrow)]
    state: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spawns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    watch: Option<u64>,
}

impl WatchEvent {
    /// The event line (without its newline).
    pub fn to_json(self) -> String {
        let mut j = WatchJson {
            event: "ping".into(),
            state: None,
            spawns: None,
            id: None,
            reason: None,
            watch: None,
        };
        match self {
            Self::Hello { watch } => {
                j.event = "hello".into();
                j.watch = Some(watch);
            }
            Self::State { state, spawns } => {
                j.event = "state".into();
                j.state = Some(state.as_str().into());
                j.spawns = Some(spawns);
            }
            Self::Failed { id, reason } => {
                j.event = "failed".into();
                j.id = Some(id);
                j.reason = Some(reason.as_str().into());
            }
            Self::Ping => {}
        }
        serde_json::to_string(&j).unwrap_or_default()
    }

    /// Parses an event line: each event with exactly its own fields of `state`, `spawns`,
    /// `id`, `reason` and `watch` (one of another event's, even with a value that names
    /// nothing, is refused, not read past); other keys are read past.
    pub fn parse(line: &str) -> Result<WatchEvent, WorkerError> {
        let j: WatchJson<'_> = serde_json::from_str(line).map_err(|_| bad(line))?;
        let fields = (
            j.state.as_deref(),
            j.spawns,
            j.id,
            j.reason.as_deref(),
            j.watch,
        );
        let event = match (j.event.as_ref(), fields) {
            ("hello", (None, None, None, None, Some(watch))) => Some(Self::Hello { watch }),
            ("state", (Some(state), Some(spawns), None, None, None)) => {
                State::parse(state).map(|state| Self::State { state, spawns })
            }
            ("failed", (None, None, Some(id), Some(reason), None)) => {
                FailReason::parse(reason).map(|reason| Self::Failed { id, reason })
            }
            ("ping", (None, None, None, None, None)) => Some(Self::Ping),
            _ => None,
        };
        event.ok_or_else(|| bad(line))
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
    #[serde(borrow)]
    stall: Cow<'a, str>,
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
            stall: self.as_str().into(),
            since_progress_s,
        };
        // A string and a number: serializing cannot fail.
        serde_json::to_string(&json).unwrap_or_default()
    }

    /// Parses an answer line (`since_progress_s` only with `not_stalled`; left out there, 0).
    pub fn parse(line: &str) -> Result<StallAnswer, WorkerError> {
        let raw: StallJson<'_> = serde_json::from_str(line).map_err(|_| bad(line))?;
        match (raw.stall.as_ref(), raw.since_progress_s) {
            ("restarting", None) => Ok(StallAnswer::Restarting),
            ("not_ready", None) => Ok(StallAnswer::NotReady),
            ("not_stalled", since) => {
                let s = since.unwrap_or(0.0);
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

/// Registers a generation sent on `slot`, owned by the client's `watch` connection `watch`
/// (its `hello` id) when given: its id, the worker's state when it is not ready, or
/// `slot_taken` when another connection's registration holds the slot.
pub fn register(
    socket: &Path,
    slot: u32,
    watch: Option<u64>,
    timeout: Duration,
) -> Result<RegisterAnswer, WorkerError> {
    RegisterAnswer::parse(&call_line(
        socket,
        &Request::Register { slot, watch }.to_line(),
        timeout,
    )?)
}

/// Reports stream progress of generation `id` (the first byte, then at most about once a
/// second).
pub fn progress(
    socket: &Path,
    id: u64,
    kind: ProgressKind,
    timeout: Duration,
) -> Result<Ack, WorkerError> {
    Ack::parse(&call_line(
        socket,
        &Request::Progress { id, kind }.to_line(),
        timeout,
    )?)
}

/// Unregisters generation `id` (it ended, whatever its outcome).
pub fn done(socket: &Path, id: u64, timeout: Duration) -> Result<Ack, WorkerError> {
    Ack::parse(&call_line(
        socket,
        &Request::Done { id }.to_line(),
        timeout,
    )?)
}

/// Reports that generation `id` stalled; the worker judges it by that generation's progress
/// (an id it does not know is judged as a bare `stall`).
pub fn report_stall_of(
    socket: &Path,
    id: u64,
    timeout: Duration,
) -> Result<StallAnswer, WorkerError> {
    StallAnswer::parse(&call_line(
        socket,
        &Request::StallOf { id }.to_line(),
        timeout,
    )?)
}

/// An open `watch` connection: [`Watcher::next_event`] returns each line as it comes.
#[derive(Debug)]
pub struct Watcher {
    reader: BufReader<UnixStream>,
}

/// Opens a `watch` connection (connecting and writing within `timeout`). Its first event is
/// the worker's state.
pub fn watch(socket: &Path, timeout: Duration) -> Result<Watcher, WorkerError> {
    let mut s = UnixStream::connect(socket).map_err(WorkerError::Io)?;
    s.set_write_timeout(Some(timeout))
        .map_err(WorkerError::Io)?;
    s.set_read_timeout(Some(WATCH_DEAD_AFTER))
        .map_err(WorkerError::Io)?;
    s.write_all(b"watch\n").map_err(WorkerError::Io)?;
    Ok(Watcher {
        reader: BufReader::new(s),
    })
}

impl Watcher {
    /// The next event, waiting at most [`WATCH_DEAD_AFTER`] (the daemon pings every
    /// [`WATCH_KEEPALIVE`]): a timeout or the end of the stream is an [`WorkerError::Io`]
    /// (`TimedOut`/`WouldBlock`, `UnexpectedEof`): the worker is gone, open a new watch.
    pub fn next_event(&mut self) -> Result<WatchEvent, WorkerError> {
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(MAX_ANSWER_BYTES)
            .read_line(&mut line)
            .map_err(WorkerError::Io)?;
        if n == 0 {
            return Err(WorkerError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        WatchEvent::parse(line.trim_end())
    }

    /// The connection's socket (to wait for its next bytes, or to see whether any are
    /// waiting, without reading them).
    pub fn get_ref(&self) -> &UnixStream {
        self.reader.get_ref()
    }

    /// Whether bytes read from the socket wait in the buffer, unparsed.
    pub fn has_buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }
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
        // A failed worker's line, as llama-worker writes it: the cause and the reason named.
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
    fn request_lines_parse_exactly() {
        let ok = [
            ("status", Request::Command(Command::Status)),
            (" stall \n", Request::Command(Command::Stall)),
            ("stall 7", Request::StallOf { id: 7 }),
            (
                "register 0",
                Request::Register {
                    slot: 0,
                    watch: None,
                },
            ),
            (
                "register 1 4",
                Request::Register {
                    slot: 1,
                    watch: Some(4),
                },
            ),
            (
                "progress 18446744073709551615 first_byte",
                Request::Progress {
                    id: u64::MAX,
                    kind: ProgressKind::FirstByte,
                },
            ),
            (
                "progress 3 bytes",
                Request::Progress {
                    id: 3,
                    kind: ProgressKind::Bytes,
                },
            ),
            ("done 3", Request::Done { id: 3 }),
            ("watch", Request::Watch),
        ];
        for (line, r) in ok {
            assert_eq!(Request::parse(line), Ok(r), "{line}");
            assert_eq!(Request::parse(&r.to_line()), Ok(r));
            assert!(r.to_line().len() <= MAX_COMMAND_BYTES);
        }
        let bad = [
            ("", RequestError::Unknown),
            ("restart", RequestError::Unknown),
            ("register", RequestError::Missing("slot")),
            ("register -1", RequestError::BadNumber("slot")),
            ("register 4294967296", RequestError::BadNumber("slot")),
            ("register 0 x", RequestError::BadNumber("watch")),
            ("register 0 4 5", RequestError::Extra),
            ("progress 1", RequestError::Missing("kind")),
            ("progress x bytes", RequestError::BadNumber("id")),
            ("progress 1 tokens", RequestError::BadProgressKind),
            ("done 18446744073709551616", RequestError::BadNumber("id")),
            ("done 1 2", RequestError::Extra),
            ("status now", RequestError::Extra),
            ("stall x", RequestError::BadNumber("id")),
        ];
        for (line, e) in bad {
            assert_eq!(Request::parse(line), Err(e), "{line}");
        }
        assert_eq!(
            error_reply(&RequestError::BadNumber("slot").to_string()),
            "{\"error\":\"slot is not a number in range\"}"
        );
    }

    #[test]
    fn answers_and_events_round_trip() {
        assert_eq!(
            RegisterAnswer::Registered(7).to_json(),
            "{\"registered\":7}"
        );
        assert_eq!(
            RegisterAnswer::Refused(State::Restarting).to_json(),
            "{\"refused\":\"restarting\"}"
        );
        assert_eq!(
            RegisterAnswer::SlotTaken.to_json(),
            "{\"refused\":\"slot_taken\"}"
        );
        for a in [
            RegisterAnswer::Registered(1),
            RegisterAnswer::Refused(State::Failed),
            RegisterAnswer::SlotTaken,
        ] {
            assert_eq!(RegisterAnswer::parse(&a.to_json()).unwrap(), a);
        }
        assert!(RegisterAnswer::parse("{\"error\":\"x\"}").is_err());
        assert_eq!(Ack::Ok.to_json(), "{\"ok\":true}");
        assert_eq!(Ack::Unknown.to_json(), "{\"ok\":false}");
        assert_eq!(Ack::parse("{\"ok\":false}").unwrap(), Ack::Unknown);
        assert!(Ack::parse("{\"error\":\"x\"}").is_err());
        let events = [
            (
                WatchEvent::State {
                    state: State::Ready,
                    spawns: 3,
                },
                "{\"event\":\"state\",\"state\":\"ready\",\"spawns\":3}",
            ),
            (
                WatchEvent::Failed {
                    id: 7,
                    reason: FailReason::WorkerRestarted,
                },
                "{\"event\":\"failed\",\"id\":7,\"reason\":\"worker_restarted\"}",
            ),
            (WatchEvent::Ping, "{\"event\":\"ping\"}"),
            (
                WatchEvent::Hello { watch: 4 },
                "{\"event\":\"hello\",\"watch\":4}",
            ),
        ];
        for (e, line) in events {
            assert_eq!(e.to_json(), line);
            assert_eq!(WatchEvent::parse(line).unwrap(), e);
        }
        for bad in [
            "{\"event\":\"failed\",\"id\":7,\"reason\":\"tired\"}",
            "{\"event\":\"state\",\"state\":\"ready\"}",
            "{\"event\":\"party\"}",
            "{\"event\":\"hello\"}",
            "{\"event\":\"ping\",\"watch\":4}",
        ] {
            assert!(WatchEvent::parse(bad).is_err(), "{bad}");
        }
    }

    /// A known field an answer or event does not carry is refused whatever its value: a
    /// value that names nothing was read past before, where a valid one was refused.
    #[test]
    fn a_field_of_another_answer_or_event_is_refused_not_read_past() {
        for line in [
            "{\"registered\":5,\"refused\":\"bogus\"}",
            "{\"registered\":5,\"refused\":\"ready\"}",
            "{\"refused\":\"bogus\"}",
        ] {
            assert!(RegisterAnswer::parse(line).is_err(), "{line}");
        }
        for line in [
            "{\"event\":\"ping\",\"state\":\"dancing\"}",
            "{\"event\":\"ping\",\"state\":\"ready\"}",
            "{\"event\":\"ping\",\"reason\":\"x\"}",
            "{\"event\":\"hello\",\"watch\":4,\"reason\":\"server_died\"}",
            "{\"event\":\"state\",\"state\":\"ready\",\"spawns\":3,\"reason\":\"x\"}",
            "{\"event\":\"failed\",\"id\":7,\"reason\":\"server_died\",\"state\":\"x\"}",
        ] {
            assert!(WatchEvent::parse(line).is_err(), "{line}");
        }
        for line in [
            "{\"stall\":\"restarting\",\"since_progress_s\":1}",
            "{\"stall\":\"not_ready\",\"since_progress_s\":0}",
        ] {
            assert!(StallAnswer::parse(line).is_err(), "{line}");
        }
        // Other keys are still read past, and a null is a field left out.
        assert_eq!(
            WatchEvent::parse("{\"event\":\"ping\",\"state\":null,\"later\":1}").unwrap(),
            WatchEvent::Ping
        );
        assert_eq!(
            StallAnswer::parse("{\"stall\":\"not_stalled\"}").unwrap(),
            StallAnswer::NotStalled {
                since_progress_ms: 0
            }
        );
    }

    /// JSON may escape any character of a name; the line reads as the one written plain.
    #[test]
    fn an_escaped_name_reads_as_written_plain() {
        assert_eq!(
            WatchEvent::parse("{\"event\":\"st\\u0061te\",\"state\":\"r\\u0065ady\",\"spawns\":3}")
                .unwrap(),
            WatchEvent::State {
                state: State::Ready,
                spawns: 3
            }
        );
        assert_eq!(
            WatchEvent::parse("{\"event\":\"failed\",\"id\":7,\"reason\":\"server\\u005fdied\"}")
                .unwrap(),
            WatchEvent::Failed {
                id: 7,
                reason: FailReason::ServerDied
            }
        );
        assert_eq!(
            RegisterAnswer::parse("{\"refused\":\"slot\\u005ftaken\"}").unwrap(),
            RegisterAnswer::SlotTaken
        );
        assert_eq!(
            StallAnswer::parse("{\"stall\":\"not\\u005fready\"}").unwrap(),
            StallAnswer::NotReady
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
