//! `ChatStream`: the recorded llama-server response through the whole path, split at every
//! byte and in every read size, gives the same events and message; each rule of the
//! composition (error statuses, in-stream errors, `[DONE]`, a cut-off body, the caps) has a
//! test with its bytes inline.

use llama_proto::{AssembleError, Assembler, ChatStream, Status, StreamError, StreamEvent};
use sse_nostd::SseError;

#[path = "common/stream_feed.rs"]
mod stream_feed;
use stream_feed::feed_pieces;

const HEAD: usize = 512;
const FIELDS: usize = 16;
const LINE: usize = 1024;
const CONTENT: usize = 256;
const REASONING: usize = 256;
const CALLS: usize = 2;
const ARGS: usize = 128;

/// The caller's buffers, with the firmware's caps.
struct Storage {
    head: [u8; HEAD],
    line: [u8; LINE],
    text: [u8; LINE],
    content: [u8; CONTENT],
    reasoning: [u8; REASONING],
    args: [[u8; ARGS]; CALLS],
}

impl Storage {
    fn new() -> Self {
        Storage {
            head: [0; HEAD],
            line: [0; LINE],
            text: [0; LINE],
            content: [0; CONTENT],
            reasoning: [0; REASONING],
            args: [[0; ARGS]; CALLS],
        }
    }

    fn stream(&mut self) -> ChatStream<'_, HEAD, FIELDS, LINE, CONTENT, REASONING, CALLS, ARGS> {
        let assembler = Assembler::new(&mut self.content, &mut self.reasoning, &mut self.args);
        ChatStream::new(&mut self.head, &mut self.line, &mut self.text, assembler)
    }
}

/// One thing the stream said, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Head(u16),
    Chunk(String),
    Idle,
    Done,
    Server(Option<u32>, String),
    ErrorBody(Vec<u8>),
    End,
    Err(StreamError),
}

/// The finished message, owned: id, content, reasoning, calls, finish reason, timings.
type Msg = (
    String,
    Option<String>,
    Option<String>,
    Vec<(String, String, String)>,
    String,
    Option<(u64, u64, u64)>,
);

/// Feeds `input` cut at `cuts` (sorted offsets) into a stream with the firmware's caps, then
/// finishes it; an error ends the events.
fn run(input: &[u8], cuts: &[usize]) -> (Vec<Ev>, Result<Msg, StreamError>) {
    let mut storage = Storage::new();
    let mut stream = storage.stream();
    let mut from = 0;
    let pieces = cuts.iter().copied().chain([input.len()]).map(|to| {
        let piece = &input[from..to.max(from)];
        from = to.max(from);
        piece
    });
    let mut out: Vec<Ev> = Vec::new();
    let failed = feed_pieces(&mut stream, pieces, |event| {
        let ev = match event {
            StreamEvent::Head(s) => Ev::Head(s),
            StreamEvent::Chunk(c) => Ev::Chunk(format!("{c:?}")),
            StreamEvent::Idle => Ev::Idle,
            StreamEvent::Done => Ev::Done,
            StreamEvent::ServerError(e) => Ev::Server(e.code, e.message.to_owned()),
            StreamEvent::ErrorBody(b) => Ev::ErrorBody(b.to_vec()),
            StreamEvent::End => Ev::End,
            other => panic!("an event this test does not know: {other:?}"),
        };
        let end = ev == Ev::End;
        // Pieces of an error body are joined: how they are cut depends on the reads.
        match (out.last_mut(), ev) {
            (Some(Ev::ErrorBody(all)), Ev::ErrorBody(more)) => all.extend(more),
            (_, ev) => out.push(ev),
        }
        !end
    });
    if let Some(e) = failed {
        out.push(Ev::Err(e));
        return (out, stream.finish().map(|_| unreachable!()));
    }
    let msg = stream.finish().map(|m| {
        (
            m.id.to_owned(),
            m.content.map(str::to_owned),
            m.reasoning_content.map(str::to_owned),
            m.tool_calls
                .iter()
                .map(|c| (c.id.into(), c.name.into(), c.arguments.into()))
                .collect(),
            m.finish_reason.as_str().to_owned(),
            m.timings.map(|t| (t.cache_n, t.prompt_n, t.predicted_n)),
        )
    });
    (out, msg)
}

fn recorded() -> Vec<u8> {
    llama_harness::fixture("chunked_tool_call.http")
}

#[test]
fn the_recorded_tool_call_response_assembles() {
    let (events, msg) = run(&recorded(), &[]);
    let (id, content, reasoning, calls, finish, timings) = msg.unwrap();
    assert_eq!(id, "chatcmpl-awd498giRoMx7oekDNh8UBze8J5BhhmP");
    assert_eq!((content, reasoning), (None, None));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, "get_weather");
    assert_eq!(calls[0].2, r#"{"city": "Paris"}"#);
    assert_eq!(finish, "tool_calls");
    assert_eq!(timings, Some((0, 301, 31)));
    assert_eq!(events[0], Ev::Head(200));
    assert_eq!(events[events.len() - 2..], [Ev::Done, Ev::End]);
    let chunks = events.iter().filter(|e| matches!(e, Ev::Chunk(_))).count();
    assert_eq!(chunks, events.len() - 3, "{events:?}");
}

#[test]
fn every_cut_and_every_read_size_gives_the_same_events() {
    let input = recorded();
    let whole = run(&input, &[]);
    for cut in 0..=input.len() {
        assert_eq!(run(&input, &[cut]), whole, "cut at {cut}");
    }
    for read in 1..=64 {
        let cuts: Vec<usize> = (read..input.len()).step_by(read).collect();
        assert_eq!(run(&input, &cuts), whole, "reads of {read}");
    }
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";

fn chunk(content: &str) -> String {
    format!(r#"data: {{"id":"c","choices":[{{"delta":{{"content":"{content}"}}}}]}}"#)
}

const STOP: &str = r#"data: {"id":"c","choices":[{"delta":{},"finish_reason":"stop"}]}"#;

/// Several events in one body slice: the stream hands back each event's end, and the
/// rest of the slice (and, chunked, the framing after it) is taken up on the next call.
#[test]
fn several_events_in_one_body_slice_split_everywhere() {
    let events = format!(
        ": hi\n\n{}\n\n{}\n\n{STOP}\n\ndata: [DONE]\n\n",
        chunk("a"),
        chunk("b")
    );
    let length = format!("{SSE_HEAD}Content-Length: {}\r\n\r\n{events}", events.len());
    let chunked = format!(
        "{SSE_HEAD}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n0\r\n\r\n",
        events.len()
    );
    let close = format!("{SSE_HEAD}\r\n{events}");
    for input in [length, chunked, close] {
        let input = input.as_bytes();
        let (got, msg) = run(input, &[]);
        assert_eq!(got[..2], [Ev::Head(200), Ev::Idle]);
        // A read-to-close body has no end of its own before the input's.
        assert!(
            got[5..] == [Ev::Done, Ev::End] || got[5..] == [Ev::Done],
            "{got:?}"
        );
        let msg = msg.unwrap();
        assert_eq!(msg.1.as_deref(), Some("ab"));
        for cut in 0..=input.len() {
            assert_eq!(
                run(input, &[cut]),
                (got.clone(), Ok(msg.clone())),
                "cut at {cut}"
            );
        }
        let every: Vec<usize> = (1..input.len()).collect();
        assert_eq!(run(input, &every), (got.clone(), Ok(msg.clone())));
    }
}

#[test]
fn an_error_status_hands_its_body_out_and_finishes_as_that_status() {
    let input = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nLoading..";
    let (events, msg) = run(input, &[]);
    assert_eq!(
        events,
        [Ev::Head(503), Ev::ErrorBody(b"Loading..".to_vec()), Ev::End]
    );
    assert_eq!(msg, Err(StreamError::Status(503)));
    assert_eq!(run(input, &[40, 60]), (events, msg));
}

#[test]
fn a_200_that_is_not_an_event_stream_is_refused() {
    let input = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    let (events, msg) = run(input, &[]);
    assert_eq!(events, [Ev::Err(StreamError::NotEventStream)]);
    assert_eq!(msg, Err(StreamError::NotEventStream));
    // The media type is compared without regard to case, and parameters may follow; a 200
    // without a Content-Type is taken as the stream.
    let input = b"HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\n\r\n";
    assert_eq!(run(input, &[]).0, [Ev::Head(200)]);
    assert_eq!(run(b"HTTP/1.1 200 OK\r\n\r\n", &[]).0, [Ev::Head(200)]);
}

#[test]
fn in_stream_errors_end_the_stream_in_both_forms() {
    let chunk_error = format!(
        "{SSE_HEAD}\r\n{}\n\ndata: {{\"error\":{{\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}}}}\n\n{}\n\n",
        chunk("a"),
        chunk("b")
    );
    let (events, msg) = run(chunk_error.as_bytes(), &[]);
    assert_eq!(events[2], Ev::Server(Some(500), "boom".into()));
    assert_eq!(events[3], Ev::Err(StreamError::Server(Some(500))));
    assert_eq!(msg, Err(StreamError::Server(Some(500))));

    let event_error = format!("{SSE_HEAD}\r\nevent: error\ndata: {{\"message\":\"gone\"}}\n\n");
    let (events, msg) = run(event_error.as_bytes(), &[]);
    assert_eq!(events[1], Ev::Server(None, "gone".into()));
    assert_eq!(msg, Err(StreamError::Server(None)));

    // An `event: error` whose data is not the error JSON: the data (its UTF-8 part) is the
    // message.
    let mut garbled = format!("{SSE_HEAD}\r\nevent: error\ndata: gone ").into_bytes();
    garbled.extend_from_slice(b"\xff\n\n");
    let (events, msg) = run(&garbled, &[]);
    assert_eq!(events[1], Ev::Server(None, "gone ".into()));
    assert_eq!(msg, Err(StreamError::Server(None)));
}

#[test]
fn an_event_after_done_is_an_error_but_a_comment_is_not() {
    let input = format!(
        "{SSE_HEAD}\r\n{STOP}\n\ndata: [DONE]\n\n: bye\n\n{}\n\n",
        chunk("x")
    );
    let (events, msg) = run(input.as_bytes(), &[]);
    assert_eq!(
        events[2..],
        [Ev::Done, Ev::Idle, Ev::Err(StreamError::AfterDone)]
    );
    assert_eq!(msg, Err(StreamError::AfterDone));
}

#[test]
fn a_body_cut_off_after_the_final_chunk_still_gives_the_message() {
    let events = format!("{}\n\n{STOP}\n\n", chunk("a"));
    let cut = format!(
        "{SSE_HEAD}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
        events.len()
    );
    let (_, msg) = run(cut.as_bytes(), &[]);
    assert_eq!(msg.unwrap().1.as_deref(), Some("a"));
    // Cut off before it: the body's truncation is the error.
    let early = format!(
        "{SSE_HEAD}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\n\n\r\n",
        chunk("a").len() + 2,
        chunk("a")
    );
    let (_, msg) = run(early.as_bytes(), &[]);
    assert_eq!(
        msg,
        Err(StreamError::Http(http_nostd::HttpError::Truncated))
    );
    // A read-to-close body cut inside an event: the event stream's own error.
    let inside = format!("{SSE_HEAD}\r\n{STOP}\n\ndata: {{");
    let (_, msg) = run(inside.as_bytes(), &[]);
    assert_eq!(msg, Err(StreamError::Sse(SseError::Unterminated)));
}

#[test]
fn without_a_finish_reason_the_message_is_incomplete() {
    let input = format!("{SSE_HEAD}\r\n{}\n\ndata: [DONE]\n\n", chunk("a"));
    let (_, msg) = run(input.as_bytes(), &[]);
    assert_eq!(
        msg,
        Err(StreamError::Assemble(AssembleError::NoFinishReason))
    );
}

#[test]
fn the_caps_are_the_parts_caps_at_the_limit_and_one_past() {
    // A line of exactly LINE bytes (without its end) passes, one more is the parser's error.
    let line = |len: usize| {
        let mut l = format!("{SSE_HEAD}\r\n: ");
        let start = l.len() - 2;
        l.push_str(&"x".repeat(len - 2));
        assert_eq!(l.len() - start, len);
        l.push_str("\n\n");
        l
    };
    assert_eq!(run(line(LINE).as_bytes(), &[]).0, [Ev::Head(200), Ev::Idle]);
    assert_eq!(
        run(line(LINE + 1).as_bytes(), &[]).0,
        [
            Ev::Head(200),
            Ev::Err(StreamError::Sse(SseError::LineTooLong))
        ]
    );
    // Content past the assembler's capacity: its error, named.
    let big = format!("{SSE_HEAD}\r\n{}\n\n", chunk(&"y".repeat(CONTENT + 1)));
    assert_eq!(
        run(big.as_bytes(), &[]).0[1],
        Ev::Err(StreamError::Assemble(AssembleError::ContentFull))
    );
    // A head over the head buffer.
    let head = format!("{SSE_HEAD}X: {}\r\n\r\n", "z".repeat(HEAD));
    assert_eq!(
        run(head.as_bytes(), &[]).0,
        [Ev::Err(StreamError::Http(
            http_nostd::HttpError::HeadersTooLarge
        ))]
    );
}

#[test]
fn after_the_end_nothing_more_is_consumed() {
    let mut storage = Storage::new();
    let mut stream = storage.stream();
    let input = format!(
        "{SSE_HEAD}Content-Length: {}\r\n\r\n{STOP}\n\n",
        STOP.len() + 2
    );
    let mut rest = input.as_bytes();
    let mut events = 0;
    loop {
        let (used, status) = stream.feed(rest).unwrap();
        rest = &rest[used..];
        events += 1;
        if status == Status::Complete(StreamEvent::End) {
            break;
        }
    }
    assert_eq!((events, rest), (3, &b""[..]));
    let end = Ok((0, Status::Complete(StreamEvent::End)));
    assert_eq!(stream.feed(b"after the body"), end);
    assert_eq!(
        stream.finish().map(|m| m.finish_reason.as_str()),
        Ok("stop")
    );
}

/// One set of buffers, two responses: the storage handed back by a stream that failed part-way
/// (head, line, text and message half written) reads the next response as fresh buffers do.
#[test]
fn the_storage_handed_back_reads_the_next_response_as_new() {
    let input = recorded();
    let fresh = run(&input, &[]).1.unwrap();
    let mut storage = Storage::new();
    let mut stream = storage.stream();
    let broken = format!("{SSE_HEAD}\r\n{}\n\ndata: {{\"choi", chunk("left over"));
    let mut rest = broken.as_bytes();
    let mut chunks = 0;
    while !rest.is_empty() {
        let (used, status) = stream.feed(rest).unwrap();
        chunks += usize::from(matches!(status, Status::Complete(StreamEvent::Chunk(_))));
        rest = &rest[used..];
    }
    assert_eq!(chunks, 1);
    let (head, line, text, assembler) = stream.into_storage();
    let (content, reasoning, args) = assembler.into_storage();
    let assembler = Assembler::new(content, reasoning, args);
    let mut stream: ChatStream<'_, HEAD, FIELDS, LINE, CONTENT, REASONING, CALLS, ARGS> =
        ChatStream::new(head, line, text, assembler);
    let mut rest = &input[..];
    while !rest.is_empty() {
        let (used, _) = stream.feed(rest).unwrap();
        rest = &rest[used..];
    }
    let m = stream.finish().unwrap();
    assert_eq!(m.id, fresh.0);
    assert_eq!(m.content.map(str::to_owned), fresh.1);
    assert_eq!(
        m.tool_calls.iter().next().map(|c| c.arguments),
        Some(&fresh.3[0].2[..])
    );
    assert_eq!(
        m.timings.map(|t| (t.cache_n, t.prompt_n, t.predicted_n)),
        fresh.5
    );
}
