//! Says when streamed content has started repeating itself, in fixed-size state.
//!
//! Small models that lose the thread tend to write one line, a cycle of two or three lines,
//! or one sentence inside a paragraph over and over until the token limit (SmolLM2 does the
//! last in `fixtures/looping.sse`). [`LoopDetector`] is fed the content deltas as they
//! arrive, in pieces of any size, and fires when the last lines are one *unit* of 1 to
//! [`MAX_CYCLE_LINES`] lines repeated back to back at least as many times as the unit's length
//! asks for ([`LoopConfig`]): a short unit must repeat more often than a long one before it
//! counts as a loop.
//!
//! The rules are in [`LoopDetector`]'s documentation.
//!
//! Each line is kept as a 64-bit FNV-1a hash and its length, so two different lines compare
//! equal only on a hash collision. Each byte costs a constant amount of work (a line end at
//! most [`MAX_CYCLE_LINES`]² comparisons), and the state is a few hundred bytes with no
//! storage from the caller. Feeding the same bytes in any pieces gives the same result.

use core::fmt;

/// The most lines one repeated unit may have: cycles of up to this many lines are found.
pub const MAX_CYCLE_LINES: usize = 4;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// How many times a unit must repeat before the detector fires, by the unit's length.
///
/// A unit shorter than `medium_from` bytes is short, one at least `long_from` bytes long is
/// long, anything between is medium. The defaults ([`LoopConfig::DEFAULT`]):
///
/// | tier | unit length (bytes) | repeats to fire |
/// | --- | --- | --- |
/// | short | 1–15 | 24 |
/// | medium | 16–63 | 8 |
/// | long | 64 and more | 5 |
///
/// and `sentence_ends_line: true`.
///
/// Short units (`}`, `});`, `---`, `Yes.`) repeat legitimately in code and prose, so they need
/// many repeats; a 64-byte line written five times in a row is nearly never meant. With
/// `sentence_ends_line` (the default) a sentence inside a paragraph counts as a line.
///
/// It deserializes from a table of these fields, each optional (the default fills in) and no
/// other (loopd's `[runner.loop_detector]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoopConfig {
    /// The shortest medium unit, in bytes (default 16).
    pub medium_from: usize,
    /// The shortest long unit, in bytes (default 64).
    pub long_from: usize,
    /// Repeats of a short unit that fire (default 24).
    pub short_repeats: u32,
    /// Repeats of a medium unit that fire (default 8).
    pub medium_repeats: u32,
    /// Repeats of a long unit that fire (default 5).
    pub long_repeats: u32,
    /// Whether a sentence end (`.`, `!` or `?` followed by whitespace) ends a line too
    /// (default true): small models also loop on one sentence inside a paragraph.
    pub sentence_ends_line: bool,
}

impl LoopConfig {
    /// The documented defaults.
    pub const DEFAULT: LoopConfig = LoopConfig {
        medium_from: 16,
        long_from: 64,
        short_repeats: 24,
        medium_repeats: 8,
        long_repeats: 5,
        sentence_ends_line: true,
    };

    /// How many times in a row a unit of `unit_len` bytes must appear to fire.
    pub fn repeats_for(&self, unit_len: usize) -> u32 {
        if unit_len >= self.long_from {
            self.long_repeats
        } else if unit_len >= self.medium_from {
            self.medium_repeats
        } else {
            self.short_repeats
        }
    }

    /// Checks that every repeat count is at least 2 and `medium_from <= long_from`.
    pub fn check(&self) -> Result<(), LoopConfigError> {
        for (field, value) in [
            ("short_repeats", self.short_repeats),
            ("medium_repeats", self.medium_repeats),
            ("long_repeats", self.long_repeats),
        ] {
            if value < 2 {
                return Err(LoopConfigError::TooFewRepeats { field, value });
            }
        }
        if self.medium_from > self.long_from {
            return Err(LoopConfigError::TiersOutOfOrder {
                medium_from: self.medium_from,
                long_from: self.long_from,
            });
        }
        Ok(())
    }
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig::DEFAULT
    }
}

/// Why a [`LoopConfig`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LoopConfigError {
    /// A repeat count is below 2 (one appearance is not a repeat).
    TooFewRepeats {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// `medium_from` is greater than `long_from`.
    TiersOutOfOrder {
        /// `medium_from`.
        medium_from: usize,
        /// `long_from`.
        long_from: usize,
    },
}

impl fmt::Display for LoopConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LoopConfigError::TooFewRepeats { field, value } => {
                write!(f, "loop detector {field} is {value}; it must be at least 2")
            }
            LoopConfigError::TiersOutOfOrder {
                medium_from,
                long_from,
            } => write!(
                f,
                "loop detector medium_from ({medium_from}) is greater than long_from ({long_from})"
            ),
        }
    }
}

impl core::error::Error for LoopConfigError {}

/// Where and on what the detector fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoopDetected {
    /// Stream offset one past the byte (`\n`, or whitespace after a sentence end) that
    /// completed the last repeat: how many bytes had been pushed when it fired.
    pub at: u64,
    /// Lines in the repeated unit (1 to [`MAX_CYCLE_LINES`]).
    pub lines: usize,
    /// The unit's length in bytes, trimmed as compared.
    pub unit_len: usize,
    /// Times the unit appeared in a row: the threshold of its tier.
    pub repeats: u32,
}

impl fmt::Display for LoopDetected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a {}-line unit of {} bytes repeated {} times in a row, ending at byte {}",
            self.lines, self.unit_len, self.repeats, self.at
        )
    }
}

/// One completed line, as compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line {
    hash: u64,
    len: usize,
}

/// Watches streamed content for one line, or a cycle of up to [`MAX_CYCLE_LINES`] lines,
/// repeated back to back. The rules:
/// - A line ends at `\n`, and (with [`LoopConfig::sentence_ends_line`], the default) at a
///   whitespace byte that follows `.`, `!` or `?`: `He is here. He is here. ` is two lines,
///   and so is `1. Hello` (`1.` and `Hello`), while `3.5` is not split. The line still open
///   when the stream ends is never judged.
/// - Lines are compared after trimming ASCII whitespace at both ends and collapsing each run of
///   it inside to one space, so re-indented copies are copies. A line that is empty after that
///   (a blank line) is skipped: `A`, blank, `A` is `A` twice in a row.
/// - Only back-to-back repeats count: `A B A B A B` is the unit `A B` three times, but `A x A y
///   A z` repeats nothing: a line that recurs with others between (a `}`, a `status: open`
///   under each list item) is how code and lists look, while a small model's loop is back
///   to back. A unit that is itself a repeat (`A A`, `A B A B`) is judged as its shorter unit.
/// - A unit's length is the sum of its lines' lengths in bytes after trimming. It fires when
///   the unit has appeared [`LoopConfig::repeats_for`] times in a row, at the byte that ends
///   the last line of that appearance (its `\n`, or the whitespace after its sentence end).
///
/// Lines are compared by a 64-bit FNV-1a hash and their length, so two different lines are
/// taken for the same only on a hash collision. Each byte costs constant work and no
/// allocation; the state's size and the cost are in `docs/benchmarks/llama-proto.md`.
///
/// ```
/// use llama_proto::{LoopConfig, LoopDetector};
///
/// let mut d = LoopDetector::new(LoopConfig::DEFAULT).unwrap();
/// let line = b"I will check the weather for you now.\n"; // 37 bytes and '\n': medium, 8 repeats
/// for _ in 0..7 {
///     assert_eq!(d.push(line), None);
/// }
/// let fired = d.push(line).unwrap();
/// assert_eq!((fired.at, fired.lines, fired.repeats), (8 * 38, 1, 8));
/// ```
#[derive(Debug, Clone)]
pub struct LoopDetector {
    config: LoopConfig,
    /// The open line: hash and length so far, whether whitespace is pending after text, and
    /// whether the last byte was a sentence stop.
    hash: u64,
    len: usize,
    space: bool,
    stop: bool,
    /// The last non-blank lines, newest first; `seen` of them are real.
    recent: [Line; MAX_CYCLE_LINES],
    seen: usize,
    /// `matched[p - 1]`: how many lines in a row, up to the newest, equal the line `p` before.
    matched: [u32; MAX_CYCLE_LINES],
    offset: u64,
    fired: Option<LoopDetected>,
}

impl LoopDetector {
    /// A detector with `config`, once [`LoopConfig::check`] accepts it.
    pub fn new(config: LoopConfig) -> Result<Self, LoopConfigError> {
        config.check()?;
        Ok(LoopDetector::fresh(config))
    }

    const fn fresh(config: LoopConfig) -> Self {
        LoopDetector {
            config,
            hash: FNV_OFFSET,
            len: 0,
            space: false,
            stop: false,
            recent: [Line { hash: 0, len: 0 }; MAX_CYCLE_LINES],
            seen: 0,
            matched: [0; MAX_CYCLE_LINES],
            offset: 0,
            fired: None,
        }
    }

    /// The configuration it runs with.
    pub fn config(&self) -> LoopConfig {
        self.config
    }

    /// Forgets everything pushed; the configuration stays.
    pub fn reset(&mut self) {
        *self = LoopDetector::fresh(self.config);
    }

    /// Bytes pushed so far (up to the firing point once it has fired).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Where it fired, if it has.
    pub fn fired(&self) -> Option<LoopDetected> {
        self.fired
    }

    /// Feeds the next piece of content. Returns where it fired if it has fired, in this piece
    /// or before; once fired, later pieces are ignored and the same answer is returned.
    pub fn push(&mut self, delta: &[u8]) -> Option<LoopDetected> {
        if self.fired.is_some() {
            return self.fired;
        }
        for &b in delta {
            self.offset += 1;
            let ends_sentence = self.stop && self.config.sentence_ends_line;
            self.stop = matches!(b, b'.' | b'!' | b'?');
            if b == b'\n' || (ends_sentence && b.is_ascii_whitespace()) {
                self.end_line();
                if self.fired.is_some() {
                    break;
                }
            } else if b.is_ascii_whitespace() {
                self.space = self.len > 0;
            } else {
                if self.space {
                    self.add(b' ');
                    self.space = false;
                }
                self.add(b);
            }
        }
        self.fired
    }

    fn add(&mut self, b: u8) {
        self.hash = (self.hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        self.len = self.len.saturating_add(1);
    }

    fn end_line(&mut self) {
        let line = Line {
            hash: self.hash,
            len: self.len,
        };
        self.hash = FNV_OFFSET;
        self.len = 0;
        self.space = false;
        if line.len == 0 {
            return;
        }
        for p in 1..=MAX_CYCLE_LINES {
            let m = &mut self.matched[p - 1];
            *m = if self.seen >= p && self.recent[p - 1] == line {
                m.saturating_add(1)
            } else {
                0
            };
        }
        self.recent.copy_within(..MAX_CYCLE_LINES - 1, 1);
        self.recent[0] = line;
        self.seen = (self.seen + 1).min(MAX_CYCLE_LINES);
        for p in 1..=MAX_CYCLE_LINES {
            let matched = u64::from(self.matched[p - 1]);
            if matched < p as u64 || !primitive(&self.recent[..p]) {
                continue;
            }
            let unit_len = self.recent[..p]
                .iter()
                .fold(0usize, |n, l| n.saturating_add(l.len));
            let repeats = self.config.repeats_for(unit_len);
            // The run is the unit once, then `matched` lines that continue it.
            if matched >= u64::from(repeats - 1) * p as u64 {
                self.fired = Some(LoopDetected {
                    at: self.offset,
                    lines: p,
                    unit_len,
                    repeats,
                });
                return;
            }
        }
    }
}

impl Default for LoopDetector {
    fn default() -> Self {
        // The defaults pass the check (a test says so).
        LoopDetector::fresh(LoopConfig::DEFAULT)
    }
}

/// True when `unit` is not a shorter unit repeated (`A A`, `A B A B`).
fn primitive(unit: &[Line]) -> bool {
    let p = unit.len();
    (1..p)
        .filter(|&q| p.is_multiple_of(q))
        .all(|q| (0..p - q).any(|j| unit[j] != unit[j + q]))
}
