//! The SSE parser on any bytes: whole, in pieces of fuzzer-chosen sizes and byte by byte.
//!
//! The body, with what it checks: [`fuzz_entries::sse_parse`] (`crates/fuzz-entries/`). The
//! stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input of
//! this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::sse_parse(data));
