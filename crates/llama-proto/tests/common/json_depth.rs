//! JSON nesting depth by a plain bracket count: the obviously right reference that
//! `tests/text_calls.rs` and the `proto_assemble` fuzz target compare the parsers' depth
//! limit against.

/// The deepest nesting of arrays and objects outside strings in `p`.
pub fn depth(p: &[u8]) -> usize {
    let (mut d, mut max, mut in_str, mut escaped) = (0usize, 0, false, false);
    for &b in p {
        if in_str {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                d += 1;
                max = max.max(d);
            }
            b']' | b'}' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    max
}
