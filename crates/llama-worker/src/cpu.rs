//! The liveness probe's IO: CPU time summed over every process of one process group.
//!
//! In router mode the work happens in the model instances the router spawns, so the router's
//! own counters stay flat during a prefill; its process group holds them all. A process that
//! vanishes between listing `/proc` and reading its `stat` is skipped, not an error.

use std::fs;
use std::io;
use std::path::Path;

use crate::stat::{parse_stat, ProcStat};

/// Largest `stat` line read; real lines are about 300 bytes.
const MAX_STAT_BYTES: usize = 4096;

/// The children of process `pid`, from `proc_root/<pid>/task/*/children` (each thread lists
/// the children it forked; the router spawns its model instances from a thread of its own),
/// sorted. `None` when the process or its task list cannot be read (gone, or a kernel without
/// `children` files).
pub fn children(proc_root: &Path, pid: u32) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let tasks = fs::read_dir(proc_root.join(pid.to_string()).join("task")).ok()?;
    for task in tasks {
        let Ok(task) = task else { continue };
        // A thread that ended since the listing has no file: it has no children either.
        let Ok(text) = fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        out.extend(
            text.split_ascii_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Every process in `proc_root` (normally `/proc`) whose process group is `pgid`, zombies
/// included. Fails only when `proc_root` itself cannot be listed.
pub fn group_members(proc_root: &Path, pgid: i32) -> io::Result<Vec<ProcStat>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(bytes) = fs::read(entry.path().join("stat")) else {
            continue; // gone since the listing
        };
        if bytes.len() > MAX_STAT_BYTES {
            continue;
        }
        if let Ok(st) = parse_stat(&bytes) {
            if st.pgrp == pgid {
                out.push(st);
            }
        }
    }
    Ok(out)
}

/// `utime + stime` summed over the group; `None` when `/proc` cannot be read or the group has
/// no process left (the caller treats both as "no update").
pub fn group_cpu_ticks(proc_root: &Path, pgid: i32) -> Option<u64> {
    let members = group_members(proc_root, pgid).ok()?;
    if members.is_empty() {
        return None;
    }
    Some(
        members
            .iter()
            .fold(0u64, |acc, m| acc.saturating_add(m.cpu_ticks())),
    )
}

/// Processes of the group that are not zombies: what must be gone after a kill.
pub fn live_members(proc_root: &Path, pgid: i32) -> io::Result<Vec<i32>> {
    Ok(group_members(proc_root, pgid)?
        .into_iter()
        .filter(|m| !m.is_zombie())
        .map(|m| m.pid)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(entries: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "lw-proc-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        for (name, stat) in entries {
            fs::create_dir_all(dir.join(name)).unwrap();
            fs::write(dir.join(name).join("stat"), stat).unwrap();
        }
        fs::create_dir_all(dir.join("self")).unwrap();
        fs::create_dir_all(dir.join("77")).unwrap(); // vanished: no stat file
        dir
    }

    #[test]
    fn sums_every_member_of_the_group_only() {
        let dir = fake_proc(&[
            (
                "10",
                "10 (llama-server) S 1 10 10 0 -1 0 0 0 0 0 100 20 0 0\n",
            ),
            (
                "11",
                "11 (llama a) b) R 10 10 10 0 -1 0 0 0 0 0 500 30 0 0\n",
            ),
            ("12", "12 (zomb) Z 10 10 10 0 -1 0 0 0 0 0 7 0 0 0\n"),
            ("13", "13 (other) S 1 13 13 0 -1 0 0 0 0 0 999 999 0 0\n"),
            ("14", "garbage"),
        ]);
        assert_eq!(group_cpu_ticks(&dir, 10), Some(657));
        let mut live = live_members(&dir, 10).unwrap();
        live.sort();
        assert_eq!(live, [10, 11]);
        assert_eq!(group_cpu_ticks(&dir, 99), None);
        assert_eq!(group_cpu_ticks(&dir.join("missing"), 10), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_the_real_proc_for_our_own_group() {
        let me = parse_stat(&fs::read("/proc/self/stat").unwrap()).unwrap();
        let members = group_members(Path::new("/proc"), me.pgrp).unwrap();
        assert!(members.iter().any(|m| m.pid == me.pid));
    }

    #[test]
    fn children_are_read_from_every_thread_of_the_process() {
        let dir = std::env::temp_dir().join(format!("lw-children-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (task, children) in [("40", ""), ("41", "52 50 "), ("42", "50 61")] {
            let t = dir.join("40/task").join(task);
            fs::create_dir_all(&t).unwrap();
            fs::write(t.join("children"), children).unwrap();
        }
        // A thread that ended between the listing and the read.
        fs::create_dir_all(dir.join("40/task/43")).unwrap();
        assert_eq!(children(&dir, 40), Some(vec![50, 52, 61]));
        assert_eq!(children(&dir, 99), None, "no such process");
        // The real thing: this test process's children, none and then one.
        let me = std::process::id();
        let before = children(Path::new("/proc"), me).expect("/proc/<pid>/task/*/children");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let with = children(Path::new("/proc"), me).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(with.contains(&child.id()), "{with:?}");
        assert!(!before.contains(&child.id()));
        let _ = fs::remove_dir_all(&dir);
    }
}
