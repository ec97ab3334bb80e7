//! `CpuLoad`: the loops spin (their CPU time rises) while it lives, and every process of
//! every group is gone once it is dropped.

use std::time::{Duration, Instant};

use llama_harness::{load_average, wait_for, CpuLoad};

/// The pids of process group `pgid` and their summed user + system ticks, from `/proc`.
fn group(pgid: u32) -> (Vec<u32>, u64) {
    let mut pids = Vec::new();
    let mut ticks = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        // After `pid (comm)`: state ppid pgrp ... utime (12th) stime (13th).
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if f.get(2).and_then(|g| g.parse().ok()) == Some(pgid) && f[0] != "Z" {
            pids.push(pid);
            ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    (pids, ticks)
}

#[test]
fn two_loops_spin_until_dropped() {
    let load = CpuLoad::start(2);
    assert_eq!(load.len(), 2);
    let pgids = load.pgids();
    assert_eq!(pgids.len(), 2);
    for &g in &pgids {
        // The watchdog shell, its `cat` on the pipe, and the loop.
        wait_for(
            &format!("three processes in group {g}"),
            Duration::from_secs(5),
            || match group(g).0.len() {
                3 => Ok(()),
                n => Err(format!("{n} processes")),
            },
        );
    }
    let before: Vec<u64> = pgids.iter().map(|&g| group(g).1).collect();
    let started = Instant::now();
    for (&g, &t0) in pgids.iter().zip(&before) {
        // A spinning loop gets CPU time even on a loaded box: a tick (10 ms) within seconds.
        wait_for(
            &format!("group {g}'s CPU time rising"),
            Duration::from_secs(10),
            || match group(g).1 {
                t if t > t0 => Ok(()),
                t => Err(format!("{t} ticks, {t0} at first")),
            },
        );
    }
    eprintln!(
        "cpu_load: both loops rose within {:?}; load average {}",
        started.elapsed(),
        load_average()
    );
    drop(load);
    for &g in &pgids {
        wait_for(
            &format!("group {g} gone"),
            Duration::from_secs(10),
            || match group(g).0.as_slice() {
                [] => Ok(()),
                left => Err(format!("{left:?} left")),
            },
        );
    }
}

#[test]
fn none_is_nothing() {
    let load = CpuLoad::start(0);
    assert!(load.is_empty());
    assert_eq!(load.pgids(), Vec::<u32>::new());
}
