//! Parsing allocates nothing: a counting global allocator sees zero allocations while a
//! parser and the pull adapter work through a stream (in its own test binary, so the
//! allocator is global only here).

use llama_harness::{counted, CountingAlloc};
use sse_nostd::{Event, EventReader, Parser, Status};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn stream() -> Vec<u8> {
    let mut s = b"\xEF\xBB\xBF: hello\r\nretry: 100\r\n".to_vec();
    for i in 0..200 {
        s.extend_from_slice(
            format!("id: {i}\nevent: e{i}\ndata: line one {i}\r\ndata: two\r\r").as_bytes(),
        );
    }
    s.extend_from_slice(b"data: [DONE]\n\n");
    s
}

#[test]
fn parsing_allocates_nothing() {
    let input = stream();
    let storage: Box<[u8; 4096]> = llama_harness::boxed_array();
    let mut parser = Parser::new(storage);
    // The counter works: an allocation inside `counted` is seen.
    assert_eq!(counted(|| drop(Box::new(1u8))).1, 1);

    let (messages, allocations) = counted(|| {
        let mut messages = 0;
        for chunk in input.chunks(7) {
            let mut rest = chunk;
            loop {
                let (used, event) = parser.feed(rest).unwrap();
                rest = &rest[used..];
                match event {
                    Status::Complete(Event::Message(_)) => messages += 1,
                    Status::Complete(_) => {}
                    Status::Partial => break,
                }
            }
        }
        parser.finish().unwrap();
        messages
    });
    assert_eq!((messages, allocations), (201, 0));

    let (messages, allocations) = counted(|| {
        let mut reader = EventReader::new(&input[..], Parser::new([0u8; 256]), [0u8; 64]);
        let mut messages = 0;
        while let Some(event) = reader.next_event().unwrap() {
            messages += usize::from(matches!(event, Event::Message(_)));
        }
        messages
    });
    assert_eq!((messages, allocations), (201, 0));
}
