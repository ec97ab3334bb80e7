//! The anchor (docs/benchmarks/embedded.md): httparse alone parsing the recorded response's
//! head, in the same profile as `path`, with the same 16 header slots. `baseline` is this image
//! without httparse.
#![no_std]
#![no_main]

use boxmaker_embedded::expected as exp;
use boxmaker_embedded::HEADER_FIELDS;
use cortex_m_rt::entry;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    boxmaker_embedded::exit(false)
}

#[entry]
fn main() -> ! {
    let input = core::hint::black_box(exp::FIXTURE);
    let mut headers = [httparse::EMPTY_HEADER; HEADER_FIELDS];
    let mut response = httparse::Response::new(&mut headers);
    let ok = matches!(response.parse(input), Ok(httparse::Status::Complete(n)) if n == exp::HEAD_LEN)
        && response.code == Some(exp::STATUS)
        && response
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding") && h.value == b"chunked");
    boxmaker_embedded::exit(ok)
}
