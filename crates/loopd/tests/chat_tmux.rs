//! `loopd chat` on a real terminal: tmux runs it against the real `loopd serve` binary (over
//! the fake server), keys are sent with `send-keys` and the screen read with `capture-pane`,
//! each check waiting for what it needs with a deadline and showing the last screen when it
//! fails. A streamed answer, a turn cancelled with Ctrl-C (the session keeps its other turns
//! and the next turn works), a daemon lost under the open chat (said, the prompt kept, the
//! next line served by the daemon started again), and the session resumed by a new
//! `loopd chat --session` after `loopd serve` was killed with SIGKILL and started again on the
//! same store. `make tmux` installs tmux; without it the test fails and says so.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use support::daemon::slow_answer;
use support::serve::{passing_self_test, props, Served};
use support::{json_answer, FakeServer};

const CHAT: &str = "/v1/chat/completions";

/// A tmux server of the test's own (`-L`), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(tag: &str) -> Tmux {
        let found = Command::new("tmux").arg("-V").output();
        assert!(
            found.as_ref().is_ok_and(|o| o.status.success()),
            "tmux is not installed ({found:?}): `make tmux` installs it"
        );
        Tmux {
            socket: format!("loopd-chat-{tag}-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A session `name` running `loopd chat` with `args` in a 120x40 window.
    fn chat(&self, name: &str, args: &[&str]) {
        let mut line = vec![env!("CARGO_BIN_EXE_loopd").to_owned(), "chat".to_owned()];
        line.extend(args.iter().map(|a| a.to_string()));
        let command = line
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" ");
        let out = self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "120",
            "-y",
            "40",
            &command,
        ]);
        assert!(out.status.success(), "tmux new-session: {out:?}");
        // The screen of a finished chat stays readable.
        self.run(&["set-option", "-t", name, "remain-on-exit", "on"]);
    }

    fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend(keys);
        let out = self.run(&args);
        assert!(out.status.success(), "send-keys {keys:?}: {out:?}");
    }

    /// The pane's text, its scrollback included.
    fn screen(&self, name: &str) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", name, "-S", "-200"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits up to 30 s for the screen to satisfy `want`; panics with the last screen.
    fn wait(&self, name: &str, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.screen(name);
            if want(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("no {what} on the screen within 30 s; the screen:\n{s}");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for `text` on the screen.
    fn wait_text(&self, name: &str, text: &str) -> String {
        self.wait(name, &format!("{text:?}"), |s| s.contains(text))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The screen's last line that is not blank.
fn last_line(screen: &str) -> &str {
    screen
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

fn prompt_back(s: &str) -> bool {
    last_line(s) == ">"
}

fn socket_arg(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn a_streamed_answer_a_cancelled_turn_and_a_session_resumed_after_a_kill_9() {
    let tmux = Tmux::new("session");
    let mut chat = passing_self_test();
    chat.push(json_answer("Blue, like the sea."));
    chat.push(slow_answer(400, Duration::from_millis(50)));
    chat.push(json_answer("Green."));
    chat.extend(passing_self_test());
    chat.push(json_answer("Yes, one more."));
    let server = FakeServer::start(vec![("/props", vec![props(), props()]), (CHAT, chat)]);
    let mut first = Served::start(&server, 200, "");
    first.expect_ready(Duration::from_secs(60));
    let socket: PathBuf = first.socket.clone();
    let s = socket_arg(&socket);

    tmux.chat("one", &["--socket", &s, "--session", "story"]);
    tmux.wait_text("one", "session story opened");
    tmux.wait("one", "the prompt", prompt_back);
    // A streamed answer, then the prompt again.
    tmux.keys("one", &["What colour is the sky?", "Enter"]);
    tmux.wait_text("one", "Blue, like the sea.");
    tmux.wait("one", "the prompt after the answer", prompt_back);
    // A long answer cancelled with Ctrl-C once it streams: the turn ends cancelled and the
    // prompt comes back in the same session.
    tmux.keys("one", &["Tell me a long story.", "Enter"]);
    tmux.wait_text("one", "w3 ");
    tmux.keys("one", &["C-c"]);
    let screen = tmux.wait("one", "the cancelled turn and the prompt", |s| {
        s.contains("cancelled") && prompt_back(s)
    });
    assert!(
        !screen.contains("w399"),
        "cancelled before its end:\n{screen}"
    );
    tmux.keys("one", &["And the grass?", "Enter"]);
    tmux.wait_text("one", "Green.");
    tmux.wait("one", "the prompt after the third turn", prompt_back);

    // The daemon killed under the open chat: a line says so and the prompt stays.
    first.signal("KILL");
    let (status, _) = first.exit_within(Duration::from_secs(10));
    assert_eq!(status.code(), None, "killed by SIGKILL");
    tmux.keys("one", &["Anyone there?", "Enter"]);
    tmux.wait("one", "the lost daemon said and the prompt", |s| {
        s.contains("cannot reach the daemon") && prompt_back(s)
    });
    // A new daemon on the same store: the same chat goes on with its next line.
    let mut second = Served::start(&server, 200, "");
    second.expect_ready(Duration::from_secs(60));
    tmux.keys("one", &["/history", "Enter"]);
    tmux.wait_text("one", "model: Green.");
    tmux.wait("one", "the prompt after /history", prompt_back);
    // Ctrl-D leaves.
    tmux.keys("one", &["C-d"]);
    tmux.wait("one", "the chat to end", |_| {
        let out = tmux.run(&["display-message", "-p", "-t", "one", "#{pane_dead}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    });

    // The session resumed by name in a new chat.
    tmux.chat("two", &["--socket", &s, "--session", "story"]);
    tmux.wait_text("two", "session story resumed (2 turns");
    tmux.wait("two", "the prompt", prompt_back);
    tmux.keys("two", &["/history", "Enter"]);
    let history = tmux.wait_text("two", "model: Green.");
    for line in [
        "you: What colour is the sky?",
        "model: Blue, like the sea.",
        "you: And the grass?",
    ] {
        assert!(history.contains(line), "no {line:?} in:\n{history}");
    }
    assert!(
        !history.contains("you: Tell me a long story."),
        "the cancelled turn is not in the log:\n{history}"
    );
    tmux.keys("two", &["One more?", "Enter"]);
    tmux.wait_text("two", "Yes, one more.");
    tmux.wait("two", "the prompt after the resumed turn", prompt_back);
    let h = support::daemon::call_raw(&socket, &json!({"cmd": "history", "session": "story"}));
    assert_eq!(h["session"]["turns"], 3, "{h}");
    tmux.keys("two", &["C-d"]);
    second.signal("TERM");
    let (status, said) = second.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{said}");
}

/// From a pipe, `loopd chat` reads one message a line and writes each answer on a line of
/// stdout, nothing else; a failed turn is a line on stderr and the exit status.
#[test]
fn from_a_pipe_each_line_is_a_turn_and_each_answer_a_line() {
    use std::io::Write;
    let mut chat = passing_self_test();
    chat.push(json_answer("Blue."));
    chat.push(json_answer("Green."));
    chat.push(support::Reply::json(
        500,
        r#"{"error":{"code":500,"message":"boom"}}"#,
    ));
    let server = FakeServer::start(vec![("/props", vec![props()]), (CHAT, chat)]);
    let mut served = Served::start(&server, 200, "");
    served.expect_ready(Duration::from_secs(60));
    let mut child = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["chat", "--socket"])
        .arg(&served.socket)
        .args(["--session", "piped"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"sky?\n\ngrass?\nblood?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Blue.\nGreen.\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("loopd chat: session piped opened; /help for commands\n"),
        "{err}"
    );
    assert!(
        err.contains("loopd chat: req-3: failed: http_error: "),
        "{err}"
    );
    let h = support::daemon::call_raw(
        &served.socket,
        &json!({"cmd": "history", "session": "piped"}),
    );
    assert_eq!(h["session"]["turns"], 2, "{h}");
    let list = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["chat", "--list", "--socket"])
        .arg(&served.socket)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{list:?}");
    assert!(
        listed.starts_with("piped\t2 turns\tupdated 20")
            && listed.ends_with(" bytes\n")
            && listed.lines().count() == 1,
        "{listed:?}"
    );
}
