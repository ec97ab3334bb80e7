//! A layer of `path`, for each crate's share of flash (docs/benchmarks/embedded.md):
//! http-nostd alone reads the recorded response in reads of 64 bytes and counts the body bytes.
#![no_std]
#![no_main]

use boxmaker_embedded::expected as exp;
use boxmaker_embedded::{Buffers, Reader};
use cortex_m_rt::entry;
use http_nostd::{Event, ResponseReader, Status};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    boxmaker_embedded::exit(false)
}

#[entry]
fn main() -> ! {
    static mut BUFFERS: Buffers = Buffers::ZERO;
    let mut reader: Reader<'_> = ResponseReader::with_field_cap(&mut BUFFERS.head);
    let input = core::hint::black_box(exp::FIXTURE);
    let mut body = 0;
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
                Status::Complete(Event::Body(b)) => body += core::hint::black_box(b).len(),
                Status::Complete(Event::End) => break 'reads,
            }
        }
    }
    boxmaker_embedded::exit(ok && reader.finish().is_ok() && body == exp::BODY_LEN)
}
