//! Host side of the firmware image.
//!
//! 1. Puts `memory.x` (the LM3S6965's flash and RAM) where cortex-m-rt's `link.x` finds it.
//! 2. Computes the expected answer for `fixtures/chunked_tool_call.http` (a real llama-server
//!    response, recorded) with std and serde_json, independently of the crates the image tests:
//!    the chunked body is decoded by hand, the event stream split into `data:` payloads, each
//!    payload parsed by serde_json, and content, reasoning, tool calls, finish reason and the last
//!    timings folded as llama-server's streaming contract says. The image checks what
//!    http-nostd -> sse-nostd -> llama-proto assemble on the device against these values.
//!
//! Output: `$OUT_DIR/expected.rs`, included by `src/lib.rs`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

const FIXTURE: &str = "chunked_tool_call.http";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));

    std::fs::copy(manifest.join("memory.x"), out.join("memory.x")).expect("copy memory.x");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");

    let fixture = manifest.join("../fixtures").join(FIXTURE);
    println!("cargo:rerun-if-changed={}", fixture.display());
    let raw = std::fs::read(&fixture).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
    let expected = Expected::of(&raw);
    std::fs::write(out.join("expected.rs"), expected.rust(&fixture)).expect("write expected.rs");
}

#[derive(Default)]
struct Expected {
    head_len: usize,
    status: u16,
    body_len: usize,
    longest_line: usize,
    longest_payload: usize,
    events: usize,
    done: bool,
    id: String,
    content: String,
    reasoning: String,
    /// (index, id, name, arguments), in index order.
    calls: Vec<(String, String, String)>,
    finish_reason: String,
    timings: Option<(u64, u64, u64)>,
}

impl Expected {
    fn of(raw: &[u8]) -> Expected {
        let mut e = Expected::default();
        let head_end = find(raw, b"\r\n\r\n").expect("head ends with CRLF CRLF") + 4;
        e.head_len = head_end;
        let head = std::str::from_utf8(&raw[..head_end]).expect("ASCII head");
        e.status = head[9..12].parse().expect("status code");
        assert!(
            head.lines()
                .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked")),
            "the fixture is a chunked response"
        );
        let body = dechunk(&raw[head_end..]);
        e.body_len = body.len();
        e.longest_line = body
            .split(|&b| b == b'\n')
            .map(<[u8]>::len)
            .max()
            .unwrap_or(0);

        // The event stream: llama-server ends lines with LF and sends only `data:` fields.
        let text = std::str::from_utf8(&body).expect("UTF-8 event stream");
        let mut data: Option<String> = None;
        for line in text.split('\n') {
            if line.is_empty() {
                if let Some(d) = data.take() {
                    e.event(&d);
                }
                continue;
            }
            let value = line
                .strip_prefix("data:")
                .unwrap_or_else(|| panic!("only data fields expected, got {line:?}"));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
        assert!(data.is_none(), "the stream ends after an empty line");
        assert!(e.done, "the stream ends with [DONE]");
        assert_eq!(e.finish_reason, "tool_calls", "the fixture is a tool call");
        e
    }

    fn event(&mut self, data: &str) {
        self.events += 1;
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        assert!(!self.done, "nothing after [DONE]");
        self.longest_payload = self.longest_payload.max(data.len());
        let v: Value = serde_json::from_str(data).expect("each payload is JSON");
        if let Some(id) = v["id"].as_str() {
            if self.id.is_empty() {
                self.id = id.to_owned();
            }
            assert_eq!(self.id, id, "one completion id");
        }
        if let Some(t) = v.get("timings") {
            let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("timings.{k}"));
            self.timings = Some((n("cache_n"), n("prompt_n"), n("predicted_n")));
        }
        let choice = &v["choices"][0];
        if let Some(r) = choice["finish_reason"].as_str() {
            self.finish_reason = r.to_owned();
        }
        let delta = &choice["delta"];
        if let Some(s) = delta["content"].as_str() {
            self.content.push_str(s);
        }
        if let Some(s) = delta["reasoning_content"].as_str() {
            self.reasoning.push_str(s);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().expect("tool call index") as usize;
            if self.calls.len() <= i {
                self.calls.resize(i + 1, Default::default());
            }
            let slot = &mut self.calls[i];
            if let Some(id) = call["id"].as_str() {
                slot.0 = id.to_owned();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                slot.1 = name.to_owned();
            }
            if let Some(args) = call["function"]["arguments"].as_str() {
                slot.2.push_str(args);
            }
        }
    }

    fn rust(&self, fixture: &Path) -> String {
        let opt = |s: &str| {
            if s.is_empty() {
                "None".to_owned()
            } else {
                format!("Some({s:?})")
            }
        };
        let mut calls = String::new();
        for (id, name, args) in &self.calls {
            writeln!(calls, "    ({id:?}, {name:?}, {args:?}),").unwrap();
        }
        let (cache_n, prompt_n, predicted_n) = self.timings.expect("the stream carries timings");
        format!(
            "// Written by build.rs from fixtures/{FIXTURE} with serde_json; do not edit.\n\
             /// The recorded response: head and chunked body, as llama-server sent it.\n\
             pub const FIXTURE: &[u8] = include_bytes!({fixture:?});\n\
             /// Bytes of the head (status line, fields, empty line).\n\
             pub const HEAD_LEN: usize = {};\n\
             pub const STATUS: u16 = {};\n\
             /// Bytes of the decoded body (the event stream).\n\
             pub const BODY_LEN: usize = {};\n\
             /// The longest line of the event stream and the longest `data:` payload.\n\
             pub const LONGEST_LINE: usize = {};\n\
             pub const LONGEST_PAYLOAD: usize = {};\n\
             /// Events dispatched, the final `[DONE]` included.\n\
             pub const EVENTS: usize = {};\n\
             pub const ID: &str = {:?};\n\
             pub const CONTENT: Option<&str> = {};\n\
             pub const REASONING: Option<&str> = {};\n\
             /// (id, name, arguments) of each tool call, by index.\n\
             pub const TOOL_CALLS: &[(&str, &str, &str)] = &[\n{calls}];\n\
             pub const FINISH_REASON: &str = {:?};\n\
             /// The last chunk's timings: (cache_n, prompt_n, predicted_n).\n\
             pub const TIMINGS: (u64, u64, u64) = ({cache_n}, {prompt_n}, {predicted_n});\n",
            self.head_len,
            self.status,
            self.body_len,
            self.longest_line,
            self.longest_payload,
            self.events,
            self.id,
            opt(&self.content),
            opt(&self.reasoning),
            self.finish_reason,
        )
    }
}

/// The chunked transfer coding, decoded by hand (no extensions or trailers in the fixture).
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let eol = find(rest, b"\r\n").expect("chunk-size line ends with CRLF");
        let size_text = std::str::from_utf8(&rest[..eol]).expect("ASCII chunk size");
        let size = usize::from_str_radix(size_text, 16).expect("hex chunk size");
        rest = &rest[eol + 2..];
        if size == 0 {
            assert_eq!(
                rest, b"\r\n",
                "empty trailer section, nothing after the body"
            );
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n", "CRLF after chunk data");
        rest = &rest[size + 2..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
