//! The `sse_dump` example prints exactly its documented format, on a recorded transcript,
//! in any read size, for a stream that ends inside an event, and for a line over its cap.
//!
//! The binary comes from `llama_harness::workspace_artifact`, which asks the cargo running the
//! tests to build the example and takes the path cargo reports (`CARGO_BIN_EXE_<name>` exists
//! only for `[[bin]]` targets). It is then run directly, once per case, with the input on stdin.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// sse_dump's buffer (examples/sse_dump.rs): 1 MiB.
const LOOPD_CAP: usize = 1024 * 1024;

fn sse_dump(args: &[&str], stdin: &[u8]) -> Output {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let bin =
        BIN.get_or_init(|| llama_harness::workspace_artifact("sse-nostd", "example", "sse_dump"));
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sse_dump starts");
    // Written from another thread so a full stdout pipe cannot block both sides.
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        // A broken pipe is fine: the dump may stop reading after an error.
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().expect("sse_dump runs");
    writer.join().unwrap();
    out
}

/// `bytes` as a JSON string literal, escaped as serde_json escapes (short escapes for `"`,
/// `\`, and the controls that have one; `\u00xx` for other controls; nothing else).
fn json_string(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            '\u{08}' => s.push_str("\\b"),
            '\u{0c}' => s.push_str("\\f"),
            c if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn message_line(data: &[u8]) -> String {
    format!(
        "{{\"event\":\"message\",\"data\":{},\"id\":\"\"}}",
        json_string(data)
    )
}

fn plain_sse() -> Vec<u8> {
    llama_harness::fixture("plain.sse")
}

/// The data payloads of a `data: X\n\n`-framed body, by a plain split (checked, not assumed).
fn data_payloads(bytes: &[u8]) -> Vec<Vec<u8>> {
    let text = std::str::from_utf8(bytes).unwrap();
    let body = text.strip_suffix("\n\n").expect("ends in an empty line");
    body.split("\n\n")
        .map(|block| {
            assert!(!block.contains('\n'), "one line per event: {block:?}");
            block
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data line: {block:?}"))
                .as_bytes()
                .to_vec()
        })
        .collect()
}

fn stdout_lines(out: &Output) -> Vec<String> {
    let text = String::from_utf8(out.stdout.clone()).expect("sse_dump prints UTF-8");
    assert!(
        text.ends_with('\n') || text.is_empty(),
        "last line ends in LF"
    );
    text.lines().map(str::to_owned).collect()
}

#[test]
fn json_string_escapes_like_serde_json() {
    // The expectations below rest on this escaper; pin it on the cases that matter.
    assert_eq!(json_string(br#"{"a":"b\n"}"#), r#""{\"a\":\"b\\n\"}""#);
    assert_eq!(json_string(b"a\nb\tc\x01\x7f"), "\"a\\nb\\tc\\u0001\x7f\"");
    assert_eq!(json_string(b"\xff"), "\"\u{fffd}\"");
}

#[test]
fn plain_transcript_prints_one_line_per_event() {
    let input = plain_sse();
    let payloads = data_payloads(&input);
    assert!(payloads.last().unwrap() == b"[DONE]");
    let want: Vec<String> = payloads.iter().map(|d| message_line(d)).collect();
    for args in [&[][..], &["--chunk", "1"][..], &["--chunk", "7"][..]] {
        let out = sse_dump(args, &input);
        assert!(out.status.success(), "{args:?}: {:?}", out.status);
        assert!(out.stderr.is_empty(), "{args:?}: stderr {:?}", out.stderr);
        let got = stdout_lines(&out);
        assert_eq!(got.len(), want.len(), "{args:?}: line count");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{args:?}: line {i}");
        }
    }
}

#[test]
fn event_type_and_last_id_are_printed() {
    let out = sse_dump(
        &[],
        b"event: tick\nid: 7\ndata: a\ndata: \"b\"\n\ndata: c\n\n",
    );
    assert!(out.status.success());
    assert_eq!(
        stdout_lines(&out),
        [
            r#"{"event":"tick","data":"a\n\"b\"","id":"7"}"#,
            r#"{"event":"message","data":"c","id":"7"}"#,
        ]
    );
}

#[test]
fn a_stream_ending_inside_an_event_ends_with_unterminated() {
    // The recorded transcript without its last byte ends `data: [DONE]\n`.
    let input = plain_sse();
    let payloads = data_payloads(&input);
    let mut want: Vec<String> = payloads[..payloads.len() - 1]
        .iter()
        .map(|d| message_line(d))
        .collect();
    want.push(r#"{"unterminated":true}"#.to_owned());
    for args in [&[][..], &["--chunk", "1"][..]] {
        let out = sse_dump(args, &input[..input.len() - 1]);
        // The issue makes only a parse error exit 1; an unterminated end is reported, not failed.
        assert!(out.status.success(), "{args:?}: {:?}", out.status);
        assert_eq!(stdout_lines(&out), want, "{args:?}");
    }
    // Ending in the middle of a line is the same.
    let out = sse_dump(&[], b"data: a\n\ndata: b");
    assert!(out.status.success());
    assert_eq!(
        stdout_lines(&out),
        [
            r#"{"event":"message","data":"a","id":""}"#,
            r#"{"unterminated":true}"#
        ]
    );
}

#[test]
fn a_line_of_exactly_the_cap_is_one_event() {
    // sse_dump's parser buffer is LOOPD_CAP (1 MiB); a line of exactly that many bytes fits.
    let data = vec![b'x'; LOOPD_CAP - "data: ".len()];
    let mut input = b"data: ".to_vec();
    input.extend_from_slice(&data);
    input.extend_from_slice(b"\n\n");
    let out = sse_dump(&["--chunk", "65536"], &input);
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(stdout_lines(&out), [message_line(&data)]);
}

#[test]
fn a_line_one_past_the_cap_is_line_too_long_and_exit_1() {
    let mut input = b"data: before\n\n".to_vec();
    input.extend_from_slice(b"data: ");
    input.resize(input.len() + LOOPD_CAP + 1 - "data: ".len(), b'x');
    input.extend_from_slice(b"\n\ndata: after\n\n");
    for args in [&[][..], &["--chunk", "1460"][..]] {
        let out = sse_dump(args, &input);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stdout_lines(&out),
            [
                message_line(b"before"),
                r#"{"error":"LineTooLong"}"#.to_owned()
            ],
            "{args:?}"
        );
    }
}
