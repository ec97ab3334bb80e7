//! The daemon's counters in the Prometheus text format (version 0.0.4), on `prometheus-client`:
//! requests by outcome and reason, slots busy, tool iterations, time to first token and tokens
//! per second (histograms), and the prompt-cache hit ratio (the sum of `cache_n` over the sum
//! of prompt tokens, `cache_n + prompt_n`), which llama-server no longer exports itself.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::prometheus_text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use loopd_agent::runner::{Outcome, RequestResult};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// `completed`, `failed` or `refused`.
    outcome: String,
    /// The fail reason or refusal code; empty for `completed`.
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    /// The failed attempt's error kind (`connect_error`, `stream_closed_early`, ...).
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    /// The `[[host]]` name.
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostRequestLabels {
    host: String,
    /// `completed` or `failed`.
    outcome: String,
    /// The fail reason; empty for `completed`.
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    /// `hit`, `loss` or `none`.
    cache_outcome: String,
    /// `true` when its request extended the last turn's.
    extends: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CompactionLabels {
    /// `tool_results` or `summary`.
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KvLabels {
    /// `save` or `restore`.
    action: String,
    /// The save's or restore's outcome (`restored`, `missing`, `saved`, ...).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictLabels {
    reason: String,
}

/// The daemon's metrics; every method is cheap and takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    evicted: Family<EvictLabels, Counter>,
    retries: Family<RetryLabels, Counter>,
    slots: Gauge,
    slots_busy: Gauge,
    tool_iterations: Counter,
    ttft: Histogram,
    tokens_per_second: Histogram,
    cache_tokens: Counter,
    prompt_tokens: Counter,
    cache_hit_ratio: Gauge<f64, AtomicU64>,
    host_up: Family<HostLabels, Gauge>,
    host_slots_busy: Family<HostLabels, Gauge>,
    host_requests: Family<HostRequestLabels, Counter>,
    session_turns: Family<TurnLabels, Counter>,
    compactions: Family<CompactionLabels, Counter>,
    kv: Family<KvLabels, Counter>,
    kv_bytes: Family<KvLabels, Counter>,
    kv_evicted: Counter,
}

impl Metrics {
    /// Every metric at zero, `slots` in the table.
    pub fn new(slots: usize) -> Metrics {
        let mut registry = Registry::with_prefix("loopd");
        let requests = Family::<RequestLabels, Counter>::default();
        let evicted = Family::<EvictLabels, Counter>::default();
        let retries = Family::<RetryLabels, Counter>::default();
        let (g_slots, slots_busy) = (Gauge::default(), Gauge::default());
        let tool_iterations = Counter::default();
        let ttft = Histogram::new(exponential_buckets(0.05, 2.0, 12));
        let tokens_per_second = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        let (cache_tokens, prompt_tokens) = (Counter::default(), Counter::default());
        let cache_hit_ratio = Gauge::<f64, AtomicU64>::default();
        let host_up = Family::<HostLabels, Gauge>::default();
        let host_slots_busy = Family::<HostLabels, Gauge>::default();
        let host_requests = Family::<HostRequestLabels, Counter>::default();
        let session_turns = Family::<TurnLabels, Counter>::default();
        let compactions = Family::<CompactionLabels, Counter>::default();
        let kv = Family::<KvLabels, Counter>::default();
        let kv_bytes = Family::<KvLabels, Counter>::default();
        let kv_evicted = Counter::default();
        registry.register(
            "kv",
            "Sessions' KV files saved after a completed run and restored before a first \
             generation, by outcome",
            kv.clone(),
        );
        registry.register(
            "kv_bytes",
            "Bytes of sessions' KV files the servers wrote and read, by action and outcome",
            kv_bytes.clone(),
        );
        registry.register(
            "kv_evicted",
            "KV files deleted, least recently used first, to keep a directory under max_bytes",
            kv_evicted.clone(),
        );
        registry.register(
            "session_turns",
            "Sessions' turns ended, by the prompt cache's outcome for their first generation \
             and whether their request extended the last turn's",
            session_turns.clone(),
        );
        registry.register(
            "session_compactions",
            "Compactions of sessions' logs recorded, by rule",
            compactions.clone(),
        );
        registry.register(
            "host_up",
            "Each [[host]]: 1 when ready for new requests, else 0",
            host_up.clone(),
        );
        registry.register(
            "host_slots_busy",
            "Each [[host]]: its owned slots running a request",
            host_slots_busy.clone(),
        );
        registry.register(
            "host_requests",
            "Agent requests ended on each [[host]], by outcome and reason",
            host_requests.clone(),
        );
        registry.register(
            "requests",
            "Agent requests by outcome (completed, failed, refused) and reason",
            requests.clone(),
        );
        registry.register(
            "results_evicted",
            "Results dropped unfetched, by reason (expired, over_cap)",
            evicted.clone(),
        );
        registry.register(
            "retries",
            "Generation attempts tried again, by the failed attempt's error",
            retries.clone(),
        );
        registry.register("slots", "Slots in the runner's table", g_slots.clone());
        registry.register("slots_busy", "Slots running a request", slots_busy.clone());
        registry.register(
            "tool_iterations",
            "Tool iterations used by finished requests",
            tool_iterations.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "From submit to the first streamed token of a request",
            ttft.clone(),
        );
        registry.register(
            "tokens_per_second",
            "Generated tokens over each generation's wall time",
            tokens_per_second.clone(),
        );
        registry.register(
            "prompt_cache_tokens",
            "Prompt tokens taken from the slot's cache (sum of cache_n)",
            cache_tokens.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens in all (sum of cache_n + prompt_n)",
            prompt_tokens.clone(),
        );
        registry.register(
            "prompt_cache_hit_ratio",
            "prompt_cache_tokens over prompt_tokens",
            cache_hit_ratio.clone(),
        );
        g_slots.set(i64::try_from(slots).unwrap_or(i64::MAX));
        Metrics {
            registry,
            requests,
            evicted,
            retries,
            slots: g_slots,
            slots_busy,
            tool_iterations,
            ttft,
            tokens_per_second,
            cache_tokens,
            prompt_tokens,
            cache_hit_ratio,
            host_up,
            host_slots_busy,
            host_requests,
            session_turns,
            compactions,
            kv,
            kv_bytes,
            kv_evicted,
        }
    }

    /// A session's KV was saved or restored (or not) as `k` says.
    pub fn kv(&self, k: &loopd_agent::runner::KvReport) {
        let labels = KvLabels {
            action: k.action.as_str().into(),
            outcome: k.outcome.as_str().into(),
        };
        self.kv.get_or_create(&labels).inc();
        self.kv_bytes.get_or_create(&labels).inc_by(k.bytes);
        self.kv_evicted.inc_by(u64::from(k.evicted));
    }

    /// A session's turn ended (completed or not) as `t` says.
    pub fn turn(&self, t: &super::protocol::TurnRecord) {
        self.session_turns
            .get_or_create(&TurnLabels {
                cache_outcome: t.cache_outcome.clone(),
                extends: t.extends.to_string(),
            })
            .inc();
    }

    /// A compaction by `rule` was recorded.
    pub fn compacted(&self, rule: &str) {
        self.compactions
            .get_or_create(&CompactionLabels { rule: rule.into() })
            .inc();
    }

    /// Each named host's state and busy slots now.
    pub fn set_hosts(&self, hosts: &[super::protocol::HostLine]) {
        for h in hosts {
            let labels = HostLabels {
                host: h.name.clone(),
            };
            let up = i64::from(h.state == "ready");
            self.host_up.get_or_create(&labels).set(up);
            let busy = i64::try_from(h.busy).unwrap_or(i64::MAX);
            self.host_slots_busy.get_or_create(&labels).set(busy);
        }
    }

    /// Slots busy now.
    pub fn set_busy(&self, busy: usize) {
        self.slots_busy.set(i64::try_from(busy).unwrap_or(i64::MAX));
    }

    /// A submit refused with `code`.
    pub fn refused(&self, code: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                outcome: "refused".into(),
                reason: code.into(),
            })
            .inc();
    }

    /// A request the last daemon left running, failed at start as `daemon_restarted`.
    pub fn restarted(&self) {
        self.requests
            .get_or_create(&RequestLabels {
                outcome: "failed".into(),
                reason: super::db::RESTARTED.into(),
            })
            .inc();
    }

    /// A result dropped unfetched.
    pub fn evicted(&self, reason: &str) {
        self.evicted
            .get_or_create(&EvictLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// A request ended with `r`; `ttft` from submit to its first token, if one came.
    pub fn finished(&self, r: &RequestResult, ttft: Option<Duration>) {
        let (outcome, reason) = match &r.outcome {
            Outcome::Completed { .. } => ("completed", ""),
            Outcome::Failed { reason, .. } => ("failed", reason.as_str()),
        };
        self.requests
            .get_or_create(&RequestLabels {
                outcome: outcome.into(),
                reason: reason.into(),
            })
            .inc();
        if let Some(host) = &r.host {
            self.host_requests
                .get_or_create(&HostRequestLabels {
                    host: host.clone(),
                    outcome: outcome.into(),
                    reason: reason.into(),
                })
                .inc();
        }
        self.tool_iterations
            .inc_by(u64::from(r.budget.saturating_sub(r.budget_left)));
        for retry in &r.retries {
            self.retries
                .get_or_create(&RetryLabels {
                    error: retry.error.into(),
                })
                .inc();
        }
        if let Some(t) = ttft {
            self.ttft.observe(t.as_secs_f64());
        }
        for g in &r.generations {
            let Some(t) = g.timings else { continue };
            self.cache_tokens.inc_by(t.cache_n);
            self.prompt_tokens
                .inc_by(t.cache_n.saturating_add(t.prompt_n));
            let secs = g.elapsed.as_secs_f64();
            if t.predicted_n > 0 && secs > 0.0 {
                self.tokens_per_second.observe(t.predicted_n as f64 / secs);
            }
        }
        let all = self.prompt_tokens.get();
        if all > 0 {
            self.cache_hit_ratio
                .set(self.cache_tokens.get() as f64 / all as f64);
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Slots in the table (as registered).
    pub fn slots(&self) -> i64 {
        self.slots.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd_agent::runner::{FailReason, GenerationStats, RequestId};
    use loopd_client::llama::{FinishReason, Timings};

    fn result(outcome: Outcome, gens: &[(u64, u64, u64, u64)]) -> RequestResult {
        RequestResult {
            id: RequestId(1),
            outcome,
            content: None,
            reasoning_content: None,
            transcript: vec![],
            tool_calls: vec![],
            exits: vec![],
            generations: gens
                .iter()
                .map(|&(cache_n, prompt_n, predicted_n, ms)| GenerationStats {
                    budget_left: 0,
                    timings: Some(Timings {
                        cache_n,
                        prompt_n,
                        predicted_n,
                    }),
                    cache: None,
                    reasoning_tokens: 0,
                    finish_reason: None,
                    elapsed: Duration::from_millis(ms),
                })
                .collect(),
            budget: 3,
            budget_left: 1,
            stalls: vec![],
            retries: vec![],
            host: None,
        }
    }

    #[test]
    fn outcomes_iterations_and_the_cache_ratio_are_counted() {
        let m = Metrics::new(2);
        m.set_busy(1);
        m.refused("NO_SLOT_AVAILABLE");
        let done = Outcome::Completed {
            finish_reason: FinishReason::Stop,
        };
        m.finished(
            &result(done, &[(0, 100, 10, 1_000), (100, 20, 5, 500)]),
            Some(Duration::from_millis(300)),
        );
        let failed = Outcome::Failed {
            reason: FailReason::Cancelled,
            detail: String::new(),
        };
        m.finished(&result(failed, &[]), None);
        let text = m.render();
        for line in [
            "loopd_requests_total{outcome=\"refused\",reason=\"NO_SLOT_AVAILABLE\"} 1",
            "loopd_requests_total{outcome=\"completed\",reason=\"\"} 1",
            "loopd_requests_total{outcome=\"failed\",reason=\"cancelled\"} 1",
            "loopd_slots 2",
            "loopd_slots_busy 1",
            "loopd_tool_iterations_total 4",
            "loopd_prompt_cache_tokens_total 100",
            "loopd_prompt_tokens_total 220",
            "loopd_prompt_cache_hit_ratio 0.45454545454545455",
            "loopd_time_to_first_token_seconds_count 1",
            "loopd_tokens_per_second_count 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
    }
}
