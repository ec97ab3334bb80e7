//! Where a request runs: a (host, slot) picked once, when it is submitted, and kept for its
//! life, as a sans-IO machine (time is `now`).
//!
//! - [`Placement::place`] of a running request answers its seat unchanged.
//! - [`PlacementPolicy::Affinity`] (the default): a request with a [`SessionKey`] whose
//!   session is remembered goes back to the host it last ran on when that host is ready with
//!   a free owned slot (its last slot if free, else the least recently used free one);
//!   otherwise, or without a key, to the ready host with the most free owned slots (ties:
//!   config order), least recently used free slot. The session then points at the new seat.
//! - Least recently used: the free slot whose last request was placed or ended longest ago
//!   (ties: `slots` order), so a new session overwrites the oldest prompt a server holds,
//!   not the one the last session left on the first slot.
//! - [`PlacementPolicy::RoundRobin`] ignores sessions: the next ready host with a free slot
//!   after the one chosen last, in config order. It exists to measure affinity against.
//! - None placed: `NO_SLOT_AVAILABLE` when some host is ready (all its slots busy), else the
//!   code of the most hopeful host: `WORKER_NOT_READY` (starting, restarting, unknown,
//!   lost), then `WORKER_FAILED`, then `WORKER_STOPPED`. A refusal changes nothing.
//! - Only a host in state ready (fed by [`Placement::handle_host_state`], from the health
//!   machine) is given requests; every host starts unknown, not ready.
//! - [`Placement::release`] frees the seat; [`Placement::rehome`] moves a request whose
//!   generation was never sent to another host (same rules, its own host excluded).
//! - A session is used when its request is placed, rehomed or released; the session map's
//!   expiry is [`Placement::poll_timeout`]. Ids and hosts it does not know are ignored.
//! - Each slot remembers the key of the last request placed on it: the conversation its
//!   server's KV holds. [`Placement::resident`] says a request's slot held its own key already
//!   (so its KV file need not be restored); a host that leaves ready (its server restarting,
//!   lost) forgets what its slots held.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use super::host::{Fleet, HostId, HostSlot, HostState};
use super::request::{RequestId, SubmitError};
use super::session::{SessionKey, Sessions, SESSION_CAPACITY, SESSION_TTL};

/// How a new request's host is chosen (`placement` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// Back to the session's last host, else the host with the most free slots.
    #[default]
    Affinity,
    /// Hosts in turn, sessions ignored: the baseline affinity is measured against.
    RoundRobin,
}

impl PlacementPolicy {
    /// `affinity` or `round_robin`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementPolicy::Affinity => "affinity",
            PlacementPolicy::RoundRobin => "round_robin",
        }
    }
}

/// The policy and the session map's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementConfig {
    /// The policy.
    pub policy: PlacementPolicy,
    /// How long a session is remembered after its last use ([`SESSION_TTL`]).
    pub session_ttl: Duration,
    /// How many sessions are remembered ([`SESSION_CAPACITY`]); 0 remembers none.
    pub session_capacity: usize,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            policy: PlacementPolicy::Affinity,
            session_ttl: SESSION_TTL,
            session_capacity: SESSION_CAPACITY,
        }
    }
}

/// Which rule chose a seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacedBy {
    /// The session's last host (affinity).
    Session,
    /// The ready host with the most free slots.
    MostFree,
    /// The next host in turn.
    RoundRobin,
    /// The request was running already: its seat is unchanged.
    Running,
}

impl PlacedBy {
    /// `session`, `most_free`, `round_robin` or `running`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlacedBy::Session => "session",
            PlacedBy::MostFree => "most_free",
            PlacedBy::RoundRobin => "round_robin",
            PlacedBy::Running => "running",
        }
    }
}

/// A seat given, and why there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The seat.
    pub at: HostSlot,
    /// The rule.
    pub by: PlacedBy,
}

#[derive(Debug)]
struct HostTable {
    state: HostState,
    slots: Vec<u32>,
    holders: Vec<Option<RequestId>>,
    /// When each slot was last taken or freed.
    used: Vec<Duration>,
    /// The session key of each slot's last request, while the host stayed ready.
    resident: Vec<Option<SessionKey>>,
}

impl HostTable {
    fn free(&self) -> usize {
        self.holders.iter().filter(|h| h.is_none()).count()
    }

    fn free_slot(&self, prefer: Option<u32>) -> Option<u32> {
        let free = |s: &u32| {
            let i = self.slots.iter().position(|x| x == s);
            i.is_some_and(|i| self.holders[i].is_none())
        };
        // min_by_key keeps the first minimum: ties go in `slots` order.
        prefer.filter(free).or_else(|| {
            self.slots
                .iter()
                .zip(&self.used)
                .filter(|(s, _)| free(s))
                .min_by_key(|(_, used)| **used)
                .map(|(s, _)| *s)
        })
    }

    fn set(&mut self, now: Duration, slot: u32, holder: Option<RequestId>) {
        if let Some(i) = self.slots.iter().position(|&x| x == slot) {
            self.holders[i] = holder;
            self.used[i] = self.used[i].max(now);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Running {
    at: HostSlot,
    key: Option<SessionKey>,
    /// The slot's last request before this one had the same key.
    resident: bool,
}

/// The placement machine over one [`Fleet`]'s owned slots.
#[derive(Debug)]
pub struct Placement {
    policy: PlacementPolicy,
    hosts: Vec<HostTable>,
    running: HashMap<RequestId, Running>,
    sessions: Sessions,
    next_turn: usize,
}

impl Placement {
    /// Every host unknown (not ready), every slot free, no session.
    pub fn new(fleet: &Fleet, cfg: PlacementConfig) -> Placement {
        let hosts = fleet
            .hosts()
            .iter()
            .map(|h| HostTable {
                state: HostState::Unknown,
                slots: h.slots.clone(),
                holders: vec![None; h.slots.len()],
                used: vec![Duration::ZERO; h.slots.len()],
                resident: vec![None; h.slots.len()],
            })
            .collect();
        Placement {
            policy: cfg.policy,
            hosts,
            running: HashMap::new(),
            sessions: Sessions::new(cfg.session_ttl, cfg.session_capacity),
            next_turn: 0,
        }
    }

    /// The host's state changed. Its running requests keep their seats (ending them is the
    /// health machine's word); only new ones follow the state.
    pub fn handle_host_state(&mut self, now: Duration, host: HostId, state: HostState) {
        self.sessions.expire(now);
        if let Some(h) = self.hosts.get_mut(host.0) {
            h.state = state;
            // A server that is not ready may be restarting: what its slots held is gone.
            if !state.is_ready() {
                h.resident.fill(None);
            }
        }
    }

    /// Gives request `id` a seat, or refuses (the module docs say how).
    pub fn place(
        &mut self,
        now: Duration,
        id: RequestId,
        key: Option<SessionKey>,
    ) -> Result<Placed, SubmitError> {
        self.place_avoiding(now, id, key, &[])
    }

    /// [`Placement::place`] on a host not in `avoid` (their workers refused just now, or did
    /// not answer): the refusal, if none is left, is the code of the hosts not avoided.
    pub fn place_avoiding(
        &mut self,
        now: Duration,
        id: RequestId,
        key: Option<SessionKey>,
        avoid: &[HostId],
    ) -> Result<Placed, SubmitError> {
        self.sessions.expire(now);
        if let Some(r) = self.running.get(&id) {
            return Ok(Placed {
                at: r.at,
                by: PlacedBy::Running,
            });
        }
        let placed = self.choose(now, key, avoid)?;
        self.take(now, id, key, placed.at);
        Ok(placed)
    }

    /// Moves running request `id` to a host other than its own (its generation was never
    /// sent); `None` when `id` is not running. A refusal leaves it where it was.
    pub fn rehome(&mut self, now: Duration, id: RequestId) -> Option<Result<Placed, SubmitError>> {
        self.sessions.expire(now);
        let r = *self.running.get(&id)?;
        let placed = match self.choose(now, r.key, &[r.at.host]) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        self.free(now, r.at);
        self.take(now, id, r.key, placed.at);
        Some(Ok(placed))
    }

    /// Frees request `id`'s seat (its result is stored); the seat it had, if it was running.
    pub fn release(&mut self, now: Duration, id: RequestId) -> Option<HostSlot> {
        self.sessions.expire(now);
        let r = self.running.remove(&id)?;
        self.free(now, r.at);
        if let (Some(key), PlacementPolicy::Affinity) = (r.key, self.policy) {
            self.sessions.touch(now, key, r.at);
        }
        Some(r.at)
    }

    /// The running request `from` is now called `to` (a seat held under a provisional id
    /// until the caller named the request); its seat and session are unchanged. Nothing
    /// happens when `from` is not running or `to` is.
    pub fn rename(&mut self, from: RequestId, to: RequestId) {
        if self.running.contains_key(&to) {
            return;
        }
        let Some(r) = self.running.remove(&from) else {
            return;
        };
        if let Some(h) = self.hosts.get_mut(r.at.host.0) {
            if let Some(i) = h.slots.iter().position(|&x| x == r.at.slot) {
                h.holders[i] = Some(to);
            }
        }
        self.running.insert(to, r);
    }

    /// How many slots the host has here (its `slots`).
    pub fn slots_of(&self, host: HostId) -> usize {
        self.hosts.get(host.0).map_or(0, |h| h.slots.len())
    }

    /// Forgets the sessions expired at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.sessions.expire(now);
    }

    /// When the next session expires.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.sessions.next_expiry()
    }

    /// Whether running request `id` has a key and its slot's last request before it had
    /// the same one, with the host ready since: its server's KV holds the conversation
    /// (unless the server lost it without placement hearing of it). `false` when `id` is
    /// not running.
    pub fn resident(&self, id: RequestId) -> bool {
        self.running.get(&id).is_some_and(|r| r.resident)
    }

    /// Request `id`'s seat, if it is running.
    pub fn seat(&self, id: RequestId) -> Option<HostSlot> {
        self.running.get(&id).map(|r| r.at)
    }

    /// Every running request and its seat, in no order.
    pub fn running(&self) -> impl Iterator<Item = (RequestId, HostSlot)> + '_ {
        self.running.iter().map(|(&id, r)| (id, r.at))
    }

    /// The host's owned slots that hold no request.
    pub fn free_slots(&self, host: HostId) -> Option<usize> {
        self.hosts.get(host.0).map(HostTable::free)
    }

    /// The host's state as placement last heard it.
    pub fn host_state(&self, host: HostId) -> Option<HostState> {
        self.hosts.get(host.0).map(|h| h.state)
    }

    /// The host session `key` would go back to at `now` (if ready with a free slot then).
    pub fn session_host(&self, now: Duration, key: &SessionKey) -> Option<HostId> {
        self.sessions.get(now, key).map(|at| at.host)
    }

    /// How many sessions are remembered (expired ones until the next `handle_*`).
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    fn choose(
        &mut self,
        now: Duration,
        key: Option<SessionKey>,
        exclude: &[HostId],
    ) -> Result<Placed, SubmitError> {
        let usable = |i: usize, h: &HostTable| {
            !exclude.contains(&HostId(i)) && h.state.is_ready() && h.free() > 0
        };
        let found = match self.policy {
            PlacementPolicy::Affinity => {
                let last = key.and_then(|k| self.sessions.get(now, &k));
                match last.filter(|at| {
                    self.hosts
                        .get(at.host.0)
                        .is_some_and(|h| usable(at.host.0, h))
                }) {
                    Some(at) => Some((at.host.0, Some(at.slot), PlacedBy::Session)),
                    None => self
                        .hosts
                        .iter()
                        .enumerate()
                        .filter(|(i, h)| usable(*i, h))
                        // max_by_key keeps the last maximum; reversed, the first in config order.
                        .rev()
                        .max_by_key(|(_, h)| h.free())
                        .map(|(i, _)| (i, None, PlacedBy::MostFree)),
                }
            }
            PlacementPolicy::RoundRobin => {
                let n = self.hosts.len();
                (0..n)
                    .map(|k| (self.next_turn + k) % n)
                    .find(|&i| usable(i, &self.hosts[i]))
                    .map(|i| (i, None, PlacedBy::RoundRobin))
            }
        };
        let Some((i, prefer, by)) = found else {
            return Err(self.refusal(exclude));
        };
        let slot = self.hosts[i]
            .free_slot(prefer)
            .ok_or(SubmitError::NoSlotAvailable)?;
        if by == PlacedBy::RoundRobin {
            self.next_turn = (i + 1) % self.hosts.len();
        }
        Ok(Placed {
            at: HostSlot {
                host: HostId(i),
                slot,
            },
            by,
        })
    }

    fn refusal(&self, exclude: &[HostId]) -> SubmitError {
        let rank = |e: &SubmitError| match e {
            SubmitError::WorkerNotReady => 0,
            SubmitError::WorkerFailed => 1,
            _ => 2,
        };
        let mut best = None;
        for (i, h) in self.hosts.iter().enumerate() {
            if exclude.contains(&HostId(i)) {
                continue;
            }
            match h.state.refusal() {
                // Ready with every slot busy.
                None => return SubmitError::NoSlotAvailable,
                Some(e) if best.is_none_or(|b| rank(&e) < rank(&b)) => best = Some(e),
                Some(_) => {}
            }
        }
        // No other host at all (a rehome on a fleet of one): no slot for it.
        best.unwrap_or(SubmitError::NoSlotAvailable)
    }

    fn take(&mut self, now: Duration, id: RequestId, key: Option<SessionKey>, at: HostSlot) {
        let mut resident = false;
        if let Some(h) = self.hosts.get_mut(at.host.0) {
            h.set(now, at.slot, Some(id));
            if let Some(i) = h.slots.iter().position(|&x| x == at.slot) {
                resident = key.is_some() && h.resident[i] == key;
                h.resident[i] = key;
            }
        }
        self.running.insert(id, Running { at, key, resident });
        if let (Some(key), PlacementPolicy::Affinity) = (key, self.policy) {
            self.sessions.touch(now, key, at);
        }
    }

    fn free(&mut self, now: Duration, at: HostSlot) {
        if let Some(h) = self.hosts.get_mut(at.host.0) {
            h.set(now, at.slot, None);
        }
    }
}
