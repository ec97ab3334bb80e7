//! What the server says about itself: `/props`, `/slots` and `/tokenize`.
//!
//! The router needs the model id on every call: as `?model=` on a GET, in the body of a POST.
//! Each call is one connection, connected and sent within `limits.connect_ms` and answered,
//! body and all, within `limits.call_ms` (`TimedOut` otherwise, naming the key).

use std::time::Duration;

use serde::Deserialize;

use crate::config::ClientConfig;
use crate::http::{self, ReadError, Response};

use super::{
    capped_body, request, Cancel, Client, Deadline, InferError, ProtocolError, ERROR_BODY_CAP,
};

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
    /// The id of the last task it ran (`id_task`); absent (or -1 on some builds) until it
    /// has run one, as on a server just started (a restored file does not count).
    #[serde(default)]
    pub id_task: Option<i64>,
}

impl SlotState {
    /// Whether the slot has run a task since its server started.
    pub fn has_run(&self) -> bool {
        self.id_task.is_some_and(|t| t >= 0)
    }
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

/// One call: `method path [body]` (a GET names the model as `?model=`), connected and sent
/// within `connect_ms`, and answered whole within `call_ms` unless `cancel` is set first; a
/// 200 answer's JSON body is decoded as `T`. The socket layer (`http`) keeps the deadline.
pub fn call_json<T: for<'de> Deserialize<'de>>(
    config: &ClientConfig,
    method: &str,
    path: &'static str,
    body: Option<&[u8]>,
    cancel: &Cancel,
) -> Result<T, InferError> {
    let target = if method == "GET" {
        format!("{path}?model={}", query_escape(&config.model))
    } else {
        path.to_owned()
    };
    call_json_at(config, method, path, &target, body, cancel)
}

/// [`call_json`] to `target` as given (a path with its own query), errors naming `path`.
pub fn call_json_at<T: for<'de> Deserialize<'de>>(
    config: &ClientConfig,
    method: &str,
    path: &'static str,
    target: &str,
    body: Option<&[u8]>,
    cancel: &Cancel,
) -> Result<T, InferError> {
    let call = Duration::from_millis(config.limits.call_ms);
    let connect = Duration::from_millis(config.limits.connect_ms).min(call);
    let stream = http::request(&config.socket, method, target, body, connect, cancel)
        .map_err(|e| InferError::from_send(&config.socket, e))?;
    let mut resp = Response::within(stream, call, cancel);
    let status = resp.head().map_err(read_error)?;
    if status != 200 {
        return Err(match resp.error_body(ERROR_BODY_CAP) {
            Ok((status, body)) => InferError::Http {
                status,
                body: capped_body(&body),
            },
            Err(e) => read_error(e),
        });
    }
    let body = resp.read_body().map_err(read_error)?;
    serde_json::from_slice(body.as_bytes()).map_err(|e| {
        InferError::Protocol(ProtocolError::Json {
            what: path,
            line: e.line(),
            column: e.column(),
        })
    })
}

/// The client error for a call whose answer could not be read.
fn read_error(e: ReadError) -> InferError {
    match e {
        ReadError::Timeout => InferError::TimedOut(Deadline::Call),
        ReadError::Cancelled => InferError::Cancelled,
        // A reset mid-response is the server going away, like a close.
        ReadError::Closed | ReadError::Io(_) => InferError::StreamClosedEarly,
        ReadError::Http(e) => e.into(),
    }
}

/// `GET /slots?model=..`, answered whole within `call_ms` unless `cancel` is set first.
pub fn slots(config: &ClientConfig, cancel: &Cancel) -> Result<Vec<SlotState>, InferError> {
    call_json(config, "GET", "/slots", None, cancel)
}

impl Client {
    /// `GET /props?model=..`: the chat template, slot count and per-slot context.
    pub fn props(&self) -> Result<Props, InferError> {
        let raw: RawProps = call_json(&self.config, "GET", "/props", None, &Cancel::new())?;
        Ok(Props {
            chat_template: raw.chat_template,
            total_slots: raw.total_slots,
            n_ctx: raw.default_generation_settings.n_ctx,
            model_path: raw.model_path,
        })
    }

    /// `GET /slots?model=..`: every slot and whether it is processing.
    pub fn slots(&self) -> Result<Vec<SlotState>, InferError> {
        slots(&self.config, &Cancel::new())
    }

    /// `POST /tokenize`: the token ids of `content` (no special tokens added).
    pub fn tokenize(&self, content: &str) -> Result<Vec<u32>, InferError> {
        let body = request::render_tokenize(&self.config.model, content);
        let raw: RawTokens = call_json(
            &self.config,
            "POST",
            "/tokenize",
            Some(&body),
            &Cancel::new(),
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
            r#"[{"id":0,"id_task":3,"n_ctx":4096,"is_processing":true,"params":{}},{"id":1,"is_processing":false},{"id":2,"id_task":-1,"is_processing":false}]"#,
        )
        .unwrap();
        assert_eq!(
            s,
            [
                SlotState {
                    id: 0,
                    n_ctx: 4096,
                    is_processing: true,
                    id_task: Some(3),
                },
                SlotState {
                    id: 1,
                    n_ctx: 0,
                    is_processing: false,
                    id_task: None,
                },
                SlotState {
                    id: 2,
                    n_ctx: 0,
                    is_processing: false,
                    id_task: Some(-1),
                }
            ]
        );
        let ran: Vec<bool> = s.iter().map(SlotState::has_run).collect();
        assert_eq!(ran, [true, false, false]);
    }
}
