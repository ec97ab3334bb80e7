//! The recorded llama-server transcripts in `fixtures/*.sse` parse, with the 1 MiB buffer
//! `loopd` uses, into exactly the events a plain reading of the file says they hold, however
//! the bytes are split into reads.
//!
//! The expected events are computed here without the parser: the recorder's bodies are framed
//! as `data: X\n\n` (and `:\n\n` keep-alive comments while the prompt is processed), so a
//! split on `\n` gives them. The framing itself is checked first, so a re-recorded fixture
//! with another shape fails loudly instead of being misread by this test.

use std::path::PathBuf;

use sse_nostd::{is_done, SseError};

mod common;
use common::owned::{parse_pieces, Ev};

/// loopd's buffer: the M2a design's 1 MiB cap per SSE line.
const LOOPD_CAP: usize = 1024 * 1024;

fn fixtures_dir() -> PathBuf {
    llama_harness::fixture_path("")
}

/// Every `fixtures/*.sse`, sorted by name, with its bytes.
fn sse_fixtures() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures/ is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sse"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("a fixture is readable"))
        })
        .collect();
    out.sort();
    out
}

/// The events of a `data: X\n\n` / `:\n\n`-framed body, by a plain split on `\n`.
fn expected_events(name: &str, bytes: &[u8]) -> Vec<Ev> {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{name}: not UTF-8: {e}"));
    let body = text
        .strip_suffix("\n\n")
        .unwrap_or_else(|| panic!("{name}: does not end in an empty line"));
    let mut out = Vec::new();
    for (i, block) in body.split("\n\n").enumerate() {
        assert!(
            !block.contains('\n') && !block.contains('\r'),
            "{name}: block {i} is not one line: {block:?}"
        );
        if let Some(data) = block.strip_prefix("data: ") {
            out.push(Ev::Msg(
                b"message".to_vec(),
                data.as_bytes().to_vec(),
                Vec::new(),
            ));
        } else if let Some(comment) = block.strip_prefix(':') {
            out.push(Ev::Comment(comment.as_bytes().to_vec()));
        } else {
            panic!("{name}: block {i} is neither `data: ` nor a comment: {block:?}");
        }
    }
    out
}

/// Feeds `input` in reads of `read` bytes into a fresh `LOOPD_CAP` parser whose buffer is on
/// the heap, collects every event, and finishes the stream.
fn parse_in_reads(input: &[u8], read: usize) -> (Vec<Ev>, Result<(), SseError>) {
    let mut out = parse_pieces::<LOOPD_CAP>(input.chunks(read));
    match out.last() {
        Some(&Ev::Err(e)) => {
            out.pop();
            (out, Err(e))
        }
        _ => (out, Ok(())),
    }
}

#[test]
fn the_recorded_transcripts_are_all_here() {
    let names: Vec<String> = sse_fixtures().into_iter().map(|(n, _)| n).collect();
    // The README lists these five; a missing one would make the tests below pass on less.
    for want in [
        "plain.sse",
        "progress.sse",
        "reasoning_end.sse",
        "thinking.sse",
        "tool_call.sse",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
}

#[test]
fn every_transcript_gives_its_data_lines_then_done() {
    for (name, bytes) in sse_fixtures() {
        let want = expected_events(&name, &bytes);
        let (got, end) = parse_in_reads(&bytes, bytes.len());
        assert_eq!(end, Ok(()), "{name}: finish");
        assert_eq!(got.len(), want.len(), "{name}: event count");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: event {i}");
        }
        let datas: Vec<&[u8]> = got
            .iter()
            .filter_map(|e| match e {
                Ev::Msg(_, data, _) => Some(&data[..]),
                _ => None,
            })
            .collect();
        assert!(datas.len() >= 2, "{name}: only {} messages", datas.len());
        let (last, before) = datas.split_last().unwrap();
        assert!(is_done(last), "{name}: last data is {last:?}");
        assert!(
            before.iter().all(|d| !is_done(d) && d.starts_with(b"{")),
            "{name}: a message before the last is not a JSON chunk"
        );
    }
}

#[test]
fn progress_transcript_keeps_its_keepalive_comments() {
    // Pins the one fixture with comments, so the comment path above is known to be exercised.
    let (name, bytes) = sse_fixtures()
        .into_iter()
        .find(|(n, _)| n == "progress.sse")
        .unwrap();
    let (got, end) = parse_in_reads(&bytes, bytes.len());
    assert_eq!(end, Ok(()), "{name}");
    let comments = got.iter().filter(|e| matches!(e, Ev::Comment(_))).count();
    assert_eq!(comments, 4, "{name}: keep-alive comments");
    assert!(got.iter().all(|e| !matches!(e, Ev::Retry(_))));
}

#[test]
fn every_transcript_gives_the_same_events_however_it_is_read() {
    for (name, bytes) in sse_fixtures() {
        let want = expected_events(&name, &bytes);
        for read in [1, 7, 128, 1460] {
            let (got, end) = parse_in_reads(&bytes, read);
            assert_eq!(end, Ok(()), "{name} in {read}-byte reads: finish");
            assert!(got == want, "{name} in {read}-byte reads: events differ");
        }
    }
}

#[test]
fn a_transcript_cut_inside_its_last_event_is_unterminated() {
    for (name, bytes) in sse_fixtures() {
        let want = expected_events(&name, &bytes);
        // Without its last byte the file ends `data: [DONE]\n`: a field line, no empty line.
        let cut = &bytes[..bytes.len() - 1];
        for read in [1, 1460, cut.len()] {
            let (got, end) = parse_in_reads(cut, read);
            assert_eq!(
                end,
                Err(SseError::Unterminated),
                "{name} in {read}-byte reads"
            );
            assert!(
                got[..] == want[..want.len() - 1],
                "{name} in {read}-byte reads: all events but [DONE]"
            );
        }
    }
}
