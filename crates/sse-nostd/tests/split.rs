//! Property tests: the parser agrees with a plain reference reading of the WHATWG rules, and
//! every way of splitting the same bytes gives the same events (and the same error).

use proptest::prelude::*;
use sse_nostd::SseError;

mod common;
use common::owned::{parse_pieces, Ev};

/// Feeds `input` cut at `cuts` (sorted offsets), then finishes; an error ends the list.
fn parse<const N: usize>(input: &[u8], cuts: &[usize]) -> Vec<Ev> {
    let mut from = 0;
    let pieces = cuts.iter().copied().chain([input.len()]).map(|to| {
        let piece = &input[from..to.max(from)];
        from = to.max(from);
        piece
    });
    parse_pieces::<N>(pieces)
}

/// The spec's algorithm written out plainly, on the whole input, without caps.
fn reference(input: &[u8]) -> Vec<Ev> {
    let input = input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input);
    let mut lines = Vec::new();
    let mut line = Vec::new();
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'\r' => {
                lines.push(std::mem::take(&mut line));
                if input.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
            }
            b'\n' => lines.push(std::mem::take(&mut line)),
            b => line.push(b),
        }
        i += 1;
    }
    let (mut out, mut data, mut event, mut id) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut has_data, mut open) = (false, false);
    for l in lines {
        if l.is_empty() {
            if has_data {
                let name = if event.is_empty() {
                    b"message".to_vec()
                } else {
                    event.clone()
                };
                out.push(Ev::Msg(name, data.clone(), id.clone()));
            }
            (data, event, has_data, open) = (Vec::new(), Vec::new(), false, false);
            continue;
        }
        if l[0] == b':' {
            out.push(Ev::Comment(l[1..].to_vec()));
            continue;
        }
        open = true;
        let (name, mut value) = match l.iter().position(|&b| b == b':') {
            Some(c) => (&l[..c], &l[c + 1..]),
            None => (&l[..], &l[l.len()..]),
        };
        if value.first() == Some(&b' ') {
            value = &value[1..];
        }
        match name {
            b"data" => {
                if has_data {
                    data.push(b'\n');
                }
                data.extend_from_slice(value);
                has_data = true;
            }
            b"event" => event = value.to_vec(),
            b"id" if !value.contains(&0) => id = value.to_vec(),
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                let ms = std::str::from_utf8(value).unwrap().parse::<u128>();
                out.push(Ev::Retry(
                    ms.map_or(u64::MAX, |v| v.min(u64::MAX as u128) as u64),
                ));
            }
            _ => {}
        }
    }
    if open || !line.is_empty() {
        out.push(Ev::Err(SseError::Unterminated));
    }
    out
}

fn stream(max_tokens: usize) -> impl Strategy<Value = Vec<u8>> {
    let token = prop::sample::select(vec![
        &b"data"[..],
        b"data:",
        b"data: ",
        b"event:",
        b"id:",
        b"retry:",
        b":",
        b" ",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b"\xEF\xBB\xBF",
        b"\xEF",
        b"\0",
        b"12",
        b"x",
        b"hello world",
    ]);
    prop::collection::vec(token, 0..max_tokens).prop_map(|t| t.concat())
}

fn random_cuts(len: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..=len, 0..64).prop_map(|mut c| {
        c.sort_unstable();
        c
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn whole_input_matches_the_reference(input in stream(60)) {
        prop_assert_eq!(parse::<4096>(&input, &[]), reference(&input));
    }

    #[test]
    fn every_single_cut_gives_the_same_events(input in stream(24)) {
        for n in [4096, 24] {
            let whole = if n == 4096 { parse::<4096>(&input, &[]) } else { parse::<24>(&input, &[]) };
            for cut in 0..=input.len() {
                let split = if n == 4096 { parse::<4096>(&input, &[cut]) } else { parse::<24>(&input, &[cut]) };
                prop_assert_eq!(&split, &whole, "cut at {} with N = {}", cut, n);
            }
        }
    }

    #[test]
    fn byte_by_byte_gives_the_same_events(input in stream(40)) {
        let every: Vec<usize> = (0..=input.len()).collect();
        prop_assert_eq!(parse::<4096>(&input, &every), parse::<4096>(&input, &[]));
        prop_assert_eq!(parse::<32>(&input, &every), parse::<32>(&input, &[]));
    }

    #[test]
    fn random_cuts_of_long_streams_give_the_same_events(
        (input, cuts) in stream(600).prop_flat_map(|i| { let n = i.len(); (Just(i), random_cuts(n)) })
    ) {
        prop_assert_eq!(parse::<4096>(&input, &cuts), parse::<4096>(&input, &[]));
        prop_assert_eq!(parse::<64>(&input, &cuts), parse::<64>(&input, &[]));
        prop_assert_eq!(parse::<{ 1 << 16 }>(&input, &[]), reference(&input));
    }

    #[test]
    fn a_cr_lf_split_is_one_line_end(head in stream(12), tail in stream(12)) {
        let mut input = head.clone();
        input.extend_from_slice(b"data: a\r\n");
        let cut = input.len() - 1;
        input.extend_from_slice(&tail);
        prop_assert_eq!(parse::<4096>(&input, &[cut]), reference(&input));
    }
}
