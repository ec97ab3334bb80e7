//! The restart policy as a sans-IO state machine: lifecycle states, restart triggers,
//! crash-loop protection, backoff, readiness threshold and stall verdicts.
//!
//! Crash-loop protection counts restarts in a row: the count goes back to zero only when the
//! server has stayed `ready`, answering readiness, for a whole `restart_window` (or on `start`;
//! a streak of failed probes ends the good time where it began), and one restart more
//! than `max_restarts_per_window` makes the state `failed`. Every loop ends there, whatever its
//! kind (exit, startup timeout, unready, stall) and however long one turn of it takes: a server
//! that never gets ready never resets the count, one that dies or stalls before it was ready for
//! the window does not either. A rolling window alone would not do: with the defaults one turn
//! of a never-ready server takes `startup_deadline + restart_backoff` (122 s), so six restarts
//! never fit in 600 s and the loop would run for ever. Whenever the rolling-window rule (more
//! than the maximum inside any window) trips, this one has tripped too: between two restarts
//! less than a window apart the server cannot have been ready for a whole window.
//!
//! With RPC endpoints (`await_endpoints`, the `[rpc]` config section) a spawn has two steps:
//! [`Action::StartRpc`] (the shell starts the local `ggml-rpc-server`s), then a wait until the
//! shell's connect probes say every endpoint accepts ([`Policy::handle_rpc_endpoints`]), then
//! [`Action::Spawn`] of the server. Local RPC servers not accepting by `startup_deadline`, or one
//! exiting, restart the whole unit like a server exit. A remote endpoint that is down is
//! waited for without a deadline and without counting a restart: it is another host's outage,
//! not a loop of ours; the state stays starting/restarting (not ready) meanwhile.
//!
//! Registered generations (appendix J, per request): each generation a client
//! registers has a phase and a last progress. In prefill its progress is the later of its
//! registration and the group's last CPU-time rise; after its first byte, its own stream
//! progress counts (CPU time rising mid-stream is not progress: a GPU host's threads spin while
//! a kernel hangs), and, while another registered generation is in its prefill, the CPU-time
//! rises since that one was registered (llama-server batches every slot's next token
//! with the other slots' prompt chunks, so a long prompt on one slot silences the other
//! slot's stream until the chunk is done; the prompt's progress is the stream's). When that
//! prefill ends (its first byte, or it is unregistered), the streams it held up keep the
//! progress it gave them. While ready, a generation without progress for `stall_timeout`
//! restarts the server (cause `stall`), and every restart or stop fails every registered
//! generation ([`Policy::take_failed_generations`]). Unregistered work gets no per-request
//! verdict.
//!
//! All time is input (`now`, a [`Duration`] since any fixed origin); nothing here reads a
//! clock, touches a process or opens a socket. The shell ([`crate::worker`]) feeds it events
//! (`handle_*`), drains what it must do with [`Policy::poll_action`], and calls
//! [`Policy::handle_timeout`] no later than [`Policy::poll_timeout`]. Tests drive it on a fake
//! clock and check every transition exactly.

use core::fmt;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

// The state and the restart cause are on the status socket's wire: their names live with
// the protocol, which loopd reads too.
pub use worker_proto::{RestartCause, State};

// Why registered work was failed, and a generation's phase and progress: on the wire too.
pub use worker_proto::{FailReason, GenerationPhase, ProgressKind};

/// Why new work is refused. Answered at once, never by waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Starting or restarting (`WORKER_NOT_READY`).
    NotReady,
    /// Crash-loop protection tripped (`WORKER_FAILED`).
    Failed,
    /// The worker is stopped (`WORKER_STOPPED`).
    Stopped,
    /// Another client's registration holds the slot (`SLOT_TAKEN`): see
    /// [`Policy::register_owned`].
    SlotTaken,
}

impl Refusal {
    /// The error code (`WORKER_NOT_READY`, `WORKER_FAILED`, `WORKER_STOPPED`).
    pub fn code(self) -> &'static str {
        match self {
            Self::NotReady => "WORKER_NOT_READY",
            Self::Failed => "WORKER_FAILED",
            Self::Stopped => "WORKER_STOPPED",
            Self::SlotTaken => "SLOT_TAKEN",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl core::error::Error for Refusal {}

/// Something the shell must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Fail every registered in-flight request with this reason.
    NotifyInflight(FailReason),
    /// SIGTERM the child's process group, wait up to the grace period, SIGKILL it, reap.
    /// Then report [`Policy::handle_killed`].
    KillGroup,
    /// Spawn the server; then report [`Policy::handle_spawned`] or [`Policy::handle_spawn_failed`].
    Spawn,
    /// Start the unit's local RPC servers (before the server, with `await_endpoints`); then
    /// report [`Policy::handle_rpc_started`] or [`Policy::handle_spawn_failed`], and probe
    /// every endpoint each startup probe interval ([`Policy::handle_rpc_endpoints`]) while
    /// [`Policy::awaiting_endpoints`].
    StartRpc,
}

/// What the shell's connect probes of the RPC endpoints found, the worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoints {
    /// A local RPC server (ours) does not accept connections.
    LocalDown,
    /// Every local one accepts; a remote one does not.
    RemoteDown,
    /// Every endpoint accepts connections.
    Up,
}

/// One readiness probe's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Every readiness path answered 200 within the probe timeout.
    Ok,
    /// It did not (refused, too slow, not 200); the detail stays with the shell.
    Failed,
}

/// Answer to [`Policy::report_stall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallVerdict {
    /// No progress within `stall_timeout`: a restart has begun.
    Restarting,
    /// There was progress this long ago (less than `stall_timeout`): no restart.
    NotStalled {
        /// Time since the last progress (CPU-time increase, stream byte or readiness).
        since_progress: Duration,
    },
    /// The server is not in the ready state; nothing to do.
    NotReady,
}

/// The numbers the policy runs on (the time-related part of [`crate::Config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// From spawn to the first good readiness probe, at most.
    pub startup_deadline: Duration,
    /// While ready: failed readiness for this long, with no CPU-time increase, restarts.
    pub unready_restart_after: Duration,
    /// A reported stall restarts only when there was no progress for this long.
    pub stall_timeout: Duration,
    /// How long the server must stay ready for the restart count to go back to zero.
    pub restart_window: Duration,
    /// More restarts in a row than this (without a whole `restart_window` ready in between)
    /// makes the state failed.
    pub max_restarts_per_window: u32,
    /// Wait between killing the old server and spawning the new one.
    pub restart_backoff: Duration,
    /// The unit has RPC endpoints: start the local ones and wait until every endpoint accepts
    /// connections before each spawn of the server.
    pub await_endpoints: bool,
}

/// A registered generation as the status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationView {
    /// Its id (from 1).
    pub id: u64,
    /// The server slot the client sent it on.
    pub slot: u32,
    /// Prefill or streaming.
    pub phase: GenerationPhase,
    /// Its last progress by appendix J (see the module docs).
    pub last_progress_at: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Generation {
    slot: u32,
    phase: GenerationPhase,
    /// Registration, then each stream progress report (streaming: also the progress another
    /// generation's prefill gave it, kept when that prefill ended, and each rise of its
    /// slot's decoded-token count).
    reported_at: Duration,
    /// Its slot's decoded-token count at the last `/slots` answer while it streamed
    /// ([`Policy::handle_slots_decoded`]); `None` until the first.
    decoded: Option<u64>,
    /// The `watch` connection that registered it (`None`: a client that named none).
    owner: Option<u64>,
}

/// Where inside starting/restarting the worker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing scheduled (stopped, failed, or waiting for the shell to report a spawn).
    Idle,
    /// Waiting before the next spawn.
    Backoff { until: Duration },
    /// Local RPC servers started; waiting until every endpoint accepts connections. `last` is
    /// the latest probe report; a remote one down at `deadline` is waited for without one.
    AwaitEndpoints {
        deadline: Duration,
        last: Option<Endpoints>,
    },
    /// Spawned; waiting for the first good readiness probe.
    AwaitReady { deadline: Duration },
    /// Ready and being watched.
    Running,
}

/// The policy state machine. See the module docs for how it is driven.
#[derive(Debug)]
pub struct Policy {
    cfg: PolicyConfig,
    state: State,
    phase: Phase,
    child_alive: bool,
    /// Restarts since the server last stayed ready for a whole window (or since `start`).
    consecutive_restarts: u32,
    /// When the state last became ready (`None` while not ready).
    ready_since: Option<Duration>,
    actions: VecDeque<Action>,
    failing_since: Option<Duration>,
    last_cpu_ticks: Option<u64>,
    last_cpu_increase_at: Option<Duration>,
    last_stream_byte_at: Option<Duration>,
    spawned_at: Option<Duration>,
    last_cause: Option<RestartCause>,
    total_restarts: u64,
    generations: BTreeMap<u64, Generation>,
    next_generation: u64,
    /// Generations failed by restarts and stops, with why, until the shell takes them.
    failed_generations: Vec<(u64, FailReason)>,
}

impl Policy {
    /// A stopped policy.
    pub fn new(cfg: PolicyConfig) -> Self {
        Self {
            cfg,
            state: State::Stopped,
            phase: Phase::Idle,
            child_alive: false,
            consecutive_restarts: 0,
            ready_since: None,
            actions: VecDeque::new(),
            failing_since: None,
            last_cpu_ticks: None,
            last_cpu_increase_at: None,
            last_stream_byte_at: None,
            spawned_at: None,
            last_cause: None,
            total_restarts: 0,
            generations: BTreeMap::new(),
            next_generation: 1,
            failed_generations: Vec::new(),
        }
    }

    /// Registers a generation sent on `slot`: its id while ready, otherwise the refusal.
    pub fn register(&mut self, now: Duration, slot: u32) -> Result<u64, Refusal> {
        self.register_owned(now, slot, None)
    }

    /// Registers a generation sent on `slot` for the `watch` connection `owner` (`None`: a
    /// client that names none). While a generation of another owner is registered on the same
    /// slot the answer is [`Refusal::SlotTaken`]: two clients (two daemons sharing one server)
    /// never generate on one slot at once. The same owner may hold the slot twice (a new
    /// generation registered a moment before the last one's `done`).
    pub fn register_owned(
        &mut self,
        now: Duration,
        slot: u32,
        owner: Option<u64>,
    ) -> Result<u64, Refusal> {
        self.admit()?;
        if self
            .generations
            .values()
            .any(|g| g.slot == slot && g.owner != owner)
        {
            return Err(Refusal::SlotTaken);
        }
        let id = self.next_generation;
        self.next_generation += 1;
        self.generations.insert(
            id,
            Generation {
                slot,
                phase: GenerationPhase::Prefill,
                reported_at: now,
                decoded: None,
                owner,
            },
        );
        Ok(id)
    }

    /// Stream progress of generation `id`; `false` when it is not registered. Any stream byte
    /// ends its prefill.
    pub fn handle_progress(&mut self, now: Duration, id: u64, _kind: ProgressKind) -> bool {
        self.end_prefill(id);
        let Some(g) = self.generations.get_mut(&id) else {
            return false;
        };
        g.phase = GenerationPhase::Streaming;
        g.reported_at = now;
        self.last_stream_byte_at = Some(now);
        true
    }

    /// Forgets generation `id` (it ended); `false` when it was not registered.
    pub fn unregister(&mut self, id: u64) -> bool {
        self.end_prefill(id);
        self.generations.remove(&id).is_some()
    }

    /// Generation `id` leaves its prefill (if it is in one): the streams its prompt held up
    /// keep the progress it gave them (a stream's next byte may come a moment after the
    /// prompt's last chunk, and the verdict must not fall back to the byte before it).
    fn end_prefill(&mut self, id: u64) {
        let Some(g) = self.generations.get(&id) else {
            return;
        };
        let Some(busy) = self.prefill_busy_at(g) else {
            return;
        };
        for (_, other) in self.generations.iter_mut().filter(|(&o, _)| o != id) {
            if other.phase == GenerationPhase::Streaming {
                other.reported_at = other.reported_at.max(busy);
            }
        }
    }

    /// While `g` is in its prefill, the group's last CPU-time rise since it was registered:
    /// the server working on its prompt.
    fn prefill_busy_at(&self, g: &Generation) -> Option<Duration> {
        let cpu = self.last_cpu_increase_at?;
        (g.phase == GenerationPhase::Prefill && cpu >= g.reported_at).then_some(cpu)
    }

    /// Forgets every registered generation without failing it (its clients are gone).
    pub fn forget_generations(&mut self) {
        self.generations.clear();
    }

    /// Forgets the generations `watch` connection `owner` registered, without failing them
    /// (that client is gone; the others' stay).
    pub fn forget_generations_of(&mut self, owner: u64) {
        self.generations.retain(|_, g| g.owner != Some(owner));
    }

    /// The registered generations, by id.
    pub fn generations(&self) -> Vec<GenerationView> {
        self.generations
            .iter()
            .map(|(&id, g)| GenerationView {
                id,
                slot: g.slot,
                phase: g.phase,
                last_progress_at: self.progress_of(id, g),
            })
            .collect()
    }

    /// The generations failed since the last call, with why (after [`Action::NotifyInflight`]).
    pub fn take_failed_generations(&mut self) -> Vec<(u64, FailReason)> {
        core::mem::take(&mut self.failed_generations)
    }

    /// Appendix J for generation `id`: in prefill the later of its registration and the
    /// group's last CPU-time rise; streaming, its last stream progress, or, while another
    /// generation is in its prefill, the CPU-time rises since that one was registered (its
    /// prompt batch holds this stream up).
    fn progress_of(&self, id: u64, g: &Generation) -> Duration {
        match g.phase {
            GenerationPhase::Prefill => g
                .reported_at
                .max(self.last_cpu_increase_at.unwrap_or_default()),
            GenerationPhase::Streaming => self
                .generations
                .iter()
                .filter(|(&o, _)| o != id)
                .filter_map(|(_, other)| self.prefill_busy_at(other))
                .fold(g.reported_at, Duration::max),
        }
    }

    /// When the shell should next read each slot's decoded-token count (`GET /slots`, then
    /// [`Policy::handle_slots_decoded`]): while ready, the first instant a streaming
    /// generation's progress is half `stall_timeout` old. The shell asks at most once per CPU
    /// probe interval, so a slot that decodes keeps its generation alive, and one that does not
    /// still runs out at its progress plus `stall_timeout`.
    pub fn slots_probe_at(&self) -> Option<Duration> {
        if self.state != State::Ready {
            return None;
        }
        self.generations
            .iter()
            .filter(|(_, g)| g.phase == GenerationPhase::Streaming)
            .map(|(&id, g)| self.progress_of(id, g) + self.cfg.stall_timeout / 2)
            .min()
    }

    /// `GET /slots`'s decoded-token counts, `(slot, n_decoded)`: a count above the one the
    /// last answer gave is progress of the streaming generation on that slot (the server
    /// generates for it, streamed or not: see [`crate::slots`]). The first count a generation
    /// gets is only its baseline; a count that falls is a new baseline. A generation in its
    /// prefill is judged by CPU time, as before.
    pub fn handle_slots_decoded(&mut self, now: Duration, slots: &[(u32, u64)]) {
        for g in self.generations.values_mut() {
            if g.phase != GenerationPhase::Streaming {
                continue;
            }
            let Some(&(_, n)) = slots.iter().find(|(slot, _)| *slot == g.slot) else {
                continue;
            };
            if g.decoded.is_some_and(|before| n > before) {
                g.reported_at = g.reported_at.max(now);
            }
            g.decoded = Some(n);
        }
    }

    /// When the first registered generation runs out of progress (while ready).
    fn generation_deadline(&self) -> Option<Duration> {
        if self.state != State::Ready {
            return None;
        }
        self.generations
            .iter()
            .map(|(&id, g)| self.progress_of(id, g) + self.cfg.stall_timeout)
            .min()
    }

    /// Fails every registered generation with `reason`.
    fn fail_generations(&mut self, reason: FailReason) {
        let ids = core::mem::take(&mut self.generations).into_keys();
        self.failed_generations.extend(ids.map(|id| (id, reason)));
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Admission: `Ok` only while ready; otherwise the refusal to answer at once.
    pub fn admit(&self) -> Result<(), Refusal> {
        match self.state {
            State::Ready => Ok(()),
            State::Starting | State::Restarting => Err(Refusal::NotReady),
            State::Failed => Err(Refusal::Failed),
            State::Stopped => Err(Refusal::Stopped),
        }
    }

    /// Restarts in a row as of `now`: since `start`, or since the server last stayed ready
    /// for a whole `restart_window` (a server ready that long now counts 0).
    pub fn consecutive_restarts(&self, now: Duration) -> u32 {
        if self.stable_at(now) {
            0
        } else {
            self.consecutive_restarts
        }
    }

    /// Whether the server has been ready, answering readiness, for a whole window at `now`
    /// (a streak of failed probes ends the good time where it began).
    fn stable_at(&self, now: Duration) -> bool {
        let good_until = self.failing_since.unwrap_or(now).min(now);
        self.state == State::Ready
            && self
                .ready_since
                .is_some_and(|t| good_until.saturating_sub(t) >= self.cfg.restart_window)
    }

    /// Restarts since the policy was created (never reset).
    pub fn total_restarts(&self) -> u64 {
        self.total_restarts
    }

    /// What triggered the latest restart (or failure), if any.
    pub fn last_cause(&self) -> Option<RestartCause> {
        self.last_cause
    }

    /// When the group's CPU time last rose.
    pub fn last_cpu_increase_at(&self) -> Option<Duration> {
        self.last_cpu_increase_at
    }

    /// The latest CPU-time sample (ticks summed over the process group).
    pub fn last_cpu_ticks(&self) -> Option<u64> {
        self.last_cpu_ticks
    }

    /// `max(last CPU-time increase, last stream byte, spawn)`: the last evidence of progress.
    pub fn last_progress_at(&self) -> Option<Duration> {
        [
            self.last_cpu_increase_at,
            self.last_stream_byte_at,
            self.spawned_at,
        ]
        .into_iter()
        .flatten()
        .max()
    }

    /// Whether the policy believes a child process is running.
    pub fn child_alive(&self) -> bool {
        self.child_alive
    }

    /// The next action for the shell, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next instant at which [`Policy::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let phase = match self.phase {
            Phase::Backoff { until } => Some(until),
            Phase::AwaitReady { deadline } => Some(deadline),
            Phase::AwaitEndpoints { deadline, last } => {
                (last != Some(Endpoints::RemoteDown)).then_some(deadline)
            }
            Phase::Idle | Phase::Running => None,
        };
        [phase, self.generation_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Start from stopped or failed (the restart count goes back to zero). Ignored in other
    /// states.
    pub fn start(&mut self, _now: Duration) {
        if !matches!(self.state, State::Stopped | State::Failed) {
            return;
        }
        self.consecutive_restarts = 0;
        self.state = State::Starting;
        if self.child_alive {
            self.actions.push_back(Action::KillGroup);
        }
        self.phase = Phase::Idle;
        self.push_spawn();
    }

    /// The first step of a spawn: the RPC servers, or the server itself.
    fn push_spawn(&mut self) {
        self.actions.push_back(if self.cfg.await_endpoints {
            Action::StartRpc
        } else {
            Action::Spawn
        });
    }

    /// Whether the shell should probe the RPC endpoints (local servers started, server not yet
    /// spawned).
    pub fn awaiting_endpoints(&self) -> bool {
        matches!(self.phase, Phase::AwaitEndpoints { .. })
    }

    /// The shell started the unit's local RPC servers (or there are none, only remote ones).
    pub fn handle_rpc_started(&mut self, now: Duration) {
        self.child_alive = true;
        if matches!(self.state, State::Starting | State::Restarting) {
            self.phase = Phase::AwaitEndpoints {
                deadline: now + self.cfg.startup_deadline,
                last: None,
            };
        } else {
            self.actions.push_back(Action::KillGroup);
        }
    }

    /// The connect probes of every endpoint, while [`Policy::awaiting_endpoints`]: all up
    /// spawns the server; a local one down past the startup deadline restarts the unit; a
    /// remote one down is waited for (no restart, not counted).
    pub fn handle_rpc_endpoints(&mut self, now: Duration, found: Endpoints) {
        let Phase::AwaitEndpoints { deadline, .. } = self.phase else {
            return;
        };
        match found {
            Endpoints::Up => {
                self.phase = Phase::Idle;
                self.actions.push_back(Action::Spawn);
            }
            Endpoints::LocalDown if now >= deadline => {
                self.restart(now, RestartCause::RpcStartupTimeout);
            }
            Endpoints::LocalDown | Endpoints::RemoteDown => {
                self.phase = Phase::AwaitEndpoints {
                    deadline,
                    last: Some(found),
                };
            }
        }
    }

    /// A local RPC server of the unit exited (seen by the shell's reaper): the unit is
    /// restarted like after a server exit, in-flight work is told `server_died`.
    pub fn handle_rpc_exit(&mut self, now: Duration) {
        if self.child_alive
            && matches!(
                self.state,
                State::Starting | State::Ready | State::Restarting
            )
        {
            self.restart(now, RestartCause::RpcExited);
        }
    }

    /// Stop: fail in-flight work, kill the group, no further spawns. Never waits on backoff.
    pub fn stop(&mut self, _now: Duration) {
        if self.state != State::Stopped {
            self.actions.clear();
            self.actions
                .push_back(Action::NotifyInflight(FailReason::WorkerStopped));
            self.fail_generations(FailReason::WorkerStopped);
        }
        if self.child_alive {
            self.actions.push_back(Action::KillGroup);
        }
        self.state = State::Stopped;
        self.phase = Phase::Idle;
        self.ready_since = None;
    }

    /// The shell spawned the server.
    pub fn handle_spawned(&mut self, now: Duration) {
        self.child_alive = true;
        self.spawned_at = Some(now);
        self.last_cpu_ticks = None;
        self.last_cpu_increase_at = None;
        self.last_stream_byte_at = None;
        self.failing_since = None;
        if matches!(self.state, State::Starting | State::Restarting) {
            self.phase = Phase::AwaitReady {
                deadline: now + self.cfg.startup_deadline,
            };
        } else {
            // Stopped (or failed) while the shell was spawning: the new child must not live.
            self.actions.push_back(Action::KillGroup);
        }
    }

    /// The shell could not spawn the server (or an RPC server; it cleaned up what it had
    /// started of that step): counts as a restart trigger. RPC servers started in an earlier
    /// step are still alive and get killed.
    pub fn handle_spawn_failed(&mut self, now: Duration) {
        if matches!(self.state, State::Starting | State::Restarting) {
            self.restart(now, RestartCause::Exited);
        }
    }

    /// The shell killed and reaped the group after a [`Action::KillGroup`].
    pub fn handle_killed(&mut self, _now: Duration) {
        self.child_alive = false;
    }

    /// The child exited on its own (seen by the shell's reaper).
    pub fn handle_exit(&mut self, now: Duration) {
        let was_alive = core::mem::replace(&mut self.child_alive, false);
        if was_alive
            && matches!(
                self.state,
                State::Starting | State::Ready | State::Restarting
            )
        {
            self.restart(now, RestartCause::Exited);
        }
    }

    /// A model instance behind the router exited: it failed to load, or died under load (the
    /// router said so in its per-model status). Counted like the server's own exit: in-flight
    /// work is told `server_died`, the whole unit is restarted, and a model that dies on every
    /// load ends in `failed` after `max_restarts_per_window` restarts in a row.
    pub fn handle_model_exit(&mut self, now: Duration) {
        if self.child_alive
            && matches!(
                self.state,
                State::Starting | State::Ready | State::Restarting
            )
            && matches!(self.phase, Phase::AwaitReady { .. } | Phase::Running)
        {
            self.restart(now, RestartCause::ModelExited);
        }
    }

    /// One readiness probe's answer.
    pub fn handle_readiness(&mut self, now: Duration, answer: Readiness) {
        match (self.phase, answer) {
            (Phase::AwaitReady { .. }, Readiness::Ok) => {
                self.state = State::Ready;
                self.phase = Phase::Running;
                self.failing_since = None;
                self.ready_since = Some(now);
            }
            (Phase::Running, Readiness::Ok) => self.failing_since = None,
            (Phase::Running, Readiness::Failed) => {
                let since = *self.failing_since.get_or_insert(now);
                // Failures while the CPU time rises do not count: the server is busy.
                let unhealthy_since = since.max(self.last_cpu_increase_at.unwrap_or(since));
                if now.saturating_sub(unhealthy_since) >= self.cfg.unready_restart_after {
                    self.restart(now, RestartCause::Unready);
                }
            }
            _ => {}
        }
    }

    /// One CPU-time sample summed over the group; `None` is a failed read (no update).
    pub fn handle_cpu_sample(&mut self, now: Duration, ticks: Option<u64>) {
        let Some(ticks) = ticks else { return };
        match self.last_cpu_ticks {
            Some(last) if ticks > last => self.last_cpu_increase_at = Some(now),
            // First sample is a baseline; a fall (a process left the group) is a new baseline.
            _ => {}
        }
        self.last_cpu_ticks = Some(ticks);
    }

    /// Bytes of a streamed response arrived.
    pub fn handle_stream_bytes(&mut self, now: Duration) {
        self.last_stream_byte_at = Some(now);
    }

    /// A request runner saw no stream bytes for its stall timeout. Restart only if the worker
    /// also saw no progress (CPU time, stream bytes) for `stall_timeout`.
    pub fn report_stall(&mut self, now: Duration) -> StallVerdict {
        if self.state != State::Ready {
            return StallVerdict::NotReady;
        }
        let since_progress = now.saturating_sub(self.last_progress_at().unwrap_or(now));
        if since_progress >= self.cfg.stall_timeout {
            self.restart(now, RestartCause::Stall);
            StallVerdict::Restarting
        } else {
            StallVerdict::NotStalled { since_progress }
        }
    }

    /// A client reports that registered generation `id` saw no progress: judged by that
    /// generation's own progress (appendix J), with the same `stall_timeout`. An id that is not
    /// registered is judged as [`Policy::report_stall`].
    pub fn report_stall_of(&mut self, now: Duration, id: u64) -> StallVerdict {
        let Some(g) = self.generations.get(&id) else {
            return self.report_stall(now);
        };
        if self.state != State::Ready {
            return StallVerdict::NotReady;
        }
        let since_progress = now.saturating_sub(self.progress_of(id, g));
        if since_progress >= self.cfg.stall_timeout {
            self.restart(now, RestartCause::Stall);
            StallVerdict::Restarting
        } else {
            StallVerdict::NotStalled { since_progress }
        }
    }

    /// Deadlines: the end of a backoff (spawn) or of the startup deadline (restart), and a
    /// registered generation without progress for `stall_timeout` (restart, cause `stall`).
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.generation_deadline().is_some_and(|t| now >= t) {
            self.restart(now, RestartCause::Stall);
            return;
        }
        match self.phase {
            Phase::Backoff { until } if now >= until => {
                self.phase = Phase::Idle;
                self.push_spawn();
            }
            Phase::AwaitEndpoints { deadline, last }
                if now >= deadline && last != Some(Endpoints::RemoteDown) =>
            {
                self.restart(now, RestartCause::RpcStartupTimeout);
            }
            Phase::AwaitReady { deadline } if now >= deadline => {
                self.restart(now, RestartCause::StartupTimeout);
            }
            _ => {}
        }
    }

    /// Nuke and repave, or fail when there were too many restarts in a row.
    fn restart(&mut self, now: Duration, cause: RestartCause) {
        if self.stable_at(now) {
            self.consecutive_restarts = 0;
        }
        self.ready_since = None;
        self.last_cause = Some(cause);
        let reason = if matches!(
            cause,
            RestartCause::Exited | RestartCause::ModelExited | RestartCause::RpcExited
        ) {
            FailReason::ServerDied
        } else {
            FailReason::WorkerRestarted
        };
        self.actions.push_back(Action::NotifyInflight(reason));
        self.fail_generations(reason);
        if self.child_alive {
            self.actions.push_back(Action::KillGroup);
        }
        if self.consecutive_restarts >= self.cfg.max_restarts_per_window {
            self.state = State::Failed;
            self.phase = Phase::Idle;
            return;
        }
        self.consecutive_restarts += 1;
        self.total_restarts += 1;
        self.state = State::Restarting;
        self.phase = Phase::Backoff {
            until: now + self.cfg.restart_backoff,
        };
        if self.cfg.restart_backoff.is_zero() {
            self.handle_timeout(now);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// The numbers the policy tests run on (the RPC tests too, with `await_endpoints`).
    pub(crate) const CFG: PolicyConfig = PolicyConfig {
        startup_deadline: s(60),
        unready_restart_after: s(30),
        stall_timeout: s(120),
        restart_window: s(600),
        max_restarts_per_window: 3,
        restart_backoff: s(2),
        await_endpoints: false,
    };

    pub(crate) fn drain(p: &mut Policy) -> Vec<Action> {
        core::iter::from_fn(|| p.poll_action()).collect()
    }

    /// Starts and gets to ready at `t`, acting as the shell would.
    fn ready_at(t: Duration) -> Policy {
        let mut p = Policy::new(CFG);
        p.start(t);
        assert_eq!(drain(&mut p), [Action::Spawn]);
        p.handle_spawned(t);
        assert_eq!(p.state(), State::Starting);
        assert_eq!(p.admit(), Err(Refusal::NotReady));
        p.handle_readiness(t, Readiness::Ok);
        assert_eq!(p.state(), State::Ready);
        assert_eq!(p.admit(), Ok(()));
        p
    }

    #[test]
    fn crash_loop_fails_after_max_restarts_with_backoff_between() {
        let mut p = Policy::new(CFG);
        assert_eq!(p.admit(), Err(Refusal::Stopped));
        p.start(s(0));
        let mut now = s(0);
        let mut spawns = Vec::new();
        loop {
            match p.poll_action() {
                Some(Action::Spawn) => {
                    spawns.push(now);
                    p.handle_spawned(now);
                    // The command exits at once.
                    p.handle_exit(now);
                }
                Some(Action::NotifyInflight(r)) => assert_eq!(r, FailReason::ServerDied),
                Some(Action::KillGroup) => panic!("a dead child is not killed"),
                None => match p.poll_timeout() {
                    Some(t) => {
                        // One tick before the backoff ends: nothing happens.
                        p.handle_timeout(t - Duration::from_millis(1));
                        assert_eq!(p.poll_action(), None);
                        assert_eq!(p.admit(), Err(Refusal::NotReady));
                        now = t;
                        p.handle_timeout(now);
                    }
                    None => break,
                },
                Some(Action::StartRpc) => panic!("no RPC endpoints"),
            }
        }
        // 1 start + 3 restarts; the 4th exit inside the window fails.
        assert_eq!(spawns, [s(0), s(2), s(4), s(6)]);
        assert_eq!(p.state(), State::Failed);
        assert_eq!(p.admit(), Err(Refusal::Failed));
        assert_eq!(p.consecutive_restarts(now), 3);
        assert_eq!(p.last_cause(), Some(RestartCause::Exited));
        // Stays failed: time passing does nothing.
        p.handle_timeout(s(10_000));
        assert_eq!(p.poll_action(), None);
        assert_eq!(p.state(), State::Failed);
        // Until started again, with a fresh window.
        p.start(s(10_000));
        assert_eq!(drain(&mut p), [Action::Spawn]);
        assert_eq!(p.state(), State::Starting);
        assert_eq!(p.consecutive_restarts(s(10_000)), 0);
    }

    #[test]
    fn readiness_never_answering_fails_after_startup_deadlines() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        let mut now = s(0);
        let mut log = Vec::new();
        loop {
            match p.poll_action() {
                Some(Action::Spawn) => {
                    log.push(("spawn", now));
                    p.handle_spawned(now);
                }
                Some(Action::KillGroup) => {
                    log.push(("kill", now));
                    p.handle_killed(now);
                }
                Some(Action::NotifyInflight(r)) => assert_eq!(r, FailReason::WorkerRestarted),
                None if p.state() == State::Failed => break,
                None => {
                    let t = p.poll_timeout().unwrap();
                    p.handle_readiness(t - Duration::from_millis(1), Readiness::Failed);
                    now = t;
                    p.handle_timeout(now);
                }
                Some(Action::StartRpc) => panic!("no RPC endpoints"),
            }
        }
        assert_eq!(
            log,
            [
                ("spawn", s(0)),
                ("kill", s(60)),
                ("spawn", s(62)),
                ("kill", s(122)),
                ("spawn", s(124)),
                ("kill", s(184)),
                ("spawn", s(186)),
                ("kill", s(246)),
            ]
        );
        assert_eq!(p.last_cause(), Some(RestartCause::StartupTimeout));
        assert!(!p.child_alive());
    }

    #[test]
    fn ready_for_a_whole_window_sets_the_count_back_to_zero() {
        let cfg = PolicyConfig {
            max_restarts_per_window: 1,
            restart_window: s(100),
            restart_backoff: Duration::ZERO,
            ..CFG
        };
        // Spawned at 0, died at 10 (restart 1), spawned again and ready at 10.
        let ready_again = || {
            let mut p = Policy::new(cfg);
            p.start(s(0));
            drain(&mut p);
            p.handle_spawned(s(0));
            p.handle_exit(s(10));
            // Zero backoff: spawn at once.
            assert_eq!(
                drain(&mut p),
                [
                    Action::NotifyInflight(FailReason::ServerDied),
                    Action::Spawn
                ]
            );
            p.handle_spawned(s(10));
            p.handle_readiness(s(10), Readiness::Ok);
            p
        };
        // Ready for 99.999 s: the earlier restart still counts, one more is one too many.
        let mut q = ready_again();
        let just_before = s(110) - Duration::from_millis(1);
        assert_eq!(q.consecutive_restarts(just_before), 1);
        q.handle_exit(just_before);
        assert_eq!(q.state(), State::Failed);
        // Ready for exactly 100 s: the count went back to zero, this restart is the first.
        let mut p = ready_again();
        assert_eq!(p.consecutive_restarts(s(110)), 0);
        p.handle_exit(s(110));
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.consecutive_restarts(s(110)), 1);
        assert_eq!(p.total_restarts(), 2);
        // A server that lives long but never gets ready does not reset the count.
        let mut r = Policy::new(PolicyConfig {
            startup_deadline: s(10_000),
            ..cfg
        });
        r.start(s(0));
        drain(&mut r);
        r.handle_spawned(s(0));
        r.handle_exit(s(1));
        drain(&mut r);
        r.handle_spawned(s(1));
        r.handle_exit(s(5_000));
        assert_eq!(r.state(), State::Failed);
    }

    /// What a simulated server does, at a time after its spawn.
    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Exit,
        Ready,
        ProbeFailed,
        Stall,
    }

    /// Drives a policy with `cfg` as the shell would, on a fake clock: after each spawn at `t`
    /// the server does what `script(t)` lists (sorted by time). Stops when failed or once
    /// `max_spawns` spawns happened; returns the policy and the spawn times.
    fn simulate(
        cfg: PolicyConfig,
        script: impl Fn(Duration) -> Vec<(Duration, Ev)>,
        max_spawns: usize,
    ) -> (Policy, Vec<Duration>) {
        let mut p = Policy::new(cfg);
        let mut now = Duration::ZERO;
        p.start(now);
        let mut spawns = Vec::new();
        let mut pending: VecDeque<(Duration, Ev)> = VecDeque::new();
        loop {
            while let Some(a) = p.poll_action() {
                match a {
                    Action::Spawn => {
                        spawns.push(now);
                        p.handle_spawned(now);
                        pending = script(now).into();
                    }
                    Action::KillGroup => {
                        p.handle_killed(now);
                        pending.clear();
                    }
                    Action::NotifyInflight(_) => {}
                    Action::StartRpc => unreachable!("no RPC endpoints in these configs"),
                }
            }
            if p.state() == State::Failed || spawns.len() >= max_spawns {
                return (p, spawns);
            }
            let event_at = pending.front().map(|e| e.0);
            now = [p.poll_timeout(), event_at]
                .into_iter()
                .flatten()
                .min()
                .expect("a timeout or a server event is always due");
            if event_at == Some(now) {
                match pending.pop_front().map(|e| e.1) {
                    Some(Ev::Exit) => {
                        p.handle_exit(now);
                        pending.clear();
                    }
                    Some(Ev::Ready) => p.handle_readiness(now, Readiness::Ok),
                    Some(Ev::ProbeFailed) => p.handle_readiness(now, Readiness::Failed),
                    Some(Ev::Stall) => {
                        p.report_stall(now);
                    }
                    None => {}
                }
            } else {
                p.handle_timeout(now);
            }
        }
    }

    fn defaults() -> PolicyConfig {
        crate::Config::default().timings().unwrap().policy
    }

    const MS: Duration = Duration::from_millis(1);

    /// A server that gets ready 1 s after its spawn and stays ready for `up`, then does `end`
    /// (with readiness failing every 5 s from then on for `Ev::ProbeFailed`).
    fn ready_then(up: Duration, end: Ev) -> impl Fn(Duration) -> Vec<(Duration, Ev)> {
        move |t| {
            let trouble = t + s(1) + up;
            let mut v = vec![(t + s(1), Ev::Ready)];
            match end {
                Ev::ProbeFailed => v.extend((0..100).map(|k| (trouble + s(5) * k, end))),
                _ => v.push((trouble, end)),
            }
            v
        }
    }

    /// Every kind of restart loop ends in failed with the default settings: six spawns (one
    /// start, five restarts), then failed at the sixth trigger.
    #[test]
    fn every_kind_of_loop_fails_with_the_default_settings() {
        let cfg = defaults();
        assert_eq!(
            (cfg.max_restarts_per_window, cfg.restart_window),
            (5, s(600))
        );
        // Never ready (a wrong readiness path, a load slower than the deadline): each turn is
        // the 120 s deadline plus the 2 s backoff, so six restarts never fit in 600 s.
        let (p, spawns) = simulate(cfg, |_| Vec::new(), 1000);
        assert_eq!(spawns, [0, 122, 244, 366, 488, 610].map(s));
        assert_eq!(p.state(), State::Failed);
        assert_eq!(p.last_cause(), Some(RestartCause::StartupTimeout));
        assert_eq!(p.total_restarts(), 5);
        // Exits before it is ready.
        let (p, spawns) = simulate(cfg, |t| vec![(t + MS * 100, Ev::Exit)], 1000);
        assert_eq!(spawns.len(), 6);
        assert_eq!(spawns[5], s(10) + MS * 500);
        assert_eq!(
            (p.state(), p.last_cause()),
            (State::Failed, Some(RestartCause::Exited))
        );
        // Ready, then each kind of trouble just before a whole window of readiness.
        let up = s(600) - MS;
        for (end, cause) in [
            (Ev::Exit, RestartCause::Exited),
            (Ev::ProbeFailed, RestartCause::Unready),
            (Ev::Stall, RestartCause::Stall),
        ] {
            let (p, spawns) = simulate(cfg, ready_then(up, end), 1000);
            assert_eq!(spawns.len(), 6, "{end:?}");
            assert_eq!(
                (p.state(), p.last_cause()),
                (State::Failed, Some(cause)),
                "{end:?}"
            );
        }
    }

    /// The limit and one past it: ready for a whole window between restarts is not a loop.
    #[test]
    fn a_server_ready_for_a_whole_window_each_time_keeps_being_restarted() {
        for end in [Ev::Exit, Ev::ProbeFailed, Ev::Stall] {
            let (p, spawns) = simulate(defaults(), ready_then(s(600), end), 50);
            assert_eq!(spawns.len(), 50, "{end:?}");
            assert_eq!(p.state(), State::Restarting, "{end:?}");
            assert_eq!(p.total_restarts(), 49, "{end:?}");
        }
    }

    #[test]
    fn unready_with_flat_cpu_restarts_at_threshold() {
        let mut p = ready_at(s(0));
        p.handle_cpu_sample(s(0), Some(100));
        p.handle_readiness(s(5), Readiness::Failed);
        p.handle_cpu_sample(s(5), Some(100));
        p.handle_readiness(s(34), Readiness::Failed);
        assert_eq!(p.state(), State::Ready);
        p.handle_readiness(s(35), Readiness::Failed);
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.last_cause(), Some(RestartCause::Unready));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::WorkerRestarted),
                Action::KillGroup
            ]
        );
    }

    #[test]
    fn unready_while_cpu_rises_does_not_count() {
        let mut p = ready_at(s(0));
        p.handle_cpu_sample(s(0), Some(100));
        for t in (5..=600).step_by(5) {
            p.handle_readiness(s(t), Readiness::Failed);
            p.handle_cpu_sample(s(t), Some(100 + t));
            assert_eq!(p.state(), State::Ready, "at {t}");
        }
        // CPU goes flat: 30 s after the last rise it restarts.
        p.handle_cpu_sample(s(620), Some(700));
        p.handle_readiness(s(629), Readiness::Failed);
        assert_eq!(p.state(), State::Ready);
        p.handle_readiness(s(630), Readiness::Failed);
        assert_eq!(p.state(), State::Restarting);
    }

    #[test]
    fn a_good_probe_resets_the_failure_streak() {
        let mut p = ready_at(s(0));
        p.handle_readiness(s(1), Readiness::Failed);
        p.handle_readiness(s(30), Readiness::Ok);
        p.handle_readiness(s(31), Readiness::Failed);
        p.handle_readiness(s(60), Readiness::Failed);
        assert_eq!(p.state(), State::Ready);
        p.handle_readiness(s(61), Readiness::Failed);
        assert_eq!(p.state(), State::Restarting);
    }

    #[test]
    fn cpu_samples_missing_or_falling_are_not_progress() {
        let mut p = ready_at(s(0));
        p.handle_cpu_sample(s(1), Some(50));
        assert_eq!(p.last_cpu_increase_at(), None, "first sample is a baseline");
        p.handle_cpu_sample(s(2), None);
        p.handle_cpu_sample(s(3), Some(40));
        assert_eq!(p.last_cpu_increase_at(), None);
        assert_eq!(p.last_cpu_ticks(), Some(40));
        p.handle_cpu_sample(s(4), Some(41));
        assert_eq!(p.last_cpu_increase_at(), Some(s(4)));
        p.handle_cpu_sample(s(5), Some(41));
        assert_eq!(p.last_cpu_increase_at(), Some(s(4)));
    }

    #[test]
    fn stall_restarts_only_without_progress() {
        let mut p = ready_at(s(0));
        p.handle_cpu_sample(s(0), Some(1));
        p.handle_cpu_sample(s(100), Some(2));
        assert_eq!(
            p.report_stall(s(150)),
            StallVerdict::NotStalled {
                since_progress: s(50)
            }
        );
        p.handle_stream_bytes(s(200));
        assert_eq!(
            p.report_stall(s(319)),
            StallVerdict::NotStalled {
                since_progress: s(119)
            }
        );
        assert_eq!(p.state(), State::Ready);
        assert_eq!(p.report_stall(s(320)), StallVerdict::Restarting);
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.last_cause(), Some(RestartCause::Stall));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::WorkerRestarted),
                Action::KillGroup
            ]
        );
        assert_eq!(p.report_stall(s(400)), StallVerdict::NotReady);
    }

    #[test]
    fn stop_during_backoff_is_immediate_and_spawns_nothing() {
        let mut p = ready_at(s(0));
        p.handle_exit(s(10));
        drain(&mut p);
        assert_eq!(p.poll_timeout(), Some(s(12)));
        p.stop(s(10));
        assert_eq!(
            drain(&mut p),
            [Action::NotifyInflight(FailReason::WorkerStopped)]
        );
        assert_eq!(p.state(), State::Stopped);
        assert_eq!(p.poll_timeout(), None);
        p.handle_timeout(s(12));
        assert_eq!(p.poll_action(), None);
    }

    #[test]
    fn stop_while_ready_kills_and_exit_afterwards_is_expected() {
        let mut p = ready_at(s(0));
        p.stop(s(1));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::WorkerStopped),
                Action::KillGroup
            ]
        );
        p.handle_killed(s(1));
        p.handle_exit(s(1));
        assert_eq!(p.state(), State::Stopped);
        assert_eq!(p.poll_action(), None);
        assert_eq!(p.total_restarts(), 0);
    }

    #[test]
    fn a_spawn_that_lands_after_stop_is_killed() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        assert_eq!(p.poll_action(), Some(Action::Spawn));
        // stop() from another thread while the shell is spawning.
        p.stop(s(0));
        assert_eq!(
            drain(&mut p),
            [Action::NotifyInflight(FailReason::WorkerStopped)]
        );
        p.handle_spawned(s(0));
        assert_eq!(drain(&mut p), [Action::KillGroup]);
        p.handle_killed(s(0));
        assert_eq!(p.state(), State::Stopped);
        assert!(!p.child_alive());
    }

    #[test]
    fn start_is_ignored_unless_stopped_or_failed() {
        let mut p = ready_at(s(0));
        p.start(s(1));
        assert_eq!(p.poll_action(), None);
        assert_eq!(p.state(), State::Ready);
    }

    #[test]
    fn spawn_failure_counts_as_a_restart() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        drain(&mut p);
        p.handle_spawn_failed(s(0));
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.poll_timeout(), Some(s(2)));
    }

    /// A model whose instance dies on every load (the router itself stays up): each death is a
    /// crash-loop event, the unit is killed and respawned after the backoff, and the worker is
    /// `failed` at the exact instant of the fourth death, never `ready` in between.
    #[test]
    fn a_model_that_dies_on_every_load_ends_failed_within_the_window() {
        let mut p = Policy::new(CFG);
        p.start(s(0));
        let ms = Duration::from_millis;
        let mut now = s(0);
        let mut log = Vec::new();
        while p.state() != State::Failed {
            match p.poll_action() {
                Some(Action::Spawn) => {
                    p.handle_spawned(now);
                    // The router answers, the model loads for 1.5 s and its instance exits.
                    p.handle_readiness(now + ms(500), Readiness::Failed);
                    now += ms(1500);
                    assert_ne!(p.state(), State::Ready);
                    p.handle_model_exit(now);
                }
                Some(a) => {
                    if a == Action::KillGroup {
                        p.handle_killed(now);
                    }
                    log.push((now, a));
                }
                None => {
                    now = p.poll_timeout().expect("a backoff is pending");
                    p.handle_timeout(now);
                }
            }
        }
        log.extend(drain(&mut p).into_iter().map(|a| (now, a)));
        let died = Action::NotifyInflight(FailReason::ServerDied);
        // Spawns at 0, 3.5, 7, 10.5 (1.5 s to die, 2 s of backoff); the fourth death fails.
        assert_eq!(
            log,
            [
                (ms(1500), died),
                (ms(1500), Action::KillGroup),
                (ms(5000), died),
                (ms(5000), Action::KillGroup),
                (ms(8500), died),
                (ms(8500), Action::KillGroup),
                (ms(12000), died),
                (ms(12000), Action::KillGroup),
            ]
        );
        assert_eq!(now, ms(12000));
        assert_eq!(p.last_cause(), Some(RestartCause::ModelExited));
        assert_eq!(p.total_restarts(), 3);
        assert_eq!(p.admit(), Err(Refusal::Failed));
        assert_eq!(p.poll_timeout(), None);
    }

    #[test]
    fn a_model_exit_while_ready_restarts_and_tells_inflight_the_server_died() {
        let mut p = ready_at(s(0));
        p.handle_model_exit(s(40));
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.last_cause(), Some(RestartCause::ModelExited));
        assert_eq!(
            drain(&mut p),
            [
                Action::NotifyInflight(FailReason::ServerDied),
                Action::KillGroup
            ]
        );
        assert_eq!(p.poll_timeout(), Some(s(42)));
    }

    #[test]
    fn a_model_exit_seen_during_backoff_or_after_stop_is_not_counted_again() {
        let mut p = ready_at(s(0));
        p.handle_model_exit(s(40));
        drain(&mut p);
        p.handle_killed(s(40));
        // The same failed status read once more before the respawn: the unit is already gone.
        p.handle_model_exit(s(41));
        assert_eq!(drain(&mut p), []);
        assert_eq!(p.total_restarts(), 1);
        p.stop(s(41));
        drain(&mut p);
        p.handle_model_exit(s(41));
        assert_eq!(drain(&mut p), []);
        assert_eq!(p.state(), State::Stopped);
    }
    const MS1: Duration = Duration::from_millis(1);

    /// Ready at 0 with a CPU baseline of 100 ticks, one generation registered at 1 s on slot 2.
    fn with_generation() -> (Policy, u64) {
        let mut p = ready_at(s(0));
        p.handle_cpu_sample(s(0), Some(100));
        let id = p.register(s(1), 2).unwrap();
        assert_eq!(id, 1);
        (p, id)
    }

    fn stalled(p: &mut Policy, id: u64) {
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.last_cause(), Some(RestartCause::Stall));
        assert_eq!(
            drain(p),
            [
                Action::NotifyInflight(FailReason::WorkerRestarted),
                Action::KillGroup
            ]
        );
        assert_eq!(
            p.take_failed_generations(),
            [(id, FailReason::WorkerRestarted)]
        );
        assert!(p.generations().is_empty());
        assert!(!p.handle_progress(p.poll_timeout().unwrap(), id, ProgressKind::Bytes));
    }

    #[test]
    fn prefill_with_rising_cpu_is_alive() {
        let (mut p, id) = with_generation();
        for t in (5..=600).step_by(5) {
            p.handle_cpu_sample(s(t), Some(100 + t));
            p.handle_timeout(s(t));
            assert_eq!(p.state(), State::Ready, "at {t}");
            assert_eq!(p.poll_timeout(), Some(s(t + 120)));
        }
        let g = p.generations();
        assert_eq!(
            g,
            [GenerationView {
                id,
                slot: 2,
                phase: GenerationPhase::Prefill,
                last_progress_at: s(600),
            }]
        );
    }

    #[test]
    fn prefill_with_flat_cpu_stalls_at_the_limit() {
        let (mut p, id) = with_generation();
        for t in (5..=120).step_by(5) {
            p.handle_cpu_sample(s(t), Some(100));
        }
        assert_eq!(p.poll_timeout(), Some(s(121)));
        p.handle_timeout(s(121) - MS1);
        assert_eq!(p.state(), State::Ready);
        assert_eq!(drain(&mut p), []);
        p.handle_timeout(s(121));
        stalled(&mut p, id);
    }

    #[test]
    fn a_silent_stream_stalls_while_cpu_rises() {
        let (mut p, id) = with_generation();
        assert!(p.handle_progress(s(10), id, ProgressKind::FirstByte));
        for t in (15..130).step_by(5) {
            p.handle_cpu_sample(s(t), Some(100 + t));
        }
        assert_eq!(p.poll_timeout(), Some(s(130)));
        p.handle_timeout(s(130) - MS1);
        assert_eq!(p.state(), State::Ready);
        p.handle_timeout(s(130));
        stalled(&mut p, id);
    }

    /// Two clients (two daemons) on one server. A slot one watch connection's
    /// generation holds is refused to any other owner; the same owner may hold it twice; a
    /// closed connection's registrations go, the others' stay.
    #[test]
    fn a_slot_held_by_one_owner_is_refused_to_the_others_until_it_is_done() {
        let mut p = ready_at(s(0));
        let a = p.register_owned(s(1), 0, Some(1)).unwrap();
        assert_eq!(p.register_owned(s(1), 0, Some(2)), Err(Refusal::SlotTaken));
        assert_eq!(p.register_owned(s(1), 0, None), Err(Refusal::SlotTaken));
        assert_eq!(Refusal::SlotTaken.code(), "SLOT_TAKEN");
        let again = p.register_owned(s(2), 0, Some(1)).unwrap();
        let b = p.register_owned(s(2), 1, Some(2)).unwrap();
        let legacy = p.register(s(2), 3).unwrap();
        assert_eq!(p.register_owned(s(2), 3, Some(2)), Err(Refusal::SlotTaken));
        assert!(p.unregister(a) && p.unregister(again));
        let c = p.register_owned(s(3), 0, Some(2)).unwrap();
        p.forget_generations_of(2);
        let left: Vec<u64> = p.generations().iter().map(|g| g.id).collect();
        assert_eq!(left, [legacy]);
        assert!(!p.unregister(b) && !p.unregister(c));
        assert_eq!(drain(&mut p), [], "forgotten, not failed");
        assert!(p.take_failed_generations().is_empty());
    }

    /// A tool call's opening at a token every few seconds: slot 2 streams nothing after its
    /// first byte at 10 s while its decoded-token count rises (a slow box, shape b).
    #[test]
    fn a_silent_stream_whose_slot_decodes_is_alive_until_the_count_stands_still() {
        let (mut p, id) = with_generation();
        assert!(p.handle_progress(s(10), id, ProgressKind::FirstByte));
        // Half stall_timeout after the first byte, the worker asks /slots; not before.
        assert_eq!(p.slots_probe_at(), Some(s(70)));
        assert_eq!(p.poll_timeout(), Some(s(130)));
        // The first answer is a baseline, not progress; slot 0's count is not slot 2's.
        p.handle_slots_decoded(s(70), &[(0, 900), (2, 30)]);
        assert_eq!(p.poll_timeout(), Some(s(130)));
        assert_eq!(p.slots_probe_at(), Some(s(70)));
        let mut n = 30;
        for t in (75..=600).step_by(5) {
            n += 1;
            p.handle_slots_decoded(s(t), &[(0, 900), (2, n)]);
            p.handle_timeout(s(t));
            assert_eq!((p.state(), drain(&mut p)), (State::Ready, vec![]), "at {t}");
            assert_eq!(p.poll_timeout(), Some(s(t + 120)), "at {t}");
            assert_eq!(p.slots_probe_at(), Some(s(t + 60)), "at {t}");
        }
        assert_eq!(p.generations()[0].last_progress_at, s(600));
        // The count stands still from 600 s: the stall comes at 720 s, to the millisecond.
        for t in (605..720).step_by(5) {
            p.handle_slots_decoded(s(t), &[(2, n)]);
            p.handle_timeout(s(t));
            assert_eq!(p.state(), State::Ready, "at {t}");
        }
        p.handle_timeout(s(720) - MS1);
        assert_eq!(p.state(), State::Ready);
        p.handle_timeout(s(720));
        stalled(&mut p, id);
        assert_eq!(p.slots_probe_at(), None);
    }

    #[test]
    fn another_slots_rising_count_is_not_this_streams_progress() {
        let (mut p, id) = with_generation();
        assert!(p.handle_progress(s(10), id, ProgressKind::FirstByte));
        for (i, t) in (70..130).step_by(5).enumerate() {
            p.handle_slots_decoded(s(t), &[(0, 10 + i as u64), (2, 7)]);
        }
        p.handle_timeout(s(130) - MS1);
        assert_eq!(p.state(), State::Ready);
        p.handle_timeout(s(130));
        stalled(&mut p, id);
    }

    #[test]
    fn a_falling_count_is_a_new_baseline_not_progress() {
        let (mut p, id) = with_generation();
        assert!(p.handle_progress(s(10), id, ProgressKind::FirstByte));
        p.handle_slots_decoded(s(70), &[(2, 30)]);
        p.handle_slots_decoded(s(75), &[(2, 3)]);
        assert_eq!(p.poll_timeout(), Some(s(130)));
        p.handle_slots_decoded(s(80), &[(2, 4)]);
        assert_eq!(p.poll_timeout(), Some(s(200)));
    }

    #[test]
    fn slots_are_asked_only_for_a_streaming_generation_while_ready() {
        let (mut p, id) = with_generation();
        // In its prefill: judged by CPU time, and its count (0) is no baseline.
        assert_eq!(p.slots_probe_at(), None);
        p.handle_slots_decoded(s(5), &[(2, 0)]);
        p.handle_slots_decoded(s(6), &[(2, 1)]);
        assert_eq!(p.generations()[0].last_progress_at, s(1));
        assert!(p.handle_progress(s(10), id, ProgressKind::FirstByte));
        assert_eq!(p.slots_probe_at(), Some(s(70)));
        // A stream byte is progress: the probe moves with it.
        assert!(p.handle_progress(s(20), id, ProgressKind::Bytes));
        assert_eq!(p.slots_probe_at(), Some(s(80)));
        p.stop(s(21));
        assert_eq!(p.slots_probe_at(), None);
    }

    /// Streaming on slot 2 from 2 s to 10 s, then slot 0's long prompt registered at 10 s:
    /// llama-server batches slot 2's next token with slot 0's prompt, so slot 2 hears nothing
    /// until the prompt is through (seen in the chaos run beside two CPU-bound loops).
    fn streaming_then_a_prompt_on_the_other_slot() -> (Policy, u64, u64) {
        let (mut p, a) = with_generation();
        assert!(p.handle_progress(s(2), a, ProgressKind::FirstByte));
        for t in 3..=10 {
            assert!(p.handle_progress(s(t), a, ProgressKind::Bytes));
        }
        let b = p.register(s(10), 0).unwrap();
        (p, a, b)
    }

    #[test]
    fn a_stream_held_up_by_the_other_slots_prompt_is_not_stalled() {
        let (mut p, a, b) = streaming_then_a_prompt_on_the_other_slot();
        // The prompt takes 290 s, more than twice stall_timeout; the CPU time rises all along.
        for t in (15..=300).step_by(5) {
            p.handle_cpu_sample(s(t), Some(100 + t));
            p.handle_timeout(s(t));
            assert_eq!((p.state(), drain(&mut p)), (State::Ready, vec![]), "at {t}");
            assert_eq!(p.poll_timeout(), Some(s(t + 120)), "at {t}");
        }
        assert_eq!(
            p.generations(),
            [
                GenerationView {
                    id: a,
                    slot: 2,
                    phase: GenerationPhase::Streaming,
                    last_progress_at: s(300),
                },
                GenerationView {
                    id: b,
                    slot: 0,
                    phase: GenerationPhase::Prefill,
                    last_progress_at: s(300),
                }
            ]
        );
        assert_eq!(
            p.report_stall_of(s(301), a),
            StallVerdict::NotStalled {
                since_progress: s(1)
            }
        );
        // The prompt is through: slot 0's first byte. Slot 2 keeps what the prompt gave it
        // until its own next byte, a moment later.
        assert!(p.handle_progress(s(302), b, ProgressKind::FirstByte));
        p.handle_timeout(s(302));
        assert_eq!(p.state(), State::Ready);
        assert_eq!(p.generations()[0].last_progress_at, s(300));
        assert_eq!(p.poll_timeout(), Some(s(420)));
        assert!(p.handle_progress(s(303), a, ProgressKind::Bytes));
        assert_eq!(p.poll_timeout(), Some(s(422)));
        // Both streaming, neither sends again: a silent stream stalls while the CPU time rises
        // (a GPU host's threads spin in a hung kernel), as before.
        for t in (305..422).step_by(5) {
            p.handle_cpu_sample(s(t), Some(100 + t));
        }
        p.handle_timeout(s(422) - MS1);
        assert_eq!(p.state(), State::Ready);
        p.handle_timeout(s(422));
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(p.last_cause(), Some(RestartCause::Stall));
        assert_eq!(
            p.take_failed_generations(),
            [
                (a, FailReason::WorkerRestarted),
                (b, FailReason::WorkerRestarted)
            ]
        );
    }

    #[test]
    fn a_hung_server_under_a_prompt_and_a_stream_still_stalls() {
        let (mut p, a, b) = streaming_then_a_prompt_on_the_other_slot();
        // A rise sampled at the registration, then the CPU time is flat (SIGSTOP): slot 2's
        // last byte (10 s) is its progress, not the prompt's registration.
        p.handle_cpu_sample(s(10), Some(150));
        for t in 11..130 {
            p.handle_cpu_sample(s(t), Some(150));
        }
        assert_eq!(p.generations()[0].last_progress_at, s(10));
        assert_eq!(p.poll_timeout(), Some(s(130)));
        p.handle_timeout(s(130) - MS1);
        assert_eq!(p.state(), State::Ready);
        p.handle_timeout(s(130));
        assert_eq!(p.state(), State::Restarting);
        assert_eq!(
            p.take_failed_generations(),
            [
                (a, FailReason::WorkerRestarted),
                (b, FailReason::WorkerRestarted)
            ]
        );
    }

    #[test]
    fn a_rise_before_the_prompt_was_registered_is_not_the_prompts() {
        let (mut p, a) = with_generation();
        assert!(p.handle_progress(s(2), a, ProgressKind::FirstByte));
        p.handle_cpu_sample(s(20), Some(200));
        let b = p.register(s(21), 0).unwrap();
        assert_eq!(p.generations()[0].last_progress_at, s(2));
        assert_eq!(p.poll_timeout(), Some(s(122)));
        // One rise after it: the stream's progress, and it stays when the prompt is cut.
        p.handle_cpu_sample(s(25), Some(300));
        assert_eq!(p.generations()[0].last_progress_at, s(25));
        assert!(p.unregister(b));
        assert_eq!(p.generations()[0].last_progress_at, s(25));
        for t in (30..=145).step_by(5) {
            p.handle_cpu_sample(s(t), Some(300 + t));
        }
        assert_eq!(p.poll_timeout(), Some(s(145)));
        p.handle_timeout(s(145));
        stalled(&mut p, a);
    }

    #[test]
    fn stream_bytes_with_flat_cpu_are_alive() {
        let (mut p, id) = with_generation();
        assert!(p.handle_progress(s(2), id, ProgressKind::FirstByte));
        for t in 3..=600 {
            assert!(p.handle_progress(s(t), id, ProgressKind::Bytes));
            p.handle_cpu_sample(s(t), Some(100));
            p.handle_timeout(s(t));
            assert_eq!(p.state(), State::Ready, "at {t}");
        }
        assert_eq!(p.generations()[0].phase, GenerationPhase::Streaming);
        assert_eq!(p.poll_timeout(), Some(s(720)));
        // Done: no deadline any more, however long it stays quiet.
        assert!(p.unregister(id));
        assert!(!p.unregister(id));
        assert_eq!(p.poll_timeout(), None);
        p.handle_timeout(s(10_000));
        assert_eq!(p.state(), State::Ready);
    }

    #[test]
    fn unregistered_work_gets_no_per_request_verdict() {
        let mut p = ready_at(s(0));
        p.handle_cpu_sample(s(0), Some(100));
        assert_eq!(p.poll_timeout(), None);
        p.handle_timeout(s(10_000));
        assert_eq!((p.state(), drain(&mut p)), (State::Ready, vec![]));
        assert!(!p.handle_progress(s(1), 9, ProgressKind::FirstByte));
    }

    #[test]
    fn a_stall_report_of_a_generation_uses_its_own_progress() {
        let (mut p, id) = with_generation();
        p.handle_progress(s(10), id, ProgressKind::FirstByte);
        // CPU rises all along: the bare report sees progress, the generation's does not.
        for t in (15..=125).step_by(5) {
            p.handle_cpu_sample(s(t), Some(100 + t));
        }
        assert_eq!(
            p.report_stall_of(s(129), id),
            StallVerdict::NotStalled {
                since_progress: s(119)
            }
        );
        // An id it does not know is a bare report: the CPU rose 5 s ago.
        assert_eq!(
            p.report_stall_of(s(130), 99),
            StallVerdict::NotStalled {
                since_progress: s(5)
            }
        );
        assert_eq!(p.report_stall_of(s(130), id), StallVerdict::Restarting);
        stalled(&mut p, id);
        assert_eq!(p.report_stall_of(s(131), id), StallVerdict::NotReady);
    }

    #[test]
    fn a_death_fails_every_generation_and_registration_needs_ready() {
        let (mut p, a) = with_generation();
        let b = p.register(s(2), 0).unwrap();
        p.handle_exit(s(3));
        assert_eq!(
            p.take_failed_generations(),
            [(a, FailReason::ServerDied), (b, FailReason::ServerDied)]
        );
        assert_eq!(p.take_failed_generations(), []);
        assert_eq!(p.register(s(3), 0), Err(Refusal::NotReady));
        let (mut p, a) = with_generation();
        p.stop(s(5));
        assert_eq!(
            p.take_failed_generations(),
            [(a, FailReason::WorkerStopped)]
        );
        assert_eq!(p.register(s(6), 0), Err(Refusal::Stopped));
    }
}
