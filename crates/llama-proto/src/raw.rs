//! The wire shapes `serde-json-core` parses, with strings still escaped.
//!
//! Only the fields the assembler needs are named; everything else is skipped. `choices`, its
//! first element and the delta are parsed by hand-written visitors that write each field in
//! place into one [`RawChunk`]: derived visitors return every nested struct by value, and
//! with the tool-call slots inside the delta that copying was an eighth of the decode time.
//! The small leaves (a tool call, `error`) stay derived. The top level is walked by
//! [`crate::scan`].

use core::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::chunk::{Chunk, ToolCallDelta};
use crate::MAX_TOOL_CALL_DELTAS;

/// One parsed payload. `chunk` holds the strings still escaped and no `finish_reason`.
#[derive(Default)]
pub(crate) struct RawChunk<'a> {
    pub chunk: Chunk<'a>,
    pub finish_reason: Option<&'a str>,
    /// `choices` had more than one element.
    pub too_many_choices: bool,
    /// `delta.tool_calls` had more than [`MAX_TOOL_CALL_DELTAS`] elements.
    pub too_many_tool_calls: bool,
    pub error: Option<RawError<'a>>,
}

#[derive(serde::Deserialize, Clone, Copy)]
pub(crate) struct RawToolCall<'a> {
    pub index: u32,
    #[serde(borrow, default)]
    pub id: Option<&'a str>,
    #[serde(borrow, default)]
    pub function: Option<RawFunction<'a>>,
}

#[derive(serde::Deserialize, Clone, Copy)]
pub(crate) struct RawFunction<'a> {
    #[serde(borrow, default)]
    pub name: Option<&'a str>,
    #[serde(borrow, default)]
    pub arguments: Option<&'a str>,
}

#[derive(serde::Deserialize, Clone, Copy)]
pub(crate) struct RawError<'a> {
    #[serde(default)]
    pub code: Option<u32>,
    #[serde(borrow)]
    pub message: &'a str,
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a str>,
}

/// Which known keys an object has had, so that a repeated one is an error as with a derive.
struct Seen(u8);

impl Seen {
    fn first<E: serde::de::Error>(&mut self, bit: u8, name: &'static str) -> Result<(), E> {
        if self.0 & bit != 0 {
            return Err(E::duplicate_field(name));
        }
        self.0 |= bit;
        Ok(())
    }
}

/// `null` or the value `S` parses, as `Option<T>` does.
pub(crate) struct Opt<S>(pub S);

impl<'de, S: DeserializeSeed<'de, Value = ()>> DeserializeSeed<'de> for Opt<S> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de, Value = ()>> Visitor<'de> for Opt<S> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null or a value")
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.0.deserialize(d)
    }
}

/// `choices`: the first element is parsed in place; further ones are skipped and flagged.
pub(crate) struct ChoicesSeed<'o, 'a>(pub &'o mut RawChunk<'a>);

impl<'de> DeserializeSeed<'de> for ChoicesSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ChoicesSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        if seq.next_element_seed(ChoiceSeed(out))?.is_none() {
            return Ok(());
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {
            out.too_many_choices = true;
        }
        Ok(())
    }
}

/// `choices[0]`.
struct ChoiceSeed<'o, 'a>(&'o mut RawChunk<'a>);

impl<'de> DeserializeSeed<'de> for ChoiceSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("RawChoice", &[], self)
    }
}

impl<'de> Visitor<'de> for ChoiceSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a choice object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        let mut seen = Seen(0);
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "finish_reason" => {
                    seen.first(1, "finish_reason")?;
                    out.finish_reason = map.next_value()?;
                }
                "delta" => {
                    seen.first(2, "delta")?;
                    map.next_value_seed(Opt(DeltaSeed(out)))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// `choices[0].delta`.
struct DeltaSeed<'o, 'a>(&'o mut RawChunk<'a>);

impl<'de> DeserializeSeed<'de> for DeltaSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("RawDelta", &[], self)
    }
}

impl<'de> Visitor<'de> for DeltaSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a delta object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        let mut seen = Seen(0);
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "content" => {
                    seen.first(1, "content")?;
                    out.chunk.content = map.next_value()?;
                }
                "reasoning_content" => {
                    seen.first(2, "reasoning_content")?;
                    out.chunk.reasoning_content = map.next_value()?;
                }
                "tool_calls" => {
                    seen.first(4, "tool_calls")?;
                    map.next_value_seed(Opt(CallsSeed(out)))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// `delta.tool_calls`: up to [`MAX_TOOL_CALL_DELTAS`] elements into the chunk's slots;
/// further ones are skipped and flagged.
struct CallsSeed<'o, 'a>(&'o mut RawChunk<'a>);

impl<'de> DeserializeSeed<'de> for CallsSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CallsSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        for n in 0..MAX_TOOL_CALL_DELTAS {
            let Some(call) = seq.next_element::<RawToolCall<'de>>()? else {
                out.chunk.tool_calls_len = n;
                return Ok(());
            };
            let (name, arguments) = call
                .function
                .map_or((None, None), |f| (f.name, f.arguments));
            out.chunk.tool_calls[n] = ToolCallDelta {
                index: call.index,
                id: call.id,
                name,
                arguments,
            };
        }
        out.chunk.tool_calls_len = MAX_TOOL_CALL_DELTAS;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            out.too_many_tool_calls = true;
        }
        Ok(())
    }
}
