//! Keeps one local `llama-server` alive: lifecycle states, restart policy, a CPU-time liveness
//! probe summed over the server's process group, and crash-loop protection.
//!
//! The policy ([`policy::Policy`]) is a sans-IO state machine on external time; the shell
//! ([`worker::Worker`]) owns the process, runs the probes and executes the policy's actions;
//! other threads use a [`worker::WorkerHandle`] to admit requests, read the status, report
//! stalls and stop. The `llama-worker` binary runs one worker as a daemon with a status socket
//! ([`serve`] answers on it, [`client`] asks it, [`status::Status`] is what it answers). The
//! server runs in a process group led by a guard that kills the whole group when the worker
//! dies, even by SIGKILL ([`process`]).
#![deny(missing_docs)]

pub mod client;
pub mod clock;
pub mod config;
pub mod cpu;
pub mod metrics;
pub mod models;
pub use socket_file as listen;
pub mod policy;
pub mod probe;
pub mod process;
pub mod rpc;
pub mod rpc_unit;
pub mod serve;
pub mod slots;
pub mod stat;
pub mod status;
pub mod worker;

pub use clock::{Clock, FakeClock, SharedClock, SystemClock};
pub use config::{Config, ConfigError};
pub use policy::{FailReason, Refusal, RestartCause, StallVerdict, State};
pub use status::Status;
pub use worker::{Work, Worker, WorkerHandle};
