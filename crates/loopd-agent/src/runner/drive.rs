//! The IO driver of one [`AgentRequest`]: it carries out the machine's actions (the chat
//! request's gate, send, `/slots` and `reasoning_end` calls and reads through the client's
//! one chat IO driver, `ChatIo`, as `Client::run` does; tool calls on
//! threads of their own, llama-worker's socket: status, stall, register / progress / done) and
//! feeds the machine what came back (and the failures the runner's watch pushes for its
//! generation) with the time from the client's clock. Before it hands the machine anything
//! that ends the stream from outside (a pushed failure, a lost host, the worker's answer, a
//! cancel), it drains what the connection already holds into it ([`ChatIo::drain`]), so the
//! output sent before that is kept whole. It decides nothing: every wait is
//! bounded by the machine's [`poll_timeout`](AgentRequest::poll_timeout) and by
//! `limits.poll_ms`, so a cancel is seen within one poll interval, and a failure pushed for a
//! registered generation within [`PUSHED_WITHIN`]. A tool that ignores its cancel token keeps
//! only its own thread: the machine has given up on it at its deadline and the request goes
//! on.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use loopd_client::llama::{wait_until, ByteSink, Cancel, ChatIo};

use super::agent::{Action, AgentRequest, Setup};
use super::hosts::Host;
use super::watch::Notice;
use super::worker::{self, RegisterAnswer, WorkerError};
use super::{
    Observer, Outcome, RequestEvent, RequestId, RequestResult, Shared, Submission, ToolError,
};
use crate::fleet::PlacedBy;

/// Where a request runs: its host (index), the server slot there, and why there.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    pub host: usize,
    pub slot: u32,
    pub by: PlacedBy,
    /// The slot's last request was this one's session: its KV is there already.
    pub resident: bool,
}

/// While a generation is registered, the longest wait before a failure the watch pushed for
/// it is seen (the socket read and the sleep are cut into slices this long).
const PUSHED_WITHIN: Duration = Duration::from_millis(100);

/// The longest a refused connect waits for the health thread's word (a rehome, or
/// `host_lost`) before the request's own retry schedule takes the error.
const REHOME_WITHIN: Duration = Duration::from_secs(2);

/// A connect the inference socket refused, or whose socket file is gone: nothing was sent.
fn refused(e: &loopd_client::llama::InferError) -> bool {
    matches!(e, loopd_client::llama::InferError::Connect { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound))
}

/// A tool call running on its thread.
struct ToolRun {
    id: String,
    result: Receiver<Result<String, ToolError>>,
    cancel: Cancel,
}

/// What [`drive`] ends with: the request's result, and the generation whose `done` the
/// worker is still owed. That call waits until the result has been handed on (so the
/// caller's result does not wait for a worker round trip); the caller makes it with
/// [`done_after`].
pub(super) struct Driven {
    pub result: RequestResult,
    done: Option<u64>,
    /// The host it ended on (another than its first, if it was rehomed).
    pub host: usize,
}

impl Driven {
    /// The generation whose `done` is owed, if any.
    pub fn done(&self) -> Option<u64> {
        self.done
    }
}

/// Tells the worker that the last generation of a driven request ended (see [`Driven`]).
pub(super) fn done_after(host: &Host, id: RequestId, driven_done: Option<u64>) {
    let (Some(g), Some(socket)) = (driven_done, host.settings.worker_socket.as_deref()) else {
        return;
    };
    let timeout = Duration::from_millis(host.settings.worker_timeout_ms);
    if let Err(e) = worker::done(socket, g, timeout) {
        eprintln!("loopd: {id}: llama-worker did not answer `done` ({e})");
    }
}

/// Runs `req` to its result on `seat`; `ends` hears when its host is lost.
#[allow(clippy::too_many_arguments)]
pub(super) fn drive(
    shared: &Shared,
    id: RequestId,
    seat: Place,
    req: Submission,
    spawns: Option<u64>,
    cancel: &Cancel,
    ends: Receiver<Notice>,
    mut observer: Option<Observer>,
) -> Driven {
    let mut host = &shared.hosts[seat.host];
    let mut host_index = seat.host;
    let slot = seat.slot;
    let client = &host.client;
    let config = client.config();
    let clock = client.clock();
    let poll = Duration::from_millis(config.limits.poll_ms);
    let worker_timeout = Duration::from_millis(host.settings.worker_timeout_ms);
    // From the first host's pool (a new 5 MiB set was a memset on the request's
    // path before its POST); it goes back there when the request ends, rehomed or not.
    let mut buffers = client.buffers();
    let setup = Setup {
        id,
        slot,
        limits: config.limits,
        retry: config.retry.clone(),
        jitter: client.shared_jitter(),
        settings: &host.settings,
        tools: &shared.tools,
        bios: shared.bios.clone(),
        spawns,
    };
    // The session whose KV this request restores first and saves when it completes.
    let kv_session = req.session.clone().filter(|_| host.kv.is_some());
    let mut m = AgentRequest::new(clock.now(), setup, req, buffers.storage());
    let mut emit = |e: &RequestEvent| {
        if let Some(o) = observer.as_mut() {
            o(e);
        }
    };
    if shared.named {
        emit(&RequestEvent::Placed {
            host: host.name.clone(),
            slot,
            by: seat.by.as_str(),
        });
    }
    if let (Some(kv), Some(session)) = (&host.kv, &kv_session) {
        // Placement's word, checked against the server's: a slot that has run no task since
        // its server started holds nothing, whatever placement last put there (a model
        // instance respawned by the router is no restart the worker sees).
        let ran = || {
            super::kv::with_room(|| client.slots())
                .is_ok_and(|s| s.iter().any(|s| s.id == slot && s.has_run()))
        };
        let report = timed_kv(clock, || {
            if seat.resident && ran() {
                super::KvReport::resident()
            } else {
                let _files = super::lock(&shared.kv_files);
                kv.restore(client, slot, session)
            }
        });
        emit(&RequestEvent::Kv(report));
    }
    let mut io = ChatIo::new(client, slot);
    // The slot the request is on (another, on another host, once rehomed).
    let mut seat_slot = slot;
    let mut tool: Option<ToolRun> = None;
    let mut cancelled = false;
    // The generation registered with the worker, and where the watch sends its failure.
    let mut registered: Option<u64> = None;
    let (pushed_to, pushed) = mpsc::channel::<Notice>();
    // A worker that does not answer is logged once per request; the request goes on.
    let mut quiet = false;
    let mut unanswered = |what: &str, e: &WorkerError| {
        if !std::mem::replace(&mut quiet, true) {
            eprintln!("loopd: {id}: llama-worker did not answer `{what}` ({e}); going on");
        }
    };
    let mut socket = host.settings.worker_socket.as_deref();
    // A generation's `done`, sent before the next worker call or wait, or after the result.
    let mut owed: Option<u64> = None;
    let pay = |owed: &mut Option<u64>,
               socket: Option<&std::path::Path>,
               unanswered: &mut dyn FnMut(&str, &WorkerError)| {
        if let (Some(g), Some(s)) = (owed.take(), socket) {
            if let Err(e) = worker::done(s, g, worker_timeout) {
                unanswered("done", &e);
            }
        }
    };
    // Several hosts: a refused connect is put to the health thread, which places the
    // request once more elsewhere.
    let rehomable = shared.hosts.len() > 1;
    loop {
        while let Some(action) = m.poll_action() {
            if !matches!(action, Action::Event(_) | Action::Done(_)) {
                pay(&mut owed, socket, &mut unanswered);
            }
            match action {
                Action::Event(e) => emit(&e),
                Action::Acquire => {
                    let mut queued =
                        |e: &loopd_client::llama::ChatEvent| emit(&RequestEvent::Chat(e.clone()));
                    let acquired = io.acquire(cancel, &mut queued);
                    m.handle_acquired(clock.now(), acquired);
                }
                Action::Send(chat) => match io.send(&chat, cancel) {
                    Ok(()) => {
                        if rehomable {
                            shared.tell_health(super::health_queue::Input::Sent(id));
                        }
                        m.handle_sent(clock.now())
                    }
                    Err(e) if rehomable && refused(&e) => {
                        shared.tell_health(super::health_queue::Input::ConnectRefused(id));
                        match ends.recv_timeout(REHOME_WITHIN) {
                            Ok(Notice::Rehomed { host: to, slot }) => {
                                io.close(false);
                                if let (Some(w), Some(g)) = (&host.watch, registered.take()) {
                                    w.unroute(g);
                                }
                                owed = None;
                                host = &shared.hosts[to];
                                host_index = to;
                                socket = host.settings.worker_socket.as_deref();
                                io = ChatIo::new(&host.client, slot);
                                seat_slot = slot;
                                emit(&RequestEvent::Placed {
                                    host: host.name.clone(),
                                    slot,
                                    by: "rehomed",
                                });
                                let spawns = socket.and_then(|s| {
                                    worker::status(s, worker_timeout).ok().map(|st| st.spawns)
                                });
                                m.handle_rehomed(clock.now(), slot, spawns);
                            }
                            Ok(Notice::HostLost(detail)) => m.handle_host_lost(clock.now(), detail),
                            // No word in time (or a push meant for a generation): the
                            // request's own retry schedule takes the error.
                            Ok(Notice::Failed(..)) | Err(_) => m.handle_send_error(clock.now(), e),
                        }
                    }
                    Err(e) => m.handle_send_error(clock.now(), e),
                },
                Action::PollSlots => {
                    let seen = io.poll_slots(cancel);
                    m.handle_slots(clock.now(), seen);
                }
                Action::EndReasoning { id } => {
                    let ok = io.end_reasoning(&id, cancel);
                    m.handle_control_answer(clock.now(), ok);
                }
                // Dropping the connection closes it: the server stops generating, and the
                // slot's next request checks that it did.
                Action::Close { abandoned } => io.close(abandoned),
                Action::RunTool {
                    id,
                    name,
                    arguments,
                } => match start_tool(shared, &name, arguments) {
                    Ok((result, cancel)) => tool = Some(ToolRun { id, result, cancel }),
                    Err(e) => m.handle_tool_result(clock.now(), &id, Err(e)),
                },
                Action::CancelTool { id } => {
                    if let Some(t) = tool.take_if(|t| t.id == id) {
                        t.cancel.cancel();
                    }
                }
                Action::WorkerStatus => {
                    let st = match &host.settings.worker_socket {
                        Some(socket) => worker::status(socket, worker_timeout),
                        None => continue,
                    };
                    io.drain(clock, &mut m);
                    m.handle_worker_status(clock.now(), st);
                }
                Action::ReportStall { generation } => {
                    let answer = match (socket, generation) {
                        (Some(s), Some(g)) => worker::report_stall_of(s, g, worker_timeout),
                        (Some(s), None) => worker::report_stall(s, worker_timeout),
                        (None, _) => continue,
                    };
                    io.drain(clock, &mut m);
                    m.handle_stall_answer(clock.now(), answer);
                }
                Action::RegisterGeneration => {
                    let Some(s) = socket else { continue };
                    // Owned by the runner's watch connection, when it has said hello.
                    let watch = host.watch.as_ref().and_then(|w| w.id());
                    let answer = worker::register(s, slot, watch, worker_timeout);
                    match &answer {
                        Ok(RegisterAnswer::Registered(g)) => {
                            registered = Some(*g);
                            if let Some(w) = &host.watch {
                                w.route(*g, pushed_to.clone());
                            }
                        }
                        Ok(RegisterAnswer::Refused(_) | RegisterAnswer::SlotTaken) => {}
                        Err(e) => unanswered("register", e),
                    }
                    m.handle_registered(clock.now(), answer);
                }
                Action::ReportProgress { id: g, kind } => {
                    let Some(s) = socket else { continue };
                    // An unknown id was failed by the worker: its push ends the request.
                    if let Err(e) = worker::progress(s, g, kind, worker_timeout) {
                        unanswered("progress", &e);
                    }
                }
                Action::GenerationDone { id: g } => {
                    unroute(host, &mut registered);
                    owed = Some(g);
                }
                Action::Done(result) => {
                    unroute(host, &mut registered);
                    io.close(false);
                    // The slot holds the conversation and its answer: the file the
                    // session's next turn restores, wherever its slot is by then.
                    if let (Some(kv), Some(session), Outcome::Completed { .. }) =
                        (&host.kv, &kv_session, &result.outcome)
                    {
                        let held = result
                            .generations
                            .last()
                            .and_then(|g| g.timings)
                            .map_or(0, |t| t.total());
                        let report = timed_kv(clock, || {
                            let _files = super::lock(&shared.kv_files);
                            kv.save(&host.client, seat_slot, session, held)
                        });
                        emit(&RequestEvent::Kv(report));
                    }
                    return Driven {
                        result: *result,
                        done: owed,
                        host: host_index,
                    };
                }
            }
        }
        pay(&mut owed, socket, &mut unanswered);
        if let Ok(notice) = pushed.try_recv().or_else(|_| ends.try_recv()) {
            // What the server sent before the notice is the request's output too.
            io.drain(clock, &mut m);
            match notice {
                Notice::Failed(g, reason) => {
                    if registered == Some(g) {
                        registered = None;
                    }
                    m.handle_worker_failed(clock.now(), g, reason);
                }
                Notice::HostLost(detail) => m.handle_host_lost(clock.now(), detail),
                // A rehome answers a refused connect, above; one arriving here is stale.
                Notice::Rehomed { .. } => {}
            }
            continue;
        }
        if cancel.is_cancelled() && !cancelled {
            cancelled = true;
            io.drain(clock, &mut m);
            match cancel.why() {
                Some(why) => m.cancel_because(clock.now(), why),
                None => m.cancel(clock.now()),
            }
            continue;
        }
        let now = clock.now();
        let due = m.poll_timeout();
        if due.is_some_and(|at| now >= at) {
            m.handle_timeout(now);
            continue;
        }
        // A registered generation's pushed failure is looked for at least this often.
        let most = match registered {
            Some(_) => poll.min(PUSHED_WITHIN),
            None => poll,
        };
        let wait = wait_until(now, due, most);
        if io.read(clock, wait, &mut m) {
            continue;
        }
        if let Some(t) = &tool {
            match t.result.recv_timeout(wait) {
                Ok(r) => {
                    let id = t.id.clone();
                    tool = None;
                    m.handle_tool_result(clock.now(), &id, r);
                }
                Err(RecvTimeoutError::Timeout) => m.handle_timeout(clock.now()),
                Err(RecvTimeoutError::Disconnected) => {
                    let id = t.id.clone();
                    tool = None;
                    let crashed = Err(ToolError::Crashed("the tool panicked".into()));
                    m.handle_tool_result(clock.now(), &id, crashed);
                }
            }
        } else {
            cancel.sleep(clock, wait);
            m.handle_timeout(clock.now());
        }
    }
}

impl ByteSink for AgentRequest<'_> {
    fn handle_bytes(&mut self, now: Duration, input: &[u8]) -> usize {
        AgentRequest::handle_bytes(self, now, input)
    }
    fn handle_eof(&mut self, now: Duration) {
        AgentRequest::handle_eof(self, now)
    }
    fn handle_timeout(&mut self, now: Duration) {
        AgentRequest::handle_timeout(self, now)
    }
}

/// A KV save or restore, with the time it took on `clock`.
fn timed_kv(clock: &dyn clock::Clock, work: impl FnOnce() -> super::KvReport) -> super::KvReport {
    let began = clock.now();
    let mut report = work();
    report.micros = clock.now().saturating_sub(began).as_micros() as u64;
    report
}

/// Stops routing pushed failures to this request: its generation ended.
fn unroute(host: &Host, registered: &mut Option<u64>) {
    if let (Some(g), Some(w)) = (registered.take(), &host.watch) {
        w.unroute(g);
    }
}

/// Starts one call of the tool `name` on a thread of its own.
fn start_tool(
    shared: &Shared,
    name: &str,
    arguments: serde_json::Value,
) -> Result<(Receiver<Result<String, ToolError>>, Cancel), ToolError> {
    let tool = shared
        .tools
        .get(name)
        .ok_or_else(|| ToolError::Failed(format!("no tool named `{name}`")))?
        .clone();
    let cancel = Cancel::new();
    let (tx, rx) = mpsc::channel();
    let tc = cancel.clone();
    std::thread::Builder::new()
        .name(format!("loopd-tool-{name}"))
        .spawn(move || {
            let _ = tx.send(tool.run(&arguments, &tc));
        })
        .map_err(|e| ToolError::Crashed(format!("no thread: {e}")))?;
    Ok((rx, cancel))
}
