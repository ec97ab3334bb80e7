//! [`Db`]: the daemon's durable store, one SQLite table of requests and their results.
//!
//! Every request the daemon acknowledges is a row written before the acknowledgement
//! ([`Db::insert_submitted`]); its streamed output is checkpointed into the row while it runs
//! ([`Db::checkpoint`]); its result replaces the output when it ends ([`Db::finish`], one
//! transaction); a client fetches it once ([`Db::take_result`]). What this promises:
//!
//! - an acknowledged row survives the daemon's death (SIGKILL, OOM, a panic) in either
//!   [`Durability`]; with [`Durability::Full`] it also survives a power loss;
//! - ids are never reused, across restarts too (`AUTOINCREMENT`);
//! - a request still running when the daemon died is, after [`Db::recover`], a result with
//!   reason [`RESTARTED`] and the output it had checkpointed;
//! - a result is kept at most `ttl` after it ended and at most `cap` of them, the oldest going
//!   first: each eviction is reported
//!   once by [`Db::poll_evicted`], and [`Db::poll_timeout`] says when the next one is due;
//! - the file stays bounded in a long run: rows are deleted when fetched or evicted, and
//!   [`Db::compact`] gives freed pages back (incremental vacuum) and truncates the WAL;
//! - one process owns the file: an exclusive `flock` on [`lock_path`] (`loopd.db.lock`
//!   beside it) is held from [`Db::open`] until the [`Db`] is dropped, so a second daemon on
//!   the same file is refused with [`OpenErrorKind::Locked`]; SQLite itself runs WAL with
//!   normal locking, so a reader (`sqlite3 -readonly loopd.db`, an operator's query) reads
//!   the live store while the daemon writes, and sees what was committed. The WAL index is
//!   the mapped `-shm` file beside it; SQLite writes each of its pages when it grows it, so a
//!   full disk is an error there, not a SIGBUS;
//! - a full disk is [`DbError::DiskFull`] on the write that met it, which is rolled back:
//!   nothing written before is lost.
//!
//! Time is an input: every entry point that needs it takes `now` as wall-clock time (the
//! daemon's `Clock::wall`), since the rows outlive the process and its monotonic clock. The
//! payloads (submission, output, result) are JSON text the store does not read.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};

use loopd_agent::runner::{ResultError, Seat};

mod sessions;
pub use sessions::{SessionRefusal, SessionRow, TurnAppend};

/// The schema this binary writes (`PRAGMA user_version`). A file with a newer one is refused.
pub const SCHEMA_VERSION: u32 = 3;

/// `PRAGMA application_id` of a loopd store ("loop" in ASCII), so another program's SQLite
/// file named as the store is refused rather than written into.
pub const APPLICATION_ID: i32 = 0x6c6f_6f70;

/// The `reason` of a request that was running when the daemon died.
pub const RESTARTED: &str = "daemon_restarted";

/// The file name of the store in its state directory.
pub const FILE_NAME: &str = "loopd.db";

/// `MIGRATIONS[v]` takes a file from schema version `v` to `v + 1`, in one transaction.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    // v0 -> v1: the requests table. `state` is `running` (with `output`, the last
    // checkpoint) or `ended` (with `ended_ms`, `reason` and `result`); times are milliseconds
    // since the Unix epoch.
    "CREATE TABLE requests (
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
    CREATE INDEX requests_ended ON requests (ended_ms, id) WHERE state = 'ended';",
    // v1 -> v2: the seat a request was placed on (`host`, the host's name with several
    // hosts, else NULL; `slot`, the server slot), written with the request, so a result
    // recovered after the daemon's death names its host as a finished one does.
    "ALTER TABLE requests ADD COLUMN host TEXT;
    ALTER TABLE requests ADD COLUMN slot INTEGER;",
    // v2 -> v3: sessions (docs/sessions.md). `settings` is the session's settings as JSON,
    // `turns` the turns completed, `bytes` the sum of its records' JSON, `prefix_key` what
    // its last turn's prompt opened with (settings and template), to tell whether the next
    // one extends it. A record is one JSON line of the log, numbered in order per session.
    "CREATE TABLE sessions (
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
    );",
];

/// How long a commit waits for the disk (`PRAGMA synchronous`); `[daemon] store_sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// `NORMAL`: a commit survives the process's death; the last commits before a power loss
    /// may be lost (never the file's consistency). No fsync per commit.
    #[default]
    Normal,
    /// `FULL`: a commit is on the disk (fsync) before it returns, so it survives a power loss.
    Full,
}

impl Durability {
    /// `normal` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Normal => "normal",
            Durability::Full => "full",
        }
    }
}

/// How [`Db::open`] sets up the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbSettings {
    /// Fsync per commit or not.
    pub durability: Durability,
    /// How long a result is kept after it ended (`runner.result_ttl_s`).
    pub ttl: Duration,
    /// How many results are kept at most (`runner.max_results`; at least 1).
    pub cap: usize,
}

/// Why [`Db::open`] refused the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenErrorKind {
    /// Another process (another `loopd serve`) holds the file.
    Locked,
    /// The file is not a database, or its pages fail SQLite's integrity check.
    Corrupt,
    /// A SQLite database, but another program's (its application id, or tables without a
    /// loopd schema version).
    NotAStore,
    /// The file or its directory cannot be written (permissions, a read-only file system).
    Unwritable,
    /// The file was written by a newer loopd whose schema this binary does not know.
    NewerSchema {
        /// The file's `user_version`.
        found: u32,
        /// [`SCHEMA_VERSION`].
        supported: u32,
    },
    /// The disk is full.
    DiskFull,
    /// Any other failure (SQLite's message is in the detail).
    Failed,
}

/// [`Db::open`]'s error: the file, what is wrong with it, and what SQLite or the OS said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError {
    /// The store's path.
    pub path: PathBuf,
    /// What is wrong.
    pub kind: OpenErrorKind,
    /// SQLite's or the OS's own words.
    pub detail: String,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            OpenErrorKind::Locked => {
                "locked by another process (is another loopd serve using this store?)".to_string()
            }
            OpenErrorKind::Corrupt => "corrupt (not a database, or damaged pages)".to_string(),
            OpenErrorKind::NotAStore => "not a loopd store (another program's database)".into(),
            OpenErrorKind::Unwritable => "cannot be written (permissions or read-only)".into(),
            OpenErrorKind::NewerSchema { found, supported } => format!(
                "schema version {found} is newer than this loopd's {supported} (a newer loopd wrote it)"
            ),
            OpenErrorKind::DiskFull => "the disk is full".to_string(),
            OpenErrorKind::Failed => "cannot be opened".to_string(),
        };
        write!(f, "store {}: {what}: {}", self.path.display(), self.detail)
    }
}

impl std::error::Error for OpenError {}

/// Why a write or read of an open [`Db`] failed; the write was rolled back whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DbError {
    /// The disk is full: the daemon refuses the submit; nothing written before is lost.
    DiskFull,
    /// `checkpoint` or `finish` of an id that is not running (unknown, or already ended).
    NotRunning {
        /// The id.
        id: u64,
    },
    /// Any other SQLite failure, by its extended result code.
    Failed {
        /// SQLite's extended result code.
        code: i32,
    },
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DbError::DiskFull => f.write_str("the store's disk is full"),
            DbError::NotRunning { id } => write!(f, "request {id} is not running in the store"),
            DbError::Failed { code } => write!(
                f,
                "the store failed: {} (SQLite code {code})",
                rusqlite::ffi::code_to_str(code)
            ),
        }
    }
}

impl std::error::Error for DbError {}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::DiskFull => {
                DbError::DiskFull
            }
            rusqlite::Error::SqliteFailure(f, _) => DbError::Failed {
                code: f.extended_code,
            },
            // A value the store wrote itself did not read back (a bug, not a user's input).
            _ => DbError::Failed {
                code: rusqlite::ffi::SQLITE_MISMATCH,
            },
        }
    }
}

/// Why a result left the store without being fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// It was kept for the whole `result_ttl_s`.
    Expired,
    /// A newer result came in with `max_results` already kept; the oldest went.
    OverCap,
}

impl EvictReason {
    /// `expired` or `over_cap`.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictReason::Expired => "expired",
            EvictReason::OverCap => "over_cap",
        }
    }
}

/// One result dropped unfetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// The request's id.
    pub id: u64,
    /// Why.
    pub reason: EvictReason,
}

/// What [`Db::take_result`] found: the result (then removed from the store), or the runner's
/// own [`ResultError`]: `Pending` (still running) or `NotFound` (never submitted, already
/// fetched, or evicted). One spelling of both, for the runner's table and the store.
pub type Lookup<T> = Result<T, ResultError>;

/// A request found running by [`Db::recover`]: what its result is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted<'a> {
    /// The request's id.
    pub id: u64,
    /// When it was submitted.
    pub created: SystemTime,
    /// Its submission, as stored.
    pub submission: &'a str,
    /// Its last checkpointed output (`None`: none was).
    pub output: Option<&'a str>,
    /// The host it was placed on (`None` without several hosts, or in a v1 file's row).
    pub host: Option<&'a str>,
    /// The server slot it was placed on (`None` in a v1 file's row).
    pub slot: Option<u32>,
}

/// The durable store: one SQLite table of requests and results. What it promises (written
/// before acknowledged, ids never reused, restart recovery, TTL and cap, one owner, a full
/// disk) is in the docs at the top of `daemon/db.rs`.
#[derive(Debug)]
pub struct Db {
    conn: Connection,
    /// Dropped after `conn` (fields drop in order): the file is closed before another daemon
    /// may take it.
    _lock: OwnerLock,
    path: PathBuf,
    ttl_ms: i64,
    cap: i64,
    evicted: VecDeque<Evicted>,
}

/// How long a write of the daemon waits for a reader in SQLite's way (a checkpoint that
/// truncates the WAL waits for readers of it to finish their read).
const READER_WAIT: Duration = Duration::from_millis(200);

/// The lock file of the store at `path`: its name with `.lock` appended
/// (`/var/lib/loopd/loopd.db.lock`). It holds nothing; its `flock` says who owns the store.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// The exclusive `flock` on the store's lock file, held while the value lives. The kernel
/// drops it when the process dies however it dies, so a SIGKILLed daemon leaves no stale
/// lock; the file itself is left in place (removing it would race with the next opener).
#[derive(Debug)]
struct OwnerLock {
    _file: fs::File,
}

impl OwnerLock {
    fn take(path: &Path) -> Result<OwnerLock, (OpenErrorKind, String)> {
        let lock = lock_path(path);
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .map_err(|e| {
                let kind = match e.kind() {
                    std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem => OpenErrorKind::Unwritable,
                    std::io::ErrorKind::StorageFull => OpenErrorKind::DiskFull,
                    _ => OpenErrorKind::Failed,
                };
                (kind, format!("opening {}: {e}", lock.display()))
            })?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(OwnerLock { _file: file }),
            // The words SQLite used when its own exclusive lock refused a second daemon.
            Err(rustix::io::Errno::WOULDBLOCK) => {
                Err((OpenErrorKind::Locked, "database is locked".into()))
            }
            Err(e) => Err((
                OpenErrorKind::Failed,
                format!("flock {}: {e}", lock.display()),
            )),
        }
    }
}

/// Milliseconds since the Unix epoch (0 before it, saturating far after it).
fn ms(t: SystemTime) -> i64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn id_sql(id: u64) -> i64 {
    // Ids come from AUTOINCREMENT, so they fit; a larger one names no row.
    i64::try_from(id).unwrap_or(-1)
}

fn id_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn open_kind(e: &rusqlite::Error) -> OpenErrorKind {
    let rusqlite::Error::SqliteFailure(f, _) = e else {
        return OpenErrorKind::Failed;
    };
    match f.code {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => OpenErrorKind::Locked,
        ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => OpenErrorKind::Corrupt,
        ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied => {
            OpenErrorKind::Unwritable
        }
        ErrorCode::DiskFull => OpenErrorKind::DiskFull,
        _ => OpenErrorKind::Failed,
    }
}

impl Db {
    /// Opens (creating it and its directory if missing) the store at `path`, migrates it to
    /// [`SCHEMA_VERSION`], checks its pages, and holds it until dropped. Rows left running by
    /// a previous daemon stay running until [`Db::recover`].
    pub fn open(path: &Path, settings: DbSettings) -> Result<Db, OpenError> {
        let fail = |kind, detail: String| OpenError {
            path: path.to_path_buf(),
            kind,
            detail,
        };
        let sql = |e: rusqlite::Error| fail(open_kind(&e), e.to_string());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|e| {
                let kind = match e.kind() {
                    std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem => OpenErrorKind::Unwritable,
                    std::io::ErrorKind::StorageFull => OpenErrorKind::DiskFull,
                    _ => OpenErrorKind::Failed,
                };
                fail(kind, format!("creating {}: {e}", dir.display()))
            })?;
        }
        let mut conn = Connection::open(path).map_err(sql)?;
        // A reader holds SQLite's locks for a moment only (WAL readers never block the
        // writer); a short wait rather than an error when one is in the way of a checkpoint.
        conn.busy_timeout(READER_WAIT).map_err(sql)?;
        if conn.is_readonly("main").map_err(sql)? {
            return Err(fail(
                OpenErrorKind::Unwritable,
                "SQLite could open it for reading only".into(),
            ));
        }
        // Before the first read (opening reads nothing): a second daemon goes no further.
        let lock = OwnerLock::take(path).map_err(|(kind, detail)| fail(kind, detail))?;
        let app: i32 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(sql)?;
        let version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql)?;
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .map_err(sql)?;
        if version > SCHEMA_VERSION {
            return Err(fail(
                OpenErrorKind::NewerSchema {
                    found: version,
                    supported: SCHEMA_VERSION,
                },
                format!("user_version {version}"),
            ));
        }
        if (app != 0 && app != APPLICATION_ID) || (version == 0 && tables > 0) {
            return Err(fail(
                OpenErrorKind::NotAStore,
                format!("application_id {app:#x}, user_version {version}, {tables} schema rows"),
            ));
        }
        if version == 0 {
            // Only takes effect before the first table exists: freed pages can then be
            // handed back to the file system by `compact` without a full VACUUM.
            conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")
                .map_err(sql)?;
        }
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(sql)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(fail(
                OpenErrorKind::Unwritable,
                format!("SQLite kept journal_mode {mode} instead of wal"),
            ));
        }
        let sync = match settings.durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        conn.execute_batch(&format!("PRAGMA synchronous = {sync}"))
            .map_err(sql)?;
        if version < SCHEMA_VERSION {
            // Only then: an open of a current store writes nothing, so it works on a full disk.
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql)?;
            for (from, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                tx.execute_batch(step).map_err(|e| {
                    fail(open_kind(&e), format!("migrating from version {from}: {e}"))
                })?;
            }
            tx.execute_batch(&format!(
                "PRAGMA user_version = {SCHEMA_VERSION}; PRAGMA application_id = {APPLICATION_ID}"
            ))
            .map_err(sql)?;
            tx.commit().map_err(sql)?;
        }
        let check: String = conn
            .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
            .map_err(sql)?;
        if check != "ok" {
            return Err(fail(OpenErrorKind::Corrupt, check));
        }
        Ok(Db {
            conn,
            _lock: lock,
            path: path.to_path_buf(),
            ttl_ms: i64::try_from(settings.ttl.as_millis()).unwrap_or(i64::MAX),
            cap: i64::try_from(settings.cap.max(1)).unwrap_or(i64::MAX),
            evicted: VecDeque::new(),
        })
    }

    /// The file this store is in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stores a new running request placed on `seat` and returns its id, greater than every
    /// id this file has ever given. Committed when it returns: the caller acknowledges after
    /// this.
    pub fn insert_submitted(
        &mut self,
        submission: &str,
        seat: Seat<'_>,
        now: SystemTime,
    ) -> Result<u64, DbError> {
        let t = ms(now);
        self.conn.execute(
            "INSERT INTO requests (state, created_ms, updated_ms, submission, host, slot)
             VALUES ('running', ?1, ?1, ?2, ?3, ?4)",
            params![t, submission, seat.host, seat.slot],
        )?;
        Ok(id_of(self.conn.last_insert_rowid()))
    }

    /// The running request `id` was placed again, on `seat` (rehomed to another host).
    pub fn move_seat(&mut self, id: u64, seat: Seat<'_>) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE requests SET host = ?2, slot = ?3 WHERE id = ?1 AND state = 'running'",
            params![id_sql(id), seat.host, seat.slot],
        )?;
        Ok(())
    }

    /// Deletes the running request `id` that was never acknowledged (the daemon could not
    /// start it after all), or whose result a full disk kept in memory and a client has
    /// fetched from there, so it does not come back as `daemon_restarted`.
    pub fn forget(&mut self, id: u64) -> Result<(), DbError> {
        let n = self.conn.execute(
            "DELETE FROM requests WHERE id = ?1 AND state = 'running'",
            [id_sql(id)],
        )?;
        if n == 0 {
            return Err(DbError::NotRunning { id });
        }
        Ok(())
    }

    /// Replaces the running request's checkpointed output with `output` (all of it so far).
    pub fn checkpoint(&mut self, id: u64, output: &str, now: SystemTime) -> Result<(), DbError> {
        let n = self.conn.execute(
            "UPDATE requests SET output = ?2, updated_ms = ?3 WHERE id = ?1 AND state = 'running'",
            params![id_sql(id), output, ms(now)],
        )?;
        if n == 0 {
            return Err(DbError::NotRunning { id });
        }
        Ok(())
    }

    /// Ends the running request `id` with `result` (its checkpoint goes), in one transaction
    /// with the expiry at `now` and the cap that its arrival may push the oldest result past.
    pub fn finish(
        &mut self,
        id: u64,
        reason: &str,
        result: &str,
        now: SystemTime,
    ) -> Result<(), DbError> {
        self.finish_turn(id, reason, result, None, now)
    }

    /// [`Db::finish`], and in the same transaction a completed turn's records appended to
    /// its session's log: the result and the log are written together or not at all.
    pub fn finish_turn(
        &mut self,
        id: u64,
        reason: &str,
        result: &str,
        append: Option<&TurnAppend>,
        now: SystemTime,
    ) -> Result<(), DbError> {
        let t = ms(now);
        let tx = self.conn.transaction()?;
        if let Some(a) = append {
            sessions::append_in(&tx, a, t)?;
        }
        let mut evicted = expire_in(&tx, t, self.ttl_ms)?;
        let n = tx.execute(
            "UPDATE requests SET state = 'ended', ended_ms = ?2, updated_ms = ?2, reason = ?3,
                 result = ?4, output = NULL
             WHERE id = ?1 AND state = 'running'",
            params![id_sql(id), t, reason, result],
        )?;
        if n == 0 {
            return Err(DbError::NotRunning { id });
        }
        evicted.extend(cap_in(&tx, self.cap)?);
        tx.commit()?;
        self.evicted.extend(evicted);
        Ok(())
    }

    /// Removes and returns the result of `id` (expired ones first go, as [`Db::expire`]).
    pub fn take_result(&mut self, id: u64, now: SystemTime) -> Result<Lookup<String>, DbError> {
        self.expire(now)?;
        let taken: Option<String> = self
            .conn
            .query_row(
                "DELETE FROM requests WHERE id = ?1 AND state = 'ended' RETURNING result",
                [id_sql(id)],
                |r| r.get(0),
            )
            .optional()?;
        match taken {
            Some(result) => Ok(Ok(result)),
            None => self.lookup_running(id),
        }
    }

    /// The result of `id` without removing it (a follower's copy); an expired one is
    /// `NotFound` though not yet deleted.
    pub fn peek_result(&self, id: u64, now: SystemTime) -> Result<Lookup<String>, DbError> {
        let kept: Option<String> = self
            .conn
            .query_row(
                "SELECT result FROM requests WHERE id = ?1 AND state = 'ended' AND ended_ms > ?2",
                params![id_sql(id), ms(now).saturating_sub(self.ttl_ms)],
                |r| r.get(0),
            )
            .optional()?;
        match kept {
            Some(result) => Ok(Ok(result)),
            None => self.lookup_running(id),
        }
    }

    fn lookup_running(&self, id: u64) -> Result<Lookup<String>, DbError> {
        let running = self
            .conn
            .query_row(
                "SELECT 1 FROM requests WHERE id = ?1 AND state = 'running'",
                [id_sql(id)],
                |_| Ok(()),
            )
            .optional()?;
        Ok(match running {
            Some(()) => Err(ResultError::Pending),
            None => Err(ResultError::NotFound),
        })
    }

    /// Whether `id` is running, or ended and kept and not yet expired at `now`.
    pub fn knows(&self, id: u64, now: SystemTime) -> Result<bool, DbError> {
        Ok(!matches!(
            self.peek_result(id, now)?,
            Err(ResultError::NotFound)
        ))
    }

    /// Deletes every result kept for `ttl` or longer at `now`; each is reported once by
    /// [`Db::poll_evicted`].
    pub fn expire(&mut self, now: SystemTime) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        let evicted = expire_in(&tx, ms(now), self.ttl_ms)?;
        tx.commit()?;
        self.evicted.extend(evicted);
        Ok(())
    }

    /// The next eviction not yet drained, each exactly once, oldest first.
    pub fn poll_evicted(&mut self) -> Option<Evicted> {
        self.evicted.pop_front()
    }

    /// When the oldest kept result expires (`None`: nothing kept).
    pub fn poll_timeout(&self) -> Result<Option<SystemTime>, DbError> {
        let oldest: Option<i64> = self.conn.query_row(
            "SELECT min(ended_ms) FROM requests WHERE state = 'ended'",
            [],
            |r| r.get(0),
        )?;
        Ok(oldest.map(|t| at_ms(t.saturating_add(self.ttl_ms))))
    }

    /// The ids running now, in order.
    pub fn running(&self) -> Result<Vec<u64>, DbError> {
        let mut q = self
            .conn
            .prepare_cached("SELECT id FROM requests WHERE state = 'running' ORDER BY id")?;
        let ids = q.query_map([], |r| r.get::<_, i64>(0))?;
        Ok(ids.map(|id| id.map(id_of)).collect::<Result<_, _>>()?)
    }

    /// Results kept now (expired ones not yet deleted included).
    pub fn kept(&self) -> Result<usize, DbError> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM requests WHERE state = 'ended'",
            [],
            |r| r.get(0),
        )?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// At start: ends every request left running by a previous daemon with reason
    /// [`RESTARTED`] and the result `make_result` builds from what was stored of it, in one
    /// transaction, then applies the cap. Returns their ids in order.
    pub fn recover(
        &mut self,
        now: SystemTime,
        mut make_result: impl FnMut(&Interrupted<'_>) -> String,
    ) -> Result<Vec<u64>, DbError> {
        let t = ms(now);
        let tx = self.conn.transaction()?;
        let mut ended = Vec::new();
        {
            let mut q = tx.prepare(
                "SELECT id, created_ms, submission, output, host, slot FROM requests
                 WHERE state = 'running' ORDER BY id",
            )?;
            let mut rows = q.query([])?;
            while let Some(r) = rows.next()? {
                let id: i64 = r.get(0)?;
                let submission: String = r.get(2)?;
                let output: Option<String> = r.get(3)?;
                let host: Option<String> = r.get(4)?;
                let result = make_result(&Interrupted {
                    id: id_of(id),
                    created: at_ms(r.get(1)?),
                    submission: &submission,
                    output: output.as_deref(),
                    host: host.as_deref(),
                    slot: r.get(5)?,
                });
                ended.push((id, result));
            }
        }
        for (id, result) in &ended {
            tx.execute(
                "UPDATE requests SET state = 'ended', ended_ms = ?2, updated_ms = ?2,
                     reason = ?3, result = ?4, output = NULL
                 WHERE id = ?1",
                params![id, t, RESTARTED, result],
            )?;
        }
        let evicted = cap_in(&tx, self.cap)?;
        tx.commit()?;
        self.evicted.extend(evicted);
        Ok(ended.into_iter().map(|(id, _)| id_of(id)).collect())
    }

    /// Gives the pages freed by deleted rows back to the file system and truncates the WAL,
    /// so the files' size follows what is kept. The daemon calls it now and then (each
    /// expiry tick); it costs a checkpoint of what the WAL holds.
    ///
    /// The first write into an emptied WAL restarts it: SQLite writes a new WAL header and
    /// syncs it (an fsync, 0.5 ms on this VM's disk), and left to the next submit that sync
    /// fell between its arrival and its acknowledgement and POST (0.76 ms at the
    /// median of the daemon's insert on the e2e stack, 0.12 ms without it). So the
    /// compaction makes that first write itself, a rewrite of the schema version it already
    /// holds: one page in the WAL, and the next insert appends to it.
    pub fn compact(&mut self) -> Result<(), DbError> {
        // Stepped to the end: each step frees one page (`execute_batch` steps once).
        let mut vacuum = self.conn.prepare_cached("PRAGMA incremental_vacuum")?;
        let mut steps = vacuum.query([])?;
        while steps.next()?.is_some() {}
        drop(steps);
        drop(vacuum);
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        self.conn
            .execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
        Ok(())
    }

    /// The bytes the store takes on disk now: the database file and its WAL.
    pub fn file_bytes(&self) -> u64 {
        let len = |p: &Path| fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        len(&self.path) + len(Path::new(&wal))
    }
}

/// Deletes the results expired at `now_ms` and names them, oldest first.
fn expire_in(tx: &Connection, now_ms: i64, ttl_ms: i64) -> Result<Vec<Evicted>, DbError> {
    let mut q = tx.prepare_cached(
        "DELETE FROM requests WHERE state = 'ended' AND ended_ms <= ?1 RETURNING ended_ms, id",
    )?;
    let gone = q.query_map([now_ms.saturating_sub(ttl_ms)], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
    })?;
    evicted(gone, EvictReason::Expired)
}

/// Deletes the oldest results past `cap` and names them, oldest first.
fn cap_in(tx: &Connection, cap: i64) -> Result<Vec<Evicted>, DbError> {
    let mut q = tx.prepare_cached(
        "DELETE FROM requests WHERE id IN (
             SELECT id FROM requests WHERE state = 'ended'
             ORDER BY ended_ms DESC, id DESC LIMIT -1 OFFSET ?1)
         RETURNING ended_ms, id",
    )?;
    let gone = q.query_map([cap], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
    evicted(gone, EvictReason::OverCap)
}

fn evicted(
    gone: impl Iterator<Item = rusqlite::Result<(i64, i64)>>,
    reason: EvictReason,
) -> Result<Vec<Evicted>, DbError> {
    let mut gone = gone.collect::<Result<Vec<_>, _>>()?;
    // RETURNING gives rows in no promised order.
    gone.sort_unstable();
    Ok(gone
        .into_iter()
        .map(|(_, id)| Evicted {
            id: id_of(id),
            reason,
        })
        .collect())
}

/// Where the store is when `[daemon] store` does not say: no directory to put it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoStorePath;

impl fmt::Display for NoStorePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "no place for the store: set [daemon] store, or STATE_DIRECTORY, XDG_STATE_HOME or HOME",
        )
    }
}

impl std::error::Error for NoStorePath {}

/// The store's path: `configured` (`[daemon] store`) if set; else [`FILE_NAME`] in the
/// first directory of `$STATE_DIRECTORY` (systemd's `StateDirectory=`, colon-separated), else
/// in `$XDG_STATE_HOME/loopd/`, else in `$HOME/.local/state/loopd/`. The environment values
/// are passed in (`std::env::var_os`); empty ones count as unset, and a relative
/// `XDG_STATE_HOME` is ignored, as the XDG spec says.
pub fn store_path(
    configured: Option<&Path>,
    state_directory: Option<&OsStr>,
    xdg_state_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Result<PathBuf, NoStorePath> {
    if let Some(p) = configured {
        return Ok(p.to_path_buf());
    }
    fn set(v: Option<&OsStr>) -> Option<&Path> {
        v.filter(|v| !v.is_empty()).map(Path::new)
    }
    if let Some(dirs) = state_directory {
        let first = dirs
            .as_bytes()
            .split(|&b| b == b':')
            .next()
            .unwrap_or_default();
        if !first.is_empty() {
            return Ok(Path::new(OsStr::from_bytes(first)).join(FILE_NAME));
        }
    }
    if let Some(x) = set(xdg_state_home).filter(|x| x.is_absolute()) {
        return Ok(x.join("loopd").join(FILE_NAME));
    }
    if let Some(h) = set(home) {
        return Ok(h.join(".local/state/loopd").join(FILE_NAME));
    }
    Err(NoStorePath)
}
