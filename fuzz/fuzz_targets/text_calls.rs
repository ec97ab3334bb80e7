//! `text_calls`, `parse_text_calls` and `prose` on any UTF-8 content.
//!
//! The body, with what it checks: [`fuzz_entries::text_calls`] (`crates/fuzz-entries/`). The
//! stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input of
//! this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::text_calls(data));
