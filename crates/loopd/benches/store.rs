//! Submit-to-acknowledge cost of the durable store: the latency of `Db::insert_submitted`
//! (the write the daemon makes before it acknowledges a submit), each call timed alone, as
//! p50/p99/max over 5,000 calls, with `synchronous=NORMAL` and with `FULL`.
//!
//! The store is a file in `$LOOPD_BENCH_DIR` (default: the system temp dir; on a tmpfs the
//! figures say nothing about the disk). Between two timed inserts the request is finished and
//! its result fetched (untimed), as in a daemon's steady state, so the table stays small and
//! SQLite's automatic WAL checkpoints land on some timed inserts, as they would.
//!
//! The peer, in the same run: what the in-memory daemon before the store did in place of the
//! write (its `ResultStore::handle_started`: one insert into a `BTreeSet` of running ids).
//! The whole submit-to-acknowledge over the socket, store against no store, is measured by
//! `tests/daemon_soak.rs` (`submit_ack_latency_*`).
//!
//! The insert after a compaction: the daemon compacts (and empties the WAL) when a
//! result was fetched and nothing runs, so the next submit's insert can be the first write into
//! an emptied WAL. That line runs 200 requests each followed by `Db::compact`, with 100 ms idle
//! before each insert (a daemon between requests: caches cold), against the same loop without
//! the compaction in the same run.
//!
//! cargo bench -p loopd --bench store

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use std::collections::BTreeSet;

use loopd::daemon::{Db, DbSettings, Durability};
use loopd_agent::runner::Seat;

/// The seat of a request on the one server of a plain config.
const SEAT: Seat<'static> = Seat {
    host: None,
    slot: 0,
};

const WARMUP: usize = 500;
const SAMPLES: usize = 5_000;

/// A submission of the size a short agent request has (~1 KiB of JSON).
fn submission() -> String {
    format!(
        r#"{{"cmd":"submit","messages":[{{"role":"user","content":"{}"}}],"budget":4,"tools":["arithmetic"]}}"#,
        "Name three colours and say why. ".repeat(30)
    )
}

struct Figures {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn figures(mut t: Vec<Duration>) -> Figures {
    t.sort_unstable();
    let at = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)];
    Figures {
        p50: at(0.50),
        p99: at(0.99),
        max: *t.last().expect("samples"),
    }
}

fn dir() -> PathBuf {
    match std::env::var_os("LOOPD_BENCH_DIR") {
        Some(d) => {
            let d = PathBuf::from(d).join(format!("loopd-store-bench-{}", std::process::id()));
            std::fs::create_dir_all(&d).expect("bench dir");
            d
        }
        None => llama_harness::temp_dir("store-bench"),
    }
}

fn bench_db(durability: Durability) -> Figures {
    let dir = dir();
    let path = dir.join("loopd.db");
    let mut db = Db::open(
        &path,
        DbSettings {
            durability,
            ttl: Duration::from_secs(300),
            cap: 1_000,
        },
    )
    .expect("open the store");
    let s = submission();
    let now = SystemTime::now();
    let mut t = Vec::with_capacity(SAMPLES);
    for n in 0..WARMUP + SAMPLES {
        let start = Instant::now();
        let id = db.insert_submitted(&s, SEAT, now).expect("insert");
        let took = start.elapsed();
        if n >= WARMUP {
            t.push(took);
        }
        db.finish(id, "completed", r#"{"outcome":"completed"}"#, now)
            .expect("finish");
        assert!(db.take_result(id, now).expect("take").is_ok());
    }
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    figures(t)
}

/// 200 requests with `idle` before each timed insert, then three checkpoints, the finish and
/// the fetch, and (`compact`) a compaction, as the daemon's idle tick makes one.
fn bench_idle_inserts(compact: bool) -> Figures {
    let dir = dir();
    let mut db = Db::open(
        &dir.join("loopd.db"),
        DbSettings {
            durability: Durability::Normal,
            ttl: Duration::from_secs(300),
            cap: 1_000,
        },
    )
    .expect("open the store");
    let s = submission();
    let now = SystemTime::now();
    let mut t = Vec::with_capacity(200);
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let id = db.insert_submitted(&s, SEAT, now).expect("insert");
        t.push(start.elapsed());
        for k in 1..=3 {
            db.checkpoint(id, &"o".repeat(300 * k), now)
                .expect("checkpoint");
        }
        db.finish(id, "completed", &"r".repeat(3_000), now)
            .expect("finish");
        assert!(db.take_result(id, now).expect("take").is_ok());
        if compact {
            db.compact().expect("compact");
        }
    }
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    figures(t)
}

fn bench_memory() -> Figures {
    let mut running: BTreeSet<u64> = BTreeSet::new();
    let mut t = Vec::with_capacity(SAMPLES);
    for id in 0..(WARMUP + SAMPLES) as u64 {
        let start = Instant::now();
        running.insert(std::hint::black_box(id));
        let took = start.elapsed();
        if id >= WARMUP as u64 {
            t.push(took);
        }
        running.remove(&id);
    }
    figures(t)
}

fn main() {
    let line = |name: &str, f: Figures| {
        println!(
            "{name:<34} p50 {:>9.2} µs   p99 {:>9.2} µs   max {:>9.2} µs",
            f.p50.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
            f.max.as_secs_f64() * 1e6
        );
    };
    println!("insert_submitted, {SAMPLES} calls each (after {WARMUP} warm-up):");
    line("store, synchronous=NORMAL", bench_db(Durability::Normal));
    line("store, synchronous=FULL", bench_db(Durability::Full));
    line("in memory (the daemon before)", bench_memory());
    println!("insert_submitted after 100 ms idle, 200 calls each, synchronous=NORMAL:");
    line("each after a compaction", bench_idle_inserts(true));
    line("no compaction (the peer)", bench_idle_inserts(false));
}
