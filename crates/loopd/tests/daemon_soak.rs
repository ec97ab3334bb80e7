//! The daemon's soak, alone in its own test binary so that the process's threads,
//! descriptors and resident set are the daemon's and the fake server's, no other test's.

mod support;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clock::SystemClock;
use loopd_client::llama::{Buffers, SPARE_BUFFERS};
use serde_json::json;
use support::daemon::{error_of, slow_answer, Running};
use support::{done, json_answer, json_chunk, FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";

/// The daemon's slots: at most this many requests run at once.
const SLOTS: usize = 2;

/// The system allocator, counting the bytes live on the heap: a leak shows in this count
/// exactly, where the resident set also moves with the allocator's arenas (glibc keeps one per
/// thread that touched it; a run's RSS at the end was anywhere from 37 to 56 MB).
struct Counting;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` or `realloc` above, that is from `System`.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: as `dealloc` and `alloc`: the block is `System`'s.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        if !p.is_null() {
            LIVE.fetch_add(
                new as isize - layout.size() as isize,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes live on the heap now.
fn live() -> isize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

fn proc_count(what: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(what))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Requests in the soak: 1,000 unless `LOOPD_SOAK_REQUESTS` says otherwise (`make soak` may
/// ask for more).
fn soak_requests() -> u32 {
    std::env::var("LOOPD_SOAK_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// 1,000 requests over the socket: completions, tool calls, cancels, refusals (each tried
/// again), results fetched late and never. Afterwards no slot, record, thread or descriptor is
/// left over, the bytes live on the heap are back where they started (but for the buffer sets
/// a client keeps for its next requests) and no higher than after the first fifth, and the
/// resident set is
/// about where it was after the first fifth. The fake server cycles a short
/// script and keeps no request, so the memory measured is loopd's. The numbers are printed:
/// `cargo test -p loopd --test daemon_soak`.
///
/// The file runs without libtest's harness (`harness = false`): the harness captures what the
/// daemon writes to stderr (one line per request, since the daemon logs each end) in a buffer
/// on this heap, which grew with every request and was counted as a leak on a fast box.
fn main() {
    soak_of_a_thousand_requests_leaks_nothing();
    println!("test soak_of_a_thousand_requests_leaks_nothing ... ok");
}

fn soak_of_a_thousand_requests_leaks_nothing() {
    let tool_then_answer = |id: &str| {
        Reply::sse(vec![
            json_chunk(
                json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                    "function": {"name": "arithmetic",
                                 "arguments": "{\"operation\":\"add\",\"numbers\":[2,3]}"}}]}),
                None,
                0,
            ),
            json_chunk(json!({}), Some("tool_calls"), 0),
            done(),
        ])
    };
    let script = vec![
        json_answer("plain"),
        tool_then_answer("c1"),
        json_answer("after the tool"),
        slow_answer(3, Duration::from_millis(2)),
    ];
    let server = FakeServer::start(vec![(CHAT, script)]);
    server.cycle_scripts();
    server.forget_requests();
    let d = Running::start(
        &server,
        SLOTS as u32,
        Arc::new(SystemClock::new()),
        Duration::from_secs(600),
    );
    let n = soak_requests();
    // The baseline once the daemon serves: its listener's descriptors are open by then.
    assert_eq!(d.call(json!({"cmd": "status"}))["ok"], true);
    let (threads0, fds0, rss0, live0) =
        (proc_count("Threads:"), fds(), proc_count("VmRSS:"), live());
    let (mut rss_warm, mut live_warm, mut store_warm) = (0, 0, 0);
    let mut store_most = 0;
    let (mut done_n, mut refused, mut cancelled, mut never) = (0, 0, 0, Vec::new());
    // Submit to acknowledgement as the client sees it (connect, line, reply), accepted ones.
    let mut acks = Vec::with_capacity(n as usize);
    let mut late = Vec::new();
    let started = Instant::now();
    for i in 0..n {
        // Both slots may still be finishing the last two: refused, counted, and tried again.
        let id = loop {
            let sent = Instant::now();
            // One conversation (the same first message), so the placement's session map, a
            // bounded cache tested at its capacity in loopd-agent, holds one key and the heap
            // check sees the requests alone.
            let r = d.call(json!({"cmd": "submit", "messages": [
                {"role": "user", "content": "soak"},
                {"role": "user", "content": format!("q{i}")}
            ]}));
            if let Some(id) = r["id"].as_u64() {
                acks.push(sent.elapsed());
                break id;
            }
            assert_eq!(error_of(&r), "NO_SLOT_AVAILABLE", "{r}");
            refused += 1;
            thread::sleep(Duration::from_millis(2));
        };
        match i % 10 {
            // Fetched late, after the next submit.
            0..=2 => late.push(id),
            // Never fetched.
            3 => never.push(id),
            // Cancelled at once.
            4 => {
                let c = d.call(json!({"cmd": "cancel", "id": id}));
                assert_eq!(c["ok"], true, "{c}");
                cancelled += 1;
                late.push(id);
            }
            _ => {
                let w = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 30_000}));
                assert_eq!(w["ok"], true, "{w}");
                done_n += 1;
            }
        }
        while late.len() > 4 {
            let id = late.remove(0);
            let w = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 30_000}));
            assert_eq!(w["ok"], true, "{w}");
            done_n += 1;
        }
        if i == n / 5 {
            rss_warm = proc_count("VmRSS:");
            live_warm = live();
            store_warm = d.daemon.store_bytes();
        }
        store_most = store_most.max(d.daemon.store_bytes());
    }
    for id in late.drain(..) {
        let w = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 30_000}));
        assert_eq!(w["ok"], true, "{w}");
        done_n += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = d.call(json!({"cmd": "status"}))["status"].clone();
        if s["busy"] == 0 && s["running"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still running: {s}");
        thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    acks.sort_unstable();
    let pct = |q: f64| acks[((acks.len() as f64 * q) as usize).min(acks.len() - 1)];
    eprintln!(
        "soak: submit to ack over the socket, {} accepted: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
        acks.len(),
        pct(0.50).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
        acks[acks.len() - 1].as_secs_f64() * 1e6
    );
    // Those never fetched are kept, except the oldest ones past max_results (100 here).
    let mut evicted = 0;
    for id in &never {
        let r = d.call(json!({"cmd": "result", "id": id}));
        if r["ok"] != true {
            assert_eq!(error_of(&r), "NOT_FOUND");
            evicted += 1;
        }
    }
    let text = d.call(json!({"cmd": "metrics"}))["metrics"]
        .as_str()
        .unwrap()
        .to_owned();
    if evicted > 0 {
        let line = format!("loopd_results_evicted_total{{reason=\"over_cap\"}} {evicted}");
        assert!(text.lines().any(|l| l == line), "no `{line}` in {text}");
    }
    let status = d.call(json!({"cmd": "status"}))["status"].clone();
    assert_eq!(status["kept"], 0, "{status}");
    assert_eq!(status["busy"], 0, "{status}");
    assert!(server.requests().is_empty());
    // Waiter and connection threads end on their own; give them a moment to be reaped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_count("Threads:") > threads0 || fds() > fds0 {
        assert!(
            Instant::now() < deadline,
            "threads {} (started with {threads0}), fds {} (started with {fds0})",
            proc_count("Threads:"),
            fds()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let (rss_end, live_end) = (proc_count("VmRSS:"), live());
    // Every row fetched or evicted by now, and compacted within a second of the last end.
    // (Waited for down to what the assertion below wants: a wait that stopped at `store_warm`
    // took a file still shrinking for the end, one run in three.)
    let compacted = Instant::now() + Duration::from_secs(5);
    let goal = store_warm.min(64 * 1024);
    while d.daemon.store_bytes() > goal && Instant::now() < compacted {
        thread::sleep(Duration::from_millis(50));
    }
    let store_end = d.daemon.store_bytes();
    eprintln!(
        "soak: store {} kB after {}, at most {} kB, {} kB at the end",
        store_warm / 1024,
        n / 5,
        store_most / 1024,
        store_end / 1024
    );
    // The file follows what is kept (at most max_results, 100 here) and the WAL (checkpointed
    // by SQLite at 1,000 pages, 4 MB), not what went through: the same whether the soak ran
    // 1,000 requests or 100,000; and once idle it is compacted to what it holds.
    assert!(
        store_most < 8 * 1024 * 1024 && store_end <= store_warm && store_end <= 64 * 1024,
        "the store grew: {store_warm} bytes after {} requests, {store_most} at most, \
         {store_end} at the end",
        n / 5
    );
    eprintln!(
        "soak: {n} submits ({} chat requests) in {:.1} s: {done_n} fetched ({cancelled} \
         cancelled), {refused} refused, {} never fetched until the end ({evicted} evicted over \
         the cap); threads {threads0} -> {}, fds {fds0} -> {}, RSS {rss0} kB at the start, \
         {rss_warm} kB after {}, {rss_end} kB at the end; heap {} kB live at the start, {} kB \
         after {}, {} kB at the end",
        server.served(),
        elapsed.as_secs_f64(),
        never.len(),
        proc_count("Threads:"),
        fds(),
        n / 5,
        live0 / 1024,
        live_warm / 1024,
        n / 5,
        live_end / 1024,
    );
    // Every result fetched and every request over, the heap is back where it started but for
    // the buffer sets a client's pool keeps for its next request: at most one per slot that
    // ran at once (2 here), never more than the pool's bound. Those sets are made in the first
    // requests and only reused after, so from a fifth to the end the heap does not grow at all
    // (in the middle it also holds the requests in flight). A leak of 100 bytes a request
    // would be 100 kB here.
    let sets = SPARE_BUFFERS.min(SLOTS) as isize;
    let pooled = sets * Buffers::BYTES as isize;
    assert!(
        live_end < live0 + pooled + 64 * 1024,
        "the heap grew from {live0} bytes live at the start to {live_end} at the end (the pool \
         may keep {sets} sets of {} bytes)",
        Buffers::BYTES
    );
    assert!(
        live_end < live_warm + 64 * 1024,
        "the heap grew from {live_warm} bytes live after {} requests to {live_end} at the end",
        n / 5
    );
    // The resident set only within the allocator's noise (its arenas), as a second look.
    assert!(
        rss_end < rss_warm + 32 * 1024,
        "RSS grew from {rss_warm} kB after {} requests to {rss_end} kB",
        n / 5
    );
}
