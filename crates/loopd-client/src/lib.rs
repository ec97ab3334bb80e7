//! loopd's llama-server client: llama-server reached through inferproxy's Unix socket.
//!
//! [`config`] holds the client's sections of loopd's `config.toml` ([`ClientConfig`]: the
//! socket, the model, the limits, the retry schedule, the sampling and what the self-test
//! expects); [`http`] is a blocking HTTP/1.1 client over a `UnixStream` with a deadline on
//! every step (on `http-nostd`); [`llama`] is the client itself: a sans-IO exchange per
//! request (on `http-nostd`, `sse-nostd` and `llama-proto`) with its timers and thinking cap,
//! driven over the socket, and the slot gate, cancel and retry around it. Time and jitter come
//! in through [`clock`]; the exchange takes time as input, so its timers are tested on fake
//! time. [`selftest`] holds the three startup checks that `loopd selftest` runs. Nothing here
//! starts a thread, opens a TCP connection, or needs SQLite or a command line.
//!
//! ```no_run
//! use loopd_client::llama::{ChatEvent, ChatRequest, Client};
//! use loopd_client::ClientConfig;
//!
//! let client = Client::new(ClientConfig::new("/run/inferproxy/infer.sock", "smollm2"));
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
mod heap;
pub mod http;
pub mod llama;
pub mod selftest;
mod sse;

pub use config::ClientConfig;
pub use llama::{ChatEvent, ChatOptions, ChatRequest, Client, InferError};
