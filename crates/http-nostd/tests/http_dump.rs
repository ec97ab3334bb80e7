//! The `http_dump` example prints exactly its documented format, on the recorded raw
//! response `fixtures/chunked_response.http`, and `{"error":"Truncated"}` with exit status 1
//! when the response is cut short.
//!
//! The binary comes from `llama_harness::workspace_artifact`, which asks the cargo running the
//! tests to build the example and takes the path cargo reports: this crate's example has
//! `test = true`, so `cargo test` builds it only as a test harness. It is then run directly,
//! once per case, with the input on stdin.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

fn http_dump(stdin: &[u8]) -> Output {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let bin =
        BIN.get_or_init(|| llama_harness::workspace_artifact("http-nostd", "example", "http_dump"));
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("http_dump starts");
    // Written from another thread so a full stdout pipe cannot block both sides.
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().expect("http_dump runs");
    writer.join().unwrap();
    out
}

fn fixture() -> Vec<u8> {
    llama_harness::fixture("chunked_response.http")
}

/// The header fields of the fixture in file order, by a split on CRLF, and the raw body.
fn split_head(bytes: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&bytes[..end]).unwrap();
    let fields = head
        .split("\r\n")
        .skip(1)
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.to_owned(), value.trim_matches([' ', '\t']).to_owned())
        })
        .collect();
    (fields, &bytes[end + 4..])
}

/// De-chunks by hand: hex size line, data, CRLF; the `0` chunk ends it (no trailers).
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&body[..eol]).unwrap(), 16).unwrap();
        body = &body[eol + 2..];
        if size == 0 {
            assert_eq!(body, b"\r\n");
            return out;
        }
        out.extend_from_slice(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}

/// A JSON string literal for an ASCII header name or value without `"`, `\` or controls
/// (checked: the fixture's header fields are plain).
fn plain_json_string(s: &str) -> String {
    assert!(
        s.bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'),
        "needs escaping: {s:?}"
    );
    format!("\"{s}\"")
}

/// Decodes padded standard base64 (RFC 4648 section 4); `None` on anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, quad) in bytes.chunks(4).enumerate() {
        let last = i == bytes.len() / 4 - 1;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = n << 6 | value(c)?;
        }
        n <<= 6 * pad;
        let group = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&group[..3 - pad]);
    }
    Some(out)
}

#[test]
fn base64_decode_reads_rfc_4648_vectors() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64_decode(encoded).as_deref(), Some(plain.as_bytes()));
    }
    assert_eq!(base64_decode("Zg="), None);
    assert_eq!(base64_decode("Zg==Zm9v"), None);
    assert_eq!(base64_decode("Z!=="), None);
}

#[test]
fn the_recorded_response_dumps_head_headers_in_order_and_the_dechunked_body() {
    let bytes = fixture();
    let (fields, chunked) = split_head(&bytes);
    let headers: Vec<String> = fields
        .iter()
        .map(|(n, v)| format!("[{},{}]", plain_json_string(n), plain_json_string(v)))
        .collect();
    let prefix = format!(
        "{{\"version\":\"HTTP/1.1\",\"status\":200,\"reason\":\"OK\",\"headers\":[{}],\"framing\":\"chunked\",\"body\":\"",
        headers.join(",")
    );
    let out = http_dump(&bytes);
    assert!(out.status.success(), "{:?}", out.status);
    assert!(out.stderr.is_empty(), "stderr {:?}", out.stderr);
    let text = String::from_utf8(out.stdout).expect("http_dump prints UTF-8");
    let line = text.strip_suffix('\n').expect("one line ending in LF");
    assert!(!line.contains('\n'), "exactly one line");
    let rest = line.strip_prefix(&prefix).unwrap_or_else(|| {
        panic!(
            "want prefix\n{prefix}\ngot\n{}",
            &line[..line.len().min(prefix.len() + 40)]
        )
    });
    let b64 = rest
        .strip_suffix("\"}")
        .expect("ends with the body string and `}`");
    let body = base64_decode(b64).expect("the body is padded standard base64");
    assert!(body == dechunk(chunked), "the body is the de-chunked body");
    assert!(body.starts_with(b"data: {") && body.ends_with(b"data: [DONE]\n\n"));
}

#[test]
fn a_truncated_response_is_an_error_and_exit_1() {
    let bytes = fixture();
    // One byte short of the final `0\r\n\r\n`, and cut inside the first chunk's data.
    let body_start = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let size_line = bytes[body_start..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap()
        + 2;
    let first_chunk_data = body_start + size_line + 10;
    for cut in [bytes.len() - 1, first_chunk_data] {
        let out = http_dump(&bytes[..cut]);
        assert_eq!(out.status.code(), Some(1), "cut at {cut}");
        assert_eq!(out.stdout, b"{\"error\":\"Truncated\"}\n", "cut at {cut}");
    }
}

#[test]
fn a_head_cut_short_is_incomplete_head_and_exit_1() {
    let bytes = fixture();
    let out = http_dump(&bytes[..20]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stdout, b"{\"error\":\"IncompleteHead\"}\n");
}
