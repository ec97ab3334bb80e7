//! loopd's inference client: llama-server reached through inferproxy's Unix socket.
//!
//! [`config`] reads `config.toml`; [`http`] and [`sse`] are the std side of the `http-nostd`
//! and `sse-nostd` parsers over a `UnixStream`; [`llama`] is the client itself, with its slot
//! gate, timers, thinking cap and retry. Time and jitter come in through [`clock`], so the
//! timers and the retry schedule are tested without sleeping. Nothing here starts a thread or
//! opens a TCP connection.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod clock;
pub mod config;
pub mod http;
pub mod sse;

pub use config::{Config, ConfigError};
pub use llama::{ChatEvent, ChatRequest, Client, InferError};
pub mod llama;
