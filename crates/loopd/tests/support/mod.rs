//! The fake llama-server (`llama_harness::fake`), and the daemon these tests start on it.
#![allow(dead_code)]

pub mod daemon;
pub mod serve;

pub use llama_harness::fake::*;
