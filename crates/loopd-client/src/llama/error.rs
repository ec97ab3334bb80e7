//! What ends a request without a completion ([`InferError`]), and what a failed request still
//! hands back ([`Failed`], [`Partial`]).
//!
//! Every timeout names the config key that fired; a broken protocol keeps the typed error of
//! the crate that found it ([`ProtocolError`]), so a caller can match on it.

use std::fmt;

use http_nostd::HttpError;
use llama_proto::{AssembleError, StreamError};
use sse_nostd::SseError;

use crate::http::SendError;

use super::{AssistantMessage, Completion, Timings};

/// Bytes of an error body kept in [`InferError::Http`].
pub const ERROR_BODY_CAP: usize = 4 * 1024;

/// What ended a request without a completion.
#[derive(Debug)]
#[non_exhaustive]
pub enum InferError {
    /// loopd's queue for the slot is full.
    Busy,
    /// The socket could not be reached or written.
    Connect {
        /// The inference socket the config names.
        socket: std::path::PathBuf,
        /// What connecting or writing said.
        source: std::io::Error,
    },
    /// The slot stayed busy past `limits.busy_wait_ms` (at the server, or at loopd's gate).
    WaitTimeout,
    /// The server stayed unavailable past `limits.load_wait_ms`.
    LoadTimeout,
    /// The server sent nothing for as long as the named limit allows.
    Stalled(Silence),
    /// A whole step took longer than the named limit allows (a server that trickles).
    TimedOut(Deadline),
    /// The stream ended before its final chunk.
    StreamClosedEarly,
    /// Reasoning went on past the cap, or the server refused to end it.
    ThinkingOverrun,
    /// The server answered with an error status (or an error payload mid-stream).
    Http {
        /// The HTTP status (or the error payload's code; 500 when it has none).
        status: u16,
        /// The body or the server's message, capped at [`ERROR_BODY_CAP`] bytes.
        body: String,
    },
    /// The server broke the protocol or a size cap.
    Protocol(ProtocolError),
    /// The caller cancelled the request.
    Cancelled,
}

/// Which limit a silent server ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Silence {
    /// No first byte while `/slots` said the slot was idle: `limits.idle_grace_ms`.
    IdleGrace,
    /// No byte at all, after the first one or on an info call: `limits.liveness_ms`.
    Liveness,
}

impl Silence {
    /// The config key of the limit, as written in config.toml.
    pub fn key(self) -> &'static str {
        match self {
            Silence::IdleGrace => "limits.idle_grace_ms",
            Silence::Liveness => "limits.liveness_ms",
        }
    }
}

/// Which whole-step deadline ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Connecting to the socket and writing the request: `limits.connect_ms`.
    Connect,
    /// A whole info or control call, or a response head after its first byte: `limits.call_ms`.
    Call,
    /// A retry's wait for its first byte reached the end of the retry budget: `retry.total_ms`.
    RetryTotal,
}

impl Deadline {
    /// The config key of the limit, as written in config.toml.
    pub fn key(self) -> &'static str {
        match self {
            Deadline::Connect => "limits.connect_ms",
            Deadline::Call => "limits.call_ms",
            Deadline::RetryTotal => "retry.total_ms",
        }
    }
}

/// How the server broke the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The response or its event stream, as `llama-proto`'s `ChatStream` reports it: the
    /// typed error of the part that found it (`http-nostd`'s head, framing or size caps,
    /// `sse-nostd`'s 1 MiB line and event cap, a payload that is not a chunk, a chunk that
    /// breaks the stream's rules or a message cap), or the stream's own (a `200` that is not an
    /// event stream).
    Stream(StreamError),
    /// The JSON body of an info or control call is not what was expected.
    Json {
        /// The call, as its path (`/props`, `/slots`, `/tokenize`, the control call).
        what: &'static str,
        /// 1-based line of the error in the body (0 when at the end).
        line: usize,
        /// 1-based column of the error in the body.
        column: usize,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Stream(e) => write!(f, "{e}"),
            ProtocolError::Json { what, line, column } => {
                write!(f, "{what}: unexpected JSON at line {line} column {column}")
            }
        }
    }
}

impl std::error::Error for ProtocolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProtocolError::Stream(e) => Some(e),
            ProtocolError::Json { .. } => None,
        }
    }
}

/// The whole path's one error (`llama_proto::ChatStream`'s), not a copy of it, except where
/// it says the connection ended before the stream did: inside the head, a chunk's size or
/// data, an event, or between events before the final chunk. That is
/// [`InferError::StreamClosedEarly`] wherever the cut falls (a router whose upstream died
/// ends its own chunked body cleanly, mid-event), so it is retried as the design says.
impl From<StreamError> for InferError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::Http(HttpError::Truncated | HttpError::IncompleteHead)
            | StreamError::Sse(SseError::Unterminated)
            | StreamError::Assemble(AssembleError::NoFinishReason) => InferError::StreamClosedEarly,
            e => InferError::Protocol(ProtocolError::Stream(e)),
        }
    }
}

/// A response read without the stream (the info and control calls): the reader's error, as
/// the stream names it.
impl From<HttpError> for InferError {
    fn from(e: HttpError) -> Self {
        StreamError::Http(e).into()
    }
}

impl fmt::Display for InferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InferError::Busy => f.write_str("the request queue for the slot is full"),
            InferError::Connect { socket, source } => write!(
                f,
                "cannot reach the inference socket {}: {source}",
                socket.display()
            ),
            InferError::WaitTimeout => f.write_str("the slot stayed busy past limits.busy_wait_ms"),
            InferError::LoadTimeout => {
                f.write_str("the server stayed unavailable past limits.load_wait_ms")
            }
            InferError::Stalled(Silence::IdleGrace) => f.write_str(
                "the slot was idle but the server sent nothing within limits.idle_grace_ms",
            ),
            InferError::Stalled(Silence::Liveness) => {
                f.write_str("the server went silent past limits.liveness_ms")
            }
            InferError::TimedOut(Deadline::Connect) => f.write_str(
                "connecting to the inference socket and sending the request took longer than \
                 limits.connect_ms",
            ),
            InferError::TimedOut(Deadline::Call) => {
                f.write_str("the server did not finish answering within limits.call_ms")
            }
            InferError::TimedOut(Deadline::RetryTotal) => {
                f.write_str("no answer before the retry budget retry.total_ms ran out")
            }
            InferError::StreamClosedEarly => f.write_str("the stream ended before its last chunk"),
            InferError::ThinkingOverrun => f.write_str("reasoning ran on past the thinking cap"),
            InferError::Http { status, body } if self.model_failed_to_load() => write!(
                f,
                "the router says the model failed to load (HTTP {status}: {body}); \
                 `llama-worker status` says why and names the server log"
            ),
            InferError::Http { status, body } => write!(f, "HTTP {status}: {body}"),
            InferError::Protocol(e) => write!(f, "protocol error: {e}"),
            InferError::Cancelled => f.write_str("the request was cancelled"),
        }
    }
}

impl InferError {
    /// Whether a request that ended this way, once sent, may have left the server generating:
    /// loopd closed the connection (a cancel, a stall, a deadline, the thinking cap, a broken
    /// stream) rather than the server ending the answer (an error status or payload, a close).
    /// The next request on that slot waits for `/slots` to say it is idle.
    pub fn may_leave_slot_busy(&self) -> bool {
        matches!(
            self,
            InferError::Cancelled
                | InferError::Stalled(_)
                | InferError::TimedOut(_)
                | InferError::ThinkingOverrun
                | InferError::Protocol(_)
                | InferError::WaitTimeout
                | InferError::LoadTimeout
        )
    }

    /// Whether this is the router's answer for a model whose instance could not load (an
    /// HTTP 500 whose body says `model name=… failed to load`): waiting longer will not help,
    /// the worker's status has the cause.
    pub fn model_failed_to_load(&self) -> bool {
        matches!(self, InferError::Http { status: 500, body } if body.contains("failed to load"))
    }
}

impl std::error::Error for InferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InferError::Connect { source, .. } => Some(source),
            InferError::Protocol(e) => Some(e),
            _ => None,
        }
    }
}

impl InferError {
    /// The printable name of the error's kind, as a request's result names it:
    /// `busy`, `connect_error`, `wait_timeout`, `load_timeout`, `stalled`, `timed_out`,
    /// `stream_closed_early`, `thinking_overrun`, `http_error`, `protocol_error`, `cancelled`.
    pub fn as_str(&self) -> &'static str {
        match self {
            InferError::Busy => "busy",
            InferError::Connect { .. } => "connect_error",
            InferError::WaitTimeout => "wait_timeout",
            InferError::LoadTimeout => "load_timeout",
            InferError::Stalled(_) => "stalled",
            InferError::TimedOut(_) => "timed_out",
            InferError::StreamClosedEarly => "stream_closed_early",
            InferError::ThinkingOverrun => "thinking_overrun",
            InferError::Http { .. } => "http_error",
            InferError::Protocol(_) => "protocol_error",
            InferError::Cancelled => "cancelled",
        }
    }

    /// The error for a request to `socket` that could not be sent.
    pub fn from_send(socket: &std::path::Path, e: SendError) -> InferError {
        match e {
            SendError::Io(source) => InferError::Connect {
                socket: socket.to_owned(),
                source,
            },
            SendError::TimedOut => InferError::TimedOut(Deadline::Connect),
            SendError::Cancelled => InferError::Cancelled,
        }
    }
}

// A request's result is kept and handed out, so its error is cloned and compared; an
// `io::Error` is neither, and is carried over by its kind and message.
impl Clone for InferError {
    fn clone(&self) -> Self {
        match self {
            InferError::Busy => InferError::Busy,
            InferError::Connect { socket, source } => InferError::Connect {
                socket: socket.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            InferError::WaitTimeout => InferError::WaitTimeout,
            InferError::LoadTimeout => InferError::LoadTimeout,
            InferError::Stalled(s) => InferError::Stalled(*s),
            InferError::TimedOut(d) => InferError::TimedOut(*d),
            InferError::StreamClosedEarly => InferError::StreamClosedEarly,
            InferError::ThinkingOverrun => InferError::ThinkingOverrun,
            InferError::Http { status, body } => InferError::Http {
                status: *status,
                body: body.clone(),
            },
            InferError::Protocol(e) => InferError::Protocol(*e),
            InferError::Cancelled => InferError::Cancelled,
        }
    }
}

impl PartialEq for InferError {
    fn eq(&self, other: &Self) -> bool {
        use InferError as E;
        match (self, other) {
            (
                E::Connect { socket, source },
                E::Connect {
                    socket: s,
                    source: o,
                },
            ) => socket == s && source.kind() == o.kind() && source.to_string() == o.to_string(),
            (E::Stalled(a), E::Stalled(b)) => a == b,
            (E::TimedOut(a), E::TimedOut(b)) => a == b,
            (E::Http { status, body }, E::Http { status: s, body: b }) => status == s && body == b,
            (E::Protocol(a), E::Protocol(b)) => a == b,
            (a, b) => {
                std::mem::discriminant(a) == std::mem::discriminant(b)
                    && !matches!(
                        a,
                        E::Connect { .. }
                            | E::Stalled(_)
                            | E::TimedOut(_)
                            | E::Http { .. }
                            | E::Protocol(_)
                    )
            }
        }
    }
}

impl Eq for InferError {}

/// `body` as text, cut to at most [`ERROR_BODY_CAP`] bytes on a character boundary.
pub fn capped_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_CAP)]);
    let mut end = text.len().min(ERROR_BODY_CAP);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// What a request had assembled when it failed: the answer so far and the stream's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Partial {
    /// The answer so far (see [`AssistantMessage::tool_calls`] for an unfinished call).
    pub message: AssistantMessage,
    /// The latest timings the stream carried.
    pub timings: Option<Timings>,
    /// Reasoning tokens counted so far.
    pub reasoning_tokens: u64,
}

impl From<Completion> for Partial {
    /// A whole answer kept as the output of a request that failed anyway.
    fn from(done: Completion) -> Self {
        Partial {
            message: done.message,
            timings: done.timings,
            reasoning_tokens: done.reasoning_tokens,
        }
    }
}

/// A request that ended without a completion: the error, and what was assembled before it.
#[derive(Debug)]
pub struct Failed {
    /// Why it ended.
    pub error: InferError,
    /// The output assembled before it ended (empty when no byte of the answer came).
    pub partial: Partial,
}

impl Failed {
    /// A failure before any output.
    pub fn bare(error: InferError) -> Failed {
        Failed {
            error,
            partial: Partial::default(),
        }
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_is_capped_at_4_kib_on_a_char_boundary() {
        assert_eq!(capped_body(&[b'a'; ERROR_BODY_CAP]).len(), ERROR_BODY_CAP);
        assert_eq!(
            capped_body(&[b'a'; ERROR_BODY_CAP + 1]).len(),
            ERROR_BODY_CAP
        );
        let mut body = vec![b'a'; ERROR_BODY_CAP - 1];
        body.extend_from_slice("é".as_bytes());
        assert_eq!(capped_body(&body).len(), ERROR_BODY_CAP - 1);
        assert_eq!(capped_body(b"bad \xff"), "bad \u{fffd}");
    }

    #[test]
    fn errors_say_what_went_wrong() {
        let e = InferError::Http {
            status: 400,
            body: "the prompt does not fit".into(),
        };
        assert_eq!(e.to_string(), "HTTP 400: the prompt does not fit");
        // The router's answer for a model whose instance died on load (recorded from the router).
        let body = include_str!("../../../../fixtures/router/props-failed-to-load.json");
        let e = InferError::Http {
            status: 500,
            body: body.into(),
        };
        assert!(e.model_failed_to_load());
        assert_eq!(
            e.to_string(),
            format!(
                "the router says the model failed to load (HTTP 500: {body}); `llama-worker \
                 status` says why and names the server log"
            )
        );
        let e = InferError::Connect {
            socket: "/run/loopd/infer.sock".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            e.to_string(),
            "cannot reach the inference socket /run/loopd/infer.sock: entity not found"
        );
        assert_eq!(
            InferError::Busy.to_string(),
            "the request queue for the slot is full"
        );
        assert_eq!(
            InferError::Cancelled.to_string(),
            "the request was cancelled"
        );
    }

    #[test]
    fn every_timeout_names_its_config_key() {
        let timeouts = [
            (InferError::Stalled(Silence::Liveness), "limits.liveness_ms"),
            (
                InferError::Stalled(Silence::IdleGrace),
                "limits.idle_grace_ms",
            ),
            (InferError::WaitTimeout, "limits.busy_wait_ms"),
            (InferError::LoadTimeout, "limits.load_wait_ms"),
            (InferError::TimedOut(Deadline::Connect), "limits.connect_ms"),
            (InferError::TimedOut(Deadline::Call), "limits.call_ms"),
            (InferError::TimedOut(Deadline::RetryTotal), "retry.total_ms"),
        ];
        for (e, key) in timeouts {
            assert!(e.to_string().contains(key), "{e} names {key}");
        }
        assert_eq!(Silence::Liveness.key(), "limits.liveness_ms");
        assert_eq!(Deadline::Call.key(), "limits.call_ms");
    }

    #[test]
    fn protocol_errors_keep_their_typed_cause() {
        use std::error::Error;
        let e = InferError::from(HttpError::HeadersTooLarge);
        assert!(matches!(
            e,
            InferError::Protocol(ProtocolError::Stream(llama_proto::StreamError::Http(
                HttpError::HeadersTooLarge
            )))
        ));
        assert!(e.to_string().starts_with("protocol error: HTTP response: "));
        // InferError -> ProtocolError -> StreamError -> HttpError.
        let cause = e
            .source()
            .and_then(|p| p.source())
            .and_then(|s| s.source())
            .map(|c| c.to_string());
        assert_eq!(cause, Some(HttpError::HeadersTooLarge.to_string()));
        // Each way the connection can end before the stream does is one error, retried.
        for cut in [
            llama_proto::StreamError::Http(HttpError::IncompleteHead),
            llama_proto::StreamError::Http(HttpError::Truncated),
            llama_proto::StreamError::Sse(SseError::Unterminated),
            llama_proto::StreamError::Assemble(llama_proto::AssembleError::NoFinishReason),
        ] {
            assert!(
                matches!(InferError::from(cut), InferError::StreamClosedEarly),
                "{cut:?}"
            );
        }
        // A stream that is wrong, not short, stays a protocol error.
        assert!(matches!(
            InferError::from(llama_proto::StreamError::Sse(SseError::LineTooLong)),
            InferError::Protocol(ProtocolError::Stream(llama_proto::StreamError::Sse(
                SseError::LineTooLong
            )))
        ));
        let j = ProtocolError::Json {
            what: "/props",
            line: 1,
            column: 7,
        };
        assert_eq!(j.to_string(), "/props: unexpected JSON at line 1 column 7");
        assert!(j.source().is_none());
    }

    #[test]
    fn failed_shows_its_error_and_keeps_the_partial() {
        let f = Failed {
            error: InferError::StreamClosedEarly,
            partial: Partial {
                message: AssistantMessage {
                    content: Some("Red".into()),
                    ..AssistantMessage::default()
                },
                ..Partial::default()
            },
        };
        assert_eq!(f.to_string(), "the stream ended before its last chunk");
        let source = std::error::Error::source(&f).map(|s| s.to_string());
        assert_eq!(source, Some(f.error.to_string()));
        assert_eq!(f.partial.message.content.as_deref(), Some("Red"));
        assert_eq!(Failed::bare(InferError::Busy).partial, Partial::default());
    }
}
