//! The whole path, `ChatStream`, on any bytes after a fixed 200 event-stream head or raw.
//!
//! The body, with what it checks: [`fuzz_entries::chat_stream`] (`crates/fuzz-entries/`). The
//! stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input of
//! this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::chat_stream(data));
