//! `loopd serve`: the agent daemon. One [`Runner`](crate::runner::Runner) (one slot table)
//! for every client, reached over a Unix socket ([docs/loopd.md](../../../docs/loopd.md)).
//!
//! - [`protocol`]: the command lines and replies, parsed and written without IO.
//! - [`ResultStore`]: finished results kept until fetched, within `runner.result_ttl_s` and
//!   `runner.max_results`; sans-IO, time as input.
//! - [`Db`] (`db.rs`): the durable store, one SQLite table of requests and results, written
//!   before a submit is acknowledged; time as input. Not wired in yet (issue 30): it is to
//!   replace [`ResultStore`] and the runner's result table.
//! - [`Metrics`]: the counters in the Prometheus text format.
//! - [`Daemon`] (`serve.rs`): the thin IO loop around them.
//! - [`client`]: how `loopd submit|result|cancel|status` and `loopd run` talk to it.

pub mod client;
mod db;
mod metrics;
pub mod protocol;
mod serve;
mod store;

pub use db::{
    store_path, Db, DbError, DbSettings, Durability, Interrupted, NoStorePath, OpenError,
    OpenErrorKind, APPLICATION_ID, FILE_NAME, RESTARTED, SCHEMA_VERSION,
};
pub use metrics::Metrics;
pub use serve::{
    write_atomically, Daemon, Settings, EVENT_QUEUE, MAX_CONNECTIONS, READ_DEADLINE, TICK,
    WRITE_DEADLINE,
};
pub use store::{EvictReason, Evicted, Lookup, ResultStore};
