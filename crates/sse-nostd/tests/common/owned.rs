// What the parser hands out, owned, and the feed loop that collects it: the one copy behind
// sse-nostd's unit, property and fixture tests, its fuzz target (`crates/fuzz-entries`) and
// llama-proto's fixture tests, each of which includes this file (`#[path]` or `include!`).
// Paths are spelled out in full so that it also compiles inside the `no_std` crate's own unit
// tests.

/// One event, or the error that ended the stream, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    /// A message: its event type, data and last event ID.
    Msg(std::vec::Vec<u8>, std::vec::Vec<u8>, std::vec::Vec<u8>),
    /// A comment line.
    Comment(std::vec::Vec<u8>),
    /// A `retry` field.
    Retry(u64),
    /// The error that ended the stream (always the last element).
    Err(sse_nostd::SseError),
}

impl Ev {
    /// The owned copy of `event`.
    pub fn of(event: sse_nostd::Event<'_>) -> Ev {
        match event {
            sse_nostd::Event::Message(m) => {
                Ev::Msg(m.event.to_vec(), m.data.to_vec(), m.id.to_vec())
            }
            sse_nostd::Event::Comment(c) => Ev::Comment(c.to_vec()),
            sse_nostd::Event::Retry(ms) => Ev::Retry(ms),
            #[allow(unreachable_patterns)]
            other => panic!("an event kind the tests do not know: {other:?}"),
        }
    }
}

/// Feeds `pieces` in order to `parser`, then finishes the stream; an error ends the list.
///
/// Checks the push shape on the way: no call consumes more than it was given, `Partial`
/// consumes everything, and an error is returned again by the next call.
pub fn feed_pieces<'p, S, const N: usize>(
    parser: &mut sse_nostd::Parser<S, N>,
    pieces: impl IntoIterator<Item = &'p [u8]>,
) -> std::vec::Vec<Ev>
where
    S: core::borrow::BorrowMut<[u8; N]>,
{
    let mut out = std::vec::Vec::new();
    for piece in pieces {
        let mut rest = piece;
        loop {
            match parser.feed(rest) {
                Ok((used, sse_nostd::Status::Complete(event))) => {
                    assert!(used <= rest.len(), "consumed more than given");
                    out.push(Ev::of(event));
                    rest = &rest[used..];
                }
                Ok((used, sse_nostd::Status::Partial)) => {
                    assert_eq!(used, rest.len(), "Partial must mean all consumed");
                    break;
                }
                Err(e) => {
                    assert_eq!(parser.feed(b"\n\n"), Err(e), "errors are final");
                    out.push(Ev::Err(e));
                    return out;
                }
            }
        }
    }
    if let Err(e) = parser.finish() {
        out.push(Ev::Err(e));
    }
    out
}

/// [`feed_pieces`] into a fresh parser whose `N`-byte buffer is on the heap.
pub fn parse_pieces<'p, const N: usize>(
    pieces: impl IntoIterator<Item = &'p [u8]>,
) -> std::vec::Vec<Ev> {
    let storage: std::boxed::Box<[u8; N]> = std::vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!("the vec has N bytes"));
    feed_pieces(&mut sse_nostd::Parser::new(storage), pieces)
}
