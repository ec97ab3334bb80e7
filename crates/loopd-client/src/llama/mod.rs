//! The llama-server client: what goes in ([`ChatRequest`]), what comes back while it runs
//! ([`ChatEvent`]) and at the end ([`Completion`], or [`Failed`] with its [`InferError`] and
//! [`Partial`] output), and the [`Client`].
//!
//! [`Client::run`] runs one request from the slot gate to the completion, cancellable through
//! a [`Cancel`]; [`Client::run_with_retry`] does the same under the retry schedule (`retry.rs`);
//! [`Client::chat`] and [`Client::chat_with_retry`] are the same without a cancel. The request
//! itself is a [`ChatCall`], a sans-IO state machine (the gate, the wait for an abandoned
//! slot, the attempts and the waits between them), which nests the [`ChatExchange`] of the
//! attempt on the wire (bytes and time in, [`Output`]s out); one IO driver (`chat.rs`)
//! carries out what either asks, for the client and for the runner alike. [`Client::props`], [`Client::slots`] and
//! [`Client::tokenize`] read what the server says about itself. A request's response is read
//! into a set of [`Buffers`] from the client's [`BufferPool`] ([`Client::buffers`]), which keeps
//! those of finished requests for the next.

use std::fmt;
use std::sync::Arc;

use crate::clock::{Clock, Jitter, SystemClock, SystemJitter};
use crate::config::{ClientConfig, Sampling};

mod assemble;
mod call;
mod chat;
mod error;
mod exchange;
mod gate;
mod info;
mod pool;
mod request;
mod retry;
mod slot_file;
mod timers;

pub use crate::cancel::Cancel;
pub use assemble::{Buffers, Storage, ARGUMENTS_CAP, CONTENT_CAP, REASONING_CAP, TOOL_CALLS_CAP};
pub use call::{CallOutput, ChatCall};
pub use chat::{wait_until, ByteSink, ChatIo};
pub use error::{
    capped_body, Deadline, Failed, InferError, Partial, ProtocolError, Silence, ERROR_BODY_CAP,
};
pub use exchange::{ChatExchange, Output};
pub use gate::SlotGate;
pub use gate::SlotPermit;
pub use llama_proto::{
    cache_outcome, AssistantMessage, CacheOutcome, ChatMessage, Completion, FinishReason, Timings,
    ToolCall, ToolSchema, CACHE_LOSS_TOLERANCE,
};
pub use pool::{BufferPool, PooledBuffers, SPARE_BUFFERS};
pub use request::render as render_request;
pub use slot_file::{check_slot_filename, SlotAction, SlotFile, SlotFilenameError};
pub use timers::SlotSeen;

/// How the model is to answer one request: the per-request settings of the chat body.
///
/// The runner's `Submission` (crate `loopd-agent`) carries the same struct and hands
/// it on unchanged to every generation, so a new setting is a field here, a line in the
/// serializer (`llama/request.rs`) and a golden file, and nothing else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// Whether the model thinks before answering.
    pub thinking: bool,
    /// `max_tokens` for this request, when lower than the config's backstop
    /// (`limits.max_tokens`, which it never raises).
    pub max_tokens: Option<u64>,
    /// Sampling for this request in place of the config's `[sampling]` (the self-test pins
    /// temperature 0 and a seed so that its answers do not vary).
    pub sampling: Option<Sampling>,
}

/// One chat request: the messages, the tools and the slot it is pinned to, and how the model
/// is to answer ([`ChatOptions`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The server slot (`id_slot`) this request runs on and queues for.
    pub slot: u32,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// The tools the model may call; fixed for the epoch; may be empty.
    pub tools: Vec<ToolSchema>,
    /// Thinking, `max_tokens`, sampling.
    pub options: ChatOptions,
}

impl ChatRequest {
    /// `messages` on `slot`, with no tools and the default [`ChatOptions`] (no thinking, the
    /// config's `max_tokens` and sampling); set the other fields on the result to change them.
    pub fn new(slot: u32, messages: Vec<ChatMessage>) -> Self {
        Self {
            slot,
            messages,
            tools: Vec::new(),
            options: ChatOptions::default(),
        }
    }

    /// One user message on `slot`, otherwise as [`ChatRequest::new`].
    pub fn user(slot: u32, content: impl Into<String>) -> Self {
        Self::new(
            slot,
            vec![ChatMessage::User {
                content: content.into(),
            }],
        )
    }

    /// The same request with `options`.
    pub fn with_options(self, options: ChatOptions) -> Self {
        Self { options, ..self }
    }
}

/// What comes back while a request runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatEvent {
    /// Waiting for loopd's own slot gate, with this many requests in front.
    Queued {
        /// Requests in front, the one in flight included.
        ahead: usize,
    },
    /// Sent, no byte yet, and `/slots` says the slot is busy or cannot say (a model loading);
    /// one event per such poll, none while it says idle.
    Waiting {
        /// Whether `/slots` said the slot is processing (else: unavailable, loading).
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

/// The inference client: one per loopd, shared by every session.
pub struct Client {
    config: ClientConfig,
    clock: Arc<dyn Clock>,
    jitter: Arc<dyn Jitter>,
    gate: gate::SlotGate,
    buffers: BufferPool,
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
    pub fn new(config: ClientConfig) -> Client {
        Client::with_time(
            config,
            Arc::new(SystemClock::new()),
            Arc::new(SystemJitter::new()),
        )
    }

    /// A client on the given clock and jitter (tests pass fakes).
    pub fn with_time(
        config: ClientConfig,
        clock: Arc<dyn Clock>,
        jitter: Arc<dyn Jitter>,
    ) -> Client {
        let gate = gate::SlotGate::new(config.limits.queue);
        Client {
            config,
            clock,
            jitter,
            gate,
            buffers: BufferPool::new(),
        }
    }

    /// The config this client was built from.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The clock the timers, the retry schedule and every wait of this client read.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The same clock, to share with what runs beside the client (the runner's tools).
    pub fn shared_clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// The jitter source of the retry schedule.
    pub fn jitter(&self) -> &dyn Jitter {
        &*self.jitter
    }

    /// The same jitter source, for a machine that runs its own retry schedule (the runner's).
    pub fn shared_jitter(&self) -> Arc<dyn Jitter> {
        Arc::clone(&self.jitter)
    }

    /// The slot gate every request of this client passes.
    pub fn gate(&self) -> &SlotGate {
        &self.gate
    }

    /// One request's [`Buffers`] from this client's pool (those of a finished request, else
    /// new ones), given back when the guard drops: what [`Client::run`] reads into, and what
    /// a driver of its own (the runner's) should use in place of [`Buffers::new`].
    pub fn buffers(&self) -> PooledBuffers<'_> {
        self.buffers.take()
    }

    /// The pool behind [`Client::buffers`].
    pub fn buffer_pool(&self) -> &BufferPool {
        &self.buffers
    }
}
