//! llama-server chat protocol, sans IO.
//!
//! The core is `no_std` without an allocator: [`Timings`], [`FinishReason`],
//! [`cache_outcome`] and [`hash`]. The `alloc` feature adds the owned types
//! `loopd` builds requests from and returns at the end of a request
//! ([`ChatMessage`], [`ToolCall`], [`ToolSchema`], [`Completion`]).
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod cache;
pub mod hash;
#[cfg(feature = "alloc")]
mod owned;
mod types;

pub use cache::{cache_outcome, CacheOutcome, CACHE_LOSS_TOLERANCE};
#[cfg(feature = "alloc")]
pub use owned::{ChatMessage, Completion, ToolCall, ToolSchema};
pub use types::{FinishReason, Timings};
