//! The session map of affinity placement: where a conversation last ran.
//!
//! A [`SessionKey`] names a conversation: the caller's `session` string, else a SHA-256 over
//! the BIOS, the caller's system message and the first user message (what the server's
//! prompt cache holds first). The map keeps at most `capacity` keys (default
//! [`SESSION_CAPACITY`]); adding one more forgets the least recently used. A key is forgotten
//! `ttl` (default [`SESSION_TTL`]) after its last use: at `used + ttl` exactly it is gone, one
//! millisecond earlier it is there. A `now` earlier than one already seen counts as no time
//! passing.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use llama_proto::hash::{HashError, Sha256};

use super::host::HostSlot;

/// How long a session is remembered after its last use: 10 minutes, longer than an operator's
/// pause between follow-ups and shorter than the server's prompt cache keeps a busy host's
/// prompts.
pub const SESSION_TTL: Duration = Duration::from_secs(600);

/// How many sessions are remembered: 1024 (32 bytes of key and a few words each).
pub const SESSION_CAPACITY: usize = 1024;

/// A conversation's identity for placement: 32 bytes of SHA-256.
///
/// Hashed input, so no two inputs share their bytes: a tag (`loopd-session-v1`), then for
/// an explicit session the byte `s` and the string; for a derived key the byte `d` and the
/// BIOS, the system message and the first user message, each as a presence byte (0 absent,
/// 1 present), its length as a little-endian `u64` and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionKey([u8; 32]);

const TAG: &[u8] = b"loopd-session-v1";

impl SessionKey {
    /// The key of the caller's `session`, if it gave one, else the derived key.
    pub fn of(
        session: Option<&str>,
        bios: &str,
        system: Option<&str>,
        first_user: Option<&str>,
    ) -> Result<SessionKey, HashError> {
        match session {
            Some(s) => SessionKey::explicit(s),
            None => SessionKey::derived(bios, system, first_user),
        }
    }

    /// The key of an explicit `session` string.
    pub fn explicit(session: &str) -> Result<SessionKey, HashError> {
        let mut h = Sha256::new();
        h.update(TAG)?;
        h.update(b"s")?;
        h.update(session.as_bytes())?;
        Ok(SessionKey(h.finish()?.0))
    }

    /// The key of a conversation without a `session`: its BIOS, system and first user message.
    pub fn derived(
        bios: &str,
        system: Option<&str>,
        first_user: Option<&str>,
    ) -> Result<SessionKey, HashError> {
        let mut h = Sha256::new();
        h.update(TAG)?;
        h.update(b"d")?;
        for part in [Some(bios), system, first_user] {
            match part {
                None => h.update(&[0])?,
                Some(p) => {
                    h.update(&[1])?;
                    h.update(&(p.len() as u64).to_le_bytes())?;
                    h.update(p.as_bytes())?;
                }
            }
        }
        Ok(SessionKey(h.finish()?.0))
    }

    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    at: HostSlot,
    used: Duration,
    seq: u64,
}

/// The LRU with a TTL. `order` maps a use's sequence number to its key, oldest first.
#[derive(Debug)]
pub(super) struct Sessions {
    ttl: Duration,
    capacity: usize,
    entries: HashMap<SessionKey, Entry>,
    order: BTreeMap<u64, SessionKey>,
    next_seq: u64,
    latest: Duration,
}

impl Sessions {
    pub(super) fn new(ttl: Duration, capacity: usize) -> Sessions {
        Sessions {
            ttl,
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            latest: Duration::ZERO,
        }
    }

    /// Where `key` last ran, if it is remembered and not expired at `now`.
    pub(super) fn get(&self, now: Duration, key: &SessionKey) -> Option<HostSlot> {
        let now = now.max(self.latest);
        self.entries
            .get(key)
            .filter(|e| !self.expired(e, now))
            .map(|e| e.at)
    }

    /// Records a use of `key` at `at`: it becomes the most recently used; one key past the
    /// capacity forgets the least recently used.
    pub(super) fn touch(&mut self, now: Duration, key: SessionKey, at: HostSlot) {
        self.expire(now);
        if self.capacity == 0 {
            return;
        }
        if let Some(old) = self.entries.remove(&key) {
            self.order.remove(&old.seq);
        }
        while self.entries.len() >= self.capacity {
            let Some((_, lru)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&lru);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key);
        let used = self.latest;
        self.entries.insert(key, Entry { at, used, seq });
    }

    /// Forgets every key expired at `now`.
    pub(super) fn expire(&mut self, now: Duration) {
        self.latest = self.latest.max(now);
        // Oldest use first: uses never go back in time, so the first live one ends the sweep.
        while let Some((&seq, key)) = self.order.first_key_value() {
            match self.entries.get(key) {
                Some(e) if !self.expired(e, self.latest) => break,
                _ => {
                    let key = *key;
                    self.order.remove(&seq);
                    self.entries.remove(&key);
                }
            }
        }
    }

    /// When the oldest remembered key expires.
    pub(super) fn next_expiry(&self) -> Option<Duration> {
        let (_, key) = self.order.first_key_value()?;
        self.entries.get(key)?.used.checked_add(self.ttl)
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    fn expired(&self, e: &Entry, now: Duration) -> bool {
        e.used.checked_add(self.ttl).is_some_and(|end| now >= end)
    }
}
