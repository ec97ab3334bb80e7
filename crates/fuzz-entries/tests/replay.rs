//! Every committed fuzz input, through the entry function its fuzz target calls, on the stable
//! toolchain: for each target in `fuzz/fuzz_targets/`, its minimized corpus
//! (`fuzz/corpus-min/<target>`, required and never empty), its hand-written seeds
//! (`fuzz/seeds/<target>`) and every crash input it ever found (`fuzz/regressions/<target>`).
//! A parser change that breaks an input the fuzzer once found fails here, in `cargo test`.

use std::collections::BTreeSet;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use fuzz_entries::TARGETS;

/// The cargo-fuzz crate, beside `crates/`.
fn fuzz_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    dir.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The names in `dir` (files or folders), sorted; empty when `dir` does not exist.
fn names(dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// Runs every file in `dir` through `entry`; the files whose check failed, with the panic.
fn replay(dir: &Path, entry: fuzz_entries::Entry) -> (usize, Vec<String>) {
    let mut failed = Vec::new();
    let files = names(dir);
    for name in &files {
        let path = dir.join(name);
        assert!(path.is_file(), "{} is not a file", path.display());
        let data = fs::read(&path).unwrap();
        if let Err(e) = panic::catch_unwind(AssertUnwindSafe(|| entry(&data))) {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{}: {why}", path.display()));
        }
    }
    (files.len(), failed)
}

/// Replays `target`'s corpora; fails when its minimized corpus is missing or empty.
fn replay_target(target: &str) {
    let (_, entry) = TARGETS
        .into_iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no entry for {target} in fuzz_entries::TARGETS"));
    let fuzz = fuzz_dir();
    let min = fuzz.join("corpus-min").join(target);
    let (n, mut failed) = replay(&min, entry);
    assert!(
        n > 0,
        "{} is missing or empty: every fuzz target keeps a minimized corpus (make fuzz-cmin)",
        min.display()
    );
    for kind in ["seeds", "regressions"] {
        failed.extend(replay(&fuzz.join(kind).join(target), entry).1);
    }
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        target,
        failed.join("\n")
    );
}

/// The targets, each its own test so they run in parallel and fail by name.
macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay_target(stringify!($target));
            }
        )*
        const REPLAYED: &[&str] = &[$(stringify!($target)),*];
    };
}

replay_tests!(
    chat_stream,
    config_toml,
    daemon_command,
    http_response,
    loop_detect,
    proto_assemble,
    sse_parse,
    text_calls,
    worker_lines,
);

/// Every fuzz target has an entry here and a replay test, its file calls that entry, and every
/// corpus folder is named after a target: nothing the fuzzer runs goes unreplayed.
#[test]
fn every_fuzz_target_is_replayed_through_its_entry() {
    let fuzz = fuzz_dir();
    let targets: BTreeSet<String> = names(&fuzz.join("fuzz_targets"))
        .into_iter()
        .map(|f| {
            f.strip_suffix(".rs")
                .expect("a target is a .rs file")
                .to_owned()
        })
        .collect();
    let entries: BTreeSet<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    let replayed: BTreeSet<String> = REPLAYED.iter().map(|n| n.to_string()).collect();
    assert_eq!(targets.len(), 9, "{targets:?}");
    assert_eq!(entries, targets);
    assert_eq!(replayed, targets);
    for t in &targets {
        let source = fs::read_to_string(fuzz.join("fuzz_targets").join(format!("{t}.rs"))).unwrap();
        let call = format!("fuzz_entries::{t}(data)");
        assert!(
            source.contains(&call),
            "fuzz/fuzz_targets/{t}.rs does not call {call}"
        );
    }
    for kind in ["corpus-min", "seeds", "regressions"] {
        let folders = names(&fuzz.join(kind));
        let strays: Vec<_> = folders
            .iter()
            .filter(|f| !targets.contains(*f) && f.as_str() != "README.md")
            .collect();
        assert!(
            strays.is_empty(),
            "fuzz/{kind}/ holds {strays:?}, no target of that name"
        );
    }
    assert_eq!(names(&fuzz.join("corpus-min")), targets, "fuzz/corpus-min/");
}
