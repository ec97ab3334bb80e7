//! The wire shapes `serde-json-core` parses, with strings still escaped.
//!
//! Only the fields the assembler needs are named; everything else is skipped
//! (`serde-json-core` skips scalars by scanning to the next delimiter, which is cheap).

use core::fmt;
use core::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, SeqAccess, Visitor};

#[derive(serde::Deserialize)]
pub(crate) struct RawChunk<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a str>,
    #[serde(borrow, default)]
    pub choices: Option<Capped<RawChoice<'a>, 1>>,
    #[serde(default)]
    pub timings: Option<RawTimings>,
    #[serde(default)]
    pub prompt_progress: Option<RawProgress>,
    #[serde(borrow, default)]
    pub error: Option<RawError<'a>>,
}

#[derive(serde::Deserialize, Clone, Copy, Default)]
pub(crate) struct RawChoice<'a> {
    #[serde(borrow, default)]
    pub delta: Option<RawDelta<'a>>,
    #[serde(borrow, default)]
    pub finish_reason: Option<&'a str>,
}

#[derive(serde::Deserialize, Clone, Copy, Default)]
pub(crate) struct RawDelta<'a> {
    #[serde(borrow, default)]
    pub content: Option<&'a str>,
    #[serde(borrow, default)]
    pub reasoning_content: Option<&'a str>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Capped<RawToolCall<'a>, { crate::MAX_TOOL_CALL_DELTAS }>>,
}

#[derive(serde::Deserialize, Clone, Copy, Default)]
pub(crate) struct RawToolCall<'a> {
    pub index: u32,
    #[serde(borrow, default)]
    pub id: Option<&'a str>,
    #[serde(borrow, default)]
    pub function: Option<RawFunction<'a>>,
}

#[derive(serde::Deserialize, Clone, Copy, Default)]
pub(crate) struct RawFunction<'a> {
    #[serde(borrow, default)]
    pub name: Option<&'a str>,
    #[serde(borrow, default)]
    pub arguments: Option<&'a str>,
}

#[derive(serde::Deserialize, Clone, Copy)]
pub(crate) struct RawTimings {
    pub cache_n: u64,
    pub prompt_n: u64,
    pub predicted_n: u64,
}

#[derive(serde::Deserialize, Clone, Copy)]
pub(crate) struct RawProgress {
    pub total: u64,
    pub cache: u64,
    pub processed: u64,
    pub time_ms: u64,
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

/// A JSON array of at most `N` elements kept in place; further elements are parsed,
/// dropped and counted in `overflow` so the caller can report a cap error by name.
#[derive(Clone, Copy)]
pub(crate) struct Capped<T, const N: usize> {
    pub items: [T; N],
    pub len: usize,
    pub overflow: bool,
}

impl<T: Copy + Default, const N: usize> Capped<T, N> {
    pub fn as_slice(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<T: Copy + Default, const N: usize> Default for Capped<T, N> {
    fn default() -> Self {
        Capped {
            items: [T::default(); N],
            len: 0,
            overflow: false,
        }
    }
}

impl<'de, T, const N: usize> Deserialize<'de> for Capped<T, N>
where
    T: Deserialize<'de> + Copy + Default,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(PhantomData<T>);
        impl<'de, T, const N: usize> Visitor<'de> for V<T, N>
        where
            T: Deserialize<'de> + Copy + Default,
        {
            type Value = Capped<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Capped::<T, N>::default();
                while out.len < N {
                    match seq.next_element::<T>()? {
                        Some(t) => {
                            out.items[out.len] = t;
                            out.len += 1;
                        }
                        None => return Ok(out),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    out.overflow = true;
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V::<T, N>(PhantomData))
    }
}
