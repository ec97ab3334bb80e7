//! The device check (`make embedded`): on an emulated LM3S6965 (Cortex-M3, 64 KiB of RAM),
//! a recorded llama-server response goes through http-nostd -> sse-nostd -> llama-proto in
//! small reads with small caps and must give the answer `build.rs` computed on the host with
//! serde_json; then SHA-256 vectors, and the typed errors at each cap (at the limit and one
//! past). The stack is painted at boot (cortex-m-rt `paint-stack`) and its high-water mark
//! reported. Exit status 0 when every check passed, 1 otherwise (semihosting).
#![no_std]
#![no_main]

use core::fmt::Write as _;
use core::mem::size_of;

use boxmaker_embedded::expected as exp;
use boxmaker_embedded::{
    run, stack, Buffers, Path, Reader, Stream, HEADER_FIELDS, HEAD_CAP, LINE_CAP, TEXT_CAP,
};
use cortex_m_rt::entry;
use cortex_m_semihosting::hprintln;
use http_nostd::{Event as HttpEvent, HttpError, ResponseReader, Status};
use llama_proto::hash::{sha256, Hash32, Sha256};
use llama_proto::{
    decode_chunk, decode_error_event, DecodeError, Payload, StreamError, MAX_NESTING,
};
use sse_nostd::{Event as SseEvent, Parser, SseError};

/// Reads the recorded response is split into: a byte at a time, odd sizes, and all at once.
const READS: [usize; 5] = [1, 7, 64, 536, usize::MAX];

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    hprintln!("FAIL panic: {}", info);
    boxmaker_embedded::exit(false)
}

/// A fixed line of text for one check's report.
struct Line {
    buf: [u8; 200],
    len: usize,
}

impl Line {
    const fn new() -> Line {
        Line {
            buf: [0; 200],
            len: 0,
        }
    }
    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
    }
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        // Truncates rather than fails: a report line is for people.
        let n = s.len().min(self.buf.len() - self.len);
        let n = (0..=n).rev().find(|&n| s.is_char_boundary(n)).unwrap_or(0);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, what: &Line) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        hprintln!(
            "{} {:<9} {}",
            if ok { "ok  " } else { "FAIL" },
            name,
            what.as_str()
        );
    }
}

/// Bytes built on the device (over-cap lines and heads, nested payloads) in a scratch buffer.
struct Scratch<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Scratch<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Scratch { buf, len: 0 }
    }
    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self
    }
    fn repeat(&mut self, bytes: &[u8], n: usize) -> &mut Self {
        for _ in 0..n {
            self.push(bytes);
        }
        self
    }
}

/// One run of the recorded response: what the path said, compared with the host's answer, and
/// the stack `run` used (the stream's state is this frame's, not counted).
fn stream_once(bufs: &mut Buffers, read: usize, line: &mut Line) -> (bool, usize) {
    let mut stream = bufs.stream();
    let input = core::hint::black_box(exp::FIXTURE);
    let (result, used) = stack::measure(|| run(input, read, &mut stream));
    (compare(result, &stream, line), used)
}

fn compare(result: Result<Stream, StreamError>, stream: &Path<'_>, line: &mut Line) -> bool {
    let result = match result {
        Ok(s) => s,
        Err(e) => {
            let _ = write!(line, "path error {e:?}");
            return false;
        }
    };
    let m = match stream.assembler().finish() {
        Ok(m) => m,
        Err(e) => {
            let _ = write!(line, "assembler {e:?}");
            return false;
        }
    };
    let calls_match = m.tool_calls.len() == exp::TOOL_CALLS.len()
        && m.tool_calls
            .iter()
            .zip(exp::TOOL_CALLS)
            .all(|(c, &(id, name, args))| c.id == id && c.name == name && c.arguments == args);
    // A stream without timings fails the comparison below rather than reading as zeros.
    let t = m.timings.unwrap_or_default();
    let checks = [
        ("status", result.status == exp::STATUS),
        ("events", result.events == exp::EVENTS && result.done),
        ("id", m.id == exp::ID),
        ("content", m.content == exp::CONTENT),
        ("reasoning", m.reasoning_content == exp::REASONING),
        ("tool calls", calls_match),
        ("finish", m.finish_reason.as_str() == exp::FINISH_REASON),
        (
            "timings",
            m.timings.is_some() && (t.cache_n, t.prompt_n, t.predicted_n) == exp::TIMINGS,
        ),
    ];
    if let Some((name, _)) = checks.iter().find(|(_, ok)| !ok) {
        let _ = write!(line, "{name} differs: got {m:?}");
        return false;
    }
    let _ = write!(line, "{} events; ", result.events);
    for c in m.tool_calls.iter() {
        let _ = write!(line, "{}({}) ", c.name, c.arguments);
    }
    let _ = write!(
        line,
        "finish {}, timings {}/{}/{}",
        m.finish_reason.as_str(),
        t.cache_n,
        t.prompt_n,
        t.predicted_n
    );
    true
}

/// llama-proto's SHA-256 vectors (byte i of a pattern message is `(i * 7 + 3) % 256`).
mod sha256_vectors {
    include!("../../../crates/llama-proto/tests/common/sha256_vectors.rs");
}

fn check_sha256(report: &mut Report, scratch: &mut [u8]) {
    use sha256_vectors::{ABC, EMPTY, MILLION_A, PATTERN};
    const VECTORS: [(&[u8], &str); 2] = [(b"", EMPTY), (b"abc", ABC)];
    let mut all = true;
    let mut n = 0;
    for (msg, hex) in VECTORS {
        all &= sha256(msg).ok() == Hash32::from_hex(hex);
        n += 1;
    }
    for (len, hex) in PATTERN {
        for (i, b) in scratch[..len].iter_mut().enumerate() {
            *b = ((i * 7 + 3) % 256) as u8;
        }
        all &= sha256(&scratch[..len]).ok() == Hash32::from_hex(hex);
        // The same digest when fed in two pieces at every split point.
        for at in 0..=len {
            let mut h = Sha256::new();
            let split = h
                .update(&scratch[..at])
                .and_then(|()| h.update(&scratch[at..len]));
            all &= split.is_ok() && h.finish().ok() == Hash32::from_hex(hex);
        }
        n += 1;
    }
    // One million 'a', streamed in 1000-byte pieces.
    scratch[..1000].fill(b'a');
    let mut h = Sha256::new();
    for _ in 0..1000 {
        all &= h.update(&scratch[..1000]).is_ok();
    }
    all &= h.finish().ok() == Hash32::from_hex(MILLION_A);
    n += 1;
    let mut line = Line::new();
    let _ = write!(
        line,
        "{n} vectors (empty, abc, 55-65 bytes split everywhere, a million 'a')"
    );
    report.check("sha256", all, &line);
}

/// An SSE line of exactly `len` bytes (without its line end), then an empty line.
fn sse_line(scratch: &mut [u8], len: usize) -> usize {
    let mut s = Scratch::new(scratch);
    s.push(b"data: ").repeat(b"x", len - 6).push(b"\n\n");
    s.len
}

fn sse_verdict(input: &[u8], step: usize) -> Result<usize, SseError> {
    let mut storage = [0u8; LINE_CAP];
    let mut p: Parser<_, LINE_CAP> = Parser::new(&mut storage);
    let mut data = 0;
    for piece in input.chunks(step) {
        let mut rest = piece;
        loop {
            let (used, ev) = p.feed(rest)?;
            rest = &rest[used..];
            match ev {
                Status::Complete(SseEvent::Message(m)) => data = m.data.len(),
                Status::Complete(_) => {}
                Status::Partial => break,
            }
        }
    }
    p.finish()?;
    Ok(data)
}

/// A head of exactly `len` bytes (`HTTP/1.1 200 OK`, one padded field, the empty line), body
/// `ok` to the end of the input.
fn head_of(scratch: &mut [u8], len: usize) -> usize {
    let mut s = Scratch::new(scratch);
    s.push(b"HTTP/1.1 200 OK\r\nX: ")
        .repeat(b"p", len - 24)
        .push(b"\r\n\r\nok");
    s.len
}

fn with_fields(scratch: &mut [u8], n: usize) -> usize {
    let mut s = Scratch::new(scratch);
    s.push(b"HTTP/1.1 200 OK\r\n");
    for i in 0..n {
        s.push(b"H").push(&[b'a' + i as u8]).push(b": 1\r\n");
    }
    s.push(b"Content-Length: 2\r\n\r\nok");
    s.len
}

fn http_verdict(input: &[u8], step: usize) -> Result<usize, HttpError> {
    let mut storage = [0u8; HEAD_CAP];
    let mut r: ResponseReader<_, HEAD_CAP, HEADER_FIELDS> =
        ResponseReader::with_field_cap(&mut storage);
    let mut body = 0;
    'reads: for piece in input.chunks(step) {
        let mut rest = piece;
        loop {
            let (used, ev) = r.feed(rest)?;
            rest = &rest[used..];
            match ev {
                Status::Partial => break,
                Status::Complete(HttpEvent::Head) => {}
                Status::Complete(HttpEvent::Body(b)) => body += b.len(),
                Status::Complete(HttpEvent::End) => break 'reads,
            }
        }
    }
    r.finish()?;
    Ok(body)
}

fn check_caps(report: &mut Report, scratch: &mut [u8]) {
    for step in [1, 64, usize::MAX] {
        let mut reads = Line::new();
        let _ = match step {
            usize::MAX => write!(reads, "one read"),
            n => write!(reads, "reads of {n}"),
        };
        let mut line = Line::new();
        let at = sse_line(scratch, LINE_CAP);
        let at = sse_verdict(&scratch[..at], step);
        let past = sse_line(scratch, LINE_CAP + 1);
        let past = sse_verdict(&scratch[..past], step);
        let _ = write!(
            line,
            "SSE line of {LINE_CAP} bytes: {at:?}; {} bytes: {past:?} ({})",
            LINE_CAP + 1,
            reads.as_str()
        );
        let ok = at == Ok(LINE_CAP - 6) && past == Err(SseError::LineTooLong);
        report.check("line cap", ok, &line);

        let mut line = Line::new();
        let at = head_of(scratch, HEAD_CAP);
        let at = http_verdict(&scratch[..at], step);
        let past = head_of(scratch, HEAD_CAP + 1);
        let past = http_verdict(&scratch[..past], step);
        let _ = write!(
            line,
            "head of {HEAD_CAP} bytes: body {at:?}; {} bytes: {past:?} ({})",
            HEAD_CAP + 1,
            reads.as_str()
        );
        let ok = at == Ok(2) && past == Err(HttpError::HeadersTooLarge);
        report.check("head cap", ok, &line);

        let mut line = Line::new();
        // Content-Length is one of the fields.
        let at = with_fields(scratch, HEADER_FIELDS - 1);
        let at = http_verdict(&scratch[..at], step);
        let past = with_fields(scratch, HEADER_FIELDS);
        let past = http_verdict(&scratch[..past], step);
        let _ = write!(
            line,
            "{HEADER_FIELDS} header fields: body {at:?}; {}: {past:?} ({})",
            HEADER_FIELDS + 1,
            reads.as_str()
        );
        let ok = at == Ok(2) && past == Err(HttpError::TooManyHeaders);
        report.check("fields", ok, &line);
    }
}

/// Where a deep value can sit in a payload, how many arrays and objects enclose it there
/// (llama-proto's tests/nesting.rs), and whether the payload is the data of an `event: error`
/// (decoded by `decode_error_event`) rather than a chunk.
type Place = (&'static str, usize, &'static [u8], &'static [u8], bool);

const PLACES: [Place; 10] = [
    (
        "top level",
        1,
        br#"{"choices":[{"delta":{"content":"a"}}],"x":"#,
        b"}",
        false,
    ),
    (
        "choices",
        3,
        br#"{"choices":[{"index":0,"delta":{"content":"a"},"x":"#,
        b"}]}",
        false,
    ),
    (
        "delta",
        4,
        br#"{"choices":[{"delta":{"content":"a","x":"#,
        b"}}]}",
        false,
    ),
    (
        "tool call",
        7,
        br#"{"choices":[{"delta":{"content":"a","tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}","x":"#,
        b"}}]}}]}",
        false,
    ),
    (
        "timings",
        2,
        br#"{"choices":[{"delta":{"content":"a"}}],"timings":{"cache_n":1,"prompt_n":2,"predicted_n":3,"x":"#,
        b"}}",
        false,
    ),
    (
        "prompt_progress",
        2,
        br#"{"choices":[{"delta":{"content":"a"}}],"prompt_progress":{"total":1,"cache":0,"processed":1,"time_ms":1,"x":"#,
        b"}}",
        false,
    ),
    (
        "error",
        2,
        br#"{"error":{"code":500,"message":"a","x":"#,
        b"}}",
        false,
    ),
    (
        "event error",
        2,
        br#"{"error":{"code":500,"message":"a","x":"#,
        b"}}",
        true,
    ),
    (
        "bare event error",
        1,
        br#"{"code":500,"message":"a","x":"#,
        b"}",
        true,
    ),
    (
        "second choice",
        2,
        br#"{"choices":[{"delta":{"content":"a"}},"#,
        b"]}",
        false,
    ),
];

/// The two shapes of a deep value: nested objects and nested arrays (open, close).
const SHAPES: [(&str, &[u8], &[u8]); 2] = [("objects", br#"{"k":"#, b"}"), ("arrays", b"[", b"]")];

/// A chunk with `depth` levels in all: `depth - outer` nested objects or arrays at the place.
fn nested(scratch: &mut [u8], place: usize, shape: usize, depth: usize) -> usize {
    let (_, outer, open, close, _) = PLACES[place];
    let (_, deeper, shallower) = SHAPES[shape];
    let inner = depth - outer;
    let mut s = Scratch::new(scratch);
    s.push(open)
        .repeat(deeper, inner)
        .push(b"1")
        .repeat(shallower, inner)
        .push(close);
    s.len
}

/// Decodes `payload` (a chunk, or the data of an `event: error`) on a freshly painted stack;
/// returns whether it said `a` (the content, or the error's message) and the peak stack.
#[inline(never)]
fn decode_measured(
    payload: &[u8],
    event: bool,
    text: &mut [u8; TEXT_CAP],
) -> (Result<bool, DecodeError>, usize) {
    let payload = core::hint::black_box(payload);
    stack::measure(|| {
        if event {
            return decode_error_event(payload, text).map(|e| e.message == "a");
        }
        match decode_chunk(payload, text) {
            Ok(Payload::Chunk(c)) => Ok(c.content == Some("a")),
            Ok(Payload::Error(e)) => Ok(e.message == "a"),
            Err(e) => Err(e),
        }
    })
}

/// A whole streamed response whose one event is `payload` (an `event: error` if `event`), then
/// `[DONE]`.
fn response_with(scratch: &mut [u8], payload_len: usize, event: bool) -> usize {
    const HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    // The payload sits at the end of the scratch buffer; the response is built at its start.
    let (out, payload) = scratch.split_at_mut(scratch.len() - payload_len);
    let event_line: &[u8] = if event { b"event: error\n" } else { b"" };
    let body_len = event_line.len() + 6 + payload_len + 2 + 14;
    let hex = |n: usize| -> [u8; 3] {
        let d = |v: usize| b"0123456789abcdef"[v & 15];
        [d(n >> 8), d(n >> 4), d(n)]
    };
    let mut s = Scratch::new(out);
    s.push(HEAD)
        .push(&hex(body_len))
        .push(b"\r\n")
        .push(event_line)
        .push(b"data: ")
        .push(payload)
        .push(b"\n\ndata: [DONE]\n\n\r\n0\r\n\r\n");
    s.len
}

/// The whole path over a response carrying `payload`; the run's verdict and its stack.
#[inline(never)]
fn path_measured(bufs: &mut Buffers, input: &[u8]) -> (Result<Stream, StreamError>, usize) {
    let mut stream = bufs.stream();
    let input = core::hint::black_box(input);
    stack::measure(|| run(input, 64, &mut stream))
}

/// Returns the deepest stack seen while decoding alone, and through the whole path.
fn check_nesting(report: &mut Report, scratch: &mut [u8], bufs: &mut Buffers) -> (usize, usize) {
    let mut peak = 0;
    let mut path_peak = 0;
    for (i, &(name, _, _, _, event)) in PLACES.iter().enumerate() {
        // A server error ends the stream: the path says so, with the message decoded. A second
        // choice is checked for depth first, then refused.
        let error = name.contains("error");
        let refused = name == "second choice";
        let expected_at = match refused {
            true => Err(DecodeError::TooManyChoices),
            false => Ok(true),
        };
        for (k, (shape, _, _)) in SHAPES.iter().enumerate() {
            let mut line = Line::new();
            let n = nested(scratch, i, k, MAX_NESTING);
            let (at, at_stack) = decode_measured(&scratch[..n], event, &mut bufs.text);
            // The same payload through http -> sse -> decode -> assemble.
            let len = scratch.len();
            scratch.copy_within(..n, len - n);
            let r = response_with(scratch, n, event);
            let (path, path_stack) = path_measured(bufs, &scratch[..r]);
            let path_ok = match path {
                Ok(s) => !error && !refused && s.events == 2 && s.done,
                Err(StreamError::Server(_)) => error,
                Err(e) => refused && e == StreamError::Decode(DecodeError::TooManyChoices),
            };
            let n = nested(scratch, i, k, MAX_NESTING + 1);
            let (past, past_stack) = decode_measured(&scratch[..n], event, &mut bufs.text);
            peak = peak.max(at_stack).max(past_stack);
            path_peak = path_peak.max(path_stack);
            let _ = write!(
            line,
            "{shape} in {name}: {MAX_NESTING} deep {at:?}, stack {at_stack} B (whole path {path_stack} B); {} deep {past:?}, {past_stack} B",
            MAX_NESTING + 1
        );
            let ok = at == expected_at && path_ok && past == Err(DecodeError::TooDeep);
            report.check("nesting", ok, &line);
        }
    }
    let text = &mut bufs.text;
    // A line-cap flood of `[` inside choices: refused before anything recurses.
    let mut s = Scratch::new(scratch);
    s.push(br#"{"choices":[{"x":"#);
    let fill = LINE_CAP - s.len;
    s.repeat(b"[", fill);
    let n = s.len;
    let (flood, flood_stack) = decode_measured(&scratch[..n], false, text);
    peak = peak.max(flood_stack);
    let mut line = Line::new();
    let _ = write!(
        line,
        "{LINE_CAP}-byte flood of [ in choices: {flood:?} (stack {flood_stack} B)"
    );
    report.check("nesting", flood == Err(DecodeError::TooDeep), &line);
    (peak, path_peak)
}

/// The anchor: the stack of httparse alone parsing the recorded head (its 16 slots included),
/// beside http-nostd reading the same head (the reader's state included).
fn check_head_stack(report: &mut Report, head_buf: &mut [u8; HEAD_CAP]) -> usize {
    let input = core::hint::black_box(&exp::FIXTURE[..exp::HEAD_LEN]);
    let (alone, alone_stack) = stack::measure(|| {
        let mut slots = [httparse::EMPTY_HEADER; HEADER_FIELDS];
        let mut response = httparse::Response::new(&mut slots);
        let parsed = response.parse(core::hint::black_box(input));
        matches!(parsed, Ok(httparse::Status::Complete(n)) if n == exp::HEAD_LEN)
            && response.code == Some(exp::STATUS)
    });
    let (ours, ours_stack) = stack::measure(|| {
        let mut reader: Reader<'_> = ResponseReader::with_field_cap(head_buf);
        let fed = reader.feed(core::hint::black_box(input));
        fed == Ok((exp::HEAD_LEN, Status::Complete(HttpEvent::Head)))
            && reader.head().is_some_and(|h| h.status() == exp::STATUS)
    });
    let mut line = Line::new();
    let _ = write!(
        line,
        "the recorded head: httparse alone {alone_stack} B of stack (16 slots included), http-nostd {ours_stack} B (reader included)"
    );
    report.check("anchor", alone && ours, &line);
    ours_stack
}

#[entry]
fn main() -> ! {
    // The caller's buffers, in .bss: cortex-m-rt turns these into `&'static mut`.
    static mut BUFFERS: Buffers = Buffers::ZERO;
    static mut SCRATCH: [u8; 2 * LINE_CAP] = [0; 2 * LINE_CAP];
    let bufs: &'static mut Buffers = BUFFERS;
    let scratch: &'static mut [u8; 2 * LINE_CAP] = SCRATCH;

    // The recorded stream first, before anything prints: the high-water mark since boot is
    // then the path's own (plus main's frame).
    let mut lines = [const { Line::new() }; READS.len()];
    let mut oks = [false; READS.len()];
    let mut run_stack = [0; READS.len()];
    for (i, &read) in READS.iter().enumerate() {
        (oks[i], run_stack[i]) = stream_once(bufs, read, &mut lines[i]);
    }

    let mut report = Report {
        passed: 0,
        failed: 0,
    };
    let (top, end) = stack::bounds();
    hprintln!(
        "embedded check: {} ({} bytes, head {} bytes); caps: head {} B, {} fields, line {} B, text {} B; stack {} B",
        "fixtures/chunked_tool_call.http",
        exp::FIXTURE.len(),
        exp::HEAD_LEN,
        HEAD_CAP,
        HEADER_FIELDS,
        LINE_CAP,
        TEXT_CAP,
        top - end
    );
    for (i, &read) in READS.iter().enumerate() {
        let mut name = Line::new();
        match read {
            usize::MAX => {
                let _ = write!(name, "one read:  ");
            }
            n => {
                let _ = write!(name, "reads of {n}: ");
            }
        }
        let _ = write!(
            name,
            "{} (run: stack {} B)",
            lines[i].as_str(),
            run_stack[i]
        );
        report.check("stream", oks[i], &name);
    }
    check_head_stack(&mut report, &mut bufs.head);
    check_sha256(&mut report, scratch);
    check_caps(&mut report, scratch);
    let (nesting_stack, nesting_path_stack) = check_nesting(&mut report, scratch, bufs);

    let state = size_of::<Path<'_>>();
    let run_peak = run_stack.iter().copied().max().unwrap_or(0);
    let peak = state + run_peak.max(nesting_path_stack);
    hprintln!(
        "stack     run(): {} B on the recording, {} B at the worst nesting accepted (the decoder alone {} B); state (the ChatStream: reader, parser, assembler) {} B; high-water mark since boot, this whole image with its formatting: {} B",
        run_peak,
        nesting_path_stack,
        nesting_stack,
        state,
        stack::high_water()
    );
    let mut line = Line::new();
    let _ = write!(line, "path peak (state + deepest run) {peak} B <= 4096 B");
    report.check("stack", peak <= 4096, &line);
    hprintln!(
        "embedded check {}: {} of {} checks",
        if report.failed == 0 {
            "passed"
        } else {
            "FAILED"
        },
        report.passed,
        report.passed + report.failed
    );
    boxmaker_embedded::exit(report.failed == 0)
}
