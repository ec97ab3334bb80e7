//! The request runner of seed 003: agent requests on a fixed table of slots, each run end to
//! end (generation, tool iterations on a budget, exit tools, fallback parsing of calls
//! written as text, loop detection) and its result kept until it is fetched once.
//!
//! Every decision about one request is made by its [`AgentRequest`], a sans-IO machine
//! (`agent.rs`); the runner only drives machines. It owns the slot table, one driver thread
//! per running request (`drive.rs`: the sockets and the tool threads), and nothing else.
//!
//! - [`Runner::submit`] takes a free slot or refuses at once: `NO_SLOT_AVAILABLE` when every
//!   slot is busy (there is no queue), `WORKER_NOT_READY` / `WORKER_FAILED` when llama-worker
//!   (asked on its status socket, when the config names one) is not ready. A refusal uses no
//!   slot. Runner slot `i` is server slot `i` (`id_slot`).
//! - The slot is released the moment the request ends, whatever ended it; then its
//!   [`RequestResult`] goes, from the request's own driver thread, to the runner's completion
//!   sink. Without one ([`Runner::complete_into`]), the runner keeps results in memory itself:
//!   [`Runner::get_result`] hands each out once (later calls are `NOT_FOUND`), as `loopd run`
//!   in process and the tests use it. With one (the daemon's durable store), the runner keeps
//!   no result at all: the sink is the one result table.
//! - Ids are the runner's own counter ([`Runner::submit`]) or the caller's
//!   ([`Runner::submit_named`]: the daemon's store gives them, once a slot is sure).
//! - [`Runner::cancel`] ends a request within one poll interval with its partial output.
//! - A [`Submission`] with a [`Summarize`] (a session's compaction) opens with a summary
//!   generation on the same slot: its text is written into one of the request's user
//!   messages, then generation 1 runs as it would have without it. It is not one of the
//!   result's generations; its failure is the request's, with no output.
//! - With a worker socket each request reads the worker's status every
//!   `runner.worker_poll_ms`: a restart (a new spawn, or a state other than ready) fails it
//!   with `worker_restarted` (`server_died` when the server exited on its own). A generating
//!   request with no stream progress for `runner.stall_ms` reports a stall on the socket; the
//!   worker restarts only if it saw no CPU progress either.
//! - With a worker socket each generation is registered with the worker, and one `watch`
//!   connection per runner (`watch.rs`, its own thread, reopened when lost) delivers the
//!   worker's `failed <id> <reason>` to the request holding that generation: it ends at once
//!   (within 100 ms) with its partial output. The status poll stays as the
//!   fallback for a failure the watch missed. Admission takes the worker's state from the
//!   watch's last `state` line, so a submit makes no worker round trip before its POST;
//!   it asks `status` instead while the watch has none, or while a line of it waits unread
//!   (the worker writes the state `start` and `stop` set on every watch before it answers
//!   them, so a submit after such an answer goes by the new state).

mod agent;
mod answer;
mod bios;
mod builtin;
mod config;
mod drive;
mod health_queue;
mod hosts;
mod kv;
mod result;
mod tools;
mod watch;
pub mod worker;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fleet::{Fleet, HostConfig, HostId, HostState, Placement, PlacementConfig, SessionKey};
use loopd_client::llama::{Cancel, ChatMessage, ChatOptions, Client};

pub use crate::fleet::{RequestId, SubmitError};
pub use agent::{Action, AgentRequest, Setup, PROGRESS_EVERY};
pub use bios::{BiosContext, BiosProvider, StandardBios};
pub use builtin::{builtin_tools, utc, Arithmetic, CurrentTime, Finish, ReadFile, READ_FILE_CAP};
pub use config::{LoopThresholds, RunnerConfig};
pub use hosts::HostSpec;
pub use kv::{evictions, KvAction, KvFile, KvOutcome, KvReport, KvSettings};
pub use result::{
    CallSource, ExitSignal, FailReason, GenerationStats, Outcome, RequestEvent, RequestResult,
    RetryRecord, ToolRecord,
};
pub use tools::{RegistryError, Tool, ToolError, ToolRegistry};
pub use worker::{StallAnswer, WorkerState, WorkerStatus};

/// How many times one submit asks the workers again when placement's word refuses it
/// (`submit_named`).
const RELEARNS: u32 = 3;

/// Where a request was placed, as [`Runner::submit_named`] hands it to the caller to record
/// with the request: a result recovered after the daemon's death names it as a finished one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat<'a> {
    /// The host's name, with several hosts (`[[host]]`); `None` for the one server of a plain
    /// config, whose results name no host.
    pub host: Option<&'a str>,
    /// The server slot (`id_slot`).
    pub slot: u32,
}

/// What a caller submits for one agent request ([`Runner::submit`]); the request itself, as
/// it runs, is its [`AgentRequest`] machine, and it ends with a [`RequestResult`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Submission {
    /// The caller's system message, sent after the BIOS.
    pub system: Option<String>,
    /// The conversation (user and earlier turns).
    pub messages: Vec<ChatMessage>,
    /// Tool iterations allowed; `None` takes `runner.budget`.
    pub budget: Option<u32>,
    /// The tools this request's generations offer, by name; `None` offers every tool of the
    /// runner. A call to a tool not chosen is refused as a call to an unknown tool.
    pub tools: Option<Vec<String>>,
    /// How the model answers (thinking, `max_tokens`, sampling), sent unchanged with every
    /// generation: the chat request's own struct, not a copy of its fields.
    pub options: ChatOptions,
    /// The conversation this request continues, for placement on several hosts: requests of
    /// one session go back to the host whose prompt cache holds it. `None`: the session is
    /// the BIOS, the system message and the first user message.
    pub session: Option<String>,
    /// A summary to write before generation 1 (a session's compaction, docs/sessions.md):
    /// its generation runs first, on the same slot, and its text goes into one of
    /// [`messages`](Submission::messages). `None`: generation 1 is the first.
    pub summarize: Option<Summarize>,
}

/// The summary generation a [`Submission`] may open with. It is sent the BIOS, the system
/// message and then [`messages`](Summarize::messages), with the request's tools (so the
/// server's prompt cache keeps that prefix for generation 1) and options, except `max_tokens`
/// and thinking, which is off; its answer's content, trimmed, is the summary (`(no summary)`
/// when empty; calls and reasoning, if any, are ignored). The summary is then written into
/// `Submission::messages[into]`, a user message, before its content: `prefix`, the summary, a
/// blank line, then the message as it was; when `into` is past the end or not a user message,
/// nothing is written (the `Summarized` event still carries the summary). A summary generation
/// that fails ends the request as any generation's failure does, with no output.
///
/// It runs through the same machinery as the request's own generations (the slot gate,
/// retries, worker registration, stall reports, loop detection, cancel), but is not one of
/// them: it is not in [`RequestResult::generations`] nor in the transcript, spends no budget,
/// has no [`RequestEvent::Generation`] (its end is [`RequestEvent::Summarized`]), and its
/// timings are not what generation 1's cache outcome is judged against.
#[derive(Debug, Clone, PartialEq)]
pub struct Summarize {
    /// The turns to summarize, then the instruction (a user message).
    pub messages: Vec<ChatMessage>,
    /// The summary's `max_tokens`.
    pub max_tokens: u64,
    /// The index in `Submission::messages` of the user message the summary goes into.
    pub into: usize,
    /// The words before the summary.
    pub prefix: String,
}

/// Why `get_result` or `cancel` had nothing to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultError {
    /// No such request, or its result was already fetched.
    NotFound,
    /// The request is still running.
    Pending,
}

impl ResultError {
    /// `NOT_FOUND` or `PENDING`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultError::NotFound => "NOT_FOUND",
            ResultError::Pending => "PENDING",
        }
    }
}

impl fmt::Display for ResultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for ResultError {}

/// One host as [`Runner::hosts`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    /// Its name (`local` for the one host of a config without `[[host]]`).
    pub name: String,
    /// What the runner knows of it: its worker's state, `unknown` or `lost`.
    pub state: HostState,
    /// The slots the runner owns there.
    pub slots: usize,
    /// Of them, those running a request.
    pub busy: usize,
}

/// What watches one request live.
pub type Observer = Box<dyn FnMut(&RequestEvent) + Send>;

/// Where each request's result goes when it ends, called once per request on its driver
/// thread after its slot was released (so it may take its caller's locks, and a submit that
/// follows the result finds the slot free).
pub type Completion = Box<dyn Fn(RequestResult) + Send + Sync>;

/// [`Runner::complete_into`] was called a second time: the first sink stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkAlreadySet;

impl fmt::Display for SinkAlreadySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the runner already has a completion sink")
    }
}

impl std::error::Error for SinkAlreadySet {}

enum Record {
    Running {
        cancel: Cancel,
        thread: Option<JoinHandle<()>>,
    },
    Done {
        result: Box<RequestResult>,
        thread: Option<JoinHandle<()>>,
    },
}

struct Table {
    /// Every owned (host, slot) seat and the request holding it, the session map, and each
    /// host's state as the health thread last said it.
    placement: Placement,
    /// Running requests, and (without a completion sink) results not yet fetched.
    records: HashMap<RequestId, Record>,
}

struct Shared {
    /// The client the runner was made with: its clock, and its config for what is not per
    /// host.
    client: Arc<Client>,
    tools: ToolRegistry,
    bios: Arc<dyn BiosProvider>,
    settings: RunnerConfig,
    /// The hosts, in config order (`HostId` `i` is `hosts[i]`).
    hosts: Vec<hosts::Host>,
    /// Whether the hosts came from `[[host]]` (named in results and events).
    named: bool,
    /// Where a lost host is told to its running requests.
    ends: hosts::Ends,
    /// The health thread's queue.
    health: Mutex<Option<std::sync::mpsc::Sender<health_queue::Input>>>,
    table: Mutex<Table>,
    stored: Condvar,
    /// The ids [`Runner::submit`] gives.
    next_id: AtomicU64,
    /// The ids a seat is held under until the caller names the request.
    next_provisional: AtomicU64,
    /// Where results go; unset: into `table.records`.
    completion: OnceLock<Completion>,
    /// Held while KV files are saved, restored or deleted: one at a time.
    kv_files: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock leaves plain data behind; keep serving it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The request runner: see the [module docs](self).
pub struct Runner {
    shared: Arc<Shared>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("slots", &self.slots())
            .field("tools", &self.shared.tools)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner of `slots` slots (at least 1) over `client`, with `tools` and `bios`, run by
    /// `settings` (`[runner]`). Its one host is the client's inference socket and
    /// `settings.worker_socket`, unnamed: a config without `[[host]]`.
    pub fn new(
        client: Arc<Client>,
        settings: RunnerConfig,
        tools: ToolRegistry,
        bios: Arc<dyn BiosProvider>,
        slots: u32,
    ) -> Runner {
        let host = HostSpec {
            name: "local".into(),
            infer_socket: client.config().socket.clone(),
            worker_socket: settings.worker_socket.clone(),
            slots: (0..slots.max(1)).collect(),
            kv_dir: settings.kv.dir.clone(),
        };
        Runner::build(
            client,
            settings,
            tools,
            bios,
            vec![host],
            PlacementConfig::default(),
            false,
        )
        .unwrap_or_else(|_| unreachable!("one host with slots 0..n is a valid fleet"))
    }

    /// A runner over several inference hosts (`[[host]]`), placed by `placement` and run by
    /// `settings` (`[runner]`; each host's worker socket is its own). Refused as the config check would
    /// refuse the same list (an empty list, a bad or repeated name, a host without slots or
    /// with a slot twice).
    pub fn with_hosts(
        client: Arc<Client>,
        settings: RunnerConfig,
        tools: ToolRegistry,
        bios: Arc<dyn BiosProvider>,
        hosts: Vec<HostSpec>,
        placement: PlacementConfig,
    ) -> Result<Runner, crate::fleet::FleetError> {
        Runner::build(client, settings, tools, bios, hosts, placement, true)
    }

    fn build(
        client: Arc<Client>,
        settings: RunnerConfig,
        tools: ToolRegistry,
        bios: Arc<dyn BiosProvider>,
        specs: Vec<HostSpec>,
        placement: PlacementConfig,
        named: bool,
    ) -> Result<Runner, crate::fleet::FleetError> {
        let fleet = Fleet::new(
            specs
                .iter()
                .map(|h| HostConfig {
                    name: h.name.clone(),
                    infer_socket: h.infer_socket.clone(),
                    worker_socket: h.worker_socket.clone().unwrap_or_default(),
                    slots: h.slots.clone(),
                    kv_dir: h.kv_dir.clone(),
                })
                .collect(),
            u32::MAX,
        )?;
        let (to_health, inputs) = std::sync::mpsc::channel();
        let timeout = Duration::from_millis(settings.worker_timeout_ms);
        let retry = Duration::from_millis(settings.worker_poll_ms);
        let mut table = Table {
            placement: Placement::new(&fleet, placement),
            records: HashMap::new(),
        };
        let now = client.clock().now();
        let hosts = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let mut host = hosts::Host::new(&client, &settings, spec);
                match &spec.worker_socket {
                    Some(socket) => {
                        let feed = (HostId(i), to_health.clone());
                        host.watch =
                            watch::Watch::start(socket.clone(), timeout, retry, Some(feed));
                    }
                    // No worker to ask: the host is as ready as its server.
                    None => table.placement.handle_host_state(
                        now,
                        HostId(i),
                        HostState::Worker(WorkerState::Ready),
                    ),
                }
                host
            })
            .collect();
        let shared = Arc::new(Shared {
            client: client.clone(),
            tools,
            bios,
            settings,
            hosts,
            named,
            ends: Mutex::new(HashMap::new()),
            health: Mutex::new(Some(to_health)),
            table: Mutex::new(table),
            stored: Condvar::new(),
            next_id: AtomicU64::new(1),
            next_provisional: AtomicU64::new(0),
            completion: OnceLock::new(),
            kv_files: Mutex::new(()),
        });
        if hosts::start_health(
            Arc::downgrade(&shared),
            &fleet,
            client.shared_clock(),
            inputs,
        )
        .is_none()
        {
            *lock(&shared.health) = None;
        }
        Ok(Runner { shared })
    }

    /// Each host's name, state, owned slots and busy slots, in config order.
    pub fn hosts(&self) -> Vec<HostStatus> {
        let t = lock(&self.shared.table);
        self.shared
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let id = HostId(i);
                let slots = t.placement.slots_of(id);
                let free = t.placement.free_slots(id).unwrap_or(0);
                HostStatus {
                    name: h.name.clone(),
                    state: t.placement.host_state(id).unwrap_or(HostState::Unknown),
                    slots,
                    busy: slots - free,
                }
            })
            .collect()
    }

    /// Whether the hosts came from `[[host]]` (and are named in results and events).
    pub fn named_hosts(&self) -> bool {
        self.shared.named
    }

    /// Seats in the table: every host's owned slots.
    pub fn slots(&self) -> usize {
        let t = lock(&self.shared.table);
        (0..self.shared.hosts.len())
            .map(|i| t.placement.slots_of(HostId(i)))
            .sum()
    }

    /// Seats in use now.
    pub fn busy_slots(&self) -> usize {
        lock(&self.shared.table).placement.running().count()
    }

    /// Results stored and not yet fetched, plus requests running.
    pub fn records(&self) -> usize {
        lock(&self.shared.table).records.len()
    }

    /// From now on each request's result goes to `sink` when it ends, and the runner keeps
    /// none itself ([`Runner::get_result`] is then `NOT_FOUND`). Set it before the first
    /// submit; a second call is refused and the first sink stays.
    pub fn complete_into(&self, sink: Completion) -> Result<(), SinkAlreadySet> {
        self.shared.completion.set(sink).map_err(|_| SinkAlreadySet)
    }

    /// Starts `req` on a free slot, or refuses at once.
    pub fn submit(&self, req: Submission) -> Result<RequestId, SubmitError> {
        self.submit_observed(req, None)
    }

    /// [`Runner::submit`] with an observer that sees every [`RequestEvent`] as it happens.
    pub fn submit_observed(
        &self,
        req: Submission,
        observer: Option<Observer>,
    ) -> Result<RequestId, SubmitError> {
        let next = &self.shared.next_id;
        self.submit_named(req, |_| {
            Ok((RequestId(next.fetch_add(1, Ordering::Relaxed)), observer))
        })
    }

    /// Starts `req` on a free slot under the id (and with the observer) that `name` gives,
    /// or refuses at once. `name` is called only once a slot is sure (llama-worker asked, a
    /// slot free), with the runner's table locked and the [`Seat`] it will run on, so the
    /// caller can record the request (write it to its store) before it runs; its error is
    /// returned as it is. A request rehomed later says so in a `Placed` event. After `name`
    /// the only refusal left is [`SubmitError::NoThread`]: the caller then forgets the id.
    /// The caller keeps the ids unique.
    pub fn submit_named<E: From<SubmitError>>(
        &self,
        req: Submission,
        name: impl FnOnce(Seat<'_>) -> Result<(RequestId, Option<Observer>), E>,
    ) -> Result<RequestId, E> {
        let s = &self.shared;
        let clock = s.client.clock();
        // A full table refuses before anyone is asked anything.
        if self.busy_slots() == self.slots() {
            return Err(SubmitError::NoSlotAvailable.into());
        }
        s.learn_hosts(true);
        let key = s.session_key(&req);
        // The seat is held under a provisional id while its host's worker is asked.
        let provisional =
            RequestId(u64::MAX - s.next_provisional.fetch_add(1, Ordering::Relaxed) % (1 << 32));
        let timeout = Duration::from_millis(s.settings.worker_timeout_ms);
        // Hosts whose worker refused or did not answer just now, and the last such answer.
        let mut avoid: Vec<HostId> = Vec::new();
        let mut refused: Option<SubmitError> = None;
        // Each worker is asked again at most this many times: the health thread may apply a
        // watch line older than the worker's answer just after it (a `stopped` it was still
        // behind on when `status` said ready); that line cannot come back a second time.
        let mut relearns = 0;
        let (placed, spawns) = loop {
            let placed =
                lock(&s.table)
                    .placement
                    .place_avoiding(clock.now(), provisional, key, &avoid);
            let placed = match placed {
                Ok(p) => p,
                // A worker state seen on the watch may be older than the worker's own word
                // (a state that changed without a line yet): ask each worker.
                Err(e) if e != SubmitError::NoSlotAvailable && relearns < RELEARNS => {
                    relearns += 1;
                    s.learn_hosts(false);
                    continue;
                }
                // Every host avoided: the last worker's word; else placement's.
                Err(e) if avoid.len() == s.hosts.len() => return Err(refused.unwrap_or(e).into()),
                Err(e) => return Err(e.into()),
            };
            let host = &s.hosts[placed.at.host.0];
            let Some(socket) = &host.settings.worker_socket else {
                break (placed, None);
            };
            // The open watch's last pushed state is the worker's word without a round trip
            // on the request's path, when no line of it waits unread; else, and with none,
            // ask.
            let answer = match host.watch.as_ref().and_then(|w| w.current_state()) {
                Some(pushed) => Ok(pushed),
                None => worker::status(socket, timeout).map(|st| (st.state, st.spawns)),
            };
            let mut t = lock(&s.table);
            match answer {
                Ok((state, spawns)) => match SubmitError::of_worker_state(state) {
                    None => break (placed, Some(spawns)),
                    Some(no) => {
                        t.placement.release(clock.now(), provisional);
                        let at = placed.at.host;
                        if t.placement.host_state(at) != Some(HostState::Lost) {
                            let state = HostState::Worker(state);
                            t.placement.handle_host_state(clock.now(), at, state);
                        }
                        refused = Some(no);
                        avoid.push(at);
                    }
                },
                Err(_) => {
                    t.placement.release(clock.now(), provisional);
                    refused = Some(SubmitError::WorkerNotReady);
                    avoid.push(placed.at.host);
                }
            }
        };
        let mut t = lock(&s.table);
        let seat = Seat {
            host: s.named.then_some(s.hosts[placed.at.host.0].name.as_str()),
            slot: placed.at.slot,
        };
        let (id, observer) = match name(seat) {
            Ok(named) => named,
            Err(e) => {
                t.placement.release(clock.now(), provisional);
                return Err(e);
            }
        };
        t.placement.rename(provisional, id);
        let cancel = Cancel::new();
        let (shared, token) = (s.clone(), cancel.clone());
        let budget = req.budget.unwrap_or(s.settings.budget);
        let (ends_to, ends) = std::sync::mpsc::channel();
        lock(&s.ends).insert(id, ends_to);
        let seat = drive::Place {
            host: placed.at.host.0,
            slot: placed.at.slot,
            by: placed.by,
            resident: t.placement.resident(id),
        };
        let thread = std::thread::Builder::new()
            .name(format!("loopd-{id}"))
            .spawn(move || {
                // A panicking observer or BIOS provider must not keep the slot for ever.
                let run = std::panic::AssertUnwindSafe(|| {
                    drive::drive(&shared, id, seat, req, spawns, &token, ends, observer)
                });
                let (mut result, owed, host) = match std::panic::catch_unwind(run) {
                    Ok(d) => {
                        let owed = d.done();
                        (d.result, owed, &shared.hosts[d.host])
                    }
                    Err(_) => {
                        let reason = FailReason::Panicked;
                        let detail = "the request's observer or BIOS provider panicked".into();
                        (
                            agent::no_output(id, budget, Outcome::Failed { reason, detail }),
                            None,
                            &shared.hosts[seat.host],
                        )
                    }
                };
                if shared.named {
                    result.host = Some(host.name.clone());
                }
                shared.end(result);
                // The worker hears of the last generation's end after the result went on.
                drive::done_after(host, id, owed);
            });
        let thread = match thread {
            Ok(t) => t,
            Err(_) => {
                t.placement.release(clock.now(), id);
                lock(&s.ends).remove(&id);
                return Err(SubmitError::NoThread.into());
            }
        };
        s.tell_health(health_queue::Input::Placed(id, HostId(seat.host)));
        t.records.insert(
            id,
            Record::Running {
                cancel,
                thread: Some(thread),
            },
        );
        Ok(id)
    }

    /// The terminal result of `id`, once: `PENDING` while it runs, `NOT_FOUND` for an unknown
    /// id and for every call after the one that returned it.
    pub fn get_result(&self, id: RequestId) -> Result<RequestResult, ResultError> {
        let mut t = lock(&self.shared.table);
        match t.records.get(&id) {
            None => Err(ResultError::NotFound),
            Some(Record::Running { .. }) => Err(ResultError::Pending),
            Some(Record::Done { .. }) => {
                let Some(Record::Done { result, thread }) = t.records.remove(&id) else {
                    unreachable!("checked above")
                };
                drop(t);
                // The thread's last act was storing this result: the join is immediate.
                if let Some(h) = thread {
                    let _ = h.join();
                }
                Ok(*result)
            }
        }
    }

    /// Waits up to `timeout` of the client's clock for the result of `id`, then as
    /// [`Runner::get_result`].
    pub fn wait_result(
        &self,
        id: RequestId,
        timeout: Duration,
    ) -> Result<RequestResult, ResultError> {
        let clock = self.shared.client.clock();
        let deadline = clock.now().saturating_add(timeout);
        let mut t = lock(&self.shared.table);
        loop {
            match t.records.get(&id) {
                Some(Record::Running { .. }) => {}
                _ => {
                    drop(t);
                    return self.get_result(id);
                }
            }
            let left = deadline.saturating_sub(clock.now());
            if left.is_zero() {
                return Err(ResultError::Pending);
            }
            t = self
                .shared
                .stored
                .wait_timeout(t, clock.wait_slice(left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Deletes session `session`'s KV files on every host with a KV directory (the session
    /// is deleted). A request of it still running saves its file again when it ends.
    pub fn forget_kv(&self, session: &str) {
        let _files = lock(&self.shared.kv_files);
        for kv in self.shared.hosts.iter().filter_map(|h| h.kv.as_ref()) {
            kv.forget(session);
        }
    }

    /// Cancels `id`: it ends within one poll interval as `cancelled`, with its partial output.
    /// A request already ended is left as it is.
    pub fn cancel(&self, id: RequestId) -> Result<(), ResultError> {
        self.cancel_with(id, None)
    }

    /// [`cancel`](Self::cancel) on behalf of someone else than its caller: the result's
    /// detail is `why` ("loopd serve was stopped") instead of the caller's words.
    pub fn cancel_because(&self, id: RequestId, why: &'static str) -> Result<(), ResultError> {
        self.cancel_with(id, Some(why))
    }

    fn cancel_with(&self, id: RequestId, why: Option<&'static str>) -> Result<(), ResultError> {
        let t = lock(&self.shared.table);
        match t.records.get(&id) {
            None => Err(ResultError::NotFound),
            Some(Record::Done { .. }) => Ok(()),
            Some(Record::Running { cancel, .. }) => {
                match why {
                    Some(why) => cancel.cancel_because(why),
                    None => cancel.cancel(),
                }
                Ok(())
            }
        }
    }
}

impl Shared {
    /// Tells the health thread (if it runs).
    fn tell_health(&self, input: health_queue::Input) {
        if let Some(h) = lock(&self.health).as_ref() {
            let _ = h.send(input);
        }
    }

    /// Asks the worker of each host no watch has spoken for yet (`only_unknown`), or of
    /// each host not lost, for its state: a submit right after the start does not wait for
    /// the first watch line, and a state that changed without a line yet is seen. A lost host
    /// is ready again only on its new watch's word.
    fn learn_hosts(&self, only_unknown: bool) {
        let wanted = |st: Option<HostState>| match st {
            Some(HostState::Unknown) => true,
            Some(HostState::Lost) | None => false,
            Some(HostState::Worker(_)) => !only_unknown,
        };
        let unknown: Vec<usize> = {
            let t = lock(&self.table);
            (0..self.hosts.len())
                .filter(|&i| wanted(t.placement.host_state(HostId(i))))
                .collect()
        };
        let timeout = Duration::from_millis(self.settings.worker_timeout_ms);
        for i in unknown {
            let Some(socket) = &self.hosts[i].settings.worker_socket else {
                continue;
            };
            if let Ok(st) = worker::status(socket, timeout) {
                let mut t = lock(&self.table);
                // A host lost meanwhile stays lost.
                if wanted(t.placement.host_state(HostId(i))) {
                    let now = self.client.clock().now();
                    t.placement
                        .handle_host_state(now, HostId(i), HostState::Worker(st.state));
                }
            }
        }
    }

    /// The request's session key: with several hosts it picks the host, and on any host the
    /// slot (the conversation's last slot, where the server's prompt cache holds it, when
    /// it is free; else the least recently used one).
    fn session_key(&self, req: &Submission) -> Option<SessionKey> {
        let first_user = req.messages.iter().find_map(|m| match m {
            ChatMessage::User { content } => Some(content.as_str()),
            _ => None,
        });
        let key = match &req.session {
            Some(session) => SessionKey::explicit(session),
            None => {
                let budget = req.budget.unwrap_or(self.settings.budget);
                let opening = agent::opening(&self.tools, &*self.bios, req, budget);
                SessionKey::derived(&opening.bios_text, req.system.as_deref(), first_user)
            }
        };
        key.ok()
    }

    /// Releases a request's seat and hands its result on: into the table in the same step
    /// (no sink), or to the sink right after (the driver thread, which calls this last,
    /// then ends on its own: nothing joins it).
    fn end(&self, result: RequestResult) {
        let now = self.client.clock().now();
        lock(&self.ends).remove(&result.id);
        self.tell_health(health_queue::Input::Ended(result.id));
        let mut t = lock(&self.table);
        t.placement.release(now, result.id);
        let id = result.id;
        let thread = match t.records.remove(&id) {
            Some(Record::Running { thread, .. }) => thread,
            _ => None,
        };
        match self.completion.get() {
            Some(sink) => {
                drop(t);
                drop(thread);
                sink(result);
            }
            None => {
                t.records.insert(
                    id,
                    Record::Done {
                        result: Box::new(result),
                        thread,
                    },
                );
                drop(t);
                self.stored.notify_all();
            }
        }
    }
}

impl Drop for Runner {
    /// Cancels every running request and waits for their driver threads (not for tool
    /// threads that ignore their cancel token).
    fn drop(&mut self) {
        for h in &self.shared.hosts {
            if let Some(w) = &h.watch {
                w.stop();
            }
        }
        self.shared.tell_health(health_queue::Input::Stop);
        let threads: Vec<JoinHandle<()>> = {
            let mut t = lock(&self.shared.table);
            t.records
                .values_mut()
                .filter_map(|r| match r {
                    Record::Running { cancel, thread } => {
                        cancel.cancel();
                        thread.take()
                    }
                    Record::Done { thread, .. } => thread.take(),
                })
                .collect()
        };
        for h in threads {
            let _ = h.join();
        }
    }
}
