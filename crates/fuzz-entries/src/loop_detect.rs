//! `LoopDetector` on any bytes, in pieces.
//!
//! The first byte picks the configuration (0: the defaults; otherwise small thresholds, so
//! fuzzed input reaches them, with sentence ends on when the byte has an even number of bits
//! set), the next two the piece sizes; the rest is the stream. Checks: no panic; the stream
//! pushed whole, in pieces and byte by byte fires at the same byte with the same report, the
//! one a literal reading of the rules gives; the report is consistent (a line end at the
//! firing byte, the tier's threshold, at most `MAX_CYCLE_LINES` lines); once fired, it stays
//! fired. Seeds (the seed's 39-character line, a cycle, code) are in
//! `fuzz/seeds/loop_detect`.
use llama_proto::{LoopConfig, LoopDetector, MAX_CYCLE_LINES};

// The same reference the unit tests use.
#[path = "../../llama-proto/tests/common/loop_reference.rs"]
mod loop_reference;
use loop_reference::reference;

fn config(b: u8) -> LoopConfig {
    if b == 0 {
        return LoopConfig::DEFAULT;
    }
    let (m, l) = (usize::from(b & 7), usize::from(b >> 3 & 7) + 4);
    LoopConfig {
        medium_from: m.min(l),
        long_from: m.max(l),
        short_repeats: u32::from(b >> 6) + 3,
        medium_repeats: u32::from(b & 3) + 2,
        long_repeats: 2,
        sentence_ends_line: b.count_ones().is_multiple_of(2),
    }
}

/// The `loop_detect` fuzz target: panics when a check fails.
pub fn loop_detect(data: &[u8]) {
    let [c, a, b, text @ ..] = data else {
        return;
    };
    let config = config(*c);
    let mut whole = LoopDetector::new(config).expect("fuzz configs are valid");
    let want = whole.push(text);
    assert_eq!(want, reference(text, config));
    if let Some(w) = want {
        let end = w.at as usize - 1;
        assert!(end < text.len());
        let sentence_end = config.sentence_ends_line
            && end > 0
            && matches!(text[end - 1], b'.' | b'!' | b'?')
            && text[end].is_ascii_whitespace();
        assert!(text[end] == b'\n' || sentence_end, "fired inside a line");
        assert!((1..=MAX_CYCLE_LINES).contains(&w.lines));
        assert_eq!(w.repeats, config.repeats_for(w.unit_len));
        assert_eq!(whole.offset(), w.at);
        assert_eq!(whole.push(b"more\n"), want, "fired stays fired");
    } else {
        assert_eq!(whole.offset(), text.len() as u64);
    }
    let sizes = [usize::from(*a % 17) + 1, usize::from(*b % 61) + 1];
    let mut pieces = LoopDetector::new(config).unwrap();
    let (mut got, mut rest, mut k) = (None, text, 0);
    while !rest.is_empty() {
        let n = sizes[k % 2].min(rest.len());
        got = pieces.push(&rest[..n]);
        rest = &rest[n..];
        k += 1;
    }
    assert_eq!(got, want);
    let mut bytes = LoopDetector::new(config).unwrap();
    let mut got = None;
    for byte in text {
        got = bytes.push(std::slice::from_ref(byte));
    }
    assert_eq!(got, want);
}
