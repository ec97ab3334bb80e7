//! The watcher thread (only with a worker socket): every `runner.worker_poll_ms` it reads the
//! worker's status and fails the requests a restart cut, and reports the stalls of requests
//! that saw no stream progress for `runner.stall_ms`.

use std::path::Path;
use std::time::Duration;

use crate::llama::Cancel;

use super::worker::{self, StallAnswer, WorkerState, WorkerStatus};
use super::{lock, Control, FailReason, Runner, Shared};

/// Runs until `stop` is cancelled.
pub(super) fn run(shared: &Shared, socket: &Path, stop: &Cancel) {
    let poll = Duration::from_millis(shared.settings.worker_poll_ms);
    let timeout = Duration::from_millis(shared.settings.worker_timeout_ms);
    while !stop.sleep(poll) {
        let running = Runner::running(shared);
        if running.is_empty() {
            continue;
        }
        if let Ok(status) = worker::status(socket, timeout) {
            for c in &running {
                check_restart(c, &status);
            }
        }
        let now = shared.client.clock().now();
        let stall = Duration::from_millis(shared.settings.stall_ms);
        for c in &running {
            if due_for_report(c, now, stall) {
                report(c, socket, timeout, shared.settings.stall_ms);
            }
        }
    }
}

/// Fails `c` if the worker is no longer running the server it was admitted under.
pub(super) fn check_restart(c: &Control, status: &WorkerStatus) {
    let Some(spawns) = c.spawns else { return };
    if status.state == WorkerState::Ready && status.spawns == spawns {
        return;
    }
    let (reason, what) = match status.state {
        WorkerState::Stopped => (FailReason::WorkerStopped, "llama-worker was stopped"),
        _ if status.server_died() => (FailReason::ServerDied, "llama-server died on its own"),
        _ => (
            FailReason::WorkerRestarted,
            "llama-worker restarted llama-server",
        ),
    };
    c.fail(
        reason,
        format!(
            "{what} (worker {}, spawn {} -> {})",
            status.state.as_str(),
            spawns,
            status.spawns
        ),
    );
}

/// Whether `c` has been generating without progress for `stall` since its last progress or
/// its last report; marks the report as sent.
fn due_for_report(c: &Control, now: Duration, stall: Duration) -> bool {
    let mut p = lock(&c.progress);
    let since = p.reported.unwrap_or(p.last).max(p.last);
    if p.generating && now.saturating_sub(since) >= stall {
        p.reported = Some(now);
        true
    } else {
        false
    }
}

/// Reports one stall and acts on the answer.
pub(super) fn report(c: &Control, socket: &Path, timeout: Duration, stall_ms: u64) {
    let Ok(answer) = worker::report_stall(socket, timeout) else {
        return;
    };
    lock(&c.stalls).push(answer);
    if answer == StallAnswer::Restarting {
        c.fail(
            FailReason::WorkerRestarted,
            format!(
                "no stream progress for {stall_ms} ms (runner.stall_ms); llama-worker saw none \
                 either and restarted llama-server"
            ),
        );
    }
}
