//! One clock: only the IO drivers read the time. Every machine (the request machine, the
//! chat exchange, llama-worker's policy, inferproxy's admission) takes `now` as an input, so a
//! fake clock fakes all of it. This test reads the workspace's sources and fails on any
//! `Instant::now` or `SystemTime::now` outside the files listed here, each of which does IO
//! (a socket, a process, a terminal) and waits in real time. Test code (a top-level
//! `#[cfg(test)] mod`, and `tests/`, `benches/`, `examples/`) is not counted, nor are the
//! crates in [`MEASURING`], whose whole job is to time real processes.

use std::path::{Path, PathBuf};

/// The IO drivers, relative to `crates/`, and why each reads the time.
const DRIVERS: &[(&str, &str)] = &[
    (
        "clock/src/lib.rs",
        "SystemClock, the workspace's one clock (monotonic and wall time)",
    ),
    (
        "loopd-client/src/http.rs",
        "socket deadlines: a read or write timeout is set from what is left of an Instant",
    ),
    (
        "llama-worker/src/process.rs",
        "waiting for a killed process group, and for a command run briefly (check-config)",
    ),
    (
        "llama-worker/src/probe.rs",
        "the readiness probe's socket deadline",
    ),
    (
        "llama-worker/src/rpc.rs",
        "the RPC endpoints' connect probe deadline",
    ),
    (
        "inferproxy/src/serve.rs",
        "the accept loop feeds its admission machine",
    ),
    (
        "llama-harness/src/lib.rs",
        "test support: starting and stopping real processes",
    ),
    (
        "llama-harness/src/fake.rs",
        "test support: the fake llama-server sends each scripted piece after its delay",
    ),
];

/// Crates, relative to `crates/`, that are benchmarks: they time real processes with the
/// wall clock, as a `benches/` file does, and no machine lives in them.
const MEASURING: &[&str] = &["e2e-bench"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if !matches!(
                name.to_str(),
                Some("tests" | "benches" | "examples" | "target")
            ) {
                sources(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn only_the_io_drivers_read_the_clock() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    sources(&crates, &mut files);
    files.retain(|f| {
        !MEASURING
            .iter()
            .any(|m| f.strip_prefix(&crates).is_ok_and(|r| r.starts_with(m)))
    });
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut readers = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let code = text.split("\n#[cfg(test)]\nmod ").next().unwrap_or("");
        if code.contains("Instant::now") || code.contains("SystemTime::now") {
            let rel = f
                .strip_prefix(&crates)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            readers.push(rel);
        }
    }
    readers.sort();
    let unlisted: Vec<&String> = readers
        .iter()
        .filter(|r| !DRIVERS.iter().any(|(d, _)| d == r))
        .collect();
    assert!(
        unlisted.is_empty(),
        "these read the clock but are not IO drivers: {unlisted:?}; take `now` as an input"
    );
    let stale: Vec<&str> = DRIVERS
        .iter()
        .map(|(d, _)| *d)
        .filter(|d| !readers.iter().any(|r| r == d))
        .collect();
    assert!(
        stale.is_empty(),
        "listed but no longer reading the clock: {stale:?}"
    );
}
