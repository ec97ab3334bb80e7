//! The slot gate: one request in flight per slot inside loopd, first come first served, with a
//! bounded queue.
//!
//! [`SlotGate::acquire`] returns a [`SlotPermit`] whose drop lets the next waiter in, so the
//! slot is released on every path: success, error, and a panic unwinding through the caller.
//! A full queue answers [`InferError::Busy`] at once; a waiter gives up after
//! `limits.busy_wait_ms` ([`InferError::WaitTimeout`]) or when its request is cancelled.
//!
//! A holder that closed its connection while the server may still be generating marks its
//! permit [`abandon`](SlotPermit::abandon)ed; the next permit for that slot says so
//! ([`SlotPermit::after_abandoned`]), and its holder waits for `/slots` to say the slot is idle
//! before sending (a decision of [`ChatCall`](super::ChatCall)'s).

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{Cancel, ChatEvent, InferError};
use crate::clock::Clock;

/// One slot's state: whether a request holds it, and the tickets waiting, oldest first.
#[derive(Debug, Default)]
struct Slot {
    held: bool,
    // The last holder abandoned the slot; the next permit takes this flag.
    abandoned: bool,
    queue: VecDeque<u64>,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<u32, Slot>,
    next_ticket: u64,
}

/// The gate shared by every request of one client.
#[derive(Debug)]
pub struct SlotGate {
    queue_cap: usize,
    state: Mutex<State>,
    changed: Condvar,
}

/// Holds one slot; dropping it lets the next queued request in.
#[derive(Debug)]
pub struct SlotPermit<'a> {
    gate: &'a SlotGate,
    slot: u32,
    after_abandoned: bool,
    abandoned: bool,
}

impl SlotGate {
    /// A gate letting at most `queue_cap` requests per slot wait behind the one in flight.
    pub fn new(queue_cap: usize) -> Self {
        SlotGate {
            queue_cap,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    // A panic elsewhere while the lock was held leaves the state consistent (every change is
    // one statement), so a poisoned lock is used as is rather than wedging every slot.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `slot`, waiting behind earlier requests for at most `wait` of `clock`'s time (then
    /// `WaitTimeout`, the request leaving the queue) and looking at `cancel` at least every
    /// `tick` (then `Cancelled`). While waiting, emits `Queued { ahead }` (the requests in front, the one in
    /// flight included) each time that number changes. `Busy` if `queue_cap` requests already
    /// wait.
    pub fn acquire(
        &self,
        slot: u32,
        wait: Duration,
        tick: Duration,
        cancel: &Cancel,
        clock: &dyn Clock,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<SlotPermit<'_>, InferError> {
        let deadline = clock.now().checked_add(wait);
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let s = state.slots.entry(slot).or_default();
        if !s.held && s.queue.is_empty() {
            s.held = true;
            let after_abandoned = std::mem::take(&mut s.abandoned);
            return Ok(SlotPermit::new(self, slot, after_abandoned));
        }
        if s.queue.len() >= self.queue_cap {
            return Err(InferError::Busy);
        }
        s.queue.push_back(ticket);
        // Leaves the queue on every way out but success: timeout, cancel, a panicking callback.
        let guard = TicketGuard {
            gate: self,
            slot,
            ticket,
        };
        let mut reported = None;
        loop {
            let s = state
                .slots
                .get_mut(&slot)
                .expect("a queued slot is never removed");
            let position = s
                .queue
                .iter()
                .position(|&t| t == ticket)
                .expect("own ticket");
            if position == 0 && !s.held {
                s.queue.pop_front();
                s.held = true;
                let after_abandoned = std::mem::take(&mut s.abandoned);
                std::mem::forget(guard);
                return Ok(SlotPermit::new(self, slot, after_abandoned));
            }
            let ahead = position + usize::from(s.held);
            if reported != Some(ahead) {
                reported = Some(ahead);
                // The callback may take its time or even panic; it must not do so under the lock.
                drop(state);
                on_event(&ChatEvent::Queued { ahead });
                state = self.lock();
                continue;
            }
            if cancel.is_cancelled() {
                drop(state);
                return Err(InferError::Cancelled);
            }
            let left = deadline.map_or(Duration::MAX, |d| d.saturating_sub(clock.now()));
            if left.is_zero() {
                drop(state);
                return Err(InferError::WaitTimeout);
            }
            state = self
                .changed
                .wait_timeout(state, clock.wait_slice(left).min(tick))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// How many requests wait for `slot` (not counting the one in flight).
    pub fn queued(&self, slot: u32) -> usize {
        self.lock().slots.get(&slot).map_or(0, |s| s.queue.len())
    }

    /// Whether a request holds `slot`.
    pub fn is_held(&self, slot: u32) -> bool {
        self.lock().slots.get(&slot).is_some_and(|s| s.held)
    }
}

impl<'a> SlotPermit<'a> {
    fn new(gate: &'a SlotGate, slot: u32, after_abandoned: bool) -> Self {
        SlotPermit {
            gate,
            slot,
            after_abandoned,
            abandoned: false,
        }
    }

    /// The slot this permit holds.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether the previous holder of the slot abandoned it: the server may still be
    /// generating its request, so `/slots` is to say idle before this one is sent.
    pub fn after_abandoned(&self) -> bool {
        self.after_abandoned
    }

    /// Marks the slot abandoned: this holder closed its connection while the server may still
    /// be generating (or it never saw the slot idle). The next permit says so.
    pub fn abandon(&mut self) {
        self.abandoned = true;
    }
}

impl Drop for SlotPermit<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        if let Some(s) = state.slots.get_mut(&self.slot) {
            s.held = false;
            s.abandoned = self.abandoned;
        }
        drop(state);
        self.gate.changed.notify_all();
    }
}

/// Removes a waiting ticket when its request stops waiting without the slot (timeout, cancel,
/// or a panicking `Queued` callback), so the queue does not wedge.
struct TicketGuard<'a> {
    gate: &'a SlotGate,
    slot: u32,
    ticket: u64,
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        if let Some(s) = state.slots.get_mut(&self.slot) {
            s.queue.retain(|&t| t != self.ticket);
        }
        drop(state);
        self.gate.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{FakeClock, SystemClock};
    use std::sync::mpsc;
    use std::thread;

    const LONG: Duration = Duration::from_secs(600);
    const TICK: Duration = Duration::from_millis(10);

    fn take<'g>(
        gate: &'g SlotGate,
        slot: u32,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<SlotPermit<'g>, InferError> {
        gate.acquire(
            slot,
            LONG,
            TICK,
            &Cancel::new(),
            &SystemClock::new(),
            on_event,
        )
    }

    fn no_events(e: &ChatEvent) {
        panic!("unexpected event {e:?}");
    }

    #[test]
    fn free_slot_is_taken_at_once_and_released_on_drop() {
        let gate = SlotGate::new(8);
        let p = take(&gate, 0, &mut no_events).unwrap();
        assert!(gate.is_held(0));
        assert!(!gate.is_held(1));
        let other = take(&gate, 1, &mut no_events).unwrap();
        assert_eq!((p.slot(), other.slot()), (0, 1));
        drop(p);
        assert!(!gate.is_held(0));
        drop(take(&gate, 0, &mut no_events).unwrap());
    }

    /// Starts a thread that queues for `slot` and reports its events and when it got in.
    /// Waiters that have emitted their first `Queued` event.
    static FIRST_SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn waiter(
        gate: &'static SlotGate,
        slot: u32,
        tag: usize,
        done: mpsc::Sender<(usize, Vec<usize>)>,
    ) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let mut seen = Vec::new();
            let r = take(gate, slot, &mut |e| match e {
                ChatEvent::Queued { ahead } => {
                    if seen.is_empty() {
                        FIRST_SEEN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    seen.push(*ahead)
                }
                other => panic!("{other:?}"),
            });
            let permit = r.unwrap();
            done.send((tag, seen)).unwrap();
            thread::sleep(Duration::from_millis(5));
            drop(permit);
        })
    }

    fn wait_until(f: impl Fn() -> bool) {
        for _ in 0..2_000 {
            if f() {
                return;
            }
            thread::sleep(Duration::from_millis(1));
        }
        panic!("condition never held");
    }

    #[test]
    fn an_abandoned_slot_is_told_to_the_next_permit_only() {
        let gate = SlotGate::new(8);
        let mut p = take(&gate, 0, &mut no_events).unwrap();
        assert!(!p.after_abandoned());
        p.abandon();
        drop(p);
        assert!(!take(&gate, 1, &mut no_events).unwrap().after_abandoned());
        let p = take(&gate, 0, &mut no_events).unwrap();
        assert!(p.after_abandoned());
        drop(p);
        assert!(!take(&gate, 0, &mut no_events).unwrap().after_abandoned());
    }

    #[test]
    fn queue_is_fifo_up_to_the_cap_then_busy() {
        let gate: &'static SlotGate = Box::leak(Box::new(SlotGate::new(8)));
        let first = take(gate, 3, &mut no_events).unwrap();
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        let before = FIRST_SEEN.load(std::sync::atomic::Ordering::SeqCst);
        for tag in 0..8 {
            threads.push(waiter(gate, 3, tag, tx.clone()));
            // Queued, and its first count told (a loaded box may run it late).
            wait_until(|| {
                let told = FIRST_SEEN.load(std::sync::atomic::Ordering::SeqCst) - before;
                gate.queued(3) == tag + 1 && told == tag + 1
            });
        }
        // At the cap: the ninth is refused at once, without an event.
        assert!(matches!(
            take(gate, 3, &mut no_events),
            Err(InferError::Busy)
        ));
        drop(first);
        let order: Vec<(usize, Vec<usize>)> = (0..8).map(|_| rx.recv().unwrap()).collect();
        for t in threads {
            t.join().unwrap();
        }
        for (i, (tag, seen)) in order.iter().enumerate() {
            assert_eq!(*tag, i, "served in arrival order");
            // Queued with i + 1 ahead, then counted down to 1. A waiter that is not scheduled
            // between two departures (5 ms apart) sees both at once, so steps may be skipped,
            // but the count only ever falls.
            assert_eq!(seen.first(), Some(&(i + 1)), "waiter {i}: {seen:?}");
            assert_eq!(seen.last(), Some(&1), "waiter {i}: {seen:?}");
            assert!(seen.windows(2).all(|w| w[0] > w[1]), "waiter {i}: {seen:?}");
        }
        assert_eq!(gate.queued(3), 0);
        assert!(!gate.is_held(3));
    }

    #[test]
    fn cap_of_zero_means_busy_whenever_held() {
        let gate = SlotGate::new(0);
        let p = take(&gate, 0, &mut no_events).unwrap();
        assert!(matches!(
            take(&gate, 0, &mut no_events),
            Err(InferError::Busy)
        ));
        drop(p);
        assert!(take(&gate, 0, &mut no_events).is_ok());
    }

    #[test]
    fn panic_while_holding_releases_the_slot() {
        let gate = SlotGate::new(8);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _p = take(&gate, 0, &mut no_events).unwrap();
            panic!("tool crashed");
        }));
        assert!(r.is_err());
        assert!(!gate.is_held(0));
        assert!(take(&gate, 0, &mut no_events).is_ok());
    }

    #[test]
    fn panic_in_the_queued_callback_leaves_the_queue() {
        let gate = SlotGate::new(8);
        let p = take(&gate, 0, &mut no_events).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = take(&gate, 0, &mut |_| panic!("ui gone"));
        }));
        assert!(r.is_err());
        assert_eq!(gate.queued(0), 0);
        drop(p);
        assert!(take(&gate, 0, &mut no_events).is_ok());
    }

    #[test]
    fn a_waiter_gives_up_at_its_wait_and_leaves_the_queue() {
        let gate = SlotGate::new(8);
        let held = take(&gate, 0, &mut no_events).unwrap();
        let start = std::time::Instant::now();
        let mut events = Vec::new();
        let r = gate.acquire(
            0,
            Duration::from_millis(60),
            TICK,
            &Cancel::new(),
            &SystemClock::new(),
            &mut |e| events.push(e.clone()),
        );
        let took = start.elapsed();
        assert!(matches!(r, Err(InferError::WaitTimeout)), "{r:?}");
        assert!(
            took >= Duration::from_millis(60) && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert_eq!(events, [ChatEvent::Queued { ahead: 1 }]);
        assert_eq!(gate.queued(0), 0);
        drop(held);
        assert!(take(&gate, 0, &mut no_events).is_ok());
    }

    /// A gate shared with a waiter thread, its slot 0 held.
    fn held_gate() -> (&'static SlotGate, SlotPermit<'static>) {
        let gate: &'static SlotGate = Box::leak(Box::new(SlotGate::new(8)));
        (gate, take(gate, 0, &mut no_events).unwrap())
    }

    #[test]
    fn a_cancelled_waiter_leaves_within_a_tick() {
        let (gate, held) = held_gate();
        let cancel = Cancel::new();
        let c = cancel.clone();
        let waiter = thread::spawn(move || {
            let tick = Duration::from_millis(50);
            let r = gate.acquire(0, LONG, tick, &c, &SystemClock::new(), &mut |_| {});
            (r.map(|_| ()), std::time::Instant::now())
        });
        wait_until(|| gate.queued(0) == 1);
        let at = std::time::Instant::now();
        cancel.cancel();
        let (r, ended) = waiter.join().unwrap();
        assert!(matches!(r, Err(InferError::Cancelled)), "{r:?}");
        let took = ended.duration_since(at);
        assert!(
            took < Duration::from_millis(50) + Duration::from_millis(200),
            "{took:?}"
        );
        assert_eq!(gate.queued(0), 0);
        drop(held);
    }

    #[test]
    fn a_waiters_deadline_is_on_the_injected_clock() {
        let (gate, held) = held_gate();
        let clock = FakeClock::new();
        let fake = clock.clone();
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let wait = Duration::from_secs(10);
            let r = gate.acquire(0, wait, LONG, &Cancel::new(), &fake, &mut |_| {});
            tx.send(r.map(|_| ())).unwrap();
        });
        wait_until(|| gate.queued(0) == 1);
        // Ten seconds of fake time: real time does not end the wait, the fake clock does.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        clock.advance(Duration::from_millis(9_999));
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        clock.advance(Duration::from_millis(1));
        let r = rx.recv_timeout(Duration::from_secs(5)).expect("gave up");
        assert!(matches!(r, Err(InferError::WaitTimeout)), "{r:?}");
        waiter.join().unwrap();
        assert_eq!(gate.queued(0), 0);
        drop(held);
    }
}
