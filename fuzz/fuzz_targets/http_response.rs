//! http-nostd: no panic on any input, caps hold, and split feeding agrees with whole feeding.
//!
//! The body, with what it checks: [`fuzz_entries::http_response`] (`crates/fuzz-entries/`). The
//! stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input of
//! this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::http_response(data));
