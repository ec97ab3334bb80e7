//! The recorded raw response `fixtures/chunked_response.http` (llama-server's streamed answer
//! to the `plain` request, read off a socket) reads into its head and its de-chunked body,
//! however the bytes are split; cut short of its last chunk it is `Truncated`.
//!
//! The expected head and body are computed here without the reader: a split of the head on
//! CRLF and a hand de-chunking of the body (the recorder's chunks carry no extensions and no
//! trailers; that is checked, not assumed).

use http_nostd::{
    BodyBuffer, Event, Framing, HttpError, ResponseReader, Status, Version, BODY_CAP, HEAD_CAP,
};

fn fixture() -> Vec<u8> {
    llama_harness::fixture("chunked_response.http")
}

/// The fixture split by hand: (status line, header fields in order, the raw chunked body).
fn split_head(bytes: &[u8]) -> (String, Vec<(String, String)>, &[u8]) {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the head ends in an empty line");
    let head = std::str::from_utf8(&bytes[..end]).expect("the head is ASCII");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap().to_owned();
    let fields = lines
        .map(|line| {
            let (name, value) = line.split_once(':').expect("a field line has a colon");
            (name.to_owned(), value.trim_matches([' ', '\t']).to_owned())
        })
        .collect();
    (status_line, fields, &bytes[end + 4..])
}

/// De-chunks `body` by hand: hex size, CRLF, data, CRLF; ends at the `0` chunk with no
/// trailers, which must be the last bytes.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk-size line ends in CRLF");
        let size_text = std::str::from_utf8(&body[..eol]).unwrap();
        let size = usize::from_str_radix(size_text, 16)
            .unwrap_or_else(|_| panic!("a bare hex chunk size, got {size_text:?}"));
        body = &body[eol + 2..];
        if size == 0 {
            assert_eq!(body, b"\r\n", "no trailers, nothing after the last chunk");
            return out;
        }
        out.extend_from_slice(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n", "CRLF after chunk data");
        body = &body[size + 2..];
    }
}

/// What the reader said about one response.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    version: Version,
    status: u16,
    reason: String,
    framing: Framing,
    headers: Vec<(String, Vec<u8>)>,
    content_type: Option<Vec<u8>>,
    body: Vec<u8>,
    finish: Result<(), HttpError>,
}

/// Feeds `input` in reads of `read` bytes (the head buffer on the heap), then finishes.
fn read_in_pieces(input: &[u8], read: usize) -> Read {
    let storage: Box<[u8; HEAD_CAP]> = llama_harness::boxed_array();
    let mut reader = ResponseReader::new(storage);
    let mut body = Vec::new();
    let mut heads = 0;
    'input: for piece in input.chunks(read) {
        let mut pos = 0;
        loop {
            let (used, event) = reader
                .feed(&piece[pos..])
                .expect("the fixture is well formed");
            pos += used;
            match event {
                Status::Partial => {
                    assert_eq!(pos, piece.len(), "NeedMore consumed everything");
                    break;
                }
                Status::Complete(Event::Head) => heads += 1,
                Status::Complete(Event::Body(bytes)) => {
                    assert!(!bytes.is_empty(), "body slices are non-empty");
                    body.extend_from_slice(bytes);
                }
                Status::Complete(Event::End) => {
                    assert!(reader.is_done());
                    break 'input;
                }
            }
        }
    }
    let finish = reader.finish();
    assert_eq!(heads, 1, "one Head event");
    let head = reader.head().expect("the head was read");
    Read {
        version: head.version(),
        status: head.status(),
        reason: head.reason().to_owned(),
        framing: head.framing(),
        headers: head
            .headers()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect(),
        content_type: head.header("cOnTeNt-TyPe").map(<[u8]>::to_vec),
        body,
        finish,
    }
}

#[test]
fn the_hand_reading_of_the_fixture_is_what_this_test_expects() {
    let bytes = fixture();
    let (status_line, fields, chunked) = split_head(&bytes);
    assert_eq!(status_line, "HTTP/1.1 200 OK");
    assert!(fields.contains(&("Transfer-Encoding".into(), "chunked".into())));
    let body = dechunk(chunked);
    assert!(body.starts_with(b"data: {"), "{:?}", &body[..20]);
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    // More than one chunk, so chunk boundaries are exercised.
    assert!(chunked.len() > body.len() + 2 * 5);
}

#[test]
fn the_recorded_response_reads_the_same_whole_byte_by_byte_and_in_1460_byte_reads() {
    let bytes = fixture();
    let (_, fields, chunked) = split_head(&bytes);
    let want_body = dechunk(chunked);
    let want_headers: Vec<(String, Vec<u8>)> = fields
        .into_iter()
        .map(|(n, v)| (n, v.into_bytes()))
        .collect();
    for read in [bytes.len(), 1, 1460] {
        let got = read_in_pieces(&bytes, read);
        assert_eq!(got.finish, Ok(()), "{read}-byte reads: finish");
        assert_eq!(got.version, Version::Http11, "{read}");
        assert_eq!(got.status, 200, "{read}");
        assert_eq!(got.reason, "OK", "{read}");
        assert_eq!(got.framing, Framing::Chunked, "{read}");
        assert_eq!(got.headers, want_headers, "{read}-byte reads: headers");
        assert_eq!(
            got.content_type.as_deref(),
            Some(&b"text/event-stream"[..]),
            "{read}"
        );
        assert!(
            got.body == want_body,
            "{read}-byte reads: body differs from the hand de-chunking"
        );
        assert!(got.body.starts_with(b"data: {"), "{read}");
        assert!(got.body.ends_with(b"data: [DONE]\n\n"), "{read}");
    }
}

#[test]
fn the_recorded_response_collects_into_a_4_mib_heap_body_buffer() {
    let bytes = fixture();
    let (_, _, chunked) = split_head(&bytes);
    let head: Box<[u8; HEAD_CAP]> = llama_harness::boxed_array();
    let body: Box<[u8; BODY_CAP]> = llama_harness::boxed_array();
    let (mut reader, mut body) = (ResponseReader::new(head), BodyBuffer::new(body));
    assert_eq!(
        reader.feed_into(&bytes, &mut body),
        Ok((bytes.len(), Status::Complete(())))
    );
    assert_eq!(reader.finish(), Ok(()));
    assert!(body.as_bytes() == dechunk(chunked));
}

#[test]
fn cut_anywhere_inside_the_final_zero_chunk_is_truncated() {
    let bytes = fixture();
    assert!(bytes.ends_with(b"\r\n0\r\n\r\n"));
    let (_, _, chunked) = split_head(&bytes);
    let want_body = dechunk(chunked);
    // One byte short of the final `0\r\n\r\n`, down to all of it missing.
    for short in 1..=5 {
        let cut = &bytes[..bytes.len() - short];
        for read in [cut.len(), 1, 1460] {
            let got = read_in_pieces(cut, read);
            assert_eq!(
                got.finish,
                Err(HttpError::Truncated),
                "{short} bytes short, {read}-byte reads"
            );
            // Every data chunk was whole: the body so far is all of it.
            assert!(
                got.body == want_body,
                "{short} bytes short, {read}-byte reads: body"
            );
        }
    }
}
