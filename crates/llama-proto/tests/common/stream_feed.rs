// The feed loop over a `ChatStream`, with the push shape checked on the way: the one copy
// behind llama-proto's stream tests and the `chat_stream` fuzz target (`crates/fuzz-entries`),
// each of which includes this file. Paths are spelled out in full for the includers' sake.

/// Feeds `pieces` to `stream` in order, handing each event to `on_event` until it returns
/// false (at `End`, say). Checks that no call consumes more than it was given, that `Partial`
/// consumes everything, and that an error is final. Returns the error that stopped the
/// feeding, if one did (`finish` returns it again).
pub fn feed_pieces<
    'p,
    const H: usize,
    const F: usize,
    const L: usize,
    const C: usize,
    const R: usize,
    const K: usize,
    const A: usize,
>(
    stream: &mut llama_proto::ChatStream<'_, H, F, L, C, R, K, A>,
    pieces: impl IntoIterator<Item = &'p [u8]>,
    mut on_event: impl FnMut(llama_proto::StreamEvent<'_>) -> bool,
) -> Option<llama_proto::StreamError> {
    for piece in pieces {
        let mut rest = piece;
        loop {
            let (used, status) = match stream.feed(rest) {
                Ok(r) => r,
                Err(e) => {
                    assert_eq!(stream.feed(b"\n").err(), Some(e), "errors are final");
                    return Some(e);
                }
            };
            assert!(used <= rest.len(), "consumed more than given");
            rest = &rest[used..];
            match status {
                llama_proto::Status::Partial => {
                    assert!(rest.is_empty(), "Partial must mean all consumed");
                    break;
                }
                llama_proto::Status::Complete(event) => {
                    if !on_event(event) {
                        return None;
                    }
                }
            }
        }
    }
    None
}
