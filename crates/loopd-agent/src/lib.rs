//! loopd's agent runner, on its llama-server client (`loopd-client`): agent requests run end
//! to end on a fixed table of slots, with tool iterations on a budget.
//!
//! [`runner`] holds the [`AgentRequest`](runner::AgentRequest) machine (sans-IO: every
//! decision about one request), the tools and the BIOS, the [`Runner`](runner::Runner) that
//! drives machines over its slot table, and the watch on llama-worker's status socket;
//! [`fleet`] is where a request runs when there are several inference hosts (placement, the
//! session map, host health), sans-IO too. The runner is the only part that starts threads
//! (one per request, one per tool call, a watcher per worker socket and the health thread).
//! Nothing here keeps a request past its result being handed out: that is the daemon's.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod fleet;
pub mod runner;
