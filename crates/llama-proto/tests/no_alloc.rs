//! Zero heap allocations per event: decode plus assembly over every recorded transcript,
//! counted by a global allocator wrapper on this thread.

mod common;

use llama_harness::{allocations as allocs, CountingAlloc};
use llama_proto::{decode_chunk, Assembler, Payload};

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
fn the_counter_counts() {
    let before = allocs();
    std::hint::black_box(vec![1u8; 16]);
    assert_eq!(allocs() - before, 1);
}
