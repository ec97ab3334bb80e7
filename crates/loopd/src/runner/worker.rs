//! llama-worker's status socket, as the runner uses it: `status` (is the server ready, and
//! which spawn of it is running) and `stall` (a request saw no progress). The protocol and its
//! client are the crate `worker-proto`, which llama-worker answers with; every call has a
//! deadline for connecting, writing and reading.

pub use worker_proto::{
    report_stall, status, StallAnswer, State as WorkerState, WorkerError, WorkerStatus,
    MAX_ANSWER_BYTES,
};
