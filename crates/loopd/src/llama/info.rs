//! What the server says about itself: `/props`, `/slots` and `/tokenize`, and the cache-loss
//! function (`cache_outcome`, from `llama-proto`).
//!
//! The router needs the model id on every call: as `?model=` on a GET, in the body of a POST.
//! Each call is one connection; its reads time out after `liveness_ms`.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::http::{self, ReadError};

use super::{request, Client, InferError, ProtocolError};

pub use llama_proto::{cache_outcome, CacheOutcome};

/// What the self-test reads from `/props`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Props {
    /// The chat template text.
    pub chat_template: String,
    /// Slots the server runs.
    pub total_slots: u32,
    /// Per-slot context size (`default_generation_settings.n_ctx`).
    pub n_ctx: u64,
    /// `model_path`, when the server says it.
    pub model_path: Option<String>,
}

/// One slot of `/slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct SlotState {
    /// The slot number (`id_slot`).
    pub id: u32,
    /// Per-slot context size.
    #[serde(default)]
    pub n_ctx: u64,
    /// Whether the slot is running a task.
    pub is_processing: bool,
}

#[derive(Deserialize)]
struct RawProps {
    chat_template: String,
    total_slots: u32,
    default_generation_settings: RawSettings,
    #[serde(default)]
    model_path: Option<String>,
}

#[derive(Deserialize)]
struct RawSettings {
    n_ctx: u64,
}

#[derive(Deserialize)]
struct RawTokens {
    tokens: Vec<u32>,
}

/// `s` percent-encoded for a query value (everything but unreserved characters).
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One call: `method target [body]`, a 200 answer's JSON body decoded as `T`.
pub fn call_json<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<T, InferError> {
    let mut resp = http::request(socket, method, target, body)?;
    resp.set_timeout(Some(timeout))
        .map_err(|source| InferError::Connect {
            socket: socket.to_owned(),
            source,
        })?;
    let status = resp.head().map_err(ReadError::into_infer)?;
    if status != 200 {
        return Err(resp.into_http_error());
    }
    let body = resp.read_body().map_err(ReadError::into_infer)?;
    serde_json::from_slice(body.as_bytes()).map_err(|e| {
        InferError::Protocol(ProtocolError::Json {
            what,
            line: e.line(),
            column: e.column(),
        })
    })
}

/// `GET /slots?model=..` on `socket`.
pub fn slots(socket: &Path, model: &str, timeout: Duration) -> Result<Vec<SlotState>, InferError> {
    call_json(
        "/slots",
        socket,
        "GET",
        &format!("/slots?model={}", query_escape(model)),
        None,
        timeout,
    )
}

impl Client {
    fn info_timeout(&self) -> Duration {
        Duration::from_millis(self.config.limits.liveness_ms)
    }

    /// `GET /props?model=..`: the chat template, slot count and per-slot context.
    pub fn props(&self) -> Result<Props, InferError> {
        let c = &self.config;
        let target = format!("/props?model={}", query_escape(&c.model));
        let raw: RawProps = call_json(
            "/props",
            &c.socket,
            "GET",
            &target,
            None,
            self.info_timeout(),
        )?;
        Ok(Props {
            chat_template: raw.chat_template,
            total_slots: raw.total_slots,
            n_ctx: raw.default_generation_settings.n_ctx,
            model_path: raw.model_path,
        })
    }

    /// `GET /slots?model=..`: every slot and whether it is processing.
    pub fn slots(&self) -> Result<Vec<SlotState>, InferError> {
        slots(&self.config.socket, &self.config.model, self.info_timeout())
    }

    /// `POST /tokenize`: the token ids of `content` (no special tokens added).
    pub fn tokenize(&self, content: &str) -> Result<Vec<u32>, InferError> {
        let c = &self.config;
        let body = request::render_tokenize(&c.model, content);
        let raw: RawTokens = call_json(
            "/tokenize",
            &c.socket,
            "POST",
            "/tokenize",
            Some(&body),
            self.info_timeout(),
        )?;
        Ok(raw.tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_escaped_for_the_query() {
        assert_eq!(query_escape("smollm2"), "smollm2");
        assert_eq!(
            query_escape("org/m-1.5B:Q4_K_M ä"),
            "org%2Fm-1.5B%3AQ4_K_M%20%C3%A4"
        );
    }

    #[test]
    fn props_and_slots_ignore_other_fields() {
        let p: RawProps = serde_json::from_str(
            r#"{"default_generation_settings":{"id":0,"n_ctx":4096,"params":{}},"total_slots":2,"chat_template":"{{x}}","model_path":"/m.gguf","build_info":"b1"}"#,
        )
        .unwrap();
        assert_eq!(
            (p.total_slots, p.default_generation_settings.n_ctx),
            (2, 4096)
        );
        let s: Vec<SlotState> = serde_json::from_str(
            r#"[{"id":0,"id_task":3,"n_ctx":4096,"is_processing":true,"params":{}},{"id":1,"is_processing":false}]"#,
        )
        .unwrap();
        assert_eq!(
            s,
            [
                SlotState {
                    id: 0,
                    n_ctx: 4096,
                    is_processing: true
                },
                SlotState {
                    id: 1,
                    n_ctx: 0,
                    is_processing: false
                }
            ]
        );
    }
}
