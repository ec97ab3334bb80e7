//! The runner over two inference hosts, hermetic: two fake servers, two fake
//! workers. Placement (affinity, the most free host, a refusal when every host is down) and
//! health (a host whose watch ends or goes silent ends only its own requests, `host_lost`,
//! with their partial output; it takes new requests again once a new watch says ready).

mod sections;
// The client's own test support: the fake server and a held slot, written once.
#[path = "../../loopd-client/tests/support/mod.rs"]
mod support;
use llama_harness::fake_worker as worker_fake;

use std::sync::Arc;
use std::time::{Duration, Instant};

use loopd_agent::fleet::{HostState, PlacementConfig, PlacementPolicy};
use loopd_agent::runner::{
    FailReason, HostSpec, Outcome, RequestEvent, RequestId, RequestResult, Runner, StandardBios,
    Submission, SubmitError, ToolRegistry,
};
use loopd_client::config::Retry;
use loopd_client::llama::{ChatMessage, Client};
use sections::Config;
use support::{answer, content, done, finish, End, FakeServer, Reply};
use worker_fake::{FakeWorker, Script};

const CHAT: &str = "/v1/chat/completions";

fn config(server: &FakeServer) -> Config {
    let mut c = Config::new(server.socket(), "smollm2");
    c.limits.poll_ms = 20;
    c.limits.liveness_ms = 20_000;
    c.limits.idle_grace_ms = 2_000;
    c.runner.stall_ms = 20_000;
    c.runner.worker_poll_ms = 50;
    c.runner.worker_timeout_ms = 1_000;
    c.retry = Retry {
        attempts: 1,
        delays_ms: vec![],
        jitter_percent: 0,
        total_ms: 5_000,
    };
    c
}

struct Host {
    server: FakeServer,
    worker: FakeWorker,
}

impl Host {
    fn start(replies: Vec<Reply>) -> Host {
        Host {
            server: FakeServer::start(vec![(CHAT, replies)]),
            worker: FakeWorker::start(Script::default()),
        }
    }

    fn spec(&self, name: &str) -> HostSpec {
        HostSpec {
            name: name.into(),
            infer_socket: self.server.socket().to_owned(),
            worker_socket: Some(self.worker.socket().to_owned()),
            slots: vec![0],
            kv_dir: None,
        }
    }
}

fn runner(a: &Host, b: &Host, policy: PlacementPolicy) -> Runner {
    ready_runner(&a.server, vec![a.spec("a"), b.spec("b")], policy)
}

/// A runner over `hosts` (its config's timers from `server`'s), once every host is ready.
fn ready_runner(server: &FakeServer, hosts: Vec<HostSpec>, policy: PlacementPolicy) -> Runner {
    let config = config(server);
    let client = Arc::new(Client::new(config.client()));
    let placement = PlacementConfig {
        policy,
        ..PlacementConfig::default()
    };
    let r = Runner::with_hosts(
        client,
        config.runner,
        ToolRegistry::new(),
        Arc::new(StandardBios),
        hosts,
        placement,
    )
    .expect("good hosts");
    wait_for(
        || r.hosts().iter().all(|h| h.state.is_ready()),
        &r,
        "every host ready",
    );
    r
}

/// `r` ended `host_lost` on `host` with `content`, the output it had.
fn assert_host_lost(r: &RequestResult, host: &str, content: &str) {
    assert_eq!(r.host.as_deref(), Some(host));
    assert_eq!(
        fail_reason(r),
        Some(&FailReason::HostLost),
        "{:?}",
        r.outcome
    );
    assert_eq!(r.content.as_deref(), Some(content));
}

fn ask(text: &str, session: Option<&str>) -> Submission {
    Submission {
        messages: vec![ChatMessage::User {
            content: text.into(),
        }],
        session: session.map(str::to_owned),
        ..Submission::default()
    }
}

/// Waits up to 10 s for `cond`, saying what the hosts were when it did not hold.
fn wait_for(cond: impl Fn() -> bool, r: &Runner, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within 10 s; hosts: {:?}",
            r.hosts()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait(r: &Runner, id: RequestId) -> RequestResult {
    r.wait_result(id, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("no result for {id} within 15 s: {e}; hosts {:?}", r.hosts()))
}

fn fail_reason(r: &RequestResult) -> Option<&FailReason> {
    match &r.outcome {
        Outcome::Failed { reason, .. } => Some(reason),
        Outcome::Completed { .. } => None,
    }
}

/// A stream that sends `partial` and then nothing until the client goes.
fn partial_then_silence(partial: &str) -> Reply {
    Reply::sse(vec![content(partial, 1)]).ending(End::Silence)
}

#[test]
fn requests_spread_over_the_hosts_and_a_session_goes_back_to_its_host() {
    let a = Host::start(vec![partial_then_silence("a1"), answer()]);
    let b = Host::start(vec![answer(), answer()]);
    let r = runner(&a, &b, PlacementPolicy::Affinity);
    let (tx, rx) = std::sync::mpsc::channel();
    let observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Placed { host, slot, by } = e {
            let _ = tx.send((host.clone(), *slot, *by));
        }
    });
    // The first goes to a (the most free, first in config order) and stays running.
    let first = r
        .submit_observed(ask("one", Some("s1")), Some(observer))
        .unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        ("a".to_owned(), 0, "most_free")
    );
    wait_for(
        || a.server.requests_to(CHAT).len() == 1,
        &r,
        "the first request sent to a",
    );
    // a is full: the second goes to b, and so the session s2 is b's.
    let second = wait(&r, r.submit(ask("two", Some("s2"))).unwrap());
    assert_eq!(second.host.as_deref(), Some("b"));
    assert!(fail_reason(&second).is_none(), "{:?}", second.outcome);
    r.cancel(first).unwrap();
    let first = wait(&r, first);
    assert_eq!(first.host.as_deref(), Some("a"));
    assert_eq!(fail_reason(&first), Some(&FailReason::Cancelled));
    // Both free now: s2 goes back to b although a comes first in config order.
    let third = wait(&r, r.submit(ask("three", Some("s2"))).unwrap());
    assert_eq!(third.host.as_deref(), Some("b"));
    assert_eq!(b.server.requests_to(CHAT).len(), 2);
    assert_eq!(a.server.requests_to(CHAT).len(), 1);
    let hosts = r.hosts();
    assert_eq!(
        hosts
            .iter()
            .map(|h| (h.name.as_str(), h.slots, h.busy))
            .collect::<Vec<_>>(),
        [("a", 1, 0), ("b", 1, 0)]
    );
}

#[test]
fn round_robin_ignores_the_session() {
    let a = Host::start(vec![answer(), answer()]);
    let b = Host::start(vec![answer(), answer()]);
    let r = runner(&a, &b, PlacementPolicy::RoundRobin);
    let hosts: Vec<Option<String>> = (0..4)
        .map(|_| wait(&r, r.submit(ask("same", Some("s"))).unwrap()).host)
        .collect();
    let names: Vec<&str> = hosts.iter().map(|h| h.as_deref().unwrap()).collect();
    assert_eq!(names, ["a", "b", "a", "b"]);
}

#[test]
fn a_closed_watch_ends_only_its_hosts_requests_with_their_output_and_the_host_comes_back() {
    let a = Host::start(vec![Reply::sse(vec![
        content("from a", 1),
        finish(2),
        done(),
    ])
    .first_after(Duration::from_millis(800))]);
    let b = Host::start(vec![partial_then_silence("partial on b"), answer()]);
    let r = runner(&a, &b, PlacementPolicy::Affinity);
    let on_a = r.submit(ask("one", Some("x"))).unwrap();
    let on_b = r.submit(ask("two", Some("y"))).unwrap();
    // b's stream has begun (its one chunk sent) before its watch goes.
    wait_for(
        || b.server.requests_to(CHAT).len() == 1,
        &r,
        "b's request sent",
    );
    std::thread::sleep(Duration::from_millis(200));
    let lost_at = Instant::now();
    b.worker.close_watches();
    let rb = wait(&r, on_b);
    assert!(
        lost_at.elapsed() < Duration::from_millis(1_500),
        "ended {:?} after the watch closed",
        lost_at.elapsed()
    );
    assert_host_lost(&rb, "b", "partial on b");
    // a's request never noticed.
    let ra = wait(&r, on_a);
    assert_eq!(ra.host.as_deref(), Some("a"));
    assert!(fail_reason(&ra).is_none(), "{:?}", ra.outcome);
    assert_eq!(ra.content.as_deref(), Some("from a"));
    // b's watch is opened again, says ready, and b takes work again.
    wait_for(
        || r.hosts()[1].state.is_ready(),
        &r,
        "b ready again on a new watch",
    );
    let again = wait(&r, r.submit(ask("two", Some("y"))).unwrap());
    assert_eq!(again.host.as_deref(), Some("b"));
    assert!(fail_reason(&again).is_none(), "{:?}", again.outcome);
}

#[test]
fn a_silent_watch_is_host_lost_after_three_seconds_and_the_next_submit_lands_on_the_live_host() {
    let a = Host::start(vec![partial_then_silence("a says")]);
    let b = Host::start(vec![answer()]);
    let r = runner(&a, &b, PlacementPolicy::Affinity);
    // Both free: the first goes to a, first in config order.
    let on_a = r.submit(ask("for a", None)).unwrap();
    wait_for(
        || a.server.requests_to(CHAT).len() == 1,
        &r,
        "the request sent to a",
    );
    let muted_at = Instant::now();
    a.worker.mute_watches(true);
    let res = wait(&r, on_a);
    let took = muted_at.elapsed();
    assert_host_lost(&res, "a", "a says");
    // The last line (a ping a second) came up to a second before the mute: lost 2 to 3 s
    // later, plus a poll; the upper bound is generous for a loaded box.
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_millis(6_000),
        "host_lost {took:?} after the mute"
    );
    assert_eq!(r.hosts()[0].state, HostState::Lost);
    // The next submit lands on the live host, refused by nobody.
    let next = wait(&r, r.submit(ask("next", None)).unwrap());
    assert_eq!(next.host.as_deref(), Some("b"));
    assert!(fail_reason(&next).is_none(), "{:?}", next.outcome);
    a.worker.mute_watches(false);
}

#[test]
fn every_host_down_refuses_with_the_most_hopeful_code_and_uses_no_slot() {
    let a = Host::start(vec![answer()]);
    let b = Host::start(vec![answer()]);
    let r = runner(&a, &b, PlacementPolicy::Affinity);
    a.worker.set(|w| w.state = "failed");
    b.worker.set(|w| w.state = "restarting");
    // Admission takes each worker's word from its watch (no status round trip): the state
    // lines are in once the hosts show them.
    let states = |want: [&str; 2]| {
        wait_for(
            || r.hosts().iter().map(|h| h.state.as_str()).eq(want),
            &r,
            &format!("hosts {want:?}"),
        )
    };
    states(["failed", "restarting"]);
    assert_eq!(r.submit(ask("x", None)), Err(SubmitError::WorkerNotReady));
    assert_eq!(r.busy_slots(), 0);
    b.worker.set(|w| w.state = "stopped");
    states(["failed", "stopped"]);
    assert_eq!(r.submit(ask("x", None)), Err(SubmitError::WorkerFailed));
    // One host back: the submit lands there.
    b.worker.set(|w| w.state = "ready");
    states(["failed", "ready"]);
    let res = wait(&r, r.submit(ask("x", None)).unwrap());
    assert_eq!(res.host.as_deref(), Some("b"));
}

/// A socket path whose connects are refused: bound, then its listener closed.
fn refusing_socket(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("refusing.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    path
}

#[test]
fn a_refused_connect_places_the_request_once_more_on_the_other_host() {
    let a = Host::start(vec![]);
    let b = Host::start(vec![answer()]);
    let dir = llama_harness::temp_dir("loopd-fleet-refused");
    let mut spec_a = a.spec("a");
    spec_a.infer_socket = refusing_socket(&dir);
    let r = ready_runner(
        &b.server,
        vec![spec_a, b.spec("b")],
        PlacementPolicy::Affinity,
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Placed { host, slot, by } = e {
            let _ = tx.send((host.clone(), *slot, *by));
        }
    });
    let id = r.submit_observed(ask("x", None), Some(observer)).unwrap();
    let res = wait(&r, id);
    assert!(fail_reason(&res).is_none(), "{:?}", res.outcome);
    assert_eq!(res.host.as_deref(), Some("b"));
    assert_eq!(res.content.as_deref(), Some("Red, blue"));
    assert!(
        res.retries.is_empty(),
        "a rehome is no retry: {:?}",
        res.retries
    );
    let placed: Vec<_> = rx.try_iter().collect();
    assert_eq!(
        placed,
        [
            ("a".to_owned(), 0, "most_free"),
            ("b".to_owned(), 0, "rehomed")
        ]
    );
    assert_eq!(b.server.requests_to(CHAT).len(), 1);
    assert_eq!(r.busy_slots(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refused_on_both_hosts_ends_host_lost_without_a_second_rehome() {
    let a = Host::start(vec![]);
    let b = Host::start(vec![]);
    let dir = llama_harness::temp_dir("loopd-fleet-refused-both");
    let (mut spec_a, mut spec_b) = (a.spec("a"), b.spec("b"));
    spec_a.infer_socket = refusing_socket(&dir);
    spec_b.infer_socket = spec_a.infer_socket.clone();
    let r = ready_runner(&a.server, vec![spec_a, spec_b], PlacementPolicy::Affinity);
    let res = wait(&r, r.submit(ask("x", None)).unwrap());
    assert_eq!(
        fail_reason(&res),
        Some(&FailReason::HostLost),
        "{:?}",
        res.outcome
    );
    assert_eq!(res.host.as_deref(), Some("b"));
    assert_eq!(r.busy_slots(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
