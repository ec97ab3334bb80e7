//! Keeps one local `llama-server` alive.
#![deny(missing_docs)]

pub mod policy;
pub mod stat;
