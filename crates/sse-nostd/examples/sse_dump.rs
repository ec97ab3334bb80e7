//! Conformance dump: reads an event stream on stdin in reads of N bytes (`--chunk N`, default
//! 4096) and prints one JSON object per dispatched event,
//! `{"event":"message","data":"...","id":""}`, then `{"unterminated":true}` if the stream
//! ended inside an event. On a parse error it prints `{"error":"<kind>"}` and exits 1.

use std::io::{Read, Write};
use std::process::ExitCode;

use sse_nostd::{Event, Parser, SseError, Status};

/// The parser's buffer: loopd's size, the M2a design's 1 MiB cap per SSE line.
const SSE_CAP: usize = 1024 * 1024;

fn main() -> ExitCode {
    let chunk = match chunk_size() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("sse_dump: {e}\nusage: sse_dump [--chunk N]   (N >= 1)");
            return ExitCode::from(2);
        }
    };
    let storage: Box<[u8; SSE_CAP]> = vec![0u8; SSE_CAP]
        .into_boxed_slice()
        .try_into()
        .expect("the vec has SSE_CAP bytes");
    let mut parser = Parser::new(storage);
    let mut read_buf = vec![0u8; chunk];
    let mut stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let result = loop {
        let n = match stdin.read(&mut read_buf) {
            Ok(0) => break parser.finish(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("sse_dump: reading stdin: {e}");
                return ExitCode::from(2);
            }
        };
        if let Err(e) = dump_read(&mut parser, &read_buf[..n], &mut out) {
            break Err(e);
        }
    };
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(SseError::Unterminated) => {
            writeln!(out, "{{\"unterminated\":true}}").ok();
            ExitCode::SUCCESS
        }
        Err(e) => {
            writeln!(out, "{{\"error\":\"{}\"}}", e.as_str()).ok();
            ExitCode::FAILURE
        }
    };
    out.flush().ok();
    code
}

fn chunk_size() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(4096),
        [flag, n] if flag == "--chunk" => match n.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("bad chunk size {n:?}")),
        },
        _ => Err(format!("unexpected arguments {args:?}")),
    }
}

fn dump_read<S: std::borrow::BorrowMut<[u8; SSE_CAP]>>(
    parser: &mut Parser<S, SSE_CAP>,
    mut rest: &[u8],
    out: &mut impl Write,
) -> Result<(), SseError> {
    loop {
        let (used, event) = parser.feed(rest)?;
        rest = &rest[used..];
        match event {
            Status::Complete(Event::Message(m)) => {
                let mut line = String::from("{\"event\":");
                json_string(&mut line, m.event);
                line.push_str(",\"data\":");
                json_string(&mut line, m.data);
                line.push_str(",\"id\":");
                json_string(&mut line, m.id);
                line.push('}');
                writeln!(out, "{line}").ok();
            }
            Status::Complete(_) => {}
            Status::Partial => return Ok(()),
        }
    }
}

/// Appends `bytes`, decoded as UTF-8 with replacement, as a JSON string (escaped as
/// serde_json does: the short escapes where JSON has them, `\u00XX` for other controls).
fn json_string(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for c in String::from_utf8_lossy(bytes).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
