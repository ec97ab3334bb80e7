//! Reads one raw HTTP response on stdin (end of input is the connection closing) and prints one
//! JSON object: version, status, reason, headers, framing and the base64 of the decoded body;
//! or `{"error":"<kind>"}` and exit status 1.
//!
//! `cargo run -q -p http-nostd --example http_dump < response.bin`

use std::io::{Read, Write};
use std::process::ExitCode;

use http_nostd::{Event, HttpError, ResponseReader, Status, HEAD_CAP};

fn main() -> ExitCode {
    let mut out = std::io::stdout().lock();
    let line = match dump(std::io::stdin().lock()) {
        Ok(json) => json,
        Err(e) => {
            let _ = writeln!(out, "{{\"error\":\"{}\"}}", e.as_str());
            return ExitCode::FAILURE;
        }
    };
    let _ = writeln!(out, "{line}");
    ExitCode::SUCCESS
}

fn dump(mut input: impl Read) -> Result<String, HttpError> {
    let storage: Box<[u8; HEAD_CAP]> = vec![0u8; HEAD_CAP].into_boxed_slice().try_into().unwrap();
    let mut reader = ResponseReader::new(storage);
    let mut body = Vec::new();
    let mut buf = vec![0u8; 4096];
    'read: loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A failed read ends the input, as a reset connection would.
            Err(_) => break,
        };
        let mut pos = 0;
        loop {
            let (used, event) = reader.feed(&buf[pos..n])?;
            pos += used;
            match event {
                Status::Partial => break,
                Status::Complete(Event::Head) => {}
                Status::Complete(Event::Body(bytes)) => body.extend_from_slice(bytes),
                Status::Complete(Event::End) => break 'read,
            }
        }
    }
    reader.finish()?;
    let head = reader.head().ok_or(HttpError::IncompleteHead)?;
    let mut json = format!(
        "{{\"version\":\"{}\",\"status\":{},\"reason\":{},\"headers\":[",
        head.version().as_str(),
        head.status(),
        json_string(head.reason().as_bytes())
    );
    for (i, (name, value)) in head.headers().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "[{},{}]",
            json_string(name.as_bytes()),
            json_string(value)
        ));
    }
    json.push_str(&format!(
        "],\"framing\":\"{}\",\"body\":\"{}\"}}",
        head.framing().as_str(),
        base64(&body)
    ));
    Ok(json)
}

/// A JSON string literal of `bytes` read as UTF-8 with replacement.
fn json_string(bytes: &[u8]) -> String {
    let mut s = String::from("\"");
    for c in String::from_utf8_lossy(bytes).chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Standard base64 (RFC 4648 section 4) with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= group.len() {
                s.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn dump_prints_the_issue_format() {
        let input = &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Q: \"a\"\r\n\r\n3\r\nfoo\r\n0\r\n\r\n"[..];
        assert_eq!(
            dump(input).unwrap(),
            r#"{"version":"HTTP/1.1","status":200,"reason":"OK","headers":[["Transfer-Encoding","chunked"],["X-Q","\"a\""]],"framing":"chunked","body":"Zm9v"}"#
        );
        assert_eq!(
            dump(&b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfoo"[..]),
            Err(HttpError::Truncated)
        );
    }
}
