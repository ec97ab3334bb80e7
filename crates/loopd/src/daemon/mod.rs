//! `loopd serve`: the agent daemon. One [`Runner`](loopd_agent::runner::Runner) (one slot table)
//! for every client, reached over a Unix socket ([docs/loopd.md](../../../docs/loopd.md)),
//! laid out as tokio's mini-redis:
//!
//! - [`Daemon`] (`listener.rs`): the accept loop, its tick and the shutdown;
//! - `connection.rs`: one connection: its command line read within a deadline and a cap;
//! - `commands.rs`: each command applied to the store, and its reply;
//! - [`Db`] (`db.rs`): the durable store, one SQLite table of requests and results, written
//!   before a submit is acknowledged; the runner's completion sink writes each result into it
//!   (`state.rs` holds it behind one lock with the followers' channels); a running request's
//!   output is checkpointed into its row (`output.rs`);
//! - `sessions.rs`: the session commands; `session_log.rs`: a session's log rendered as the
//!   conversation a turn is sent, and its compaction (docs/sessions.md);
//! - [`protocol`]: the command lines and replies, parsed and written without IO;
//! - [`Metrics`]: the counters in the Prometheus text format;
//! - [`client`]: how `loopd submit|result|cancel|status` and `loopd run` talk to it.

pub mod client;
mod commands;
mod connection;
mod db;
mod follower;
mod line;
mod listener;
mod metrics;
mod output;
pub mod protocol;
mod session_log;
mod sessions;
mod state;

pub use db::{
    store_path, Db, DbError, DbSettings, Durability, EvictReason, Evicted, Interrupted, Lookup,
    NoStorePath, OpenError, OpenErrorKind, SessionRefusal, SessionRow, TurnAppend, APPLICATION_ID,
    FILE_NAME, RESTARTED, SCHEMA_VERSION,
};
pub use listener::{
    write_atomically, Daemon, Settings, StartError, COMPACT_BUSY_EVERY, COMPACT_EVERY, EVENT_QUEUE,
    MAX_CONNECTIONS, READ_DEADLINE, STOPPED, TICK, WRITE_DEADLINE,
};
pub use metrics::Metrics;
pub use output::CHECKPOINT_EVERY;
