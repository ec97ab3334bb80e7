//! A session's log as a conversation (docs/sessions.md), without IO: the messages a turn is
//! sent ([`Log::render`]), the compaction that makes room when the next turn would not fit
//! the slot's context ([`plan`]), and the records a completed turn appends ([`turn_records`]).
//!
//! Rendering is a pure function of the log, so turn k+1's messages are turn k's messages,
//! then what turn k added (its answers, calls and tool results, as the runner sent them on),
//! then the new user message: the request extends the last one byte for byte, and the
//! server's prompt cache holds all of it. Only a compaction (or a change of the BIOS or the
//! template) breaks that, and the turn's result says so.
//!
//! The compaction rule, applied in order until the estimate is at most half the context:
//! 1. `tool_results`: the tool results of every turn but the last two become a note of their
//!    size;
//! 2. `summary`: turns 2 to b (all but the first turn and the last turns that fit a quarter
//!    of the context) are replaced by a summary the model writes in a generation of their
//!    own, which goes before the user message of turn b + 1. After the server refused the
//!    last turn as too long (the estimate was wrong), only the last turn is kept.
//!
//! The system message (and the BIOS) and turn 1 are always kept whole. Estimates are in
//! tokens: the server's count of the last turn's conversation (`total_n`) plus the new text
//! at the session's own measured tokens per byte.

use std::collections::BTreeMap;

use super::protocol::{Compaction, CompactionRule, Record, TurnRecord, WireCall};
use loopd_client::llama::{AssistantMessage, ChatMessage, ToolCall};

/// What the summary is preceded by where it goes in the conversation.
pub const SUMMARY_PREFIX: &str =
    "[Summary of the earlier conversation, written to fit the context window]\n";

/// The instruction the summary generation is sent after the turns it summarizes.
pub const SUMMARY_INSTRUCTION: &str = "Summarize the conversation so far in a few sentences: \
     the facts, names, numbers and decisions it established and what is still open. Write \
     only the summary.";

/// Tokens per byte before a session has measured its own (a conservative guess: English
/// text runs near 0.25).
pub const DEFAULT_TOKENS_PER_BYTE: f64 = 0.5;

/// The turns whose tool results rule 1 keeps.
pub const KEEP_TOOL_TURNS: u32 = 2;

/// A tool result's note after rule 1.
pub fn tool_note(bytes: usize) -> String {
    format!("[tool result removed to fit the context window: {bytes} bytes]")
}

/// A parsed log: each record with its turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    records: Vec<(u32, Record)>,
}

/// A record that does not read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Its position in the log, from 0.
    pub index: usize,
    /// serde's words.
    pub detail: String,
}

impl Log {
    /// The log from the store's `(turn, JSON)` rows.
    pub fn parse(rows: &[(u32, String)]) -> Result<Log, BadRecord> {
        let mut records = Vec::with_capacity(rows.len());
        for (index, (turn, json)) in rows.iter().enumerate() {
            let r = serde_json::from_str(json).map_err(|e| BadRecord {
                index,
                detail: e.to_string(),
            })?;
            records.push((*turn, r));
        }
        Ok(Log { records })
    }

    /// The records, in order.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.iter().map(|(_, r)| r)
    }

    /// The last completed turn's record.
    pub fn last_turn(&self) -> Option<&TurnRecord> {
        self.records.iter().rev().find_map(|(_, r)| match r {
            Record::Turn(t) => Some(t),
            _ => None,
        })
    }

    /// Turns completed.
    pub fn turns(&self) -> u32 {
        self.last_turn().map_or(0, |t| t.turn)
    }

    fn compactions<'a>(
        &'a self,
        pending: &'a [Compaction],
    ) -> impl Iterator<Item = &'a Compaction> + 'a {
        self.records
            .iter()
            .filter_map(|(_, r)| match r {
                Record::Compaction(c) => Some(c),
                _ => None,
            })
            .chain(pending)
    }

    /// The conversation the log holds, as a turn is sent it (after the BIOS and the system
    /// message), with `pending` compactions applied as if logged. A pending summary with
    /// no text yet leaves its turns out and writes nothing before turn b + 1 (the runner
    /// writes it there). Turns after `through` are left out.
    pub fn render(&self, pending: &[Compaction], through: Option<u32>) -> Vec<ChatMessage> {
        self.rendered(pending, through)
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    }

    /// [`Log::render`], each message with its turn.
    fn rendered(&self, pending: &[Compaction], through: Option<u32>) -> Vec<(u32, ChatMessage)> {
        let mut tools_through = 0;
        let mut summary: Option<&Compaction> = None;
        for c in self.compactions(pending) {
            match c.rule {
                CompactionRule::ToolResults => tools_through = tools_through.max(c.through_turn),
                CompactionRule::Summary => summary = Some(c),
            }
        }
        let mut out = Vec::with_capacity(self.records.len());
        let mut prefixed = false;
        for (turn, r) in &self.records {
            let turn = *turn;
            if through.is_some_and(|t| turn > t) {
                break;
            }
            if let Some(s) = summary {
                if (s.from_turn..=s.through_turn).contains(&turn) {
                    continue;
                }
            }
            let m = match r {
                Record::User { content } => {
                    let mut content = content.clone();
                    if let Some(s) = summary.filter(|s| turn > s.through_turn && !prefixed) {
                        prefixed = true;
                        if let Some(text) = &s.summary {
                            content = summarized(text, &content);
                        }
                    }
                    ChatMessage::User { content }
                }
                Record::Assistant {
                    content,
                    reasoning_content,
                    tool_calls,
                } => ChatMessage::Assistant(AssistantMessage {
                    content: content.clone(),
                    reasoning_content: reasoning_content.clone(),
                    tool_calls: tool_calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c.id.clone(),
                            name: c.name.clone(),
                            arguments: c.arguments.clone(),
                        })
                        .collect(),
                }),
                Record::Tool {
                    tool_call_id,
                    content,
                } => ChatMessage::Tool {
                    tool_call_id: tool_call_id.clone(),
                    content: if turn <= tools_through {
                        tool_note(content.len())
                    } else {
                        content.clone()
                    },
                },
                Record::Compaction(_) | Record::Turn(_) => continue,
            };
            out.push((turn, m));
        }
        out
    }

    /// The bytes of each turn's messages as rendered with `pending` applied.
    fn turn_bytes(&self, pending: &[Compaction]) -> BTreeMap<u32, u64> {
        let mut bytes = BTreeMap::new();
        for (turn, m) in self.rendered(pending, None) {
            *bytes.entry(turn).or_insert(0) += message_bytes(&m);
        }
        bytes
    }

    /// Tokens per byte, measured on the last two turns (the growth of the server's count
    /// over the growth of the log), else [`DEFAULT_TOKENS_PER_BYTE`]; within 0.1 to 1.
    pub fn tokens_per_byte(&self) -> f64 {
        let turns: Vec<&TurnRecord> = self
            .records
            .iter()
            .filter_map(|(_, r)| match r {
                Record::Turn(t) => Some(t),
                _ => None,
            })
            .collect();
        let [.., a, b] = turns.as_slice() else {
            return DEFAULT_TOKENS_PER_BYTE;
        };
        if !b.compacted.is_empty() || b.total_n <= a.total_n {
            return DEFAULT_TOKENS_PER_BYTE;
        }
        let bytes = self.turn_bytes(&[]).get(&b.turn).copied().unwrap_or(0);
        if bytes == 0 {
            return DEFAULT_TOKENS_PER_BYTE;
        }
        ((b.total_n - a.total_n) as f64 / bytes as f64).clamp(0.1, 1.0)
    }
}

/// A user message with a summary before it, as the runner writes it.
pub fn summarized(summary: &str, content: &str) -> String {
    format!("{SUMMARY_PREFIX}{summary}\n\n{content}")
}

/// A message's size for the estimates: its text and a few bytes of template around it.
fn message_bytes(m: &ChatMessage) -> u64 {
    let text = match m {
        ChatMessage::System { content } | ChatMessage::User { content } => content.len(),
        ChatMessage::Tool {
            tool_call_id,
            content,
        } => tool_call_id.len() + content.len(),
        ChatMessage::Assistant(a) => {
            a.content.as_ref().map_or(0, String::len)
                + a.reasoning_content.as_ref().map_or(0, String::len)
                + a.tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len() + 16)
                    .sum::<usize>()
        }
    };
    text as u64 + 16
}

/// What a turn must do first to fit: the compactions to log, and the summary generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// In order; a summary's text is filled in when its generation has run.
    pub compactions: Vec<Compaction>,
    /// The summary generation's messages (after the BIOS and the system message), when
    /// rule 2 applies.
    pub summary_messages: Option<Vec<ChatMessage>>,
}

/// The compaction the next turn needs, if any: when the estimate of its prompt plus
/// `reserve` (its `max_tokens`) passes `n_ctx`, or when `force`d (the last turn was refused
/// by the server as too long). `n_ctx` 0 (unknown) plans nothing unless forced with a
/// known log.
pub fn plan(
    log: &Log,
    user: &str,
    n_ctx: u64,
    reserve: u64,
    summary_max_tokens: u64,
    force: bool,
) -> Option<Plan> {
    let last = log.last_turn()?;
    let k = last.turn;
    let ratio = log.tokens_per_byte();
    let tokens = |bytes: u64| (bytes as f64 * ratio).ceil() as u64;
    let mut estimate = last.total_n + tokens(user.len() as u64 + 16) + reserve;
    if n_ctx == 0 || (estimate <= n_ctx && !force) {
        return None;
    }
    let before = estimate;
    let target = n_ctx / 2;
    let mut compactions = Vec::new();
    // Rule 1: tool results older than the last turns.
    let tools_through = log
        .compactions(&[])
        .filter(|c| c.rule == CompactionRule::ToolResults)
        .map(|c| c.through_turn)
        .max()
        .unwrap_or(0);
    let upto = k.saturating_sub(KEEP_TOOL_TURNS);
    if upto > tools_through {
        let saved: u64 = log
            .records
            .iter()
            .filter(|(t, _)| *t > tools_through && *t <= upto)
            .filter_map(|(_, r)| match r {
                Record::Tool { content, .. } => Some(
                    (content.len() as u64).saturating_sub(tool_note(content.len()).len() as u64),
                ),
                _ => None,
            })
            .sum();
        if saved > 0 {
            estimate = estimate.saturating_sub(tokens(saved));
            compactions.push(Compaction {
                rule: CompactionRule::ToolResults,
                from_turn: tools_through + 1,
                through_turn: upto,
                summary: None,
                tokens_before: before,
                tokens_after: estimate,
            });
        }
    }
    if estimate <= target && !compactions.is_empty() {
        return Some(Plan {
            compactions,
            summary_messages: None,
        });
    }
    // Rule 2: a summary of turns 2..=b, keeping the last turns that fit a quarter.
    let bytes = log.turn_bytes(&compactions);
    let mut kept = 0u64;
    let mut b = k;
    for (turn, n) in bytes.iter().rev() {
        // Forced, the estimate was wrong: the last turn alone is kept.
        if *turn <= 1 || kept + tokens(*n) > n_ctx / 4 || (force && b < k) {
            break;
        }
        kept += tokens(*n);
        b = turn - 1;
    }
    let summarized_before = log
        .compactions(&[])
        .filter(|c| c.rule == CompactionRule::Summary)
        .map(|c| c.through_turn)
        .max()
        .unwrap_or(0);
    // The summary input is the conversation through b and the instruction; it must leave
    // room for the summary itself.
    let instruction = tokens(SUMMARY_INSTRUCTION.len() as u64 + 16);
    while b >= 2 && b > summarized_before {
        let after: u64 = bytes.range(b + 1..).map(|(_, n)| tokens(*n)).sum();
        let input = estimate
            .saturating_sub(reserve)
            .saturating_sub(tokens(user.len() as u64 + 16))
            .saturating_sub(after)
            + instruction;
        if input + summary_max_tokens <= n_ctx {
            break;
        }
        b -= 1;
    }
    if b < 2 || b <= summarized_before {
        return (!compactions.is_empty()).then_some(Plan {
            compactions,
            summary_messages: None,
        });
    }
    let removed: u64 = bytes.range(2..=b).map(|(_, n)| tokens(*n)).sum();
    let after = estimate.saturating_sub(removed) + summary_max_tokens;
    let mut messages = log.render(&compactions, Some(b));
    messages.push(ChatMessage::User {
        content: SUMMARY_INSTRUCTION.to_owned(),
    });
    compactions.push(Compaction {
        rule: CompactionRule::Summary,
        from_turn: 2,
        through_turn: b,
        summary: None,
        tokens_before: before,
        tokens_after: after,
    });
    Some(Plan {
        compactions,
        summary_messages: Some(messages),
    })
}

/// Where the summary goes in a turn's messages: the first user message after the summary's
/// last turn (the new user message itself when it covers every earlier turn but the first).
pub fn summary_index(log: &Log, pending: &[Compaction]) -> usize {
    let rendered = log.rendered(pending, None);
    let through = pending
        .iter()
        .rev()
        .find(|c| c.rule == CompactionRule::Summary)
        .map_or(0, |c| c.through_turn);
    rendered
        .iter()
        .position(|(t, m)| *t > through && matches!(m, ChatMessage::User { .. }))
        .unwrap_or(rendered.len())
}

/// A turn's records, in order: its compactions, the user message, what the runner added,
/// then `end`.
pub fn turn_records(
    compactions: &[Compaction],
    user: &str,
    transcript: &[ChatMessage],
    end: TurnRecord,
) -> Vec<Record> {
    let mut out: Vec<Record> = compactions
        .iter()
        .cloned()
        .map(Record::Compaction)
        .collect();
    out.push(Record::User {
        content: user.to_owned(),
    });
    for m in transcript {
        out.push(match m {
            ChatMessage::Assistant(a) => Record::Assistant {
                content: a.content.clone(),
                reasoning_content: a.reasoning_content.clone(),
                tool_calls: a
                    .tool_calls
                    .iter()
                    .map(|c| WireCall {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    })
                    .collect(),
            },
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => Record::Tool {
                tool_call_id: tool_call_id.clone(),
                content: content.clone(),
            },
            // The runner adds only answers and tool results; anything else is kept as said.
            ChatMessage::User { content } | ChatMessage::System { content } => Record::User {
                content: content.clone(),
            },
        });
    }
    out.push(Record::Turn(end));
    out
}
