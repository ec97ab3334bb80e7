//! http-nostd: no panic on any input, caps hold, and split feeding agrees with whole feeding.
//!
//! The first two bytes pick the read sizes; the rest is the response. A small head cap (512) makes
//! the HeadersTooLarge and TrailersTooLarge paths reachable.

use http_nostd::{BodyBuffer, Event, HttpError, ResponseReader, Status, MAX_HEADERS};

const H: usize = 512;
const N: usize = 1024;

#[derive(Debug, PartialEq)]
struct Outcome {
    status: u16,
    framing: &'static str,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn stream<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> Result<Outcome, HttpError> {
    let mut storage = [0u8; H];
    let mut reader = ResponseReader::<_, H>::new(&mut storage);
    let mut body = Vec::new();
    'outer: for piece in pieces {
        let mut pos = 0;
        loop {
            let (used, event) = reader.feed(&piece[pos..])?;
            assert!(used <= piece.len() - pos, "consumed more than given");
            let rest = &piece[pos..];
            pos += used;
            match event {
                Status::Partial => {
                    assert_eq!(pos, piece.len(), "NeedMore with input left");
                    break;
                }
                Status::Complete(Event::Head) => assert!(reader.head().is_some()),
                Status::Complete(Event::Body(b)) => {
                    assert!(!b.is_empty());
                    // A body slice lies inside the bytes this call consumed.
                    let start = b.as_ptr() as usize - rest.as_ptr() as usize;
                    assert!(start + b.len() <= used);
                    body.extend_from_slice(b);
                }
                Status::Complete(Event::End) => {
                    assert!(reader.is_done());
                    break 'outer;
                }
            }
        }
    }
    reader.finish()?;
    let head = reader.head().expect("a finished response has a head");
    assert!(head.headers().count() <= MAX_HEADERS);
    assert!((100..1000).contains(&head.status()));
    Ok(Outcome {
        status: head.status(),
        framing: head.framing().as_str(),
        headers: head
            .headers()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect(),
        body,
    })
}

fn collect(input: &[u8], step: usize) -> Result<Vec<u8>, HttpError> {
    let mut storage = [0u8; H];
    let mut reader = ResponseReader::<_, H>::new(&mut storage);
    let mut body_storage = [0u8; N];
    let mut body = BodyBuffer::<_, N>::new(&mut body_storage);
    for piece in input.chunks(step) {
        let (used, progress) = reader.feed_into(piece, &mut body)?;
        assert!(body.len() <= N);
        if progress == Status::Complete(()) {
            return Ok(body.as_bytes().to_vec());
        }
        assert_eq!(used, piece.len());
    }
    reader.finish()?;
    Ok(body.as_bytes().to_vec())
}

/// The `http_response` fuzz target: panics when a check fails.
pub fn http_response(data: &[u8]) {
    let [a, b, input @ ..] = data else { return };
    let whole = stream(core::iter::once(input));
    let step = usize::from(*a % 64) + 1;
    assert_eq!(stream(input.chunks(step)), whole, "reads of {step}");
    // Uneven reads: sizes cycle through a few lengths picked by the second byte.
    let sizes = [usize::from(*b & 7) + 1, usize::from(*b >> 3) + 1, 1];
    let mut pieces = Vec::new();
    let mut rest = input;
    for size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (p, r) = rest.split_at((*size).min(rest.len()));
        pieces.push(p);
        rest = r;
    }
    assert_eq!(stream(pieces.into_iter()), whole, "uneven reads");

    // Collecting agrees with streaming, failing exactly when the body is over N bytes.
    match (&whole, collect(input, step)) {
        (Ok(o), Ok(body)) => assert_eq!(o.body, body),
        (Ok(o), Err(HttpError::BodyTooLarge)) => {
            let announced = o.framing == "length" && o.body.len() > N;
            assert!(
                o.body.len() > N || announced,
                "BodyTooLarge for {} bytes",
                o.body.len()
            );
        }
        (Err(e), Err(c)) => assert!(*e == c || c == HttpError::BodyTooLarge, "{e:?} vs {c:?}"),
        (w, c) => panic!("stream {w:?} vs collect {c:?}"),
    }
}
