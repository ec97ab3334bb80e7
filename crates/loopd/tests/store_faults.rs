//! The durable store's faults, each refused with its own error and nothing acknowledged lost:
//! a second opener (in this process and in another), a corrupt file, a read-only directory, a
//! full disk (the store alone, and the daemon over the fake server), and a daemon SIGKILLed
//! right after acknowledging.
//!
//! The read-only directory and the full disk need a file system of their own: the test runs
//! itself again (this binary, only that test) under `unshare --user --map-root-user --mount`,
//! and there mounts a tmpfs, read-only or 1 MiB small. A private mount namespace
//! in a user namespace works for root and for an ordinary user alike (permission bits would
//! not stop root), and the mount goes away with the child. Where unshare is missing or user
//! namespaces are off, these tests fail and say so; they are never skipped.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod support;

use std::sync::Arc;

use loopd::daemon::{Db, DbError, DbSettings, Durability, OpenErrorKind};
use loopd_agent::runner::{ResultError, Seat};

/// The seat of a request on the one server of a plain config.
const SEAT: Seat<'static> = Seat {
    host: None,
    slot: 0,
};
use serde_json::{json, Value};
use support::daemon::{error_of, submit, Running};
use support::{done, json_chunk, json_content, FakeServer, Reply, CHAT};

/// Set in a child: which role this run of the binary plays, and the store's path.
const ROLE: &str = "LOOPD_STORE_FAULT_ROLE";
const PATH: &str = "LOOPD_STORE_FAULT_PATH";

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(ms)
}

fn settings() -> DbSettings {
    DbSettings {
        durability: Durability::Normal,
        ttl: Duration::from_secs(60),
        cap: 1_000,
    }
}

/// Neither TTL nor cap in the way of a test that looks at every row.
fn keep_all() -> DbSettings {
    DbSettings {
        ttl: Duration::from_secs(365 * 86_400),
        cap: usize::MAX,
        ..settings()
    }
}

/// The role this process plays (`None`: the test itself, the parent).
fn role() -> Option<(String, PathBuf)> {
    let role = std::env::var(ROLE).ok()?;
    Some((role, PathBuf::from(std::env::var_os(PATH).expect(PATH))))
}

/// This test binary again, running only `test` as `role` on `path`, after `wrapper`.
fn rerun(test: &str, role: &str, path: &Path, wrapper: &[&str]) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut c = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    c.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env("RUST_BACKTRACE", "0");
    c
}

const UNSHARE: [&str; 4] = ["unshare", "--user", "--map-root-user", "--mount"];

/// Runs `test` as `role` in its own user and mount namespace; returns its stdout, having
/// checked it exited 0.
fn in_namespace(test: &str, role: &str, path: &Path) -> String {
    let out = rerun(test, role, path, &UNSHARE)
        .output()
        .expect("run unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the {role} child (under unshare; needs user namespaces) failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn mount(args: &[&str]) {
    let st = Command::new("mount").args(args).status().expect("mount");
    assert!(st.success(), "mount {args:?}: {st}");
}

/// Every line `marker ...` the child printed.
fn marked<'a>(stdout: &'a str, marker: &str) -> Vec<&'a str> {
    stdout
        .lines()
        // The harness prints `test NAME ... ` before the first line, on the same line.
        .filter_map(|l| l.find(marker).map(|i| l[i + marker.len()..].trim()))
        .collect()
}

#[test]
fn a_second_opener_is_refused_while_the_first_holds_the_file() {
    const TEST: &str = "a_second_opener_is_refused_while_the_first_holds_the_file";
    if let Some((role, path)) = role() {
        assert_eq!(role, "holder");
        // An existing store at the current version: open writes nothing, yet holds it.
        let _db = Db::open(&path, settings()).unwrap();
        println!("holding");
        std::io::stdout().flush().unwrap();
        // Held until the parent closes our stdin.
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        return;
    }
    let path = llama_harness::temp_dir("fault-locked").join("loopd.db");

    // In this process: a second Db, and a plain SQLite reader.
    let first = Db::open(&path, settings()).unwrap();
    let e = Db::open(&path, settings()).unwrap_err();
    assert_eq!(e.kind, OpenErrorKind::Locked);
    assert_eq!(
        e.to_string(),
        format!(
            "store {}: locked by another process (is another loopd serve using this store?): database is locked",
            path.display()
        )
    );
    // A plain SQLite reader is not a daemon: it reads the live store, as an operator's `sqlite3 -readonly` does.
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader.busy_timeout(Duration::ZERO).unwrap();
    let read: i64 = reader
        .query_row("SELECT count(*) FROM requests", [], |r| r.get(0))
        .unwrap();
    assert_eq!(read, 0);
    drop(reader);
    drop(first);
    Db::open(&path, settings())
        .unwrap()
        .insert_submitted("{}", SEAT, at(0))
        .unwrap();

    // In another process, as a second daemon would be.
    let mut holder = rerun(TEST, "holder", &path, &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until the holder ends, so its output never meets a closed pipe.
    let mut holder_out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    while !line.ends_with("holding\n") {
        line.clear();
        assert_ne!(
            holder_out.read_line(&mut line).unwrap(),
            0,
            "the holder ended"
        );
    }
    assert_eq!(
        Db::open(&path, settings()).unwrap_err().kind,
        OpenErrorKind::Locked
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    drop(holder_out);
    let db = Db::open(&path, settings()).unwrap();
    assert_eq!(db.running().unwrap(), vec![1]);
}

#[test]
fn a_corrupt_file_is_refused_and_left_as_it_was() {
    let dir = llama_harness::temp_dir("fault-corrupt");
    let garbage = dir.join("garbage.db");
    let bytes: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&garbage, &bytes).unwrap();
    let e = Db::open(&garbage, settings()).unwrap_err();
    assert_eq!(e.kind, OpenErrorKind::Corrupt);
    assert_eq!(
        e.to_string(),
        format!(
            "store {}: corrupt (not a database, or damaged pages): file is not a database",
            garbage.display()
        )
    );
    assert_eq!(std::fs::read(&garbage).unwrap(), bytes, "not overwritten");

    // A real store whose pages after the first were damaged: the header reads, the check
    // does not pass.
    let damaged = dir.join("damaged.db");
    {
        let mut db = Db::open(&damaged, settings()).unwrap();
        let big = format!("\"{}\"", "x".repeat(20_000));
        for _ in 0..5 {
            db.insert_submitted(&big, SEAT, at(0)).unwrap();
        }
        db.compact().unwrap();
    }
    let mut file = std::fs::read(&damaged).unwrap();
    assert!(file.len() > 4 * 4096, "{} bytes", file.len());
    for b in &mut file[4096..] {
        *b = 0xA5;
    }
    std::fs::write(&damaged, &file).unwrap();
    let e = Db::open(&damaged, settings()).unwrap_err();
    assert_eq!(e.kind, OpenErrorKind::Corrupt, "{e}");
    assert!(
        e.to_string()
            .starts_with(&format!("store {}: corrupt", damaged.display())),
        "{e}"
    );
}

#[test]
fn a_read_only_directory_is_refused_with_the_file_named() {
    const TEST: &str = "a_read_only_directory_is_refused_with_the_file_named";
    if let Some((role, path)) = role() {
        assert_eq!(role, "read-only");
        let dir = path.parent().unwrap();
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "tmpfs",
            dir.to_str().unwrap(),
        ]);
        {
            let mut db = Db::open(&path, settings()).unwrap();
            db.insert_submitted("{}", SEAT, at(0)).unwrap();
        }
        mount(&["-o", "remount,ro", dir.to_str().unwrap()]);
        let cases = [
            ("existing", path.clone()),
            ("new", dir.join("new.db")),
            ("new-dir", dir.join("sub/loopd.db")),
        ];
        for (case, p) in cases {
            let e = Db::open(&p, settings()).unwrap_err();
            assert_eq!(e.kind, OpenErrorKind::Unwritable, "{case}: {e}");
            println!("=> refused {case}: {e}");
        }
        return;
    }
    let dir = llama_harness::temp_dir("fault-ro").join("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("loopd.db");
    let out = in_namespace(TEST, "read-only", &path);
    let d = dir.display();
    assert_eq!(
        marked(&out, "=> refused "),
        vec![
            format!("existing: store {d}/loopd.db: cannot be written (permissions or read-only): SQLite could open it for reading only"),
            format!("new: store {d}/new.db: cannot be written (permissions or read-only): unable to open database file: {d}/new.db"),
            format!("new-dir: store {d}/sub/loopd.db: cannot be written (permissions or read-only): creating {d}/sub: Read-only file system (os error 30)"),
        ]
    );
}

#[test]
fn a_full_disk_refuses_the_submit_and_loses_nothing_acknowledged() {
    const TEST: &str = "a_full_disk_refuses_the_submit_and_loses_nothing_acknowledged";
    if let Some((role, path)) = role() {
        assert_eq!(role, "disk-full");
        let dir = path.parent().unwrap();
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "tmpfs",
            dir.to_str().unwrap(),
        ]);
        // Another program's file on the same disk, deleted later to give space back.
        let filler = dir.join("filler");
        std::fs::write(&filler, vec![0u8; 512 * 1024]).unwrap();
        let mut db = Db::open(&path, settings()).unwrap();
        let payload = format!("\"{}\"", "p".repeat(8 * 1024));
        let mut acked = Vec::new();
        let refused = loop {
            assert!(acked.len() < 1_000, "the 1 MiB disk never filled");
            match db.insert_submitted(&payload, SEAT, at(0)) {
                Ok(id) => acked.push(id),
                Err(e) => break e,
            }
        };
        assert_eq!(refused, DbError::DiskFull);
        println!("=> refused after {} submits: {refused}", acked.len());
        assert_eq!(
            db.running().unwrap(),
            acked,
            "every acknowledged row is there"
        );
        // A finish on a full disk fails as a whole too; the request stays running.
        let big = format!("\"{}\"", "r".repeat(64 * 1024));
        assert_eq!(
            db.finish(acked[0], "completed", &big, at(1)),
            Err(DbError::DiskFull)
        );
        assert_eq!(
            db.take_result(acked[0], at(1)).unwrap(),
            Err(ResultError::Pending)
        );
        drop(db);
        // The next daemon opens the full disk's store (open writes nothing) and finds them
        // all; once space is freed, it ends and fetches them, and takes submits again.
        let mut db = Db::open(&path, settings()).unwrap();
        assert_eq!(db.running().unwrap(), acked);
        std::fs::remove_file(&filler).unwrap();
        // Until a checkpoint, everything written is in the WAL, which only grows: the
        // daemon's periodic compaction is what moves it into the database file.
        db.compact().unwrap();
        for &id in &acked[..acked.len() / 2] {
            db.finish(id, "completed", "0", at(2)).unwrap();
            assert_eq!(db.take_result(id, at(2)).unwrap(), Ok("0".into()));
        }
        let next = db.insert_submitted(&payload, SEAT, at(3)).unwrap();
        println!("=> accepted {next} once space was freed");
        assert_eq!(next, acked[acked.len() - 1] + 1);
        return;
    }
    let dir = llama_harness::temp_dir("fault-full").join("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    let out = in_namespace(TEST, "disk-full", &dir.join("loopd.db"));
    let refused = marked(&out, "=> refused after ");
    assert_eq!(refused.len(), 1, "{out}");
    assert!(
        refused[0].ends_with("submits: the store's disk is full"),
        "{out}"
    );
    assert_eq!(marked(&out, "=> accepted ").len(), 1, "{out}");
}

/// The answer of the daemon test below: a first word, then 100 KiB in ten pieces, 300 ms
/// apart, so its result is larger than any room a full disk leaves in the store's files.
fn big_answer() -> (Reply, String) {
    let piece = "x".repeat(10 * 1024);
    let mut pieces = vec![json_content("start ")];
    pieces.extend((0..10).map(|_| json_content(&piece)));
    pieces.push(json_chunk(json!({}), Some("stop"), 5));
    pieces.push(done());
    let reply = Reply::sse(pieces).each_after(Duration::from_millis(300));
    (reply, format!("start {}", piece.repeat(10)))
}

/// The daemon on a full disk: a submit is refused `STORE_FULL` with the store named;
/// the two requests it had acknowledged end on the full disk, and their results, which the
/// store cannot take, are kept in memory: one is fetched from there while the disk is full, the
/// other is written once space is freed (and found by the next open of the store); then
/// submits are taken again, with a greater id.
#[test]
fn a_full_disk_at_the_daemon_refuses_submits_and_keeps_the_results_it_owes() {
    const TEST: &str = "a_full_disk_at_the_daemon_refuses_submits_and_keeps_the_results_it_owes";
    if let Some((role, path)) = role() {
        assert_eq!(role, "daemon-disk-full");
        let dir = path.parent().unwrap();
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "tmpfs",
            dir.to_str().unwrap(),
        ]);
        let (reply, content) = big_answer();
        let server = FakeServer::start(vec![(CHAT, vec![reply.clone(), reply.clone(), reply])]);
        let mut d = Running::start_with_store(
            &server,
            3,
            Arc::new(clock::SystemClock::new()),
            Duration::from_secs(60),
            &path,
        );
        let id = |v: Value| v["id"].as_u64().unwrap_or_else(|| panic!("no id: {v}"));
        let (fetched, held) = (id(d.call(submit("a"))), id(d.call(submit("b"))));
        // Another program fills the disk.
        let filler = dir.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write_all(&[0u8; 4096]).is_ok() {}
        drop(f);
        let big = "q".repeat(200 * 1024);
        let refused =
            d.call(json!({"cmd": "submit", "messages": [{"role": "user", "content": big}]}));
        assert_eq!(error_of(&refused), "STORE_FULL", "{refused}");
        let detail = refused["detail"].as_str().unwrap_or("");
        assert!(
            detail.contains(path.to_str().unwrap()) && detail.contains("already acknowledged"),
            "{refused}"
        );
        println!("=> refused: {detail}");
        // The first ends on the full disk and is fetched whole, from memory.
        let r = d.call(json!({"cmd": "wait", "id": fetched, "timeout_ms": 20_000}));
        assert_eq!(r["result"]["outcome"], "completed", "{r}");
        assert_eq!(r["result"]["content"].as_str(), Some(content.as_str()));
        println!("=> fetched {fetched} on the full disk");
        // The second ends too (it runs beside the first) and is not fetched yet.
        let ended = |d: &Running| {
            let s = d.call(json!({"cmd": "status"}));
            s["status"]["running"]
                .as_array()
                .is_some_and(|r| r.iter().all(|x| x["id"] != json!(held)))
        };
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while !ended(&d) {
            assert!(
                std::time::Instant::now() < until,
                "request {held} never ended"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Space comes back: the daemon's maintenance writes the held result, and takes submits.
        std::fs::remove_file(&filler).unwrap();
        let again = d.call(submit("c"));
        let next = id(again);
        assert!(next > held, "{next} after {held}");
        println!("=> accepted {next} once space was freed");
        d.stop();
        drop(d);
        let mut db = Db::open(&path, settings()).unwrap();
        match db.take_result(held, SystemTime::now()).unwrap() {
            Ok(body) => {
                let v: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(v["outcome"], "completed", "{body}");
                assert_eq!(v["content"].as_str(), Some(content.as_str()));
            }
            other => panic!("request {held}'s result was not stored: {other:?}"),
        }
        println!("=> stored {held}");
        // The one fetched from memory left no row behind to come back as daemon_restarted.
        assert_eq!(
            db.take_result(fetched, SystemTime::now()).unwrap(),
            Err(ResultError::NotFound)
        );
        return;
    }
    let dir = llama_harness::temp_dir("fault-daemon-full").join("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    let out = in_namespace(TEST, "daemon-disk-full", &dir.join("loopd.db"));
    for marker in ["=> refused: ", "=> fetched ", "=> accepted ", "=> stored "] {
        assert_eq!(marked(&out, marker).len(), 1, "{marker}: {out}");
    }
}

/// A daemon that writes, checkpoints and acknowledges in a loop is SIGKILLed mid-stream: the
/// next open finds every acknowledged request, with its checkpoint, and gives new ids above
/// all of them.
#[test]
fn a_sigkilled_daemon_loses_nothing_it_acknowledged() {
    const TEST: &str = "a_sigkilled_daemon_loses_nothing_it_acknowledged";
    if let Some((role, path)) = role() {
        assert_eq!(role, "writer");
        let mut db = Db::open(&path, keep_all()).unwrap();
        let mut out = std::io::stdout().lock();
        for n in 0.. {
            let id = db
                .insert_submitted(&format!("{{\"n\":{n}}}"), SEAT, at(n))
                .unwrap();
            db.checkpoint(id, &format!("\"out-{id}\""), at(n)).unwrap();
            if n % 3 == 0 {
                db.finish(id, "completed", &format!("\"done-{id}\""), at(n))
                    .unwrap();
            }
            writeln!(out, "acked {id}").unwrap();
            out.flush().unwrap();
        }
        unreachable!();
    }
    let path = llama_harness::temp_dir("fault-kill").join("loopd.db");
    let mut writer = rerun(TEST, "writer", &path, &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    let mut lines = BufReader::new(writer.stdout.take().unwrap()).lines();
    while acked.len() < 300 {
        let line = lines.next().expect("the writer died early").unwrap();
        if let Some(id) = line.strip_prefix("acked ") {
            acked.push(id.parse::<u64>().unwrap());
        }
    }
    writer.kill().unwrap(); // SIGKILL, mid-write as likely as not.
    writer.wait().unwrap();
    let max_acked = *acked.last().unwrap();

    let mut db = Db::open(&path, keep_all()).unwrap();
    let running = db.running().unwrap();
    let recovered = db
        .recover(at(1_000_000), |r| r.output.unwrap_or("null").to_string())
        .unwrap();
    assert_eq!(recovered, running);
    for &id in &acked {
        let want = if id % 3 == 1 {
            format!("\"done-{id}\"")
        } else {
            format!("\"out-{id}\"")
        };
        assert_eq!(
            db.take_result(id, at(1_000_001)).unwrap(),
            Ok(want),
            "id {id}"
        );
    }
    let next = db.insert_submitted("{}", SEAT, at(1_000_002)).unwrap();
    assert!(next > max_acked, "{next} after {max_acked}");
    assert!(
        recovered.iter().all(|&id| id < next),
        "rows written after the last ack are ended as well: {recovered:?}"
    );
}
