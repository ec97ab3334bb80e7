//! The body of every cargo-fuzz target in `fuzz/fuzz_targets/`: one function per target, named
//! as the target, which panics when its input breaks one of the target's checks (as the target
//! would crash). The fuzzer (nightly, `fuzz/`) and the replay test (stable, `tests/replay.rs`,
//! part of a plain `cargo test`) call the same functions, so an input the fuzzer once found
//! keeps being checked by every test run.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod chat_stream;
mod config_toml;
mod daemon_command;
mod http_response;
mod json_text;
mod loop_detect;
mod proto_assemble;
mod sse_parse;
mod text_calls;
mod worker_lines;

pub use chat_stream::chat_stream;
pub use config_toml::config_toml;
pub use daemon_command::daemon_command;
pub use http_response::http_response;
pub use loop_detect::loop_detect;
pub use proto_assemble::proto_assemble;
pub use sse_parse::sse_parse;
pub use text_calls::text_calls;
pub use worker_lines::worker_lines;

/// A target's body: returns on an input that passes every check, panics on one that does not.
pub type Entry = fn(&[u8]);

/// Every target by its name in `fuzz/fuzz_targets/<name>.rs`, with its entry function.
pub const TARGETS: [(&str, Entry); 9] = [
    ("chat_stream", chat_stream),
    ("config_toml", config_toml),
    ("daemon_command", daemon_command),
    ("http_response", http_response),
    ("loop_detect", loop_detect),
    ("proto_assemble", proto_assemble),
    ("sse_parse", sse_parse),
    ("text_calls", text_calls),
    ("worker_lines", worker_lines),
];
