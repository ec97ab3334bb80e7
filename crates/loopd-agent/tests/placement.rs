//! Placement on the fake clock (time is a `Duration` passed in): seats kept for a request's
//! life, affinity and its TTL to the millisecond, the session map's capacity at the limit and
//! one past, the refusal codes when no host can take work, rehoming, and round robin.

use std::time::Duration;

use loopd_agent::fleet::{
    Fleet, HostConfig, HostId, HostSlot, HostState, Placed, PlacedBy, Placement, PlacementConfig,
    PlacementPolicy, SessionKey, SESSION_CAPACITY, SESSION_TTL,
};
use loopd_agent::runner::{RequestId, SubmitError, WorkerState};

const A: HostId = HostId(0);
const B: HostId = HostId(1);
const C: HostId = HostId(2);
const READY: HostState = HostState::Worker(WorkerState::Ready);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fleet(slots: &[&[u32]]) -> Fleet {
    let hosts = slots
        .iter()
        .enumerate()
        .map(|(i, s)| HostConfig {
            name: format!("h{i}"),
            infer_socket: format!("/run/loopd-tunnel/h{i}/infer.sock").into(),
            worker_socket: format!("/run/loopd-tunnel/h{i}/status.sock").into(),
            slots: s.to_vec(),
            kv_dir: None,
        })
        .collect();
    Fleet::new(hosts, 8).unwrap()
}

/// Every host ready.
fn placement(slots: &[&[u32]], cfg: PlacementConfig) -> Placement {
    let mut p = Placement::new(&fleet(slots), cfg);
    for i in 0..slots.len() {
        p.handle_host_state(ms(0), HostId(i), READY);
    }
    p
}

fn at(host: HostId, slot: u32) -> HostSlot {
    HostSlot { host, slot }
}

fn placed(host: HostId, slot: u32, by: PlacedBy) -> Result<Placed, SubmitError> {
    Ok(Placed {
        at: at(host, slot),
        by,
    })
}

fn key(s: &str) -> SessionKey {
    SessionKey::explicit(s).unwrap()
}

fn hex(k: &SessionKey) -> String {
    k.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

const R: fn(u64) -> RequestId = RequestId;

#[test]
fn session_keys_are_the_documented_digests() {
    // sha256(b"loopd-session-v1" b"s" b"abc")
    assert_eq!(
        hex(&key("abc")),
        "0ed9d9b3b8d5d7c9a417e6c0fa6bdf4b182b666f29ee3c2e3a35ed4c01ec04da"
    );
    // sha256(tag b"d" [1] le64(1) b"B" [0] [1] le64(2) b"hi")
    let d = SessionKey::derived("B", None, Some("hi")).unwrap();
    assert_eq!(
        hex(&d),
        "0fa15e55e479705516bb36b3373b228146db5465e9a8196dea73a1f078d2f4da"
    );
    assert_eq!(SessionKey::of(None, "B", None, Some("hi")).unwrap(), d);
    assert_eq!(
        SessionKey::of(Some("abc"), "B", None, Some("hi")).unwrap(),
        key("abc")
    );
    // An absent system message is not an empty one, and fields do not run into each other.
    assert_ne!(SessionKey::derived("B", Some(""), Some("hi")).unwrap(), d);
    assert_ne!(
        SessionKey::derived("ab", Some("c"), None).unwrap(),
        SessionKey::derived("a", Some("bc"), None).unwrap()
    );
}

#[test]
fn policy_names() {
    #[derive(serde::Deserialize)]
    struct Doc {
        placement: PlacementPolicy,
    }
    let rr: Doc = toml::from_str("placement = \"round_robin\"").unwrap();
    assert_eq!(rr.placement, PlacementPolicy::RoundRobin);
    assert_eq!(rr.placement.as_str(), "round_robin");
    let a: Doc = toml::from_str("placement = \"affinity\"").unwrap();
    assert_eq!(a.placement, PlacementPolicy::Affinity);
    assert!(toml::from_str::<Doc>("placement = \"random\"").is_err());
    assert_eq!(PlacementPolicy::default(), PlacementPolicy::Affinity);
}

#[test]
fn a_running_request_keeps_its_seat() {
    let mut p = placement(&[&[0, 1], &[0, 1]], PlacementConfig::default());
    assert_eq!(p.place(ms(0), R(1), None), placed(A, 0, PlacedBy::MostFree));
    assert_eq!(
        p.place(ms(5), R(1), Some(key("k"))),
        placed(A, 0, PlacedBy::Running)
    );
    // Its host going down does not move it: ending it is the health machine's word.
    p.handle_host_state(ms(6), A, HostState::Lost);
    assert_eq!(p.seat(R(1)), Some(at(A, 0)));
    assert_eq!(p.free_slots(A), Some(1));
    assert_eq!(p.release(ms(7), R(1)), Some(at(A, 0)));
    assert_eq!(p.release(ms(7), R(1)), None);
    assert_eq!(p.free_slots(A), Some(2));
}

#[test]
fn most_free_owned_slots_then_config_order() {
    let mut p = placement(&[&[0, 1], &[2, 3]], PlacementConfig::default());
    assert_eq!(p.place(ms(0), R(1), None), placed(A, 0, PlacedBy::MostFree));
    assert_eq!(p.place(ms(0), R(2), None), placed(B, 2, PlacedBy::MostFree));
    assert_eq!(p.place(ms(0), R(3), None), placed(A, 1, PlacedBy::MostFree));
    assert_eq!(p.place(ms(0), R(4), None), placed(B, 3, PlacedBy::MostFree));
    assert_eq!(
        p.place(ms(0), R(5), None),
        Err(SubmitError::NoSlotAvailable)
    );
    assert_eq!(p.release(ms(1), R(3)), Some(at(A, 1)));
    assert_eq!(p.place(ms(2), R(6), None), placed(A, 1, PlacedBy::MostFree));
}

#[test]
fn a_session_goes_back_to_its_last_host() {
    let mut p = placement(&[&[0, 1], &[0, 1]], PlacementConfig::default());
    assert_eq!(
        p.place(ms(0), R(1), Some(key("k"))),
        placed(A, 0, PlacedBy::MostFree)
    );
    p.release(ms(10), R(1));
    // A keyless request takes A (tie, config order), on its least recently used slot 1: now
    // B has more free slots than A.
    assert_eq!(
        p.place(ms(11), R(2), None),
        placed(A, 1, PlacedBy::MostFree)
    );
    assert_eq!(p.session_host(ms(12), &key("k")), Some(A));
    assert_eq!(
        p.place(ms(12), R(3), Some(key("k"))),
        placed(A, 0, PlacedBy::Session)
    );
    // Another session has no history: the most free host.
    assert_eq!(
        p.place(ms(13), R(4), Some(key("j"))),
        placed(B, 0, PlacedBy::MostFree)
    );
}

#[test]
fn a_session_prefers_its_last_slot() {
    let mut p = placement(&[&[0, 1, 2]], PlacementConfig::default());
    assert_eq!(p.place(ms(0), R(1), None), placed(A, 0, PlacedBy::MostFree));
    assert_eq!(
        p.place(ms(0), R(2), Some(key("k"))),
        placed(A, 1, PlacedBy::MostFree)
    );
    p.release(ms(1), R(1));
    p.release(ms(1), R(2));
    assert_eq!(
        p.place(ms(2), R(3), Some(key("k"))),
        placed(A, 1, PlacedBy::Session)
    );
}

#[test]
fn a_full_or_unready_last_host_is_left_and_the_session_follows() {
    let mut p = placement(&[&[0], &[0]], PlacementConfig::default());
    assert_eq!(
        p.place(ms(0), R(1), Some(key("k"))),
        placed(A, 0, PlacedBy::MostFree)
    );
    // A is full: B, and the session now points at B.
    assert_eq!(
        p.place(ms(1), R(2), Some(key("k"))),
        placed(B, 0, PlacedBy::MostFree)
    );
    assert_eq!(p.session_host(ms(1), &key("k")), Some(B));
    p.release(ms(2), R(1));
    p.release(ms(3), R(2));
    // Released last on B: B it is, though A comes first in config order.
    assert_eq!(
        p.place(ms(4), R(3), Some(key("k"))),
        placed(B, 0, PlacedBy::Session)
    );
    p.release(ms(5), R(3));
    p.handle_host_state(ms(6), B, HostState::Worker(WorkerState::Restarting));
    assert_eq!(
        p.place(ms(7), R(4), Some(key("k"))),
        placed(A, 0, PlacedBy::MostFree)
    );
    assert_eq!(p.session_host(ms(7), &key("k")), Some(A));
}

/// A session used last at 1,000 ms (on A); then A holds one request, so B has more free slots.
fn ttl_setup() -> Placement {
    let mut p = placement(&[&[0, 1], &[0, 1]], PlacementConfig::default());
    assert_eq!(
        p.place(ms(0), R(1), Some(key("k"))),
        placed(A, 0, PlacedBy::MostFree)
    );
    assert_eq!(p.release(ms(1_000), R(1)), Some(at(A, 0)));
    assert_eq!(
        p.place(ms(1_000), R(2), None),
        placed(A, 1, PlacedBy::MostFree)
    );
    p
}

#[test]
fn affinity_holds_one_ms_before_the_ttl_and_not_at_it() {
    let expiry = ms(1_000) + SESSION_TTL;
    let mut p = ttl_setup();
    assert_eq!(p.poll_timeout(), Some(expiry));
    assert_eq!(p.session_host(expiry - ms(1), &key("k")), Some(A));
    assert_eq!(p.session_host(expiry, &key("k")), None);
    assert_eq!(
        p.place(expiry - ms(1), R(3), Some(key("k"))),
        placed(A, 0, PlacedBy::Session)
    );

    let mut p = ttl_setup();
    assert_eq!(
        p.place(expiry, R(3), Some(key("k"))),
        placed(B, 0, PlacedBy::MostFree)
    );
    assert_eq!(p.poll_timeout(), Some(expiry + SESSION_TTL));
}

#[test]
fn handle_timeout_forgets_a_session_at_its_expiry() {
    let expiry = ms(1_000) + SESSION_TTL;
    let mut p = ttl_setup();
    p.handle_timeout(expiry - ms(1));
    assert_eq!(p.sessions(), 1);
    p.handle_timeout(expiry);
    assert_eq!(p.sessions(), 0);
    assert_eq!(p.poll_timeout(), None);
    // A `now` from the past counts as no time passing: the session stays gone.
    assert_eq!(p.session_host(ms(1_500), &key("k")), None);
}

/// Places and releases one request with session `s` (a use of the session).
fn use_session(p: &mut Placement, now: Duration, id: u64, s: &str) -> Placed {
    let placed = p.place(now, R(id), Some(key(s))).unwrap();
    p.release(now, R(id));
    placed
}

#[test]
fn session_capacity_at_the_limit_and_one_past() {
    let mut p = placement(&[&[0]], PlacementConfig::default());
    let n = SESSION_CAPACITY as u64;
    for i in 0..n {
        use_session(&mut p, ms(i), i, &format!("s{i}"));
    }
    assert_eq!(p.sessions(), SESSION_CAPACITY);
    assert_eq!(p.session_host(ms(n), &key("s0")), Some(A));
    // s0 used again: s1 is now the least recently used.
    assert_eq!(use_session(&mut p, ms(n), n, "s0").by, PlacedBy::Session);
    use_session(&mut p, ms(n + 1), n + 1, &format!("s{n}"));
    assert_eq!(p.sessions(), SESSION_CAPACITY);
    assert_eq!(p.session_host(ms(n + 2), &key("s1")), None);
    assert_eq!(p.session_host(ms(n + 2), &key("s0")), Some(A));
    assert_eq!(p.session_host(ms(n + 2), &key("s2")), Some(A));
    assert_eq!(p.session_host(ms(n + 2), &key(&format!("s{n}"))), Some(A));
}

#[test]
fn a_small_capacity_and_zero() {
    let cfg = PlacementConfig {
        session_capacity: 2,
        ..PlacementConfig::default()
    };
    let mut p = placement(&[&[0]], cfg);
    use_session(&mut p, ms(0), 1, "a");
    use_session(&mut p, ms(1), 2, "b");
    assert_eq!(p.sessions(), 2);
    use_session(&mut p, ms(2), 3, "c");
    assert_eq!(p.sessions(), 2);
    assert_eq!(p.session_host(ms(3), &key("a")), None);
    assert_eq!(p.session_host(ms(3), &key("b")), Some(A));

    let cfg = PlacementConfig {
        session_capacity: 0,
        ..PlacementConfig::default()
    };
    let mut p = placement(&[&[0]], cfg);
    assert_eq!(use_session(&mut p, ms(0), 1, "a").by, PlacedBy::MostFree);
    assert_eq!(use_session(&mut p, ms(1), 2, "a").by, PlacedBy::MostFree);
    assert_eq!(p.sessions(), 0);
    assert_eq!(p.poll_timeout(), None);
}

#[test]
fn every_host_down_gives_the_most_hopeful_code() {
    use WorkerState::{Failed, Restarting, Starting, Stopped};
    let w = HostState::Worker;
    let cases = [
        (
            [HostState::Unknown, HostState::Unknown],
            SubmitError::WorkerNotReady,
        ),
        ([w(Stopped), HostState::Lost], SubmitError::WorkerNotReady),
        ([w(Failed), w(Restarting)], SubmitError::WorkerNotReady),
        ([w(Starting), w(Failed)], SubmitError::WorkerNotReady),
        ([w(Stopped), w(Failed)], SubmitError::WorkerFailed),
        ([w(Stopped), w(Stopped)], SubmitError::WorkerStopped),
    ];
    for (states, want) in cases {
        let mut p = Placement::new(&fleet(&[&[0], &[0]]), PlacementConfig::default());
        p.handle_host_state(ms(0), A, states[0]);
        p.handle_host_state(ms(0), B, states[1]);
        assert_eq!(
            p.place(ms(1), R(1), Some(key("k"))),
            Err(want),
            "{states:?}"
        );
        // A refusal changes nothing.
        assert_eq!(p.sessions(), 0);
        assert_eq!(p.running().count(), 0);
        assert_eq!(want.as_str(), want.to_string());
    }
}

#[test]
fn a_ready_host_that_is_full_is_no_slot_available() {
    let mut p = Placement::new(&fleet(&[&[0], &[0]]), PlacementConfig::default());
    p.handle_host_state(ms(0), A, HostState::Worker(WorkerState::Failed));
    p.handle_host_state(ms(0), B, READY);
    assert_eq!(p.place(ms(1), R(1), None), placed(B, 0, PlacedBy::MostFree));
    assert_eq!(
        p.place(ms(2), R(2), None),
        Err(SubmitError::NoSlotAvailable)
    );
    assert_eq!(SubmitError::NoSlotAvailable.as_str(), "NO_SLOT_AVAILABLE");
}

#[test]
fn rehome_moves_a_request_to_another_host_or_leaves_it() {
    let mut p = placement(&[&[0, 1], &[0]], PlacementConfig::default());
    assert_eq!(
        p.place(ms(0), R(1), Some(key("k"))),
        placed(A, 0, PlacedBy::MostFree)
    );
    assert_eq!(
        p.rehome(ms(1), R(1)),
        Some(placed(B, 0, PlacedBy::MostFree))
    );
    assert_eq!(p.seat(R(1)), Some(at(B, 0)));
    assert_eq!(p.free_slots(A), Some(2));
    assert_eq!(p.session_host(ms(1), &key("k")), Some(B));
    // Away from B: A is its only other host, and the session's last host (B) is excluded;
    // on A, slot 1 (never used) rather than slot 0 (freed at 1 ms).
    assert_eq!(
        p.rehome(ms(2), R(1)),
        Some(placed(A, 1, PlacedBy::MostFree))
    );
    // B full: nowhere to go, and nothing changed.
    assert_eq!(p.place(ms(3), R(2), None), placed(A, 0, PlacedBy::MostFree));
    assert_eq!(p.place(ms(3), R(3), None), placed(B, 0, PlacedBy::MostFree));
    assert_eq!(
        p.rehome(ms(4), R(1)),
        Some(Err(SubmitError::NoSlotAvailable))
    );
    assert_eq!(p.seat(R(1)), Some(at(A, 1)));
    assert_eq!(p.rehome(ms(5), R(9)), None);

    let mut one = placement(&[&[0, 1]], PlacementConfig::default());
    one.place(ms(0), R(1), None).unwrap();
    assert_eq!(
        one.rehome(ms(1), R(1)),
        Some(Err(SubmitError::NoSlotAvailable))
    );
}

#[test]
fn rehome_away_from_a_lost_host_to_an_unready_one_gives_its_code() {
    let mut p = placement(&[&[0], &[0]], PlacementConfig::default());
    p.place(ms(0), R(1), None).unwrap();
    p.handle_host_state(ms(1), A, HostState::Lost);
    p.handle_host_state(ms(1), B, HostState::Worker(WorkerState::Stopped));
    assert_eq!(p.rehome(ms(2), R(1)), Some(Err(SubmitError::WorkerStopped)));
}

fn rr() -> PlacementConfig {
    PlacementConfig {
        policy: PlacementPolicy::RoundRobin,
        ..PlacementConfig::default()
    }
}

#[test]
fn round_robin_takes_hosts_in_turn_and_ignores_sessions() {
    let mut p = placement(&[&[0, 1], &[0, 1], &[0, 1]], rr());
    let hosts: Vec<HostSlot> = (0..6)
        .map(|i| p.place(ms(i), R(i), Some(key("k"))).unwrap().at)
        .collect();
    assert_eq!(
        hosts,
        [at(A, 0), at(B, 0), at(C, 0), at(A, 1), at(B, 1), at(C, 1)]
    );
    assert_eq!(p.sessions(), 0);
    assert_eq!(
        p.place(ms(7), R(7), None),
        Err(SubmitError::NoSlotAvailable)
    );

    // An unready host is skipped; the turn goes on after the host chosen.
    let mut p = placement(&[&[0, 1], &[0, 1], &[0, 1]], rr());
    p.handle_host_state(ms(0), B, HostState::Lost);
    let hosts: Vec<HostId> = (0..4)
        .map(|i| p.place(ms(i), R(i), None).unwrap().at.host)
        .collect();
    assert_eq!(hosts, [A, C, A, C]);
    assert_eq!(
        p.place(ms(5), R(5), None),
        Err(SubmitError::NoSlotAvailable)
    );
}

/// 8 sessions x 4 submits, one at a time, on 3 hosts: how many follow-ups (24) land on the
/// host their session ran on before.
fn follow_ups_on_the_same_host(cfg: PlacementConfig) -> usize {
    let mut p = placement(&[&[0, 1], &[0, 1], &[0, 1]], cfg);
    let mut last = [None; 8];
    let mut same = 0;
    let mut id = 0;
    for round in 0..4 {
        for (s, prev) in last.iter_mut().enumerate() {
            id += 1;
            let now = ms(round * 100 + s as u64);
            let host = use_session(&mut p, now, id, &format!("s{s}")).at.host;
            if *prev == Some(host) {
                same += 1;
            }
            *prev = Some(host);
        }
    }
    same
}

#[test]
fn affinity_against_round_robin() {
    assert_eq!(follow_ups_on_the_same_host(PlacementConfig::default()), 24);
    // 8 submits a round on 3 hosts: each session moves on by 8 mod 3 = 2 hosts a round.
    assert_eq!(follow_ups_on_the_same_host(rr()), 0);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Place { id: u64, session: Option<u8> },
        Release { id: u64 },
        Rehome { id: u64 },
        State { host: usize, state: HostState },
        Wait { ms: u64 },
    }

    fn state() -> impl Strategy<Value = HostState> {
        use WorkerState::*;
        prop_oneof![
            4 => Just(READY),
            1 => Just(HostState::Unknown),
            1 => Just(HostState::Lost),
            1 => Just(HostState::Worker(Starting)),
            1 => Just(HostState::Worker(Restarting)),
            1 => Just(HostState::Worker(Failed)),
            1 => Just(HostState::Worker(Stopped)),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..12u64, proptest::option::of(0..4u8))
                .prop_map(|(id, session)| Op::Place { id, session }),
            3 => (0..12u64).prop_map(|id| Op::Release { id }),
            1 => (0..12u64).prop_map(|id| Op::Rehome { id }),
            2 => (0..3usize, state()).prop_map(|(host, state)| Op::State { host, state }),
            1 => (0..2_000u64).prop_map(|ms| Op::Wait { ms }),
        ]
    }

    /// The simple reference: whether a request can be placed at all, and the code if not.
    fn expected(
        states: &[HostState],
        free: &[usize],
        exclude: Option<usize>,
    ) -> Option<SubmitError> {
        let others = (0..states.len()).filter(|&i| Some(i) != exclude);
        if others.clone().any(|i| states[i].is_ready() && free[i] > 0) {
            return None;
        }
        if others.clone().any(|i| states[i].is_ready()) {
            return Some(SubmitError::NoSlotAvailable);
        }
        let codes: Vec<SubmitError> = others.filter_map(|i| states[i].refusal()).collect();
        Some(
            [
                SubmitError::WorkerNotReady,
                SubmitError::WorkerFailed,
                SubmitError::WorkerStopped,
            ]
            .into_iter()
            .find(|c| codes.contains(c))
            .unwrap_or(SubmitError::NoSlotAvailable),
        )
    }

    fn check(policy: PlacementPolicy, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let slots: [&[u32]; 3] = [&[0, 1], &[3], &[0, 1, 2]];
        let cfg = PlacementConfig {
            policy,
            session_ttl: ms(1_500),
            session_capacity: 3,
        };
        let mut p = Placement::new(&fleet(&slots), cfg);
        let mut states = [HostState::Unknown; 3];
        let mut now = ms(0);
        for op in ops {
            let free: Vec<usize> = (0..3).map(|i| p.free_slots(HostId(i)).unwrap()).collect();
            let decided = match op {
                Op::Place { id, session } => {
                    let running = p.seat(R(id));
                    let k = session.map(|s| key(&s.to_string()));
                    let got = p.place(now, R(id), k);
                    match running {
                        Some(seat) => {
                            let by = PlacedBy::Running;
                            prop_assert_eq!(got, Ok(Placed { at: seat, by }));
                            None
                        }
                        None => Some((got, None)),
                    }
                }
                Op::Rehome { id } => match p.seat(R(id)) {
                    None => {
                        prop_assert_eq!(p.rehome(now, R(id)), None);
                        None
                    }
                    Some(seat) => {
                        let got = p.rehome(now, R(id)).unwrap();
                        if got.is_err() {
                            prop_assert_eq!(p.seat(R(id)), Some(seat));
                        }
                        Some((got, Some(seat.host.0)))
                    }
                },
                Op::Release { id } => {
                    p.release(now, R(id));
                    None
                }
                Op::State { host, state } => {
                    states[host] = state;
                    p.handle_host_state(now, HostId(host), state);
                    None
                }
                Op::Wait { ms: d } => {
                    now += ms(d);
                    None
                }
            };
            match decided {
                // Never on a host that is not ready; never on the host it was rehomed from.
                Some((Ok(placed), exclude)) => {
                    prop_assert!(states[placed.at.host.0].is_ready());
                    prop_assert_ne!(Some(placed.at.host.0), exclude);
                    prop_assert_eq!(expected(&states, &free, exclude), None);
                }
                Some((Err(e), exclude)) => {
                    prop_assert_eq!(Some(e), expected(&states, &free, exclude))
                }
                None => {}
            }
            // No two running requests hold the same seat, and every seat is an owned slot.
            let mut seats: Vec<HostSlot> = p.running().map(|(_, s)| s).collect();
            for s in &seats {
                prop_assert!(slots[s.host.0].contains(&s.slot));
            }
            let n = seats.len();
            seats.sort();
            seats.dedup();
            prop_assert_eq!(seats.len(), n);
            let owned: usize = slots.iter().map(|s| s.len()).sum();
            let free: usize = (0..3).map(|i| p.free_slots(HostId(i)).unwrap()).sum();
            prop_assert_eq!(free + n, owned);
            prop_assert!(p.sessions() <= 3);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn affinity_never_shares_a_seat_nor_uses_an_unready_host(
            ops in proptest::collection::vec(op(), 1..80)
        ) {
            check(PlacementPolicy::Affinity, ops)?;
        }

        #[test]
        fn round_robin_never_shares_a_seat_nor_uses_an_unready_host(
            ops in proptest::collection::vec(op(), 1..80)
        ) {
            check(PlacementPolicy::RoundRobin, ops)?;
        }
    }
}

/// A new session takes the least recently used free slot, so it overwrites the oldest prompt
/// the server holds, not the one the last new session left on the first slot; a returning
/// session still takes its own slot.
#[test]
fn a_new_session_takes_the_least_recently_used_free_slot() {
    let mut p = placement(&[&[0, 1, 2]], PlacementConfig::default());
    // All unused: ties go in slots order.
    assert_eq!(
        p.place(ms(1), R(1), Some(key("a"))),
        placed(A, 0, PlacedBy::MostFree)
    );
    p.release(ms(2), R(1));
    assert_eq!(
        p.place(ms(3), R(2), Some(key("b"))),
        placed(A, 1, PlacedBy::MostFree)
    );
    p.release(ms(4), R(2));
    assert_eq!(
        p.place(ms(5), R(3), Some(key("c"))),
        placed(A, 2, PlacedBy::MostFree)
    );
    p.release(ms(6), R(3));
    // "b" goes back to its own slot 1 (affinity), though slot 0 was used longest ago.
    assert_eq!(
        p.place(ms(7), R(4), Some(key("b"))),
        placed(A, 1, PlacedBy::Session)
    );
    // Without a key: the least recently used free slot, slot 0 (freed at 2 ms).
    assert_eq!(p.place(ms(8), R(5), None), placed(A, 0, PlacedBy::MostFree));
    // A new session: the one free slot left, 2.
    assert_eq!(
        p.place(ms(9), R(6), Some(key("d"))),
        placed(A, 2, PlacedBy::MostFree)
    );
    // At the same instant, ties again go in slots order.
    let mut q = placement(&[&[4, 5]], PlacementConfig::default());
    assert_eq!(q.place(ms(0), R(1), None), placed(A, 4, PlacedBy::MostFree));
    assert_eq!(q.place(ms(0), R(2), None), placed(A, 5, PlacedBy::MostFree));
    q.release(ms(10), R(2));
    q.release(ms(10), R(1));
    assert_eq!(
        q.place(ms(11), R(3), None),
        placed(A, 4, PlacedBy::MostFree)
    );
}

#[test]
fn a_slot_remembers_the_session_its_kv_holds_until_its_host_leaves_ready() {
    let mut p = placement(&[&[0]], PlacementConfig::default());
    // The slot has held nothing yet.
    p.place(ms(1), R(1), Some(key("a"))).unwrap();
    assert!(!p.resident(R(1)));
    p.release(ms(2), R(1));
    // "a" again, with nothing between: its KV is still there.
    p.place(ms(3), R(2), Some(key("a"))).unwrap();
    assert!(p.resident(R(2)));
    p.release(ms(4), R(2));
    // "b" takes the slot, then "a" comes back to what "b" left.
    p.place(ms(5), R(3), Some(key("b"))).unwrap();
    assert!(!p.resident(R(3)));
    p.release(ms(6), R(3));
    p.place(ms(7), R(4), Some(key("a"))).unwrap();
    assert!(!p.resident(R(4)));
    p.release(ms(8), R(4));
    // A request without a key holds no session, and leaves none behind.
    p.place(ms(9), R(5), None).unwrap();
    assert!(!p.resident(R(5)));
    p.release(ms(10), R(5));
    p.place(ms(11), R(6), Some(key("a"))).unwrap();
    assert!(!p.resident(R(6)));
    p.release(ms(12), R(6));
    // The server restarting empties its slots; ready again, "a" is not resident.
    let restarting = HostState::Worker(WorkerState::Restarting);
    p.handle_host_state(ms(13), A, restarting);
    p.handle_host_state(ms(14), A, READY);
    p.place(ms(15), R(7), Some(key("a"))).unwrap();
    assert!(!p.resident(R(7)));
    // Not running: false.
    assert!(!p.resident(R(99)));
}
