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
//! - With a worker socket each request reads the worker's status every
//!   `runner.worker_poll_ms`: a restart (a new spawn, or a state other than ready) fails it
//!   with `worker_restarted` (`server_died` when the server exited on its own). A generating
//!   request with no stream progress for `runner.stall_ms` reports a stall on the socket; the
//!   worker restarts only if it saw no CPU progress either.
//! - With a worker socket each generation is registered with the worker, and one `watch`
//!   connection per runner (`watch.rs`, its own thread, reopened when lost) delivers the
//!   worker's `failed <id> <reason>` to the request holding that generation: it ends at once
//!   (within 100 ms) with its partial output. The status poll stays as the
//!   fallback for a failure the watch missed.

mod agent;
mod answer;
mod bios;
mod builtin;
mod drive;
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

use crate::llama::{Cancel, ChatMessage, ChatOptions, Client};

pub use crate::config::{LoopThresholds, RunnerConfig};
pub use agent::{Action, AgentRequest, Setup, PROGRESS_EVERY};
pub use bios::{BiosContext, BiosProvider, StandardBios};
pub use builtin::{builtin_tools, Arithmetic, CurrentTime, Finish, ReadFile, READ_FILE_CAP};
pub use result::{
    CallSource, ExitSignal, FailReason, GenerationStats, Outcome, RequestEvent, RequestResult,
    RetryRecord, ToolRecord,
};
pub use tools::{RegistryError, Tool, ToolError, ToolRegistry};
pub use worker::{StallAnswer, WorkerState, WorkerStatus};

/// A request's id, unique within one runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
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
}

/// Why `submit` refused a request; none of them uses a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubmitError {
    /// Every slot is busy.
    NoSlotAvailable,
    /// llama-worker is starting or restarting (or its socket did not answer).
    WorkerNotReady,
    /// llama-worker's crash-loop protection tripped.
    WorkerFailed,
    /// llama-worker is stopped.
    WorkerStopped,
    /// No thread could be started for the request.
    NoThread,
}

impl SubmitError {
    /// The refusal a worker in `state` makes (seed 003): none when it is ready.
    pub fn of_worker_state(state: WorkerState) -> Option<SubmitError> {
        match state {
            WorkerState::Ready => None,
            WorkerState::Failed => Some(SubmitError::WorkerFailed),
            WorkerState::Stopped => Some(SubmitError::WorkerStopped),
            WorkerState::Starting | WorkerState::Restarting => Some(SubmitError::WorkerNotReady),
        }
    }

    /// The code: `NO_SLOT_AVAILABLE`, `WORKER_NOT_READY`, `WORKER_FAILED`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            SubmitError::NoSlotAvailable => "NO_SLOT_AVAILABLE",
            SubmitError::WorkerNotReady => "WORKER_NOT_READY",
            SubmitError::WorkerFailed => "WORKER_FAILED",
            SubmitError::WorkerStopped => "WORKER_STOPPED",
            SubmitError::NoThread => "NO_THREAD",
        }
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for SubmitError {}

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
    slots: Vec<Option<RequestId>>,
    /// Running requests, and (without a completion sink) results not yet fetched.
    records: HashMap<RequestId, Record>,
}

struct Shared {
    client: Arc<Client>,
    tools: ToolRegistry,
    bios: Arc<dyn BiosProvider>,
    settings: RunnerConfig,
    /// The watch channel's routes, with a worker socket.
    watch: Option<Arc<watch::Watch>>,
    table: Mutex<Table>,
    stored: Condvar,
    /// The ids [`Runner::submit`] gives.
    next_id: AtomicU64,
    /// Where results go; unset: into `table.records`.
    completion: OnceLock<Completion>,
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
    /// A runner of `slots` slots (at least 1) over `client`, with `tools` and `bios`; the
    /// rest of its settings come from the client's config (`[runner]`).
    pub fn new(
        client: Arc<Client>,
        tools: ToolRegistry,
        bios: Arc<dyn BiosProvider>,
        slots: u32,
    ) -> Runner {
        let settings = client.config().runner.clone();
        let watch = settings.worker_socket.clone().and_then(|socket| {
            let timeout = Duration::from_millis(settings.worker_timeout_ms);
            let retry = Duration::from_millis(settings.worker_poll_ms);
            watch::Watch::start(socket, timeout, retry)
        });
        let shared = Arc::new(Shared {
            client,
            tools,
            bios,
            settings,
            watch,
            table: Mutex::new(Table {
                slots: vec![None; slots.max(1) as usize],
                records: HashMap::new(),
            }),
            stored: Condvar::new(),
            next_id: AtomicU64::new(1),
            completion: OnceLock::new(),
        });
        Runner { shared }
    }

    /// Slots in the table.
    pub fn slots(&self) -> usize {
        lock(&self.shared.table).slots.len()
    }

    /// Slots in use now.
    pub fn busy_slots(&self) -> usize {
        lock(&self.shared.table)
            .slots
            .iter()
            .filter(|s| s.is_some())
            .count()
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
        self.submit_named(req, || {
            Ok((RequestId(next.fetch_add(1, Ordering::Relaxed)), observer))
        })
    }

    /// Starts `req` on a free slot under the id (and with the observer) that `name` gives,
    /// or refuses at once. `name` is called only once a slot is sure (llama-worker asked, a
    /// slot free), with the runner's table locked, so the caller can record the request
    /// (write it to its store) before it runs; its error is returned as it is. After `name`
    /// the only refusal left is [`SubmitError::NoThread`]: the caller then forgets the id.
    /// The caller keeps the ids unique.
    pub fn submit_named<E: From<SubmitError>>(
        &self,
        req: Submission,
        name: impl FnOnce() -> Result<(RequestId, Option<Observer>), E>,
    ) -> Result<RequestId, E> {
        let s = &self.shared;
        // A full table refuses before anyone is asked anything.
        if lock(&s.table).slots.iter().all(|x| x.is_some()) {
            return Err(SubmitError::NoSlotAvailable.into());
        }
        let spawns = match &s.settings.worker_socket {
            None => None,
            Some(socket) => {
                let timeout = Duration::from_millis(s.settings.worker_timeout_ms);
                match worker::status(socket, timeout) {
                    Ok(st) => match SubmitError::of_worker_state(st.state) {
                        None => Some(st.spawns),
                        Some(refused) => return Err(refused.into()),
                    },
                    Err(_) => return Err(SubmitError::WorkerNotReady.into()),
                }
            }
        };
        let mut t = lock(&s.table);
        let Some(slot) = t.slots.iter().position(|x| x.is_none()) else {
            return Err(SubmitError::NoSlotAvailable.into());
        };
        let (id, observer) = name()?;
        let cancel = Cancel::new();
        let (shared, token) = (s.clone(), cancel.clone());
        let budget = req.budget.unwrap_or(s.settings.budget);
        let thread = std::thread::Builder::new()
            .name(format!("loopd-{id}"))
            .spawn(move || {
                // A panicking observer or BIOS provider must not keep the slot for ever.
                let run = std::panic::AssertUnwindSafe(|| {
                    drive::drive(&shared, id, slot as u32, req, spawns, &token, observer)
                });
                let (result, owed) = match std::panic::catch_unwind(run) {
                    Ok(d) => {
                        let owed = d.done();
                        (d.result, owed)
                    }
                    Err(_) => {
                        let reason = FailReason::Panicked;
                        let detail = "the request's observer or BIOS provider panicked".into();
                        (
                            agent::no_output(id, budget, Outcome::Failed { reason, detail }),
                            None,
                        )
                    }
                };
                shared.end(slot, result);
                // The worker hears of the last generation's end after the result went on.
                drive::done_after(&shared, id, owed);
            })
            .map_err(|_| SubmitError::NoThread)?;
        t.slots[slot] = Some(id);
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

    /// Cancels `id`: it ends within one poll interval as `cancelled`, with its partial output.
    /// A request already ended is left as it is.
    pub fn cancel(&self, id: RequestId) -> Result<(), ResultError> {
        let t = lock(&self.shared.table);
        match t.records.get(&id) {
            None => Err(ResultError::NotFound),
            Some(Record::Done { .. }) => Ok(()),
            Some(Record::Running { cancel, .. }) => {
                cancel.cancel();
                Ok(())
            }
        }
    }
}

impl Shared {
    /// Releases a request's slot and hands its result on: into the table in the same step
    /// (no sink), or to the sink right after (the driver thread, which calls this last,
    /// then ends on its own: nothing joins it).
    fn end(&self, slot: usize, result: RequestResult) {
        let mut t = lock(&self.table);
        if t.slots.get(slot).copied().flatten() == Some(result.id) {
            t.slots[slot] = None;
        }
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
        if let Some(w) = &self.shared.watch {
            w.stop();
        }
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
