//! loopd's inference client: llama-server reached through inferproxy's Unix socket.
//!
//! [`config`] reads `config.toml`; [`http`] is a blocking HTTP/1.1 client over a `UnixStream`
//! with a deadline on every step (on `http-nostd`); [`llama`] is the client itself: a sans-IO
//! exchange per request (on `http-nostd`, `sse-nostd` and `llama-proto`) with its timers and
//! thinking cap, driven over the socket, and the slot gate, cancel and retry around it. Time
//! and jitter come in through [`clock`]; the exchange takes time as input, so its timers are
//! tested on fake time. [`selftest`] holds the three startup checks that `loopd selftest`
//! runs. [`runner`] is the request runner of seed 003 (agent requests on a fixed slot table,
//! tool iterations on a budget, results kept until fetched); it is the only part that starts
//! threads (one per request, one per tool call, and a watcher when llama-worker's socket is
//! configured). Nothing opens a TCP connection.
//!
//! ```no_run
//! use loopd::llama::{ChatEvent, ChatRequest, Client};
//! use loopd::Config;
//!
//! let config = Config::load(std::path::Path::new("/etc/boxmaker/loopd.toml"))?;
//! let client = Client::new(config);
//! let req = ChatRequest::user(0, "Name three colours.");
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
pub mod daemon;
pub mod fleet;
mod heap;
pub mod http;
mod sse;

pub use config::{Config, ConfigError};
pub use llama::{ChatEvent, ChatOptions, ChatRequest, Client, InferError};
pub mod llama;
pub mod runner;
pub mod selftest;
