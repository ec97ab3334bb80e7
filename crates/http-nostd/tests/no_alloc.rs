//! The reader and the body buffer never touch the heap: a counting global allocator sees zero
//! allocations while a chunked and a length-framed response are read (storage is made before).

use http_nostd::{BodyBuffer, Event, ResponseReader, Status, HEAD_CAP};
use llama_harness::{allocations, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const CHUNKED: &[u8] =
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
    X-Folded: a\r\n b\r\nTransfer-Encoding: chunked\r\n\r\n\
    f;x=y\r\ndata: {\"a\":1}\n\n\r\n6\r\ndata: \r\n0\r\nT: v\r\n\r\n";
const LENGTH: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";

#[test]
fn reading_responses_allocates_nothing() {
    let mut head = vec![0u8; HEAD_CAP];
    let head: &mut [u8; HEAD_CAP] = (&mut head[..]).try_into().unwrap();
    let mut body_storage = [0u8; 64];

    let before = allocations();
    let mut streamed = 0usize;
    {
        let mut reader = ResponseReader::new(&mut *head);
        for piece in CHUNKED.chunks(5) {
            let mut pos = 0;
            loop {
                let (used, event) = reader.feed(&piece[pos..]).unwrap();
                pos += used;
                match event {
                    Status::Complete(Event::Body(b)) => streamed += b.len(),
                    Status::Partial | Status::Complete(Event::End) => break,
                    Status::Complete(Event::Head) => {}
                }
            }
        }
        reader.finish().unwrap();
        assert_eq!(
            reader.head().unwrap().header("x-folded"),
            Some(&b"a   b"[..])
        );
    }
    let collected_ok = {
        let mut reader = ResponseReader::new(&mut *head);
        let mut body = BodyBuffer::new(&mut body_storage);
        let (_, progress) = reader.feed_into(LENGTH, &mut body).unwrap();
        progress == Status::Complete(()) && body.as_bytes() == b"{\"ok\":true}"
    };
    let after = allocations();

    assert_eq!(after - before, 0, "heap allocations while reading");
    assert_eq!(streamed, 21);
    assert!(collected_ok);
}
