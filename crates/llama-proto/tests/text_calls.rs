//! `text_calls`, `parse_text_calls`, `prose` and `check_json_object`: one test per rule with
//! the bytes inline, the list at its capacity and one past, numbers at each edge of their
//! range and length, a differential property test against `serde_json`, and the model's own
//! text from `fixtures/tool_call_text.sse`.

mod common;
#[path = "common/json_depth.rs"]
mod json_depth;

use json_depth::depth;
use llama_proto::{
    check_json_object, decode_chunk, parse_text_calls, prose, text_calls, JsonError, Payload,
    TextCall, TextCallBlock, TextCallError, TooManyTextCalls, MAX_NESTING, MAX_NUMBER_LEN,
};
use proptest::prelude::*;

fn blocks(content: &str) -> Vec<TextCallBlock<'_>> {
    text_calls(content).collect()
}

/// The single block of `content` and its outcome.
fn one(content: &str) -> Result<TextCall<'_>, TextCallError> {
    let b = blocks(content);
    assert_eq!(b.len(), 1, "{content:?}: {b:?}");
    b[0].outcome
}

fn call<'a>(name: &'a str, arguments: &'a str) -> Result<TextCall<'a>, TextCallError> {
    Ok(TextCall { name, arguments })
}

fn kept(content: &str) -> String {
    prose(content).collect()
}

#[test]
fn the_template_form_is_a_call() {
    let c = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert_eq!(
        blocks(c),
        [TextCallBlock {
            start: 0,
            end: c.len(),
            outcome: call("get_weather", "{\"city\": \"Paris\"}"),
        }]
    );
    assert_eq!(kept(c), "");
}

#[test]
fn no_block_is_no_call_and_all_prose() {
    for c in [
        "",
        "Paris is sunny.",
        "a </tool_call> b",
        "<tool_call",
        "<tool_cal>{}",
    ] {
        assert_eq!(blocks(c), [], "{c:?}");
        assert_eq!(kept(c), c);
    }
}

#[test]
fn blocks_come_in_order_with_their_ranges_and_the_prose_between() {
    let c = "First.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\nThen \
             <tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": null}]}}</tool_call> end";
    let b = blocks(c);
    assert_eq!(b.len(), 2);
    assert_eq!(
        &c[b[0].start..b[0].end],
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
    );
    assert_eq!(b[0].outcome, call("a", "{}"));
    assert_eq!(b[1].outcome, call("b", "{\"x\": [1, {\"y\": null}]}"));
    assert_eq!(&c[b[1].end..], " end");
    assert_eq!(
        prose(c).collect::<Vec<_>>(),
        ["First.\n", "\nThen ", " end"]
    );
}

#[test]
fn whitespace_around_the_object_is_allowed_and_other_keys_ignored() {
    assert_eq!(
        one(
            "<tool_call> \r\n\t{ \"id\": 7, \"arguments\" : { } , \"name\":\"f\" }\n\n</tool_call>"
        ),
        call("f", "{ }")
    );
}

#[test]
fn a_close_tag_inside_a_json_string_does_not_close_the_block() {
    let c = "<tool_call>{\"name\": \"echo\", \"arguments\": {\"s\": \"</tool_call><tool_call>\"}}</tool_call>";
    assert_eq!(
        blocks(c),
        [TextCallBlock {
            start: 0,
            end: c.len(),
            outcome: call("echo", "{\"s\": \"</tool_call><tool_call>\"}"),
        }]
    );
}

#[test]
fn a_block_without_its_close_tag_is_unterminated_and_last() {
    for c in [
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Par",
        "<tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {}} and <tool_call>",
    ] {
        assert_eq!(
            blocks(c),
            [TextCallBlock {
                start: 0,
                end: c.len(),
                outcome: Err(TextCallError::Unterminated),
            }],
            "{c:?}"
        );
        assert_eq!(kept(c), "");
    }
    let c = "ok <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> <tool_call>{";
    let b = blocks(c);
    assert_eq!(b.len(), 2);
    assert_eq!(b[1].outcome, Err(TextCallError::Unterminated));
    assert_eq!((b[1].start, b[1].end), (c.len() - 12, c.len()));
    assert_eq!(kept(c), "ok  ");
}

#[test]
fn malformed_json_says_where_and_the_next_block_is_still_found() {
    let c = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1,}}</tool_call>\
             <tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
    let b = blocks(c);
    assert_eq!(b.len(), 2);
    assert_eq!(
        b[0].outcome,
        Err(TextCallError::MalformedJson {
            at: c.find(",}").unwrap() + 1
        })
    );
    assert_eq!(b[0].end, c.find("</tool_call>").unwrap() + 12);
    assert_eq!(b[1].outcome, call("g", "{}"));
}

#[test]
fn json_that_stops_at_the_close_tag_is_malformed_there() {
    // The object is missing its last brace: the scanner meets `<` of the close tag.
    let c = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}</tool_call>";
    let close = c.find("</tool_call>").unwrap();
    assert_eq!(one(c), Err(TextCallError::MalformedJson { at: close }));
    // A string that runs over the close tag: the fault is reported at the block's end.
    let c = "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"abc}}</tool_call> prose";
    let close = c.find("</tool_call>").unwrap();
    assert_eq!(one(c), Err(TextCallError::MalformedJson { at: close }));
    assert_eq!(kept(c), " prose");
}

#[test]
fn each_json_fault_is_malformed() {
    for (inner, fault) in [
        ("{'name': 'f'}", "'"),
        ("{\"name\": \"f\", \"arguments\": {},}", ",}"),
        ("{\"name\": \"f\" \"arguments\": {}}", "\"arguments"),
        ("{\"name\": \"f\", \"arguments\": {\"a\": tru}}", "}}"),
        ("{\"name\": \"f\", \"arguments\": {\"a\": 01}}", "1}}"),
        ("{\"name\": \"f\", \"arguments\": {\"a\": \"\\q\"}}", "q"),
        (
            "{\"name\": \"f\", \"arguments\": {\"a\": \"\\ud800\"}}",
            "\"}}",
        ),
        ("{\"name\": \"f\", \"arguments\": {\"a\": \"\t\"}}", "\t"),
        ("{\"name\": \"f\", \"arguments\": {\"a\" 1}}", "1}}"),
        ("{\"name\": \"f\", \"arguments\": {a: 1}}", "a:"),
    ] {
        let c = format!("<tool_call>{inner}</tool_call>");
        let at = 11 + inner.find(fault).unwrap() + usize::from(fault == ",}");
        assert_eq!(one(&c), Err(TextCallError::MalformedJson { at }), "{inner}");
    }
}

#[test]
fn the_block_must_hold_an_object() {
    for inner in ["", " ", "[1]", "\"name\"", "get_weather({})", "null"] {
        let c = format!("<tool_call>{inner}</tool_call>");
        let at = 11 + inner.len() - inner.trim_start().len();
        assert_eq!(one(&c), Err(TextCallError::NotAnObject { at }), "{inner:?}");
    }
}

#[test]
fn text_after_the_object_is_trailing() {
    let c = "<tool_call>{\"name\": \"f\", \"arguments\": {}} {\"name\": \"g\", \"arguments\": {}}</tool_call>";
    assert_eq!(one(c), Err(TextCallError::TrailingText { at: 42 }));
    assert_eq!(&c[42..43], "{");
}

#[test]
fn the_name_must_be_there_once_as_a_plain_non_empty_string() {
    for (inner, err) in [
        ("{}", TextCallError::MissingName),
        ("{\"arguments\": {}}", TextCallError::MissingName),
        (
            "{\"n\\u0061me\": \"f\", \"arguments\": {}}",
            TextCallError::MissingName,
        ),
        (
            "{\"name\": 7, \"arguments\": {}}",
            TextCallError::NameNotString { at: 20 },
        ),
        (
            "{\"name\": null, \"arguments\": {}}",
            TextCallError::NameNotString { at: 20 },
        ),
        (
            "{\"name\": \"\", \"arguments\": {}}",
            TextCallError::BadName { at: 20 },
        ),
        (
            "{\"name\": \"f\\u0020\", \"arguments\": {}}",
            TextCallError::BadName { at: 20 },
        ),
        (
            "{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}",
            TextCallError::DuplicateKey { at: 25 },
        ),
    ] {
        let c = format!("<tool_call>{inner}</tool_call>");
        assert_eq!(one(&c), Err(err), "{inner}");
    }
}

#[test]
fn the_arguments_must_be_there_once_as_an_object() {
    for (inner, err) in [
        ("{\"name\": \"f\"}", TextCallError::MissingArguments),
        (
            "{\"name\": \"f\", \"arguments\": [1]}",
            TextCallError::ArgumentsNotObject { at: 38 },
        ),
        (
            "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}",
            TextCallError::ArgumentsNotObject { at: 38 },
        ),
        (
            "{\"name\": \"f\", \"arguments\": null}",
            TextCallError::ArgumentsNotObject { at: 38 },
        ),
        (
            "{\"name\": \"f\", \"arguments\": {}, \"arguments\": {}}",
            TextCallError::DuplicateKey { at: 42 },
        ),
    ] {
        let c = format!("<tool_call>{inner}</tool_call>");
        assert_eq!(one(&c), Err(err), "{inner}");
    }
}

#[test]
fn the_first_wrong_key_in_order_wins_over_a_missing_one() {
    let c = "<tool_call>{\"arguments\": 1, \"name\": 2}</tool_call>";
    assert_eq!(one(c), Err(TextCallError::ArgumentsNotObject { at: 25 }));
    let c = "<tool_call>{\"name\": 2}</tool_call>";
    assert_eq!(one(c), Err(TextCallError::NameNotString { at: 20 }));
}

/// A call whose object nests `depth` levels in all, the object itself counting as one.
fn nested(depth: usize) -> String {
    let inner = depth - 2;
    format!(
        "<tool_call>{{\"name\": \"f\", \"arguments\": {{\"a\": {}1{}}}}}</tool_call>",
        "[".repeat(inner),
        "]".repeat(inner)
    )
}

#[test]
fn nesting_at_max_nesting_is_a_call_and_one_past_is_too_deep() {
    let at_limit = nested(MAX_NESTING);
    let args = &at_limit[at_limit.find("{\"a\"").unwrap()..at_limit.len() - "}</tool_call>".len()];
    assert_eq!(one(&at_limit), call("f", args));
    let past = nested(MAX_NESTING + 1);
    let at = 11 + "{\"name\": \"f\", \"arguments\": {\"a\": ".len() + (MAX_NESTING - 2);
    assert_eq!(&past[at..at + 1], "[");
    assert_eq!(one(&past), Err(TextCallError::TooDeep { at }));
}

#[test]
fn a_deep_flood_costs_no_stack() {
    // A hundred thousand open brackets: refused at the limit, never walked further.
    let c = format!(
        "<tool_call>{{\"name\": \"f\", \"arguments\": {}",
        "[".repeat(100_000)
    );
    assert_eq!(one(&c), Err(TextCallError::Unterminated));
    let c = format!("{c}</tool_call>");
    let b = blocks(&c);
    assert!(
        matches!(b[0].outcome, Err(TextCallError::TooDeep { .. })),
        "{:?}",
        b[0].outcome
    );
}

/// A call whose arguments are `{"n": <number>}`, and the number's offset in it.
fn with_number(number: &str) -> (String, usize) {
    let head = "<tool_call>{\"name\": \"f\", \"arguments\": {\"n\": ";
    (format!("{head}{number}}}}}</tool_call>"), head.len())
}

/// The number is accepted, in the call and alone, and serde_json reads the arguments.
fn assert_accepted(number: &str) {
    let (c, _) = with_number(number);
    let args = format!("{{\"n\": {number}}}");
    assert_eq!(one(&c), call("f", &args), "{number}");
    assert_eq!(check_json_object(&args), Ok(()), "{number}");
    let v: serde_json::Value = serde_json::from_str(&args).expect(number);
    assert!(v["n"].is_number(), "{number}");
}

/// The number is refused in the call and alone, at its first byte, with the error `call_err`
/// and `json_err` make of that offset.
fn assert_refused(
    number: &str,
    call_err: fn(usize) -> TextCallError,
    json_err: fn(usize) -> JsonError,
) {
    let (c, at) = with_number(number);
    assert_eq!(one(&c), Err(call_err(at)), "{number}");
    let args = format!("{{\"n\": {number}}}");
    assert_eq!(check_json_object(&args), Err(json_err(6)), "{number}");
}

fn out_of_range(number: &str) {
    assert_refused(
        number,
        |at| TextCallError::NumberOutOfRange { at },
        |at| JsonError::NumberOutOfRange { at },
    );
}

fn too_long(number: &str) {
    assert_refused(
        number,
        |at| TextCallError::NumberTooLong { at },
        |at| JsonError::NumberTooLong { at },
    );
}

#[test]
fn the_largest_number_accepted_is_the_f64_below_f64_max() {
    // f64::MAX's neighbour below, and the last text before the midpoint between the two
    // (1.79769313486231560835...e308, which rounds to even: the neighbour).
    for n in [
        "1.7976931348623155e308",
        "1.797693134862315608e308",
        "-1.7976931348623155e308",
        "-1.797693134862315608e308",
    ] {
        assert_accepted(n);
    }
}

#[test]
fn a_number_that_rounds_to_f64_max_or_beyond_is_out_of_range_at_its_first_byte() {
    // Just past the midpoint: correctly rounded, f64::MAX. serde_json's default parser, which
    // multiplies a rounded significand by a rounded power of ten, overflows on some such
    // texts (1.7976931348623158e308) and reads others (1.7976931348623157e308, f64::MAX's
    // own): the rule stops below f64::MAX so that it never has to tell them apart.
    for n in [
        "1.797693134862315609e308",
        "1.7976931348623157e308",
        "1.7976931348623158e308",
        "-1.7976931348623157e308",
        // Past the midpoint to 2^1024: infinite for every reader.
        "1.7976931348623159e308",
        "-1.7976931348623159e308",
    ] {
        out_of_range(n);
    }
    assert!(serde_json::from_str::<serde_json::Value>("1.7976931348623158e308").is_err());
}

#[test]
fn a_huge_positive_exponent_is_out_of_range() {
    for n in [
        "1e400",
        "-1e400",
        "1E+400",
        "0.1e310",
        "1e99999999999999999999",
    ] {
        out_of_range(n);
        assert!(serde_json::from_str::<serde_json::Value>(n).is_err(), "{n}");
    }
}

#[test]
fn a_huge_negative_exponent_underflows_to_zero_and_is_accepted() {
    for n in [
        "1e-400",
        "-1e-400",
        "1E-400",
        "4.9e-324",
        "1e-99999999999999999999",
    ] {
        assert_accepted(n);
    }
    let v: serde_json::Value = serde_json::from_str("1e-400").unwrap();
    assert_eq!(v.as_f64(), Some(0.0));
    // Zero times any power of ten is zero.
    assert_accepted("0e99999999999999999999");
}

#[test]
fn a_number_at_the_length_cap_is_accepted_and_one_past_is_too_long() {
    let integer = format!("1{}", "0".repeat(MAX_NUMBER_LEN - 1));
    let fraction = format!("-0.{}", "7".repeat(MAX_NUMBER_LEN - 3));
    let exponent = format!("1e-{}", "9".repeat(MAX_NUMBER_LEN - 3));
    for n in [&integer, &fraction, &exponent] {
        assert_eq!(n.len(), MAX_NUMBER_LEN);
        assert_accepted(n);
        too_long(&format!("{n}0"));
    }
    // The fuzz find: a 101-digit exponent, which serde_json refuses as out of range.
    too_long(
        "3333333333333333333333333333333333e33333333333333333333333333333333333333333333333333333333333333333330",
    );
}

#[test]
fn a_number_fault_past_the_close_tag_is_malformed_there() {
    // The first `</tool_call>` is inside a string, so the block ends there and the number
    // after it is outside the block.
    for n in ["1e400", &"1".repeat(MAX_NUMBER_LEN + 1)] {
        let c = format!(
            "<tool_call>{{\"name\": \"f\", \"arguments\": {{\"s\": \"</tool_call>\", \"n\": {n}}}}}</tool_call>"
        );
        let close = c.find("</tool_call>").unwrap();
        assert_eq!(
            blocks(&c)[0].outcome,
            Err(TextCallError::MalformedJson { at: close })
        );
    }
}

#[test]
fn numbers_in_other_keys_are_held_to_the_same_rules() {
    let c = "<tool_call>{\"id\": 1e400, \"name\": \"f\", \"arguments\": {}}</tool_call>";
    assert_eq!(one(c), Err(TextCallError::NumberOutOfRange { at: 18 }));
    assert_eq!(&c[18..23], "1e400");
}

/// Every text serde_json's default parser overflows on is refused: it holds a number as a
/// `u64` significand and a power of ten, so near `f64::MAX` that is every significand whose
/// value lies within a few units in the last place of it, for each power it can take
/// (10^289 to 10^308; a lower one with any `u64` stays far below).
#[test]
fn no_number_accepted_is_one_serde_json_overflows_on() {
    let max = format!("{:.0}", f64::MAX);
    let ulp = f64::MAX - f64::from_bits(f64::MAX.to_bits() - 1);
    let (mut refused_by_serde, mut accepted) = (0, 0);
    for e in 289..=308 {
        let prefix: u64 = max[..max.len() - e].parse().unwrap();
        let span = (3.0 * ulp / 10f64.powi(e as i32)).ceil() as u64 + 2;
        for sig in prefix - span.min(prefix)..=prefix + span {
            let args = format!("{{\"n\": {sig}e{e}}}");
            let serde_ok = serde_json::from_str::<serde_json::Value>(&args).is_ok();
            refused_by_serde += usize::from(!serde_ok);
            if check_json_object(&args).is_ok() {
                accepted += 1;
                assert!(serde_ok, "{args}");
            }
        }
    }
    // The window reaches both sides of the edge.
    assert!(
        refused_by_serde > 1000 && accepted > 1000,
        "{refused_by_serde} {accepted}"
    );
}

#[test]
fn check_json_object_takes_one_object_with_whitespace_around_it() {
    for text in [
        "{}",
        " \t\r\n{\"a\": [1, {\"b\": null}]} \n",
        "{\"city\": \"Paris\"}",
    ] {
        assert_eq!(check_json_object(text), Ok(()), "{text:?}");
    }
    for (text, err) in [
        ("", JsonError::NotAnObject { at: 0 }),
        ("  ", JsonError::NotAnObject { at: 2 }),
        ("[1]", JsonError::NotAnObject { at: 0 }),
        ("\"{}\"", JsonError::NotAnObject { at: 0 }),
        (" {} {}", JsonError::TrailingText { at: 4 }),
        ("{}x", JsonError::TrailingText { at: 2 }),
        ("{\"a\": 1,}", JsonError::Malformed { at: 8 }),
        ("{\"a\": 01}", JsonError::Malformed { at: 7 }),
        ("{\"a\": ", JsonError::Malformed { at: 6 }),
    ] {
        assert_eq!(check_json_object(text), Err(err), "{text:?}");
    }
}

#[test]
fn check_json_object_nests_max_nesting_deep_and_refuses_one_past() {
    // The object itself is the first level.
    let nested = |depth: usize| {
        format!(
            "{{\"a\": {}1{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    };
    assert_eq!(check_json_object(&nested(MAX_NESTING)), Ok(()));
    let at = 6 + MAX_NESTING - 1;
    assert_eq!(
        check_json_object(&nested(MAX_NESTING + 1)),
        Err(JsonError::TooDeep { at })
    );
    let flood = format!("{{\"a\": {}", "[".repeat(100_000));
    assert_eq!(check_json_object(&flood), Err(JsonError::TooDeep { at }));
}

fn many(n: usize) -> String {
    (0..n)
        .map(|i| format!("<tool_call>{{\"name\": \"t{i}\", \"arguments\": {{}}}}</tool_call>\n"))
        .collect()
}

#[test]
fn the_list_holds_its_capacity_and_refuses_one_past() {
    let four = many(4);
    let list = parse_text_calls::<4>(&four).unwrap();
    assert_eq!(list.len(), 4);
    let names: Vec<_> = list
        .as_slice()
        .iter()
        .map(|b| b.outcome.unwrap().name)
        .collect();
    assert_eq!(names, ["t0", "t1", "t2", "t3"]);
    assert_eq!(list.as_slice(), blocks(&four).as_slice());

    let five = many(5);
    let fifth = five.rfind("<tool_call>").unwrap();
    assert_eq!(
        parse_text_calls::<4>(&five).unwrap_err(),
        TooManyTextCalls {
            capacity: 4,
            at: fifth
        }
    );
    // Errors count against the capacity like calls: the caller sees every block or none.
    let bad = "<tool_call>{}</tool_call>".repeat(2);
    assert_eq!(parse_text_calls::<1>(&bad).unwrap_err().at, 25);
    let empty = parse_text_calls::<0>("no calls").unwrap();
    assert!(empty.is_empty());
    assert_eq!(
        parse_text_calls::<0>(&many(1)).unwrap_err(),
        TooManyTextCalls { capacity: 0, at: 0 }
    );
}

#[test]
fn errors_print_what_and_where() {
    assert_eq!(
        TextCallError::MalformedJson { at: 12 }.to_string(),
        "tool_call JSON is malformed at byte 12"
    );
    assert_eq!(
        TextCallError::TooDeep { at: 40 }.to_string(),
        format!("tool_call JSON nests deeper than {MAX_NESTING} levels at byte 40")
    );
    assert_eq!(
        TextCallError::NumberTooLong { at: 33 }.to_string(),
        format!("tool_call JSON number at byte 33 is longer than {MAX_NUMBER_LEN} bytes")
    );
    assert_eq!(
        TextCallError::NumberOutOfRange { at: 33 }.to_string(),
        "tool_call JSON number at byte 33 is out of range (it rounds to f64::MAX or beyond)"
    );
    assert_eq!(
        TooManyTextCalls {
            capacity: 4,
            at: 300
        }
        .to_string(),
        "more than 4 tool_call blocks; the next starts at byte 300"
    );
    for (e, s) in [
        (
            JsonError::NotAnObject { at: 0 },
            "no JSON object at byte 0".to_owned(),
        ),
        (
            JsonError::Malformed { at: 5 },
            "JSON is malformed at byte 5".to_owned(),
        ),
        (
            JsonError::TooDeep { at: 40 },
            format!("JSON nests deeper than {MAX_NESTING} levels at byte 40"),
        ),
        (
            JsonError::NumberTooLong { at: 6 },
            format!("JSON number at byte 6 is longer than {MAX_NUMBER_LEN} bytes"),
        ),
        (
            JsonError::NumberOutOfRange { at: 6 },
            "JSON number at byte 6 is out of range (it rounds to f64::MAX or beyond)".to_owned(),
        ),
        (
            JsonError::TrailingText { at: 2 },
            "text after the JSON object at byte 2".to_owned(),
        ),
    ] {
        assert_eq!(e.to_string(), s);
    }
}

/// The content of the recorded stream, from its deltas.
fn streamed_content(name: &str) -> String {
    let mut content = String::new();
    for p in common::payloads(name) {
        let mut text = vec![0u8; p.len()];
        if let Ok(Payload::Chunk(c)) = decode_chunk(&p, &mut text) {
            content.push_str(c.content.unwrap_or(""));
        }
    }
    content
}

#[test]
fn the_models_own_text_call_from_the_fixture() {
    let content = streamed_content("tool_call_text");
    let list = parse_text_calls::<1>(&content).unwrap();
    assert_eq!(
        list.as_slice(),
        [TextCallBlock {
            start: 0,
            end: content.len(),
            outcome: call("get_weather", "{\"city\": \"Paris\"}"),
        }]
    );
    assert_eq!(kept(&content), "");
    // The server parsed the same call from the same model in `tool_call`.
    let v: serde_json::Value =
        serde_json::from_slice(&common::read("tool_call.response.json")).unwrap();
    let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(f["name"], "get_weather");
    assert_eq!(f["arguments"], "{\"city\": \"Paris\"}");
}

/// Whether `serde_json` takes `text` as one object, nothing after it but whitespace.
fn serde_object(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
}

/// Valid JSON text: scalars from a small set (escapes and surrogate pairs included), arrays
/// and objects around them, with or without spaces.
fn json_text() -> impl Strategy<Value = String> {
    let scalar = prop::sample::select(vec![
        "1",
        "-0.5e3",
        "0",
        "true",
        "false",
        "null",
        "\"a\"",
        "\"\\n\"",
        "\"\\u00e9\"",
        "\"\\ud83d\\ude00\"",
        "\"é\"",
        "\"</tool\"",
        // Out of range for every reader, and underflow to zero, which every reader takes.
        "1e400",
        "-1e-400",
    ])
    .prop_map(str::to_owned);
    scalar.prop_recursive(40, 200, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(inner, 0..4).prop_map(|v| {
                let fields: Vec<String> = v.iter().map(|x| format!("\"k\": {x}")).collect();
                format!("{{{}}}", fields.join(", "))
            }),
        ]
    })
}

/// Valid JSON, or valid JSON with a few atoms put in or bytes taken out.
fn jsonish() -> impl Strategy<Value = String> {
    let atom = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        " ",
        "\"",
        "\"\\x\"",
        "\"\\ud83d\"",
        "01",
        "1.",
        "nul",
        "\u{1}",
        "",
        "",
    ]);
    let edits = prop::collection::vec((any::<prop::sample::Index>(), atom, 0..3usize), 0..3);
    (json_text(), edits).prop_map(|(mut s, edits)| {
        for (at, atom, cut) in edits {
            let mut i = at.index(s.len() + 1);
            while !s.is_char_boundary(i) {
                i -= 1;
            }
            let mut j = (i + cut).min(s.len());
            while !s.is_char_boundary(j) {
                j -= 1;
            }
            s.replace_range(i..j, atom);
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8192))]

    /// The arguments are accepted exactly when `serde_json` reads them as an object and they
    /// nest no deeper than the limit allows under the call object.
    #[test]
    fn arguments_accepted_exactly_when_serde_json_takes_an_object(args in jsonish()) {
        prop_assume!(!args.contains("</tool_call>"));
        let c = format!("<tool_call>{{\"name\": \"f\", \"arguments\": {args}}}</tool_call>");
        let got = one(&c);
        let want = serde_object(&args) && depth(args.as_bytes()) < MAX_NESTING;
        prop_assert_eq!(got.is_ok(), want, "{:?} gave {:?}", args, got);
        // Alone, the arguments may nest one level deeper: no call object around them.
        let alone = check_json_object(&args);
        let want = serde_object(&args) && depth(args.as_bytes()) <= MAX_NESTING;
        prop_assert_eq!(alone.is_ok(), want, "{:?} gave {:?}", args, alone);
        if let Ok(call) = got {
            prop_assert_eq!(call.arguments, args.trim());
        }
    }

    /// Blocks are ordered, disjoint and inside the content; prose and blocks together are the
    /// content; a call's slices lie inside its block; the list agrees with the iterator.
    #[test]
    fn blocks_and_prose_partition_the_content(
        parts in prop::collection::vec(prop::sample::select(vec![
            "<tool_call>", "</tool_call>", "{\"name\": \"f\", \"arguments\": {\"a\": [1]}}",
            "{\"name\": \"f\"", "\"</tool_call>\"", " ", "\n", "text", "{", "}", "\"",
        ]), 0..16)
    ) {
        let c = parts.concat();
        let b = blocks(&c);
        let mut pos = 0;
        for block in &b {
            prop_assert!(pos <= block.start && block.start < block.end && block.end <= c.len());
            prop_assert!(c[block.start..].starts_with("<tool_call>"));
            pos = block.end;
            if let Ok(call) = block.outcome {
                let range = |s: &str| s.as_ptr() as usize - c.as_ptr() as usize;
                prop_assert!(range(call.name) > block.start && range(call.arguments) < block.end);
                prop_assert!(c[block.start..block.end].ends_with("</tool_call>"));
            }
        }
        let kept_text: String = prose(&c).collect();
        let in_blocks: usize = b.iter().map(|b| b.end - b.start).sum();
        prop_assert_eq!(kept_text.len() + in_blocks, c.len());
        let mut expected = String::new();
        let mut pos = 0;
        for block in &b {
            expected.push_str(&c[pos..block.start]);
            pos = block.end;
        }
        expected.push_str(&c[pos..]);
        prop_assert_eq!(kept_text, expected);
        match parse_text_calls::<3>(&c) {
            Ok(list) => prop_assert_eq!(list.as_slice(), b.as_slice()),
            Err(e) => {
                prop_assert!(b.len() > 3);
                prop_assert_eq!(e, TooManyTextCalls { capacity: 3, at: b[3].start });
            }
        }
    }
}
