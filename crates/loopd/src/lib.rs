//! loopd's inference client: llama-server reached through inferproxy's Unix socket.
//!
//! [`config`] reads `config.toml`; [`http`] and [`sse`] are the std side of the `http-nostd`
//! and `sse-nostd` parsers over a `UnixStream`; [`llama`] is the client itself, with its slot
//! gate, timers, thinking cap and retry. Time and jitter come in through [`clock`], so the
//! timers and the retry schedule are tested without sleeping. [`selftest`] holds the three
//! startup checks that `loopd selftest` runs. Nothing here starts a thread or
//! opens a TCP connection.
//!
//! ```no_run
//! use loopd::llama::{ChatEvent, ChatMessage, ChatRequest, Client};
//! use loopd::Config;
//!
//! let config = Config::load(std::path::Path::new("/etc/boxmaker/loopd.toml"))?;
//! let client = Client::new(config);
//! let req = ChatRequest {
//!     slot: 0,
//!     messages: vec![ChatMessage::User { content: "Name three colours.".into() }],
//!     tools: vec![],
//!     thinking: false,
//!     max_tokens: None,
//!     sampling: None,
//! };
//! let done = client.chat_with_retry(&req, &mut |e: &ChatEvent| {
//!     if let ChatEvent::Content(text) = e {
//!         print!("{text}");
//!     }
//! })?;
//! println!("\n{:?} after {} tokens", done.finish_reason, done.timings.expect("timings").predicted_n);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod cancel;
pub mod clock;
pub mod config;
mod heap;
pub mod http;
pub mod sse;

pub use config::{Config, ConfigError};
pub use llama::{ChatEvent, ChatRequest, Client, InferError};
pub mod llama;
pub mod selftest;
