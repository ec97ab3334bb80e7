//! A layer of `path`, for each crate's share of flash (docs/benchmarks/embedded.md):
//! http-nostd and sse-nostd read the recorded response in reads of 64 bytes and count the
//! events and their data bytes; nothing is decoded.
#![no_std]
#![no_main]

use boxmaker_embedded::expected as exp;
use boxmaker_embedded::{Buffers, Reader, Sse};
use cortex_m_rt::entry;
use http_nostd::{Event, ResponseReader, Status};
use sse_nostd::{Event as SseEvent, Parser};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    boxmaker_embedded::exit(false)
}

#[entry]
fn main() -> ! {
    static mut BUFFERS: Buffers = Buffers::ZERO;
    let Buffers { head, line, .. } = BUFFERS;
    let mut reader: Reader<'_> = ResponseReader::with_field_cap(head);
    let mut sse: Sse<'_> = Parser::new(line);
    let input = core::hint::black_box(exp::FIXTURE);
    let (mut events, mut data, mut done) = (0, 0, false);
    let mut ok = true;
    'reads: for piece in input.chunks(64) {
        let mut rest = piece;
        loop {
            let Ok((used, event)) = reader.feed(rest) else {
                ok = false;
                break 'reads;
            };
            rest = &rest[used..];
            match event {
                Status::Partial => break,
                Status::Complete(Event::Head) => {
                    ok &= reader.head().is_some_and(|h| h.status() == exp::STATUS)
                }
                Status::Complete(Event::Body(mut b)) => loop {
                    let Ok((used, ev)) = sse.feed(b) else {
                        ok = false;
                        break 'reads;
                    };
                    match ev {
                        Status::Complete(SseEvent::Message(m)) => {
                            events += 1;
                            data += core::hint::black_box(m.data).len();
                            done = sse_nostd::is_done(m.data);
                        }
                        Status::Complete(_) => {}
                        Status::Partial => break,
                    }
                    b = &b[used..];
                },
                Status::Complete(Event::End) => break 'reads,
            }
        }
    }
    ok &= reader.finish().is_ok() && sse.finish().is_ok();
    boxmaker_embedded::exit(ok && events == exp::EVENTS && done && data > exp::LONGEST_PAYLOAD)
}
