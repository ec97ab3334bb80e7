//! The runner's inference hosts: one [`Host`] per `[[host]]` (or the one unnamed
//! host of a config without them), each with its own client (its inference socket), its own
//! llama-worker socket and `watch`, and the health thread that turns every host's watch into
//! host states and `host_lost` endings ([`crate::fleet::Health`], a sans-IO machine; this
//! thread is its IO loop: it reads the clock and sleeps until the machine's `poll_timeout`).
//!
//! Where a new request runs is [`crate::fleet::Placement`], kept in the runner's table; the
//! health thread feeds it each host's state. Nothing here decides anything.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use clock::Clock;

use super::health_queue::Input;
use super::kv::KvStore;
use super::watch::{Notice, Watch};
use super::{lock, RequestId, RunnerConfig, Shared};
use crate::fleet::{EndReason, Fleet, Health, HealthEvent, HostConfig, HostState};
use loopd_client::llama::Client;

/// One inference host, as the runner is given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// Its name (`[[host]] name`), in results, events, `status` and metrics.
    pub name: String,
    /// The Unix socket that reaches its llama-server (inferproxy, or a tunnel's end).
    pub infer_socket: PathBuf,
    /// The Unix socket that reaches its llama-worker; `None`: no worker (no watch, no stall
    /// reports, and the host is taken as ready).
    pub worker_socket: Option<PathBuf>,
    /// The server slots (`id_slot`) the runner owns there.
    pub slots: Vec<u32>,
    /// Its server's `--slot-save-path` as this process sees it: sessions' KV files are
    /// saved and restored there (`runner/kv.rs`); `None`: not on this host.
    pub kv_dir: Option<PathBuf>,
}

impl HostSpec {
    /// A client for this host: `base`'s config with this host's inference socket, on
    /// `base`'s clock and jitter.
    pub fn client(&self, base: &Client) -> Client {
        let mut config = base.config().clone();
        config.socket = self.infer_socket.clone();
        Client::with_time(config, base.shared_clock(), base.shared_jitter())
    }
}

impl From<&HostConfig> for HostSpec {
    fn from(h: &HostConfig) -> Self {
        HostSpec {
            name: h.name.clone(),
            infer_socket: h.infer_socket.clone(),
            worker_socket: Some(h.worker_socket.clone()),
            slots: h.slots.clone(),
            kv_dir: h.kv_dir.clone(),
        }
    }
}

/// A host as the runner drives it.
pub(super) struct Host {
    pub name: String,
    /// Its own client: the base config with this host's inference socket.
    pub client: Arc<Client>,
    /// The runner's settings with this host's worker socket.
    pub settings: RunnerConfig,
    pub watch: Option<Arc<Watch>>,
    /// Where its sessions' KV files are, when its server saves them.
    pub kv: Option<KvStore>,
}

impl Host {
    /// The host of `spec`, with its client on `base`'s config, clock and jitter (`base`
    /// itself, its slot gate shared with its other users, when both sockets are its own) and
    /// the runner's `settings` with the host's worker socket.
    pub fn new(base: &Arc<Client>, settings: &RunnerConfig, spec: &HostSpec) -> Host {
        let own = base.config().socket == spec.infer_socket
            && settings.worker_socket == spec.worker_socket;
        let settings = RunnerConfig {
            worker_socket: spec.worker_socket.clone(),
            ..settings.clone()
        };
        let client = if own {
            base.clone()
        } else {
            Arc::new(spec.client(base))
        };
        let kv = spec
            .kv_dir
            .clone()
            .map(|dir| KvStore::new(dir, &settings.kv, &client));
        Host {
            name: spec.name.clone(),
            client,
            settings,
            watch: None,
            kv,
        }
    }
}

/// The longest the health thread sleeps with nothing due: it then reads the clock again.
const IDLE: Duration = Duration::from_secs(1);

/// Starts the health thread over `fleet` (the hosts with a worker feed it); `None` when no
/// thread could be started (then no host becomes ready through its watch).
pub(super) fn start_health(
    shared: Weak<Shared>,
    fleet: &Fleet,
    clock: Arc<dyn Clock>,
    inputs: Receiver<Input>,
) -> Option<()> {
    let health = Health::new(fleet);
    std::thread::Builder::new()
        .name("loopd-health".into())
        .spawn(move || run(shared, health, &*clock, inputs))
        .ok()
        .map(|_| ())
}

fn run(shared: Weak<Shared>, mut health: Health, clock: &dyn Clock, inputs: Receiver<Input>) {
    loop {
        let now = clock.now();
        health.handle_timeout(now);
        while let Some(event) = health.poll_event() {
            let Some(s) = shared.upgrade() else { return };
            apply(&s, &mut health, now, event);
        }
        let wait = health
            .poll_timeout()
            .map_or(IDLE, |at| at.saturating_sub(now))
            .min(IDLE);
        let input = match inputs.recv_timeout(clock.wait_slice(wait)) {
            Ok(i) => i,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let now = clock.now();
        match input {
            Input::Connected(h) => health.handle_connected(now, h),
            Input::Line(h, e) => health.handle_watch_event(now, h, e),
            Input::Lost(h) => health.handle_connection_lost(now, h),
            Input::Placed(id, h) => health.handle_placed(now, id, h),
            Input::Sent(id) => health.handle_sent(now, id),
            Input::ConnectRefused(id) => health.handle_connect_refused(now, id),
            Input::Ended(id) => health.handle_ended(now, id),
            Input::Stop => return,
        }
    }
}

fn apply(s: &Shared, health: &mut Health, now: Duration, event: HealthEvent) {
    match event {
        HealthEvent::HostState { host, state } => {
            let name = s.hosts.get(host.0).map_or("?", |h| h.name.as_str());
            eprintln!("loopd: host {name} is {}", state.as_str());
            lock(&s.table).placement.handle_host_state(now, host, state);
            if state == HostState::Lost {
                if let Some(w) = s.hosts.get(host.0).and_then(|h| h.watch.as_ref()) {
                    w.renew();
                }
            }
        }
        HealthEvent::End { id, host, reason } => {
            let name = s.hosts.get(host.0).map_or("?", |h| h.name.as_str());
            let notice = match reason {
                EndReason::HostLost => Notice::HostLost(format!(
                    "host {name} was lost: its llama-worker watch was silent for 3 s, ended or \
                     could not be opened"
                )),
                // Pushed failures reach their request through the watch's own routes.
                EndReason::Worker(_) => return,
            };
            if let Some(to) = lock(&s.ends).get(&id) {
                let _ = to.send(notice);
            }
        }
        HealthEvent::Rehome { id, from } => {
            let placed = lock(&s.table).placement.rehome(now, id);
            match placed {
                Some(Ok(p)) => {
                    let from = s.hosts.get(from.0).map_or("?", |h| h.name.as_str());
                    let to = s.hosts.get(p.at.host.0).map_or("?", |h| h.name.as_str());
                    eprintln!("loopd: {id}: host {from} refused the connect; placed on {to}");
                    health.handle_placed(now, id, p.at.host);
                    if let Some(tx) = lock(&s.ends).get(&id) {
                        let _ = tx.send(Notice::Rehomed {
                            host: p.at.host.0,
                            slot: p.at.slot,
                        });
                    }
                }
                // No other host can take it: the machine ends it `host_lost`.
                Some(Err(_)) | None => health.handle_rehome_failed(now, id),
            }
        }
    }
}

/// Where a host lost is told to each request running there, by request id.
pub(super) type Ends = Mutex<HashMap<RequestId, Sender<Notice>>>;
