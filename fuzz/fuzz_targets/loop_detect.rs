//! `LoopDetector` on any bytes, in pieces.
//!
//! The body, with what it checks: [`fuzz_entries::loop_detect`] (`crates/fuzz-entries/`). The
//! stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input of
//! this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::loop_detect(data));
