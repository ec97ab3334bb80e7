//! Per-host health on the fake clock (time is a `Duration` passed in): `host_lost` at 3 s of
//! watch silence to the millisecond, a pushed failure ending only its own host's request,
//! refused sockets, rehoming once and not twice, and health's states driving placement.

use std::time::Duration;

use loopd_agent::fleet::{
    EndReason, Fleet, Health, HealthEvent, HostConfig, HostId, HostState, Placed, PlacedBy,
    Placement, PlacementConfig, WATCH_SILENCE,
};
use loopd_agent::runner::{RequestId, SubmitError, WorkerState};
use worker_proto::{FailReason, WatchEvent};

const A: HostId = HostId(0);
const B: HostId = HostId(1);
const R: fn(u64) -> RequestId = RequestId;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fleet() -> Fleet {
    let hosts = ["a", "b"]
        .iter()
        .map(|n| HostConfig {
            name: n.to_string(),
            infer_socket: format!("/run/loopd-tunnel/{n}/infer.sock").into(),
            worker_socket: format!("/run/loopd-tunnel/{n}/status.sock").into(),
            slots: vec![0, 1],
            kv_dir: None,
        })
        .collect();
    Fleet::new(hosts, 2).unwrap()
}

fn state(s: WorkerState) -> WatchEvent {
    WatchEvent::State {
        state: s,
        spawns: 1,
    }
}

fn failed(id: u64, reason: FailReason) -> WatchEvent {
    WatchEvent::Failed { id, reason }
}

fn events(h: &mut Health) -> Vec<HealthEvent> {
    std::iter::from_fn(|| h.poll_event()).collect()
}

fn host_state(host: HostId, state: HostState) -> HealthEvent {
    HealthEvent::HostState { host, state }
}

fn end(id: u64, host: HostId, reason: EndReason) -> HealthEvent {
    HealthEvent::End {
        id: R(id),
        host,
        reason,
    }
}

const READY: HostState = HostState::Worker(WorkerState::Ready);

/// Both hosts' watches open at 0 ms and ready; events drained.
fn both_ready() -> Health {
    let mut h = Health::new(&fleet());
    for host in [A, B] {
        h.handle_connected(ms(0), host);
        h.handle_watch_event(ms(0), host, state(WorkerState::Ready));
    }
    assert_eq!(events(&mut h), [host_state(A, READY), host_state(B, READY)]);
    h
}

#[test]
fn the_silence_limit_is_three_seconds() {
    assert_eq!(WATCH_SILENCE, ms(3_000));
}

#[test]
fn a_watch_silent_for_3_s_is_lost_at_3000_ms_not_2999() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_placed(ms(0), R(2), A);
    h.handle_placed(ms(0), R(3), B);
    h.handle_watch_event(ms(1_000), B, WatchEvent::Ping);
    assert_eq!(h.poll_timeout(), Some(ms(3_000)));
    h.handle_timeout(ms(2_999));
    assert_eq!(events(&mut h), []);
    assert_eq!(h.state(A), Some(READY));
    h.handle_timeout(ms(3_000));
    assert_eq!(
        events(&mut h),
        [
            host_state(A, HostState::Lost),
            end(1, A, EndReason::HostLost),
            end(2, A, EndReason::HostLost),
        ]
    );
    assert_eq!(h.host_of(R(3)), Some(B));
    // B was heard at 1,000 ms: lost at 4,000, not 3,999.
    assert_eq!(h.poll_timeout(), Some(ms(4_000)));
    h.handle_timeout(ms(3_999));
    assert_eq!(events(&mut h), []);
    h.handle_timeout(ms(4_000));
    assert_eq!(
        events(&mut h),
        [
            host_state(B, HostState::Lost),
            end(3, B, EndReason::HostLost)
        ]
    );
    assert_eq!(h.poll_timeout(), None);
}

#[test]
fn a_watch_that_never_speaks_is_lost_3_s_after_it_opened() {
    let mut h = Health::new(&fleet());
    assert_eq!(h.poll_timeout(), None);
    h.handle_connected(ms(500), A);
    assert_eq!(h.poll_timeout(), Some(ms(3_500)));
    h.handle_timeout(ms(3_499));
    assert_eq!(events(&mut h), []);
    h.handle_timeout(ms(3_500));
    assert_eq!(events(&mut h), [host_state(A, HostState::Lost)]);
}

#[test]
fn each_line_restarts_the_silence() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_watch_event(ms(2_999), A, WatchEvent::Ping);
    h.handle_watch_event(ms(2_000), B, state(WorkerState::Ready));
    h.handle_watch_event(ms(4_999), B, WatchEvent::Ping);
    assert_eq!(events(&mut h), []);
    assert_eq!(h.poll_timeout(), Some(ms(5_999)));
    h.handle_timeout(ms(5_998));
    assert_eq!(events(&mut h), []);
    h.handle_timeout(ms(5_999));
    assert_eq!(
        events(&mut h),
        [
            host_state(A, HostState::Lost),
            end(1, A, EndReason::HostLost)
        ]
    );
    assert_eq!(h.poll_timeout(), Some(ms(7_999)));
}

#[test]
fn a_line_arriving_at_the_limit_is_too_late() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    // No handle_timeout in between: the ping at 3,000 ms finds A lost, and is ignored.
    h.handle_watch_event(ms(3_000), A, WatchEvent::Ping);
    h.handle_watch_event(ms(3_000), A, state(WorkerState::Ready));
    assert_eq!(
        events(&mut h)[..3],
        [
            host_state(A, HostState::Lost),
            end(1, A, EndReason::HostLost),
            host_state(B, HostState::Lost),
        ]
    );
    assert_eq!(h.state(A), Some(HostState::Lost));
}

#[test]
fn a_push_from_host_b_touches_nothing_on_host_a() {
    let mut h = both_ready();
    // Each worker numbers its own generations: both hold a generation 7.
    h.handle_placed(ms(0), R(1), A);
    h.handle_registered(ms(0), R(1), 7);
    h.handle_placed(ms(0), R(2), B);
    h.handle_registered(ms(0), R(2), 7);
    h.handle_placed(ms(0), R(3), B);
    h.handle_registered(ms(0), R(3), 8);
    h.handle_watch_event(ms(100), B, failed(7, FailReason::WorkerRestarted));
    assert_eq!(
        events(&mut h),
        [end(2, B, EndReason::Worker(FailReason::WorkerRestarted))]
    );
    assert_eq!(h.host_of(R(1)), Some(A));
    assert_eq!(h.host_of(R(2)), None);
    assert_eq!(h.host_of(R(3)), Some(B));
    assert_eq!(h.state(A), Some(READY));
    h.handle_watch_event(ms(200), B, failed(8, FailReason::ServerDied));
    h.handle_watch_event(ms(300), B, state(WorkerState::Restarting));
    assert_eq!(
        events(&mut h),
        [
            end(3, B, EndReason::Worker(FailReason::ServerDied)),
            host_state(B, HostState::Worker(WorkerState::Restarting)),
        ]
    );
    // And B's whole watch lost: still nothing on A.
    h.handle_connection_lost(ms(400), B);
    assert_eq!(events(&mut h), [host_state(B, HostState::Lost)]);
    assert_eq!(h.host_of(R(1)), Some(A));
    assert_eq!(h.state(A), Some(READY));
}

#[test]
fn a_push_for_an_id_nobody_holds_is_dropped() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_registered(ms(0), R(1), 4);
    h.handle_watch_event(ms(1), A, failed(5, FailReason::ServerDied));
    h.handle_generation_done(ms(2), R(1));
    h.handle_watch_event(ms(3), A, failed(4, FailReason::ServerDied));
    assert_eq!(events(&mut h), []);
    assert_eq!(h.host_of(R(1)), Some(A));
    h.handle_ended(ms(4), R(1));
    assert_eq!(h.host_of(R(1)), None);
}

#[test]
fn a_state_line_is_reported_only_when_it_changes() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_watch_event(ms(1), A, state(WorkerState::Ready));
    assert_eq!(events(&mut h), []);
    // Not ready: no new requests, but the worker's own pushes end the running ones.
    h.handle_watch_event(ms(2), A, state(WorkerState::Failed));
    assert_eq!(
        events(&mut h),
        [host_state(A, HostState::Worker(WorkerState::Failed))]
    );
    assert_eq!(h.host_of(R(1)), Some(A));
}

#[test]
fn a_lost_host_is_ready_again_only_on_a_new_watch_saying_ready() {
    let mut h = Health::new(&fleet());
    // Lines before any watch opened are stale.
    h.handle_watch_event(ms(0), A, state(WorkerState::Ready));
    assert_eq!(h.state(A), Some(HostState::Unknown));
    h.handle_connection_lost(ms(1), A);
    assert_eq!(events(&mut h), [host_state(A, HostState::Lost)]);
    // Refused again: no new event.
    h.handle_connection_lost(ms(2), A);
    assert_eq!(events(&mut h), []);
    // Lines of the old connection are ignored.
    h.handle_watch_event(ms(3), A, state(WorkerState::Ready));
    assert_eq!(h.state(A), Some(HostState::Lost));
    h.handle_connected(ms(10), A);
    h.handle_watch_event(ms(11), A, WatchEvent::Ping);
    assert_eq!(h.state(A), Some(HostState::Lost));
    h.handle_watch_event(ms(12), A, state(WorkerState::Starting));
    h.handle_watch_event(ms(13), A, state(WorkerState::Ready));
    assert_eq!(
        events(&mut h),
        [
            host_state(A, HostState::Worker(WorkerState::Starting)),
            host_state(A, READY),
        ]
    );
}

#[test]
fn a_refused_connect_rehomes_once_and_not_twice() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_registered(ms(0), R(1), 3);
    h.handle_placed(ms(0), R(2), A);
    h.handle_connect_refused(ms(50), R(1));
    assert_eq!(
        events(&mut h),
        [
            host_state(A, HostState::Lost),
            end(2, A, EndReason::HostLost),
            HealthEvent::Rehome { id: R(1), from: A },
        ]
    );
    assert_eq!(h.host_of(R(1)), None);
    // Its old registration on A no longer routes to it.
    h.handle_connected(ms(60), A);
    h.handle_watch_event(ms(60), A, failed(3, FailReason::ServerDied));
    assert_eq!(events(&mut h), []);
    h.handle_placed(ms(70), R(1), B);
    h.handle_registered(ms(70), R(1), 3);
    assert_eq!(h.host_of(R(1)), Some(B));
    // The same generation refused again, on B: it ends, and B is lost.
    h.handle_connect_refused(ms(80), R(1));
    assert_eq!(
        events(&mut h),
        [
            host_state(B, HostState::Lost),
            end(1, B, EndReason::HostLost)
        ]
    );
    assert_eq!(h.host_of(R(1)), None);
}

#[test]
fn a_generation_sent_lets_the_next_one_be_rehomed_again() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_connect_refused(ms(1), R(1));
    assert_eq!(
        events(&mut h),
        [
            host_state(A, HostState::Lost),
            HealthEvent::Rehome { id: R(1), from: A },
        ]
    );
    h.handle_placed(ms(2), R(1), B);
    h.handle_sent(ms(3), R(1));
    h.handle_generation_done(ms(400), R(1));
    h.handle_connect_refused(ms(500), R(1));
    assert_eq!(
        events(&mut h),
        [
            host_state(B, HostState::Lost),
            HealthEvent::Rehome { id: R(1), from: B },
        ]
    );
}

#[test]
fn a_rehome_with_nowhere_to_go_ends_as_host_lost() {
    let mut h = both_ready();
    h.handle_placed(ms(0), R(1), A);
    h.handle_connect_refused(ms(1), R(1));
    events(&mut h);
    h.handle_rehome_failed(ms(2), R(1));
    assert_eq!(events(&mut h), [end(1, A, EndReason::HostLost)]);
    // Only a request being rehomed can fail to be.
    h.handle_placed(ms(3), R(2), B);
    h.handle_rehome_failed(ms(4), R(2));
    assert_eq!(events(&mut h), []);
}

#[test]
fn reason_and_state_names() {
    assert_eq!(EndReason::HostLost.as_str(), "host_lost");
    assert_eq!(EndReason::HostLost.to_string(), "host_lost");
    assert_eq!(
        EndReason::Worker(FailReason::WorkerRestarted).as_str(),
        "worker_restarted"
    );
    assert_eq!(HostState::Lost.as_str(), "lost");
    assert_eq!(HostState::Unknown.as_str(), "unknown");
    assert_eq!(READY.as_str(), "ready");
    assert_eq!(HostState::Lost.refusal(), Some(SubmitError::WorkerNotReady));
    assert_eq!(READY.refusal(), None);
}

#[test]
fn unknown_hosts_and_requests_are_ignored() {
    let mut h = both_ready();
    let c = HostId(2);
    h.handle_connected(ms(1), c);
    h.handle_watch_event(ms(1), c, state(WorkerState::Ready));
    h.handle_connection_lost(ms(1), c);
    h.handle_placed(ms(1), R(1), c);
    h.handle_connect_refused(ms(1), R(9));
    h.handle_sent(ms(1), R(9));
    assert_eq!(events(&mut h), []);
    assert_eq!(h.state(c), None);
    assert_eq!(h.host_of(R(1)), None);
}

/// The daemon's wiring, by hand: health's host states go to placement.
fn feed(h: &mut Health, p: &mut Placement, now: Duration) -> Vec<HealthEvent> {
    let evs = events(h);
    for e in &evs {
        if let HealthEvent::HostState { host, state } = *e {
            p.handle_host_state(now, host, state);
        }
    }
    evs
}

#[test]
fn with_b_lost_new_requests_go_to_a_and_with_both_lost_none_go() {
    let fleet = fleet();
    let mut h = Health::new(&fleet);
    let mut p = Placement::new(&fleet, PlacementConfig::default());
    for host in [A, B] {
        h.handle_connected(ms(0), host);
        h.handle_watch_event(ms(0), host, state(WorkerState::Ready));
    }
    feed(&mut h, &mut p, ms(0));
    let on = |at: Result<Placed, SubmitError>| at.map(|p| (p.at.host, p.by));
    assert_eq!(on(p.place(ms(1), R(1), None)), Ok((A, PlacedBy::MostFree)));
    assert_eq!(on(p.place(ms(1), R(2), None)), Ok((B, PlacedBy::MostFree)));
    h.handle_placed(ms(1), R(1), A);
    h.handle_placed(ms(1), R(2), B);
    h.handle_watch_event(ms(2_000), A, WatchEvent::Ping);
    h.handle_timeout(ms(3_000));
    assert_eq!(
        feed(&mut h, &mut p, ms(3_000)),
        [
            host_state(B, HostState::Lost),
            end(2, B, EndReason::HostLost)
        ]
    );
    // B's request still holds its seat until its result is stored.
    assert_eq!(p.free_slots(B), Some(1));
    p.release(ms(3_001), R(2));
    assert_eq!(
        on(p.place(ms(3_002), R(3), None)),
        Ok((A, PlacedBy::MostFree))
    );
    assert_eq!(
        p.place(ms(3_002), R(4), None),
        Err(SubmitError::NoSlotAvailable)
    );
    h.handle_timeout(ms(5_000));
    feed(&mut h, &mut p, ms(5_000));
    p.release(ms(5_001), R(1));
    assert_eq!(
        p.place(ms(5_002), R(5), None),
        Err(SubmitError::WorkerNotReady)
    );
}
