//! llama-worker's status-socket lines on any UTF-8, whole and line by line: every parser of
//! worker-proto, each value read written by its own writer and read back equal.
//!
//! The body, with what it checks: [`fuzz_entries::worker_lines`] (`crates/fuzz-entries/`).
//! The stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input
//! of this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::worker_lines(data));
