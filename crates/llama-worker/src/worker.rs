//! The shell around [`Policy`]: owns the server process, runs the probes, executes the
//! policy's actions, and shares admission, in-flight registration and status with other
//! threads through a [`WorkerHandle`].
//!
//! One thread drives [`Worker::tick`] (or [`Worker::run_until`]); any number of threads hold
//! handles. A handle never waits on the driving thread: admission, status, stall reports and
//! stop requests take one short lock. The driving thread holds no lock while it kills, spawns
//! or probes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::SharedClock;
use crate::config::{CommandSpec, Config, ConfigError, Timings};
use crate::cpu;
use crate::metrics::Metrics;
use crate::models::{self, ModelState, ModelsVerdict, MAX_MODELS_BODY, MODELS_PATH};
use crate::policy::{
    Action, FailReason, Policy, ProgressKind, Readiness, Refusal, RestartCause, StallVerdict, State,
};
use crate::probe::{self, ProbeError, ProbeOutcome};
use crate::process::{Exit, Lingering, ServerProcess};
use crate::rpc::{rpc_arg, EndpointStatus};
use crate::rpc_unit::RpcUnit;
use crate::slots::{self, MAX_SLOTS_BODY, SLOTS_PATH};
use crate::status::{ModelExit, ReadinessRecord, RpcLoss, Status};
use worker_proto::{WatchEvent, MAX_WATCHERS};

/// Longest the driving loop sleeps: how late an exit of the server is noticed at worst.
pub const MAX_IDLE: Duration = Duration::from_millis(100);

/// How long readiness is probed at the startup interval after a model instance is gone: the
/// router may take a moment to notice the exit and say so in `/models`.
pub const INSTANCE_RECHECK: Duration = Duration::from_secs(3);

/// What goes down one watch connection's queue.
#[derive(Debug)]
pub enum Push {
    /// A line to write.
    Event(WatchEvent),
    /// Answer on this channel once everything before it is written
    /// ([`WorkerHandle::flush_watches`]).
    Flushed(Sender<()>),
}

#[derive(Debug)]
struct Inner {
    policy: Policy,
    inflight: BTreeMap<u64, Sender<FailReason>>,
    next_work_id: u64,
    pid: Option<u32>,
    pgid: Option<i32>,
    spawns: u64,
    last_readiness: Option<ReadinessRecord>,
    /// The latest model instance exit the router reported.
    last_model_exit: Option<ModelExit>,
    /// How the server last exited on its own (`exit status: 1`, `signal: 11 (SIGSEGV)`, …).
    last_server_exit: Option<String>,
    /// The counters (`metrics` on the socket, `metrics_file`).
    metrics: Metrics,
    /// The RPC endpoints as last probed (a copy of the driving thread's [`RpcUnit`]).
    rpc: Vec<EndpointStatus>,
    /// The latest RPC endpoint the unit lost.
    rpc_lost: Option<RpcLoss>,
    /// The `watch` connections' queues.
    watchers: Vec<Sender<Push>>,
    /// Open `watch` connections; when the last one closes, registered generations are
    /// forgotten (their clients are gone and can report neither progress nor their end).
    watching: usize,
    /// The last watch connection's id (each gets the next).
    next_watch: u64,
    /// The state last pushed to the watchers.
    pushed_state: State,
}

impl Inner {
    /// Pushes `event` to every watcher, dropping those whose connection is gone.
    fn push(&mut self, event: WatchEvent) {
        self.watchers.retain(|w| w.send(Push::Event(event)).is_ok());
    }

    /// Pushes the state to the watchers if it changed since the last push.
    fn push_state(&mut self) {
        let state = self.policy.state();
        if state != self.pushed_state {
            self.pushed_state = state;
            let spawns = self.spawns;
            self.push(WatchEvent::State { state, spawns });
        }
    }

    /// Requests in flight: in-process registrations and registered generations.
    fn inflight(&self) -> usize {
        self.inflight.len() + self.policy.generations().len()
    }

    /// Brings the counters up to the policy as it is at `now`.
    fn observe(&mut self, now: Duration) {
        let p = &self.policy;
        let (state, total, cause) = (p.state(), p.total_restarts(), p.last_cause());
        self.metrics.handle_policy(now, state, total, cause);
    }
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    wake: Condvar,
    /// Set by `stop`: a readiness probe in progress gives up. Cleared by the driving thread at
    /// the start of each tick, before it looks at the state.
    interrupt: AtomicBool,
    /// Set by `kill_now`: kills send SIGKILL at once instead of waiting out the grace period.
    skip_grace: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A cheap, cloneable, thread-safe view of a [`Worker`]: admission, status, control.
#[derive(Clone, Debug)]
pub struct WorkerHandle<C: SharedClock> {
    shared: Arc<Shared>,
    clock: C,
    port: u16,
    /// Where the server's output goes (named in the failure reason).
    log_file: Option<PathBuf>,
    /// `startup_deadline_s` and friends, for the failure reason.
    timings: Timings,
}

impl<C: SharedClock> WorkerHandle<C> {
    /// Admits one request: `Ok` with its registration while ready, otherwise the refusal
    /// (`WORKER_NOT_READY`, `WORKER_FAILED`, `WORKER_STOPPED`) at once.
    pub fn admit(&self) -> Result<Work<C>, Refusal> {
        let mut g = self.shared.lock();
        g.policy.admit()?;
        let id = g.next_work_id;
        g.next_work_id += 1;
        let (tx, rx) = mpsc::channel();
        g.inflight.insert(id, tx);
        Ok(Work {
            id,
            rx,
            handle: self.clone(),
            failed: None,
        })
    }

    /// The lifecycle state.
    pub fn state(&self) -> State {
        self.shared.lock().policy.state()
    }

    /// Everything `llama-worker status` shows.
    pub fn status(&self) -> Status {
        let now = self.clock.now();
        let g = self.shared.lock();
        let reason = if g.policy.state() == State::Failed {
            Some(self.failure_reason(&g, now))
        } else if g.policy.awaiting_endpoints() {
            g.rpc.iter().find_map(|e| match e.last_probe {
                Some(Err(err)) => Some(format!(
                    "waiting for RPC endpoint {e} to accept connections: {}",
                    err.as_str()
                )),
                _ => None,
            })
        } else {
            None
        };
        Status {
            state: g.policy.state(),
            pid: g.pid,
            pgid: g.pgid,
            port: self.port,
            consecutive_restarts: g.policy.consecutive_restarts(now),
            total_restarts: g.policy.total_restarts(),
            spawns: g.spawns,
            last_cause: g.policy.last_cause(),
            cpu_ticks: g.policy.last_cpu_ticks(),
            cpu_progress_age: g
                .policy
                .last_cpu_increase_at()
                .map(|t| now.saturating_sub(t)),
            last_readiness: g.last_readiness.clone(),
            readiness_age: g.last_readiness.as_ref().map(|r| now.saturating_sub(r.at)),
            inflight: g.inflight(),
            generations: g
                .policy
                .generations()
                .into_iter()
                .map(|v| crate::status::GenerationStatus {
                    progress_age: now.saturating_sub(v.last_progress_at),
                    view: v,
                })
                .collect(),
            last_model_exit: g.last_model_exit.clone(),
            model_exit_age: g.last_model_exit.as_ref().map(|e| now.saturating_sub(e.at)),
            log_file: self.log_file.clone(),
            reason,
            rpc: g.rpc.clone(),
            rpc_lost: g.rpc_lost.clone().map(|l| RpcLoss {
                age: Some(now.saturating_sub(l.at)),
                ..l
            }),
        }
    }

    /// Why the worker is `failed`, in one sentence naming what a person needs: the cause of the
    /// last restart (the model and its exit status, the server's exit), and where the log is.
    fn failure_reason(&self, g: &Inner, now: Duration) -> String {
        let secs = |d: Duration| crate::status::secs(d);
        let t = &self.timings.policy;
        let cause = match g.policy.last_cause() {
            Some(RestartCause::ModelExited) => match &g.last_model_exit {
                Some(e) => format!(
                    "model {} {}: its instance exited with status {}",
                    e.model,
                    if e.while_loading {
                        "failed to load"
                    } else {
                        "died while serving"
                    },
                    e.exit_code
                ),
                None => "a model instance exited".to_string(),
            },
            Some(RestartCause::Exited) => format!(
                "the server exited ({})",
                g.last_server_exit
                    .as_deref()
                    .unwrap_or("could not be spawned")
            ),
            Some(RestartCause::StartupTimeout) => format!(
                "the server was not ready within startup_deadline_s ({} s)",
                secs(t.startup_deadline)
            ),
            Some(RestartCause::Unready) => format!(
                "readiness failed for unready_restart_s ({} s) with flat CPU time",
                secs(t.unready_restart_after)
            ),
            Some(RestartCause::Stall) => format!(
                "a stall was reported with no progress for stall_timeout_s ({} s)",
                secs(t.stall_timeout)
            ),
            Some(RestartCause::RpcExited) => match &g.rpc_lost {
                Some(l) => format!("RPC server {} exited ({})", l.endpoint, l.what),
                None => "an RPC server exited".to_string(),
            },
            Some(RestartCause::RpcStartupTimeout) => format!(
                "an RPC server ({}) did not accept connections within startup_deadline_s ({} s)",
                g.rpc
                    .iter()
                    .find(|e| matches!(e.last_probe, Some(Err(_))))
                    .map_or("?".to_string(), |e| e.to_string()),
                secs(t.startup_deadline)
            ),
            None => "no restart was recorded".to_string(),
        };
        let log = self
            .log_file
            .as_ref()
            .map_or("the worker's own stderr".to_string(), |p| {
                p.display().to_string()
            });
        let restarts = g.policy.consecutive_restarts(now);
        format!(
            "crash-loop protection: {} failures in a row ({restarts} restarts) without {} s \
             ready, the last because {cause}; server log: {log}",
            restarts + 1,
            secs(t.restart_window)
        )
    }

    /// The counters in the Prometheus text format, ending with `# EOF\n` (see
    /// [`crate::metrics`]).
    pub fn metrics(&self) -> String {
        let now = self.clock.now();
        let mut g = self.shared.lock();
        g.observe(now);
        let inflight = g.inflight();
        g.metrics.encode(now, inflight)
    }

    /// Starts from stopped or failed (the restart count goes back to zero); otherwise nothing.
    /// Kills wait out the grace period again after a [`WorkerHandle::kill_now`].
    pub fn start(&self) {
        let now = self.clock.now();
        self.shared.skip_grace.store(false, Ordering::SeqCst);
        let mut g = self.shared.lock();
        g.policy.start(now);
        // On the watches before the command is answered (see `flush_watches`).
        g.push_state();
        drop(g);
        self.shared.wake.notify_all();
    }

    /// Stops: in-flight work is told `worker_stopped`, the group is killed by the driving
    /// thread on its next tick. Never waits on a backoff; a readiness probe in progress gives
    /// up within [`probe::CANCEL_CHECK`].
    pub fn stop(&self) {
        let now = self.clock.now();
        let mut g = self.shared.lock();
        g.policy.stop(now);
        // On the watches before the command is answered (see `flush_watches`).
        g.push_state();
        drop(g);
        self.shared.interrupt.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
    }

    /// Waits, at most `within`, until every open watch connection has written what was
    /// pushed to it before this call. A command that changes the state (`start`, `stop`) is
    /// answered after it, so a client that heard the answer finds the new state already in
    /// its watch socket: what it admits next cannot go by the state before.
    pub fn flush_watches(&self, within: Duration) {
        let (tx, rx) = mpsc::channel();
        let mut g = self.shared.lock();
        g.watchers
            .retain(|w| w.send(Push::Flushed(tx.clone())).is_ok());
        let n = g.watchers.len();
        drop(g);
        drop(tx);
        let deadline = self.clock.now() + within;
        for _ in 0..n {
            let left = deadline.saturating_sub(self.clock.now());
            if rx.recv_timeout(left).is_err() {
                return;
            }
        }
    }

    /// Stops like [`WorkerHandle::stop`], and a kill in progress or to come sends SIGKILL to
    /// the group at once, skipping the rest of `stop_grace_s` (the second signal to the daemon).
    pub fn kill_now(&self) {
        self.shared.skip_grace.store(true, Ordering::SeqCst);
        self.stop();
    }

    /// Reports that a request saw no stream bytes for its stall timeout. The worker restarts
    /// the server only if it, too, saw no progress (CPU time, stream bytes) for `stall_timeout`.
    pub fn report_stall(&self) -> StallVerdict {
        let now = self.clock.now();
        let mut g = self.shared.lock();
        let v = g.policy.report_stall(now);
        g.metrics.handle_stall(v);
        g.observe(now);
        drop(g);
        self.shared.wake.notify_all();
        v
    }

    /// Registers a generation a client sent on `slot` (`register`): its id while ready.
    pub fn register(&self, slot: u32) -> Result<u64, Refusal> {
        self.register_owned(slot, None)
    }

    /// Registers a generation a client sent on `slot` for its `watch` connection `watch`
    /// (`register <slot> <watch>`): see [`Policy::register_owned`].
    pub fn register_owned(&self, slot: u32, watch: Option<u64>) -> Result<u64, Refusal> {
        let now = self.clock.now();
        let r = self.shared.lock().policy.register_owned(now, slot, watch);
        // Its stall deadline is the driving loop's next wake-up.
        self.shared.wake.notify_all();
        r
    }

    /// Stream progress of generation `id` (`progress`); `false` when it is not registered.
    pub fn progress(&self, id: u64, kind: ProgressKind) -> bool {
        let now = self.clock.now();
        self.shared.lock().policy.handle_progress(now, id, kind)
    }

    /// Generation `id` ended (`done`); `false` when it was not registered.
    pub fn done(&self, id: u64) -> bool {
        self.shared.lock().policy.unregister(id)
    }

    /// Reports that generation `id` stalled (`stall <id>`): judged by its own progress.
    pub fn report_stall_of(&self, id: u64) -> StallVerdict {
        let now = self.clock.now();
        let mut g = self.shared.lock();
        let v = g.policy.report_stall_of(now, id);
        g.metrics.handle_stall(v);
        g.observe(now);
        drop(g);
        self.shared.wake.notify_all();
        v
    }

    /// Opens a watch: its id and the queue its events arrive on, its `hello` (the id) and the
    /// current state first; `None` when [`MAX_WATCHERS`] are open. Call
    /// [`WorkerHandle::unwatch`] with the id when the connection ends.
    pub fn watch(&self) -> Option<(u64, Receiver<Push>)> {
        let mut g = self.shared.lock();
        // A closed watcher is found by a failed send; a ping is harmless to the live ones.
        g.push(WatchEvent::Ping);
        if g.watching >= MAX_WATCHERS {
            return None;
        }
        g.next_watch += 1;
        let id = g.next_watch;
        let (tx, rx) = mpsc::channel();
        let _ = tx.send(Push::Event(WatchEvent::Hello { watch: id }));
        let first = WatchEvent::State {
            state: g.policy.state(),
            spawns: g.spawns,
        };
        let _ = tx.send(Push::Event(first));
        g.watchers.push(tx);
        g.watching += 1;
        Some((id, rx))
    }

    /// Watch connection `id` ended: the generations it registered are forgotten, and when no
    /// watch is left, every registered generation (those registered without a watch too).
    pub fn unwatch(&self, id: u64) {
        let mut g = self.shared.lock();
        g.watching = g.watching.saturating_sub(1);
        g.policy.forget_generations_of(id);
        if g.watching == 0 {
            g.policy.forget_generations();
        }
    }

    /// Reports that stream bytes arrived (progress).
    pub fn note_stream_bytes(&self) {
        let now = self.clock.now();
        self.shared.lock().policy.handle_stream_bytes(now);
    }
}

/// One admitted request's registration. Dropping it deregisters the request.
#[derive(Debug)]
pub struct Work<C: SharedClock> {
    id: u64,
    rx: Receiver<FailReason>,
    handle: WorkerHandle<C>,
    failed: Option<FailReason>,
}

impl<C: SharedClock> Work<C> {
    /// This registration's id (unique per worker).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Why the worker failed this request, if it did (restart, death, stop).
    pub fn failure(&mut self) -> Option<FailReason> {
        if self.failed.is_none() {
            self.failed = self.rx.try_recv().ok();
        }
        self.failed
    }

    /// Like [`Work::failure`], waiting up to `timeout` for one.
    pub fn wait_failure(&mut self, timeout: Duration) -> Option<FailReason> {
        if self.failed.is_none() {
            // Timeout and a dropped worker both mean: no failure reported.
            self.failed = self.rx.recv_timeout(timeout).ok();
        }
        self.failed
    }

    /// Stream bytes arrived for this request.
    pub fn note_stream_bytes(&self) {
        self.handle.note_stream_bytes();
    }

    /// This request stalled; see [`WorkerHandle::report_stall`].
    pub fn report_stall(&self) -> StallVerdict {
        self.handle.report_stall()
    }
}

impl<C: SharedClock> Drop for Work<C> {
    fn drop(&mut self) {
        self.handle.shared.lock().inflight.remove(&self.id);
    }
}

/// Owns one server process and drives the policy.
#[derive(Debug)]
pub struct Worker<C: SharedClock> {
    config: Config,
    timings: Timings,
    spec: CommandSpec,
    port: u16,
    clock: C,
    shared: Arc<Shared>,
    process: Option<ServerProcess>,
    next_readiness_at: Duration,
    next_cpu_at: Duration,
    /// `GET /slots` is asked no earlier than this (once per CPU probe interval at most).
    next_slots_at: Duration,
    /// The last `/slots` probe failed (logged once, until one succeeds).
    slots_failing: bool,
    /// The router's pid and its children (the model instances) at the last tick.
    instances: Option<(u32, Vec<u32>)>,
    /// Until when readiness is probed at the startup interval: an instance just left.
    recheck_until: Duration,
    proc_root: PathBuf,
    logged_state: State,
    logged_restarts: u64,
    /// Killed children that had not exited by the end of the kill; reaped on later ticks.
    lingering: Vec<Lingering>,
    /// When `metrics_file` is written next.
    next_metrics_at: Duration,
    /// The RPC servers of the unit (with `[rpc]`).
    rpc: Option<RpcUnit>,
    next_rpc_probe_at: Duration,
}

impl<C: SharedClock> Worker<C> {
    /// A stopped worker for `config`, its server on `port`; call [`WorkerHandle::start`].
    pub fn new(config: Config, port: u16, clock: C) -> Result<Self, ConfigError> {
        config.validate_for_port(port)?;
        let timings = config.timings()?;
        let spec = config.command_spec(port);
        let rpc = config
            .rpc
            .as_ref()
            .map(|r| RpcUnit::new(r.clone(), config.log_file.clone()));
        Ok(Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    policy: Policy::new(timings.policy),
                    inflight: BTreeMap::new(),
                    next_work_id: 1,
                    pid: None,
                    pgid: None,
                    spawns: 0,
                    last_readiness: None,
                    last_model_exit: None,
                    last_server_exit: None,
                    metrics: Metrics::new(clock.now()),
                    rpc: rpc.as_ref().map_or(Vec::new(), |u| u.endpoints().to_vec()),
                    rpc_lost: None,
                    watchers: Vec::new(),
                    watching: 0,
                    next_watch: 0,
                    pushed_state: State::Stopped,
                }),
                wake: Condvar::new(),
                interrupt: AtomicBool::new(false),
                skip_grace: AtomicBool::new(false),
            }),
            config,
            timings,
            spec,
            port,
            clock,
            process: None,
            next_readiness_at: Duration::ZERO,
            next_cpu_at: Duration::ZERO,
            next_slots_at: Duration::ZERO,
            slots_failing: false,
            instances: None,
            recheck_until: Duration::ZERO,
            proc_root: PathBuf::from("/proc"),
            logged_state: State::Stopped,
            logged_restarts: 0,
            lingering: Vec::new(),
            next_metrics_at: Duration::ZERO,
            rpc,
            next_rpc_probe_at: Duration::ZERO,
        })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> WorkerHandle<C> {
        WorkerHandle {
            shared: self.shared.clone(),
            clock: self.clock.clone(),
            port: self.port,
            log_file: self.config.log_file.clone(),
            timings: self.timings,
        }
    }

    /// The server's process group id while one runs.
    pub fn pgid(&self) -> Option<i32> {
        self.process.as_ref().map(ServerProcess::pgid)
    }

    /// Killed children not reaped yet (in uninterruptible sleep when they were killed).
    pub fn lingering_pids(&self) -> Vec<u32> {
        self.lingering.iter().flat_map(Lingering::pids).collect()
    }

    /// One step: notice an exit, run due deadlines, probes and actions. Returns the clock time
    /// by which it wants the next tick.
    pub fn tick(&mut self) -> Duration {
        // Before the state is read: a stop from now on interrupts this tick's probe.
        self.shared.interrupt.store(false, Ordering::SeqCst);
        let now = self.clock.now();
        self.lingering.retain_mut(|l| !l.try_reap());
        // An RPC server first: the server aborts when its RPC peer dies, and the peer is the
        // cause to report.
        if let Some(lost) = self.rpc.as_mut().and_then(RpcUnit::try_exited) {
            eprintln!(
                "llama-worker: RPC server {} exited: {}; restarting the unit",
                lost.endpoint, lost.what
            );
            // The policy first: the state is `restarting` (and in-flight work told) before the
            // kill, which may wait out the server's grace period; its KillGroup kills the unit.
            let mut g = self.shared.lock();
            g.rpc_lost = Some(RpcLoss {
                at: now,
                endpoint: lost.endpoint.to_string(),
                what: lost.what,
                age: None,
            });
            g.policy.handle_rpc_exit(now);
            let unit_gone = !g.policy.child_alive();
            drop(g);
            if unit_gone {
                // Not the policy's unit (it already counts it as killed): reap it here, so the
                // same exit is not seen again on the next tick.
                self.kill_unit();
            }
        }
        if let Some(p) = &mut self.process {
            if let Some(exit) = p.try_exited() {
                let what = match exit {
                    Exit::Server(status) => {
                        eprintln!("llama-worker: server pid {} exited: {status}", p.pid());
                        status.to_string()
                    }
                    Exit::GuardGone => {
                        eprintln!(
                            "llama-worker: the guard of group {} is gone; restarting the server",
                            p.pgid()
                        );
                        "its group's guard was killed".to_string()
                    }
                };
                self.shared.lock().last_server_exit = Some(what);
                // Its children may outlive it in the group: clean them up too.
                self.kill();
                self.shared.lock().policy.handle_exit(now);
                // Then the rest of the unit (spawned again before the server) and which remote
                // endpoint went away, after the state says restarting: the probe may take up to
                // probe_timeout_s per endpoint.
                self.kill_unit();
                self.note_remote_loss(now);
            }
        }
        self.shared.lock().policy.handle_timeout(now);
        self.run_actions();
        self.probe_if_due();
        self.run_actions();
        self.log_state();
        self.write_metrics_if_due();
        let g = self.shared.lock();
        let mut next = self.clock.now() + MAX_IDLE;
        if self.config.metrics_file.is_some() {
            next = next.min(self.next_metrics_at);
        }
        if let Some(t) = g.policy.poll_timeout() {
            next = next.min(t);
        }
        if let Some(t) = g.policy.slots_probe_at() {
            next = next.min(t.max(self.next_slots_at));
        }
        if self.process.is_some() {
            next = next.min(self.next_readiness_at).min(self.next_cpu_at);
        }
        if g.policy.awaiting_endpoints() {
            next = next.min(self.next_rpc_probe_at);
        }
        next
    }

    /// Ticks until `done(state)` says so after a tick, sleeping in between (woken early by
    /// handle calls). Uses real time for the sleeps, so it is for a [`crate::SystemClock`].
    pub fn run_until(&mut self, mut done: impl FnMut(State) -> bool) {
        loop {
            let next = self.tick();
            let state = self.shared.lock().policy.state();
            // Called without the lock: `done` may use a handle (e.g. to stop).
            if done(state) {
                return;
            }
            let wait = next.saturating_sub(self.clock.now()).min(MAX_IDLE);
            if !wait.is_zero() {
                let g = self.shared.lock();
                let _ = self.shared.wake.wait_timeout(g, wait);
            }
        }
    }

    /// Stops and kills the server now (used on the way out).
    pub fn shutdown(&mut self) {
        self.handle().stop();
        self.tick();
    }

    fn run_actions(&mut self) {
        loop {
            let action = self.shared.lock().policy.poll_action();
            match action {
                None => return,
                Some(Action::NotifyInflight(reason)) => {
                    let mut g = self.shared.lock();
                    for tx in core::mem::take(&mut g.inflight).into_values() {
                        let _ = tx.send(reason);
                    }
                    // Pushed at once, before the kill: the clients end their requests now.
                    for (id, reason) in g.policy.take_failed_generations() {
                        g.push(WatchEvent::Failed { id, reason });
                    }
                    g.push_state();
                }
                Some(Action::KillGroup) => {
                    self.kill_unit();
                    let now = self.clock.now();
                    self.shared.lock().policy.handle_killed(now);
                }
                Some(Action::StartRpc) => self.start_rpc(),
                Some(Action::Spawn) => {
                    self.kill(); // never two servers
                    let now = self.clock.now();
                    let mut spec = self.spec.clone();
                    if let Some(u) = &self.rpc {
                        // Saving the prompt cache with RPC devices crashes the server
                        // (llama.cpp #26529): `--cache-ram 0` turns it off.
                        spec.args.extend([
                            "--rpc".to_string(),
                            rpc_arg(&u.addrs()),
                            "--cache-ram".to_string(),
                            "0".to_string(),
                        ]);
                    }
                    match ServerProcess::spawn(&spec) {
                        Ok(p) => {
                            eprintln!(
                                "llama-worker: spawned {} as pid {} (port {})",
                                self.spec.program,
                                p.pid(),
                                self.port
                            );
                            let mut g = self.shared.lock();
                            g.pid = Some(p.pid());
                            g.pgid = Some(p.pgid());
                            g.spawns += 1;
                            g.metrics.handle_spawned(now);
                            g.policy.handle_spawned(now);
                            self.process = Some(p);
                            self.next_readiness_at = now;
                            self.next_cpu_at = now;
                        }
                        Err(e) => {
                            eprintln!("llama-worker: cannot spawn {}: {e}", self.spec.program);
                            self.shared.lock().policy.handle_spawn_failed(now);
                        }
                    }
                }
            }
        }
    }

    /// Starts the local RPC servers of the unit (after killing any left).
    fn start_rpc(&mut self) {
        self.kill_unit();
        let Some(u) = &mut self.rpc else {
            // A policy with `await_endpoints` always has a unit: the config made both.
            self.shared
                .lock()
                .policy
                .handle_spawn_failed(self.clock.now());
            return;
        };
        let result = u.start(&self.shared.skip_grace);
        let now = self.clock.now();
        let mut g = self.shared.lock();
        g.rpc = u.endpoints().to_vec();
        match result {
            Ok(()) => {
                g.spawns += u.pgids().len() as u64;
                g.policy.handle_rpc_started(now);
                self.next_rpc_probe_at = now;
            }
            Err((what, e)) => {
                eprintln!("llama-worker: cannot spawn {what}: {e}");
                g.last_server_exit = Some(format!("could not spawn RPC server {what}: {e}"));
                g.policy.handle_spawn_failed(now);
            }
        }
    }

    /// After the server exited: a remote endpoint that no longer accepts connections is the
    /// likely cause (llama-server aborts when an RPC peer goes away); record it.
    fn note_remote_loss(&mut self, now: Duration) {
        let Some(u) = &mut self.rpc else { return };
        let timeout = self.timings.probe_timeout;
        let interrupt = &self.shared.interrupt;
        u.probe(true, timeout, &|| interrupt.load(Ordering::SeqCst));
        let mut g = self.shared.lock();
        g.rpc = u.endpoints().to_vec();
        if let Some(e) = u.first_down() {
            let what = match e.last_probe {
                Some(Err(err)) => err.as_str(),
                _ => "down",
            };
            eprintln!("llama-worker: RPC endpoint {e} is down ({what}) after the server exited");
            g.rpc_lost = Some(RpcLoss {
                at: now,
                endpoint: e.to_string(),
                what: format!("connect: {what}"),
                age: None,
            });
        }
    }

    /// Kills the server and the unit's RPC servers.
    fn kill_unit(&mut self) {
        self.kill();
        if let Some(u) = &mut self.rpc {
            let left = u.kill(self.timings.stop_grace, &self.shared.skip_grace);
            self.lingering.extend(left);
            self.shared.lock().rpc = u.endpoints().to_vec();
        }
    }

    fn kill(&mut self) {
        if let Some(p) = self.process.take() {
            let (pid, pgid) = (p.pid(), p.pgid());
            let r = p.kill_group(self.timings.stop_grace, &self.shared.skip_grace);
            eprintln!(
                "llama-worker: killed group {pgid} (server pid {pid}){} (survivors: {})",
                if r.escalated { " with SIGKILL" } else { "" },
                r.survivors
            );
            if let Some(l) = r.lingering {
                eprintln!(
                    "llama-worker: pids {:?} have not exited after SIGKILL (uninterruptible \
                     sleep?); reaping them later",
                    l.pids()
                );
                self.lingering.push(l);
            }
            let mut g = self.shared.lock();
            g.pid = None;
            g.pgid = None;
        }
    }

    /// While the policy waits for the RPC endpoints: connect to each, every startup probe
    /// interval.
    fn probe_endpoints_if_due(&mut self) {
        let now = self.clock.now();
        if now < self.next_rpc_probe_at || !self.shared.lock().policy.awaiting_endpoints() {
            return;
        }
        let Some(u) = &mut self.rpc else { return };
        let interrupt = &self.shared.interrupt;
        let found = u.probe(false, self.timings.probe_timeout, &|| {
            interrupt.load(Ordering::SeqCst)
        });
        let now = self.clock.now();
        let mut g = self.shared.lock();
        g.rpc = u.endpoints().to_vec();
        if let Some(found) = found {
            g.policy.handle_rpc_endpoints(now, found);
        }
        self.next_rpc_probe_at = now + self.timings.startup_probe_interval;
    }

    fn probe_if_due(&mut self) {
        self.probe_endpoints_if_due();
        let Some(pgid) = self.pgid() else { return };
        let now = self.clock.now();
        self.watch_instances(now);
        if now >= self.next_cpu_at {
            // The RPC servers do the model's work in groups of their own: their CPU time is
            // the unit's progress too.
            let rpc_ticks: u64 = self
                .rpc
                .iter()
                .flat_map(RpcUnit::pgids)
                .filter_map(|g| cpu::group_cpu_ticks(&self.proc_root, g))
                .sum();
            let ticks = cpu::group_cpu_ticks(&self.proc_root, pgid).map(|t| t + rpc_ticks);
            self.shared.lock().policy.handle_cpu_sample(now, ticks);
            self.next_cpu_at = now + self.timings.cpu_probe_interval;
        }
        self.probe_slots_if_due(now);
        let state = self.shared.lock().policy.state();
        if now < self.next_readiness_at
            || !matches!(state, State::Starting | State::Restarting | State::Ready)
        {
            return;
        }
        let (path, mut outcome) = self.probe_readiness();
        let mut model = None;
        if outcome == ProbeOutcome::Status(200) && !self.config.models.is_empty() {
            (outcome, model) = self.probe_models();
        }
        let path = if model.is_some() || path.is_empty() {
            MODELS_PATH.to_string()
        } else {
            path
        };
        let now = self.clock.now();
        if outcome == ProbeOutcome::Error(ProbeError::Cancelled) {
            // Not an answer: the stop that cancelled it is acted on next, nothing recorded.
            return;
        }
        let mut g = self.shared.lock();
        let answer = if outcome == ProbeOutcome::Status(200) && model.is_none() {
            Readiness::Ok
        } else {
            Readiness::Failed
        };
        if let Some((id, ModelState::Failed { exit_code })) = &model {
            let while_loading = state != State::Ready;
            eprintln!(
                "llama-worker: the router says model {id}'s instance exited with status \
                 {exit_code} ({}); restarting the server",
                if while_loading {
                    "while loading"
                } else {
                    "while serving"
                }
            );
            g.last_model_exit = Some(ModelExit {
                at: now,
                model: id.clone(),
                exit_code: *exit_code,
                while_loading,
            });
            g.policy.handle_model_exit(now);
        } else {
            g.policy.handle_readiness(now, answer);
        }
        g.last_readiness = Some(ReadinessRecord {
            at: now,
            path,
            outcome,
            model,
        });
        let interval = if g.policy.state() == State::Ready && now >= self.recheck_until {
            self.timings.probe_interval
        } else {
            self.timings.startup_probe_interval
        };
        self.next_readiness_at = now + interval;
    }

    /// When the policy wants each slot's decoded-token count (a streaming generation's progress
    /// is half `stall_timeout` old), asks `GET /slots`, at most once per CPU probe interval.
    /// A failed probe feeds nothing: the generation runs out as it would without it.
    fn probe_slots_if_due(&mut self, now: Duration) {
        let (due, deadline) = {
            let g = self.shared.lock();
            (g.policy.slots_probe_at(), g.policy.poll_timeout())
        };
        if due.is_none_or(|t| now < t) || now < self.next_slots_at {
            return;
        }
        self.next_slots_at = now + self.timings.cpu_probe_interval;
        // A hung server does not answer: the wait ends by the policy's next deadline (a
        // generation's stall), so the stall is not put off by the probe.
        let timeout = deadline.map_or(self.timings.probe_timeout, |d| {
            self.timings.probe_timeout.min(d.saturating_sub(now))
        });
        if timeout.is_zero() {
            return;
        }
        let got = probe::http_get_body::<MAX_SLOTS_BODY>(
            &self.config.host,
            self.port,
            &slots::path(&self.config.models),
            timeout,
            &|| self.shared.interrupt.load(Ordering::SeqCst),
        );
        let decoded = match got {
            Ok((200, body)) => slots::decoded(&body).map_err(|e| e.to_string()),
            Ok((code, _)) => Err(format!("GET {SLOTS_PATH}: status {code}")),
            Err(ProbeError::Cancelled) => return,
            Err(e) => Err(format!("GET {SLOTS_PATH}: {}", e.as_str())),
        };
        match decoded {
            Ok(counts) => {
                self.slots_failing = false;
                // The answer's own time: the probe may have waited for a decode step.
                let at = self.clock.now();
                self.shared.lock().policy.handle_slots_decoded(at, &counts);
            }
            Err(e) => {
                if !self.slots_failing {
                    eprintln!(
                        "llama-worker: {e}; a silent stream is judged without its slot's \
                         decoded-token count"
                    );
                }
                self.slots_failing = true;
            }
        }
    }

    /// With `models` required (router mode), looks at the router's children every tick: when
    /// one of them (a model instance) is gone, readiness is probed now and then at the startup
    /// interval for [`INSTANCE_RECHECK`], so the router's word on how it exited (`/models`:
    /// failed, with its status) is read within a probe interval of the death, not up to
    /// `probe_interval_s` later. The router reaps its instances, so only it can say the status.
    fn watch_instances(&mut self, now: Duration) {
        let Some(router) = self.process.as_ref().map(ServerProcess::pid) else {
            self.instances = None;
            return;
        };
        if self.config.models.is_empty() {
            return;
        }
        let Some(children) = cpu::children(&self.proc_root, router) else {
            return;
        };
        let gone = match &self.instances {
            Some((pid, before)) if *pid == router => before.iter().any(|c| !children.contains(c)),
            _ => false,
        };
        if gone {
            eprintln!(
                "llama-worker: a model instance of router pid {router} is gone; asking the \
                 router now"
            );
            self.next_readiness_at = now;
            self.recheck_until = now + INSTANCE_RECHECK;
        }
        self.instances = Some((router, children));
    }

    /// The router's model list: `Status(200)` with the first required model that is not
    /// loaded (failed ones first), or the probe's error. A body of another shape reads as
    /// `malformed`.
    fn probe_models(&self) -> (ProbeOutcome, Option<(String, ModelState)>) {
        let got = probe::http_get_body::<MAX_MODELS_BODY>(
            &self.config.host,
            self.port,
            MODELS_PATH,
            self.timings.probe_timeout,
            &|| self.shared.interrupt.load(Ordering::SeqCst),
        );
        match got {
            Err(e) => (ProbeOutcome::Error(e), None),
            Ok((200, body)) => match models::verdict(&body, &self.config.models) {
                Ok(ModelsVerdict::Loaded) => (ProbeOutcome::Status(200), None),
                Ok(ModelsVerdict::NotReady { model, state }) => {
                    (ProbeOutcome::Status(200), Some((model, state)))
                }
                Err(e) => {
                    eprintln!("llama-worker: {e}");
                    (ProbeOutcome::Error(ProbeError::Malformed), None)
                }
            },
            Ok((code, _)) => (ProbeOutcome::Status(code), None),
        }
    }

    /// Every readiness path in turn; the first that is not 200, or the last answer.
    fn probe_readiness(&self) -> (String, ProbeOutcome) {
        let mut last = (String::new(), ProbeOutcome::Error(ProbeError::Closed));
        for path in &self.config.readiness_paths {
            let outcome = match probe::http_get_status(
                &self.config.host,
                self.port,
                path,
                self.timings.probe_timeout,
                &|| self.shared.interrupt.load(Ordering::SeqCst),
            ) {
                Ok(code) => ProbeOutcome::Status(code),
                Err(e) => ProbeOutcome::Error(e),
            };
            last = (path.clone(), outcome);
            if outcome != ProbeOutcome::Status(200) {
                break;
            }
        }
        last
    }

    /// Writes `metrics_file` when its interval is up. A failed write is logged and tried again
    /// at the next interval; the worker keeps running.
    fn write_metrics_if_due(&mut self) {
        let Some(path) = &self.config.metrics_file else {
            return;
        };
        let now = self.clock.now();
        if now < self.next_metrics_at {
            return;
        }
        self.next_metrics_at = now + self.timings.metrics_interval;
        let text = self.handle().metrics();
        if let Err(e) = crate::metrics::write_atomically(path, &text) {
            eprintln!("llama-worker: metrics_file {}: {e}", path.display());
        }
    }

    fn log_state(&mut self) {
        let mut g = self.shared.lock();
        g.push_state();
        g.observe(self.clock.now());
        let total = g.policy.total_restarts();
        if total != self.logged_restarts {
            eprintln!(
                "llama-worker: restart {} in a row (at most {}): {}",
                g.policy.consecutive_restarts(self.clock.now()),
                self.timings.policy.max_restarts_per_window,
                g.policy.last_cause().map_or("", |c| c.as_str())
            );
            self.logged_restarts = total;
        }
        let state = g.policy.state();
        if state != self.logged_state {
            let cause = g.policy.last_cause().map_or("", |c| c.as_str());
            eprintln!(
                "llama-worker: {} -> {} {}",
                self.logged_state.as_str(),
                state.as_str(),
                if matches!(state, State::Restarting | State::Failed) {
                    cause
                } else {
                    ""
                }
            );
            self.logged_state = state;
        }
    }
}

impl<C: SharedClock> Drop for Worker<C> {
    /// Never leave a server behind, whatever happened to the worker.
    fn drop(&mut self) {
        self.kill_unit();
    }
}
