//! http-nostd (placeholder until its issue lands).
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
