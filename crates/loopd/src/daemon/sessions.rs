//! The session commands of `loopd serve` (docs/sessions.md): `open`, `turn`, `history`,
//! `list` and `delete`, applied to the store. A turn is an ordinary request (`start` in
//! `commands.rs`) whose conversation is rendered from the session's log
//! (`session_log.rs`); its records are appended with its result (`state.rs`).

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::db::{DbError, SessionRefusal, SessionRow};
use super::line::send;
use super::listener::Daemon;
use super::protocol::{
    check_name, to_line, DeleteReply, ErrorCode, HistoryReply, ListReply, OkTrue, OpenCmd,
    OpenReply, ProtoError, Record, SessionLine, SessionSettings, TurnCmd,
};
use super::session_log::{plan, summary_index, Log, SUMMARY_PREFIX};
use super::state::{lock, Inner, State, TurnCtx};
use llama_proto::hash::sha256;
use loopd_agent::runner::{Submission, Summarize};
use loopd_client::llama::{ChatMessage, ChatOptions};

fn refused(code: ErrorCode, detail: String) -> String {
    ProtoError::Refused(code, detail).to_line()
}

fn not_found(name: &str) -> String {
    refused(
        ErrorCode::SessionNotFound,
        format!("no session named {name:?}"),
    )
}

/// The store's error, or a record that does not read back, as a reply.
fn store_failed(e: DbError) -> String {
    State::failed(e).to_line()
}

fn line_of(row: &SessionRow, running: Option<u64>) -> SessionLine {
    SessionLine {
        name: row.name.clone(),
        turns: row.turns,
        bytes: row.bytes,
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
        running,
    }
}

/// What a turn's prompt opens with, besides the log: the settings (which write the BIOS and
/// the tools) and the chat template. Two parts, so a change says which.
fn prefix_key(settings: &str, template: &str) -> String {
    let h = sha256(settings.as_bytes()).map_or(String::new(), |h| h.to_string());
    format!("template={template};settings={h}")
}

fn running(inner: &Inner, name: &str) -> Option<u64> {
    inner.busy.get(name).copied().flatten()
}

impl Daemon {
    pub(super) fn open_session(&self, c: &OpenCmd) -> String {
        if let Some(n) = &c.session {
            if let Err(e) = check_name(n) {
                return e.to_line();
            }
        }
        if self.stopping() {
            return ProtoError::ShuttingDown.to_line();
        }
        if let Some(t) = c
            .tools
            .iter()
            .flatten()
            .find(|t| !self.settings.tools.contains(t))
        {
            return ProtoError::UnknownTool(t.clone()).to_line();
        }
        let settings = to_line(&c.settings());
        let s = &self.state;
        let mut inner = lock(&s.inner);
        let max = self.settings.sessions.max_sessions;
        match inner
            .db
            .open_session(c.session.as_deref(), &settings, max, s.clock.wall())
        {
            Ok(Ok(name)) => to_line(&OpenReply {
                ok: OkTrue,
                session: name,
            }),
            Ok(Err(SessionRefusal::Exists)) => refused(
                ErrorCode::SessionExists,
                format!(
                    "a session named {:?} exists; resume it with turn",
                    c.session.as_deref().unwrap_or("")
                ),
            ),
            Ok(Err(_)) => refused(
                ErrorCode::SessionFull,
                format!("{max} sessions are open (sessions.max_sessions); delete one first"),
            ),
            Err(e) => {
                inner.freed |= e == DbError::DiskFull;
                store_failed(e)
            }
        }
    }

    pub(super) fn list_sessions(&self) -> String {
        let inner = lock(&self.state.inner);
        match inner.db.sessions() {
            Ok(rows) => to_line(&ListReply {
                ok: OkTrue,
                sessions: rows
                    .iter()
                    .map(|r| line_of(r, running(&inner, &r.name)))
                    .collect(),
            }),
            Err(e) => store_failed(e),
        }
    }

    pub(super) fn history(&self, name: &str) -> String {
        if let Err(e) = check_name(name) {
            return e.to_line();
        }
        let inner = lock(&self.state.inner);
        let (row, rows) = match (inner.db.session(name), inner.db.session_records(name)) {
            (Ok(Some(row)), Ok(rows)) => (row, rows),
            (Ok(None), _) => return not_found(name),
            (Err(e), _) | (_, Err(e)) => return store_failed(e),
        };
        let line = line_of(&row, running(&inner, name));
        drop(inner);
        let log = match Log::parse(&rows) {
            Ok(l) => l,
            Err(e) => return unreadable(name, &e.detail),
        };
        let settings: SessionSettings = match serde_json::from_str(&row.settings) {
            Ok(s) => s,
            Err(e) => return unreadable(name, &e.to_string()),
        };
        to_line(&HistoryReply {
            ok: OkTrue,
            session: line,
            settings,
            records: log.records().cloned().collect::<Vec<Record>>(),
        })
    }

    pub(super) fn delete_session(&self, name: &str) -> String {
        if let Err(e) = check_name(name) {
            return e.to_line();
        }
        let mut inner = lock(&self.state.inner);
        if let Some(id) = inner.busy.get(name) {
            return busy(name, *id);
        }
        match inner.db.delete_session(name) {
            Ok(Ok(())) => {
                inner.freed = true;
                inner.force_compact.remove(name);
                // No turn of it runs (busy was checked under this lock), so none saves
                // its file again.
                self.runner.forget_kv(name);
                to_line(&DeleteReply {
                    ok: OkTrue,
                    deleted: name.to_owned(),
                })
            }
            Ok(Err(_)) => not_found(name),
            Err(e) => {
                inner.freed |= e == DbError::DiskFull;
                store_failed(e)
            }
        }
    }

    pub(super) fn turn(
        self: &Arc<Daemon>,
        stream: &UnixStream,
        c: &TurnCmd,
        line: &[u8],
    ) -> io::Result<()> {
        if let Err(e) = check_name(&c.session) {
            return send(stream, &e.to_line());
        }
        if self.stopping() {
            return send(stream, &ProtoError::ShuttingDown.to_line());
        }
        let name = c.session.as_str();
        let s = &self.state;
        // Under the lock: the session is taken (busy) before anything else can look.
        let (row, rows, force) = {
            let mut inner = lock(&s.inner);
            let row = match inner.db.session(name) {
                Ok(Some(r)) => r,
                Ok(None) => return send(stream, &not_found(name)),
                Err(e) => return send(stream, &store_failed(e)),
            };
            if let Some(id) = inner.busy.get(name) {
                return send(stream, &busy(name, *id));
            }
            let max = self.settings.sessions.max_log_bytes;
            if row.bytes >= max {
                return send(
                    stream,
                    &refused(
                        ErrorCode::SessionFull,
                        format!(
                            "session {name:?}'s log holds {} bytes, at its cap of {max} \
                             (sessions.max_log_bytes); start a new session",
                            row.bytes
                        ),
                    ),
                );
            }
            let rows = match inner.db.session_records(name) {
                Ok(r) => r,
                Err(e) => return send(stream, &store_failed(e)),
            };
            let mut row = row;
            if let Some(b) = c.budget {
                let mut settings: SessionSettings =
                    serde_json::from_str(&row.settings).unwrap_or_default();
                settings.budget = Some(b);
                row.settings = to_line(&settings);
                if let Err(e) = inner.db.set_session_settings(name, &row.settings) {
                    inner.freed |= e == DbError::DiskFull;
                    return send(stream, &store_failed(e));
                }
            }
            inner.busy.insert(name.to_owned(), None);
            let force = inner.force_compact.remove(name);
            (row, rows, force)
        };
        match self.turn_request(c, &row, &rows, force) {
            Ok((request, ctx)) => self.start(stream, request, c.follow, line, Some(ctx)),
            Err(reply) => {
                s.release(Some(name));
                if force {
                    lock(&s.inner).force_compact.insert(name.to_owned());
                }
                send(stream, &reply)
            }
        }
    }

    /// The turn's request (its conversation from the log, compacted if it must be) and what
    /// its completion appends; or the reply refusing it.
    fn turn_request(
        &self,
        c: &TurnCmd,
        row: &SessionRow,
        rows: &[(u32, String)],
        force: bool,
    ) -> Result<(Submission, TurnCtx), String> {
        let name = row.name.as_str();
        let settings: SessionSettings =
            serde_json::from_str(&row.settings).map_err(|e| unreadable(name, &e.to_string()))?;
        let log = Log::parse(rows).map_err(|e| unreadable(name, &e.detail))?;
        let n_ctx = self.settings.n_ctx;
        let max_tokens = settings.max_tokens.unwrap_or(self.settings.max_tokens);
        let reserve = max_tokens.min(n_ctx / 4);
        let summary_max = self.settings.sessions.summary_max_tokens;
        let plan = plan(&log, &c.content, n_ctx, reserve, summary_max, force);
        let compactions = plan.as_ref().map_or(Vec::new(), |p| p.compactions.clone());
        let mut messages = log.render(&compactions, None);
        messages.push(ChatMessage::User {
            content: c.content.clone(),
        });
        let summarize = plan
            .and_then(|p| p.summary_messages)
            .map(|summary| Summarize {
                messages: summary,
                max_tokens: summary_max,
                into: summary_index(&log, &compactions),
                prefix: SUMMARY_PREFIX.to_owned(),
            });
        let key = prefix_key(&row.settings, &self.settings.template);
        let previous = log.last_turn();
        let why_not = match (&row.prefix_key, previous) {
            (_, None) => Some("first_turn"),
            _ if !compactions.is_empty() => Some("compacted"),
            (Some(k), _) if *k != key => Some(if k.split(';').next() != key.split(';').next() {
                "template_changed"
            } else {
                "settings_changed"
            }),
            _ => None,
        };
        let ctx = TurnCtx {
            session: name.to_owned(),
            turn: log.turns() + 1,
            user: c.content.clone(),
            compactions,
            prefix_key: key,
            extends: why_not.is_none(),
            why_not,
            prev_total: previous.map(|t| t.total_n),
        };
        let request = Submission {
            system: settings.system,
            messages,
            budget: settings.budget,
            tools: settings.tools,
            options: ChatOptions {
                thinking: settings.thinking,
                max_tokens: settings.max_tokens,
                ..ChatOptions::default()
            },
            session: Some(name.to_owned()),
            summarize,
        };
        Ok((request, ctx))
    }
}

fn busy(name: &str, id: Option<u64>) -> String {
    let which = id.map_or("a turn".to_owned(), |id| format!("req-{id}"));
    refused(
        ErrorCode::SessionBusy,
        format!("session {name:?} is running {which}; its turns run one at a time"),
    )
}

fn unreadable(name: &str, detail: &str) -> String {
    refused(
        ErrorCode::StoreFailed,
        format!("session {name:?}: its stored log cannot be read: {detail}"),
    )
}
