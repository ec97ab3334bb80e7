//! `loopd chat`: a conversation with `loopd serve` on a terminal, one session
//! (docs/sessions.md#loopd-chat).
//!
//! On a terminal: a `> ` prompt with line editing and history (rustyline); each line is a
//! `turn` of the session, its reply streamed with `loopd run`'s renderer (reasoning dimmed,
//! each tool call with its outcome); Ctrl-C while a turn runs cancels it (the session keeps
//! its earlier turns), at the prompt it clears the line; Ctrl-D leaves. Lines starting with `/`
//! are commands (`/help`). Anywhere else (a pipe, a file): one message per line, each
//! answer's text on its own line on stdout, the status of a failed turn on stderr, and the
//! exit status of the last failure (0 when every turn completed).

use std::io::{BufRead, IsTerminal};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loopd::daemon::client::{self, ClientError};
use loopd::daemon::protocol::{
    CancelCmd, Command, ErrorCode, HistoryCmd, HistoryReply, ListCmd, ListReply, OpenCmd,
    OpenReply, Record, ResultCmd, ResultReply, StatusCmd, StatusReply, TurnCmd, WireResult,
};
use rustyline::error::ReadlineError;

use crate::cli::ChatArgs;
use crate::exit::{Exit, Fail};
use crate::remote::{addr, call, exit_of, fail_of};
use crate::request_watcher::RequestWatcher;
use crate::stdout;

/// How long one reply line may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a streamed turn may be silent: longer than the daemon's own deadlines.
const TURN_SILENCE: Duration = Duration::from_secs(3_600);

const HELP: &str = "/history  the session's conversation so far\n\
                    /new      start a new session\n\
                    /budget N tool iterations of each turn from now on\n\
                    /tools    the tools the session offers\n\
                    /help     this list\n\
                    Ctrl-C cancels a running turn (or clears the line); Ctrl-D leaves.";

/// A line of the prompt, read as what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Nothing (an empty line).
    Empty,
    /// A message: a turn.
    Message(String),
    /// `/history`.
    History,
    /// `/new`.
    New,
    /// `/budget N`.
    Budget(u32),
    /// `/tools`.
    Tools,
    /// `/help`.
    Help,
    /// A command that is not one, or one with a bad argument: what to say.
    Bad(String),
}

/// Reads one line of the prompt.
pub fn parse_line(line: &str) -> Line {
    let t = line.trim();
    if t.is_empty() {
        return Line::Empty;
    }
    let Some(command) = t.strip_prefix('/') else {
        return Line::Message(t.to_owned());
    };
    let mut words = command.split_whitespace();
    let (name, arg, extra) = (words.next().unwrap_or(""), words.next(), words.next());
    match (name, arg, extra) {
        ("history", None, _) => Line::History,
        ("new", None, _) => Line::New,
        ("tools", None, _) => Line::Tools,
        ("help", None, _) => Line::Help,
        ("budget", Some(n), None) => match n.parse() {
            Ok(n) => Line::Budget(n),
            Err(_) => Line::Bad(format!(
                "/budget wants a number of tool iterations, not {n:?}"
            )),
        },
        ("budget", None, _) => Line::Bad("/budget wants a number: /budget 3".into()),
        ("history" | "new" | "tools" | "help" | "budget", _, _) => Line::Bad(format!(
            "/{name} takes no such argument; /help lists the commands"
        )),
        _ => Line::Bad(format!("no command /{name}; /help lists the commands")),
    }
}

/// A session's log as a person reads it, one block per record.
pub fn history_text(h: &HistoryReply) -> String {
    let mut out = format!(
        "session {}: {}, {} bytes\n",
        h.session.name,
        turns_text(h.session.turns),
        h.session.bytes
    );
    for r in &h.records {
        let line = match r {
            Record::User { content } => format!("you: {content}"),
            Record::Assistant {
                content,
                reasoning_content,
                tool_calls,
            } => {
                let mut s = String::new();
                if let Some(r) = reasoning_content.as_deref().filter(|r| !r.is_empty()) {
                    s.push_str(&format!("model (thinking): {r}\n"));
                }
                for c in tool_calls {
                    s.push_str(&format!("model calls {}({})\n", c.name, c.arguments));
                }
                match content.as_deref().filter(|c| !c.is_empty()) {
                    Some(c) => s.push_str(&format!("model: {c}")),
                    None => {
                        s.pop();
                    }
                }
                s
            }
            Record::Tool {
                tool_call_id,
                content,
            } => format!("tool ({tool_call_id}): {content}"),
            Record::Compaction(c) => match &c.summary {
                Some(s) => format!(
                    "[turns {} to {} summarized to fit the context: {s}]",
                    c.from_turn, c.through_turn
                ),
                None => format!(
                    "[{} of turns {} to {} removed to fit the context]",
                    c.rule.as_str().replace('_', " "),
                    c.from_turn,
                    c.through_turn
                ),
            },
            Record::Turn(_) => continue,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `--list`: a line a session, tab-separated: name, turns, when its last turn completed (UTC),
/// the log's bytes, and the running turn's request if one runs.
pub fn list_text(l: &ListReply) -> String {
    let mut out = String::new();
    for s in &l.sessions {
        out.push_str(&format!(
            "{}\t{}\tupdated {}\t{} bytes{}\n",
            s.name,
            turns_text(s.turns),
            utc_text(s.updated_ms),
            s.bytes,
            s.running
                .map_or(String::new(), |id| format!("\trunning req-{id}"))
        ));
    }
    out
}

/// `1 turn`, `2 turns`.
fn turns_text(n: u32) -> String {
    format!("{n} turn{}", if n == 1 { "" } else { "s" })
}

/// Unix milliseconds as an RFC 3339 UTC time to the second (`2026-12-05T03:15:43Z`).
pub fn utc_text(unix_ms: u64) -> String {
    // The `current_time` tool's calendar, one copy of it.
    loopd_agent::runner::utc(unix_ms / 1000)
}

/// What a turn read from a pipe writes.
#[derive(Debug, PartialEq, Eq)]
pub enum Piped {
    /// A completed turn: its answer's text and a newline, for stdout.
    Answer(String),
    /// A failed one: its status line, for stderr.
    Failed(String),
}

/// A turn's result as the pipe mode writes it.
pub fn piped(r: &WireResult) -> Piped {
    if r.completed() {
        Piped::Answer(format!(
            "{}\n",
            r.content.as_deref().unwrap_or("").trim_end()
        ))
    } else {
        Piped::Failed(format!(
            "loopd chat: req-{}: failed: {}: {}\n",
            r.id,
            r.fail_reason.as_deref().unwrap_or("?"),
            r.detail.as_deref().unwrap_or("")
        ))
    }
}

/// `loopd chat`.
pub fn chat(a: ChatArgs) -> Result<Exit, Fail> {
    let socket = addr(&a.addr)?;
    if a.list {
        let l: ListReply = call(&socket, ListCmd {}, REPLY_TIMEOUT)?;
        stdout::print(&list_text(&l))?;
        return Ok(Exit::Completed);
    }
    let open = OpenCmd {
        session: a.session.clone(),
        system: a.system.clone(),
        budget: a.budget,
        tools: (!a.tools.is_empty()).then(|| a.tools.clone()),
        ..OpenCmd::default()
    };
    let session = match &a.session {
        // Resumed when it exists, opened with that name when not.
        Some(name) => match client::call::<HistoryReply>(
            &socket,
            &HistoryCmd {
                session: name.clone(),
            }
            .into(),
            REPLY_TIMEOUT,
        ) {
            Ok(h) => {
                eprintln!(
                    "loopd chat: session {name} resumed ({}; /history shows them)",
                    turns_text(h.session.turns)
                );
                name.clone()
            }
            Err(ClientError::Refused(r)) if r.error == ErrorCode::SessionNotFound => {
                opened(&socket, &open)?
            }
            Err(e) => return Err(fail_of(e)),
        },
        None => opened(&socket, &open)?,
    };
    let mut chat = Chat {
        socket: &socket,
        session,
        budget: None,
        running: Arc::new(Mutex::new(TurnState::Idle)),
        open,
    };
    if std::io::stdin().is_terminal() {
        chat.interactive()
    } else {
        chat.lines(std::io::stdin().lock())
    }
}

/// Opens a session: its name.
fn opened(socket: &Path, open: &OpenCmd) -> Result<String, Fail> {
    let r: OpenReply = call(socket, open.clone(), REPLY_TIMEOUT)?;
    eprintln!(
        "loopd chat: session {} opened; /help for commands",
        r.session
    );
    Ok(r.session)
}

struct Chat<'a> {
    socket: &'a Path,
    session: String,
    /// A `/budget` to send with the next turn (the daemon keeps it from then on).
    budget: Option<u32>,
    /// The running turn, for Ctrl-C.
    running: Arc<Mutex<TurnState>>,
    /// What `/new` opens (the command line's settings, without its name).
    open: OpenCmd,
}

impl Chat<'_> {
    fn interactive(&mut self) -> Result<Exit, Fail> {
        let mut editor = rustyline::DefaultEditor::new()
            .map_err(|e| Fail::new(Exit::Failed, format!("the terminal: {e}")))?;
        self.cancel_on_interrupt();
        loop {
            let line = match editor.readline("> ") {
                Ok(l) => l,
                Err(ReadlineError::Interrupted) => continue,
                Err(ReadlineError::Eof) => return Ok(Exit::Completed),
                Err(e) => return Err(Fail::new(Exit::Failed, format!("reading a line: {e}"))),
            };
            let parsed = parse_line(&line);
            if parsed != Line::Empty {
                let _ = editor.add_history_entry(line.trim());
            }
            match parsed {
                Line::Empty => {}
                Line::Message(m) => {
                    if let Err(f) = self.turn(&m, true) {
                        eprintln!("loopd chat: {}", f.why);
                    }
                }
                other => {
                    if let Err(f) = self.command(other) {
                        eprintln!("loopd chat: {}", f.why);
                    }
                }
            }
        }
    }

    /// One message a line, the answers' text on stdout.
    fn lines(&mut self, input: impl BufRead) -> Result<Exit, Fail> {
        let mut exit = Exit::Completed;
        for line in input.lines() {
            let line = line.map_err(|e| Fail::new(Exit::Failed, format!("stdin: {e}")))?;
            match parse_line(&line) {
                Line::Empty => {}
                Line::Message(m) => match self.turn(&m, false) {
                    Ok(r) => match piped(&r) {
                        Piped::Answer(a) => stdout::print(&a)?,
                        Piped::Failed(f) => {
                            eprint!("{f}");
                            exit = exit_of(&r);
                        }
                    },
                    Err(f) => {
                        eprintln!("loopd chat: {}", f.why);
                        exit = f.exit;
                    }
                },
                other => self.command(other)?,
            }
        }
        Ok(exit)
    }

    /// A turn, followed to its end: rendered when `render` (a terminal), else only returned.
    fn turn(&mut self, content: &str, render: bool) -> Result<WireResult, Fail> {
        let cmd: Command = TurnCmd {
            session: self.session.clone(),
            content: content.to_owned(),
            follow: true,
            budget: self.budget,
        }
        .into();
        let (running, socket) = (self.running.clone(), self.socket);
        *lock(&running) = TurnState::Sent;
        let mut on_reply = |v: &loopd::daemon::protocol::SubmitReply| {
            let wanted = lock(&running).accepted(v.id);
            if let Some(id) = wanted {
                cancel(socket, id);
            }
        };
        let mut watcher = RequestWatcher::for_stdout();
        let followed = client::follow(self.socket, &cmd, TURN_SILENCE, &mut on_reply, &mut |e| {
            if render {
                watcher.event(e);
            }
        });
        *lock(&self.running) = TurnState::Idle;
        let result = followed.map_err(fail_of)?.result;
        self.budget = None;
        // Followed to the end: fetched, so the daemon need not keep it.
        let _ = client::call::<ResultReply>(
            self.socket,
            &ResultCmd { id: result.id }.into(),
            REPLY_TIMEOUT,
        );
        if render {
            watcher.finish(&result);
        }
        Ok(result)
    }

    fn command(&mut self, line: Line) -> Result<(), Fail> {
        match line {
            Line::History => {
                let h: HistoryReply = call(
                    self.socket,
                    HistoryCmd {
                        session: self.session.clone(),
                    },
                    REPLY_TIMEOUT,
                )?;
                stdout::print(&history_text(&h))?;
            }
            Line::New => {
                let unnamed = OpenCmd {
                    session: None,
                    ..self.open.clone()
                };
                self.session = opened(self.socket, &unnamed)?;
            }
            Line::Budget(n) => {
                self.budget = Some(n);
                eprintln!("loopd chat: {n} tool iterations a turn from the next turn on");
            }
            Line::Tools => {
                let h: HistoryReply = call(
                    self.socket,
                    HistoryCmd {
                        session: self.session.clone(),
                    },
                    REPLY_TIMEOUT,
                )?;
                let tools = match h.settings.tools {
                    Some(t) => t,
                    None => {
                        let s: StatusReply = call(self.socket, StatusCmd {}, REPLY_TIMEOUT)?;
                        s.status.tools
                    }
                };
                let shown = if tools.is_empty() {
                    "none".to_owned()
                } else {
                    tools.join(", ")
                };
                stdout::print(&format!("tools: {shown}\n"))?;
            }
            Line::Help => stdout::print(&format!("{HELP}\n"))?,
            Line::Bad(why) => eprintln!("loopd chat: {why}"),
            Line::Empty | Line::Message(_) => {}
        }
        Ok(())
    }

    /// Ctrl-C while a turn streams (the terminal is not rustyline's then, so it is a signal):
    /// the turn is cancelled on a connection of its own, and its stream ends with the
    /// cancelled result. The signal no longer ends the program.
    fn cancel_on_interrupt(&self) {
        let Ok(mut signals) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT])
        else {
            return;
        };
        let (running, socket) = (self.running.clone(), self.socket.to_owned());
        std::thread::spawn(move || {
            for _ in signals.forever() {
                let now = lock(&running).interrupt();
                if let Some(id) = now {
                    cancel(&socket, id);
                }
            }
        });
    }
}

/// Where the turn Ctrl-C would cancel is: Ctrl-C can come before the daemon has named the
/// turn's request, and is then kept until it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TurnState {
    /// No turn runs (at the prompt, or a command).
    Idle,
    /// The turn was sent; its request has no id yet.
    Sent,
    /// Ctrl-C came while [`TurnState::Sent`].
    CancelWanted,
    /// The turn runs as this request.
    Running(u64),
}

impl TurnState {
    /// Ctrl-C: the request to cancel now, if its id is known (else it is cancelled when it is).
    fn interrupt(&mut self) -> Option<u64> {
        match *self {
            TurnState::Running(id) => Some(id),
            TurnState::Sent => {
                *self = TurnState::CancelWanted;
                None
            }
            TurnState::Idle | TurnState::CancelWanted => None,
        }
    }

    /// The daemon named the sent turn's request: the request to cancel now if Ctrl-C came first.
    fn accepted(&mut self, id: u64) -> Option<u64> {
        let wanted = *self == TurnState::CancelWanted;
        *self = TurnState::Running(id);
        wanted.then_some(id)
    }
}

fn lock(m: &Mutex<TurnState>) -> std::sync::MutexGuard<'_, TurnState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cancel` on a connection of its own; its stream, not this reply, says how the turn ended.
fn cancel(socket: &Path, id: u64) {
    let _ = client::call::<serde_json::Value>(socket, &CancelCmd { id }.into(), REPLY_TIMEOUT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd::daemon::protocol::{
        Compaction, CompactionRule, OkTrue, SessionLine, WireCall, WireOutcome,
    };

    fn result(id: u64, content: Option<&str>, failed: Option<(&str, &str)>) -> WireResult {
        WireResult {
            id,
            outcome: match failed {
                None => WireOutcome::Completed,
                Some(_) => WireOutcome::Failed,
            },
            finish_reason: failed.is_none().then(|| "stop".into()),
            fail_reason: failed.map(|(r, _)| r.into()),
            detail: failed.map(|(_, d)| d.into()),
            content: content.map(Into::into),
            reasoning_content: None,
            tool_calls: vec![],
            not_run: vec![],
            exits: vec![],
            generations: vec![],
            budget: 1,
            budget_left: 1,
            stalls: vec![],
            retries: vec![],
            host: None,
            session: None,
        }
    }

    #[test]
    fn from_a_pipe_an_answer_is_its_text_and_a_newline_and_a_failure_a_status_line() {
        assert_eq!(
            piped(&result(2, Some("Blue.\n\n"), None)),
            Piped::Answer("Blue.\n".into())
        );
        assert_eq!(
            piped(&result(2, Some("One\ntwo."), None)),
            Piped::Answer("One\ntwo.\n".into()),
            "an answer of several lines keeps them"
        );
        assert_eq!(
            piped(&result(2, None, None)),
            Piped::Answer("\n".into()),
            "no text: an empty line, so answers stay one to a message"
        );
        assert_eq!(
            piped(&result(
                3,
                Some("partial"),
                Some(("http_error", "server said 500: boom"))
            )),
            Piped::Failed("loopd chat: req-3: failed: http_error: server said 500: boom\n".into())
        );
        assert_eq!(
            piped(&result(
                4,
                None,
                Some(("cancelled", "cancelled by a client"))
            )),
            Piped::Failed("loopd chat: req-4: failed: cancelled: cancelled by a client\n".into())
        );
    }

    #[test]
    fn the_list_is_a_line_a_session_with_its_updated_time() {
        let line = |name: &str, updated_ms, running| SessionLine {
            name: name.into(),
            turns: 3,
            bytes: 1_200,
            created_ms: 0,
            updated_ms,
            running,
        };
        let l = ListReply {
            ok: OkTrue,
            sessions: vec![
                line("story", 1_796_440_543_999, Some(9)),
                SessionLine {
                    turns: 1,
                    ..line("s-1", 951_782_400_000, None)
                },
            ],
        };
        assert_eq!(
            list_text(&l),
            "story\t3 turns\tupdated 2026-12-05T03:15:43Z\t1200 bytes\trunning req-9\n\
             s-1\t1 turn\tupdated 2000-02-29T00:00:00Z\t1200 bytes\n"
        );
        assert_eq!(
            list_text(&ListReply {
                ok: OkTrue,
                sessions: vec![]
            }),
            ""
        );
    }

    #[test]
    fn ctrl_c_cancels_the_running_turn_even_before_its_id_is_known() {
        let mut t = TurnState::Idle;
        assert_eq!(t.interrupt(), None, "at the prompt: nothing to cancel");
        assert_eq!(t, TurnState::Idle);
        t = TurnState::Sent;
        assert_eq!(t.accepted(7), None, "no Ctrl-C: runs on");
        assert_eq!(t.interrupt(), Some(7));
        assert_eq!(t.interrupt(), Some(7), "again: cancel again");
        t = TurnState::Sent;
        assert_eq!(t.interrupt(), None, "no id yet");
        assert_eq!(t.interrupt(), None);
        assert_eq!(t.accepted(8), Some(8), "cancelled once named");
        assert_eq!(t, TurnState::Running(8));
    }

    #[test]
    fn utc_text_matches_the_calendar() {
        // The expected values are `date -u -d @SECS +%FT%TZ`.
        assert_eq!(utc_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_text(951_782_399_000), "2000-02-28T23:59:59Z");
        assert_eq!(utc_text(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc_text(1_796_440_543_000), "2026-12-05T03:15:43Z");
        assert_eq!(utc_text(4_102_444_799_000), "2099-12-31T23:59:59Z");
        // Every day to 2199 against a calendar walked a day at a time.
        let (mut y, mut m, mut d) = (1970u64, 1u64, 1u64);
        for day in 0..84_000u64 {
            assert_eq!(
                utc_text(day * 86_400_000 + 86_399_999),
                format!("{y:04}-{m:02}-{d:02}T23:59:59Z")
            );
            let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
            let days_in = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            d += 1;
            if d > days_in[(m - 1) as usize] {
                (d, m) = (1, m + 1);
                if m > 12 {
                    (m, y) = (1, y + 1);
                }
            }
        }
    }

    #[test]
    fn each_line_is_a_message_or_a_command() {
        assert_eq!(parse_line("  "), Line::Empty);
        assert_eq!(parse_line(" hi there "), Line::Message("hi there".into()));
        assert_eq!(parse_line("/history"), Line::History);
        assert_eq!(parse_line("/new"), Line::New);
        assert_eq!(parse_line("/tools"), Line::Tools);
        assert_eq!(parse_line("/help"), Line::Help);
        assert_eq!(parse_line("/budget 3"), Line::Budget(3));
        assert_eq!(
            parse_line("/budget"),
            Line::Bad("/budget wants a number: /budget 3".into())
        );
        assert_eq!(
            parse_line("/budget x"),
            Line::Bad("/budget wants a number of tool iterations, not \"x\"".into())
        );
        assert_eq!(
            parse_line("/budget 3 4"),
            Line::Bad("/budget takes no such argument; /help lists the commands".into())
        );
        assert_eq!(
            parse_line("/history all"),
            Line::Bad("/history takes no such argument; /help lists the commands".into())
        );
        assert_eq!(
            parse_line("/quit"),
            Line::Bad("no command /quit; /help lists the commands".into())
        );
    }

    #[test]
    fn the_history_reads_as_a_conversation() {
        let h = HistoryReply {
            ok: OkTrue,
            session: SessionLine {
                name: "s".into(),
                turns: 2,
                bytes: 300,
                created_ms: 0,
                updated_ms: 0,
                running: None,
            },
            settings: Default::default(),
            records: vec![
                Record::User {
                    content: "2+3?".into(),
                },
                Record::Assistant {
                    content: None,
                    reasoning_content: Some("add".into()),
                    tool_calls: vec![WireCall {
                        id: "c1".into(),
                        name: "arithmetic".into(),
                        arguments: "{}".into(),
                    }],
                },
                Record::Tool {
                    tool_call_id: "c1".into(),
                    content: "5".into(),
                },
                Record::Assistant {
                    content: Some("5.".into()),
                    reasoning_content: None,
                    tool_calls: vec![],
                },
                Record::Compaction(Compaction {
                    rule: CompactionRule::Summary,
                    from_turn: 2,
                    through_turn: 4,
                    summary: Some("Sums.".into()),
                    tokens_before: 9,
                    tokens_after: 3,
                }),
                Record::Compaction(Compaction {
                    rule: CompactionRule::ToolResults,
                    from_turn: 1,
                    through_turn: 3,
                    summary: None,
                    tokens_before: 9,
                    tokens_after: 3,
                }),
            ],
        };
        assert_eq!(
            history_text(&h),
            "session s: 2 turns, 300 bytes\n\
             you: 2+3?\n\
             model (thinking): add\n\
             model calls arithmetic({})\n\
             tool (c1): 5\n\
             model: 5.\n\
             [turns 2 to 4 summarized to fit the context: Sums.]\n\
             [tool results of turns 1 to 3 removed to fit the context]\n"
        );
    }
}
