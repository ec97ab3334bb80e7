//! The `loopd` command line through the real binary: `check-config` and `probe` (against the
//! fake server), the exit statuses of docs/loopd.md, a stdout closed under a command, shell
//! completions, and a second `loopd serve` on a live socket.

mod support;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use llama_proto::hash::sha256;
use serde_json::json;
use support::daemon::Running;
use support::ran;
use support::{FakeServer, Reply};

const TEMPLATE: &str = "{{ messages }}";

fn loopd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn props_server() -> FakeServer {
    let body = json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2,
                      "chat_template": TEMPLATE});
    FakeServer::start(vec![("/props", vec![Reply::json(200, &body.to_string())])])
}

fn hash() -> String {
    sha256(TEMPLATE.as_bytes()).unwrap().to_string()
}

/// A serve config next to the fake server's socket, with `expect` as its [expect] section.
fn config(server: &FakeServer, expect: &str) -> PathBuf {
    let dir = server.socket().parent().unwrap();
    let path = dir.join("loopd.toml");
    std::fs::write(
        &path,
        format!(
            "socket = {:?}\nmodel = \"smollm2\"\n[daemon]\nsocket = {:?}\n{expect}",
            server.socket().display().to_string(),
            dir.join("loopd.sock").display().to_string()
        ),
    )
    .unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn probe_prints_the_expect_section_the_server_matches() {
    let server = props_server();
    let (code, stdout, stderr) = ran(loopd(&["probe", "--socket", s(server.socket())]));
    let section = format!(
        "[expect]\nchat_template_sha256 = \"{}\"\nn_ctx = 4096\ntotal_slots = 2\n",
        hash()
    );
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (Some(0), section.as_str(), "")
    );
    // A single server ignores the model; a router is asked for the one named.
    assert_eq!(server.requests_to("/props")[0].target, "/props?model=");
    let (code, _, _) = ran(loopd(&[
        "probe",
        "--socket",
        s(server.socket()),
        "--model",
        "a b",
    ]));
    assert_eq!(code, Some(0));
    assert_eq!(server.requests_to("/props")[1].target, "/props?model=a%20b");

    // What it printed, pasted into the config, is what check-config --probe agrees with.
    let path = config(&server, &section);
    let (code, stdout, stderr) = ran(loopd(&["check-config", "--config", s(&path), "--probe"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.ends_with(&section), "{stdout}");
    let other = section.replace("n_ctx = 4096", "n_ctx = 8192");
    let path = config(&server, &other);
    let (code, _, stderr) = ran(loopd(&["check-config", "--config", s(&path), "--probe"]));
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "loopd check-config: the server on {} differs from [expect]: it serves template \
             sha256 {h}, n_ctx 4096, 2 slots; the config expects template sha256 {h}, n_ctx \
             8192, 2 slots\n",
            server.socket().display(),
            h = hash()
        )
    );
}

#[test]
fn check_config_prints_one_line_or_names_the_key_with_status_2() {
    let server = props_server();
    let dir = server.socket().parent().unwrap().to_owned();
    let expect = format!(
        "[expect]\nchat_template_sha256 = \"{}\"\nn_ctx = 4096\ntotal_slots = 2\n",
        hash()
    );
    let path = config(&server, &expect);
    let (code, stdout, stderr) = ran(loopd(&["check-config", "--config", s(&path)]));
    assert_eq!(
        (code, stdout, stderr),
        (
            Some(0),
            format!(
                "{}: ok: model smollm2 on {}, serving on {}, template sha256 {}, n_ctx 4096, 2 \
                 slots, no llama-worker\n",
                path.display(),
                server.socket().display(),
                dir.join("loopd.sock").display(),
                hash()
            ),
            String::new()
        )
    );
    // It never asked the server.
    assert_eq!(server.requests(), []);

    let placeholder = expect.replace(&hash(), "020aba33\u{2026}");
    let path = config(&server, &placeholder);
    let (code, stdout, stderr) = ran(loopd(&["check-config", "--config", s(&path)]));
    assert_eq!((code, stdout.as_str()), (Some(2), ""));
    assert_eq!(
        stderr,
        format!(
            "loopd check-config: bad config: {}:6: key `expect.chat_template_sha256`: \
             `020aba33\u{2026}` is not a SHA-256 (64 hex digits): set the hash of the template \
             the server serves (`loopd probe --socket S` prints it)\n",
            path.display()
        )
    );

    // What loopd serve needs beyond every command: [expect], [daemon] socket.
    let path = config(&server, "");
    let (code, _, stderr) = ran(loopd(&["check-config", "--config", s(&path)]));
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        format!(
            "loopd check-config: bad config: {}: key `expect`: missing: loopd serve's self-test \
             compares the server with it (`loopd probe` prints it)\n",
            path.display()
        )
    );
    let text = std::fs::read_to_string(config(&server, &expect)).unwrap();
    let no_daemon = text.replace("[daemon]\nsocket", "[daemon]\nmetrics_file");
    std::fs::write(&path, no_daemon).unwrap();
    let (code, _, stderr) = ran(loopd(&["check-config", "--config", s(&path)]));
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        format!(
            "loopd check-config: bad config: {}: key `daemon.socket`: missing: loopd serve \
             listens on it\n",
            path.display()
        )
    );
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

#[test]
fn a_closed_stdout_ends_quietly_with_status_141() {
    let server = props_server();
    let expect = format!(
        "[expect]\nchat_template_sha256 = \"{}\"\nn_ctx = 4096\ntotal_slots = 2\n",
        hash()
    );
    let path = config(&server, &expect);
    for args in [
        vec!["check-config", "--config", s(&path)],
        vec!["check-config", "--config", s(&path), "--probe"],
        vec!["probe", "--socket", s(server.socket())],
        vec!["completions", "bash"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(&args)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            (out.status.code(), stderr.as_ref()),
            (Some(141), ""),
            "{args:?}"
        );
    }
}

#[test]
fn each_exit_status_of_the_table() {
    // 0 and 2: help; a command line clap refuses.
    assert_eq!(ran(loopd(&["--help"])).0, Some(0));
    let (code, _, stderr) = ran(loopd(&["result", "--socket", "s"]));
    assert_eq!(code, Some(2), "{stderr}");
    // 6: nothing on the socket, named.
    let dir = llama_harness::temp_dir("loopd-cli");
    let absent = dir.join("absent.sock");
    let (code, stdout, stderr) = ran(loopd(&["probe", "--socket", s(&absent)]));
    assert_eq!(
        (code, stdout.as_str(), stderr),
        (
            Some(6),
            "",
            format!(
                "loopd probe: cannot reach the inference socket {}: No such file or directory \
                 (os error 2)\n",
                absent.display()
            )
        )
    );
    // 1: the server answers with an error.
    let server = FakeServer::start(vec![("/props", vec![Reply::json(500, "{}")])]);
    let (code, _, stderr) = ran(loopd(&["probe", "--socket", s(server.socket())]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "loopd probe: GET /props on {}: ",
            server.socket().display()
        )),
        "{stderr}"
    );
    assert!(stderr.ends_with(" (a router needs --model)\n"), "{stderr}");
    // A daemon client names the path too (each of them: daemon_cli.rs).
    let (code, _, stderr) = ran(loopd(&["status", "--socket", s(&absent)]));
    assert_eq!(
        (code, stderr),
        (
            Some(6),
            format!(
                "loopd status: cannot reach the daemon: {}: No such file or directory (os error \
                 2) (is `loopd serve` running?)\n",
                absent.display()
            )
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // 3, 4, 5 from the daemon's clients: daemon_cli.rs; 3 from `loopd run`: daemon.rs.
}

#[test]
fn completions_name_every_command_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, stdout, stderr) = ran(loopd(&["completions", shell]));
        assert_eq!((code, stderr.as_str()), (Some(0), ""), "{shell}");
        for cmd in [
            "selftest",
            "ask",
            "run",
            "serve",
            "submit",
            "result",
            "cancel",
            "follow",
            "status",
            "check-config",
            "probe",
            "completions",
        ] {
            assert!(stdout.contains(cmd), "{shell}: {cmd} missing");
        }
    }
}

#[test]
fn a_second_serve_on_a_live_socket_refuses_before_its_self_test() {
    let server = FakeServer::start(vec![]);
    let live = Running::on_system_clock(&server, 1);
    let expect = format!(
        "[expect]\nchat_template_sha256 = \"{}\"\nn_ctx = 4096\ntotal_slots = 2\n",
        hash()
    );
    let path = config(&server, &expect);
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["serve", "--config", s(&path)])
        .env("STATE_DIRECTORY", path.parent().unwrap())
        .output()
        .unwrap();
    let took = started.elapsed();
    let (code, _, stderr) = ran(out);
    assert_eq!(
        (code, stderr),
        (
            Some(1),
            format!(
                "loopd serve: refusing to start: a loopd serve is already serving on {s} \
                 (`loopd status --socket {s}`)\n",
                s = live.socket.display()
            )
        )
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Neither the server nor the store was touched.
    assert_eq!(server.requests(), []);
}
