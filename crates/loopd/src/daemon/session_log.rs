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
use loopd_client::llama::{AssistantMessage, ChatMessage};

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

    /// The last turn a logged compaction by `rule` covers (0: none).
    fn compacted_through(&self, rule: CompactionRule) -> u32 {
        self.compactions(&[])
            .filter(|c| c.rule == rule)
            .map(|c| c.through_turn)
            .max()
            .unwrap_or(0)
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
                    tool_calls: tool_calls.iter().map(WireCall::to_call).collect(),
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
    let tools_through = log.compacted_through(CompactionRule::ToolResults);
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
    let summarized_before = log.compacted_through(CompactionRule::Summary);
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
                tool_calls: a.tool_calls.iter().map(WireCall::from).collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use loopd_client::llama::ToolCall;

    fn turn_end(turn: u32, total_n: u64) -> Record {
        Record::Turn(TurnRecord {
            session: "s".into(),
            turn,
            request: u64::from(turn),
            extends: turn > 1,
            why_not: None,
            cache_outcome: "hit".into(),
            cache_n: 0,
            prompt_n: 0,
            total_n,
            compacted: vec![],
        })
    }

    fn user(t: &str) -> Record {
        Record::User { content: t.into() }
    }

    fn said(t: &str) -> Record {
        Record::Assistant {
            content: Some(t.into()),
            reasoning_content: None,
            tool_calls: vec![],
        }
    }

    fn tool(t: &str) -> Record {
        Record::Tool {
            tool_call_id: "c".into(),
            content: t.into(),
        }
    }

    /// Turns of (user, tool result, answer), each with its running total.
    fn log(turns: &[(&str, &str, &str, u64)]) -> Log {
        let mut records = Vec::new();
        for (i, (u, t, a, total)) in turns.iter().enumerate() {
            let n = i as u32 + 1;
            records.push((n, user(u)));
            records.push((n, tool(t)));
            records.push((n, said(a)));
            records.push((n, turn_end(n, *total)));
        }
        Log { records }
    }

    fn contents(m: &[ChatMessage]) -> Vec<String> {
        m.iter()
            .map(|m| match m {
                ChatMessage::System { content }
                | ChatMessage::User { content }
                | ChatMessage::Tool { content, .. } => content.clone(),
                ChatMessage::Assistant(a) => a.content.clone().unwrap_or_default(),
            })
            .collect()
    }

    fn compaction(rule: CompactionRule, through: u32, summary: Option<&str>) -> Compaction {
        Compaction {
            rule,
            from_turn: if rule == CompactionRule::Summary {
                2
            } else {
                1
            },
            through_turn: through,
            summary: summary.map(str::to_owned),
            tokens_before: 0,
            tokens_after: 0,
        }
    }

    #[test]
    fn a_log_renders_as_its_messages_and_compactions_apply_to_their_turns_only() {
        let l = log(&[
            ("u1", "t1", "a1", 10),
            ("u2", "t2", "a2", 20),
            ("u3", "t3", "a3", 30),
            ("u4", "t4", "a4", 40),
        ]);
        assert_eq!(
            contents(&l.render(&[], None)),
            ["u1", "t1", "a1", "u2", "t2", "a2", "u3", "t3", "a3", "u4", "t4", "a4"]
        );
        let tools = compaction(CompactionRule::ToolResults, 2, None);
        let note = tool_note(2);
        assert_eq!(
            contents(&l.render(std::slice::from_ref(&tools), Some(3))),
            ["u1", &note, "a1", "u2", &note, "a2", "u3", "t3", "a3"]
        );
        // A summary of turns 2..=3 goes before turn 4's user message; a pending one (no
        // text yet) leaves the place to the runner.
        let summary = compaction(CompactionRule::Summary, 3, Some("S"));
        assert_eq!(
            contents(&l.render(&[tools.clone(), summary.clone()], None)),
            ["u1", &note, "a1", &summarized("S", "u4"), "t4", "a4"]
        );
        let pending = compaction(CompactionRule::Summary, 3, None);
        assert_eq!(
            contents(&l.render(std::slice::from_ref(&pending), None)),
            ["u1", "t1", "a1", "u4", "t4", "a4"]
        );
        assert_eq!(summary_index(&l, &[pending]), 3);
        // Only the latest summary is rendered: it covers the earlier one's turns.
        let later = compaction(CompactionRule::Summary, 2, None);
        let mut logged = l.clone();
        logged.records.push((5, Record::Compaction(summary)));
        assert_eq!(
            contents(&logged.render(std::slice::from_ref(&later), None)),
            ["u1", "t1", "a1", "u3", "t3", "a3", "u4", "t4", "a4"]
        );
    }

    /// The compaction threshold at its limit and one past: an estimate of exactly `n_ctx`
    /// plans nothing; one token more plans a compaction.
    #[test]
    fn the_estimate_at_the_context_plans_nothing_and_one_past_it_compacts() {
        let l = log(&[("u1", "t1", "a1", 1000)]);
        // 1000 + ceil(0.5 * (0 + 16)) + 100 = 1108.
        assert_eq!(plan(&l, "", 1108, 100, 50, false), None);
        assert_eq!(plan(&l, "", 0, 100, 50, false), None, "n_ctx unknown");
        // One turn: nothing older than the last two for rule 1, no turn 2 for rule 2.
        assert_eq!(plan(&l, "", 1107, 100, 50, false), None);
        let big = "x".repeat(400);
        let l = log(&[
            ("u1", &big, "a1", 300),
            ("u2", &big, "a2", 600),
            ("u3", &big, "a3", 900),
            ("u4", "t4", "a4", 1000),
        ]);
        // Measured on turns 3 and 4: 100 tokens over 55 bytes, clamped to 1 token a byte.
        assert_eq!(l.tokens_per_byte(), 1.0);
        let at = 1000 + 16 + 100;
        assert_eq!(plan(&l, "", at, 100, 50, false), None);
        let p = plan(&l, "", at - 1, 100, 50, false).expect("one past the context");
        assert_eq!(p.compactions[0].rule, CompactionRule::ToolResults);
        assert_eq!(
            (p.compactions[0].from_turn, p.compactions[0].through_turn),
            (1, 2)
        );
        assert_eq!(p.compactions[0].tokens_before, at);
    }

    #[test]
    fn a_summary_keeps_turn_1_and_the_last_turns_and_is_asked_after_them() {
        let long = "y".repeat(800);
        let l = log(&[
            ("u1", "t", &long, 420),
            ("u2", "t", &long, 840),
            ("u3", "t", &long, 1260),
            ("u4", "t", &long, 1680),
        ]);
        assert_eq!(plan(&l, "next", 1800, 100, 60, false), None, "it fits");
        let p = plan(&l, "next", 1700, 100, 60, false).expect("over the context");
        let s = p.compactions.last().unwrap();
        assert_eq!(s.rule, CompactionRule::Summary);
        assert_eq!(
            (s.from_turn, s.through_turn),
            (2, 3),
            "turn 4 fits a quarter"
        );
        let asked = p.summary_messages.unwrap();
        assert_eq!(
            contents(&asked).last().unwrap(),
            SUMMARY_INSTRUCTION,
            "the instruction comes last"
        );
        assert_eq!(contents(&asked)[0], "u1");
        assert!(!contents(&asked).contains(&"u4".to_owned()));
        // Forced (the server refused the last turn), only the last turn is kept.
        let forced = plan(&l, "next", 100_000, 100, 60, true).expect("forced");
        let s = forced.compactions.last().unwrap();
        assert_eq!((s.rule, s.through_turn), (CompactionRule::Summary, 3));
    }

    #[test]
    fn tokens_per_byte_is_measured_on_the_last_two_turns() {
        assert_eq!(Log::default().tokens_per_byte(), DEFAULT_TOKENS_PER_BYTE);
        let l = log(&[("u1", "t1", "a1", 100), ("a", "b", "c", 150)]);
        // Turn 2 renders 3 messages of 1 byte (+16 each, the tool's id 1 more): 52 bytes.
        let want = (50.0 / 52.0f64).clamp(0.1, 1.0);
        assert_eq!(l.tokens_per_byte(), want);
    }

    #[test]
    fn a_turns_records_are_its_compactions_its_message_what_the_runner_added_and_its_end() {
        let c = compaction(CompactionRule::ToolResults, 1, None);
        let transcript = [
            ChatMessage::Assistant(AssistantMessage {
                content: None,
                reasoning_content: Some("hmm".into()),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "arithmetic".into(),
                    arguments: "{}".into(),
                }],
            }),
            ChatMessage::Tool {
                tool_call_id: "c1".into(),
                content: "5".into(),
            },
        ];
        let end = turn_end(2, 9);
        let Record::Turn(t) = end.clone() else {
            unreachable!()
        };
        let r = turn_records(std::slice::from_ref(&c), "q", &transcript, t);
        assert_eq!(
            r,
            [
                Record::Compaction(c),
                user("q"),
                Record::Assistant {
                    content: None,
                    reasoning_content: Some("hmm".into()),
                    tool_calls: vec![WireCall {
                        id: "c1".into(),
                        name: "arithmetic".into(),
                        arguments: "{}".into()
                    }]
                },
                Record::Tool {
                    tool_call_id: "c1".into(),
                    content: "5".into()
                },
                end
            ]
        );
    }
}
