//! The sessions' tables of the store: each session's settings and its log, one JSON record
//! per row in order. The store does not read the JSON; `daemon/sessions.rs` does.
//!
//! A completed turn's records are appended in the transaction that stores its result
//! ([`Db::finish_turn`]), so a turn is in the log exactly when its result is in the store; a
//! turn that failed, was cancelled or was running when the daemon died appends nothing.

use std::time::SystemTime;

use rusqlite::{params, Connection, OptionalExtension};

use super::{id_of, ms, Db, DbError};

/// One session's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// Its name.
    pub name: String,
    /// Its settings, JSON.
    pub settings: String,
    /// Opened, Unix milliseconds.
    pub created_ms: u64,
    /// Last turn completed (or opened), Unix milliseconds.
    pub updated_ms: u64,
    /// Turns completed.
    pub turns: u32,
    /// The bytes of its records.
    pub bytes: u64,
    /// What its last turn's prompt opened with (`None` before the first turn).
    pub prefix_key: Option<String>,
}

/// Why a session command was refused by the store's rules (not by a failure of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRefusal {
    /// `open` of a name taken.
    Exists,
    /// `open` with `max_sessions` sessions already.
    TooMany,
    /// No session of that name.
    NotFound,
}

/// A completed turn's records, for [`Db::finish_turn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnAppend {
    /// The session.
    pub session: String,
    /// The turn's number.
    pub turn: u32,
    /// Its records, JSON, in order.
    pub records: Vec<String>,
    /// What its prompt opened with.
    pub prefix_key: String,
}

/// Appends `a` to its session (no-op if the session is gone) at `now_ms`.
pub(super) fn append_in(tx: &Connection, a: &TurnAppend, now_ms: i64) -> Result<(), DbError> {
    let next: Option<i64> = tx
        .query_row(
            "SELECT coalesce((SELECT max(seq) FROM session_records WHERE session = ?1), 0)
             FROM sessions WHERE name = ?1",
            [&a.session],
            |r| r.get(0),
        )
        .optional()?;
    let Some(last) = next else {
        return Ok(());
    };
    let mut bytes = 0i64;
    for (i, r) in a.records.iter().enumerate() {
        let seq = last + 1 + i64::try_from(i).unwrap_or(i64::MAX - last - 1);
        tx.execute(
            "INSERT INTO session_records (session, seq, turn, record) VALUES (?1, ?2, ?3, ?4)",
            params![a.session, seq, a.turn, r],
        )?;
        bytes = bytes.saturating_add(i64::try_from(r.len()).unwrap_or(i64::MAX));
    }
    tx.execute(
        "UPDATE sessions SET turns = turns + 1, bytes = bytes + ?2, updated_ms = ?3,
             prefix_key = ?4
         WHERE name = ?1",
        params![a.session, bytes, now_ms, a.prefix_key],
    )?;
    Ok(())
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        name: r.get(0)?,
        settings: r.get(1)?,
        created_ms: id_of(r.get(2)?),
        updated_ms: id_of(r.get(3)?),
        turns: u32::try_from(r.get::<_, i64>(4)?).unwrap_or(u32::MAX),
        bytes: id_of(r.get(5)?),
        prefix_key: r.get(6)?,
    })
}

const COLUMNS: &str = "name, settings, created_ms, updated_ms, turns, bytes, prefix_key";

impl Db {
    /// Opens a session named `name` (or, when `None`, the first free `s-N`) with `settings`;
    /// refused when the name is taken or `max_sessions` are open. Returns its name.
    pub fn open_session(
        &mut self,
        name: Option<&str>,
        settings: &str,
        max_sessions: usize,
        now: SystemTime,
    ) -> Result<Result<String, SessionRefusal>, DbError> {
        let tx = self.conn.transaction()?;
        let count: i64 = tx.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))?;
        let taken = |n: &str| -> Result<bool, DbError> {
            Ok(tx
                .query_row("SELECT 1 FROM sessions WHERE name = ?1", [n], |_| Ok(()))
                .optional()?
                .is_some())
        };
        let name = match name {
            Some(n) if taken(n)? => return Ok(Err(SessionRefusal::Exists)),
            Some(n) => n.to_owned(),
            None => {
                let mut k = count.saturating_add(1);
                while taken(&format!("s-{k}"))? {
                    k = k.saturating_add(1);
                }
                format!("s-{k}")
            }
        };
        if usize::try_from(count).unwrap_or(usize::MAX) >= max_sessions {
            return Ok(Err(SessionRefusal::TooMany));
        }
        tx.execute(
            "INSERT INTO sessions (name, settings, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?3)",
            params![name, settings, ms(now)],
        )?;
        tx.commit()?;
        Ok(Ok(name))
    }

    /// The session `name`, if there is one.
    pub fn session(&self, name: &str) -> Result<Option<SessionRow>, DbError> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM sessions WHERE name = ?1"),
                [name],
                row,
            )
            .optional()?)
    }

    /// The session's records, oldest first: `(turn, JSON)`.
    pub fn session_records(&self, name: &str) -> Result<Vec<(u32, String)>, DbError> {
        let mut q = self.conn.prepare_cached(
            "SELECT turn, record FROM session_records WHERE session = ?1 ORDER BY seq",
        )?;
        let rows = q.query_map([name], |r| {
            Ok((
                u32::try_from(r.get::<_, i64>(0)?).unwrap_or(u32::MAX),
                r.get::<_, String>(1)?,
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every session, most recently used first.
    pub fn sessions(&self) -> Result<Vec<SessionRow>, DbError> {
        let mut q = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM sessions ORDER BY updated_ms DESC, name"
        ))?;
        let rows = q.query_map([], row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Replaces a session's settings (a turn that changed its budget).
    pub fn set_session_settings(&mut self, name: &str, settings: &str) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE sessions SET settings = ?2 WHERE name = ?1",
            params![name, settings],
        )?;
        Ok(())
    }

    /// Deletes a session and every record of it, in one transaction.
    pub fn delete_session(&mut self, name: &str) -> Result<Result<(), SessionRefusal>, DbError> {
        let tx = self.conn.transaction()?;
        tx.execute("DELETE FROM session_records WHERE session = ?1", [name])?;
        let n = tx.execute("DELETE FROM sessions WHERE name = ?1", [name])?;
        if n == 0 {
            return Ok(Err(SessionRefusal::NotFound));
        }
        tx.commit()?;
        Ok(Ok(()))
    }
}
