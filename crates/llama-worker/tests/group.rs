//! The process side: the whole group dies on stop and on restart, stalls and deaths reach
//! registered work, and a crash loop ends in failed with the backoff seen on a fake clock.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    config, dead, live, ready_idle_worker, state, tick_until, wait_members, Endpoint, Mode,
};
use llama_worker::{
    Clock, FailReason, FakeClock, Refusal, RestartCause, StallVerdict, State, SystemClock, Worker,
};

const T: Duration = Duration::from_secs(10);

/// A leader that forks two children, one of which ignores SIGTERM (so SIGKILL is needed).
const FAMILY: &str = "sleep 300 & (trap '' TERM; sleep 301) & wait";

#[test]
fn stop_kills_the_whole_group_even_a_child_ignoring_sigterm() {
    let ep = Endpoint::start(Mode::Ok);
    let mut w = Worker::new(config(FAMILY), ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let pgid = w.pgid().unwrap();
    // guard, sh, sleep 300, sleep 301 (the subshell execs its last command)
    let members = wait_members(pgid, 4);
    assert_eq!(members.len(), 4, "{members:?}");
    assert_eq!(h.status().pgid, Some(pgid));
    assert!(members.contains(&(h.status().pid.unwrap() as i32)));
    h.stop();
    w.tick();
    assert_eq!(state(&w), State::Stopped);
    assert_eq!(live(pgid), Vec::<i32>::new());
    for pid in members {
        assert!(dead(pid), "pid {pid} survived the stop");
    }
    assert_eq!(h.status().pid, None);
    assert_eq!(h.admit().err(), Some(Refusal::Stopped));
}

/// A server that does not wait for its child: the child, ignoring SIGTERM, outlives it for a
/// moment, orphaned, and then exits on its own.
const ORPHAN: &str = "(trap '' TERM; sleep 0.3) & exec sleep 300";

/// An orphaned member is the worker's to reap (it is their subreaper): when stop returns not
/// even a zombie of the group is left, which systemd would otherwise find in the unit's
/// cgroup once the worker exits and kill itself.
#[test]
fn stop_leaves_not_even_a_zombie_of_an_orphaned_member() {
    let ep = Endpoint::start(Mode::Ok);
    let mut w = Worker::new(config(ORPHAN), ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let pgid = w.pgid().unwrap();
    // guard, sleep 300, the subshell's sleep 0.3
    let members = wait_members(pgid, 3);
    assert_eq!(members.len(), 3, "{members:?}");
    h.stop();
    w.tick();
    assert_eq!(state(&w), State::Stopped);
    let left: Vec<_> = llama_worker::cpu::group_members(Path::new("/proc"), pgid)
        .unwrap()
        .into_iter()
        .map(|m| (m.pid, m.state as char))
        .collect();
    assert_eq!(
        left,
        vec![],
        "members of group {pgid} (pid, state) after stop"
    );
}

#[test]
fn reported_stall_restarts_tells_work_why_and_leaves_no_process() {
    let ep = Endpoint::start(Mode::Ok);
    let clock = FakeClock::new();
    let mut cfg = config(FAMILY);
    cfg.restart_backoff_s = 0.0;
    let mut w = Worker::new(cfg, ep.port, clock.clone()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let old = w.pgid().unwrap();
    let old_members = wait_members(old, 4);
    let mut work = h.admit().unwrap();
    let mut other = h.admit().unwrap();
    assert_eq!(h.status().inflight, 2);
    // Progress 0.5 s ago (the spawn): not stalled yet.
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        work.report_stall(),
        StallVerdict::NotStalled {
            since_progress: Duration::from_millis(500)
        }
    );
    // Stream bytes count as progress.
    clock.advance(Duration::from_millis(600));
    work.note_stream_bytes();
    clock.advance(Duration::from_millis(999));
    assert!(matches!(
        work.report_stall(),
        StallVerdict::NotStalled { .. }
    ));
    clock.advance(Duration::from_millis(1));
    assert_eq!(work.report_stall(), StallVerdict::Restarting);
    // Admission answers at once, before the driving thread has even run.
    assert_eq!(h.admit().err(), Some(Refusal::NotReady));
    w.tick();
    assert_eq!(work.failure(), Some(FailReason::WorkerRestarted));
    assert_eq!(other.failure(), Some(FailReason::WorkerRestarted));
    assert_eq!(live(old), Vec::<i32>::new());
    for pid in old_members {
        assert!(dead(pid), "pid {pid} survived the restart");
    }
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let new = w.pgid().unwrap();
    assert_ne!(new, old);
    let s = h.status();
    assert_eq!(
        (s.total_restarts, s.spawns, s.last_cause, s.inflight),
        (1, 2, Some(RestartCause::Stall), 0),
        "failed work leaves the in-flight registry"
    );
    drop((work, other));
    let _again = h.admit().unwrap();
    assert_eq!(h.status().inflight, 1);
    h.stop();
    w.tick();
    assert_eq!(live(new), Vec::<i32>::new());
}

#[test]
fn server_death_is_server_died_and_comes_back() {
    let ep = Endpoint::start(Mode::Ok);
    let clock = FakeClock::new();
    let mut w = Worker::new(config(FAMILY), ep.port, clock.clone()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let old = w.pgid().unwrap();
    let mut work = h.admit().unwrap();
    // Someone SIGKILLs the server only; its children stay in the group.
    kill_one(h.status().pid.unwrap() as i32);
    assert!(tick_until(&mut w, T, |w| state(w) == State::Restarting));
    assert_eq!(work.failure(), Some(FailReason::ServerDied));
    assert_eq!(h.status().last_cause, Some(RestartCause::Exited));
    // The orphans are cleaned up with the group.
    assert_eq!(live(old), Vec::<i32>::new());
    // The backoff holds the spawn until the fake clock passes it.
    w.tick();
    assert_eq!(h.status().spawns, 1);
    clock.advance(Duration::from_secs(2));
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    assert_eq!(h.status().spawns, 2);
    h.stop();
    w.tick();
}

/// Without its guard a server would outlive a SIGKILLed worker: a killed guard is a lost server.
#[test]
fn a_killed_guard_restarts_the_server_and_its_group_goes() {
    let ep = Endpoint::start(Mode::Ok);
    let clock = FakeClock::new();
    let mut w = Worker::new(config(FAMILY), ep.port, clock.clone()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let old = w.pgid().unwrap();
    let members = wait_members(old, 4);
    let mut work = h.admit().unwrap();
    kill_one(old); // the guard leads the group: its pid is the pgid
    assert!(tick_until(&mut w, T, |w| state(w) == State::Restarting));
    assert_eq!(work.failure(), Some(FailReason::ServerDied));
    assert_eq!(h.status().last_cause, Some(RestartCause::Exited));
    assert_eq!(live(old), Vec::<i32>::new());
    for pid in members {
        assert!(dead(pid), "pid {pid} survived");
    }
    clock.advance(Duration::from_secs(2));
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    assert_ne!(w.pgid(), Some(old));
    h.stop();
    w.tick();
}

/// SIGKILL to one pid through the `kill` command (the library only signals groups).
fn kill_one(pid: i32) {
    let ok = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// Ticks without moving the fake clock until the state leaves `from` (real time passes so
/// the child can exit); returns the new state.
fn settle(w: &mut Worker<FakeClock>, from: State) -> State {
    assert!(tick_until(w, T, |w| state(w) != from));
    state(w)
}

#[test]
fn crash_loop_ends_failed_after_max_restarts_with_backoff_on_the_fake_clock() {
    // A crashing server never answers readiness.
    let ep = Endpoint::start(Mode::Unavailable);
    let clock = FakeClock::new();
    let mut w = Worker::new(config("exit 7"), ep.port, clock.clone()).unwrap();
    let h = w.handle();
    h.start();
    let mut spawn_times = vec![clock.now()];
    let mut st = settle(&mut w, State::Starting);
    while st == State::Restarting {
        assert_eq!(h.admit().err(), Some(Refusal::NotReady));
        let spawns = h.status().spawns;
        // Real time passes, fake time does not: no spawn during the backoff.
        std::thread::sleep(Duration::from_millis(100));
        clock.advance(Duration::from_millis(1999));
        w.tick();
        assert_eq!(h.status().spawns, spawns, "spawned inside the backoff");
        clock.advance(Duration::from_millis(1));
        w.tick();
        assert_eq!(h.status().spawns, spawns + 1);
        spawn_times.push(clock.now());
        // Wait for this spawn's exit to be seen.
        assert!(tick_until(&mut w, T, |w| w.pgid().is_none()));
        st = state(&w);
    }
    assert_eq!(st, State::Failed);
    let secs: Vec<u64> = spawn_times.iter().map(|d| d.as_secs()).collect();
    assert_eq!(secs, [0, 2, 4, 6]);
    assert_eq!(h.admit().err(), Some(Refusal::Failed));
    let s = h.status();
    assert_eq!(
        (s.consecutive_restarts, s.last_cause),
        (3, Some(RestartCause::Exited))
    );
    // Failed stays failed as time passes...
    clock.advance(Duration::from_secs(3600));
    w.tick();
    assert_eq!(state(&w), State::Failed);
    assert_eq!(h.status().spawns, 4);
    // ...until started again.
    h.start();
    w.tick();
    assert_eq!(h.status().spawns, 5);
    assert_eq!(h.status().consecutive_restarts, 0);
}

#[test]
fn readiness_that_keeps_failing_ends_failed_and_leaves_no_process() {
    let ep = Endpoint::start(Mode::Unavailable);
    let clock = FakeClock::new();
    let mut cfg = config("sleep 300 & wait");
    // The test reads the one probe of each spawn: give a loaded machine time to answer it.
    cfg.probe_timeout_s = 5.0;
    let mut w = Worker::new(cfg, ep.port, clock.clone()).unwrap();
    let h = w.handle();
    h.start();
    let mut groups = Vec::new();
    for round in 0..4 {
        assert!(
            tick_until(&mut w, T, |w| w.pgid().is_some()),
            "round {round}"
        );
        let pgid = w.pgid().unwrap();
        wait_members(pgid, 2);
        groups.push(pgid);
        w.tick();
        let r = h.status().last_readiness.unwrap();
        assert_eq!(
            r.outcome,
            llama_worker::probe::ProbeOutcome::Status(503),
            "{r:?}"
        );
        assert_eq!(r.path, "/health");
        // The startup deadline (5 s) passes: killed, then the backoff (2 s).
        clock.advance(Duration::from_secs(5));
        w.tick();
        assert_eq!(live(pgid), Vec::<i32>::new());
        assert_eq!(w.pgid(), None);
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(state(&w), State::Failed);
    assert_eq!(h.status().last_cause, Some(RestartCause::StartupTimeout));
    assert_eq!(groups.len(), 4);
}

/// While ready the endpoint stops answering in time. `script` is the child; `expect_restart`
/// says whether the worker must restart within the watch.
fn unready_case(script: &str, mode: Mode, expect_restart: bool) {
    let ep = Endpoint::start(Mode::Ok);
    let mut w = Worker::new(config(script), ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    ep.set(mode);
    // unready_restart_s is 1.5 s: watch for 4 s.
    let restarted = tick_until(&mut w, Duration::from_secs(4), |w| state(w) != State::Ready);
    let s = h.status();
    assert_eq!(restarted, expect_restart, "{}", s.to_json());
    if expect_restart {
        assert_eq!(s.last_cause, Some(RestartCause::Unready));
    } else {
        assert_eq!(s.total_restarts, 0);
        assert!(!s
            .last_readiness
            .unwrap()
            .outcome
            .eq(&llama_worker::probe::ProbeOutcome::Status(200)));
    }
    let pgid = w.pgid();
    h.stop();
    w.tick();
    if let Some(p) = pgid {
        assert_eq!(live(p), Vec::<i32>::new());
    }
}

#[test]
fn silent_readiness_with_flat_cpu_restarts() {
    unready_case("sleep 300", Mode::Silent, true);
}

#[test]
fn slow_readiness_with_flat_cpu_restarts() {
    unready_case("sleep 300", Mode::Slow, true);
}

#[test]
fn silent_readiness_while_cpu_rises_does_not_restart() {
    unready_case("while :; do :; done", Mode::Silent, false);
}

/// A cgroup-v1 freezer group: its tasks sleep uninterruptibly (state D) while frozen, and a
/// SIGKILL stays pending until they are thawed. Thawed and removed on drop.
struct Freezer {
    dir: PathBuf,
}

impl Freezer {
    fn new() -> Self {
        let root = Path::new("/sys/fs/cgroup/freezer");
        assert!(
            root.join("cgroup.procs").exists(),
            "this test needs the cgroup-v1 freezer at {} (and root)",
            root.display()
        );
        let dir = root.join(format!("llama-worker-test-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        Self { dir }
    }

    fn set(&self, state: &str) {
        std::fs::write(self.dir.join("freezer.state"), state).unwrap();
    }

    /// Moves `pid` in and freezes it; waits until it is in uninterruptible sleep.
    fn freeze(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        self.set("FROZEN");
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let st = std::fs::read(format!("/proc/{pid}/stat")).unwrap();
            let st = llama_worker::stat::parse_stat(&st).unwrap();
            if st.state == b'D' {
                return;
            }
            assert!(Instant::now() < end, "pid {pid} is {}", st.state as char);
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn thaw(&self) {
        self.set("THAWED");
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        let end = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < end {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `wait` after SIGKILL is bounded. A server in uninterruptible sleep cannot die until
/// its sleep ends; stop still returns within stop_grace_s + 1 s, and the worker reaps the server
/// on a later tick once it can die. Needs root and the cgroup-v1 freezer (the project's test
/// machines have both).
#[test]
fn a_server_in_uninterruptible_sleep_does_not_hang_stop() {
    let freezer = Freezer::new();
    let ep = Endpoint::start(Mode::Ok);
    let mut cfg = config("exec sleep 300");
    cfg.stop_grace_s = 0.5;
    let mut w = Worker::new(cfg, ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    assert!(tick_until(&mut w, T, |w| state(w) == State::Ready));
    let pid = h.status().pid.unwrap();
    let pgid = w.pgid().unwrap();
    freezer.freeze(pid);
    let (tx, rx) = mpsc::channel();
    let driver = thread::spawn(move || {
        let t0 = Instant::now();
        h.stop();
        w.tick();
        let _ = tx.send(t0.elapsed());
        w
    });
    let Ok(took) = rx.recv_timeout(Duration::from_secs(10)) else {
        freezer.thaw();
        panic!("stop did not return within 10 s with a server in uninterruptible sleep");
    };
    let mut w = driver.join().unwrap();
    // Bounded (the kill waits 0.8 s for a child that cannot die), with room for a loaded machine.
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    assert_eq!(state(&w), State::Stopped);
    assert_eq!(w.lingering_pids(), [pid]);
    assert!(!dead(pid as i32), "frozen, SIGKILL pending");
    freezer.thaw();
    assert!(tick_until(&mut w, T, |w| w.lingering_pids().is_empty()));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "reaped, not a zombie"
    );
    assert_eq!(live(pgid), Vec::<i32>::new());
}

/// Two clients: each registration belongs to the watch connection named with it. Closing one
/// watch forgets that client's generations (it is gone) and keeps the other client's; a slot
/// the other holds is refused meanwhile.
#[test]
fn a_closed_watch_takes_its_registrations_and_leaves_the_others() {
    let ep = Endpoint::start(Mode::Ok);
    let (mut w, _clock) = ready_idle_worker(&ep);
    let h = w.handle();
    let (one, first) = h.watch().unwrap();
    let (two, _second) = h.watch().unwrap();
    assert_ne!(one, two);
    assert!(matches!(
        first.try_recv(),
        Ok(llama_worker::worker::Push::Event(worker_proto::WatchEvent::Hello { watch }))
            if watch == one
    ));
    let a = h.register_owned(0, Some(one)).unwrap();
    let b = h.register_owned(1, Some(two)).unwrap();
    assert_eq!(h.register_owned(0, Some(two)), Err(Refusal::SlotTaken));
    assert_eq!(h.status().inflight, 2);
    h.unwatch(two);
    assert_eq!(h.status().inflight, 1);
    assert!(!h.done(b), "watch {two}'s generation went with it");
    assert_eq!(h.register_owned(1, Some(one)).map(|_| ()), Ok(()));
    assert!(h.done(a));
    h.unwatch(one);
    assert_eq!(h.status().inflight, 0);
    h.stop();
    w.tick();
}
