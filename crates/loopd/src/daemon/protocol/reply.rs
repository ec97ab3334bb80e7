//! The daemon's replies, one struct each, and the one enum of error codes.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::result::WireResult;
use loopd_agent::runner::SubmitError;

/// The `ok` of a reply that succeeded: `true`, and only `true`, on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OkTrue;

/// The `ok` of an error reply: `false`, and only `false`, on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OkFalse;

macro_rules! fixed_bool {
    ($t:ty, $v:literal) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bool($v)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if bool::deserialize(d)? == $v {
                    Ok(Self)
                } else {
                    Err(D::Error::custom(concat!("expected `ok` to be ", $v)))
                }
            }
        }
    };
}

fixed_bool!(OkTrue, true);
fixed_bool!(OkFalse, false);

/// The reply to `submit` (and, same shape, to `follow`): `{"ok":true,"id":7}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitReply {
    /// `true`.
    pub ok: OkTrue,
    /// The request's id.
    pub id: u64,
}

/// The first reply to `follow`: `{"ok":true,"id":7}`, then the events and a [`ResultReply`].
pub type FollowReply = SubmitReply;

impl SubmitReply {
    /// The reply naming `id`.
    pub fn new(id: u64) -> SubmitReply {
        SubmitReply { ok: OkTrue, id }
    }
}

/// The reply to `result` and `wait`, and the last line of a `follow` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultReply {
    /// `true`.
    pub ok: OkTrue,
    /// The result.
    pub result: WireResult,
}

impl ResultReply {
    /// The reply carrying `result`.
    pub fn new(result: WireResult) -> ResultReply {
        ResultReply { ok: OkTrue, result }
    }
}

/// Where a cancelled request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelState {
    /// It was running: it ends within one poll interval as `cancelled`.
    Cancelling,
    /// It had ended; its result is kept.
    Ended,
}

impl CancelState {
    /// `cancelling` or `ended`.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelState::Cancelling => "cancelling",
            CancelState::Ended => "ended",
        }
    }
}

/// The reply to `cancel`: `{"ok":true,"state":"cancelling"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelReply {
    /// `true`.
    pub ok: OkTrue,
    /// Where the request stands.
    pub state: CancelState,
}

/// Whether the daemon takes new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServeState {
    /// It does.
    Serving,
    /// It is shutting down.
    Stopping,
}

/// The daemon's state, as `status` tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// Serving or stopping.
    pub state: ServeState,
    /// The server's slots.
    pub slots: usize,
    /// Slots busy now.
    pub busy: usize,
    /// The requests running, by id.
    pub running: Vec<u64>,
    /// Results kept, unfetched.
    pub kept: usize,
    /// Connections open, this one included.
    pub connections: usize,
    /// The tools a request may choose from.
    pub tools: Vec<String>,
    /// Each `[[host]]`, in config order; left out on a daemon of one unnamed host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostLine>,
}

/// One inference host in `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLine {
    /// Its name.
    pub name: String,
    /// `ready`, `starting`, `restarting`, `failed`, `stopped`, `unknown` or `lost`.
    pub state: String,
    /// The slots this daemon owns there.
    pub slots: usize,
    /// Of them, those running a request.
    pub busy: usize,
}

/// The reply to `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusReply {
    /// `true`.
    pub ok: OkTrue,
    /// The state.
    pub status: Status,
}

/// The reply to `metrics`: the counters in the Prometheus text format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsReply {
    /// `true`.
    pub ok: OkTrue,
    /// The text.
    pub metrics: String,
}

/// Every error code on the wire, by its [`as_str`](ErrorCode::as_str) name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// No such request, or its result was fetched or dropped.
    NotFound,
    /// The request is still running.
    Pending,
    /// Every slot is busy; there is no queue.
    NoSlotAvailable,
    /// llama-worker is starting or restarting.
    WorkerNotReady,
    /// llama-worker's crash-loop protection tripped.
    WorkerFailed,
    /// llama-worker is stopped.
    WorkerStopped,
    /// No thread could be started for the request.
    NoThread,
    /// `tools` names a tool the daemon does not offer.
    UnknownTool,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The store's disk is full.
    StoreFull,
    /// Any other store failure.
    StoreFailed,
    /// The command line reached [`MAX_LINE_BYTES`](super::MAX_LINE_BYTES).
    LineTooLong,
    /// No whole line within the read deadline.
    ReadTimeout,
    /// The line is not JSON.
    BadJson,
    /// `cmd` is missing, not a string, or names no command.
    UnknownCommand,
    /// A field is missing, of the wrong type, or unknown.
    BadRequest,
    /// `follow` of a request that has ended.
    Ended,
    /// The follower read too slowly and was dropped.
    FollowerDropped,
    /// Too many connections at once.
    TooManyConnections,
    /// No session of that name.
    SessionNotFound,
    /// `open` of a name a session already has.
    SessionExists,
    /// A turn of the session is running; its turns run one at a time.
    SessionBusy,
    /// The session's log, or the number of sessions, is at its cap (`[sessions]`).
    SessionFull,
}

impl ErrorCode {
    /// Every code, in the order above.
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::NotFound,
        ErrorCode::Pending,
        ErrorCode::NoSlotAvailable,
        ErrorCode::WorkerNotReady,
        ErrorCode::WorkerFailed,
        ErrorCode::WorkerStopped,
        ErrorCode::NoThread,
        ErrorCode::UnknownTool,
        ErrorCode::ShuttingDown,
        ErrorCode::StoreFull,
        ErrorCode::StoreFailed,
        ErrorCode::LineTooLong,
        ErrorCode::ReadTimeout,
        ErrorCode::BadJson,
        ErrorCode::UnknownCommand,
        ErrorCode::BadRequest,
        ErrorCode::Ended,
        ErrorCode::FollowerDropped,
        ErrorCode::TooManyConnections,
        ErrorCode::SessionNotFound,
        ErrorCode::SessionExists,
        ErrorCode::SessionBusy,
        ErrorCode::SessionFull,
    ];

    /// The name on the wire: `NOT_FOUND`, `PENDING`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Pending => "PENDING",
            ErrorCode::NoSlotAvailable => "NO_SLOT_AVAILABLE",
            ErrorCode::WorkerNotReady => "WORKER_NOT_READY",
            ErrorCode::WorkerFailed => "WORKER_FAILED",
            ErrorCode::WorkerStopped => "WORKER_STOPPED",
            ErrorCode::NoThread => "NO_THREAD",
            ErrorCode::UnknownTool => "UNKNOWN_TOOL",
            ErrorCode::ShuttingDown => "SHUTTING_DOWN",
            ErrorCode::StoreFull => "STORE_FULL",
            ErrorCode::StoreFailed => "STORE_FAILED",
            ErrorCode::LineTooLong => "LINE_TOO_LONG",
            ErrorCode::ReadTimeout => "READ_TIMEOUT",
            ErrorCode::BadJson => "BAD_JSON",
            ErrorCode::UnknownCommand => "UNKNOWN_COMMAND",
            ErrorCode::BadRequest => "BAD_REQUEST",
            ErrorCode::Ended => "ENDED",
            ErrorCode::FollowerDropped => "FOLLOWER_DROPPED",
            ErrorCode::TooManyConnections => "TOO_MANY_CONNECTIONS",
            ErrorCode::SessionNotFound => "SESSION_NOT_FOUND",
            ErrorCode::SessionExists => "SESSION_EXISTS",
            ErrorCode::SessionBusy => "SESSION_BUSY",
            ErrorCode::SessionFull => "SESSION_FULL",
        }
    }

    /// The code named `s`, if there is one.
    pub fn from_wire(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl From<SubmitError> for ErrorCode {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::NoSlotAvailable => ErrorCode::NoSlotAvailable,
            SubmitError::WorkerNotReady => ErrorCode::WorkerNotReady,
            SubmitError::WorkerFailed => ErrorCode::WorkerFailed,
            SubmitError::WorkerStopped => ErrorCode::WorkerStopped,
            SubmitError::NoThread => ErrorCode::NoThread,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ErrorCode::from_wire(&s).ok_or_else(|| D::Error::custom(format!("unknown error code {s}")))
    }
}

/// An error reply: `{"ok":false,"error":"NOT_FOUND","detail":"..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    /// `false`.
    pub ok: OkFalse,
    /// What kind of error.
    pub error: ErrorCode,
    /// What was wrong, in words.
    pub detail: String,
}

impl ErrorReply {
    /// The reply for `error`, said as `detail`.
    pub fn new(error: ErrorCode, detail: impl Into<String>) -> ErrorReply {
        ErrorReply {
            ok: OkFalse,
            error,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error, self.detail)
    }
}

impl std::error::Error for ErrorReply {}

/// A reply or event line, without its newline.
pub fn to_line(message: &impl Serialize) -> String {
    // Every message type is strings, numbers, lists and fixed names: it always serializes.
    serde_json::to_string(message).unwrap_or_default()
}
