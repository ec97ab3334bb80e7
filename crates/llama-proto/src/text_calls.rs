//! Tool calls written as text in an assistant message's content, found without an allocator.
//!
//! When the server did not parse a call (no `tool_calls` in the message), the model may still
//! have written one in the form the project's chat template teaches it:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! [`text_calls`] finds every such block in order and says, for each, what it holds: a
//! [`TextCall`] (the name and the raw JSON text of the arguments, both borrowed from the
//! content) or a [`TextCallError`] naming what was wrong. [`parse_text_calls`] collects them
//! into a list whose capacity is a const generic; [`prose`] gives the content between the
//! blocks. Which tool a name means (unknown, exit tool) is the caller's to decide.
//!
//! The rules are in [`text_calls`]'s documentation.

use core::fmt;

use crate::validate::{self, Bad, Fault};
use crate::{MAX_NESTING, MAX_NUMBER_LEN};

const OPEN: &[u8] = b"<tool_call>";
const CLOSE: &[u8] = b"</tool_call>";

/// One tool call found in the text: borrowed slices of the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextCall<'a> {
    /// The tool's name as written between its quotes (it has no escapes).
    pub name: &'a str,
    /// The raw JSON text of the `arguments` object, from its `{` to its `}`.
    pub arguments: &'a str,
}

/// One `<tool_call>` block: where it is in the content and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextCallBlock<'a> {
    /// Byte offset of the block's `<tool_call>`.
    pub start: usize,
    /// Byte offset one past the block's `</tool_call>` (the content's length when unterminated).
    pub end: usize,
    /// The call, or what was wrong with the block.
    pub outcome: Result<TextCall<'a>, TextCallError>,
}

/// What was wrong with one `<tool_call>` block. Offsets are bytes into the whole content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TextCallError {
    /// No `</tool_call>` after the block's JSON (or after its opening tag, when the JSON is
    /// malformed).
    Unterminated,
    /// The block's text does not start with a JSON object.
    NotAnObject {
        /// Where the object should start.
        at: usize,
    },
    /// The object is not valid JSON.
    MalformedJson {
        /// The first byte the JSON cannot have, or the block's end if it stops short.
        at: usize,
    },
    /// Arrays and objects nest deeper than [`MAX_NESTING`].
    TooDeep {
        /// The opening bracket one level too deep.
        at: usize,
    },
    /// A number's text is longer than [`MAX_NUMBER_LEN`] bytes.
    NumberTooLong {
        /// The number's first byte.
        at: usize,
    },
    /// A number rounds to `f64::MAX` or beyond in magnitude, where a reader may overflow.
    NumberOutOfRange {
        /// The number's first byte.
        at: usize,
    },
    /// `"name"` or `"arguments"` appears twice.
    DuplicateKey {
        /// The second occurrence of the key.
        at: usize,
    },
    /// The object has no `"name"`.
    MissingName,
    /// `"name"` is not a string.
    NameNotString {
        /// The value.
        at: usize,
    },
    /// `"name"` is empty or has an escape sequence.
    BadName {
        /// The value.
        at: usize,
    },
    /// The object has no `"arguments"`.
    MissingArguments,
    /// `"arguments"` is not an object (a JSON string holding an object included).
    ArgumentsNotObject {
        /// The value.
        at: usize,
    },
    /// Something other than whitespace between the object and `</tool_call>`.
    TrailingText {
        /// The first byte after the object that is not whitespace.
        at: usize,
    },
}

impl fmt::Display for TextCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TextCallError::Unterminated => f.write_str("tool_call block has no </tool_call>"),
            TextCallError::NotAnObject { at } => {
                write!(f, "tool_call block holds no JSON object at byte {at}")
            }
            TextCallError::MalformedJson { at } => {
                write!(f, "tool_call JSON is malformed at byte {at}")
            }
            TextCallError::TooDeep { at } => write!(
                f,
                "tool_call JSON nests deeper than {MAX_NESTING} levels at byte {at}"
            ),
            TextCallError::NumberTooLong { at } => write!(
                f,
                "tool_call JSON number at byte {at} is longer than {MAX_NUMBER_LEN} bytes"
            ),
            TextCallError::NumberOutOfRange { at } => write!(
                f,
                "tool_call JSON number at byte {at} is out of range (it rounds to f64::MAX or beyond)"
            ),
            TextCallError::DuplicateKey { at } => {
                write!(
                    f,
                    "tool_call has a second \"name\" or \"arguments\" at byte {at}"
                )
            }
            TextCallError::MissingName => f.write_str("tool_call has no \"name\""),
            TextCallError::NameNotString { at } => {
                write!(f, "tool_call \"name\" at byte {at} is not a string")
            }
            TextCallError::BadName { at } => {
                write!(
                    f,
                    "tool_call \"name\" at byte {at} is empty or has an escape"
                )
            }
            TextCallError::MissingArguments => f.write_str("tool_call has no \"arguments\""),
            TextCallError::ArgumentsNotObject { at } => {
                write!(f, "tool_call \"arguments\" at byte {at} is not an object")
            }
            TextCallError::TrailingText { at } => write!(
                f,
                "tool_call block has text after its JSON object at byte {at}"
            ),
        }
    }
}

impl core::error::Error for TextCallError {}

/// [`parse_text_calls`]: the content holds more blocks than the list's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TooManyTextCalls {
    /// The list's capacity.
    pub capacity: usize,
    /// Byte offset of the first block that did not fit.
    pub at: usize,
}

impl fmt::Display for TooManyTextCalls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "more than {} tool_call blocks; the next starts at byte {}",
            self.capacity, self.at
        )
    }
}

impl core::error::Error for TooManyTextCalls {}

/// The `<tool_call>` blocks of `content`, in order, each with its byte range and its
/// [`TextCall`] or [`TextCallError`]. The rules:
/// - A block opens at `<tool_call>` anywhere in the content and closes at the first
///   `</tool_call>` after the JSON it holds (a `</tool_call>` inside a JSON string does not
///   close it). Inside, only JSON whitespace may surround one JSON object.
/// - The object is strict JSON (RFC 8259) whose arrays and objects nest at most
///   [`MAX_NESTING`] deep, the object itself counting as the first level.
/// - Every number in it is at most [`MAX_NUMBER_LEN`] bytes ([`TextCallError::NumberTooLong`])
///   and its correctly rounded `f64` is below `f64::MAX` in magnitude
///   ([`TextCallError::NumberOutOfRange`]); underflow to zero is fine. serde_json and
///   llama-server's nlohmann::json both read every call accepted: the first refuses some
///   texts that round to `f64::MAX`, the second any that rounds to infinity.
///   [`check_json_object`](crate::check_json_object) holds a native call's arguments to the
///   same rules.
/// - It has exactly one `"name"`, a non-empty string without escapes (returned as written,
///   without its quotes), and exactly one `"arguments"`, an object. Other keys are ignored.
///   Keys are compared as written: `"n\u0061me"` is not `"name"`.
/// - A block that has no `</tool_call>` after it is [`TextCallError::Unterminated`]; it runs
///   to the end of the content and is the last block.
/// - A `</tool_call>` without a `<tool_call>` before it is prose.
///
/// No allocation; the work is linear in the content's length and the stack use constant.
///
/// ```
/// use llama_proto::{text_calls, TextCall};
///
/// let content = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
/// let blocks: Vec<_> = text_calls(content).collect();
/// assert_eq!(blocks.len(), 1);
/// assert_eq!(blocks[0].start, 14);
/// assert_eq!(blocks[0].end, content.len());
/// assert_eq!(
///     blocks[0].outcome,
///     Ok(TextCall { name: "get_weather", arguments: "{\"city\": \"Paris\"}" })
/// );
/// ```
pub fn text_calls(content: &str) -> TextCalls<'_> {
    TextCalls { content, pos: 0 }
}

/// Iterator over the blocks of one content: see [`text_calls`].
#[derive(Debug, Clone)]
pub struct TextCalls<'a> {
    content: &'a str,
    /// Where the search for the next block starts; past the end once an unterminated block
    /// has been returned.
    pos: usize,
}

impl<'a> Iterator for TextCalls<'a> {
    type Item = TextCallBlock<'a>;

    fn next(&mut self) -> Option<TextCallBlock<'a>> {
        let b = self.content.as_bytes();
        let start = find(b, self.pos, OPEN)?;
        let block = block(self.content, start);
        self.pos = match block.outcome {
            Err(TextCallError::Unterminated) => usize::MAX,
            _ => block.end,
        };
        Some(block)
    }
}

/// The blocks of one content, at most `N`: see [`parse_text_calls`].
#[derive(Debug, Clone, Copy)]
pub struct TextCallList<'a, const N: usize> {
    blocks: [TextCallBlock<'a>; N],
    len: usize,
}

impl<'a, const N: usize> TextCallList<'a, N> {
    /// The blocks in the order they appear.
    pub fn as_slice(&self) -> &[TextCallBlock<'a>] {
        &self.blocks[..self.len]
    }

    /// How many blocks there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the content has no block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Every `<tool_call>` block of `content` (as [`text_calls`] gives them), or
/// [`TooManyTextCalls`] when there are more than `N`.
///
/// ```
/// use llama_proto::{parse_text_calls, TooManyTextCalls};
///
/// let two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{}</tool_call>";
/// let list = parse_text_calls::<2>(two).unwrap();
/// assert_eq!(list.as_slice()[0].outcome.unwrap().name, "a");
/// assert!(list.as_slice()[1].outcome.is_err());
/// assert_eq!(parse_text_calls::<1>(two).unwrap_err(), TooManyTextCalls { capacity: 1, at: 53 });
/// ```
pub fn parse_text_calls<const N: usize>(
    content: &str,
) -> Result<TextCallList<'_, N>, TooManyTextCalls> {
    const BLANK: TextCallBlock<'static> = TextCallBlock {
        start: 0,
        end: 0,
        outcome: Err(TextCallError::Unterminated),
    };
    let mut list = TextCallList {
        blocks: [BLANK; N],
        len: 0,
    };
    for block in text_calls(content) {
        let slot = list.blocks.get_mut(list.len).ok_or(TooManyTextCalls {
            capacity: N,
            at: block.start,
        })?;
        *slot = block;
        list.len += 1;
    }
    Ok(list)
}

/// The content outside the `<tool_call>` blocks, piece by piece in order, unchanged (the
/// whitespace around a block included). Empty pieces are skipped.
///
/// ```
/// use llama_proto::prose;
///
/// let content = "Checking.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nDone.";
/// let kept: String = prose(content).collect();
/// assert_eq!(kept, "Checking.\n\nDone.");
/// ```
pub fn prose(content: &str) -> Prose<'_> {
    Prose {
        content,
        blocks: text_calls(content),
        pos: 0,
    }
}

/// Iterator over the content between blocks: see [`prose`].
#[derive(Debug, Clone)]
pub struct Prose<'a> {
    content: &'a str,
    blocks: TextCalls<'a>,
    pos: usize,
}

impl<'a> Iterator for Prose<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        loop {
            let from = self.pos;
            if from >= self.content.len() {
                return None;
            }
            let to = match self.blocks.next() {
                Some(block) => {
                    self.pos = block.end;
                    block.start
                }
                None => {
                    self.pos = self.content.len();
                    self.content.len()
                }
            };
            if to > from {
                return Some(&self.content[from..to]);
            }
        }
    }
}

/// The first occurrence of `needle` in `b` at or after `from`.
fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| from + i)
}

/// The block whose `<tool_call>` starts at `start`.
fn block(content: &str, start: usize) -> TextCallBlock<'_> {
    let b = content.as_bytes();
    let body = start + OPEN.len();
    let (outcome, close) = match object(content, validate::ws(b, body)) {
        Ok((call, after)) => {
            let after = validate::ws(b, after);
            match find(b, after, CLOSE) {
                Some(close) if close == after => (call, close),
                Some(close) => (
                    call.and(Err(TextCallError::TrailingText { at: after })),
                    close,
                ),
                None => (Err(TextCallError::Unterminated), b.len()),
            }
        }
        Err(e) => match find(b, body, CLOSE) {
            Some(close) => (Err(clamp(e, close)), close),
            None => (Err(TextCallError::Unterminated), b.len()),
        },
    };
    let end = if close == b.len() {
        close
    } else {
        close + CLOSE.len()
    };
    TextCallBlock {
        start,
        end,
        outcome,
    }
}

/// An error found past the block's `</tool_call>` (a string ran over it) is reported there.
fn clamp(e: TextCallError, close: usize) -> TextCallError {
    match e {
        TextCallError::MalformedJson { at } => TextCallError::MalformedJson { at: at.min(close) },
        TextCallError::TooDeep { at }
        | TextCallError::NumberTooLong { at }
        | TextCallError::NumberOutOfRange { at }
            if at > close =>
        {
            TextCallError::MalformedJson { at: close }
        }
        other => other,
    }
}

fn json_error(bad: Bad) -> TextCallError {
    match bad.fault {
        Fault::Malformed => TextCallError::MalformedJson { at: bad.at },
        Fault::TooDeep => TextCallError::TooDeep { at: bad.at },
        Fault::NumberTooLong => TextCallError::NumberTooLong { at: bad.at },
        Fault::NumberOutOfRange => TextCallError::NumberOutOfRange { at: bad.at },
    }
}

/// What the block's text at `i` holds.
type Object<'a> = (Result<TextCall<'a>, TextCallError>, usize);

/// The call object that starts at `i` and the index one past it, or the JSON fault (or the
/// missing object) that leaves its end unknown. Of the faults of a valid object, the first
/// wrong or duplicate key in order comes first, then a missing key.
fn object(content: &str, mut i: usize) -> Result<Object<'_>, TextCallError> {
    let b = content.as_bytes();
    if b.get(i) != Some(&b'{') {
        return Err(TextCallError::NotAnObject { at: i });
    }
    let mut name = None;
    let mut arguments = None;
    let mut wrong = None;
    i = validate::ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Ok((Err(TextCallError::MissingName), i + 1));
    }
    loop {
        let key_start = i;
        let key_end = validate::string(b, i).map_err(json_error)?;
        let key = &b[key_start + 1..key_end - 1];
        i = validate::ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err(TextCallError::MalformedJson { at: i });
        }
        let at = validate::ws(b, i + 1);
        // The call object is the first level; its values start at the second.
        let end = validate::value(b, at, MAX_NESTING - 1).map_err(json_error)?;
        let problem = match key {
            b"name" if name.is_some() => Some(TextCallError::DuplicateKey { at: key_start }),
            b"name" if b[at] != b'"' => Some(TextCallError::NameNotString { at }),
            b"name" => {
                let text = &content[at + 1..end - 1];
                if text.is_empty() || text.contains('\\') {
                    Some(TextCallError::BadName { at })
                } else {
                    name = Some(text);
                    None
                }
            }
            b"arguments" if arguments.is_some() => {
                Some(TextCallError::DuplicateKey { at: key_start })
            }
            b"arguments" if b[at] != b'{' => Some(TextCallError::ArgumentsNotObject { at }),
            b"arguments" => {
                arguments = Some(&content[at..end]);
                None
            }
            _ => None,
        };
        wrong = wrong.or(problem);
        i = validate::ws(b, end);
        match b.get(i) {
            Some(b',') => i = validate::ws(b, i + 1),
            Some(b'}') => break,
            _ => return Err(TextCallError::MalformedJson { at: i }),
        }
    }
    let call = match (wrong, name, arguments) {
        (Some(e), _, _) => Err(e),
        (None, None, _) => Err(TextCallError::MissingName),
        (None, _, None) => Err(TextCallError::MissingArguments),
        (None, Some(name), Some(arguments)) => Ok(TextCall { name, arguments }),
    };
    Ok((call, i + 1))
}
