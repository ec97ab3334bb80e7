//! Property: however the input is split into reads, the reader gives the same head, the same
//! body bytes, and the same error.

use http_nostd::{Event, HttpError, ResponseReader, Status, HEAD_CAP};
use proptest::prelude::*;

/// Head fields and body as plain data, for comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    status: u16,
    reason: String,
    framing: &'static str,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn read_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Result<Outcome, HttpError> {
    let storage: Box<[u8; HEAD_CAP]> = llama_harness::boxed_array();
    let mut reader = ResponseReader::new(storage);
    let mut body = Vec::new();
    'outer: for piece in pieces {
        let mut pos = 0;
        loop {
            let (used, event) = reader.feed(&piece[pos..])?;
            pos += used;
            match event {
                Status::Partial => {
                    assert_eq!(pos, piece.len());
                    break;
                }
                Status::Complete(Event::Head) => {}
                Status::Complete(Event::Body(b)) => body.extend_from_slice(b),
                Status::Complete(Event::End) => break 'outer,
            }
        }
    }
    reader.finish()?;
    let head = reader.head().unwrap();
    Ok(Outcome {
        status: head.status(),
        reason: head.reason().to_string(),
        framing: head.framing().as_str(),
        headers: head
            .headers()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect(),
        body,
    })
}

fn split_at_points(input: &[u8], points: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = points.iter().map(|p| p % (input.len() + 1)).collect();
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut last = 0;
    for c in cuts {
        pieces.push(input[last..c].to_vec());
        last = c;
    }
    pieces.push(input[last..].to_vec());
    pieces
}

/// A well-formed response: its bytes and the body it must decode to.
fn response() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let body = proptest::collection::vec(any::<u8>(), 0..300);
    let chunk_sizes = proptest::collection::vec(1usize..40, 0..20);
    (0u8..4, body, chunk_sizes, any::<bool>(), any::<bool>()).prop_map(
        |(kind, body, sizes, interim, fold)| {
            let mut v = Vec::new();
            if interim {
                v.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            v.extend_from_slice(b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\n");
            if fold {
                v.extend_from_slice(b"X-Folded: a\r\n b\r\n");
            }
            match kind {
                0 => {
                    v.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(),
                    );
                    v.extend_from_slice(&body);
                }
                1 | 2 => {
                    v.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    let mut rest = &body[..];
                    let mut i = 0;
                    while !rest.is_empty() {
                        let n = sizes.get(i).copied().unwrap_or(17).min(rest.len());
                        let ext = if i % 3 == 1 { ";ext=1" } else { "" };
                        v.extend_from_slice(format!("{n:X}{ext}\r\n").as_bytes());
                        v.extend_from_slice(&rest[..n]);
                        v.extend_from_slice(b"\r\n");
                        rest = &rest[n..];
                        i += 1;
                    }
                    v.extend_from_slice(b"0\r\n");
                    if kind == 2 {
                        v.extend_from_slice(b"X-Trailer: done\r\n");
                    }
                    v.extend_from_slice(b"\r\n");
                }
                _ => {
                    v.extend_from_slice(b"\r\n");
                    v.extend_from_slice(&body);
                }
            }
            (v, body)
        },
    )
}

/// Bytes that look like a response but may be broken anywhere.
fn mangled() -> impl Strategy<Value = Vec<u8>> {
    (
        response(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
    )
        .prop_map(|((mut v, _), edits)| {
            for (at, b) in edits {
                let i = at % v.len();
                v[i] = b;
            }
            v
        })
}

#[test]
fn every_split_point_of_a_short_response() {
    let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-F: a\r\n b\r\n\
        Transfer-Encoding: chunked\r\n\r\n3;e\r\nabc\r\n1\r\n\r\r\n0\r\nT: v\r\n\r\n";
    let whole = read_pieces([&input[..]]).unwrap();
    assert_eq!(whole.body, b"abc\r");
    assert_eq!(whole.headers[0], ("X-F".to_string(), b"a   b".to_vec()));
    for i in 0..=input.len() {
        for j in i..=input.len() {
            let got = read_pieces([&input[..i], &input[i..j], &input[j..]]);
            assert_eq!(got.as_ref(), Ok(&whole), "split at {i}, {j}");
        }
    }
    assert_eq!(read_pieces(input.chunks(1)).as_ref(), Ok(&whole));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_split_point_gives_the_same_body((input, body) in response()) {
        let whole = read_pieces([&input[..]]).unwrap();
        prop_assert_eq!(&whole.body, &body);
        for i in 0..=input.len() {
            let got = read_pieces([&input[..i], &input[i..]]);
            prop_assert_eq!(got, Ok(whole.clone()), "split at {}", i);
        }
        prop_assert_eq!(read_pieces(input.chunks(1)), Ok(whole));
    }

    #[test]
    fn random_splits_of_broken_input_agree(input in mangled(), points in proptest::collection::vec(any::<usize>(), 0..40)) {
        let whole = read_pieces([&input[..]]);
        let pieces = split_at_points(&input, &points);
        prop_assert_eq!(read_pieces(pieces.iter().map(|p| &p[..])), whole.clone());
        prop_assert_eq!(read_pieces(input.chunks(1)), whole);
    }
}

proptest! {
    // Long inputs cost more per case in a debug build; fewer cases, many random cut points each.
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_splits_of_a_long_chunked_body(body in proptest::collection::vec(any::<u8>(), 20_000..60_000), points in proptest::collection::vec(any::<usize>(), 1..64)) {
        let mut input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for chunk in body.chunks(230) {
            input.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            input.extend_from_slice(chunk);
            input.extend_from_slice(b"\r\n");
        }
        input.extend_from_slice(b"0\r\n\r\n");
        let pieces = split_at_points(&input, &points);
        let got = read_pieces(pieces.iter().map(|p| &p[..])).unwrap();
        prop_assert_eq!(got.body, body);
    }
}
