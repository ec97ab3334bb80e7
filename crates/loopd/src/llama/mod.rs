//! The llama-server client: what goes in ([`ChatRequest`]), what comes back while it runs
//! ([`ChatEvent`]) and at the end ([`Completion`] or [`InferError`]), and the [`Client`].
//!
//! `Client::chat` (in [`chat`]) runs one request from the slot gate to the completion;
//! `Client::chat_with_retry` (in [`retry`]) wraps it in the backoff schedule; the calls of
//! [`info`] read `/props`, `/slots` and `/tokenize`.

use std::fmt;
use std::sync::Arc;

use crate::clock::{Clock, Jitter, SystemClock, SystemJitter};
use crate::config::{Config, Sampling};

pub mod assemble;
pub mod chat;
pub mod gate;
pub mod info;
pub mod request;
pub mod retry;
// SHIM (issue 14): issue 13's cancellable exchange; delete when issue 13 lands.
mod run_shim;
pub use run_shim::{Cancel, Failed, Partial};

pub use llama_proto::{
    cache_outcome, CacheOutcome, ChatMessage, Completion, FinishReason, Timings, ToolCall,
    ToolSchema, CACHE_LOSS_TOLERANCE,
};

/// One chat request: the messages, the tools and the slot it is pinned to.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The server slot (`id_slot`) this request runs on and queues for.
    pub slot: u32,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// The tools the model may call; fixed for the epoch; may be empty.
    pub tools: Vec<ToolSchema>,
    /// Whether the model thinks before answering.
    pub thinking: bool,
    /// `max_tokens` for this request, when lower than the config's backstop
    /// (`limits.max_tokens`, which it never raises).
    pub max_tokens: Option<u64>,
    /// Sampling for this request in place of the config's `[sampling]` (the self-test pins
    /// temperature 0 and a seed so that its answers do not vary).
    pub sampling: Option<Sampling>,
}

/// What comes back while a request runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatEvent {
    /// Waiting for loopd's own slot gate, with this many requests in front.
    Queued {
        /// Requests in front, the one in flight included.
        ahead: usize,
    },
    /// Sent, no byte yet; one event per `/slots` poll.
    Waiting {
        /// Whether `/slots` said the slot is processing.
        slot_busy: bool,
    },
    /// Prompt processing progress.
    Progress {
        /// Prompt tokens in all.
        total: u64,
        /// Prompt tokens taken from the cache.
        cache: u64,
        /// Prompt tokens processed so far (the cached ones included).
        processed: u64,
    },
    /// A piece of the reasoning text.
    Reasoning(String),
    /// A piece of the answer text.
    Content(String),
    /// A piece of one tool call.
    ToolCallDelta {
        /// Which tool call of the message.
        index: u32,
        /// The call id, on the piece that carries it.
        id: Option<String>,
        /// The function name, on the piece that carries it.
        name: Option<String>,
        /// A piece of the arguments text.
        arguments: String,
    },
    /// The thinking cap was reached after this many reasoning tokens; `reasoning_end` was sent.
    ThinkingCapped {
        /// Reasoning tokens when the cap was hit.
        tokens: u64,
    },
    /// The previous attempt failed with `error`; attempt `attempt` starts after `after_ms`.
    Retrying {
        /// The attempt about to start (2 for the first retry).
        attempt: u32,
        /// The wait before it, jitter included.
        after_ms: u64,
        /// What went wrong with the previous attempt.
        error: String,
    },
}

/// What ended a request without a completion.
#[derive(Debug)]
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
    /// The slot stayed busy past `limits.busy_wait_ms`.
    WaitTimeout,
    /// The server stayed unavailable past `limits.load_wait_ms`.
    LoadTimeout,
    /// The server sent nothing for as long as the named limit allows.
    Stalled(Silence),
    /// The stream ended before its final chunk.
    StreamClosedEarly,
    /// Reasoning went on past the cap, or the server refused to end it.
    ThinkingOverrun,
    /// The server answered with an error status (or an error payload mid-stream).
    Http {
        /// The HTTP status (or the error payload's code).
        status: u16,
        /// The body or the server's message, capped at [`ERROR_BODY_CAP`] bytes.
        body: String,
    },
    /// The server broke the protocol or a size cap.
    Protocol(String),
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

/// Bytes of an error body kept in [`InferError::Http`].
pub const ERROR_BODY_CAP: usize = 4 * 1024;

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
            InferError::StreamClosedEarly => f.write_str("the stream ended before its last chunk"),
            InferError::ThinkingOverrun => f.write_str("reasoning ran on past the thinking cap"),
            InferError::Http { status, body } => write!(f, "HTTP {status}: {body}"),
            InferError::Protocol(what) => write!(f, "protocol error: {what}"),
            InferError::Cancelled => f.write_str("the request was cancelled"),
        }
    }
}

impl std::error::Error for InferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InferError::Connect { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `body` as text, cut to at most [`ERROR_BODY_CAP`] bytes on a character boundary.
pub fn capped_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_CAP)]);
    let mut end = text.len().min(ERROR_BODY_CAP);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The inference client: one per loopd, shared by every session.
pub struct Client {
    config: Config,
    clock: Arc<dyn Clock>,
    jitter: Arc<dyn Jitter>,
    gate: gate::SlotGate,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client on the system clock and jitter.
    pub fn new(config: Config) -> Client {
        Client::with_time(
            config,
            Arc::new(SystemClock::new()),
            Arc::new(SystemJitter::new()),
        )
    }

    /// A client on the given clock and jitter (tests pass fakes).
    pub fn with_time(config: Config, clock: Arc<dyn Clock>, jitter: Arc<dyn Jitter>) -> Client {
        let gate = gate::SlotGate::new(config.limits.queue);
        Client {
            config,
            clock,
            jitter,
            gate,
        }
    }

    /// The config this client was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The clock the timers and the retry schedule read.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The jitter source of the retry schedule.
    pub fn jitter(&self) -> &dyn Jitter {
        &*self.jitter
    }

    /// The slot gate every request of this client passes.
    pub fn gate(&self) -> &gate::SlotGate {
        &self.gate
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
        let e = InferError::Connect {
            socket: "/run/loopd/infer.sock".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            e.to_string(),
            "cannot reach the inference socket /run/loopd/infer.sock: entity not found"
        );
        // Each timeout names the config key that fired.
        assert_eq!(
            InferError::Stalled(Silence::Liveness).to_string(),
            "the server went silent past limits.liveness_ms"
        );
        assert_eq!(
            InferError::Stalled(Silence::IdleGrace).to_string(),
            "the slot was idle but the server sent nothing within limits.idle_grace_ms"
        );
        assert_eq!(
            InferError::WaitTimeout.to_string(),
            "the slot stayed busy past limits.busy_wait_ms"
        );
        assert_eq!(
            InferError::LoadTimeout.to_string(),
            "the server stayed unavailable past limits.load_wait_ms"
        );
        assert_eq!(
            InferError::Busy.to_string(),
            "the request queue for the slot is full"
        );
    }
}
