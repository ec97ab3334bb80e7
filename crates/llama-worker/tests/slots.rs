//! A stream that is silent while its slot decodes (a tool call's opening on a slow box) is
//! not a stall: the worker asks `/slots` once the stream's progress is half `stall_timeout`
//! old, and a rising `n_decoded` on the generation's slot is its progress (a slow box, shape b).
//! Without the rise, the same silence restarts the server. Fake clock, real HTTP.

mod common;

use std::time::Duration;

use common::{ready_idle_worker, state, Endpoint, Mode};
use llama_worker::policy::ProgressKind;
use llama_worker::{RestartCause, State};

const STEP: Duration = Duration::from_millis(50);

#[test]
fn a_silent_stream_lives_while_its_slot_decodes_and_stalls_once_it_stops() {
    let ep = Endpoint::start(Mode::Ok);
    // stall_timeout 1 s, CPU (and /slots) every 0.25 s; `sleep` spends no CPU time.
    let (mut w, clock) = ready_idle_worker(&ep);
    let h = w.handle();
    ep.set_decoding(true);
    let id = h.register(2).unwrap();
    assert!(h.progress(id, ProgressKind::FirstByte));
    // Before half the stall timeout nothing asks /slots.
    clock.advance(Duration::from_millis(499));
    w.tick();
    assert_eq!(ep.slots_hits(), 0);
    // Five stall timeouts of silence on the stream while slot 2 decodes: no restart.
    for step in 0..100 {
        clock.advance(STEP);
        w.tick();
        assert_eq!(
            (state(&w), h.status().total_restarts),
            (State::Ready, 0),
            "after {} ms of silence, {} /slots answers",
            499 + 50 * (step + 1),
            ep.slots_hits()
        );
    }
    // Asked at 0.5 s (the baseline), 0.75 s (a CPU probe interval later: the first rise), then
    // half a stall timeout after each rise: 1.25, 1.75, ... 5.25 s.
    assert_eq!(ep.slots_hits(), 11);
    // The slot stops decoding (a hung server): the stall comes within a stall timeout and a
    // probe interval of the last rise.
    ep.set_decoding(false);
    let mut silent = Duration::ZERO;
    while state(&w) == State::Ready {
        assert!(
            silent <= Duration::from_millis(1300),
            "still ready {silent:?} after the count stood still"
        );
        clock.advance(STEP);
        silent += STEP;
        w.tick();
    }
    assert!(
        silent >= Duration::from_millis(750),
        "stalled after {silent:?}"
    );
    let s = h.status();
    assert_eq!(
        (s.total_restarts, s.last_cause),
        (1, Some(RestartCause::Stall))
    );
    h.stop();
    w.tick();
}

#[test]
fn a_count_that_stands_still_stalls_at_the_timeout() {
    let ep = Endpoint::start(Mode::Ok);
    let (mut w, clock) = ready_idle_worker(&ep);
    let h = w.handle();
    let id = h.register(2).unwrap();
    assert!(h.progress(id, ProgressKind::FirstByte));
    // The count stands still: /slots is asked, and the stall comes at 1 s to the step.
    for _ in 0..19 {
        clock.advance(STEP);
        w.tick();
        assert_eq!(state(&w), State::Ready);
    }
    assert!(ep.slots_hits() > 0);
    clock.advance(STEP);
    w.tick();
    assert_eq!(state(&w), State::Restarting);
    assert_eq!(h.status().last_cause, Some(RestartCause::Stall));
    h.stop();
    w.tick();
}
