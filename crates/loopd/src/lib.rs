//! loopd, the agent daemon: `loopd serve` keeps agent requests and their results in a durable
//! store and answers clients on its Unix socket, running each request on the agent runner
//! (`loopd-agent`) over the llama-server client (`loopd-client`).
//!
//! [`config`] reads `config.toml`, the one file that assembles every layer's section (the
//! client's `[limits]`, `[retry]`, `[sampling]` and `[expect]`, the runner's `[runner]`,
//! `[placement]` and `[[host]]`, and the daemon's own `[daemon]`) and checks them against each
//! other. [`daemon`] is `loopd serve`: its listener, one connection's handler, the commands,
//! the state and its followers, the store (SQLite), the socket protocol and the metrics. The
//! `loopd` binary (`src/bin/loopd`) is the command line over all three.
//!
//! ```no_run
//! use loopd::Config;
//! use loopd_client::llama::{ChatEvent, ChatRequest, Client};
//!
//! let config = Config::load(std::path::Path::new("/etc/boxmaker/loopd.toml"))?;
//! let client = Client::new(config.client());
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

pub mod config;
pub mod daemon;

pub use config::{Config, ConfigError};
