//! `loopd serve`'s command line on any bytes: a command read is written by its own serde type
//! and reads back as itself, a refusal names where or what, and the documented cap holds.
//!
//! The body, with what it checks: [`fuzz_entries::daemon_command`] (`crates/fuzz-entries/`).
//! The stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input
//! of this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::daemon_command(data));
