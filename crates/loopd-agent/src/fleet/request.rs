//! What a request is to the fleet: its id, and why it was refused a seat. The runner hands
//! both out ([`crate::runner`] re-exports them); placement and health, below it, use them.

use std::fmt;

use worker_proto::State as WorkerState;

/// A request's id, unique within one runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// Why `submit` refused a request; none of them uses a slot.
///
/// Exhaustive on purpose: the daemon matches every refusal to its wire code, so a new one
/// fails to compile until it is given a code there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// Every slot is busy.
    NoSlotAvailable,
    /// llama-worker is starting or restarting (or its socket did not answer).
    WorkerNotReady,
    /// llama-worker's crash-loop protection tripped.
    WorkerFailed,
    /// llama-worker is stopped.
    WorkerStopped,
    /// No thread could be started for the request.
    NoThread,
}

impl SubmitError {
    /// The refusal a worker in `state` makes (seed 003): none when it is ready.
    pub fn of_worker_state(state: WorkerState) -> Option<SubmitError> {
        match state {
            WorkerState::Ready => None,
            WorkerState::Failed => Some(SubmitError::WorkerFailed),
            WorkerState::Stopped => Some(SubmitError::WorkerStopped),
            WorkerState::Starting | WorkerState::Restarting => Some(SubmitError::WorkerNotReady),
        }
    }

    /// The code: `NO_SLOT_AVAILABLE`, `WORKER_NOT_READY`, `WORKER_FAILED`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            SubmitError::NoSlotAvailable => "NO_SLOT_AVAILABLE",
            SubmitError::WorkerNotReady => "WORKER_NOT_READY",
            SubmitError::WorkerFailed => "WORKER_FAILED",
            SubmitError::WorkerStopped => "WORKER_STOPPED",
            SubmitError::NoThread => "NO_THREAD",
        }
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for SubmitError {}
