//! Each slot's decoded-token count (`GET /slots`), read as a streaming generation's progress.
//!
//! A client reports a generation's progress when stream bytes arrive. llama-server sends
//! nothing for a slot while it generates a tool call's opening that its parser cannot yet turn
//! into a delta, so at a token a second (a loaded CPU box, a big model) a call's first tokens
//! are a silence of several seconds from a healthy server. The group's CPU time cannot tell
//! that from a hung kernel on a GPU host (the spin is the same), and the other slot's bytes are
//! not this slot's. `n_decoded` is this slot's own count: it rises with every token the server
//! generates for the slot, streamed or not, on a CPU or a GPU host alike, and stands still when
//! decoding does (a hung server does not answer `/slots` at all: the request waits its turn
//! between decode steps). The policy asks for it only when a streaming generation's progress is
//! half `stall_timeout` old ([`crate::policy::Policy::slots_probe_at`]).
//!
//! The shape read is what llama-server answers (fixtures/slots.generating.json, recorded):
//! `[{"id":1, "is_processing":true, …, "next_token":[{"n_decoded":5, …}]}, …]`; a slot that
//! never ran a task has no `next_token`. Fields not named here are ignored.

use core::fmt;

use serde::Deserialize;

/// Where llama-server lists its slots.
pub const SLOTS_PATH: &str = "/slots";

/// Largest `/slots` body read: about 1.3 KiB a slot with its sampling parameters, so room for
/// a few hundred slots.
pub const MAX_SLOTS_BODY: usize = 1 << 19;

/// Why a `/slots` body could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotsError {
    /// Not JSON of the documented shape; the parser's message.
    Malformed(String),
}

impl fmt::Display for SlotsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(m) => write!(f, "GET {SLOTS_PATH}: not a slot list: {m}"),
        }
    }
}

impl core::error::Error for SlotsError {}

#[derive(Deserialize)]
struct RawSlot {
    id: u32,
    #[serde(default)]
    next_token: Vec<RawNextToken>,
}

#[derive(Deserialize)]
struct RawNextToken {
    n_decoded: u64,
}

/// The path to ask: `/slots`, or for a router the first required model's `/slots?model=…`
/// (the model whose slots clients register).
pub fn path(models: &[String]) -> String {
    match models.first() {
        None => SLOTS_PATH.to_string(),
        Some(m) => format!("{SLOTS_PATH}?model={}", query_escape(m)),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `(slot id, n_decoded)` for every slot that has run a task, in the server's order.
pub fn decoded(body: &[u8]) -> Result<Vec<(u32, u64)>, SlotsError> {
    let slots: Vec<RawSlot> =
        serde_json::from_slice(body).map_err(|e| SlotsError::Malformed(e.to_string()))?;
    Ok(slots
        .into_iter()
        .filter_map(|s| s.next_token.first().map(|t| (s.id, t.n_decoded)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_answer_gives_the_generating_slot_its_count() {
        let body = include_bytes!("../../../fixtures/slots.generating.json");
        // Slot 0 never ran a task (no next_token); slot 1 was streaming a story.
        assert_eq!(decoded(body), Ok(vec![(1, 5)]));
    }

    #[test]
    fn an_idle_slot_with_a_past_task_keeps_its_count() {
        let body = br#"[{"id":0,"is_processing":false,"next_token":[{"has_next_token":false,"n_remain":-1,"n_decoded":0}]},{"id":1,"next_token":[{"n_decoded":17}],"params":{"x":1}}]"#;
        assert_eq!(decoded(body), Ok(vec![(0, 0), (1, 17)]));
    }

    #[test]
    fn other_shapes_are_malformed_with_the_parsers_word() {
        for body in [
            &b"{\"error\":{\"code\":501,\"message\":\"This server does not support slots endpoint.\"}}"[..],
            b"[{\"id\":\"zero\"}]",
            b"[{\"id\":0,\"next_token\":[{\"n_decoded\":-1}]}]",
            b"",
        ] {
            let err = decoded(body).unwrap_err();
            assert!(
                matches!(&err, SlotsError::Malformed(m) if !m.is_empty()),
                "{err:?}"
            );
            assert!(err.to_string().starts_with("GET /slots: not a slot list: "));
        }
    }

    #[test]
    fn a_router_is_asked_for_the_first_models_slots() {
        assert_eq!(path(&[]), "/slots");
        assert_eq!(
            path(&["smollm2".into(), "other".into()]),
            "/slots?model=smollm2"
        );
        assert_eq!(path(&["org/m 1".into()]), "/slots?model=org%2Fm%201");
    }
}
