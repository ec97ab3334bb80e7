//! [`ResultStore`]: the daemon's finished results, kept until fetched once, for at most
//! `runner.result_ttl_s` and at most `runner.max_results` of them. Sans-IO: every entry point
//! takes `now`, evictions are drained with [`ResultStore::poll_evicted`] (so each is logged
//! once), and [`ResultStore::poll_timeout`] says when the next one falls due.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// Why a result left the store without being fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// It was kept for the whole `result_ttl_s`.
    Expired,
    /// A newer result came in with `max_results` already kept; the oldest went.
    OverCap,
}

impl EvictReason {
    /// `expired` or `over_cap`.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictReason::Expired => "expired",
            EvictReason::OverCap => "over_cap",
        }
    }
}

/// One result dropped unfetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// The request's id.
    pub id: u64,
    /// Why.
    pub reason: EvictReason,
}

/// What [`ResultStore::take`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    /// The result, now removed from the store.
    Done(T),
    /// The request is still running.
    Pending,
    /// Never submitted, already fetched, or evicted.
    NotFound,
}

/// Running requests and finished results; see the [module docs](self).
#[derive(Debug)]
pub struct ResultStore<T> {
    ttl: Duration,
    cap: usize,
    running: BTreeSet<u64>,
    done: BTreeMap<u64, (Duration, T)>,
    /// `(stored_at, id)` in the order stored; may name ids already fetched.
    order: VecDeque<(Duration, u64)>,
    evicted: VecDeque<Evicted>,
}

impl<T> ResultStore<T> {
    /// A store keeping each result for `ttl` and at most `cap` (at least 1) of them.
    pub fn new(ttl: Duration, cap: usize) -> Self {
        ResultStore {
            ttl,
            cap: cap.max(1),
            running: BTreeSet::new(),
            done: BTreeMap::new(),
            order: VecDeque::new(),
            evicted: VecDeque::new(),
        }
    }

    /// `id` started running.
    pub fn handle_started(&mut self, id: u64) {
        self.running.insert(id);
    }

    /// `id` ended with `value` at `now`; past the cap the oldest kept result is evicted.
    pub fn handle_stored(&mut self, id: u64, value: T, now: Duration) {
        self.expire(now);
        self.running.remove(&id);
        self.done.insert(id, (now, value));
        self.order.push_back((now, id));
        while self.done.len() > self.cap {
            let Some((_, old)) = self.order.pop_front() else {
                break;
            };
            if self.done.remove(&old).is_some() {
                self.evicted.push_back(Evicted {
                    id: old,
                    reason: EvictReason::OverCap,
                });
            }
        }
    }

    /// Removes and returns the result of `id` (expired ones first go, as [`Self::expire`]).
    pub fn take(&mut self, id: u64, now: Duration) -> Lookup<T> {
        self.expire(now);
        if self.running.contains(&id) {
            return Lookup::Pending;
        }
        match self.done.remove(&id) {
            Some((_, v)) => Lookup::Done(v),
            None => Lookup::NotFound,
        }
    }

    /// Whether `id` is running, or kept and not yet expired at `now`.
    pub fn knows(&self, id: u64, now: Duration) -> bool {
        self.running.contains(&id)
            || self
                .done
                .get(&id)
                .is_some_and(|(at, _)| now < at.saturating_add(self.ttl))
    }

    /// Evicts every result kept for `ttl` or longer at `now`.
    pub fn expire(&mut self, now: Duration) {
        while let Some(&(at, id)) = self.order.front() {
            let live = self.done.get(&id).is_some_and(|(s, _)| *s == at);
            if live && now < at.saturating_add(self.ttl) {
                break;
            }
            self.order.pop_front();
            if live {
                self.done.remove(&id);
                self.evicted.push_back(Evicted {
                    id,
                    reason: EvictReason::Expired,
                });
            }
        }
    }

    /// The next eviction not yet drained, each exactly once.
    pub fn poll_evicted(&mut self) -> Option<Evicted> {
        self.evicted.pop_front()
    }

    /// When the oldest kept result expires (`None`: nothing kept).
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.order
            .iter()
            .find(|(at, id)| self.done.get(id).is_some_and(|(s, _)| s == at))
            .map(|(at, _)| at.saturating_add(self.ttl))
    }

    /// The ids running now, in order.
    pub fn running(&self) -> impl Iterator<Item = u64> + '_ {
        self.running.iter().copied()
    }

    /// Results kept now.
    pub fn kept(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn drained(s: &mut ResultStore<&'static str>) -> Vec<Evicted> {
        std::iter::from_fn(|| s.poll_evicted()).collect()
    }

    #[test]
    fn a_result_is_pending_then_fetched_once() {
        let mut s = ResultStore::new(MS(1_000), 10);
        s.handle_started(1);
        assert_eq!(s.take(1, MS(0)), Lookup::Pending);
        s.handle_stored(1, "one", MS(5));
        assert_eq!(s.take(1, MS(6)), Lookup::Done("one"));
        assert_eq!(s.take(1, MS(7)), Lookup::NotFound);
        assert_eq!(s.take(99, MS(7)), Lookup::NotFound);
        assert!(drained(&mut s).is_empty());
    }

    #[test]
    fn a_result_expires_at_its_ttl_to_the_millisecond_and_is_reported_once() {
        let mut s = ResultStore::new(MS(1_000), 10);
        s.handle_started(1);
        s.handle_stored(1, "one", MS(500));
        assert_eq!(s.poll_timeout(), Some(MS(1_500)));
        s.expire(MS(1_499));
        assert!(s.knows(1, MS(1_499)));
        assert!(drained(&mut s).is_empty());
        assert!(!s.knows(1, MS(1_500)));
        assert_eq!(s.take(1, MS(1_500)), Lookup::NotFound);
        assert_eq!(
            drained(&mut s),
            vec![Evicted {
                id: 1,
                reason: EvictReason::Expired
            }]
        );
        s.expire(MS(9_000));
        assert!(drained(&mut s).is_empty());
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn past_the_cap_the_oldest_result_goes() {
        let mut s = ResultStore::new(MS(1_000), 2);
        for (id, at) in [(1, 0), (2, 10), (3, 20)] {
            s.handle_started(id);
            s.handle_stored(id, "r", MS(at));
        }
        assert_eq!(s.kept(), 2);
        assert_eq!(
            drained(&mut s),
            vec![Evicted {
                id: 1,
                reason: EvictReason::OverCap
            }]
        );
        assert_eq!(s.take(1, MS(30)), Lookup::NotFound);
        assert_eq!(s.poll_timeout(), Some(MS(1_010)));
    }

    #[test]
    fn a_fetched_result_is_never_reported_as_evicted() {
        let mut s = ResultStore::new(MS(100), 1);
        s.handle_stored(1, "a", MS(0));
        assert_eq!(s.take(1, MS(1)), Lookup::Done("a"));
        s.handle_stored(2, "b", MS(2));
        assert_eq!(s.poll_timeout(), Some(MS(102)));
        s.expire(MS(500));
        assert_eq!(
            drained(&mut s),
            vec![Evicted {
                id: 2,
                reason: EvictReason::Expired
            }]
        );
        assert_eq!(s.running().count(), 0);
    }
}
