//! Every message of `loopd serve`'s protocol against the example lines of docs/loopd.md, byte
//! for byte: each typed message serializes to the doc's line, and the line reads back as the
//! same message. The lines are taken from the doc here, so the doc and the code cannot drift.

use loopd::daemon::protocol::{
    parse, to_line, CancelCmd, CancelReply, CancelState, Command, ErrorCode, ErrorReply, FollowCmd,
    FollowReply, MetricsCmd, MetricsReply, OkTrue, ResultCmd, ResultReply, ServeState, Status,
    StatusCmd, StatusReply, SubmitCmd, SubmitReply, WaitCmd, WireEvent, WireExit, WireGeneration,
    WireMessage, WireOutcome, WireResult, WireSource, WireStall, WireToolRun,
};
use loopd::daemon::protocol::{
    Compaction, CompactionRule, DeleteCmd, DeleteReply, HistoryCmd, ListCmd, ListReply, OpenCmd,
    OpenReply, Record, SessionLine, TurnCmd, TurnRecord,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

const DOC: &str = include_str!("../../../docs/loopd.md");

/// The doc's inline code spans.
fn spans() -> Vec<&'static str> {
    let mut out = Vec::new();
    for line in DOC.lines().filter(|l| !l.starts_with("```")) {
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            out.push(code);
        }
    }
    out
}

/// The doc's ```json blocks, each as its lines.
fn blocks() -> Vec<Vec<&'static str>> {
    let mut out = Vec::new();
    let mut lines = DOC.lines();
    while let Some(l) = lines.next() {
        if l == "```json" {
            out.push(lines.by_ref().take_while(|l| *l != "```").collect());
        }
    }
    out
}

/// The one span that starts with `prefix` (shown once or more, always the same).
fn span(prefix: &str) -> &'static str {
    let mut found: Vec<_> = spans()
        .into_iter()
        .filter(|s| s.starts_with(prefix))
        .collect();
    found.dedup();
    assert_eq!(found.len(), 1, "spans starting {prefix}: {found:?}");
    found[0]
}

/// The one block that starts with `prefix`, its lines trimmed and joined: the line on the
/// wire, shown wrapped.
fn block(prefix: &str) -> String {
    let found: Vec<String> = blocks()
        .into_iter()
        .map(|b| b.iter().map(|l| l.trim()).collect())
        .filter(|b: &String| b.starts_with(prefix))
        .collect();
    assert_eq!(found.len(), 1, "blocks starting {prefix}: {found:?}");
    found[0].clone()
}

/// `message` is written as `line`, and `line` reads back as `message`.
fn golden<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(message: &T, line: &str) {
    assert_eq!(to_line(message), line);
    assert_eq!(&serde_json::from_str::<T>(line).unwrap(), message, "{line}");
}

/// A command, also through the daemon's parse.
fn golden_command(cmd: impl Into<Command>, line: &str) {
    let cmd = cmd.into();
    golden(&cmd, line);
    assert_eq!(cmd.to_line(), line);
    assert_eq!(parse(line.as_bytes()), Ok(cmd), "{line}");
}

#[test]
fn submit_and_its_reply() {
    golden_command(
        SubmitCmd {
            system: Some("optional".into()),
            budget: Some(2),
            max_tokens: Some(512),
            tools: Some(vec!["arithmetic".into()]),
            ..SubmitCmd::new(vec![WireMessage::user("What is 17 times 23?")])
        },
        &block(r#"{"cmd":"submit""#),
    );
    golden(&SubmitReply::new(7), span(r#"{"ok":true,"id":7}"#));
}

fn the_docs_result() -> WireResult {
    WireResult {
        id: 7,
        outcome: WireOutcome::Completed,
        finish_reason: Some("stop".into()),
        fail_reason: None,
        detail: None,
        content: Some("391".into()),
        reasoning_content: None,
        tool_calls: vec![WireToolRun {
            iteration: 1,
            id: "c1".into(),
            name: "arithmetic".into(),
            arguments: "{...}".into(),
            source: WireSource::Native,
            ok: true,
            result: "391".into(),
        }],
        not_run: vec![],
        exits: vec![WireExit {
            generation: 2,
            name: "finish".into(),
            arguments: "{}".into(),
            source: WireSource::Native,
        }],
        generations: vec![WireGeneration {
            budget_left: 2,
            cache_n: 0,
            prompt_n: 310,
            predicted_n: 25,
            reasoning_tokens: 0,
            finish_reason: Some("tool_calls".into()),
            elapsed_ms: 812,
        }],
        budget: 2,
        budget_left: 1,
        stalls: vec![WireStall::NotStalled {
            since_progress_ms: 200,
        }],
        retries: vec![],
        host: None,
        session: None,
    }
}

#[test]
fn result_wait_and_the_result_object() {
    golden_command(ResultCmd { id: 7 }, span(r#"{"cmd":"result""#));
    let result = block(r#"{"id":7,"outcome""#);
    golden(&the_docs_result(), &result);
    golden(
        &ResultReply::new(the_docs_result()),
        &span(r#"{"ok":true,"result":"#).replace("{...}", &result),
    );
    golden_command(
        WaitCmd {
            id: 7,
            timeout_ms: Some(30_000),
        },
        span(r#"{"cmd":"wait""#),
    );
}

#[test]
fn cancel_and_its_replies() {
    golden_command(CancelCmd { id: 7 }, span(r#"{"cmd":"cancel""#));
    for (state, line) in [
        (
            CancelState::Cancelling,
            r#"{"ok":true,"state":"cancelling"}"#,
        ),
        (CancelState::Ended, r#"{"ok":true,"state":"ended"}"#),
    ] {
        golden(&CancelReply { ok: OkTrue, state }, span(line));
    }
}

#[test]
fn follow_its_reply_and_every_event() {
    golden_command(FollowCmd { id: 7 }, span(r#"{"cmd":"follow""#));
    let reply: FollowReply = SubmitReply::new(7);
    golden(&reply, span(r#"{"ok":true,"id":7}"#));
    let events = [
        WireEvent::Generation {
            number: 1,
            budget_left: 2,
        },
        WireEvent::Content {
            text: "The answer is ".into(),
        },
        WireEvent::Reasoning {
            text: "17 times 23".into(),
        },
        WireEvent::Waiting { slot_busy: true },
        WireEvent::Progress {
            total: 310,
            cache: 0,
            processed: 128,
        },
        WireEvent::Retrying {
            attempt: 2,
            after_ms: 500,
            error: "the stream closed before its end".into(),
        },
        WireEvent::ThinkingCapped { tokens: 512 },
        WireEvent::ToolStarted {
            id: "c1".into(),
            name: "arithmetic".into(),
            arguments: r#"{"operation":"multiply","numbers":[17,23]}"#.into(),
            source: WireSource::Native,
        },
        WireEvent::ToolFinished {
            id: "c1".into(),
            ok: true,
            result: "391".into(),
        },
        WireEvent::Exit {
            name: "finish".into(),
            arguments: "{}".into(),
            source: WireSource::Native,
        },
        WireEvent::Iteration {
            number: 1,
            budget_left: 1,
        },
        WireEvent::Stall(WireStall::NotStalled {
            since_progress_ms: 200,
        }),
        WireEvent::Placed {
            host: "gpu-b".into(),
            slot: 0,
            by: "rehomed".into(),
        },
        WireEvent::Kv {
            action: "restore".into(),
            outcome: "restored".into(),
            tokens: 174,
            bytes: 4_063_232,
            evicted: 0,
            us: 9_120,
            detail: None,
        },
    ];
    let lines: Vec<&str> = blocks()
        .into_iter()
        .find(|b| b[0].starts_with(r#"{"event":"#))
        .expect("the doc's block of events");
    assert_eq!(lines.len(), events.len(), "one doc line per event");
    for (e, line) in events.iter().zip(lines) {
        golden(e, line);
    }
    // Every event of the examples is in the doc's table.
    for name in [
        "generation",
        "content",
        "reasoning",
        "waiting",
        "progress",
        "retrying",
        "thinking_capped",
        "tool_started",
        "tool_finished",
        "exit",
        "iteration",
        "stall",
        "placed",
        "kv",
    ] {
        assert!(
            DOC.contains(&format!("| `{name}`")) || DOC.contains(&format!(", `{name}` |")),
            "the doc's table of events has no `{name}`"
        );
    }
}

#[test]
fn status_and_metrics_and_their_replies() {
    golden_command(StatusCmd {}, span(r#"{"cmd":"status"}"#));
    golden(
        &StatusReply {
            ok: OkTrue,
            status: Status {
                state: ServeState::Serving,
                slots: 2,
                busy: 1,
                running: vec![7],
                kept: 3,
                connections: 1,
                tools: vec!["current_time".into(), "arithmetic".into(), "finish".into()],
                hosts: vec![],
            },
        },
        span(r#"{"ok":true,"status":"#),
    );
    golden_command(MetricsCmd {}, span(r#"{"cmd":"metrics"}"#));
    golden(
        &MetricsReply {
            ok: OkTrue,
            metrics: "<Prometheus text format 0.0.4>".into(),
        },
        span(r#"{"ok":true,"metrics":"#),
    );
}

#[test]
fn the_error_reply_and_every_code_the_doc_names() {
    golden(
        &ErrorReply::new(
            ErrorCode::NoSlotAvailable,
            "every slot is busy (2 of 2); there is no queue",
        ),
        span(r#"{"ok":false,"error":"NO_SLOT_AVAILABLE""#),
    );
    for code in ErrorCode::ALL {
        assert!(
            spans().contains(&code.as_str()),
            "docs/loopd.md does not name {code}"
        );
    }
}

#[test]
fn the_session_commands_their_replies_and_the_logs_records() {
    golden_command(
        OpenCmd {
            session: Some("notes".into()),
            system: Some("Answer briefly.".into()),
            budget: Some(2),
            ..OpenCmd::default()
        },
        span(r#"{"cmd":"open""#),
    );
    golden(
        &OpenReply {
            ok: OkTrue,
            session: "notes".into(),
        },
        span(r#"{"ok":true,"session":"notes"}"#),
    );
    golden_command(
        TurnCmd {
            session: "notes".into(),
            content: "And the grass?".into(),
            follow: true,
            budget: None,
        },
        span(r#"{"cmd":"turn""#),
    );
    golden(&SubmitReply::new(8), span(r#"{"ok":true,"id":8}"#));
    let turn = TurnRecord {
        session: "notes".into(),
        turn: 2,
        request: 8,
        extends: true,
        why_not: None,
        cache_outcome: "hit".into(),
        cache_n: 118,
        prompt_n: 15,
        total_n: 153,
        compacted: vec![],
    };
    golden(&turn, span(r#"{"session":"notes","turn":2"#));
    golden_command(
        HistoryCmd {
            session: "notes".into(),
        },
        span(r#"{"cmd":"history""#),
    );
    for (record, prefix) in [
        (
            Record::User {
                content: "And the grass?".into(),
            },
            r#"{"kind":"user""#,
        ),
        (
            Record::Assistant {
                content: Some("Green.".into()),
                reasoning_content: None,
                tool_calls: vec![],
            },
            r#"{"kind":"assistant""#,
        ),
        (
            Record::Tool {
                tool_call_id: "c1".into(),
                content: "5".into(),
            },
            r#"{"kind":"tool""#,
        ),
        (
            Record::Compaction(Compaction {
                rule: CompactionRule::Summary,
                from_turn: 2,
                through_turn: 7,
                summary: Some("They compared colours.".into()),
                tokens_before: 4210,
                tokens_after: 1630,
            }),
            r#"{"kind":"compaction""#,
        ),
    ] {
        golden(&record, span(prefix));
    }
    let closing =
        serde_json::from_str::<Record>(&format!(r#"{{"kind":"turn",{}"#, &to_line(&turn)[1..]))
            .unwrap();
    assert_eq!(closing, Record::Turn(turn));
    golden_command(ListCmd {}, span(r#"{"cmd":"list"}"#));
    golden(
        &ListReply {
            ok: OkTrue,
            sessions: vec![SessionLine {
                name: "notes".into(),
                turns: 2,
                bytes: 612,
                created_ms: 1_764_892_800_000,
                updated_ms: 1_764_892_860_000,
                running: Some(9),
            }],
        },
        span(r#"{"ok":true,"sessions":"#),
    );
    golden_command(
        DeleteCmd {
            session: "notes".into(),
        },
        span(r#"{"cmd":"delete""#),
    );
    golden(
        &DeleteReply {
            ok: OkTrue,
            deleted: "notes".into(),
        },
        span(r#"{"ok":true,"deleted""#),
    );
}
