//! Parsing allocates nothing: a counting global allocator sees zero allocations while a
//! parser and the pull adapter work through a stream (in its own test binary, so the
//! allocator is global only here).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use sse_nostd::{Event, EventReader, Parser};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the measuring thread counts: the test harness allocates on its own threads.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call unchanged to `System`; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCATIONS.load(Ordering::SeqCst) - before)
}

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
    let storage: Box<[u8; 4096]> = vec![0u8; 4096].into_boxed_slice().try_into().unwrap();
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
                    Some(Event::Message(_)) => messages += 1,
                    Some(_) => {}
                    None => break,
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
