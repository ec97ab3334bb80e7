//! [`State`]: what every connection and every request's driver thread share. The store
//! ([`Db`]) is the one table of requests and results, behind one lock; everything else here is
//! a view of it or a channel into it: the followers of each running request (its hub) and the
//! time of its first token, both gone when it ends.
//!
//! Lock order: the runner's table, then this lock (the runner calls [`State::name`] with its
//! table locked); so nothing here calls into the runner while holding this lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use clock::Clock;

use super::db::{Db, DbError, TurnAppend};
use super::follower::Follower;
use super::metrics::Metrics;
use super::output::{Checkpoints, Output};
use super::protocol::{to_line, ErrorCode, ProtoError, ResultReply, WireEvent, WireResult};
use loopd_agent::runner::{RequestEvent, RequestId, RequestResult, Seat, SubmitError};

/// The followers of one running request.
pub(super) type Hub = Arc<Mutex<Vec<Follower>>>;

/// A running request's channels.
pub(super) struct Live {
    pub hub: Hub,
    first_token: Arc<Mutex<Option<Duration>>>,
    /// When it was named, on the daemon's clock: its end line's wall time counts from here.
    submitted: Duration,
}

pub(super) struct Inner {
    pub db: Db,
    pub live: HashMap<u64, Live>,
    /// Rows were deleted (or a write met a full disk) since the last compaction.
    pub freed: bool,
    /// Results the store could not take (a full disk), by id: `(reason, result line)`. They
    /// are served from here and written at each maintenance tick until the store takes them,
    /// so an acknowledged request's result is never lost to a full disk while the daemon runs.
    pub unstored: BTreeMap<u64, (String, String)>,
    /// Requests fetched from `unstored` whose `running` row the full disk kept: deleted at the
    /// same ticks, so they do not come back as `daemon_restarted`.
    pub unforgotten: Vec<u64>,
    /// The running turns of sessions, by request id.
    pub turns: HashMap<u64, TurnCtx>,
    /// The sessions with a turn under way (its request id once named): one at a time. A
    /// turn whose result a full disk holds keeps its session busy until it is stored, so the
    /// log never takes a later turn before it.
    pub busy: HashMap<String, Option<u64>>,
    /// The sessions whose last turn the server refused as too long for its context: the
    /// next turn compacts whatever the estimate says.
    pub force_compact: HashSet<String>,
    /// The turns' records held with their result in `unstored`, by request id.
    pub unstored_turns: HashMap<u64, TurnAppend>,
}

/// A running turn: what its completion appends to its session's log.
#[derive(Debug, Clone)]
pub(super) struct TurnCtx {
    pub session: String,
    pub turn: u32,
    pub user: String,
    /// The compactions made for it; a summary's text arrives with its event.
    pub compactions: Vec<super::protocol::Compaction>,
    pub prefix_key: String,
    pub extends: bool,
    pub why_not: Option<&'static str>,
    /// The last turn's `total_n`, its cache is judged against.
    pub prev_total: Option<u64>,
}

impl TurnCtx {
    /// How the turn ran, from its result.
    pub fn record(&self, result: &RequestResult) -> super::protocol::TurnRecord {
        use loopd_client::llama::{cache_outcome, CacheOutcome, Timings};
        let first = result.generations.first().and_then(|g| g.timings);
        let last = result.generations.last().and_then(|g| g.timings);
        let outcome = match (self.prev_total, first) {
            (Some(p), Some(f)) => {
                let previous = Timings {
                    cache_n: 0,
                    prompt_n: p,
                    predicted_n: 0,
                };
                match cache_outcome(&previous, &f) {
                    CacheOutcome::Hit => "hit",
                    CacheOutcome::Loss { .. } => "loss",
                }
            }
            _ => "none",
        };
        super::protocol::TurnRecord {
            session: self.session.clone(),
            turn: self.turn,
            request: result.id.0,
            extends: self.extends,
            why_not: self.why_not.map(str::to_owned),
            cache_outcome: outcome.to_owned(),
            cache_n: first.map_or(0, |t| t.cache_n),
            prompt_n: first.map_or(0, |t| t.prompt_n),
            total_n: last.map_or(0, |t| t.total()),
            compacted: self.compactions.iter().map(|c| c.rule).collect(),
        }
    }
}

/// Why a submit was refused after the runner had its say.
#[derive(Debug)]
pub(super) enum Refusal {
    Runner(SubmitError),
    Store(DbError),
}

impl From<SubmitError> for Refusal {
    fn from(e: SubmitError) -> Self {
        Refusal::Runner(e)
    }
}

impl Refusal {
    /// The code on the wire: the runner's, `STORE_FULL` or `STORE_FAILED`.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Runner(e) => ErrorCode::from(*e),
            Refusal::Store(e) => store_code(e),
        }
    }
}

pub(super) struct State {
    pub clock: Arc<dyn Clock>,
    pub inner: Mutex<Inner>,
    /// Told when a result is stored and when a follower leaves.
    pub changed: Condvar,
    pub metrics: Metrics,
    pub stopping: AtomicBool,
    /// Connections streaming a request's events: each still owes its client the end line.
    pub followers: AtomicUsize,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    /// Writes a new request (its submit line as sent) and opens its hub; called by the
    /// runner once a slot is sure, before the submit is acknowledged. Returns its id and the
    /// observer that streams its events to the hub and checkpoints its output.
    pub fn name(
        self: &Arc<State>,
        submission: &str,
        seat: Seat<'_>,
        hub: Hub,
        turn: Option<TurnCtx>,
    ) -> Result<(RequestId, loopd_agent::runner::Observer), Refusal> {
        let submitted = self.clock.now();
        let mut inner = lock(&self.inner);
        let id = match inner
            .db
            .insert_submitted(submission, seat, self.clock.wall())
        {
            Ok(id) => id,
            Err(e) => {
                inner.freed |= e == DbError::DiskFull;
                return Err(Refusal::Store(e));
            }
        };
        let first_token: Arc<Mutex<Option<Duration>>> = Arc::default();
        inner.live.insert(
            id,
            Live {
                hub: hub.clone(),
                first_token: first_token.clone(),
                submitted,
            },
        );
        if let Some(t) = turn {
            inner.busy.insert(t.session.clone(), Some(id));
            inner.turns.insert(id, t);
        }
        drop(inner);
        let me = self.clone();
        let (mut output, mut checkpoints) = (Output::default(), Checkpoints::default());
        let observer = Box::new(move |e: &RequestEvent| {
            let now = me.clock.now();
            if let RequestEvent::Chat(
                loopd_client::llama::ChatEvent::Content(_)
                | loopd_client::llama::ChatEvent::Reasoning(_)
                | loopd_client::llama::ChatEvent::ToolCallDelta { .. },
            ) = e
            {
                let mut t = lock(&first_token);
                if t.is_none() {
                    *t = Some(now.saturating_sub(submitted));
                }
            }
            if let RequestEvent::Kv(k) = e {
                me.metrics.kv(k);
            }
            if let RequestEvent::Summarized { summary, .. } = e {
                me.summarized(id, summary);
            }
            if let RequestEvent::Placed { host, slot, by } = e {
                if *by == "rehomed" {
                    me.move_seat(id, host, *slot);
                }
            }
            // Written before a follower sees it: what a client saw, a restart keeps.
            if checkpoints.due(output.handle(e), now) {
                me.checkpoint(id, &output);
            }
            let mut subs = lock(&hub);
            if subs.is_empty() {
                return;
            }
            let Some(event) = WireEvent::of(e) else {
                return;
            };
            let mut line = to_line(&event);
            line.push('\n');
            // Written to each client at once where nothing is queued for it (follower.rs).
            subs.retain(|f| f.offer(line.as_bytes()));
        });
        Ok((RequestId(id), observer))
    }

    fn checkpoint(&self, id: u64, output: &Output) {
        let mut inner = lock(&self.inner);
        if let Err(e) = inner
            .db
            .checkpoint(id, &output.to_json(), self.clock.wall())
        {
            inner.freed |= e == DbError::DiskFull;
            eprintln!(
                "loopd serve: {}: checkpoint not written: {e}",
                RequestId(id)
            );
        }
    }

    /// Frees a session whose turn was refused before it was named (`None`: not a turn).
    pub fn release(&self, session: Option<&str>) {
        if let Some(s) = session {
            let mut inner = lock(&self.inner);
            if inner.busy.get(s) == Some(&None) {
                inner.busy.remove(s);
            }
        }
    }

    /// Keeps the summary a turn's compaction wrote, for its log.
    fn summarized(&self, id: u64, summary: &str) {
        let mut inner = lock(&self.inner);
        if let Some(c) = inner.turns.get_mut(&id).and_then(|t| {
            t.compactions
                .iter_mut()
                .rfind(|c| c.rule == super::protocol::CompactionRule::Summary)
        }) {
            c.summary = Some(summary.to_owned());
        }
    }

    /// Records that the running request `id` now runs on `slot` of `host` (rehomed).
    fn move_seat(&self, id: u64, host: &str, slot: u32) {
        let seat = Seat {
            host: Some(host),
            slot,
        };
        let mut inner = lock(&self.inner);
        if let Err(e) = inner.db.move_seat(id, seat) {
            inner.freed |= e == DbError::DiskFull;
            eprintln!(
                "loopd serve: {}: its new seat not written: {e}",
                RequestId(id)
            );
        }
    }

    /// Forgets a request named but never started (no thread for it), and frees its session.
    pub fn forget(&self, id: u64) {
        let mut inner = lock(&self.inner);
        inner.live.remove(&id);
        if let Some(t) = inner.turns.remove(&id) {
            inner.busy.remove(&t.session);
        }
        if let Err(e) = inner.db.forget(id) {
            eprintln!(
                "loopd serve: {}: not removed from the store: {e}",
                RequestId(id)
            );
        }
    }

    /// The completion sink: logs the request's [`end_line`], stores its result in one
    /// transaction, ends its hub with it, and wakes the waiters. A result the store cannot take
    /// (a full disk) leaves the row running: it comes back as `daemon_restarted` at the next
    /// start.
    pub fn complete(&self, result: RequestResult) {
        let id = result.id;
        let mut wire = WireResult::from(&result);
        let reason = match &result.outcome {
            loopd_agent::runner::Outcome::Completed { finish_reason } => finish_reason.as_str(),
            loopd_agent::runner::Outcome::Failed { reason, .. } => reason.as_str(),
        };
        if self.stopping.load(Ordering::SeqCst) {
            let partial = result.content.as_deref().unwrap_or("");
            eprintln!(
                "loopd serve: {id} ended at shutdown: {} ({} bytes of output: {:?})",
                result
                    .outcome
                    .fail_reason()
                    .map_or("completed", |r| r.as_str()),
                partial.len(),
                partial.chars().take(80).collect::<String>()
            );
        }
        let mut inner = lock(&self.inner);
        let turn = inner.turns.remove(&id.0);
        let append = turn.as_ref().and_then(|t| {
            let record = t.record(&result);
            wire.session = Some(record.clone());
            self.metrics.turn(&record);
            if too_long(&result.outcome) {
                inner.force_compact.insert(t.session.clone());
            }
            if !matches!(
                result.outcome,
                loopd_agent::runner::Outcome::Completed { .. }
            ) {
                return None;
            }
            for c in &t.compactions {
                self.metrics.compacted(c.rule.as_str());
            }
            let records = super::session_log::turn_records(
                &t.compactions,
                &t.user,
                &result.transcript,
                record,
            );
            Some(TurnAppend {
                session: t.session.clone(),
                turn: t.turn,
                records: records.iter().map(to_line).collect(),
                prefix_key: t.prefix_key.clone(),
            })
        });
        let body = to_line(&wire);
        let live = inner.live.remove(&id.0);
        let first_token = live.as_ref().and_then(|l| *lock(&l.first_token));
        let wall = live
            .as_ref()
            .map(|l| self.clock.now().saturating_sub(l.submitted));
        eprintln!("loopd serve: {}", end_line(&result, wall));
        self.metrics.finished(&result, first_token);
        let stored = inner
            .db
            .finish_turn(id.0, reason, &body, append.as_ref(), self.clock.wall());
        match stored {
            Ok(()) => {
                if let Some(t) = &turn {
                    inner.busy.remove(&t.session);
                }
            }
            Err(e) => {
                inner.freed |= e == DbError::DiskFull;
                eprintln!(
                    "loopd serve: {id}: its result could not be stored ({e}); it is kept in \
                     memory, served from there and written once the store takes it (a daemon \
                     that stops first leaves it daemon_restarted with its last checkpoint)"
                );
                inner.unstored.insert(id.0, (reason.to_owned(), body));
                match (append, &turn) {
                    (Some(a), _) => {
                        inner.unstored_turns.insert(id.0, a);
                    }
                    (None, Some(t)) => {
                        inner.busy.remove(&t.session);
                    }
                    (None, None) => {}
                }
            }
        }
        self.drain_evicted(&mut inner);
        // Under the lock, so no follower can join the hub after its last line.
        if let Some(l) = live {
            let end = to_line(&ResultReply::new(wire));
            for f in lock(&l.hub).drain(..) {
                let _ = f.end(end.clone());
            }
        }
        drop(inner);
        self.changed.notify_all();
    }

    /// Writes the results a full disk kept in memory, oldest first, until the store refuses
    /// one (the disk is still full: the next try is the next maintenance tick).
    pub fn store_held(&self, inner: &mut Inner) {
        while let Some(&id) = inner.unforgotten.first() {
            if inner.db.forget(id).is_err() {
                return;
            }
            inner.unforgotten.remove(0);
        }
        while let Some((&id, (reason, body))) = inner.unstored.first_key_value() {
            let (reason, body) = (reason.clone(), body.clone());
            let append = inner.unstored_turns.get(&id).cloned();
            if inner
                .db
                .finish_turn(id, &reason, &body, append.as_ref(), self.clock.wall())
                .is_err()
            {
                return;
            }
            inner.unstored.remove(&id);
            if let Some(a) = inner.unstored_turns.remove(&id) {
                inner.busy.remove(&a.session);
            }
            eprintln!("loopd serve: {}: its result is stored now", RequestId(id));
        }
    }

    /// Logs and counts each result the store dropped unfetched.
    pub fn drain_evicted(&self, inner: &mut Inner) {
        while let Some(e) = inner.db.poll_evicted() {
            inner.freed = true;
            eprintln!(
                "loopd serve: the result of {} was dropped unfetched ({})",
                RequestId(e.id),
                e.reason.as_str()
            );
            self.metrics.evicted(e.reason.as_str());
        }
    }

    /// The store's error as the reply's error.
    pub fn failed(e: DbError) -> ProtoError {
        ProtoError::Refused(store_code(&e), e.to_string())
    }
}

/// Whether the server refused the request's prompt as longer than its context (HTTP 400,
/// `exceed_context_size_error`).
fn too_long(outcome: &loopd_agent::runner::Outcome) -> bool {
    use loopd_agent::runner::{FailReason, Outcome};
    use loopd_client::llama::InferError;
    matches!(outcome, Outcome::Failed {
        reason: FailReason::Client(InferError::Http { status: 400, body }),
        ..
    } if body.contains("exceed_context_size") || body.contains("context size"))
}

/// `STORE_FULL` for a full disk, `STORE_FAILED` for anything else.
fn store_code(e: &DbError) -> ErrorCode {
    if *e == DbError::DiskFull {
        ErrorCode::StoreFull
    } else {
        ErrorCode::StoreFailed
    }
}

/// The line `loopd serve` logs when a request ends, one per request, `key=value` so the journal
/// can be searched and split: its id, outcome (`completed`, `failed`), reason (the finish reason
/// of a completed request, the fail reason of a failed one), generations, tokens summed over the
/// generations (prompt tokens include the cached ones) and the wall time from its submit to its
/// end (`-` when it was never named, which the sink does not see in practice).
pub(super) fn end_line(result: &RequestResult, wall: Option<Duration>) -> String {
    use loopd_agent::runner::Outcome;
    let (outcome, reason) = match &result.outcome {
        Outcome::Completed { finish_reason } => ("completed", finish_reason.as_str()),
        Outcome::Failed { reason, .. } => ("failed", reason.as_str()),
    };
    let (mut prompt, mut cached, mut generated) = (0u64, 0u64, 0u64);
    for t in result.generations.iter().filter_map(|g| g.timings) {
        prompt = prompt.saturating_add(t.prompt_n).saturating_add(t.cache_n);
        cached = cached.saturating_add(t.cache_n);
        generated = generated.saturating_add(t.predicted_n);
    }
    let wall = wall.map_or("-".to_owned(), |w| w.as_millis().to_string());
    format!(
        "{} end outcome={outcome} reason={reason} generations={} prompt_tokens={prompt} \
         cached_tokens={cached} generated_tokens={generated} wall_ms={wall}",
        result.id,
        result.generations.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd_agent::runner::{FailReason, GenerationStats, Outcome};
    use loopd_client::llama::{FinishReason, Timings};

    fn generation(t: Option<(u64, u64, u64)>) -> GenerationStats {
        GenerationStats {
            budget_left: 0,
            timings: t.map(|(cache_n, prompt_n, predicted_n)| Timings {
                cache_n,
                prompt_n,
                predicted_n,
            }),
            cache: None,
            reasoning_tokens: 0,
            finish_reason: None,
            elapsed: Duration::ZERO,
        }
    }

    fn result(outcome: Outcome, generations: Vec<GenerationStats>) -> RequestResult {
        RequestResult {
            id: RequestId(7),
            outcome,
            content: None,
            reasoning_content: None,
            transcript: Vec::new(),
            tool_calls: Vec::new(),
            exits: Vec::new(),
            generations,
            budget: 3,
            budget_left: 2,
            stalls: Vec::new(),
            retries: Vec::new(),
            host: None,
        }
    }

    #[test]
    fn the_end_line_sums_the_generations_tokens_and_names_the_reason() {
        let done = result(
            Outcome::Completed {
                finish_reason: FinishReason::Stop,
            },
            vec![
                generation(Some((0, 300, 20))),
                generation(None),
                generation(Some((300, 12, 5))),
            ],
        );
        assert_eq!(
            end_line(&done, Some(Duration::from_micros(1_234_999))),
            "req-7 end outcome=completed reason=stop generations=3 prompt_tokens=612 \
             cached_tokens=300 generated_tokens=25 wall_ms=1234"
        );
        let cancelled = result(
            Outcome::Failed {
                reason: FailReason::Cancelled,
                detail: "cancelled by a client".into(),
            },
            Vec::new(),
        );
        assert_eq!(
            end_line(&cancelled, None),
            "req-7 end outcome=failed reason=cancelled generations=0 prompt_tokens=0 \
             cached_tokens=0 generated_tokens=0 wall_ms=-"
        );
    }

    #[test]
    fn huge_server_counts_saturate() {
        let big = Some((u64::MAX, u64::MAX, u64::MAX));
        let r = result(
            Outcome::Completed {
                finish_reason: FinishReason::Length,
            },
            vec![generation(big), generation(big)],
        );
        assert_eq!(
            end_line(&r, Some(Duration::ZERO)),
            format!(
                "req-7 end outcome=completed reason=length generations=2 prompt_tokens={m} \
                 cached_tokens={m} generated_tokens={m} wall_ms=0",
                m = u64::MAX
            )
        );
    }
}
