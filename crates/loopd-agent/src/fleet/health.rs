//! Each host's health, from its own llama-worker `watch`, as a sans-IO machine (time is
//! `now`), and what it means for the requests running there.
//!
//! - A host is ready only on the word of a `state` line saying `ready` on a watch opened
//!   ([`Health::handle_connected`]) since it was last lost. Every host starts unknown.
//! - Lost (`host_lost`): a watch with no line for [`WATCH_SILENCE`] (lost at exactly 3 s after
//!   the last line, or after the connect when no line came; not at 2,999 ms), a watch that
//!   ended or could not be opened ([`Health::handle_connection_lost`]), or an inference socket
//!   that refused a connect ([`Health::handle_connect_refused`]). Every request running there
//!   ends with `host_lost`, the watch counts as closed (the daemon closes and reopens it),
//!   and lines arriving before the next [`Health::handle_connected`] are ignored.
//! - A pushed `failed <id> <reason>` ends the request on *that* host whose registered
//!   generation is `id` with the worker's reason; generation ids of other hosts are not
//!   looked at (each worker numbers its own). An id nobody holds is dropped.
//! - A generation whose connect was refused was never sent: its request is rehomed (placed
//!   once more elsewhere, [`HealthEvent::Rehome`]) once; refused again before a generation
//!   of it was sent ([`Health::handle_sent`]), it ends with `host_lost`.
//! - Events come out of [`Health::poll_event`] in the order decided: a host's new state,
//!   then the requests it ends in id order, then the refused request's own decision. A host
//!   state is reported only when it changes. Ids and hosts it does not know are ignored.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use worker_proto::{FailReason, WatchEvent};

use super::host::{Fleet, HostId, HostState};
use super::request::RequestId;

/// A watch this long without a line means its host is lost. llama-worker pings every second,
/// so three pings in a row were missed.
pub const WATCH_SILENCE: Duration = Duration::from_secs(3);

/// Why a request on a host was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The host was lost (`host_lost`).
    HostLost,
    /// The host's worker pushed a failure (`worker_restarted`, `server_died`, ...).
    Worker(FailReason),
}

impl EndReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::HostLost => "host_lost",
            EndReason::Worker(r) => r.as_str(),
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the daemon must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthEvent {
    /// The host's state changed (tell placement; on `Lost`, close and reopen its watch).
    HostState {
        /// The host.
        host: HostId,
        /// Its new state.
        state: HostState,
    },
    /// End the request with `reason`, its partial output kept; no retry.
    End {
        /// The request.
        id: RequestId,
        /// The host it ran on.
        host: HostId,
        /// Why.
        reason: EndReason,
    },
    /// Place the request once more, on another host (a cold prefill there); report it as
    /// `rehomed`. Then [`Health::handle_placed`], or [`Health::handle_rehome_failed`].
    Rehome {
        /// The request.
        id: RequestId,
        /// The host that refused it.
        from: HostId,
    },
}

#[derive(Debug, Clone, Copy)]
struct HostWatch {
    state: HostState,
    /// When the open watch last gave a line (or opened); `None`: no watch open.
    heard: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// `None` while it is being rehomed.
    host: Option<HostId>,
    /// The last host it was on.
    last: HostId,
    generation: Option<u64>,
    /// Rehomed since its last generation was sent.
    rehomed: bool,
}

/// The health machine over one [`Fleet`]'s hosts.
#[derive(Debug)]
pub struct Health {
    hosts: Vec<HostWatch>,
    requests: BTreeMap<RequestId, Tracked>,
    events: VecDeque<HealthEvent>,
}

impl Health {
    /// Every host unknown with no watch open, no request.
    pub fn new(fleet: &Fleet) -> Health {
        let host = HostWatch {
            state: HostState::Unknown,
            heard: None,
        };
        Health {
            hosts: vec![host; fleet.hosts().len()],
            requests: BTreeMap::new(),
            events: VecDeque::new(),
        }
    }

    /// A watch to `host` opened: its silence is counted from `now`.
    pub fn handle_connected(&mut self, now: Duration, host: HostId) {
        self.handle_timeout(now);
        if let Some(h) = self.hosts.get_mut(host.0) {
            h.heard = Some(now);
        }
    }

    /// A line from `host`'s open watch.
    pub fn handle_watch_event(&mut self, now: Duration, host: HostId, event: WatchEvent) {
        self.handle_timeout(now);
        let Some(h) = self.hosts.get_mut(host.0) else {
            return;
        };
        if h.heard.is_none() {
            return;
        }
        h.heard = Some(now);
        match event {
            WatchEvent::Ping | WatchEvent::Hello { .. } => {}
            WatchEvent::State { state, .. } => self.set_state(host, HostState::Worker(state)),
            WatchEvent::Failed { id, reason } => {
                let holder = self.requests.iter().find_map(|(&rid, t)| {
                    (t.host == Some(host) && t.generation == Some(id)).then_some(rid)
                });
                if let Some(rid) = holder {
                    self.requests.remove(&rid);
                    self.events.push_back(HealthEvent::End {
                        id: rid,
                        host,
                        reason: EndReason::Worker(reason),
                    });
                }
            }
        }
    }

    /// `host`'s watch ended, failed, or could not be opened.
    pub fn handle_connection_lost(&mut self, now: Duration, host: HostId) {
        self.handle_timeout(now);
        self.lose(host);
    }

    /// Request `id` now runs on `host` (placed, or rehomed there).
    pub fn handle_placed(&mut self, now: Duration, id: RequestId, host: HostId) {
        self.handle_timeout(now);
        if host.0 >= self.hosts.len() {
            return;
        }
        let t = self.requests.entry(id).or_insert(Tracked {
            host: None,
            last: host,
            generation: None,
            rehomed: false,
        });
        t.host = Some(host);
        t.last = host;
    }

    /// Request `id`'s current generation is registered with its host's worker as `generation`.
    pub fn handle_registered(&mut self, now: Duration, id: RequestId, generation: u64) {
        self.handle_timeout(now);
        if let Some(t) = self.requests.get_mut(&id) {
            t.generation = Some(generation);
        }
    }

    /// Request `id`'s current generation went out: its next one may be rehomed again.
    pub fn handle_sent(&mut self, now: Duration, id: RequestId) {
        self.handle_timeout(now);
        if let Some(t) = self.requests.get_mut(&id) {
            t.rehomed = false;
        }
    }

    /// Request `id`'s generation ended (its registration is gone).
    pub fn handle_generation_done(&mut self, now: Duration, id: RequestId) {
        self.handle_timeout(now);
        if let Some(t) = self.requests.get_mut(&id) {
            t.generation = None;
        }
    }

    /// Request `id`'s connect to its host's inference socket was refused (nothing sent): the
    /// host is lost, and `id` is rehomed or, if rehomed already, ended.
    pub fn handle_connect_refused(&mut self, now: Duration, id: RequestId) {
        self.handle_timeout(now);
        let Some(t) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(host) = t.host else {
            return;
        };
        let decision = if t.rehomed {
            self.requests.remove(&id);
            HealthEvent::End {
                id,
                host,
                reason: EndReason::HostLost,
            }
        } else {
            t.host = None;
            t.generation = None;
            t.rehomed = true;
            HealthEvent::Rehome { id, from: host }
        };
        self.lose(host);
        self.events.push_back(decision);
    }

    /// No other host could take request `id` after a [`HealthEvent::Rehome`]: it ends.
    pub fn handle_rehome_failed(&mut self, now: Duration, id: RequestId) {
        self.handle_timeout(now);
        if self.requests.get(&id).is_some_and(|t| t.host.is_none()) {
            if let Some(t) = self.requests.remove(&id) {
                self.events.push_back(HealthEvent::End {
                    id,
                    host: t.last,
                    reason: EndReason::HostLost,
                });
            }
        }
    }

    /// Request `id` ended (for any reason): it is forgotten.
    pub fn handle_ended(&mut self, now: Duration, id: RequestId) {
        self.handle_timeout(now);
        self.requests.remove(&id);
    }

    /// Loses every host whose watch has been silent for [`WATCH_SILENCE`] at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        for i in 0..self.hosts.len() {
            if self.hosts[i]
                .heard
                .is_some_and(|t| now >= t.saturating_add(WATCH_SILENCE))
            {
                self.lose(HostId(i));
            }
        }
    }

    /// When the earliest open watch reaches its silence limit.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.hosts
            .iter()
            .filter_map(|h| h.heard)
            .min()
            .map(|t| t.saturating_add(WATCH_SILENCE))
    }

    /// The next thing to do.
    pub fn poll_event(&mut self) -> Option<HealthEvent> {
        self.events.pop_front()
    }

    /// The host's state.
    pub fn state(&self, host: HostId) -> Option<HostState> {
        self.hosts.get(host.0).map(|h| h.state)
    }

    /// The host request `id` runs on (`None` while rehomed or when not running).
    pub fn host_of(&self, id: RequestId) -> Option<HostId> {
        self.requests.get(&id).and_then(|t| t.host)
    }

    fn set_state(&mut self, host: HostId, state: HostState) {
        if let Some(h) = self.hosts.get_mut(host.0) {
            if h.state != state {
                h.state = state;
                self.events
                    .push_back(HealthEvent::HostState { host, state });
            }
        }
    }

    fn lose(&mut self, host: HostId) {
        let Some(h) = self.hosts.get_mut(host.0) else {
            return;
        };
        h.heard = None;
        self.set_state(host, HostState::Lost);
        let ended: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, t)| t.host == Some(host))
            .map(|(&id, _)| id)
            .collect();
        for id in ended {
            self.requests.remove(&id);
            self.events.push_back(HealthEvent::End {
                id,
                host,
                reason: EndReason::HostLost,
            });
        }
    }
}
