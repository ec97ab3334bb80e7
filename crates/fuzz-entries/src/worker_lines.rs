//! llama-worker's status-socket lines ([`worker_proto`]) on any UTF-8: every parser of the
//! crate on the whole text, on each of its lines, and on each line trimmed at its end (as the
//! clients read an answer).
//!
//! A value read is written by its own writer (`as_str`, `Request::to_line`, `to_json`; the
//! status line by llama-worker's `Status::to_json`, which the daemon answers) and reads back
//! equal. A JSON line and its canonical form (through `serde_json::Value`) read the same both
//! ways, save a line that gives a key twice (the `Value` keeps the last); no field the parser
//! knows is in the line and missing from what the value writes (read, then silently dropped).
//! An answer refused is `BadAnswer` with the line's first 200 characters; a request refused
//! names the argument, and its `{"error": ...}` line reads back as its message.

use std::fmt::Debug;

use llama_worker::status::Status;
use serde_json::Value;
use worker_proto::{
    error_reply, Ack, Command, FailReason, RegisterAnswer, Request, RequestError, RestartCause,
    StallAnswer, State, WatchEvent, WorkerError, WorkerStatus, MAX_COMMAND_BYTES,
};

use crate::json_text::keys;

/// Below this many milliseconds a `since_progress_s` written by `secs` reads back exact: the
/// division by 1000, the text's reading and the product by 1000 each round by at most half an
/// ulp, three together well under half a millisecond here. Above it, to within 2^-48.
const EXACT_MS: u64 = 1 << 50;

/// The `worker_lines` fuzz target: panics when a check fails.
pub fn worker_lines(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    check_line(&text);
    for line in text.split('\n') {
        check_line(line);
        check_line(line.trim_end());
    }
}

fn check_line(s: &str) {
    check_words(s);
    check_request(s);
    check_json(
        s,
        RegisterAnswer::parse,
        |a| Some(a.to_json()),
        eq,
        &["registered", "refused"],
    );
    check_json(s, Ack::parse, |a| Some(a.to_json()), eq, &["ok"]);
    check_json(
        s,
        WatchEvent::parse,
        |e| Some(e.to_json()),
        eq,
        &["event", "state", "spawns", "id", "reason", "watch"],
    );
    check_json(
        s,
        StallAnswer::parse,
        |a| Some(a.to_json()),
        stall_close,
        &["stall", "since_progress_s"],
    );
    check_json(
        s,
        WorkerStatus::parse,
        status_line,
        eq,
        &["state", "spawns", "last_cause", "reason"],
    );
}

fn eq<T: PartialEq>(a: &T, b: &T) -> bool {
    a == b
}

/// Equal, a `since_progress_ms` past [`EXACT_MS`] to within 2^-48 of itself.
fn stall_close(a: &StallAnswer, b: &StallAnswer) -> bool {
    match (a, b) {
        (
            StallAnswer::NotStalled {
                since_progress_ms: x,
            },
            StallAnswer::NotStalled {
                since_progress_ms: y,
            },
        ) if (*x).max(*y) > EXACT_MS => x.abs_diff(*y) <= x.max(y) >> 48,
        _ => a == b,
    }
}

/// The bare words: `Command`, `State` and `FailReason` by their wire names.
fn check_words(s: &str) {
    match Command::parse(s) {
        Some(c) => {
            assert_eq!(c.as_str(), s.trim());
            assert_eq!(Command::parse(c.as_str()), Some(c));
            assert_eq!(Request::parse(s), Ok(Request::Command(c)), "{s:?}");
        }
        None => assert!(Command::ALL.iter().all(|c| c.as_str() != s.trim())),
    }
    if let Some(x) = State::parse(s) {
        assert_eq!(x.as_str(), s);
    }
    if let Some(x) = FailReason::parse(s) {
        assert_eq!(x.as_str(), s);
    }
}

/// The words a request line may start with, and the most words each takes.
const REQUEST_WORDS: [(&str, usize); 9] = [
    ("status", 1),
    ("start", 1),
    ("stop", 1),
    ("stall", 2),
    ("metrics", 1),
    ("register", 3),
    ("progress", 3),
    ("done", 2),
    ("watch", 1),
];

fn check_request(s: &str) {
    let words: Vec<&str> = s.split_whitespace().collect();
    let most = words
        .first()
        .and_then(|w| REQUEST_WORDS.iter().find(|(name, _)| name == w))
        .map(|&(_, n)| n);
    match Request::parse(s) {
        Ok(r) => {
            let line = r.to_line();
            assert_eq!(Request::parse(&line), Ok(r), "written as {line:?}");
            assert!(line.len() <= MAX_COMMAND_BYTES, "{line:?}");
            let written: Vec<&str> = line.split(' ').collect();
            assert_eq!(written.len(), words.len(), "{s:?} written as {line:?}");
            for (w, x) in words.iter().zip(&written) {
                let same_number = matches!(
                    (w.parse::<u64>(), x.parse::<u64>()),
                    (Ok(a), Ok(b)) if a == b
                );
                assert!(w == x || same_number, "{s:?} written as {line:?}");
            }
            if let Request::Command(c) = r {
                assert_eq!(Command::parse(s), Some(c));
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(!message.is_empty());
            let reply: Value = serde_json::from_str(&error_reply(&message)).unwrap();
            assert_eq!(reply["error"].as_str(), Some(message.as_str()));
            match e {
                RequestError::Unknown => assert!(most.is_none(), "{s:?}"),
                RequestError::Missing(what) | RequestError::BadNumber(what) => {
                    assert!(["slot", "watch", "id", "kind"].contains(&what), "{what}")
                }
                RequestError::BadProgressKind => assert_eq!(words.first(), Some(&"progress")),
                RequestError::Extra => {
                    assert!(words.len() > most.expect("a known word"), "{s:?}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

/// The status line as llama-worker writes it, for a cause it knows (or none).
fn status_line(w: &WorkerStatus) -> Option<String> {
    let last_cause = match &w.last_cause {
        None => None,
        Some(name) => Some(*RestartCause::ALL.iter().find(|c| c.as_str() == name)?),
    };
    let status = Status {
        state: w.state,
        pid: None,
        pgid: None,
        port: 8080,
        consecutive_restarts: 0,
        total_restarts: 0,
        spawns: w.spawns,
        last_cause,
        cpu_ticks: None,
        cpu_progress_age: None,
        last_readiness: None,
        readiness_age: None,
        inflight: 0,
        generations: Vec::new(),
        last_model_exit: None,
        model_exit_age: None,
        log_file: None,
        reason: w.reason.clone(),
        rpc: Vec::new(),
        rpc_lost: None,
    };
    Some(status.to_json())
}

/// One JSON answer parser on `s`: refusals, the round trip through `write` (none when the
/// value has no writer), the canonical form, and the fields it knows (`known`).
fn check_json<T: Debug>(
    s: &str,
    parse: fn(&str) -> Result<T, WorkerError>,
    write: impl Fn(&T) -> Option<String>,
    same: fn(&T, &T) -> bool,
    known: &[&str],
) {
    let got = parse(s);
    match &got {
        Err(WorkerError::BadAnswer(a)) => {
            assert_eq!(a, &s.chars().take(200).collect::<String>());
            let shown = WorkerError::BadAnswer(a.clone()).to_string();
            assert!(shown.ends_with(a.as_str()) && shown.len() > a.len());
        }
        Err(e) => panic!("a parse gave {e:?}"),
        Ok(v) => {
            if let Some(line) = write(v) {
                match parse(&line) {
                    Ok(back) => assert!(same(&back, v), "{v:?} written as {line} reads {back:?}"),
                    Err(e) => panic!("{v:?} written as {line} is refused: {e}"),
                }
                let input: Value = serde_json::from_str(s).expect("an answer read is JSON");
                let output: Value = serde_json::from_str(&line).unwrap();
                for k in known {
                    let given = input.get(k).is_some_and(|x| !x.is_null());
                    let kept = output.get(k).is_some_and(|x| !x.is_null());
                    assert!(
                        !given || kept,
                        "`{k}` of {s} is read past: {v:?} is written {line}"
                    );
                }
            }
        }
    }
    let Ok(value) = serde_json::from_str::<Value>(s) else {
        return;
    };
    let canonical = value.to_string();
    let again = parse(&canonical);
    match (&got, &again) {
        (Ok(a), Ok(b)) => assert!(same(a, b), "{s} reads {a:?}, its canonical form {b:?}"),
        (Ok(a), Err(_)) => panic!("{s} reads {a:?}, its canonical form {canonical} is refused"),
        (Err(_), Ok(b)) if keys(s.as_bytes()).is_some_and(|k| !k.twice) => {
            panic!("{s} is refused, its canonical form {canonical} reads {b:?}")
        }
        _ => {}
    }
}
