//! The client's sections of loopd's `config.toml`: the socket and model ([`ClientConfig`]),
//! `[limits]`, `[retry]`, `[sampling]` and `[expect]`.
//!
//! Every limit of the design's section 4 is a field with the default given there. The
//! sections are read, and checked against each other, by the file that assembles them
//! (`loopd`'s config); a program that builds a [`ClientConfig`] in code gets the same defaults.

use std::path::PathBuf;

use serde::Deserialize;

/// What the client is given: where the server is, which model, and the sections it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConfig {
    /// The Unix socket inferproxy listens on; the client reaches the model only through it.
    pub socket: PathBuf,
    /// The model id the router serves (sent as `model` in every request and query).
    pub model: String,
    /// The timers and caps of one request.
    pub limits: Limits,
    /// The retry schedule of `chat_with_retry`.
    pub retry: Retry,
    /// Sampling settings; an unset one is left to the server's default.
    pub sampling: Sampling,
    /// What the startup self-test expects of the server.
    pub expect: Option<Expect>,
}

impl ClientConfig {
    /// A config with every default, for tests and programs that build one in code.
    pub fn new(socket: impl Into<PathBuf>, model: impl Into<String>) -> ClientConfig {
        ClientConfig {
            socket: socket.into(),
            model: model.into(),
            limits: Limits::default(),
            retry: Retry::default(),
            sampling: Sampling::default(),
            expect: None,
        }
    }
}

/// The limits of section 4, in milliseconds or tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Read timeout while waiting for the first byte; each expiry polls `/slots` (5 s).
    pub poll_ms: u64,
    /// How long the slot may stay busy before the first byte: then `WaitTimeout` (10 min).
    pub busy_wait_ms: u64,
    /// How long `/slots` may fail or answer 503 before the first byte: then `LoadTimeout` (3 min).
    pub load_wait_ms: u64,
    /// How long an idle slot may send no byte: then `Stalled` (30 s).
    pub idle_grace_ms: u64,
    /// Read timeout after the first byte: silence past it is `Stalled` (30 s).
    pub liveness_ms: u64,
    /// Connecting to the socket and writing a request, whole: past it is `TimedOut` (5 s).
    pub connect_ms: u64,
    /// A whole `/props`, `/slots`, `/tokenize` or control call with its body, an error body,
    /// or a response head after its first byte: past it is `TimedOut` (30 s).
    pub call_ms: u64,
    /// Reasoning tokens before the client posts `reasoning_end` (4,096).
    pub thinking_cap: u64,
    /// Reasoning tokens tolerated after the cap before `ThinkingOverrun` (256).
    pub thinking_overrun: u64,
    /// `max_tokens` of every request, the backstop (8,192).
    pub max_tokens: u64,
    /// Requests that may queue at loopd's slot gate per slot before `Busy` (8).
    pub queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            poll_ms: 5_000,
            busy_wait_ms: 600_000,
            load_wait_ms: 180_000,
            idle_grace_ms: 30_000,
            liveness_ms: 30_000,
            connect_ms: 5_000,
            call_ms: 30_000,
            thinking_cap: 4_096,
            thinking_overrun: 256,
            max_tokens: 8_192,
            queue: 8,
        }
    }
}

/// The retry schedule: `attempts` in all, waiting `delays_ms` between them with jitter.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retry {
    /// Attempts in all, the first included (4; at most [`Retry::MAX_ATTEMPTS`]).
    pub attempts: u32,
    /// The wait before attempt 2, 3, ... (2 s, 8 s, 30 s); one fewer than `attempts`. Left out
    /// of the file it follows `attempts` ([`Retry::delays_for`]).
    pub delays_ms: Vec<u64>,
    /// Each wait varies by up to this percentage either way (25).
    pub jitter_percent: u64,
    /// No retry is started whose wait would end past this time since the first attempt (5 min).
    pub total_ms: u64,
}

impl Retry {
    /// One attempt, never retried.
    pub fn once() -> Self {
        Retry {
            attempts: 1,
            delays_ms: Vec::new(),
            jitter_percent: 0,
            total_ms: 0,
        }
    }
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 4,
            delays_ms: vec![2_000, 8_000, 30_000],
            jitter_percent: 25,
            total_ms: 300_000,
        }
    }
}

/// Sampling settings sent with every request; `None` leaves the server's default.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k`.
    pub top_k: Option<u32>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `repeat_penalty`.
    pub repeat_penalty: Option<f64>,
    /// `seed`.
    pub seed: Option<u64>,
}

/// Hex digits in `[expect] chat_template_sha256`: a SHA-256 is 32 bytes.
pub const SHA256_HEX_DIGITS: usize = 64;

/// What `/props` must say for the self-test to pass.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Hex SHA-256 of `chat_template`: [`SHA256_HEX_DIGITS`] digits, either case.
    pub chat_template_sha256: String,
    /// Per-slot context size.
    pub n_ctx: u64,
    /// `total_slots`.
    pub total_slots: u32,
}

impl Retry {
    /// The most attempts a config may ask for: a bound on the schedule it is given.
    pub const MAX_ATTEMPTS: u32 = 100;

    /// The default waits for `attempts` attempts: the default schedule's first
    /// `attempts - 1`, its last (30 s) repeated past its end. Empty for 0 or 1 attempt.
    pub fn delays_for(attempts: u32) -> Vec<u64> {
        let schedule = Retry::default().delays_ms;
        let last = schedule.last().copied().unwrap_or(0);
        let retries = attempts.clamp(1, Retry::MAX_ATTEMPTS) as usize - 1;
        (0..retries)
            .map(|i| schedule.get(i).copied().unwrap_or(last))
            .collect()
    }
}
