//! One test per rule of the event-stream format and per limit, with the bytes inline.

use std::vec::Vec;

use crate::{Event, Parser, SseError, Status};

#[path = "../tests/common/owned.rs"]
mod owned;
use owned::{feed_pieces, parse_pieces, Ev};

fn msg(event: &str, data: &str, id: &str) -> Ev {
    Ev::Msg(event.into(), data.into(), id.into())
}

fn comment(text: &str) -> Ev {
    Ev::Comment(text.into())
}

/// Feeds `chunks` in order, then finishes; an error ends the list.
fn run_with<S: core::borrow::BorrowMut<[u8; N]>, const N: usize>(
    parser: &mut Parser<S, N>,
    chunks: &[&[u8]],
) -> Vec<Ev> {
    feed_pieces(parser, chunks.iter().copied())
}

fn run<const N: usize>(chunks: &[&[u8]]) -> Vec<Ev> {
    parse_pieces::<N>(chunks.iter().copied())
}

/// The events of `input` fed whole, after checking that byte-by-byte feeding agrees.
fn parse(input: &[u8]) -> Vec<Ev> {
    let whole = run::<256>(&[input]);
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(run::<256>(&bytes), whole, "byte-by-byte feeding disagrees");
    whole
}

#[test]
fn lf_cr_and_crlf_each_end_a_line() {
    assert_eq!(parse(b"data: a\n\n"), [msg("message", "a", "")]);
    assert_eq!(parse(b"data: a\r\r"), [msg("message", "a", "")]);
    assert_eq!(parse(b"data: a\r\n\r\n"), [msg("message", "a", "")]);
    assert_eq!(parse(b"data: a\r\n\n"), [msg("message", "a", "")]);
    // LF CR is two line ends: the CR ends an empty line.
    assert_eq!(parse(b"data: a\n\r"), [msg("message", "a", "")]);
}

#[test]
fn cr_ending_one_read_and_lf_starting_the_next_are_one_line_end() {
    // Were the LF a second line end, "a" would be dispatched alone.
    let split: &[&[u8]] = &[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"];
    assert_eq!(run::<64>(split), [msg("message", "a\nb", "")]);
    // An empty read between them changes nothing.
    let split: &[&[u8]] = &[b"data: a\r", b"", b"\ndata: b\n\n"];
    assert_eq!(run::<64>(split), [msg("message", "a\nb", "")]);
    // A CR followed by another byte in the next read is a line end on its own.
    let split: &[&[u8]] = &[b"data: a\r", b"\r"];
    assert_eq!(run::<64>(split), [msg("message", "a", "")]);
}

#[test]
fn bom_is_skipped_at_the_very_start_only() {
    assert_eq!(parse(b"\xEF\xBB\xBFdata: a\n\n"), [msg("message", "a", "")]);
    let split: &[&[u8]] = &[b"\xEF", b"\xBB", b"\xBFdata: a\n\n"];
    assert_eq!(run::<64>(split), [msg("message", "a", "")]);
    // A second BOM, or one after the start, makes the field name unknown.
    assert_eq!(parse(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n"), []);
    assert_eq!(
        parse(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"),
        [msg("message", "a", "")]
    );
    // Part of a BOM is content.
    assert_eq!(parse(b"\xEF\xBBdata: a\n\n"), []);
    assert_eq!(parse(b"\xEF\xBB"), [Ev::Err(SseError::Unterminated)]);
    assert_eq!(parse(b"\xEF\n\n"), []);
}

#[test]
fn comments_are_reported_and_do_not_touch_the_event() {
    assert_eq!(parse(b": ping\n"), [comment(" ping")]);
    assert_eq!(parse(b":\r\n"), [comment("")]);
    assert_eq!(
        parse(b"data: a\n:c\ndata: b\n\n"),
        [comment("c"), msg("message", "a\nb", "")]
    );
    let split: &[&[u8]] = &[b"data: a\n: lo", b"ng comment\ndat", b"a: b\n\n"];
    assert_eq!(
        run::<64>(split),
        [comment(" long comment"), msg("message", "a\nb", "")]
    );
}

#[test]
fn one_space_after_the_colon_is_removed() {
    assert_eq!(parse(b"data:a\n\n"), [msg("message", "a", "")]);
    assert_eq!(parse(b"data: a\n\n"), [msg("message", "a", "")]);
    assert_eq!(parse(b"data:  a \n\n"), [msg("message", " a ", "")]);
    assert_eq!(parse(b"data:\ta\n\n"), [msg("message", "\ta", "")]);
    assert_eq!(parse(b"data: \n\n"), [msg("message", "", "")]);
    // Only the first colon separates.
    assert_eq!(parse(b"data: a: b\n\n"), [msg("message", "a: b", "")]);
}

#[test]
fn a_line_without_colon_is_a_field_with_an_empty_value() {
    assert_eq!(parse(b"data\n\n"), [msg("message", "", "")]);
    assert_eq!(parse(b"event\ndata: a\n\n"), [msg("message", "a", "")]);
    assert_eq!(
        parse(b"id: 1\n\nid\ndata: a\n\n"),
        [msg("message", "a", "")]
    );
}

#[test]
fn data_lines_are_joined_with_lf() {
    assert_eq!(parse(b"data: a\ndata: b\n\n"), [msg("message", "a\nb", "")]);
    assert_eq!(parse(b"data: a\ndata\n\n"), [msg("message", "a\n", "")]);
    assert_eq!(parse(b"data\ndata\n\n"), [msg("message", "\n", "")]);
    assert_eq!(parse(b"data:\ndata: b\n\n"), [msg("message", "\nb", "")]);
}

#[test]
fn an_empty_line_dispatches_only_when_there_is_data() {
    assert_eq!(parse(b"\n\n\r\n"), []);
    // The event type of an event without data is forgotten.
    assert_eq!(parse(b"event: x\n\ndata: a\n\n"), [msg("message", "a", "")]);
    assert_eq!(
        parse(b"data: a\n\n\ndata: b\n\n"),
        [msg("message", "a", ""), msg("message", "b", "")]
    );
}

#[test]
fn event_sets_the_type_of_the_current_event_only() {
    assert_eq!(
        parse(b"event: add\ndata: a\n\ndata: b\n\n"),
        [msg("add", "a", ""), msg("message", "b", "")]
    );
    // Set after the data, or twice: the last value counts; empty means "message".
    assert_eq!(
        parse(b"data: a\nevent: x\nevent: yz\n\n"),
        [msg("yz", "a", "")]
    );
    assert_eq!(
        parse(b"event: x\nevent:\ndata: a\n\n"),
        [msg("message", "a", "")]
    );
}

#[test]
fn id_persists_and_is_ignored_with_nul() {
    assert_eq!(
        parse(b"id: 7\ndata: a\n\ndata: b\n\n"),
        [msg("message", "a", "7"), msg("message", "b", "7")]
    );
    assert_eq!(
        parse(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n"),
        [msg("message", "a", "1"), msg("message", "b", "1")]
    );
    // An empty id clears it; an id after the data still counts for this event.
    assert_eq!(
        parse(b"id: 1\ndata: a\n\nid\ndata: b\nid: 22\nevent: e\nid: 333\n\n"),
        [msg("message", "a", "1"), msg("e", "b", "333")]
    );
    let mut parser = Parser::new([0u8; 32]);
    assert_eq!(run_with(&mut parser, &[b"id: abc\n\n"]), []);
    assert_eq!(parser.last_event_id(), b"abc");
}

#[test]
fn retry_with_digits_only_is_reported() {
    assert_eq!(parse(b"retry: 3000\n\n"), [Ev::Retry(3000)]);
    assert_eq!(parse(b"retry:0\n\n"), [Ev::Retry(0)]);
    assert_eq!(
        parse(b"retry: 30a\n\nretry: -1\n\nretry:\n\nretry: 1 \n\n"),
        []
    );
    assert_eq!(
        parse(b"retry: 99999999999999999999999\n\n"),
        [Ev::Retry(u64::MAX)]
    );
    // A retry line does not dispatch or disturb the event around it.
    assert_eq!(
        parse(b"data: a\nretry: 5\ndata: b\n\n"),
        [Ev::Retry(5), msg("message", "a\nb", "")]
    );
}

#[test]
fn unknown_fields_are_ignored() {
    assert_eq!(
        parse(b"foo: bar\ndata: a\nData: b\n data: c\ndata : d\n\n"),
        [msg("message", "a", "")]
    );
}

#[test]
fn an_event_open_at_the_end_is_unterminated() {
    let unterminated = [Ev::Err(SseError::Unterminated)];
    assert_eq!(parse(b"data: a\n"), unterminated);
    assert_eq!(parse(b"data: a"), unterminated);
    assert_eq!(
        parse(b"data: a\n\ndata: b\n"),
        [msg("message", "a", ""), unterminated[0].clone()]
    );
    assert_eq!(parse(b"event: x\n"), unterminated);
    assert_eq!(parse(b"id: 1\n"), unterminated);
    assert_eq!(parse(b": partial comment"), unterminated);
    assert_eq!(parse(b"data: [DONE]\n"), unterminated);
    // Closed cleanly: nothing open.
    assert_eq!(parse(b""), []);
    assert_eq!(parse(b": ping\n"), [comment(" ping")]);
    assert_eq!(parse(b"data: a\n\n"), [msg("message", "a", "")]);
}

#[test]
fn a_final_cr_still_ends_the_line() {
    // "data: a\r" ends the line; the stream then ends inside the event.
    assert_eq!(parse(b"data: a\r"), [Ev::Err(SseError::Unterminated)]);
    assert_eq!(parse(b"data: a\r\r"), [msg("message", "a", "")]);
}

#[test]
fn llama_server_stream_ends_with_done() {
    let stream: &[u8] = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
    let events = parse(stream);
    assert_eq!(
        events,
        [
            msg("message", "{\"choices\":[]}", ""),
            msg("message", "[DONE]", "")
        ]
    );
    let Ev::Msg(_, data, _) = &events[1] else {
        unreachable!()
    };
    assert!(crate::is_done(data));
}

#[test]
fn line_at_the_cap_passes_and_one_past_is_line_too_long() {
    // N = 16: "data: " + 10 bytes is 16 bytes.
    assert_eq!(
        run::<16>(&[b"data: 0123456789\n\n"]),
        [msg("message", "0123456789", "")]
    );
    assert_eq!(
        run::<16>(&[b"data: 0123456789A\n\n"]),
        [Ev::Err(SseError::LineTooLong)]
    );
    // Same answer when the line arrives in pieces, and for any kind of line.
    let pieces: &[&[u8]] = &[b"data: 01234", b"56789", b"\n\n"];
    assert_eq!(run::<16>(pieces), [msg("message", "0123456789", "")]);
    let pieces: &[&[u8]] = &[b"data: 01234", b"56789A"];
    assert_eq!(run::<16>(pieces), [Ev::Err(SseError::LineTooLong)]);
    assert_eq!(
        run::<16>(&[b":123456789012345\n"]),
        [comment("123456789012345")]
    );
    assert_eq!(
        run::<16>(&[b":1234567890123456\n"]),
        [Ev::Err(SseError::LineTooLong)]
    );
}

#[test]
fn event_at_the_cap_passes_and_one_past_is_event_too_large() {
    // 8 bytes of data, then a line of 8 bytes: 16 in all.
    assert_eq!(
        run::<16>(&[b"data: 01234567\ndata:abc\n\n"]),
        [msg("message", "01234567\nabc", "")]
    );
    assert_eq!(
        run::<16>(&[b"data: 01234567\ndata:abcd\n\n"]),
        [Ev::Err(SseError::EventTooLarge)]
    );
    // The split case keeps the buffered first line's prefix; still the same answer.
    let pieces: &[&[u8]] = &[b"data: 0123", b"4567\nda", b"ta:abc\n\n"];
    assert_eq!(run::<16>(pieces), [msg("message", "01234567\nabc", "")]);
    let pieces: &[&[u8]] = &[b"data: 0123", b"4567\nda", b"ta:abcd\n\n"];
    assert_eq!(run::<16>(pieces), [Ev::Err(SseError::EventTooLarge)]);
    // The last event ID and the event type take room too: 4 + 3 + 9 = 16.
    assert_eq!(
        run::<16>(&[b"id:abcd\nevent:xyz\ndata:0123\n\n"]),
        [msg("xyz", "0123", "abcd")]
    );
    assert_eq!(
        run::<16>(&[b"id:abcd\nevent:xyz\ndata:01234\n\n"]),
        [Ev::Err(SseError::EventTooLarge)]
    );
}

#[test]
fn errors_are_final_until_reset() {
    let mut parser = Parser::new([0u8; 8]);
    assert_eq!(parser.feed(b"data: 0123\n"), Err(SseError::LineTooLong));
    assert_eq!(parser.feed(b"\n"), Err(SseError::LineTooLong));
    assert_eq!(parser.finish(), Err(SseError::LineTooLong));
    parser.reset();
    assert_eq!(
        run_with(&mut parser, &[b"data: 1\n\n"]),
        [msg("message", "1", "")]
    );
}

#[test]
fn reset_forgets_the_stream_and_the_last_id() {
    let mut parser = Parser::new([0u8; 64]);
    assert_eq!(
        run_with(&mut parser, &[b"\xEF\xBB\xBFid: 9\ndata: a\n\ndata: b"]),
        [msg("message", "a", "9"), Ev::Err(SseError::Unterminated)]
    );
    parser.reset();
    assert_eq!(parser.last_event_id(), b"");
    // The BOM is skipped again at the start of the new stream.
    assert_eq!(
        run_with(&mut parser, &[b"\xEF\xBB\xBFdata: c\n\n"]),
        [msg("message", "c", "")]
    );
}

/// loopd's size: the M2a design's 1 MiB cap per SSE line.
const MIB: usize = 1 << 20;

fn heap_storage() -> std::boxed::Box<[u8; MIB]> {
    std::vec![0u8; MIB].into_boxed_slice().try_into().unwrap()
}

#[test]
fn a_one_mebibyte_buffer_holds_on_a_test_thread() {
    let mut line = std::vec![b'x'; MIB];
    line[..6].copy_from_slice(b"data: ");
    let mut parser = Parser::new(heap_storage());
    let pieces: Vec<&[u8]> = line.chunks(4096).chain([&b"\n\n"[..]]).collect();
    let events = run_with(&mut parser, &pieces);
    assert_eq!(events.len(), 1);
    let Ev::Msg(_, data, _) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(data.len(), MIB - 6);
    line.push(b'x');
    let mut parser = Parser::new(heap_storage());
    assert_eq!(
        run_with(&mut parser, &[&line]),
        [Ev::Err(SseError::LineTooLong)]
    );
}

#[test]
fn an_event_in_one_read_borrows_the_input() {
    let input = b"data: abc\n\n";
    let mut parser = Parser::new([0u8; 16]);
    let (used, event) = parser.feed(input).unwrap();
    assert_eq!(used, input.len());
    let Status::Complete(Event::Message(m)) = event else {
        panic!("{event:?}")
    };
    assert!(core::ptr::eq(m.data.as_ptr(), input[6..].as_ptr()));
}

#[test]
fn a_line_outgrowing_the_event_is_judged_at_its_end() {
    // 8 bytes of data held; the next line outgrows the 8 bytes left, then N itself.
    let pieces: &[&[u8]] = &[b"data: 01234567\ndata:", b"abcdefghijkl"];
    assert_eq!(run::<16>(pieces), [Ev::Err(SseError::LineTooLong)]);
    assert_eq!(
        run::<16>(&[pieces.concat().as_slice()]),
        [Ev::Err(SseError::LineTooLong)]
    );
    // It ends at 16 bytes or less: too large for the event, at its end or the stream's.
    let pieces: &[&[u8]] = &[b"data: 01234567\ndata:", b"abcdefghijk", b"\n"];
    assert_eq!(run::<16>(pieces), [Ev::Err(SseError::EventTooLarge)]);
    let pieces: &[&[u8]] = &[b"data: 01234567\ndata:", b"abcdefghijk"];
    assert_eq!(run::<16>(pieces), [Ev::Err(SseError::EventTooLarge)]);
}

#[test]
fn debug_output_leaves_the_buffer_out() {
    let parser = Parser::new([7u8; 64]);
    let text = std::format!("{parser:?}");
    assert!(text.starts_with("Parser { capacity: 64,"), "{text}");
    assert!(!text.contains('7'), "{text}");
}
