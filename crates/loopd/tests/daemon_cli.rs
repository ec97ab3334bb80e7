//! The daemon's clients through the real binary against `loopd serve`'s daemon over the fake
//! server: `submit`, `result`, `cancel`, `status` and `run --daemon` end with the statuses of
//! docs/loopd.md (the daemon's error code picks it), name a socket nothing answers on, and end
//! quietly with 141 on a closed stdout.

mod support;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::daemon::{slow_answer, Running};
use support::ran;
use support::{json_answer, FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";

fn loopd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(args)
        .stdin(Stdio::null())
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A pipe whose reading end is already closed: every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: pipe(2) just opened both and nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

/// Waits until the daemon runs a request, and returns its id.
fn running(d: &Running) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = d.call(json!({"cmd": "status"}));
        if let Some(id) = st["status"]["running"][0].as_u64() {
            return id;
        }
        assert!(Instant::now() < deadline, "never running: {st}");
        thread::sleep(Duration::from_millis(20));
    }
}

const NOT_FOUND: &str =
    "NOT_FOUND: no such request, or its result was already fetched or has expired";

#[test]
fn each_daemon_client_ends_with_the_status_of_the_daemons_answer() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            json_answer("Hello."),
            slow_answer(200, Duration::from_millis(50)),
        ],
    )]);
    let d = Running::on_system_clock(&server, 1);
    let sock = s(&d.socket).to_owned();
    let sock = sock.as_str();

    // 0: submitted, then its result (a completed request).
    let (code, stdout, stderr) = ran(loopd(&["submit", "--socket", sock, "hi"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (Some(0), "req-1\n", "")
    );
    let (code, stdout, stderr) = ran(loopd(&["result", "--socket", sock, "--wait", "20", "1"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(0),
            "Hello.\nreq-1: completed (stop) after 0 tool calls; 3 of 3 tool iterations left\n",
            ""
        )
    );
    // 4: fetched already; never submitted.
    for id in ["1", "req-99"] {
        let (code, stdout, stderr) = ran(loopd(&["result", "--socket", sock, id]));
        assert_eq!(
            (code, stdout.as_str(), stderr),
            (Some(4), "", format!("loopd result: {NOT_FOUND}\n")),
            "{id}"
        );
    }
    let (code, _, stderr) = ran(loopd(&["cancel", "--socket", sock, "99"]));
    assert_eq!(
        (code, stderr),
        (Some(4), format!("loopd cancel: {NOT_FOUND}\n"))
    );

    // 5: still running; 3: the one slot is busy; 2: a tool the daemon does not offer.
    let (code, stdout, _) = ran(loopd(&["submit", "--socket", sock, "slow"]));
    assert_eq!((code, stdout.as_str()), (Some(0), "req-2\n"));
    assert_eq!(running(&d), 2);
    let (code, stdout, stderr) = ran(loopd(&["result", "--socket", sock, "2"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(5),
            "",
            "loopd result: PENDING: the request is still running\n"
        )
    );
    let (code, stdout, stderr) = ran(loopd(&["submit", "--socket", sock, "another"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(3),
            "",
            "loopd submit: NO_SLOT_AVAILABLE: every slot is busy (1 of 1); there is no queue\n"
        )
    );
    let (code, _, stderr) = ran(loopd(&["submit", "--socket", sock, "--tool", "rm", "x"]));
    assert_eq!(
        (code, stderr.as_str()),
        (
            Some(2),
            "loopd submit: UNKNOWN_TOOL: the daemon offers no tool `rm`\n"
        )
    );
    // 0: cancelled; then its result is a failed request: 1.
    let (code, stdout, stderr) = ran(loopd(&["cancel", "--socket", sock, "req-2"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (Some(0), "req-2: cancelling\n", "")
    );
    let (code, stdout, stderr) = ran(loopd(&[
        "result", "--socket", sock, "--wait", "20", "--json", "2",
    ]));
    assert_eq!((code, stderr.as_str()), (Some(1), ""));
    let line: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (&line["result"]["outcome"], &line["result"]["fail_reason"]),
        (&json!("failed"), &json!("cancelled"))
    );
}

#[test]
fn a_socket_nothing_answers_on_is_named_with_status_6() {
    let dir = llama_harness::temp_dir("loopd-cli");
    let absent = dir.join("absent.sock");
    for args in [
        vec!["submit", "hi"],
        vec!["result", "1"],
        vec!["cancel", "1"],
        vec!["status"],
        vec!["status", "--metrics"],
        vec!["submit", "--follow", "hi"],
    ] {
        let mut argv = vec![args[0], "--socket", s(&absent)];
        argv.extend(&args[1..]);
        let (code, stdout, stderr) = ran(loopd(&argv));
        assert_eq!(
            (code, stdout.as_str(), stderr),
            (
                Some(6),
                "",
                format!(
                    "loopd {}: cannot reach the daemon: {}: No such file or directory (os error \
                     2) (is `loopd serve` running?)\n",
                    args[0],
                    absent.display()
                )
            ),
            "{args:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `loopd result --json ID | head -c 300` used to panic ("failed printing to stdout: Broken
/// pipe") after the one-shot result was taken.
#[test]
fn a_closed_stdout_ends_each_daemon_client_quietly_with_141() {
    let server = FakeServer::start(vec![(CHAT, vec![json_answer("Hello.")])]);
    let d = Running::on_system_clock(&server, 1);
    let sock = s(&d.socket).to_owned();
    let sock = sock.as_str();
    for args in [
        vec!["submit", "--socket", sock, "hi"],
        vec!["result", "--socket", sock, "--wait", "20", "--json", "1"],
        vec!["submit", "--socket", sock, "hi"],
        vec!["result", "--socket", sock, "--wait", "20", "2"],
        vec!["submit", "--socket", sock, "--follow", "hi"],
        vec!["status", "--socket", sock],
        vec!["status", "--socket", sock, "--metrics"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(&args)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = if args.contains(&"--follow") {
            "loopd submit: submitted as req-3\n"
        } else {
            ""
        };
        assert_eq!(
            (out.status.code(), stderr.as_ref()),
            (Some(141), said),
            "{args:?}"
        );
    }
    // The results were taken all the same: the daemon keeps none.
    assert_eq!(d.call(json!({"cmd": "status"}))["status"]["kept"], 0);
}

#[test]
fn a_failed_request_followed_ends_with_1() {
    let server = FakeServer::start(vec![(CHAT, vec![Reply::json(500, "{}")])]);
    let d = Running::on_system_clock(&server, 1);
    let (code, stdout, stderr) = ran(loopd(&[
        "submit",
        "--socket",
        s(&d.socket),
        "--follow",
        "hi",
    ]));
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_eq!(stderr, "loopd submit: submitted as req-1\n");
    let last = stdout.lines().last().unwrap();
    assert!(last.starts_with("req-1: failed: "), "{stdout}");
}

/// The generation's summary line without its wall time, which the test cannot fix.
fn untimed(stdout: &str) -> String {
    stdout
        .lines()
        .map(|l| match l.strip_prefix("generation ") {
            Some(_) => l.rsplit_once(", ").map_or(l, |(head, _)| head),
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn run_daemon_takes_the_socket_as_the_other_clients_do() {
    let server = FakeServer::start(vec![(CHAT, vec![json_answer("Hello.")])]);
    let d = Running::on_system_clock(&server, 1);
    let (code, stdout, stderr) = ran(loopd(&["run", "--daemon", "--socket", s(&d.socket), "hi"]));
    assert_eq!(
        (code, untimed(&stdout), stderr.as_str()),
        (
            Some(0),
            "== generation 1: 3 tool iterations left\n[answer]\nHello.\n\
             generation 1: budget left 3, prompt 15 tokens (5 from cache), generated 3, stop\n\
             req-1: completed (stop) after 0 tool calls; 3 of 3 tool iterations left"
                .to_owned(),
            "loopd run: submitted as req-1\n"
        )
    );
    // Followed to its end, the result was fetched: the daemon keeps nothing.
    assert_eq!(d.call(json!({"cmd": "status"}))["status"]["kept"], 0);
    // Without --daemon the socket means nothing: a usage error.
    let (code, _, stderr) = ran(loopd(&["run", "--socket", s(&d.socket), "hi"]));
    assert_eq!(code, Some(2), "{stderr}");
}

/// `loopd follow` re-attaches to a running request and shows it with `submit --follow`'s
/// renderer; a request that has ended is shown as `loopd result` shows it; none: status 4.
#[test]
fn follow_re_attaches_to_a_running_request_and_shows_an_ended_one() {
    // Twenty pieces 100 ms apart: the follower attaches in the middle, after the first ones.
    let server = FakeServer::start(vec![(
        CHAT,
        vec![slow_answer(20, Duration::from_millis(100))],
    )]);
    let d = Running::on_system_clock(&server, 1);
    let sock = s(&d.socket).to_owned();
    let sock = sock.as_str();
    let id = d.call(json!({"cmd": "submit", "messages": [{"role": "user", "content": "hi"}]}))
        ["id"]
        .as_u64()
        .unwrap();
    assert_eq!(running(&d), id);
    thread::sleep(Duration::from_millis(350));
    let (code, stdout, stderr) = ran(loopd(&["follow", "--socket", sock, "req-1"]));
    let whole: String = (0..20).map(|i| format!("w{i} ")).collect();
    let shown = stdout
        .strip_prefix("[answer]\n")
        .and_then(|s| s.split_once('\n'))
        .map_or("", |(content, _)| content);
    assert!(
        !shown.is_empty()
            && shown.len() < whole.len()
            && whole.ends_with(shown)
            && shown.starts_with('w'),
        "not the tail of the answer from a piece on: {stdout}"
    );
    assert_eq!(
        (code, untimed(&stdout), stderr.as_str()),
        (
            Some(0),
            format!(
                "[answer]\n{shown}\n\
                 generation 1: budget left 3, prompt 15 tokens (5 from cache), generated 3, stop\n\
                 req-1: completed (stop) after 0 tool calls; 3 of 3 tool iterations left"
            ),
            ""
        )
    );
    // Followed to its end, it was fetched.
    assert_eq!(d.call(json!({"cmd": "status"}))["status"]["kept"], 0);

    // Ended before the follow: its result, once.
    let id = d.call(json!({"cmd": "submit", "messages": [{"role": "user", "content": "hi"}]}))
        ["id"]
        .as_u64()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.call(json!({"cmd": "status"}))["status"]["kept"] != 1 {
        assert!(Instant::now() < deadline, "req-{id} never ended");
        thread::sleep(Duration::from_millis(20));
    }
    let (code, stdout, stderr) = ran(loopd(&["follow", "--socket", sock, "2"]));
    assert_eq!(
        (code, stdout, stderr.as_str()),
        (
            Some(0),
            format!("{whole}\nreq-2: completed (stop) after 0 tool calls; 3 of 3 tool iterations left\n"),
            ""
        )
    );
    let (code, _, stderr) = ran(loopd(&["follow", "--socket", sock, "2"]));
    assert_eq!(
        (code, stderr),
        (Some(4), format!("loopd follow: {NOT_FOUND}\n"))
    );
}

/// Ctrl-C on `submit --follow` and `run --daemon` leaves the request running and says how to
/// watch it again or stop it.
#[test]
fn ctrl_c_while_following_names_follow_and_cancel() {
    use std::io::{BufRead, BufReader, Read};
    let late = json_answer("Hello.").first_after(Duration::from_secs(30));
    let server = FakeServer::start(vec![(CHAT, vec![late])]);
    let d = Running::on_system_clock(&server, 2);
    let sock = s(&d.socket).to_owned();
    for (n, (verb, args)) in [
        (
            "submit",
            vec!["submit", "--socket", &sock, "--follow", "hi"],
        ),
        ("run", vec!["run", "--daemon", "--socket", &sock, "hi"]),
    ]
    .into_iter()
    .enumerate()
    {
        let id = n + 1;
        let mut child = Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        err.read_line(&mut first).unwrap();
        assert_eq!(first, format!("loopd {verb}: submitted as req-{id}\n"));
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            (status.code(), rest),
            (
                Some(130),
                format!(
                    "loopd {verb}: interrupted; req-{id} goes on in the daemon: `loopd follow \
                     --socket {sock} {id}` shows it again, `loopd cancel --socket {sock} {id}` \
                     stops it\n"
                )
            ),
            "{verb}"
        );
        let st = d.call(json!({"cmd": "status"}));
        assert!(
            st["status"]["running"]
                .as_array()
                .unwrap()
                .contains(&json!(id)),
            "{st}"
        );
    }
}

#[test]
fn submit_and_status_print_the_reply_line_with_json_and_status_reads_by_field() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![slow_answer(200, Duration::from_millis(50))],
    )]);
    let d = Running::on_system_clock(&server, 2);
    let sock = s(&d.socket).to_owned();
    let sock = sock.as_str();
    let (code, stdout, stderr) = ran(loopd(&["status", "--socket", sock]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(0),
            "state: serving\nslots: 0 busy of 2\nrunning: none\nkept results: 0\n\
             connections: 1\ntools: current_time, arithmetic, finish\n",
            ""
        )
    );
    let (code, stdout, stderr) = ran(loopd(&["submit", "--socket", sock, "--json", "hi"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (Some(0), "{\"ok\":true,\"id\":1}\n", "")
    );
    assert_eq!(running(&d), 1);
    let (code, stdout, stderr) = ran(loopd(&["status", "--socket", sock, "--json"]));
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(0),
            "{\"ok\":true,\"status\":{\"state\":\"serving\",\"slots\":2,\"busy\":1,\
             \"running\":[1],\"kept\":0,\"connections\":1,\"tools\":[\"current_time\",\
             \"arithmetic\",\"finish\"]}}\n",
            ""
        )
    );
    let (code, stdout, _) = ran(loopd(&["status", "--socket", sock]));
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "state: serving\nslots: 1 busy of 2\nrunning: req-1\nkept results: 0\n\
             connections: 1\ntools: current_time, arithmetic, finish\n"
        )
    );
}

/// `loopd serve` over `[[host]]` where no host answers: each is named as not used, and the
/// daemon refuses to start (status 1), having bound nothing.
#[test]
fn serve_refuses_to_start_when_no_host_passes_its_check() {
    let dir = llama_harness::temp_dir("loopd-serve-no-host");
    let host = |name: &str| {
        format!(
            "[[host]]\nname = \"{name}\"\ninfer_socket = \"{}\"\nworker_socket = \"{}\"\nslots = [0]\n",
            dir.join(format!("{name}-infer.sock")).display(),
            dir.join(format!("{name}-status.sock")).display()
        )
    };
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nmodel = \"m\"\n[limits]\nload_wait_ms = 300\n[daemon]\nsocket = \"{}\"\nstore = \"{}\"\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = 4096\ntotal_slots = 2\n{}{}",
            dir.join("a-infer.sock").display(),
            dir.join("loopd.sock").display(),
            dir.join("loopd.db").display(),
            "0".repeat(64),
            host("a"),
            host("b"),
        ),
    )
    .unwrap();
    let out = loopd(&["serve", "--config", s(&config)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for name in ["a", "b"] {
        assert!(
            err.contains(&format!(
                "loopd serve: host {name}: not used: the server did not answer GET /props"
            )),
            "{err}"
        );
    }
    assert!(
        err.contains("refusing to start: none of the 2 hosts passed its self-test"),
        "{err}"
    );
    assert!(!dir.join("loopd.sock").exists(), "nothing was bound");
    let _ = std::fs::remove_dir_all(&dir);
}
