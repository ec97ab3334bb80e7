//! `inferproxy`: forwards a Unix socket to one TCP upstream, byte for byte.
//!
//! The agent daemon reaches the model server only through this socket. The forwarder never
//! parses what it carries; it only bounds how many connections there are (8) and how fast they
//! are accepted (a burst of 10, then 2 per second), to stop accidents such as a retry storm.
//!
//! The decisions ([`bucket`], [`admission`], [`args`]) take their inputs, time included, from
//! the caller and are tested without sockets; [`listen`], [`forward`] and [`serve`] do the IO.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admission;
pub mod args;
pub mod bucket;
pub mod forward;
pub use socket_file as listen;
pub mod serve;
