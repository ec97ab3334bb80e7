//! The sweep of temp dirs left by test processes that are gone.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use llama_harness::{remove_stale_temp_dirs, temp_dir};

/// A pid that was alive a moment ago and is not now.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("run true");
    let pid = child.id();
    child.wait().expect("wait for true");
    pid
}

fn make(root: &Path, name: &str, age: Duration) {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("server.log"), b"log").unwrap();
    let when = SystemTime::now() - age;
    std::fs::File::open(&dir)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

fn names(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn removes_only_old_dirs_of_processes_that_are_gone() {
    let root = temp_dir("sweep");
    let (dead, alive) = (dead_pid(), std::process::id());
    let hour = Duration::from_secs(3600);
    let old = hour + Duration::from_secs(60);
    let recent = hour - Duration::from_secs(60);
    let gone = [
        format!("boxmaker-llama-{dead}-0"),
        format!("boxmaker-loopd-http-{dead}-12"),
    ];
    let kept = [
        format!("boxmaker-llama-{dead}-1"), // its process is gone, but it is recent
        format!("boxmaker-proxy-{alive}-0"), // its process runs
        "boxmaker-notes".to_string(),       // not a name temp_dir makes
        format!("boxmaker--{dead}-0"),      // no tag
        format!("boxmaker-llama-{dead}-x"), // no call number
        format!("other-{dead}-0"),          // not ours
    ];
    for name in &gone {
        make(&root, name, old);
    }
    make(&root, &kept[0], recent);
    for name in &kept[1..] {
        make(&root, name, old);
    }

    assert_eq!(remove_stale_temp_dirs(&root, hour), gone.len());
    assert_eq!(names(&root), kept.iter().cloned().collect());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_missing_root_removes_nothing() {
    let parent = temp_dir("sweep-missing");
    assert_eq!(
        remove_stale_temp_dirs(&parent.join("absent"), Duration::ZERO),
        0
    );
    std::fs::remove_dir_all(&parent).unwrap();
}
