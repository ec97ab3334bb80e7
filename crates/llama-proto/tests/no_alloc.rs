//! Zero heap allocations per event: decode plus assembly over every recorded transcript,
//! counted by a global allocator wrapper on this thread.

mod common;

use llama_harness::{allocations as allocs, CountingAlloc};
use llama_proto::{decode_chunk, Assembler, ChatStream, Payload, Status, StreamEvent};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn decode_and_assemble_allocate_nothing_per_event() {
    let names = common::PAIRED.iter().chain(common::SSE_ONLY.iter());
    let transcripts: Vec<Vec<Vec<u8>>> = names.map(|n| common::payloads(n)).collect();
    let longest = transcripts.iter().flatten().map(Vec::len).max().unwrap();
    let mut s = common::storage();
    let mut text = vec![0u8; longest];
    let mut asm = Assembler::new(&mut s.content, &mut s.reasoning, &mut s.args);

    let before = allocs();
    let mut events = 0;
    for t in &transcripts {
        asm.reset();
        for p in t {
            let Ok(Payload::Chunk(c)) = decode_chunk(p, &mut text) else {
                panic!("fixture chunk does not decode");
            };
            asm.push(&c).expect("fixture chunk assembles");
            events += 1;
        }
        std::hint::black_box(asm.finish().expect("fixture finishes"));
    }
    let after = allocs();
    assert!(
        events > 50,
        "only {events} events: the check would prove little"
    );
    assert_eq!(after - before, 0, "allocations during {events} events");
}

#[test]
fn the_whole_path_allocates_nothing() {
    let response = llama_harness::fixture("chunked_tool_call.http");
    let mut s = common::storage();
    let mut head = vec![0u8; 1024];
    let mut line = vec![0u8; 4096];
    let mut text = vec![0u8; 4096];
    let head: &mut [u8; 1024] = head.as_mut_slice().try_into().unwrap();
    let line: &mut [u8; 4096] = line.as_mut_slice().try_into().unwrap();
    let text: &mut [u8; 4096] = text.as_mut_slice().try_into().unwrap();
    let asm = Assembler::new(&mut s.content, &mut s.reasoning, &mut s.args);
    let mut stream = ChatStream::<_, 16, _, _, _, _, _>::new(head, line, text, asm);

    let before = allocs();
    let mut events = 0;
    'reads: for piece in response.chunks(7) {
        let mut rest = piece;
        loop {
            let (used, status) = stream.feed(rest).expect("the recording streams");
            rest = &rest[used..];
            match status {
                Status::Partial => break,
                Status::Complete(StreamEvent::Chunk(_)) => events += 1,
                Status::Complete(StreamEvent::End) => break 'reads,
                Status::Complete(_) => {}
            }
        }
    }
    std::hint::black_box(stream.finish().expect("the recording finishes"));
    let after = allocs();
    assert_eq!(events, 12);
    assert_eq!(after - before, 0, "allocations during {events} events");
}

#[test]
fn the_counter_counts() {
    let before = allocs();
    std::hint::black_box(vec![1u8; 16]);
    assert_eq!(allocs() - before, 1);
}
