//! The layout llama-server writes, matched as one template: a fast path ahead of the walk in
//! [`crate::scan`], on 64-bit hosts only.
//!
//! A llama-server chunk is always the same text around its values:
//! `{"choices":[{"finish_reason":F,"index":0,"delta":{D}}],"created":N,"id":S,"model":S,
//! "system_fingerprint":S,"object":S[,"timings":{..}][,"prompt_progress":{..}]}`. Here each
//! run of that text is compared as a whole, a constant-length compare that the compiler
//! turns into a few wide loads (no loop, no call), so a key costs no scan, no `match` on its bytes and no comma or colon check of its own;
//! the values are read by the walk's own steps ([`Scan::string`], [`Scan::null`],
//! [`Scan::u64_from`], [`Scan::scalar`]), at the same positions the walk reads them, after
//! a check of their first byte in place of the walk's whitespace skip and type `match`.
//!
//! The template accepts only what it matches exactly, and anything else (another order, a
//! space, an escaped or repeated key, a second choice or tool call, an unknown field, an error
//! from a value) returns `None`: the caller then walks the payload from the start, so what a
//! payload decodes to, or which error it gives, never depends on this path. Every layout it
//! accepts the walk accepts too, with the same fields; a proptest in `decode` and the
//! `proto_assemble` fuzz target hold the two paths to the same result on every input.

use crate::raw::RawChunk;
use crate::scan::Scan;
use crate::PromptProgress;
use crate::Timings;

/// Parses `payload` into `out` (which must start as `RawChunk::default()`) if it is laid out
/// as llama-server writes it; `None` otherwise, with `out` partly written.
pub(crate) fn parse_laid_out<'a>(payload: &'a [u8], out: &mut RawChunk<'a>) -> Option<()> {
    let mut s = Layout(Scan { b: payload, i: 0 });
    s.lit(b"{\"choices\":[{\"finish_reason\":")?;
    // Nearly every chunk goes on so, to the delta's brace: one more compare.
    if s.lit(b"null,\"index\":0,\"delta\":{").is_none() {
        out.finish_reason = s.opt_str()?;
        s.lit(b",\"index\":")?;
        s.number()?;
        s.lit(b",\"delta\":{")?;
    }
    s.delta(out)?;
    s.lit(b"}],\"created\":")?;
    s.number()?;
    s.lit(b",\"id\":")?;
    out.chunk.id = s.opt_str()?;
    s.lit(b",\"model\":")?;
    s.string()?;
    s.lit(b",\"system_fingerprint\":")?;
    s.string()?;
    s.lit(b",\"object\":")?;
    s.string()?;
    if s.lit(b",\"timings\":{\"cache_n\":").is_some() {
        out.chunk.timings = Some(s.timings()?);
    }
    if s.lit(b",\"prompt_progress\":{\"total\":").is_some() {
        out.chunk.prompt_progress = Some(s.progress()?);
    }
    s.lit(b"}")?;
    s.0.end().ok()
}

/// The walk's cursor, read against the template.
struct Layout<'a>(Scan<'a>);

impl<'a> Layout<'a> {
    /// Passes `text` if it is next, byte for byte (a constant-length compare, no loop).
    #[inline(always)]
    fn lit<const N: usize>(&mut self, text: &[u8; N]) -> Option<()> {
        let at = self.0.i;
        let next: &[u8; N] = self.0.b.get(at..at + N)?.try_into().ok()?;
        if next != text {
            return None;
        }
        self.0.i = at + N;
        Some(())
    }

    /// A string the decoder does not read, its opening quote next (no whitespace before it:
    /// the walk would skip that first); read as the walk reads it.
    #[inline(always)]
    fn string(&mut self) -> Option<()> {
        if self.0.b.get(self.0.i) != Some(&b'"') {
            return None;
        }
        self.0.string().ok().map(drop)
    }

    /// `null` or a string, next with no whitespace before it, as [`Scan::opt_str`] reads it.
    #[inline(always)]
    fn opt_str(&mut self) -> Option<Option<&'a str>> {
        match self.0.b.get(self.0.i)? {
            b'"' => self
                .0
                .string()
                .ok()
                .and_then(|raw| core::str::from_utf8(raw).ok().map(Some)),
            b'n' => self.0.null().ok().map(|()| None),
            _ => None,
        }
    }

    /// A number the decoder does not read, next with no whitespace before it: to the next
    /// `,`, `}` or `]`, as [`Scan::value`] passes it ([`Scan::scalar`]).
    #[inline(always)]
    fn number(&mut self) -> Option<()> {
        match self.0.b.get(self.0.i)? {
            b'-' | b'0'..=b'9' => self.0.scalar().ok(),
            _ => None,
        }
    }

    /// An unsigned integer, next with no whitespace before it, as [`Scan::u64`] reads it.
    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        match *self.0.b.get(self.0.i)? {
            first @ b'0'..=b'9' => self.0.u64_from(first).ok(),
            _ => None,
        }
    }

    /// The delta's fields after its `{`, to its `}`: `content`, `reasoning_content`, `role`
    /// (skipped, as the walk skips it) and one tool call, each at most once.
    #[inline(always)]
    fn delta(&mut self, out: &mut RawChunk<'a>) -> Option<()> {
        if self.lit(b"}").is_some() {
            return Some(());
        }
        let mut seen = 0u8;
        loop {
            let bit = if self.lit(b"\"content\":").is_some() {
                out.chunk.content = self.opt_str()?;
                1
            } else if self.lit(b"\"reasoning_content\":").is_some() {
                out.chunk.reasoning_content = self.opt_str()?;
                2
            } else if self.lit(b"\"role\":").is_some() {
                self.string()?;
                4
            } else if self.lit(b"\"tool_calls\":[{\"index\":").is_some() {
                self.tool_call(out)?;
                8
            } else {
                return None;
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            if self.lit(b"}").is_some() {
                return Some(());
            }
            self.lit(b",")?;
        }
    }

    /// One tool call after its `[{"index":`, to the array's `]`: `index`, then maybe `id`
    /// and `type`, then `function` with maybe `name` and then `arguments`.
    #[inline(always)]
    fn tool_call(&mut self, out: &mut RawChunk<'a>) -> Option<()> {
        let call = out.chunk.tool_calls.first_mut()?;
        call.index = self.0.u32().ok()?;
        if self.lit(b",\"id\":").is_some() {
            call.id = self.opt_str()?;
        }
        if self.lit(b",\"type\":").is_some() {
            self.string()?;
        }
        self.lit(b",\"function\":{")?;
        if self.lit(b"\"name\":").is_some() {
            call.name = self.opt_str()?;
            self.lit(b",")?;
        }
        self.lit(b"\"arguments\":")?;
        call.arguments = self.opt_str()?;
        self.lit(b"}}]")?;
        out.chunk.tool_calls_len = 1;
        Some(())
    }

    /// `timings` after `{"cache_n":`, to its `}`: its nine fields in llama-server's order.
    #[inline(always)]
    fn timings(&mut self) -> Option<Timings> {
        let cache_n = self.u64()?;
        self.lit(b",\"prompt_n\":")?;
        let prompt_n = self.u64()?;
        self.lit(b",\"prompt_ms\":")?;
        self.number()?;
        self.lit(b",\"prompt_per_token_ms\":")?;
        self.number()?;
        self.lit(b",\"prompt_per_second\":")?;
        self.number()?;
        self.lit(b",\"predicted_n\":")?;
        let predicted_n = self.u64()?;
        self.lit(b",\"predicted_ms\":")?;
        self.number()?;
        self.lit(b",\"predicted_per_token_ms\":")?;
        self.number()?;
        self.lit(b",\"predicted_per_second\":")?;
        self.number()?;
        self.lit(b"}")?;
        Some(Timings {
            cache_n,
            prompt_n,
            predicted_n,
        })
    }

    /// `prompt_progress` after `{"total":`, to its `}`.
    #[inline(always)]
    fn progress(&mut self) -> Option<PromptProgress> {
        let total = self.u64()?;
        self.lit(b",\"cache\":")?;
        let cache = self.u64()?;
        self.lit(b",\"processed\":")?;
        let processed = self.u64()?;
        self.lit(b",\"time_ms\":")?;
        let time_ms = self.u64()?;
        self.lit(b"}")?;
        Some(PromptProgress {
            total,
            cache,
            processed,
            time_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode_chunk, decode_chunk_walked};
    use std::format;
    use std::string::String;
    use std::vec::Vec;

    use proptest::prelude::*;

    /// `decode_chunk` (the template first) and the walk alone, as text.
    fn both_paths(p: &[u8]) -> [String; 2] {
        let (mut t1, mut t2) = (std::vec![0u8; p.len()], std::vec![0u8; p.len()]);
        [
            format!("{:?}", decode_chunk(p, &mut t1)),
            format!("{:?}", decode_chunk_walked(p, &mut t2)),
        ]
    }

    fn laid_out(p: &[u8]) -> bool {
        parse_laid_out(p, &mut RawChunk::default()).is_some()
    }

    /// Every `data:` payload of the recorded streams.
    fn recorded() -> Vec<&'static str> {
        crate::recorded_payloads(&[
            include_str!("../../../fixtures/plain.sse"),
            include_str!("../../../fixtures/thinking.sse"),
            include_str!("../../../fixtures/tool_call.sse"),
            include_str!("../../../fixtures/progress.sse"),
            include_str!("../../../fixtures/looping.sse"),
            include_str!("../../../fixtures/reasoning_end.sse"),
            include_str!("../../../fixtures/tool_call_text.sse"),
        ])
    }

    #[test]
    fn every_recorded_payload_takes_the_template_and_decodes_as_the_walk_does() {
        let payloads = recorded();
        assert!(payloads.len() > 600);
        for p in payloads {
            assert!(laid_out(p.as_bytes()), "{p}");
            let [fast, walked] = both_paths(p.as_bytes());
            assert_eq!(fast, walked, "{p}");
        }
    }

    #[test]
    fn other_layouts_are_left_to_the_walk_and_decode_as_it_does() {
        let chunk = r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#;
        assert!(laid_out(chunk.as_bytes()));
        for p in [
            // Spaced, reordered, repeated, escaped, a second choice, an unknown field.
            r#" {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"} x"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a","content":"b"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"con\u0074ent":"a"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{}},{"delta":{}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"x":1}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o","timings":{"cache_n":01,"prompt_n":2,"prompt_ms":1,"prompt_per_token_ms":1,"prompt_per_second":1,"predicted_n":3,"predicted_ms":1,"predicted_per_token_ms":1,"predicted_per_second":1}}"#,
            r#"{"choices":[{"finish_reason":"nope","index":0,"delta":{}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}},{"index":1,"function":{"arguments":"{"}}]}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a\ud800"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"created":1,"id":"c","model":"m","system_fingerprint":"f","object":"o","error":{"message":"m"}}"#,
        ] {
            assert!(
                !laid_out(p.as_bytes()) || p.contains("nope") || p.contains("ud800"),
                "{p}"
            );
            let [fast, walked] = both_paths(p.as_bytes());
            assert_eq!(fast, walked, "{p}");
        }
    }

    /// The bytes an edit puts in: JSON's own, digits, signs and letters of `null`, escapes.
    fn edit_byte() -> impl Strategy<Value = u8> {
        prop::sample::select(b"\"{}[]:, \\0159-.eEnul\tx".to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// A recorded payload with up to four bytes replaced, inserted or removed, and maybe
        /// cut short, decodes the same (the same chunk or the same error) by both paths.
        #[test]
        fn the_template_gives_what_the_walk_gives_on_damaged_recordings(
            which in any::<prop::sample::Index>(),
            edits in proptest::collection::vec(
                (any::<prop::sample::Index>(), edit_byte(), 0u8..3),
                0..4,
            ),
            cut in any::<prop::sample::Index>(),
            cut_it in any::<bool>(),
        ) {
            let payloads = recorded();
            let mut p = payloads[which.index(payloads.len())].as_bytes().to_vec();
            for (at, b, how) in edits {
                let at = at.index(p.len());
                match how {
                    0 => p[at] = b,
                    1 => p.insert(at, b),
                    _ => {
                        p.remove(at);
                    }
                }
            }
            if cut_it {
                p.truncate(cut.index(p.len() + 1));
            }
            let [fast, walked] = both_paths(&p);
            prop_assert_eq!(fast, walked);
        }
    }
}
