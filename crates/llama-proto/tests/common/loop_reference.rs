//! The loop detector's rules read literally, on whole strings: the obviously right reference
//! that `tests/repeat.rs` and the `loop_detect` fuzz target compare `LoopDetector` against.

use llama_proto::{LoopConfig, LoopDetected, MAX_CYCLE_LINES};

/// Where the rules say the detector fires on `text`, if anywhere.
pub fn reference(text: &[u8], config: LoopConfig) -> Option<LoopDetected> {
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
            let repeated_shorter = (1..p)
                .filter(|q| p % q == 0)
                .any(|q| (0..p - q).all(|j| unit[j] == unit[j + q]));
            if repeated_shorter {
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
