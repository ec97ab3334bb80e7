//! `loopd serve`'s command line ([`loopd::daemon::protocol::parse`]) on any bytes.
//!
//! A command it reads is written back by its own serde type (`Command::to_line`) and reads back
//! as itself, and serde's typed path reads the line as the same command (no second reading of
//! a line: a key given twice is refused, not "last one wins"); a submit applies itself exactly
//! when a plain reference of its rules says it may. A refusal is one of the four kinds a parse
//! can give, its detail names where (a line and column inside the input) or what (the `cmd`
//! found, the field), and its error line reads back as itself. The cap is the documented one:
//! a line of `MAX_LINE_BYTES` bytes without its newline is refused with `LINE_TOO_LONG`, one
//! byte shorter is read as the line without the padding.

use loopd::daemon::protocol::{
    parse, Command, ErrorCode, ErrorReply, ProtoError, SubmitCmd, MAX_LINE_BYTES,
    MAX_SESSION_BYTES, MAX_WAIT_MS,
};
use serde_json::Value;

use crate::json_text::{keys, position_in};

/// Every field name of every command and message, as a "missing field" may name them.
const FIELDS: [&str; 17] = [
    "cmd",
    "id",
    "timeout_ms",
    "messages",
    "system",
    "budget",
    "thinking",
    "max_tokens",
    "tools",
    "follow",
    "session",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "arguments",
];

/// The `daemon_command` fuzz target: panics when a check fails.
pub fn daemon_command(data: &[u8]) {
    let got = parse(data);
    match &got {
        Ok(cmd) => check_command(data, cmd),
        Err(e) => check_refusal(data, e),
    }
    check_cap(data, &got);
}

fn check_command(data: &[u8], cmd: &Command) {
    assert!(data.len() < MAX_LINE_BYTES, "a line at the cap was read");
    let line = cmd.to_line();
    assert_eq!(
        parse(line.as_bytes()).as_ref(),
        Ok(cmd),
        "written as {line}"
    );
    assert!(
        Command::NAMES
            .iter()
            .any(|n| line.starts_with(&format!("{{\"cmd\":\"{n}\""))),
        "{line}"
    );
    match serde_json::from_slice::<Command>(data) {
        Ok(typed) => assert_eq!(&typed, cmd, "serde's typed path reads another command"),
        Err(e) => panic!("parse read {cmd:?}; serde's typed path refuses the line: {e}"),
    }
    match cmd {
        Command::Submit(s) => check_submit(s),
        Command::Wait(w) => assert!(w.timeout_ms() <= MAX_WAIT_MS),
        _ => {}
    }
}

/// The submit rules of docs/loopd.md, written plainly.
fn submit_allowed(s: &SubmitCmd) -> bool {
    let roles_ok = s.messages.iter().all(|m| {
        let role = m.role.as_str();
        ["user", "system", "assistant", "tool"].contains(&role)
            && (m.tool_calls.is_empty() || role == "assistant")
            && m.tool_call_id.is_some() == (role == "tool")
    });
    let session_ok = s
        .session
        .as_ref()
        .is_none_or(|x| (1..=MAX_SESSION_BYTES).contains(&x.len()));
    roles_ok && s.messages.iter().any(|m| m.role == "user") && session_ok
}

fn check_submit(s: &SubmitCmd) {
    match s.to_submission() {
        Ok(sub) => {
            assert!(submit_allowed(s), "applied against the rules: {s:?}");
            assert_eq!(sub.messages.len(), s.messages.len());
            assert_eq!(sub.session, s.session);
            assert_eq!(
                (sub.budget, sub.options.max_tokens, sub.options.thinking),
                (s.budget, s.max_tokens, s.thinking)
            );
        }
        Err(e) => {
            assert!(!submit_allowed(s), "refused within the rules ({e}): {s:?}");
            assert_eq!(e.code(), ErrorCode::BadRequest, "{e}");
            assert!(!e.to_string().is_empty());
        }
    }
}

fn check_refusal(data: &[u8], e: &ProtoError) {
    let detail = e.to_string();
    assert!(!detail.is_empty(), "{e:?}");
    let reply: ErrorReply = serde_json::from_str(&e.to_line())
        .unwrap_or_else(|x| panic!("the error line {} does not read back: {x}", e.to_line()));
    assert_eq!(reply, e.reply());
    assert_eq!(reply.error, e.code());
    let value = serde_json::from_slice::<Value>(data);
    match e {
        ProtoError::LineTooLong => assert!(data.len() >= MAX_LINE_BYTES, "{} bytes", data.len()),
        ProtoError::BadJson(m) => {
            assert!(value.is_err(), "valid JSON refused as BAD_JSON: {m}");
            let (line, column) =
                position_in(m).unwrap_or_else(|| panic!("BAD_JSON names no position: {m}"));
            assert_position_within(data, line, column, m);
        }
        ProtoError::UnknownCommand(found) => {
            let v = value.expect("UNKNOWN_COMMAND of a line that is not JSON");
            let Value::Object(o) = &v else {
                panic!("UNKNOWN_COMMAND of a JSON line that is no object")
            };
            let want = match o.get("cmd") {
                None => "(no `cmd`)".to_string(),
                Some(Value::String(s)) => {
                    assert!(!Command::NAMES.contains(&s.as_str()), "{s} is a command");
                    format!("`{s}`")
                }
                Some(other) => other.to_string(),
            };
            assert_eq!(found, &want, "the detail names the `cmd` found");
        }
        ProtoError::BadRequest(m) => {
            let v = value.expect("BAD_REQUEST of a line that is not JSON");
            if v.is_object() {
                assert!(
                    serde_json::from_slice::<Command>(data).is_err(),
                    "refused ({m}) what serde's typed path reads"
                );
                check_field_named(data, m);
            } else {
                assert_eq!(m, "the line is not a JSON object");
            }
        }
        other => panic!("{other:?} is not a refusal of the parse"),
    }
}

/// A serde message that names a field names one the line has (unknown, twice; a key given
/// twice may be refused at its first value, which a `Value` drops) or one the protocol has
/// (missing). A key may hold a backtick or serde's own words, so the message is matched from
/// its start, where serde puts the name.
fn check_field_named(data: &[u8], message: &str) {
    let given = keys(data).expect("JSON").all;
    let protocol = FIELDS.iter().map(|f| f.to_string()).collect();
    for (kind, names) in [
        ("unknown field", &given),
        ("duplicate field", &given),
        ("missing field", &protocol),
    ] {
        if message.starts_with(&format!("{kind} `")) {
            assert!(
                names.iter().any(|k| {
                    let rest = message.strip_prefix(&format!("{kind} `{k}`"));
                    rest.is_some_and(|r| r.is_empty() || r.starts_with([',', ' ']))
                }),
                "{message}: the field is not {}",
                if kind == "missing field" {
                    "the protocol's"
                } else {
                    "in the line"
                }
            );
        }
    }
}

/// `line` (1-based) is a line of `data` and `column` at most its length.
fn assert_position_within(data: &[u8], line: usize, column: usize, message: &str) {
    let text = data.split(|&b| b == b'\n').nth(line.wrapping_sub(1));
    let Some(text) = text else {
        panic!("{message}: line {line} is past the input's end")
    };
    assert!(
        column <= text.len(),
        "{message}: column {column} is past its line's {} bytes",
        text.len()
    );
}

fn check_cap(data: &[u8], got: &Result<Command, ProtoError>) {
    if data.len() >= MAX_LINE_BYTES {
        assert_eq!(got, &Err(ProtoError::LineTooLong));
        return;
    }
    // One past: MAX_LINE_BYTES without the newline (zeroed memory costs nothing until touched,
    // and the length alone refuses it).
    let mut past = vec![0u8; MAX_LINE_BYTES];
    past[..data.len()].copy_from_slice(data);
    assert_eq!(
        parse(&past),
        Err(ProtoError::LineTooLong),
        "one past the cap"
    );
    // At the cap: JSON white space after the line changes nothing. A megabyte parse per run
    // would slow the fuzzer a hundredfold, so only lines that start with a space take it.
    if data.first() == Some(&b' ') {
        let mut at = data.to_vec();
        at.resize(MAX_LINE_BYTES - 1, b' ');
        let padded = parse(&at);
        match (got, &padded) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "at the cap"),
            (Err(a), Err(b)) => assert_eq!(a.code(), b.code(), "at the cap: {a} / {b}"),
            (a, b) => panic!("at the cap: {b:?}, unpadded: {a:?}"),
        }
    }
}
