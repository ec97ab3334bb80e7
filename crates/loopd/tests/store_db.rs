//! The durable store's rules (`loopd::daemon::Db`), each on a fresh file in a temp dir, on
//! wall-clock times the test chooses: written before acknowledged, fetched once, pending while
//! running, checkpoints, restart recovery, TTL and cap with their evictions, ids never reused,
//! the file's size bounded, the schema's version, and the default path.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loopd::daemon::{
    store_path, Db, DbError, DbSettings, Durability, EvictReason, Evicted, Interrupted,
    NoStorePath, OpenErrorKind, RESTARTED, SCHEMA_VERSION,
};
use loopd_agent::runner::{ResultError, Seat};

/// The seat of a request on the one server of a plain config.
const SEAT: Seat<'static> = Seat {
    host: None,
    slot: 0,
};
use rusqlite::Connection;

/// Wall time `ms` milliseconds after an arbitrary fixed date.
fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(ms)
}

fn settings(ttl_ms: u64, cap: usize) -> DbSettings {
    DbSettings {
        durability: Durability::Normal,
        ttl: Duration::from_millis(ttl_ms),
        cap,
    }
}

fn fresh(tag: &str) -> PathBuf {
    llama_harness::temp_dir(tag).join("loopd.db")
}

fn drained(db: &mut Db) -> Vec<Evicted> {
    std::iter::from_fn(|| db.poll_evicted()).collect()
}

fn ev(id: u64, reason: EvictReason) -> Evicted {
    Evicted { id, reason }
}

#[test]
fn a_result_is_pending_then_fetched_once() {
    let mut db = Db::open(&fresh("db-once"), settings(1_000, 10)).unwrap();
    let id = db.insert_submitted(r#"{"q":1}"#, SEAT, at(0)).unwrap();
    assert_eq!(id, 1);
    assert_eq!(db.running().unwrap(), vec![1]);
    assert_eq!(db.take_result(1, at(1)).unwrap(), Err(ResultError::Pending));
    assert_eq!(db.peek_result(1, at(1)).unwrap(), Err(ResultError::Pending));
    assert!(db.knows(1, at(1)).unwrap());
    db.finish(1, "completed", r#"{"r":1}"#, at(5)).unwrap();
    assert_eq!(db.running().unwrap(), Vec::<u64>::new());
    assert_eq!(db.kept().unwrap(), 1);
    assert_eq!(
        db.peek_result(1, at(6)).unwrap(),
        Ok(r#"{"r":1}"#.to_string()),
        "a peek leaves it"
    );
    assert_eq!(
        db.take_result(1, at(6)).unwrap(),
        Ok(r#"{"r":1}"#.to_string())
    );
    assert_eq!(
        db.take_result(1, at(7)).unwrap(),
        Err(ResultError::NotFound)
    );
    assert_eq!(
        db.take_result(99, at(7)).unwrap(),
        Err(ResultError::NotFound)
    );
    assert!(!db.knows(1, at(7)).unwrap());
    assert_eq!(db.kept().unwrap(), 0);
    assert!(drained(&mut db).is_empty());
}

#[test]
fn checkpoint_and_finish_only_touch_a_running_request() {
    let mut db = Db::open(&fresh("db-running"), settings(1_000, 10)).unwrap();
    let id = db.insert_submitted("{}", SEAT, at(0)).unwrap();
    db.checkpoint(id, r#"{"content":"he"}"#, at(1)).unwrap();
    db.checkpoint(id, r#"{"content":"hello"}"#, at(2)).unwrap();
    db.finish(id, "completed", "{}", at(3)).unwrap();
    assert_eq!(
        db.checkpoint(id, "{}", at(4)),
        Err(DbError::NotRunning { id })
    );
    assert_eq!(
        db.finish(id, "completed", "{}", at(4)),
        Err(DbError::NotRunning { id })
    );
    assert_eq!(
        db.checkpoint(7, "{}", at(4)),
        Err(DbError::NotRunning { id: 7 })
    );
    assert_eq!(
        db.finish(u64::MAX, "x", "{}", at(4)),
        Err(DbError::NotRunning { id: u64::MAX })
    );
    assert_eq!(
        DbError::NotRunning { id: 7 }.to_string(),
        "request 7 is not running in the store"
    );
    assert_eq!(DbError::DiskFull.to_string(), "the store's disk is full");
}

#[test]
fn a_result_expires_at_its_ttl_to_the_millisecond_and_is_reported_once() {
    let mut db = Db::open(&fresh("db-ttl"), settings(1_000, 10)).unwrap();
    let id = db.insert_submitted("{}", SEAT, at(0)).unwrap();
    db.finish(id, "completed", "{}", at(500)).unwrap();
    assert_eq!(db.poll_timeout().unwrap(), Some(at(1_500)));
    db.expire(at(1_499)).unwrap();
    assert!(db.knows(id, at(1_499)).unwrap());
    assert!(drained(&mut db).is_empty());
    assert!(!db.knows(id, at(1_500)).unwrap());
    assert_eq!(
        db.peek_result(id, at(1_500)).unwrap(),
        Err(ResultError::NotFound)
    );
    assert_eq!(
        db.take_result(id, at(1_500)).unwrap(),
        Err(ResultError::NotFound)
    );
    assert_eq!(drained(&mut db), vec![ev(id, EvictReason::Expired)]);
    db.expire(at(9_000)).unwrap();
    assert!(drained(&mut db).is_empty());
    assert_eq!(db.poll_timeout().unwrap(), None);
    assert_eq!(db.kept().unwrap(), 0);
}

#[test]
fn past_the_cap_the_oldest_result_goes() {
    let mut db = Db::open(&fresh("db-cap"), settings(1_000, 2)).unwrap();
    for t in [0, 10, 20] {
        let id = db.insert_submitted("{}", SEAT, at(t)).unwrap();
        db.finish(id, "completed", &format!("{{\"n\":{id}}}"), at(t))
            .unwrap();
    }
    assert_eq!(db.kept().unwrap(), 2);
    assert_eq!(drained(&mut db), vec![ev(1, EvictReason::OverCap)]);
    assert_eq!(
        db.take_result(1, at(30)).unwrap(),
        Err(ResultError::NotFound)
    );
    assert_eq!(db.poll_timeout().unwrap(), Some(at(1_010)));
    // The cap counts results only: running requests are the runner's to limit.
    for _ in 0..3 {
        db.insert_submitted("{}", SEAT, at(40)).unwrap();
    }
    assert_eq!(db.running().unwrap(), vec![4, 5, 6]);
    assert_eq!(db.kept().unwrap(), 2);
    assert!(drained(&mut db).is_empty());
}

#[test]
fn finish_expires_first_and_a_cap_of_zero_keeps_one() {
    let mut db = Db::open(&fresh("db-cap0"), settings(100, 0)).unwrap();
    let a = db.insert_submitted("{}", SEAT, at(0)).unwrap();
    let b = db.insert_submitted("{}", SEAT, at(0)).unwrap();
    db.finish(a, "completed", "{}", at(0)).unwrap();
    db.finish(b, "completed", "{}", at(100)).unwrap();
    assert_eq!(
        drained(&mut db),
        vec![ev(a, EvictReason::Expired)],
        "expired at 100 before b arrived, so not over the cap"
    );
    assert_eq!(db.kept().unwrap(), 1);
}

#[test]
fn a_fetched_result_is_never_reported_as_evicted() {
    let mut db = Db::open(&fresh("db-fetched"), settings(100, 1)).unwrap();
    let a = db.insert_submitted("{}", SEAT, at(0)).unwrap();
    db.finish(a, "completed", "\"a\"", at(0)).unwrap();
    assert_eq!(db.take_result(a, at(1)).unwrap(), Ok("\"a\"".into()));
    let b = db.insert_submitted("{}", SEAT, at(2)).unwrap();
    db.finish(b, "completed", "\"b\"", at(2)).unwrap();
    assert_eq!(db.poll_timeout().unwrap(), Some(at(102)));
    db.expire(at(500)).unwrap();
    assert_eq!(drained(&mut db), vec![ev(b, EvictReason::Expired)]);
}

#[test]
fn evictions_are_reported_oldest_first() {
    let mut db = Db::open(&fresh("db-order"), settings(1_000, 10)).unwrap();
    let ids: Vec<u64> = (0..5)
        .map(|_| db.insert_submitted("{}", SEAT, at(0)).unwrap())
        .collect();
    // Ended in the order 3, 1, 5, 2, 4.
    for (k, &i) in [2usize, 0, 4, 1, 3].iter().enumerate() {
        db.finish(ids[i], "completed", "{}", at(k as u64)).unwrap();
    }
    db.expire(at(1_003)).unwrap();
    assert_eq!(
        drained(&mut db),
        [3, 1, 5, 2].map(|id| ev(id, EvictReason::Expired)).to_vec()
    );
}

#[test]
fn rows_and_ids_survive_a_reopen_and_ids_are_never_reused() {
    let path = fresh("db-reopen");
    {
        let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
        for _ in 0..3 {
            db.insert_submitted("{}", SEAT, at(0)).unwrap();
        }
        db.finish(3, "completed", "\"three\"", at(1)).unwrap();
        assert_eq!(db.take_result(3, at(2)).unwrap(), Ok("\"three\"".into()));
        db.finish(2, "cancelled", "\"two\"", at(2)).unwrap();
    }
    let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
    assert_eq!(db.running().unwrap(), vec![1]);
    assert_eq!(db.take_result(2, at(3)).unwrap(), Ok("\"two\"".into()));
    assert_eq!(
        db.insert_submitted("{}", SEAT, at(4)).unwrap(),
        4,
        "3 was the highest and was deleted; it is not given again"
    );
}

#[test]
fn recover_ends_every_running_request_with_its_checkpoint() {
    let path = fresh("db-recover");
    {
        let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
        for s in ["{\"s\":1}", "{\"s\":2}", "{\"s\":3}"] {
            db.insert_submitted(s, SEAT, at(10)).unwrap();
        }
        db.checkpoint(1, "\"partial one\"", at(20)).unwrap();
        db.finish(2, "completed", "\"two\"", at(30)).unwrap();
        // Dropped with 1 and 3 running: the daemon died.
    }
    let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
    let mut seen = Vec::new();
    let ended = db
        .recover(at(1_000), |r: &Interrupted<'_>| {
            seen.push((
                r.id,
                r.created,
                r.submission.to_string(),
                r.output.map(str::to_string),
            ));
            format!(
                "{{\"failed\":{},\"output\":{}}}",
                r.id,
                r.output.unwrap_or("null")
            )
        })
        .unwrap();
    assert_eq!(ended, vec![1, 3]);
    assert_eq!(
        seen,
        vec![
            (
                1,
                at(10),
                "{\"s\":1}".into(),
                Some("\"partial one\"".into())
            ),
            (3, at(10), "{\"s\":3}".into(), None),
        ]
    );
    assert_eq!(db.running().unwrap(), Vec::<u64>::new());
    assert_eq!(
        db.take_result(1, at(1_001)).unwrap(),
        Ok("{\"failed\":1,\"output\":\"partial one\"}".into())
    );
    assert_eq!(
        db.take_result(3, at(1_001)).unwrap(),
        Ok("{\"failed\":3,\"output\":null}".into())
    );
    assert_eq!(db.take_result(2, at(1_001)).unwrap(), Ok("\"two\"".into()));
    // The reason is a real column, for the daemon's queries (and an operator's).
    drop(db);
    let reasons = reasons(&path);
    assert!(reasons.is_empty(), "all fetched: {reasons:?}");
    assert_eq!(
        Db::open(&path, settings(60_000, 10))
            .unwrap()
            .recover(at(2_000), |_| unreachable!("nothing running"))
            .unwrap(),
        Vec::<u64>::new()
    );
}

#[test]
fn recovered_results_count_against_the_cap_and_carry_their_reason() {
    let path = fresh("db-recover-cap");
    {
        let mut db = Db::open(&path, settings(60_000, 2)).unwrap();
        for _ in 0..3 {
            db.insert_submitted("{}", SEAT, at(0)).unwrap();
        }
        db.finish(1, "completed", "\"one\"", at(5)).unwrap();
    }
    let mut db = Db::open(&path, settings(60_000, 2)).unwrap();
    assert_eq!(
        db.recover(at(10), |_| "\"lost\"".into()).unwrap(),
        vec![2, 3]
    );
    assert_eq!(drained(&mut db), vec![ev(1, EvictReason::OverCap)]);
    drop(db);
    assert_eq!(
        reasons(&path),
        vec![
            (2, "ended".into(), Some(RESTARTED.into())),
            (3, "ended".into(), Some(RESTARTED.into()))
        ]
    );
}

/// `(id, state, reason)` of every row, read with a plain connection (the store is closed).
fn reasons(path: &Path) -> Vec<(i64, String, Option<String>)> {
    let c = Connection::open(path).unwrap();
    let mut q = c
        .prepare("SELECT id, state, reason FROM requests ORDER BY id")
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The v1 schema as it shipped, frozen here: a file written by the first loopd with a store.
/// When the schema changes, this test keeps proving that such a file is migrated.
const V1_SCHEMA: &str = "
    PRAGMA auto_vacuum = INCREMENTAL;
    PRAGMA journal_mode = WAL;
    CREATE TABLE requests (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        state       TEXT    NOT NULL CHECK (state IN ('running', 'ended')),
        created_ms  INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL,
        ended_ms    INTEGER,
        reason      TEXT,
        submission  TEXT    NOT NULL,
        output      TEXT,
        result      TEXT,
        CHECK ((state = 'ended') = (ended_ms IS NOT NULL AND result IS NOT NULL))
    );
    CREATE INDEX requests_ended ON requests (ended_ms, id) WHERE state = 'ended';
    PRAGMA user_version = 1;
    PRAGMA application_id = 1819242352;";

#[test]
fn a_v1_file_written_by_hand_opens_with_its_rows() {
    let path = fresh("db-v1");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(V1_SCHEMA).unwrap();
        c.execute_batch(
            "INSERT INTO requests (id, state, created_ms, updated_ms, submission, output)
                 VALUES (41, 'running', 1700000000000, 1700000000500, '{}', '\"so far\"');
             INSERT INTO requests (id, state, created_ms, updated_ms, ended_ms, reason,
                                   submission, result)
                 VALUES (42, 'ended', 1700000000000, 1700000001000, 1700000001000,
                         'completed', '{}', '\"done\"');",
        )
        .unwrap();
    }
    let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
    assert_eq!(db.running().unwrap(), vec![41]);
    assert_eq!(
        db.take_result(42, at(2_000)).unwrap(),
        Ok("\"done\"".into())
    );
    assert_eq!(
        db.recover(at(2_000), |r| r.output.unwrap().to_string())
            .unwrap(),
        vec![41]
    );
    assert_eq!(db.insert_submitted("{}", SEAT, at(3_000)).unwrap(), 43);
    drop(db);
    let c = Connection::open(&path).unwrap();
    let version: u32 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

/// The v2 schema: v1 and the seat a request was placed on.
const V2_STEP: &str = "
    ALTER TABLE requests ADD COLUMN host TEXT;
    ALTER TABLE requests ADD COLUMN slot INTEGER;
    PRAGMA user_version = 2;";

/// Schema v3 as released: the sessions and their records.
const V3_STEP: &str = "
    CREATE TABLE sessions (
        name        TEXT    PRIMARY KEY,
        settings    TEXT    NOT NULL,
        created_ms  INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL,
        turns       INTEGER NOT NULL DEFAULT 0,
        bytes       INTEGER NOT NULL DEFAULT 0,
        prefix_key  TEXT
    );
    CREATE TABLE session_records (
        session     TEXT    NOT NULL,
        seq         INTEGER NOT NULL,
        turn        INTEGER NOT NULL,
        record      TEXT    NOT NULL,
        PRIMARY KEY (session, seq)
    );
    PRAGMA user_version = 3;";

/// A v2 store (a request running in it) migrates to v3: the request recovers as before, and
/// sessions open, append and delete in it.
#[test]
fn a_v2_store_migrates_to_v3_and_keeps_its_requests() {
    let path = fresh("db-v2");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(V1_SCHEMA).unwrap();
        c.execute_batch(V2_STEP).unwrap();
        c.execute_batch(
            "INSERT INTO requests (id, state, created_ms, updated_ms, submission, host, slot)
                 VALUES (9, 'running', 1700000000000, 1700000000000, '{}', 'gpu-a', 1);",
        )
        .unwrap();
    }
    let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
    let mut seen = Vec::new();
    db.recover(at(2), |r| {
        seen.push((r.id, r.host.map(str::to_owned), r.slot));
        String::new()
    })
    .unwrap();
    assert_eq!(seen, [(9, Some("gpu-a".into()), Some(1))]);
    assert_eq!(
        db.open_session(Some("s"), "{}", 10, at(3)).unwrap(),
        Ok("s".to_owned())
    );
    let id = db.insert_submitted("{}", SEAT, at(3)).unwrap();
    let append = loopd::daemon::TurnAppend {
        session: "s".into(),
        turn: 1,
        records: vec![r#"{"kind":"user","content":"hi"}"#.into()],
        prefix_key: "k".into(),
    };
    db.finish_turn(id, "stop", "{}", Some(&append), at(4))
        .unwrap();
    assert_eq!(
        db.session_records("s").unwrap(),
        [(1, r#"{"kind":"user","content":"hi"}"#.to_owned())]
    );
    let row = db.session("s").unwrap().unwrap();
    assert_eq!(
        (row.turns, row.bytes, row.prefix_key.as_deref()),
        (1, 30, Some("k"))
    );
    assert_eq!(db.delete_session("s").unwrap(), Ok(()));
    assert_eq!(db.session("s").unwrap(), None);
    assert!(db.session_records("s").unwrap().is_empty());
}

#[test]
fn a_v1_row_recovers_without_a_seat_and_a_new_one_keeps_its_seat() {
    let path = fresh("db-v1-seat");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(V1_SCHEMA).unwrap();
        c.execute_batch(
            "INSERT INTO requests (id, state, created_ms, updated_ms, submission)
                 VALUES (7, 'running', 1700000000000, 1700000000000, '{}');",
        )
        .unwrap();
    }
    let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
    let b = Seat {
        host: Some("gpu-b"),
        slot: 1,
    };
    let placed = db.insert_submitted("{}", b, at(1)).unwrap();
    let moved = db.insert_submitted("{}", SEAT, at(1)).unwrap();
    db.move_seat(moved, b).unwrap();
    let mut seen = Vec::new();
    db.recover(at(2), |r| {
        seen.push((r.id, r.host.map(str::to_owned), r.slot));
        String::new()
    })
    .unwrap();
    assert_eq!(
        seen,
        [
            (7, None, None),
            (placed, Some("gpu-b".into()), Some(1)),
            (moved, Some("gpu-b".into()), Some(1)),
        ]
    );
}

#[test]
fn the_current_schema_is_the_frozen_v3_one() {
    // Guards the migration test above: if the schema moves on without a new migration (and a
    // new frozen version here), the two no longer agree.
    let ours = fresh("db-schema-ours");
    drop(Db::open(&ours, settings(1, 1)).unwrap());
    let frozen = fresh("db-schema-frozen");
    let c = Connection::open(&frozen).unwrap();
    c.execute_batch(V1_SCHEMA).unwrap();
    c.execute_batch(V2_STEP).unwrap();
    c.execute_batch(V3_STEP).unwrap();
    drop(c);
    let schema = |p: &Path| -> Vec<(String, String, i64)> {
        let c = Connection::open(p).unwrap();
        let mut q = c
            .prepare(
                "SELECT 'column', name, 0 FROM pragma_table_info('requests')
                 UNION ALL SELECT type, name, 0 FROM sqlite_schema ORDER BY 1, 2",
            )
            .unwrap();
        let mut rows: Vec<(String, String, i64)> = q
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for pragma in ["user_version", "application_id", "auto_vacuum"] {
            let v: i64 = c
                .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
                .unwrap();
            rows.push(("pragma".into(), pragma.into(), v));
        }
        rows
    };
    assert_eq!(schema(&ours), schema(&frozen));
    assert_eq!(SCHEMA_VERSION, 3);
}

#[test]
fn a_newer_schema_is_refused_and_the_file_left_as_it_was() {
    let path = fresh("db-newer");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(V1_SCHEMA).unwrap();
        c.execute_batch("PRAGMA user_version = 4").unwrap();
    }
    let e = Db::open(&path, settings(1_000, 10)).unwrap_err();
    assert_eq!(
        e.kind,
        OpenErrorKind::NewerSchema {
            found: 4,
            supported: 3
        }
    );
    assert_eq!(
        e.to_string(),
        format!(
            "store {}: schema version 4 is newer than this loopd's 3 (a newer loopd wrote it): user_version 4",
            path.display()
        )
    );
    let c = Connection::open(&path).unwrap();
    let version: u32 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
}

#[test]
fn another_programs_database_is_refused() {
    let path = fresh("db-foreign");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let e = Db::open(&path, settings(1_000, 10)).unwrap_err();
    assert_eq!(e.kind, OpenErrorKind::NotAStore);
    assert_eq!(
        e.to_string(),
        format!(
            "store {}: not a loopd store (another program's database): application_id 0x0, user_version 0, 1 schema rows",
            path.display()
        )
    );
    let other = fresh("db-foreign-app");
    Connection::open(&other)
        .unwrap()
        .execute_batch("PRAGMA application_id = 7; PRAGMA user_version = 1;")
        .unwrap();
    assert_eq!(
        Db::open(&other, settings(1_000, 10)).unwrap_err().kind,
        OpenErrorKind::NotAStore
    );
}

#[test]
fn open_makes_the_missing_directories() {
    let path = llama_harness::temp_dir("db-mkdir").join("a/b/loopd.db");
    let mut db = Db::open(&path, settings(1_000, 10)).unwrap();
    assert_eq!(db.insert_submitted("{}", SEAT, at(0)).unwrap(), 1);
    assert_eq!(db.path(), path);
}

#[test]
fn full_durability_opens_and_writes_the_same() {
    let path = fresh("db-full");
    let mut db = Db::open(
        &path,
        DbSettings {
            durability: Durability::Full,
            ..settings(1_000, 10)
        },
    )
    .unwrap();
    let id = db.insert_submitted("{}", SEAT, at(0)).unwrap();
    db.finish(id, "completed", "1", at(1)).unwrap();
    assert_eq!(db.take_result(id, at(2)).unwrap(), Ok("1".into()));
    assert_eq!(
        (Durability::Normal.as_str(), Durability::Full.as_str()),
        ("normal", "full")
    );
}

/// 5,000 requests of 8 KiB submissions and 16 KiB results, every other one fetched and the
/// rest expired, with `compact` on each expiry tick: the files stay near what is kept, not
/// what went through (115 MiB of payloads).
#[test]
fn the_files_stay_bounded_in_a_long_run() {
    let path = fresh("db-bounded");
    let mut db = Db::open(&path, settings(1_000, 100)).unwrap();
    let submission = format!("\"{}\"", "s".repeat(8 * 1024));
    let result = format!("\"{}\"", "r".repeat(16 * 1024));
    let (mut peak, mut after_compact) = (0, 0);
    for n in 0..5_000u64 {
        let t = n * 10;
        let id = db.insert_submitted(&submission, SEAT, at(t)).unwrap();
        db.checkpoint(id, &result[..4096], at(t)).unwrap();
        db.finish(id, "completed", &result, at(t)).unwrap();
        if n % 2 == 0 {
            assert!(db.take_result(id, at(t)).unwrap().is_ok());
        }
        peak = peak.max(db.file_bytes());
        if n % 250 == 249 {
            db.expire(at(t)).unwrap();
            db.compact().unwrap();
            after_compact = after_compact.max(db.file_bytes());
        }
        while db.poll_evicted().is_some() {}
    }
    // At most 100 results of ~16 KiB kept (1.3 MB measured after a compaction), plus a WAL
    // that SQLite checkpoints at 1,000 pages (5.5 MB measured at the peak).
    eprintln!("over 5,000 requests: peak {peak} bytes, {after_compact} after a compaction");
    assert!(peak < 8 << 20, "peak {peak} bytes");
    assert!(
        after_compact < 2 << 20,
        "{after_compact} bytes after a compaction"
    );
    db.expire(at(10_000_000)).unwrap();
    db.compact().unwrap();
    assert_eq!(db.kept().unwrap(), 0);
    assert!(
        db.file_bytes() < 64 * 1024,
        "an empty store is a few pages: {}",
        db.file_bytes()
    );
}

/// A compaction empties the WAL and then restarts it itself (a new header, synced, and one
/// page), so the next submit's insert appends to a WAL already begun instead of paying that
/// sync before its acknowledgement.
#[test]
fn a_compaction_leaves_the_wal_begun_so_the_next_insert_does_not_restart_it() {
    let path = fresh("db-wal-begun");
    let mut db = Db::open(&path, settings(1_000, 100)).unwrap();
    let wal = path.with_extension("db-wal");
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    for n in 0..3u64 {
        let id = db.insert_submitted("\"x\"", SEAT, at(n)).unwrap();
        db.finish(id, "completed", "\"r\"", at(n)).unwrap();
        assert!(db.take_result(id, at(n)).unwrap().is_ok());
    }
    db.compact().unwrap();
    // The WAL header (32 bytes) and one frame (24 bytes and a page) are there already.
    let page = 4096;
    assert_eq!(wal_len(), 32 + 24 + page, "the WAL after a compaction");
    let before = wal_len();
    db.insert_submitted("\"y\"", SEAT, at(9)).unwrap();
    assert!(
        wal_len() > before,
        "the insert appended to the WAL ({before} -> {} bytes)",
        wal_len()
    );
}

#[test]
fn the_default_path_follows_systemd_then_xdg_then_home() {
    let os = |s: &'static str| Some(OsStr::new(s));
    let p = |s: &str| Ok(PathBuf::from(s));
    assert_eq!(
        store_path(
            Some(Path::new("/etc/x.db")),
            os("/var/lib/loopd"),
            os("/x"),
            os("/h")
        ),
        p("/etc/x.db")
    );
    assert_eq!(
        store_path(None, os("/var/lib/loopd"), os("/x"), os("/h")),
        p("/var/lib/loopd/loopd.db")
    );
    assert_eq!(
        store_path(None, os("/var/lib/loopd:/var/lib/other"), None, None),
        p("/var/lib/loopd/loopd.db"),
        "several StateDirectory= entries: the first"
    );
    assert_eq!(
        store_path(None, os(""), os("/x/state"), os("/h")),
        p("/x/state/loopd/loopd.db")
    );
    assert_eq!(
        store_path(None, None, os("relative"), os("/home/u")),
        p("/home/u/.local/state/loopd/loopd.db"),
        "a relative XDG_STATE_HOME is ignored"
    );
    assert_eq!(
        store_path(None, None, os(""), os("/home/u")),
        p("/home/u/.local/state/loopd/loopd.db")
    );
    assert_eq!(store_path(None, None, None, None), Err(NoStorePath));
    assert_eq!(store_path(None, os(""), os(""), os("")), Err(NoStorePath));
    assert_eq!(
        NoStorePath.to_string(),
        "no place for the store: set [daemon] store, or STATE_DIRECTORY, XDG_STATE_HOME or HOME"
    );
}

/// An operator reads the live store (`sqlite3 -readonly /var/lib/loopd/loopd.db`)
/// while the daemon holds it: the reader sees what was committed, the daemon's writes go on
/// while a read is open, a compaction waits for no reader's permission, and a second `Db` is
/// still refused while the first holds the owner lock beside the file.
#[test]
fn a_reader_reads_the_live_store_read_only_while_a_db_holds_it() {
    let path = fresh("db-live-reader");
    let mut db = Db::open(&path, settings(60_000, 10)).unwrap();
    let first = db.insert_submitted(r#"{"q":1}"#, SEAT, at(0)).unwrap();
    db.finish(first, "completed", r#"{"r":1}"#, at(5)).unwrap();
    let second = db.insert_submitted(r#"{"q":2}"#, SEAT, at(10)).unwrap();

    let reader = Connection::open_with_flags(
        &path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    let rows = |c: &Connection| -> Vec<(i64, String, Option<String>)> {
        c.prepare("SELECT id, state, reason FROM requests ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(
        rows(&reader),
        vec![
            (1, "ended".into(), Some("completed".into())),
            (2, "running".into(), None)
        ]
    );
    assert_eq!(
        reader
            .query_row("SELECT result FROM requests WHERE id = 1", [], |r| r
                .get::<_, String>(0))
            .unwrap(),
        r#"{"r":1}"#
    );

    // A read left open: the daemon still writes and compacts, and the reader then sees it.
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(rows(&reader).len(), 2);
    db.finish(second, "cancelled", r#"{"r":2}"#, at(20))
        .unwrap();
    db.compact().unwrap();
    assert_eq!(rows(&reader)[1].1, "running", "a read sees one snapshot");
    reader.execute_batch("COMMIT").unwrap();
    assert_eq!(
        rows(&reader)[1],
        (2, "ended".into(), Some("cancelled".into()))
    );

    let e = Db::open(&path, settings(60_000, 10)).unwrap_err();
    assert_eq!(e.kind, OpenErrorKind::Locked, "{e}");
    assert!(path.with_extension("db.lock").exists());
    drop(reader);
    drop(db);
    assert!(Db::open(&path, settings(60_000, 10)).is_ok());
}
