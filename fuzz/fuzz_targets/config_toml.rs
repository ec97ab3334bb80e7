//! loopd's and llama-worker's config files on any text (the first byte chooses which): an
//! accepted config holds its own rules, a refusal names the file, its line and its key.
//!
//! The body, with what it checks: [`fuzz_entries::config_toml`] (`crates/fuzz-entries/`).
//! The stable replay test (`crates/fuzz-entries/tests/replay.rs`) runs every committed input
//! of this target through it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entries::config_toml(data));
