//! `text_calls`, `parse_text_calls` and `prose` on any UTF-8 content.
//!
//! Checks: no panic; blocks are ordered, disjoint, inside the content and open with
//! `<tool_call>`; an unterminated block is the last and runs to the end; a call's block ends
//! with `</tool_call>`, its name and arguments lie inside it, `serde_json` reads the arguments
//! as an object and `check_json_object` (the same rules for a native call's arguments) takes
//! them; the prose and the blocks add up to the content; the list of capacity 4 holds exactly
//! the iterator's blocks or refuses at the fifth; and content `check_json_object` takes is an
//! object to `serde_json`. Seeds (the model's own call, nesting at the limit and one past) are
//! in `fuzz/seeds/text_calls`.
use llama_proto::{check_json_object, parse_text_calls, prose, TextCallError, TooManyTextCalls};

/// The `text_calls` fuzz target: panics when a check fails.
pub fn text_calls(data: &[u8]) {
    let Ok(content) = std::str::from_utf8(data) else {
        return;
    };
    let base = content.as_ptr() as usize;
    let blocks: Vec<_> = llama_proto::text_calls(content).collect();
    let mut pos = 0;
    for (i, b) in blocks.iter().enumerate() {
        assert!(
            pos <= b.start && b.start < b.end && b.end <= content.len(),
            "{b:?}"
        );
        assert!(content[b.start..].starts_with("<tool_call>"));
        pos = b.end;
        match b.outcome {
            Ok(call) => {
                let block = &content[b.start..b.end];
                assert!(block.ends_with("</tool_call>"));
                for s in [call.name, call.arguments] {
                    let at = s.as_ptr() as usize - base;
                    assert!(at > b.start && at + s.len() < b.end);
                }
                assert!(!call.name.is_empty() && !call.name.contains(['\\', '"']));
                let v: serde_json::Value =
                    serde_json::from_str(call.arguments).expect("accepted arguments are JSON");
                assert!(v.is_object());
                assert_eq!(check_json_object(call.arguments), Ok(()));
            }
            Err(TextCallError::Unterminated) => {
                assert_eq!(i, blocks.len() - 1, "an unterminated block is the last");
                assert_eq!(b.end, content.len());
            }
            Err(_) => {}
        }
    }
    if check_json_object(content).is_ok() {
        let v: serde_json::Value =
            serde_json::from_str(content).expect("an object check_json_object takes is JSON");
        assert!(v.is_object());
    }
    let kept: usize = prose(content).map(str::len).sum();
    let in_blocks: usize = blocks.iter().map(|b| b.end - b.start).sum();
    assert_eq!(kept + in_blocks, content.len());
    match parse_text_calls::<4>(content) {
        Ok(list) => assert_eq!(list.as_slice(), blocks.as_slice()),
        Err(e) => assert_eq!(
            e,
            TooManyTextCalls {
                capacity: 4,
                at: blocks[4].start
            }
        ),
    }
}
