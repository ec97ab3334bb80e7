//! The runtime alone (vector table, reset handler, semihosting exit) and the fixture bytes:
//! `path` minus this is what the path costs (docs/benchmarks/embedded.md).
#![no_std]
#![no_main]

use boxmaker_embedded::expected as exp;
use cortex_m_rt::entry;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    boxmaker_embedded::exit(false)
}

#[entry]
fn main() -> ! {
    // The fixture stays in, as in `path`, so that the difference is code and constants only.
    let input = core::hint::black_box(exp::FIXTURE);
    let ok = input.len() == exp::FIXTURE.len() && input[exp::HEAD_LEN - 1] == b'\n';
    boxmaker_embedded::exit(ok)
}
