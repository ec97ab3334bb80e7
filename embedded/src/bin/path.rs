//! The path alone, for its flash and RAM (docs/benchmarks/embedded.md): the recorded response
//! through llama-proto's `ChatStream` (http-nostd -> sse-nostd -> decoder -> assembler) in
//! reads of 64 bytes, the finished message compared with the host's answer, exit 0 or 1. Nothing is formatted, so `core::fmt` stays out
//! unless the crates pull it in. `baseline` is this image without the path.
#![no_std]
#![no_main]

use boxmaker_embedded::expected as exp;
use boxmaker_embedded::{run, Buffers};
use cortex_m_rt::entry;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    boxmaker_embedded::exit(false)
}

#[entry]
fn main() -> ! {
    static mut BUFFERS: Buffers = Buffers::ZERO;
    let mut stream = BUFFERS.stream();
    // black_box: the input is not known to the optimizer, as a socket's would not be.
    let input = core::hint::black_box(exp::FIXTURE);
    let ok = run(input, 64, &mut stream).is_ok()
        && stream.assembler().finish().is_ok_and(|m| {
            m.tool_calls.len() == exp::TOOL_CALLS.len()
                && m.tool_calls
                    .iter()
                    .zip(exp::TOOL_CALLS)
                    .all(|(c, &(id, name, args))| {
                        c.id == id && c.name == name && c.arguments == args
                    })
                && m.content == exp::CONTENT
                && m.reasoning_content == exp::REASONING
                && m.finish_reason.as_str() == exp::FINISH_REASON
        });
    boxmaker_embedded::exit(ok)
}
