//! `LoopDetector` on any bytes, in pieces.
//!
//! The first byte picks the configuration (0: the defaults; otherwise small thresholds, so
//! fuzzed input reaches them), the next two the piece sizes; the rest is the stream. Checks:
//! no panic; the stream pushed whole, in pieces and byte by byte fires at the same byte with
//! the same report, the one a literal reading of the rules gives; the report is consistent
//! (a `\n` at the firing byte, the tier's threshold, at most `MAX_CYCLE_LINES` lines); once
//! fired, it stays fired. Seeds (the seed's 39-character line, a cycle, code) are in
//! `fuzz/seeds/loop_detect`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use llama_proto::{LoopConfig, LoopDetected, LoopDetector, MAX_CYCLE_LINES};

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
    }
}

/// The rules read literally on the whole stream.
fn reference(text: &[u8], config: LoopConfig) -> Option<LoopDetected> {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut start = 0;
    for (i, &b) in text.iter().enumerate() {
        let after_stop = i > 0 && matches!(text[i - 1], b'.' | b'!' | b'?');
        let sentence_end = config.sentence_ends_line && after_stop && b.is_ascii_whitespace();
        if b != b'\n' && !sentence_end {
            continue;
        }
        let words: Vec<&[u8]> = text[start..i]
            .split(|c| c.is_ascii_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        start = i + 1;
        if words.is_empty() {
            continue;
        }
        kept.push(words.join(&b' '));
        let k = kept.len() - 1;
        for p in 1..=MAX_CYCLE_LINES.min(k) {
            let unit = &kept[k + 1 - p..];
            if (1..p)
                .filter(|q| p % q == 0)
                .any(|q| (0..p - q).all(|j| unit[j] == unit[j + q]))
            {
                continue;
            }
            let mut run = 0;
            while run + p <= k && kept[k - run] == kept[k - run - p] {
                run += 1;
            }
            let unit_len = unit.iter().map(Vec::len).sum();
            let repeats = config.repeats_for(unit_len);
            if run >= (repeats as usize - 1) * p {
                return Some(LoopDetected {
                    at: i as u64 + 1,
                    lines: p,
                    unit_len,
                    repeats,
                });
            }
        }
    }
    None
}

fuzz_target!(|data: &[u8]| {
    let [c, a, b, text @ ..] = data else {
        return;
    };
    let config = config(*c);
    let mut whole = LoopDetector::new(config).expect("fuzz configs are valid");
    let want = whole.push(text);
    assert_eq!(want, reference(text, config));
    if let Some(w) = want {
        assert!(w.at as usize <= text.len() && text[w.at as usize - 1] == b'\n');
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
});
