//! llama-worker's socket, as the runner uses it: `status` (is the server ready, and which spawn
//! of it is running), `stall` / `stall <id>` (a request saw no progress), the per-generation
//! `register` / `progress` / `done`, and the `watch` channel that pushes a generation's failure.
//! The protocol and its client are the crate `worker-proto`, which llama-worker answers with;
//! every call has a deadline for connecting, writing and reading.

pub use worker_proto::{
    done, progress, register, report_stall, report_stall_of, status, watch, Ack,
    FailReason as WorkerFailReason, ProgressKind, RegisterAnswer, StallAnswer,
    State as WorkerState, WatchEvent, Watcher, WorkerError, WorkerStatus, MAX_ANSWER_BYTES,
};
