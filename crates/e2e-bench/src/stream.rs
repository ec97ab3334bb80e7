//! What a client sees of one streamed answer, from the bytes it reads: the content, whether a
//! read brought the first of it, the token counts and (from llama-server) the server's timings.
//!
//! Two readers, one per wire: [`SseAnswer`] for llama-server's de-chunked SSE body (direct and
//! through inferproxy) and [`DaemonAnswer`] for `loopd serve`'s `submit` with `follow` (JSON
//! lines, docs/loopd.md). Both are fed bytes as they arrive, split anywhere, and say when the
//! first content arrived, so the first token is timed the same way on every path.

use std::fmt;

use serde_json::Value;

/// The token counts of one generation, as the server reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens reused from the slot's cache.
    pub cache_n: u64,
    /// Prompt tokens evaluated.
    pub prompt_n: u64,
    /// Tokens generated.
    pub predicted_n: u64,
}

impl Tokens {
    /// The prompt's length in tokens, cached or not: equal on two paths only if the prompts are.
    pub fn prompt(&self) -> u64 {
        self.cache_n + self.prompt_n
    }
}

/// Why a stream could not be read as an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// A line that should hold JSON did not (the line, cut to 200 bytes).
    NotJson(String),
    /// The server or the daemon answered with an error (its code or body, and detail).
    Refused(String),
    /// The daemon's request ended without completing (its fail reason and detail).
    NotCompleted(String),
    /// The stream ended before the answer did.
    Truncated,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::NotJson(l) => write!(f, "a line is not JSON: {l}"),
            StreamError::Refused(why) => write!(f, "refused: {why}"),
            StreamError::NotCompleted(why) => write!(f, "the request did not complete: {why}"),
            StreamError::Truncated => f.write_str("the stream ended before the answer did"),
        }
    }
}

impl std::error::Error for StreamError {}

/// Splits fed bytes into `\n`-terminated lines, whatever the split of the input.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// Calls `each` with every line that `bytes` completes (without its `\n`).
    fn feed(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(&[u8]) -> Result<(), StreamError>,
    ) -> Result<(), StreamError> {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if self.partial.is_empty() {
                each(&rest[..i])?;
            } else {
                self.partial.extend_from_slice(&rest[..i]);
                let line = std::mem::take(&mut self.partial);
                each(&line)?;
            }
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }
}

fn json(line: &[u8]) -> Result<Value, StreamError> {
    serde_json::from_slice(line).map_err(|_| {
        let cut = &line[..line.len().min(200)];
        StreamError::NotJson(String::from_utf8_lossy(cut).into_owned())
    })
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// llama-server's streamed chat completion, from its de-chunked SSE body.
#[derive(Debug, Default)]
pub struct SseAnswer {
    lines: Lines,
    /// The content so far.
    pub content: String,
    /// The token counts of the newest chunk that carried `timings`.
    pub tokens: Tokens,
    /// `prompt_ms + predicted_ms` of the newest chunk that carried `timings`: the server's
    /// compute time for the request once the final chunk is in.
    pub compute_ms: Option<f64>,
    /// True once `data: [DONE]` was read.
    pub done: bool,
}

impl SseAnswer {
    /// Feeds body bytes; returns true when they brought the answer's first content.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<bool, StreamError> {
        let had_content = !self.content.is_empty();
        let Self {
            lines,
            content,
            tokens,
            compute_ms,
            done,
        } = self;
        lines.feed(bytes, |line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(data) = line.strip_prefix(b"data: ") else {
                if line.starts_with(b"error") {
                    return Err(StreamError::Refused(
                        String::from_utf8_lossy(line).into_owned(),
                    ));
                }
                return Ok(());
            };
            if data == b"[DONE]" {
                *done = true;
                return Ok(());
            }
            let chunk = json(data)?;
            if let Some(e) = chunk.get("error") {
                return Err(StreamError::Refused(e.to_string()));
            }
            let delta = &chunk["choices"][0]["delta"]["content"];
            if let Some(text) = delta.as_str() {
                content.push_str(text);
            }
            if let Some(t) = chunk.get("timings") {
                *tokens = Tokens {
                    cache_n: count(t, "cache_n"),
                    prompt_n: count(t, "prompt_n"),
                    predicted_n: count(t, "predicted_n"),
                };
                let ms = |key| t.get(key).and_then(Value::as_f64).unwrap_or(0.0);
                *compute_ms = Some(ms("prompt_ms") + ms("predicted_ms"));
            }
            Ok(())
        })?;
        Ok(!had_content && !self.content.is_empty())
    }
}

/// `loopd serve`'s answer to a `submit` with `follow`: the `{"ok":true,"id":N}` line, the
/// events, and the result line.
#[derive(Debug, Default)]
pub struct DaemonAnswer {
    lines: Lines,
    /// The request's id, once its first line was read.
    pub id: Option<u64>,
    /// The content streamed in `content` events so far.
    pub streamed: String,
    /// The result's content, once the result line was read.
    pub content: String,
    /// The result's token counts, summed over its generations.
    pub tokens: Tokens,
    /// True once the result line was read.
    pub done: bool,
}

impl DaemonAnswer {
    /// Feeds bytes from the connection; returns true when they brought the first content.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<bool, StreamError> {
        let had_content = !self.streamed.is_empty();
        let Self {
            lines,
            id,
            streamed,
            content,
            tokens,
            done,
        } = self;
        lines.feed(bytes, |line| {
            let v = json(line)?;
            if v.get("ok") == Some(&Value::Bool(false)) {
                return Err(StreamError::Refused(format!(
                    "{}: {}",
                    v["error"].as_str().unwrap_or("?"),
                    v["detail"].as_str().unwrap_or("")
                )));
            }
            if let Some(r) = v.get("result") {
                if r["outcome"] != "completed" {
                    return Err(StreamError::NotCompleted(format!(
                        "{}: {}",
                        r["fail_reason"].as_str().unwrap_or("?"),
                        r["detail"].as_str().unwrap_or("")
                    )));
                }
                content.push_str(r["content"].as_str().unwrap_or(""));
                for g in r["generations"].as_array().into_iter().flatten() {
                    tokens.cache_n += count(g, "cache_n");
                    tokens.prompt_n += count(g, "prompt_n");
                    tokens.predicted_n += count(g, "predicted_n");
                }
                *done = true;
            } else if v.get("event").and_then(Value::as_str) == Some("content") {
                streamed.push_str(v["text"].as_str().unwrap_or(""));
            } else if v.get("event").is_none() {
                *id = v["id"].as_u64();
            }
            Ok(())
        })?;
        Ok(!had_content && !self.streamed.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SSE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"timings\":{\"cache_n\":30,\"prompt_n\":1,\"prompt_ms\":12.5,\"predicted_n\":0,\"predicted_ms\":0.0}}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The\"}}],\"timings\":{\"cache_n\":30,\"prompt_n\":1,\"prompt_ms\":12.5,\"predicted_n\":1,\"predicted_ms\":8.25}}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" sky\"}}],\"timings\":{\"cache_n\":30,\"prompt_n\":1,\"prompt_ms\":12.5,\"predicted_n\":2,\"predicted_ms\":16.5}}\n\n\
data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"delta\":{}}],\"timings\":{\"cache_n\":30,\"prompt_n\":1,\"prompt_ms\":12.5,\"predicted_n\":2,\"predicted_ms\":17.25}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn sse_whole() {
        let mut a = SseAnswer::default();
        assert_eq!(a.feed(SSE), Ok(true));
        assert_eq!(a.content, "The sky");
        assert_eq!(
            a.tokens,
            Tokens {
                cache_n: 30,
                prompt_n: 1,
                predicted_n: 2
            }
        );
        assert_eq!(a.compute_ms, Some(29.75));
        assert!(a.done);
    }

    /// The first content arrives with the read that completes its line, and with no other.
    #[test]
    fn sse_first_content_on_its_line() {
        let second_line_end = SSE
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w == b"\n\n")
            .nth(1)
            .unwrap()
            .0;
        let mut a = SseAnswer::default();
        assert_eq!(a.feed(&SSE[..second_line_end]), Ok(false));
        assert_eq!(a.feed(&SSE[second_line_end..second_line_end + 1]), Ok(true));
        assert_eq!(a.feed(&SSE[second_line_end + 1..]), Ok(false));
        assert_eq!(a.content, "The sky");
    }

    #[test]
    fn sse_every_split_is_the_same() {
        for cut in 0..=SSE.len() {
            let mut a = SseAnswer::default();
            let first = a.feed(&SSE[..cut]).unwrap() as u32 + a.feed(&SSE[cut..]).unwrap() as u32;
            assert_eq!(first, 1, "cut at {cut}");
            assert_eq!(a.content, "The sky", "cut at {cut}");
            assert_eq!(a.compute_ms, Some(29.75), "cut at {cut}");
            assert!(a.done);
        }
    }

    #[test]
    fn sse_error_chunk() {
        let mut a = SseAnswer::default();
        assert_eq!(
            a.feed(b"data: {\"error\":{\"code\":503,\"message\":\"Loading model\"}}\n\n"),
            Err(StreamError::Refused(
                "{\"code\":503,\"message\":\"Loading model\"}".into()
            ))
        );
        assert_eq!(
            SseAnswer::default().feed(b"data: {oops\n"),
            Err(StreamError::NotJson("{oops".into()))
        );
    }

    const FOLLOW: &[u8] = b"{\"ok\":true,\"id\":7}\n\
{\"event\":\"generation\",\"number\":1,\"budget_left\":0}\n\
{\"event\":\"progress\",\"total\":31,\"cache\":30,\"processed\":31}\n\
{\"event\":\"content\",\"text\":\"The\"}\n\
{\"event\":\"content\",\"text\":\" sky\"}\n\
{\"ok\":true,\"result\":{\"id\":7,\"outcome\":\"completed\",\"finish_reason\":\"length\",\"content\":\"The sky\",\"generations\":[{\"budget_left\":0,\"cache_n\":30,\"prompt_n\":1,\"predicted_n\":2,\"elapsed_ms\":40}]}}\n";

    #[test]
    fn daemon_every_split_is_the_same() {
        for cut in 0..=FOLLOW.len() {
            let mut a = DaemonAnswer::default();
            let first =
                a.feed(&FOLLOW[..cut]).unwrap() as u32 + a.feed(&FOLLOW[cut..]).unwrap() as u32;
            assert_eq!(first, 1, "cut at {cut}");
            assert_eq!(a.id, Some(7));
            assert_eq!(a.streamed, "The sky");
            assert_eq!(a.content, "The sky");
            assert_eq!(
                a.tokens,
                Tokens {
                    cache_n: 30,
                    prompt_n: 1,
                    predicted_n: 2
                }
            );
            assert!(a.done);
        }
    }

    #[test]
    fn daemon_refusal_and_failure() {
        let mut a = DaemonAnswer::default();
        assert_eq!(
            a.feed(b"{\"ok\":false,\"error\":\"NO_SLOT_AVAILABLE\",\"detail\":\"every slot is busy (2 of 2); there is no queue\"}\n"),
            Err(StreamError::Refused(
                "NO_SLOT_AVAILABLE: every slot is busy (2 of 2); there is no queue".into()
            ))
        );
        let mut a = DaemonAnswer::default();
        assert_eq!(
            a.feed(b"{\"ok\":true,\"result\":{\"outcome\":\"failed\",\"fail_reason\":\"cancelled\",\"detail\":\"by a client\"}}\n"),
            Err(StreamError::NotCompleted("cancelled: by a client".into()))
        );
    }
}
