//! One test per rule, with the input bytes in the test, at each limit and one past it.

use std::boxed::Box;
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use crate::*;

/// What a whole read produced, for exact comparisons.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Read {
    pub version: Version,
    pub status: u16,
    pub reason: String,
    pub framing: Framing,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

pub(crate) fn heap_head() -> Box<[u8; HEAD_CAP]> {
    vec![0u8; HEAD_CAP].into_boxed_slice().try_into().unwrap()
}

/// Feeds `pieces` in order as separate reads, then ends the input.
pub(crate) fn read_pieces<'a>(
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Read, HttpError> {
    let mut reader = ResponseReader::new(heap_head());
    let mut body = Vec::new();
    'outer: for piece in pieces {
        let mut pos = 0;
        loop {
            let (used, event) = reader.feed(&piece[pos..])?;
            assert!(used <= piece.len() - pos);
            pos += used;
            match event {
                Status::Partial => {
                    assert_eq!(pos, piece.len());
                    break;
                }
                Status::Complete(Event::Head) => {}
                Status::Complete(Event::Body(b)) => {
                    assert!(!b.is_empty());
                    body.extend_from_slice(b)
                }
                Status::Complete(Event::End) => break 'outer,
            }
        }
    }
    reader.finish()?;
    let head = reader.head().expect("finish Ok implies a head");
    Ok(Read {
        version: head.version(),
        status: head.status(),
        reason: head.reason().to_string(),
        framing: head.framing(),
        headers: head
            .headers()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect(),
        body,
    })
}

pub(crate) fn read(input: &[u8]) -> Result<Read, HttpError> {
    read_pieces([input])
}

fn body_of(input: &[u8]) -> Result<(Framing, Vec<u8>), HttpError> {
    read(input).map(|r| (r.framing, r.body))
}

fn err(input: &[u8]) -> HttpError {
    read(input).unwrap_err()
}

#[test]
fn content_length_body_and_exact_head() {
    let r =
        read(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap();
    assert_eq!(
        r,
        Read {
            version: Version::Http11,
            status: 200,
            reason: "OK".into(),
            framing: Framing::Length(2),
            headers: vec![
                ("Content-Type".into(), b"application/json".to_vec()),
                ("Content-Length".into(), b"2".to_vec()),
            ],
            body: b"{}".to_vec(),
        }
    );
}

#[test]
fn content_length_short_is_truncated() {
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab"),
        HttpError::Truncated
    );
}

#[test]
fn content_length_zero_ends_without_input() {
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    let input = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nXYZ";
    assert_eq!(
        r.feed(input),
        Ok((input.len() - 3, Status::Complete(Event::Head)))
    );
    assert_eq!(
        r.feed(&input[input.len() - 3..]),
        Ok((0, Status::Complete(Event::End)))
    );
    assert!(r.is_done());
    assert_eq!(r.finish(), Ok(()));
}

#[test]
fn bytes_after_a_length_body_are_left_unconsumed() {
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    let input = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiEXTRA";
    let (n, e) = r.feed(input).unwrap();
    assert_eq!(e, Status::Complete(Event::Head));
    assert_eq!(
        r.feed(&input[n..]),
        Ok((2, Status::Complete(Event::Body(b"hi"))))
    );
    assert_eq!(
        r.feed(&input[n + 2..]),
        Ok((0, Status::Complete(Event::End)))
    );
}

#[test]
fn chunked_body_with_extensions_and_trailers() {
    let (f, body) = body_of(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;name=value\r\nhello\r\n1 ; x\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\nY: \r\n\r\n",
    )
    .unwrap();
    assert_eq!(f, Framing::Chunked);
    assert_eq!(body, b"hello 0123456789");
}

#[test]
fn chunk_body_slices_borrow_the_input() {
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    let input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (n, _) = r.feed(input).unwrap();
    let (m, e) = r.feed(&input[n..]).unwrap();
    assert_eq!((m, e), (8, Status::Complete(Event::Body(b"abc"))));
    if let Status::Complete(Event::Body(b)) = e {
        assert_eq!(b.as_ptr(), input[n + 3..].as_ptr());
    }
    assert_eq!(
        r.feed(&input[n + m..]),
        Ok((5, Status::Complete(Event::End)))
    );
}

#[test]
fn chunk_data_needs_crlf_after_it() {
    let h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for tail in [
        "5\r\nhelloX\r\n0\r\n\r\n",
        "5\r\nhello\rX0\r\n\r\n",
        "5\r\nhello\n0\r\n\r\n",
    ] {
        let input = [h, tail].concat();
        assert_eq!(
            err(input.as_bytes()),
            HttpError::MissingChunkCrlf,
            "{tail:?}"
        );
    }
}

#[test]
fn chunk_size_digits_limit() {
    let h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    // 15 digits (leading zeros count) is the limit and works.
    let ok = [h, "00000000000000a\r\n0123456789\r\n0\r\n\r\n"].concat();
    assert_eq!(body_of(ok.as_bytes()).unwrap().1, b"0123456789");
    // The largest 15-digit size is accepted and then the input runs out.
    let big = [h, "fffffffffffffff\r\nabc"].concat();
    assert_eq!(err(big.as_bytes()), HttpError::Truncated);
    // 16 digits: refused before any overflow could happen.
    for tail in [
        "000000000000000a\r\n",
        "ffffffffffffffff\r\n",
        "10000000000000000\r\n",
    ] {
        let input = [h, tail].concat();
        assert_eq!(
            err(input.as_bytes()),
            HttpError::ChunkSizeTooLong,
            "{tail:?}"
        );
    }
}

#[test]
fn chunk_size_must_be_strict_hex() {
    let h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for tail in [
        "\r\n",
        " 5\r\nhello\r\n",
        "-5\r\n",
        "0x5\r\n",
        "5\nhello\r\n",
        "5;ext\nhello\r\n",
        "5\rx\n",
        "g\r\n",
        ";e\r\n",
    ] {
        let input = [h, tail].concat();
        assert_eq!(
            err(input.as_bytes()),
            HttpError::InvalidChunkSize,
            "{tail:?}"
        );
    }
}

fn chunk_line_of(len: usize) -> Vec<u8> {
    // "1;" + padding + "\r\n" is `len` bytes, then one data byte.
    let mut v = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
    v.extend(std::iter::repeat_n(b'e', len - 4));
    v.extend_from_slice(b"\r\nz\r\n0\r\n\r\n");
    v
}

#[test]
fn chunk_extension_bound() {
    assert_eq!(body_of(&chunk_line_of(CHUNK_LINE_CAP)).unwrap().1, b"z");
    assert_eq!(
        err(&chunk_line_of(CHUNK_LINE_CAP + 1)),
        HttpError::ChunkLineTooLong
    );
    // The same bound holds when the line arrives a byte at a time.
    let input = chunk_line_of(CHUNK_LINE_CAP + 1);
    assert_eq!(
        read_pieces(input.chunks(1)).unwrap_err(),
        HttpError::ChunkLineTooLong
    );
    let input = chunk_line_of(CHUNK_LINE_CAP);
    assert_eq!(read_pieces(input.chunks(1)).unwrap().body, b"z");
}

fn trailers_of(len: usize) -> Vec<u8> {
    // The trailer section (after "0\r\n") is "T: " + padding + "\r\n\r\n", `len` bytes.
    let mut v = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: ".to_vec();
    v.extend(std::iter::repeat_n(b'v', len - 7));
    v.extend_from_slice(b"\r\n\r\n");
    v
}

#[test]
fn trailer_section_is_capped_by_the_head_cap() {
    assert_eq!(
        body_of(&trailers_of(HEAD_CAP)).unwrap(),
        (Framing::Chunked, Vec::new())
    );
    assert_eq!(err(&trailers_of(HEAD_CAP + 1)), HttpError::TrailersTooLarge);
}

#[test]
fn malformed_trailers_are_errors() {
    let h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n";
    for tail in [
        "Bad Name: x\r\n\r\n",
        "NoColon\r\n\r\n",
        "T: v\n\r\n",
        "T: v\r\n\n",
        " T: v\r\n\r\n",
        "T: a\x00b\r\n\r\n",
        "\rx",
    ] {
        let input = [h, tail].concat();
        assert_eq!(err(input.as_bytes()), HttpError::InvalidTrailer, "{tail:?}");
    }
}

#[test]
fn chunked_cut_short_is_truncated() {
    let h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for tail in [
        "",
        "5",
        "5\r\nhel",
        "5\r\nhello",
        "5\r\nhello\r\n",
        "5\r\nhello\r\n0\r\n",
        "5\r\nhello\r\n0\r\nT: v\r\n",
    ] {
        let input = [h, tail].concat();
        assert_eq!(err(input.as_bytes()), HttpError::Truncated, "{tail:?}");
    }
}

#[test]
fn transfer_coding_decides_chunked_or_close() {
    let cases: [(&str, Result<Framing, HttpError>); 10] = [
        ("Transfer-Encoding: chunked", Ok(Framing::Chunked)),
        ("transfer-ENCODING: CHUNKED", Ok(Framing::Chunked)),
        ("Transfer-Encoding: gzip, chunked", Ok(Framing::Chunked)),
        (
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
            Ok(Framing::Chunked),
        ),
        ("Transfer-Encoding: gzip", Ok(Framing::Close)),
        ("Transfer-Encoding: chunked, gzip", Ok(Framing::Close)),
        (
            "Transfer-Encoding: chunked, chunked",
            Err(HttpError::InvalidTransferEncoding),
        ),
        (
            "Transfer-Encoding: ",
            Err(HttpError::InvalidTransferEncoding),
        ),
        (
            "Transfer-Encoding: , ,",
            Err(HttpError::InvalidTransferEncoding),
        ),
        (
            "Transfer-Encoding: chu\"nked",
            Err(HttpError::InvalidTransferEncoding),
        ),
    ];
    for (header, want) in cases {
        let input = std::format!("HTTP/1.1 200 OK\r\n{header}\r\n\r\n0\r\n\r\n");
        let mut buf = heap_head();
        let mut r = ResponseReader::new(&mut *buf);
        let got = r
            .feed(input.as_bytes())
            .map(|_| r.head().unwrap().framing());
        assert_eq!(got, want, "{header:?}");
    }
}

#[test]
fn close_delimited_body_ends_cleanly_at_end_of_input() {
    let (f, body) =
        body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw bytes").unwrap();
    assert_eq!((f, body.as_slice()), (Framing::Close, &b"raw bytes"[..]));
    let r = read(b"HTTP/1.0 200 OK\r\n\r\nold").unwrap();
    assert_eq!(
        (r.version, r.framing, r.body.as_slice()),
        (Version::Http10, Framing::Close, &b"old"[..])
    );
}

#[test]
fn transfer_encoding_with_content_length_is_an_error() {
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
        HttpError::TransferEncodingWithContentLength
    );
    assert_eq!(
        err(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
        HttpError::TransferEncodingInHttp10
    );
}

#[test]
fn content_length_values() {
    let ok: [(&str, u64); 4] = [
        ("Content-Length: 2", 2),
        ("Content-Length: 2, 2", 2),
        ("Content-Length: 2\r\ncontent-length: 2", 2),
        ("Content-Length: 00002", 2),
    ];
    for (header, n) in ok {
        let input = std::format!("HTTP/1.1 200 OK\r\n{header}\r\n\r\nhi");
        assert_eq!(
            body_of(input.as_bytes()).unwrap(),
            (Framing::Length(n), b"hi".to_vec())
        );
    }
    let max = b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n";
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    assert_eq!(r.feed(max), Ok((max.len(), Status::Complete(Event::Head))));
    assert_eq!(r.head().unwrap().framing(), Framing::Length(u64::MAX));
    let bad: [(&str, HttpError); 9] = [
        (
            "Content-Length: 2\r\nContent-Length: 3",
            HttpError::ConflictingContentLength,
        ),
        ("Content-Length: 2, 3", HttpError::ConflictingContentLength),
        (
            "Content-Length: 18446744073709551616",
            HttpError::InvalidContentLength,
        ),
        ("Content-Length: ", HttpError::InvalidContentLength),
        ("Content-Length: -1", HttpError::InvalidContentLength),
        ("Content-Length: +2", HttpError::InvalidContentLength),
        ("Content-Length: 2 2", HttpError::InvalidContentLength),
        ("Content-Length: 0x2", HttpError::InvalidContentLength),
        ("Content-Length: 2,", HttpError::InvalidContentLength),
    ];
    for (header, e) in bad {
        let input = std::format!("HTTP/1.1 200 OK\r\n{header}\r\n\r\nhi");
        assert_eq!(err(input.as_bytes()), e, "{header:?}");
    }
}

#[test]
fn no_body_statuses_ignore_framing_headers() {
    for status in ["204 No Content", "304 Not Modified"] {
        let input = std::format!(
            "HTTP/1.1 {status}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let r = read(input.as_bytes()).unwrap();
        assert_eq!((r.framing, r.body), (Framing::None, Vec::new()));
    }
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    let input = b"HTTP/1.1 204 No Content\r\n\r\nstray";
    assert_eq!(
        r.feed(input),
        Ok((input.len() - 5, Status::Complete(Event::Head)))
    );
    assert_eq!(r.feed(b"stray"), Ok((0, Status::Complete(Event::End))));
}

#[test]
fn interim_responses_are_skipped() {
    let r = read(b"HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").unwrap();
    assert_eq!(
        (r.status, r.headers.len(), r.body.as_slice()),
        (200, 1, &b"hi"[..])
    );
    assert_eq!(
        err(b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        HttpError::SwitchingProtocols
    );
}

fn interims(n: usize) -> Vec<u8> {
    let mut v = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(n);
    v.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx");
    v
}

#[test]
fn interim_response_limit() {
    assert_eq!(read(&interims(MAX_INTERIM_RESPONSES)).unwrap().body, b"x");
    assert_eq!(
        err(&interims(MAX_INTERIM_RESPONSES + 1)),
        HttpError::TooManyInterimResponses
    );
}

#[test]
fn obs_fold_reads_as_spaces() {
    let r = read(
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\n\tc\r\nX-Next: d\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(
        r.headers,
        vec![
            ("X-Folded".into(), b"a   b  \tc".to_vec()),
            ("X-Next".into(), b"d".to_vec()),
            ("Content-Length".into(), b"0".to_vec()),
        ]
    );
    // A fold inside Content-Length leaves "1   0", which is no number.
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n 0\r\n\r\n"),
        HttpError::InvalidContentLength
    );
}

#[test]
fn header_lookup_is_case_insensitive() {
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    r.feed(b"HTTP/1.1 200 OK\r\ncontent-TYPE: text/event-stream\r\n\r\n")
        .unwrap();
    let head = r.head().unwrap();
    assert_eq!(head.header("Content-Type"), Some(&b"text/event-stream"[..]));
    assert_eq!(head.header("CONTENT-TYPE"), Some(&b"text/event-stream"[..]));
    assert_eq!(head.header("Content-Length"), None);
}

fn head_of(len: usize) -> Vec<u8> {
    // "HTTP/1.1 200 OK\r\nX: " + padding + "\r\n\r\n" is `len` bytes.
    let mut v = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
    let pad = len - v.len() - 4;
    v.extend(std::iter::repeat_n(b'p', pad));
    v.extend_from_slice(b"\r\n\r\nbody");
    v
}

#[test]
fn head_cap_exactly_and_one_past() {
    let r = read(&head_of(HEAD_CAP)).unwrap();
    assert_eq!(
        (r.framing, r.body.as_slice()),
        (Framing::Close, &b"body"[..])
    );
    assert_eq!(r.headers[0].1.len(), HEAD_CAP - 24);
    assert_eq!(err(&head_of(HEAD_CAP + 1)), HttpError::HeadersTooLarge);
    // Split reads reach the same verdicts.
    assert_eq!(
        read_pieces(head_of(HEAD_CAP).chunks(1000)).unwrap().body,
        b"body"
    );
    assert_eq!(
        read_pieces(head_of(HEAD_CAP + 1).chunks(1000)).unwrap_err(),
        HttpError::HeadersTooLarge
    );
}

fn with_headers(n: usize) -> Vec<u8> {
    let mut v = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..n {
        v.extend_from_slice(std::format!("H{i}: {i}\r\n").as_bytes());
    }
    v.extend_from_slice(b"\r\n");
    v
}

#[test]
fn header_count_limit() {
    assert_eq!(
        read(&with_headers(MAX_HEADERS)).unwrap().headers.len(),
        MAX_HEADERS
    );
    assert_eq!(
        err(&with_headers(MAX_HEADERS + 1)),
        HttpError::TooManyHeaders
    );
}

/// The offset table is small for up to `FEW_HEADERS` fields and full-size past that: every field
/// reads back, in order, on both sides of the switch, also when the head is reparsed after a
/// split read and after an interim response had used the table first.
#[test]
fn header_table_sizes_read_back_every_field() {
    use crate::head::FEW_HEADERS;
    for n in [0, 1, FEW_HEADERS, FEW_HEADERS + 1, MAX_HEADERS] {
        let expected: Vec<(String, Vec<u8>)> = (0..n)
            .map(|i| (std::format!("H{i}"), i.to_string().into_bytes()))
            .collect();
        let input = with_headers(n);
        assert_eq!(read(&input).unwrap().headers, expected, "{n} fields");
        assert_eq!(read_pieces(input.chunks(7)).unwrap().headers, expected);
        let mut interim = with_headers(FEW_HEADERS + 1);
        interim[9..12].copy_from_slice(b"100");
        interim.extend_from_slice(&input);
        assert_eq!(read(&interim).unwrap().headers, expected);
    }
}

#[test]
fn malformed_heads() {
    let cases: [(&[u8], HttpError); 7] = [
        (b"HTTP/2 200 OK\r\n\r\n", HttpError::InvalidVersion),
        (b"HTTP/1.1 20 OK\r\n\r\n", HttpError::InvalidStatusLine),
        (b"HTTP/1.1 099 Low\r\n\r\n", HttpError::InvalidStatusLine),
        (
            b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            HttpError::InvalidHeaderName,
        ),
        (
            b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
            HttpError::InvalidHeaderValue,
        ),
        (
            b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
            HttpError::InvalidHeaderValue,
        ),
        (b"HTTP/1.1 200 OK\r\n\rX", HttpError::InvalidLineEnding),
    ];
    for (input, e) in cases {
        assert_eq!(err(input), e, "{:?}", String::from_utf8_lossy(input));
    }
}

#[test]
fn reason_phrase_with_obs_text_reads_empty() {
    assert_eq!(read(b"HTTP/1.1 200 \xffK\r\n\r\n").unwrap().reason, "");
    assert_eq!(read(b"HTTP/1.1 200\r\n\r\n").unwrap().reason, "");
}

#[test]
fn end_of_input_inside_the_head() {
    assert_eq!(err(b""), HttpError::IncompleteHead);
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nX: y\r\n"),
        HttpError::IncompleteHead
    );
}

#[test]
fn errors_are_sticky() {
    let mut buf = heap_head();
    let mut r = ResponseReader::new(&mut *buf);
    assert_eq!(r.feed(b"HTTP/9"), Err(HttpError::InvalidVersion));
    assert_eq!(
        r.feed(b"HTTP/1.1 200 OK\r\n\r\n"),
        Err(HttpError::InvalidVersion)
    );
    assert_eq!(r.finish(), Err(HttpError::InvalidVersion));
}

/// Reads `input` into a BodyBuffer of `N` bytes, in pieces of `step`.
fn collect<const N: usize>(input: &[u8], step: usize) -> Result<Vec<u8>, HttpError> {
    let mut r = ResponseReader::new(heap_head());
    let storage: Box<[u8; N]> = vec![0u8; N].into_boxed_slice().try_into().unwrap();
    let mut body = BodyBuffer::new(storage);
    for piece in input.chunks(step) {
        let (_, p) = r.feed_into(piece, &mut body)?;
        if p == Status::Complete(()) {
            return Ok(body.as_bytes().to_vec());
        }
    }
    r.finish()?;
    Ok(body.as_bytes().to_vec())
}

#[test]
fn body_buffer_cap_small() {
    assert_eq!(
        collect::<4>(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd", 3).unwrap(),
        b"abcd"
    );
    assert_eq!(
        collect::<4>(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", 3),
        Err(HttpError::BodyTooLarge)
    );
    let chunked =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n";
    assert_eq!(collect::<4>(chunked, 5).unwrap(), b"abcd");
    assert_eq!(collect::<3>(chunked, 5), Err(HttpError::BodyTooLarge));
    assert_eq!(
        collect::<4>(b"HTTP/1.1 200 OK\r\n\r\nabcd", 2).unwrap(),
        b"abcd"
    );
    assert_eq!(
        collect::<4>(b"HTTP/1.1 200 OK\r\n\r\nabcde", 2),
        Err(HttpError::BodyTooLarge)
    );
}

fn big_response(chunked: bool, len: usize) -> Vec<u8> {
    let mut v = if chunked {
        std::format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{len:x}\r\n")
            .into_bytes()
    } else {
        std::format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").into_bytes()
    };
    let start = v.len();
    v.resize(start + len, 0);
    for (i, b) in v[start..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    if chunked {
        v.extend_from_slice(b"\r\n0\r\n\r\n");
    }
    v
}

#[test]
fn body_cap_4_mib_exactly_and_one_past() {
    // Inputs and storage live on the heap; debug build, default 2 MiB test thread.
    for chunked in [false, true] {
        let ok = big_response(chunked, BODY_CAP);
        let body = collect::<BODY_CAP>(&ok, 64 * 1024).unwrap();
        assert_eq!(body.len(), BODY_CAP);
        assert!(body.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let over = big_response(chunked, BODY_CAP + 1);
        assert_eq!(
            collect::<BODY_CAP>(&over, 64 * 1024),
            Err(HttpError::BodyTooLarge)
        );
    }
}

#[test]
fn error_kinds_and_messages() {
    assert_eq!(HttpError::Truncated.as_str(), "Truncated");
    assert_eq!(
        std::format!("{}", HttpError::HeadersTooLarge),
        "response head larger than the head buffer"
    );
    assert_eq!(Framing::Length(3).as_str(), "length");
}

#[test]
fn a_fault_in_an_unfinished_head_is_named_whatever_the_reads() {
    let pieces: [&[u8]; 2] = [b"HTTP/1.1 200 OK\r\n", b"Bad Name: x\r\n"];
    assert_eq!(
        read_pieces(pieces).unwrap_err(),
        HttpError::InvalidHeaderName
    );
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nBad Name: x\r\n"),
        HttpError::InvalidHeaderName
    );
    // Dripped a byte at a time, a head with many folded lines still reads the same.
    let mut input = b"HTTP/1.1 200 OK\r\nX: a".to_vec();
    input.extend(b"\r\n b".repeat(500));
    input.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
    let r = read_pieces(input.chunks(1)).unwrap();
    assert_eq!(r.headers[0].1.len(), 1 + 500 * 4);
    assert_eq!(r.headers[0].1, read(&input).unwrap().headers[0].1);
}

/// The reader's own state (besides the head buffer) is what every response pays to set up; it
/// lost its 1 KiB chunk-line buffer, and this keeps it from growing back unnoticed.
#[test]
fn reader_state_stays_small() {
    let reader = core::mem::size_of::<ResponseReader<&mut [u8; HEAD_CAP]>>();
    let offsets = MAX_HEADERS * 16;
    assert!(reader <= offsets + 192, "{reader} bytes");
    assert!(core::mem::size_of::<ChunkedDecoder>() <= 64);
}

/// Reads `input` in pieces of `step` with a reader of `H` head bytes and `F` header fields;
/// returns the header count and the body.
fn read_capped<const H: usize, const F: usize>(
    input: &[u8],
    step: usize,
) -> Result<(usize, Vec<u8>), HttpError> {
    let mut storage = [0u8; H];
    let mut reader = ResponseReader::<_, H, F>::with_field_cap(&mut storage);
    let mut body = Vec::new();
    'outer: for piece in input.chunks(step) {
        let mut pos = 0;
        loop {
            let (used, event) = reader.feed(&piece[pos..])?;
            pos += used;
            match event {
                Status::Partial => break,
                Status::Complete(Event::Head) => {}
                Status::Complete(Event::Body(b)) => body.extend_from_slice(b),
                Status::Complete(Event::End) => break 'outer,
            }
        }
    }
    reader.finish()?;
    Ok((reader.head().expect("a head").headers().count(), body))
}

/// A small host's caps behave as the defaults do: the same errors at the limit and one past,
/// whole or split into reads.
#[test]
fn small_caps_at_the_limit_and_one_past() {
    for step in [1, 7, usize::MAX] {
        // Head buffer of 64 bytes.
        assert_eq!(
            read_capped::<64, 4>(&head_of(64), step),
            Ok((1, b"body".to_vec()))
        );
        assert_eq!(
            read_capped::<64, 4>(&head_of(65), step),
            Err(HttpError::HeadersTooLarge)
        );
        // Two header fields, and as many as the small offset table holds.
        assert_eq!(
            read_capped::<256, 2>(&with_headers(2), step),
            Ok((2, Vec::new()))
        );
        assert_eq!(
            read_capped::<256, 2>(&with_headers(3), step),
            Err(HttpError::TooManyHeaders)
        );
        const FEW: usize = crate::head::FEW_HEADERS;
        assert_eq!(
            read_capped::<512, FEW>(&with_headers(FEW), step),
            Ok((FEW, Vec::new()))
        );
        assert_eq!(
            read_capped::<512, FEW>(&with_headers(FEW + 1), step),
            Err(HttpError::TooManyHeaders)
        );
        // The trailer section is capped by the same 64 bytes.
        assert_eq!(
            read_capped::<64, 4>(&trailers_of(64), step),
            Ok((1, Vec::new()))
        );
        assert_eq!(
            read_capped::<64, 4>(&trailers_of(65), step),
            Err(HttpError::TrailersTooLarge)
        );
    }
}

/// The header offsets grow with the field cap and no further: 16 bytes a field, never fewer
/// than the small table's.
#[test]
fn reader_state_follows_the_field_cap() {
    use crate::head::FEW_HEADERS;
    let size = |f: usize| match f {
        2 => core::mem::size_of::<ResponseReader<&mut [u8; 64], 64, 2>>(),
        16 => core::mem::size_of::<ResponseReader<&mut [u8; 64], 64, 16>>(),
        _ => core::mem::size_of::<ResponseReader<&mut [u8; 64], 64, 64>>(),
    };
    assert_eq!(size(2), size(FEW_HEADERS));
    assert_eq!(size(64) - size(16), (64 - FEW_HEADERS) * 16);
}
