//! Renders a [`ChatRequest`] and the config into the chat-completions JSON body.
//!
//! Every request carries, from the config: `model`, `id_slot`, `cache_prompt: true`,
//! `stream: true`, `return_progress: true`, `timings_per_token: true`,
//! `reasoning_control: true`, `max_tokens` and the sampling settings that are set (the
//! request's own `max_tokens`, capped by the config's, and its own sampling, where it has them). Thinking on
//! or off travels as `chat_template_kwargs.enable_thinking`, which the template reads. The
//! fields are written in a fixed order, so the same inputs give the same bytes (a retry sends
//! the same request again, and M2b checks each request extends the one before).

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::config::{ClientConfig, Sampling};

use super::{AssistantMessage, ChatMessage, ChatRequest, ToolCall, ToolSchema};

/// The chat-completions body for `req` under `config`, as JSON bytes.
pub fn render(config: &ClientConfig, req: &ChatRequest) -> Vec<u8> {
    let body = Body { config, req };
    // Serialising plain strings, numbers and `serde_json::Value`s into a Vec cannot fail.
    serde_json::to_vec(&body).expect("request JSON is always serialisable")
}

/// The control call that ends reasoning early: `{"id":..,"action":"reasoning_end","model":..}`.
pub fn render_reasoning_end(model: &str, completion_id: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Control<'a> {
        id: &'a str,
        action: &'a str,
        model: &'a str,
    }
    let body = Control {
        id: completion_id,
        action: "reasoning_end",
        model,
    };
    serde_json::to_vec(&body).expect("control JSON is always serialisable")
}

/// The `/tokenize` body.
pub fn render_tokenize(model: &str, content: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Tokenize<'a> {
        model: &'a str,
        content: &'a str,
    }
    serde_json::to_vec(&Tokenize { model, content }).expect("tokenize JSON is always serialisable")
}

// Fixed structs rather than `json!`, whose key order depends on serde_json's features.
#[derive(Serialize)]
struct Function<'a, A: Serialize> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<A>,
}

#[derive(Serialize)]
struct Typed<'a, A: Serialize> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'a str,
    function: Function<'a, A>,
}

struct Body<'a> {
    config: &'a ClientConfig,
    req: &'a ChatRequest,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (c, r) = (self.config, self.req);
        let o = &r.options;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("model", &c.model)?;
        m.serialize_entry("id_slot", &r.slot)?;
        m.serialize_entry("messages", &Messages(&r.messages))?;
        if !r.tools.is_empty() {
            m.serialize_entry("tools", &Tools(&r.tools))?;
        }
        m.serialize_entry("stream", &true)?;
        m.serialize_entry("cache_prompt", &true)?;
        m.serialize_entry("return_progress", &true)?;
        m.serialize_entry("timings_per_token", &true)?;
        m.serialize_entry("reasoning_control", &true)?;
        let max_tokens = o
            .max_tokens
            .map_or(c.limits.max_tokens, |n| n.min(c.limits.max_tokens));
        m.serialize_entry("max_tokens", &max_tokens)?;
        sampling(&mut m, o.sampling.as_ref().unwrap_or(&c.sampling))?;
        m.serialize_entry("chat_template_kwargs", &EnableThinking(o.thinking))?;
        m.end()
    }
}

fn sampling<M: SerializeMap>(m: &mut M, s: &Sampling) -> Result<(), M::Error> {
    let floats = [
        ("temperature", s.temperature),
        ("top_p", s.top_p),
        ("min_p", s.min_p),
        ("presence_penalty", s.presence_penalty),
        ("repeat_penalty", s.repeat_penalty),
    ];
    for (key, value) in floats {
        if let Some(v) = value {
            m.serialize_entry(key, &v)?;
        }
    }
    if let Some(k) = s.top_k {
        m.serialize_entry("top_k", &k)?;
    }
    if let Some(seed) = s.seed {
        m.serialize_entry("seed", &seed)?;
    }
    Ok(())
}

struct EnableThinking(bool);

impl Serialize for EnableThinking {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("kwargs", 1)?;
        st.serialize_field("enable_thinking", &self.0)?;
        st.end()
    }
}

struct Messages<'a>(&'a [ChatMessage]);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Message))
    }
}

struct Message<'a>(&'a ChatMessage);

impl Serialize for Message<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self.0 {
            ChatMessage::System { content } => {
                m.serialize_entry("role", "system")?;
                m.serialize_entry("content", content)?;
            }
            ChatMessage::User { content } => {
                m.serialize_entry("role", "user")?;
                m.serialize_entry("content", content)?;
            }
            ChatMessage::Assistant(AssistantMessage {
                content,
                reasoning_content,
                tool_calls,
            }) => {
                m.serialize_entry("role", "assistant")?;
                // `null` content is how OpenAI-style APIs spell "only tool calls".
                m.serialize_entry("content", content)?;
                if let Some(r) = reasoning_content {
                    m.serialize_entry("reasoning_content", r)?;
                }
                if !tool_calls.is_empty() {
                    m.serialize_entry("tool_calls", &Calls(tool_calls))?;
                }
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => {
                m.serialize_entry("role", "tool")?;
                m.serialize_entry("tool_call_id", tool_call_id)?;
                m.serialize_entry("content", content)?;
            }
        }
        m.end()
    }
}

struct Calls<'a>(&'a [ToolCall]);

impl Serialize for Calls<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|c| Typed {
            id: Some(&c.id),
            kind: "function",
            // The arguments go back exactly as the model streamed them.
            function: Function {
                name: &c.name,
                description: None,
                parameters: None,
                arguments: Some(c.arguments.as_str()),
            },
        }))
    }
}

struct Tools<'a>(&'a [ToolSchema]);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|t| Typed::<&str> {
            id: None,
            kind: "function",
            function: Function {
                name: &t.name,
                description: Some(&t.description),
                parameters: Some(&t.parameters),
                arguments: None,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClientConfig {
        ClientConfig::new("/run/infer.sock", "smollm2")
    }

    fn user(text: &str) -> ChatRequest {
        ChatRequest::user(1, text)
    }

    #[test]
    fn minimal_request_has_every_field_in_order() {
        let body = String::from_utf8(render(&config(), &user("hi"))).unwrap();
        assert_eq!(
            body,
            r#"{"model":"smollm2","id_slot":1,"messages":[{"role":"user","content":"hi"}],"stream":true,"cache_prompt":true,"return_progress":true,"timings_per_token":true,"reasoning_control":true,"max_tokens":8192,"chat_template_kwargs":{"enable_thinking":false}}"#
        );
    }

    #[test]
    fn strings_are_escaped() {
        let body = render(&config(), &user("a \"quote\"\n\u{1}é"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["messages"][0]["content"], "a \"quote\"\n\u{1}é");
    }

    #[test]
    fn control_and_tokenize_bodies() {
        assert_eq!(
            render_reasoning_end("smollm2", "chatcmpl-1"),
            br#"{"id":"chatcmpl-1","action":"reasoning_end","model":"smollm2"}"#
        );
        assert_eq!(
            render_tokenize("m", "x y"),
            br#"{"model":"m","content":"x y"}"#
        );
    }
}
