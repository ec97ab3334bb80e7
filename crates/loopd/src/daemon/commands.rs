//! Each command of `loopd serve`, applied: what it reads or writes in the store, and its reply.
//! A submit is written to the store before it is acknowledged; a result is fetched from it.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::db::DbError;
use super::follower::{follower, Feed};
use super::line::send;
use super::listener::{Daemon, EVENT_QUEUE, TICK};
use super::protocol::{
    to_line, CancelReply, CancelState, Command, ErrorCode, HostLine, MetricsReply, OkTrue,
    ProtoError, ResultReply, ServeState, Status, StatusReply, SubmitCmd, SubmitReply, WireResult,
};
use super::state::{lock, Hub, Refusal, State, TurnCtx};
use loopd_agent::runner::{RequestId, ResultError, Submission, SubmitError};

/// A `result` reply around the stored result's JSON text, read back into its type.
fn result_line(id: u64, stored: &str) -> String {
    match serde_json::from_str::<WireResult>(stored) {
        Ok(r) => to_line(&ResultReply::new(r)),
        Err(e) => ProtoError::Refused(
            ErrorCode::StoreFailed,
            format!("the stored result of {} cannot be read: {e}", RequestId(id)),
        )
        .to_line(),
    }
}

impl Daemon {
    /// Applies `cmd` (parsed from `line`) and writes its reply on `stream`.
    pub(super) fn apply(
        self: &Arc<Daemon>,
        stream: &UnixStream,
        cmd: Command,
        line: &[u8],
    ) -> io::Result<()> {
        match cmd {
            Command::Submit(s) => self.submit(stream, &s, line),
            Command::Result(c) => send(stream, &self.wait(c.id, Duration::ZERO)),
            Command::Wait(c) => send(
                stream,
                &self.wait(c.id, Duration::from_millis(c.timeout_ms())),
            ),
            Command::Cancel(c) => send(stream, &self.cancel(c.id)),
            Command::Follow(c) => self.follow(stream, c.id),
            Command::Status(_) => send(stream, &self.status()),
            Command::Metrics(_) => send(
                stream,
                &to_line(&MetricsReply {
                    ok: OkTrue,
                    metrics: self.metrics(),
                }),
            ),
            Command::Open(c) => send(stream, &self.open_session(&c)),
            Command::Turn(c) => self.turn(stream, &c, line),
            Command::History(c) => send(stream, &self.history(&c.session)),
            Command::List(_) => send(stream, &self.list_sessions()),
            Command::Delete(c) => send(stream, &self.delete_session(&c.session)),
        }
    }

    /// Takes the result of `id` from the store, waiting up to `timeout` for it to end.
    fn wait(&self, id: u64, timeout: Duration) -> String {
        let s = &self.state;
        let deadline = s.clock.now() + timeout;
        let mut inner = lock(&s.inner);
        loop {
            if let Some((_, body)) = inner.unstored.remove(&id) {
                // Fetched from memory: its row (still `running` in the store) goes, now or,
                // on a disk still full, once the store takes writes again.
                if inner.db.forget(id).is_err() {
                    inner.unforgotten.push(id);
                }
                return result_line(id, &body);
            }
            match inner.db.take_result(id, s.clock.wall()) {
                Ok(Ok(r)) => {
                    inner.freed = true;
                    return result_line(id, &r);
                }
                Ok(Err(ResultError::NotFound)) => {
                    return ProtoError::from(ResultError::NotFound).to_line()
                }
                Ok(Err(ResultError::Pending)) => {}
                Err(e) => return State::failed(e).to_line(),
            }
            s.drain_evicted(&mut inner);
            let left = deadline.saturating_sub(s.clock.now());
            if left.is_zero() {
                return ProtoError::from(ResultError::Pending).to_line();
            }
            inner = s
                .changed
                .wait_timeout(inner, s.clock.wait_slice(left.min(TICK * 20)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn cancel(&self, id: u64) -> String {
        let s = &self.state;
        let found = {
            let inner = lock(&s.inner);
            if inner.unstored.contains_key(&id) {
                Ok(Ok(String::new()))
            } else {
                inner.db.peek_result(id, s.clock.wall())
            }
        };
        match found {
            Ok(Err(ResultError::Pending)) => {
                // Outside the store's lock: the runner's table comes first.
                let _ = self.runner.cancel(RequestId(id));
                cancel_line(CancelState::Cancelling)
            }
            Ok(Ok(_)) => cancel_line(CancelState::Ended),
            Ok(Err(ResultError::NotFound)) => ProtoError::from(ResultError::NotFound).to_line(),
            Err(e) => State::failed(e).to_line(),
        }
    }

    /// Each named host for `status` and the metrics; none on a daemon of one unnamed host.
    pub(super) fn host_lines(&self) -> Vec<HostLine> {
        if !self.runner.named_hosts() {
            return Vec::new();
        }
        self.runner
            .hosts()
            .into_iter()
            .map(|h| HostLine {
                name: h.name,
                state: h.state.as_str().to_owned(),
                slots: h.slots,
                busy: h.busy,
            })
            .collect()
    }

    fn status(&self) -> String {
        let (slots, busy) = (self.runner.slots(), self.runner.busy_slots());
        let s = &self.state;
        let inner = lock(&s.inner);
        let (running, kept) = match (inner.db.running(), inner.db.kept()) {
            (Ok(r), Ok(k)) => (r, k),
            (Err(e), _) | (_, Err(e)) => return State::failed(e).to_line(),
        };
        drop(inner);
        to_line(&StatusReply {
            ok: OkTrue,
            status: Status {
                state: if self.stopping() {
                    ServeState::Stopping
                } else {
                    ServeState::Serving
                },
                slots,
                busy,
                running,
                kept,
                connections: self.connections.load(Ordering::SeqCst),
                tools: self.settings.tools.clone(),
                hosts: self.host_lines(),
            },
        })
    }

    fn follow(&self, stream: &UnixStream, id: u64) -> io::Result<()> {
        let s = &self.state;
        let (f, feed) = follower(stream, EVENT_QUEUE)?;
        {
            let inner = lock(&s.inner);
            match inner.live.get(&id) {
                Some(l) => lock(&l.hub).push(f),
                None => {
                    let reply = match inner.db.knows(id, s.clock.wall()) {
                        Ok(true) => ProtoError::Ended(RequestId(id)),
                        Ok(false) => ProtoError::from(ResultError::NotFound),
                        Err(e) => State::failed(e),
                    };
                    return send(stream, &reply.to_line());
                }
            }
        }
        feed.open(stream, &to_line(&SubmitReply::new(id)))?;
        self.stream_events(stream, feed)
    }

    fn stream_events(&self, stream: &UnixStream, feed: Feed) -> io::Result<()> {
        let s = &self.state;
        s.followers.fetch_add(1, Ordering::SeqCst);
        let sent = feed.pass_on(stream);
        // Under the store's lock, so a shutdown waiting on the count cannot miss the wake-up.
        let inner = lock(&s.inner);
        s.followers.fetch_sub(1, Ordering::SeqCst);
        drop(inner);
        s.changed.notify_all();
        sent
    }

    fn submit(
        self: &Arc<Daemon>,
        stream: &UnixStream,
        cmd: &SubmitCmd,
        line: &[u8],
    ) -> io::Result<()> {
        let request = match cmd.to_submission() {
            Ok(r) => r,
            Err(e) => return send(stream, &e.to_line()),
        };
        if self.stopping() {
            return send(stream, &ProtoError::ShuttingDown.to_line());
        }
        if let Some(t) = request
            .tools
            .iter()
            .flatten()
            .find(|t| !self.settings.tools.contains(t))
        {
            return send(stream, &ProtoError::UnknownTool(t.clone()).to_line());
        }
        self.start(stream, request, cmd.follow, line, None)
    }

    /// Starts `request` (a submit's, or a session's turn with its `turn`), stores it before
    /// the acknowledgement, and replies; with `follow`, streams its events and result. A
    /// refused turn's session is free again.
    pub(super) fn start(
        self: &Arc<Daemon>,
        stream: &UnixStream,
        request: Submission,
        follow: bool,
        line: &[u8],
        mut turn: Option<TurnCtx>,
    ) -> io::Result<()> {
        let session = turn.as_ref().map(|t| t.session.clone());
        let hub: Hub = Arc::new(Mutex::new(Vec::new()));
        let feed = match follow.then(|| follower(stream, EVENT_QUEUE)).transpose() {
            Ok(Some((f, feed))) => {
                lock(&hub).push(f);
                Some(feed)
            }
            Ok(None) => None,
            Err(e) => {
                self.state.release(session.as_deref());
                return Err(e);
            }
        };
        // The line parsed as JSON, so it is UTF-8.
        let submission = String::from_utf8_lossy(line);
        let mut named = None;
        let submitted = self.runner.submit_named(request, |seat| {
            let (id, observer) = self.state.name(&submission, seat, hub, turn.take())?;
            named = Some(id);
            Ok::<_, Refusal>((id, Some(observer)))
        });
        let id = match submitted {
            Ok(id) => id,
            Err(e) => {
                if let Some(id) = named {
                    self.state.forget(id.0);
                }
                self.state.release(session.as_deref());
                self.state.metrics.refused(e.code().as_str());
                let detail = match &e {
                    Refusal::Runner(SubmitError::NoSlotAvailable) => format!(
                        "every slot is busy ({} of {}); there is no queue",
                        self.runner.busy_slots(),
                        self.runner.slots()
                    ),
                    Refusal::Runner(other) => format!("llama-worker is not ready: {other}"),
                    Refusal::Store(DbError::DiskFull) => format!(
                        "the store's disk is full: no new request is taken; every result \
                         already acknowledged is kept ({})",
                        lock(&self.state.inner).db.path().display()
                    ),
                    Refusal::Store(other) => format!("the store refused the request: {other}"),
                };
                return send(stream, &ProtoError::Refused(e.code(), detail).to_line());
            }
        };
        self.state.metrics.set_busy(self.runner.busy_slots());
        self.state.metrics.set_hosts(&self.host_lines());
        let reply = to_line(&SubmitReply::new(id.0));
        match feed {
            Some(feed) => {
                feed.open(stream, &reply)?;
                self.stream_events(stream, feed)
            }
            None => send(stream, &reply),
        }
    }
}

fn cancel_line(state: CancelState) -> String {
    to_line(&CancelReply { ok: OkTrue, state })
}
