//! `LoopDetector`: the seed's case, each tier at its threshold and one below, cycles of lines,
//! the benign repetition that must not fire, and property tests that any split of the input
//! fires at the same byte as a simple reference does.

mod common;

#[path = "common/loop_reference.rs"]
mod loop_reference;
use llama_proto::{
    decode_chunk, LoopConfig, LoopConfigError, LoopDetected, LoopDetector, Payload, MAX_CYCLE_LINES,
};
use loop_reference::reference;
use proptest::prelude::*;

/// Where the default detector fires on `text` pushed whole.
fn fire(text: &str) -> Option<LoopDetected> {
    LoopDetector::default().push(text.as_bytes())
}

/// `line` (without its `\n`) `n` times, each ended by `\n`.
fn lines(line: &str, n: usize) -> String {
    format!("{line}\n").repeat(n)
}

/// A line of exactly `len` bytes, none of them whitespace.
fn line_of(len: usize) -> String {
    (0..len)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}

#[test]
fn the_seeds_39_character_line_fires_at_its_eighth_repeat() {
    let line = "I will now call the get_weather tool...";
    assert_eq!(line.len(), 39);
    assert_eq!(fire(&lines(line, 7)), None);
    assert_eq!(
        fire(&lines(line, 8)),
        Some(LoopDetected {
            at: 8 * 40,
            lines: 1,
            unit_len: 39,
            repeats: 8
        })
    );
    // What comes after the firing line does not move it.
    assert_eq!(fire(&lines(line, 50)).map(|d| d.at), Some(320));
}

#[test]
fn the_defaults_are_the_documented_ones() {
    assert_eq!(
        LoopConfig::default(),
        LoopConfig {
            medium_from: 16,
            long_from: 64,
            short_repeats: 24,
            medium_repeats: 8,
            long_repeats: 5,
            sentence_ends_line: true,
        }
    );
    assert_eq!(LoopConfig::DEFAULT.check(), Ok(()));
    assert_eq!(LoopDetector::default().config(), LoopConfig::DEFAULT);
}

#[test]
fn each_tier_fires_at_its_threshold_and_not_one_below() {
    for (len, repeats) in [
        (1, 24),
        (15, 24),
        (16, 8),
        (39, 8),
        (63, 8),
        (64, 5),
        (80, 5),
    ] {
        assert_eq!(LoopConfig::DEFAULT.repeats_for(len), repeats, "{len}");
        let line = line_of(len);
        assert_eq!(fire(&lines(&line, repeats as usize - 1)), None, "{len}");
        let got = fire(&lines(&line, repeats as usize));
        assert_eq!(
            got,
            Some(LoopDetected {
                at: (repeats as u64) * (len as u64 + 1),
                lines: 1,
                unit_len: len,
                repeats
            }),
            "{len}"
        );
    }
}

#[test]
fn a_configured_tier_is_used() {
    let config = LoopConfig {
        medium_from: 4,
        long_from: 10,
        short_repeats: 6,
        medium_repeats: 3,
        long_repeats: 2,
        sentence_ends_line: true,
    };
    let fire_with = |text: &str| LoopDetector::new(config).unwrap().push(text.as_bytes());
    for (len, repeats) in [(3, 6), (4, 3), (9, 3), (10, 2)] {
        let line = line_of(len);
        assert_eq!(fire_with(&lines(&line, repeats - 1)), None, "{len}");
        assert_eq!(
            fire_with(&lines(&line, repeats)).map(|d| d.repeats),
            Some(repeats as u32),
            "{len}"
        );
    }
}

#[test]
fn a_cycle_of_two_three_or_four_lines_fires_by_its_whole_length() {
    // Two lines of 20 bytes: a 40-byte unit, medium, 8 appearances = 16 lines.
    let two = ["Checking the city...", "Calling get_weather."];
    let mut text = String::new();
    let mut got = None;
    for i in 0..16 {
        assert_eq!(got, None, "fired early at line {i}");
        text += two[i % 2];
        text += "\n";
        got = fire(&text);
    }
    assert_eq!(
        got,
        Some(LoopDetected {
            at: 16 * 21,
            lines: 2,
            unit_len: 40,
            repeats: 8
        })
    );
    // Three lines, 70 bytes in all: long, 5 appearances = 15 lines.
    let three = [
        "Let me think about it.",
        "The user wants Paris.",
        "I should call the tool.",
    ];
    assert_eq!(three.iter().map(|l| l.len()).sum::<usize>(), 66);
    let unit = format!("{}\n{}\n{}\n", three[0], three[1], three[2]);
    let mut body = unit.repeat(4);
    body += &format!("{}\n{}\n", three[0], three[1]);
    assert_eq!(fire(&body), None);
    body += &format!("{}\n", three[2]);
    assert_eq!(
        fire(&body),
        Some(LoopDetected {
            at: body.len() as u64,
            lines: 3,
            unit_len: 66,
            repeats: 5
        })
    );
    // Four short lines, 12 bytes: short, 24 appearances.
    let four = "a\nbb\nccc\ndddddd\n";
    assert_eq!(fire(&four.repeat(23)), None);
    assert_eq!(
        fire(&four.repeat(24)).map(|d| (d.lines, d.unit_len, d.repeats)),
        Some((4, 12, 24))
    );
}

#[test]
fn a_cycle_longer_than_max_cycle_lines_is_not_found() {
    assert_eq!(MAX_CYCLE_LINES, 4);
    let five: String = (0..5).map(|i| format!("{} {i}\n", line_of(60))).collect();
    assert_eq!(fire(&five.repeat(40)), None);
}

#[test]
fn one_line_repeated_is_judged_as_one_line_not_as_pairs() {
    // `A A` as a unit of two would be 24 bytes (medium, 8 appearances = 16 lines); `A` alone
    // is short and needs 24.
    let a = line_of(12);
    assert_eq!(fire(&lines(&a, 23)), None);
    assert_eq!(
        fire(&lines(&a, 24)).map(|d| (d.lines, d.repeats)),
        Some((1, 24))
    );
    // `A B A B` as a unit of four would be 30 bytes (medium: 8 appearances = 16 pairs); it
    // is judged as `A B`, 15 bytes, short: 24 pairs.
    let ab = format!("{}\n{}\n", line_of(7), line_of(8));
    assert_eq!(fire(&ab.repeat(23)), None);
    assert_eq!(
        fire(&ab.repeat(24)).map(|d| (d.lines, d.unit_len)),
        Some((2, 15))
    );
}

#[test]
fn blank_lines_are_skipped_and_whitespace_is_normalised() {
    let line = "I will now call the get_weather tool...";
    let spaced = format!("{line}\n\n  \t\n").repeat(8);
    assert_eq!(fire(&spaced).map(|d| d.repeats), Some(8));
    // Indentation, tabs, inner runs of spaces and CRLF do not make lines different.
    let variants = [
        "I will now call the get_weather tool...",
        "   I will now call the get_weather tool...",
        "I will  now call\tthe get_weather tool...\r",
        "\tI will now call the   get_weather tool...   ",
    ];
    let text: String = (0..8).map(|i| format!("{}\n", variants[i % 4])).collect();
    assert_eq!(fire(&text).map(|d| d.unit_len), Some(39));
    // Blank lines alone never fire.
    assert_eq!(fire(&"\n".repeat(10_000)), None);
    assert_eq!(fire(&" \t \r\n".repeat(10_000)), None);
}

#[test]
fn the_open_line_is_not_judged_until_its_newline() {
    let line = "I will now call the get_weather tool...";
    let mut d = LoopDetector::default();
    assert_eq!(d.push(lines(line, 7).as_bytes()), None);
    assert_eq!(d.push(line.as_bytes()), None);
    assert_eq!(d.offset(), 7 * 40 + 39);
    assert_eq!(d.push(b"\n").map(|f| f.at), Some(320));
}

#[test]
fn once_fired_it_stays_fired_until_reset() {
    let line = "I will now call the get_weather tool...";
    let mut d = LoopDetector::default();
    let text = lines(line, 9);
    let fired = d.push(text.as_bytes()).unwrap();
    assert_eq!(fired.at, 320);
    assert_eq!(
        d.offset(),
        320,
        "bytes after the firing point are not consumed"
    );
    assert_eq!(d.push(b"anything else\n"), Some(fired));
    assert_eq!(d.fired(), Some(fired));
    d.reset();
    assert_eq!((d.fired(), d.offset()), (None, 0));
    assert_eq!(d.push(lines(line, 7).as_bytes()), None);
}

#[test]
fn a_few_repeats_do_not_fire() {
    let long = line_of(80);
    let medium = line_of(39);
    let text = format!(
        "{}{}{}",
        lines(&long, 4),
        lines(&medium, 7),
        lines("Thanks!", 23)
    );
    assert_eq!(fire(&text), None);
    // A chorus of four lines sung twice, and again after a verse.
    let chorus = "Row, row, row your boat\nGently down the stream\nMerrily, merrily, merrily, merrily\nLife is but a dream\n";
    let song = format!("{chorus}{chorus}A verse in between\n{chorus}{chorus}");
    assert_eq!(fire(&song), None);
}

#[test]
fn list_bullets_that_differ_do_not_fire() {
    let list: String = (0..500).map(|i| format!("- item {i}\n")).collect();
    assert_eq!(fire(&list), None);
    let todo: String = (0..200)
        .map(|i| format!("- [ ] task {i}\n  - status: open\n"))
        .collect();
    assert_eq!(fire(&todo), None);
}

#[test]
fn code_with_repeated_closing_braces_does_not_fire() {
    let code = r#"
fn main() {
    for i in 0..10 {
        if i % 2 == 0 {
            match i {
                0 => {
                    println!("zero");
                }
                _ => {
                    println!("even");
                }
            }
        }
    }
}

describe('api', () => {
  it('works', () => {
    return fetch('/x').then((r) => {
      expect(r.ok).toBe(true);
    });
  });
});
"#;
    assert_eq!(fire(&code.repeat(3)), None);
    // Even deep nesting: 20 closing braces in a row, each indented differently.
    let closing: String = (0..20)
        .rev()
        .map(|d| format!("{}}}\n", "    ".repeat(d)))
        .collect();
    assert_eq!(fire(&closing), None);
    let js: String = (0..20)
        .rev()
        .map(|d| format!("{}}});\n", "  ".repeat(d)))
        .collect();
    assert_eq!(fire(&js), None);
}

#[test]
fn markdown_separators_and_tables_do_not_fire() {
    let doc: String = (0..30)
        .map(|i| format!("## Section {i}\n\nSome text about part {i}.\n\n---\n\n"))
        .collect();
    assert_eq!(fire(&doc), None);
    let table: String = "| city | weather |\n|---|---|\n".to_owned()
        + &(0..100)
            .map(|i| format!("| city {i} | sunny |\n"))
            .collect::<String>();
    assert_eq!(fire(&table), None);
    assert_eq!(fire(&lines("---", 23)), None);
}

#[test]
fn a_sentence_repeated_inside_a_paragraph_fires_at_the_space_after_it() {
    let sentence = "He is a sailor's son, a sailor's son, a sailor's son.";
    assert_eq!(sentence.len(), 53);
    let text = format!(
        "In the midst of the sea, a lone figure stands. {}",
        format!("{sentence} ").repeat(7)
    );
    assert_eq!(fire(&text), None);
    let text = format!("{text}{sentence} ");
    assert_eq!(
        fire(&text),
        Some(LoopDetected {
            at: text.len() as u64,
            lines: 1,
            unit_len: 53,
            repeats: 8
        })
    );
    // Off, the paragraph is one open line and never judged.
    let lines_only = LoopConfig {
        sentence_ends_line: false,
        ..LoopConfig::DEFAULT
    };
    let long = format!("{sentence} ").repeat(100);
    assert_eq!(
        LoopDetector::new(lines_only).unwrap().push(long.as_bytes()),
        None
    );
    // A stop not followed by whitespace does not end a line.
    assert_eq!(fire(&"Version 3.5.1!x".repeat(100)), None);
}

#[test]
fn a_numbered_list_is_not_a_loop_even_when_it_runs_away() {
    // What SmolLM2 wrote for "Write the word hello on 30 lines." at temperature 0: it counted
    // on past 30. The numbers differ, so nothing repeats back to back; the token limit ends it.
    let list: String = (1..=200).map(|i| format!("{i}. Hello\n")).collect();
    assert_eq!(fire(&list), None);
}

/// The content and the reasoning deltas of a recorded stream, in the order sent.
fn streamed(name: &str) -> (Vec<String>, Vec<String>) {
    let (mut content, mut reasoning) = (Vec::new(), Vec::new());
    for p in common::payloads(name) {
        let mut text = vec![0u8; p.len()];
        if let Ok(Payload::Chunk(c)) = decode_chunk(&p, &mut text) {
            content.extend(c.content.map(str::to_owned));
            reasoning.extend(c.reasoning_content.map(str::to_owned));
        }
    }
    (content, reasoning)
}

#[test]
fn the_models_own_loop_fires_at_its_eighth_sentence() {
    let (deltas, _) = streamed("looping");
    let mut d = LoopDetector::default();
    let mut fired = None;
    for delta in &deltas {
        fired = d.push(delta.as_bytes());
    }
    let sentence = "He is a sailor's son, a sailor's son, a sailor's son.";
    let content = deltas.concat();
    let eighth = content.match_indices(sentence).nth(7).unwrap().0;
    assert_eq!(
        fired,
        Some(LoopDetected {
            at: (eighth + sentence.len() + 1) as u64,
            lines: 1,
            unit_len: sentence.len(),
            repeats: 8
        })
    );
    // The server went on to its token limit; the runner would have closed the stream here.
    assert!((fired.unwrap().at as usize) < content.len() - 500);
}

#[test]
fn no_other_recorded_answer_fires() {
    for name in [
        "plain",
        "thinking",
        "tool_call",
        "tool_call_text",
        "progress",
        "reasoning_end",
    ] {
        let (content, reasoning) = streamed(name);
        for (what, deltas) in [("content", content), ("reasoning", reasoning)] {
            let mut d = LoopDetector::default();
            let fired = deltas.iter().find_map(|x| d.push(x.as_bytes()));
            assert_eq!(fired, None, "{name} {what}");
        }
    }
}

#[test]
fn a_bad_config_is_refused_with_its_field() {
    let bad = LoopConfig {
        medium_repeats: 1,
        ..LoopConfig::DEFAULT
    };
    let e = LoopDetector::new(bad).unwrap_err();
    assert_eq!(
        e,
        LoopConfigError::TooFewRepeats {
            field: "medium_repeats",
            value: 1
        }
    );
    assert_eq!(
        e.to_string(),
        "loop detector medium_repeats is 1; it must be at least 2"
    );
    let two = LoopConfig {
        short_repeats: 2,
        medium_repeats: 2,
        long_repeats: 2,
        ..LoopConfig::DEFAULT
    };
    assert!(LoopDetector::new(two).is_ok(), "2 is the smallest accepted");
    let swapped = LoopConfig {
        medium_from: 65,
        ..LoopConfig::DEFAULT
    };
    assert_eq!(
        swapped.check(),
        Err(LoopConfigError::TiersOutOfOrder {
            medium_from: 65,
            long_from: 64
        })
    );
    let equal = LoopConfig {
        medium_from: 64,
        ..LoopConfig::DEFAULT
    };
    assert_eq!(equal.check(), Ok(()), "no medium tier at all is allowed");
}

/// Lines drawn from a few, so repeats and cycles are common, with odd whitespace.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let line = prop::sample::select(vec![
        "ab",
        " ab",
        "ab\t",
        "a b",
        "a  b",
        "",
        " ",
        "}",
        "});",
        "x",
        "hello there",
        "é",
        "I will now call the get_weather tool...",
        "He is here. ",
        "He is here.",
        "Yes! ",
        "3.5 ",
        "1. ab",
        "ab? ab",
    ]);
    prop::collection::vec((line, prop::bool::weighted(0.9)), 0..120).prop_map(|v| {
        let mut out = Vec::new();
        for (l, nl) in v {
            out.extend_from_slice(l.as_bytes());
            if nl {
                out.push(b'\n');
            }
        }
        out
    })
}

fn small_config() -> impl Strategy<Value = LoopConfig> {
    (
        0usize..20,
        0usize..30,
        2u32..8,
        2u32..8,
        2u32..8,
        any::<bool>(),
    )
        .prop_map(|(m, l, s, me, lo, sentences)| LoopConfig {
            medium_from: m.min(l),
            long_from: m.max(l),
            short_repeats: s,
            medium_repeats: me,
            long_repeats: lo,
            sentence_ends_line: sentences,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Every way of cutting the stream into pieces fires at the same byte, with the same
    /// report, as the reference reading the rules literally.
    #[test]
    fn any_split_fires_where_the_reference_does(
        text in stream(),
        config in small_config(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let want = reference(&text, config);
        let mut whole = LoopDetector::new(config).unwrap();
        prop_assert_eq!(whole.push(&text), want);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
        cuts.sort_unstable();
        let mut split = LoopDetector::new(config).unwrap();
        let mut got = None;
        let mut from = 0;
        for to in cuts.into_iter().chain([text.len()]) {
            got = split.push(&text[from..to]);
            from = to;
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(split.fired(), want);
        prop_assert_eq!(split.offset(), want.map_or(text.len() as u64, |w| w.at));
    }

    /// Byte by byte is one more split: the extreme one.
    #[test]
    fn byte_by_byte_is_the_same(text in stream()) {
        let want = fire(std::str::from_utf8(&text).unwrap());
        let mut d = LoopDetector::default();
        let mut got = None;
        for b in &text {
            got = d.push(std::slice::from_ref(b));
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(want, reference(&text, LoopConfig::DEFAULT));
    }
}
