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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn generating_since(last: u64) -> Control {
        let c = Control::default();
        {
            let mut p = lock(&c.progress);
            p.generating = true;
            p.last = ms(last);
        }
        c
    }

    #[test]
    fn a_stall_is_due_at_stall_ms_and_again_each_period_after_its_report() {
        let c = generating_since(1_000);
        let stall = ms(150);
        assert!(!due_for_report(&c, ms(1_149), stall));
        assert!(due_for_report(&c, ms(1_150), stall));
        assert!(
            !due_for_report(&c, ms(1_150), stall),
            "one report per period"
        );
        assert!(!due_for_report(&c, ms(1_299), stall));
        assert!(due_for_report(&c, ms(1_300), stall));
        // Progress starts the count again.
        {
            let mut p = lock(&c.progress);
            p.last = ms(1_310);
            p.reported = None;
        }
        assert!(!due_for_report(&c, ms(1_459), stall));
        assert!(due_for_report(&c, ms(1_460), stall));
        // While tools run nothing streams, and nothing is a stall.
        lock(&c.progress).generating = false;
        assert!(!due_for_report(&c, ms(9_999), stall));
    }

    fn status(state: WorkerState, spawns: u64, cause: Option<&str>) -> WorkerStatus {
        WorkerStatus {
            state,
            spawns,
            last_cause: cause.map(str::to_owned),
            reason: None,
        }
    }

    fn admitted(spawns: Option<u64>) -> Control {
        Control {
            spawns,
            ..Control::default()
        }
    }

    #[test]
    fn a_new_spawn_or_a_state_other_than_ready_fails_the_request_with_its_cause() {
        let c = admitted(Some(3));
        check_restart(&c, &status(WorkerState::Ready, 3, Some("exited")));
        assert_eq!(c.reason(), None, "the same server, still ready");
        assert!(!c.cancel.is_cancelled());
        let cases = [
            (
                status(WorkerState::Ready, 4, Some("stall")),
                FailReason::WorkerRestarted,
            ),
            (
                status(WorkerState::Restarting, 3, Some("unready")),
                FailReason::WorkerRestarted,
            ),
            (
                status(WorkerState::Restarting, 3, Some("exited")),
                FailReason::ServerDied,
            ),
            (
                status(WorkerState::Failed, 5, Some("exited")),
                FailReason::ServerDied,
            ),
            (
                status(WorkerState::Stopped, 3, None),
                FailReason::WorkerStopped,
            ),
        ];
        for (s, want) in cases {
            let c = admitted(Some(3));
            check_restart(&c, &s);
            assert_eq!(c.reason().map(|r| r.0), Some(want), "{s:?}");
            assert!(c.cancel.is_cancelled());
        }
        // Admitted without a worker socket: nothing to compare with.
        let c = admitted(None);
        check_restart(&c, &status(WorkerState::Failed, 9, Some("exited")));
        assert_eq!(c.reason(), None);
    }

    #[test]
    fn the_first_reason_wins() {
        let c = admitted(Some(1));
        c.fail(FailReason::LoopDetected, "loop".into());
        check_restart(&c, &status(WorkerState::Restarting, 2, None));
        assert_eq!(c.reason(), Some((FailReason::LoopDetected, "loop".into())));
    }
}
