//! The request runner against the real local llama-server (under the real llama-worker,
//! whose status socket the runner reads), through a real inferproxy.
//!
//! Greedy sampling with a seed and a small `max_tokens` keep the answers the same from run to
//! run. The model is tiny, so the test checks the runner's bookkeeping, not the wording: the
//! budget goes down by exactly one per iteration, and the request ends with an answer or a
//! typed failure with its output kept. It also measures `cache_n` per generation with the
//! standard BIOS (which states the iterations left, so it changes after every iteration) and
//! with a BIOS that never changes, and prints both (docs/runner.md).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use llama_harness::{LocalServer, Proxy};
use loopd::config::Config;
use loopd::llama::{Cancel, ChatMessage, Client, ToolCall};
use loopd::runner::{
    BiosContext, BiosProvider, Outcome, RunRequest, RunResult, Runner, StandardBios, Tool,
    ToolError, ToolRegistry,
};
use loopd::selftest::SAMPLING;
use serde_json::{json, Value};

/// `get_weather`, answering the same for every city and logging the cities asked.
struct Weather(Arc<Mutex<Vec<String>>>);

impl Tool for Weather {
    fn name(&self) -> &str {
        "get_weather"
    }
    fn description(&self) -> &str {
        "Get the current weather for a city."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        })
    }
    fn run(&self, args: &Value, _: &Cancel) -> Result<String, ToolError> {
        let city = args["city"]
            .as_str()
            .ok_or_else(|| ToolError::BadArguments("`city` must be a string".into()))?;
        self.0.lock().unwrap().push(city.to_owned());
        Ok(format!("{city}: sunny, 21 C"))
    }
}

/// A BIOS that never changes: the baseline for what the prompt cache can keep.
struct FixedBios;

impl BiosProvider for FixedBios {
    fn bios(&self, _: &BiosContext<'_>) -> String {
        "You are an agent. You may call tools; each message in which you call tools is one \
         tool iteration, however many calls it holds. Call tools only when you need them, then \
         answer."
            .into()
    }
}

/// The self-test's worked examples (a question answered by a call, twice), then the question:
/// the tiny model copies the pattern and calls the tool.
fn conversation() -> Vec<ChatMessage> {
    let mut m = Vec::new();
    for (n, city) in [(1, "Rome"), (2, "Oslo")] {
        m.push(ChatMessage::User {
            content: format!("What is the weather in {city}?"),
        });
        m.push(ChatMessage::Assistant {
            content: Some(String::new()),
            reasoning_content: None,
            tool_calls: vec![ToolCall {
                id: format!("call_{n}"),
                name: "get_weather".into(),
                arguments: format!("{{\"city\": \"{city}\"}}"),
            }],
        });
    }
    m.push(ChatMessage::User {
        content: "What is the weather in Paris?".into(),
    });
    m
}

fn run(
    server: &LocalServer,
    proxy: &Proxy,
    bios: Arc<dyn BiosProvider>,
) -> (RunResult, Vec<String>) {
    let mut c = Config::new(proxy.socket(), server.model());
    c.limits.poll_ms = 500;
    // A long prompt takes minutes on a loaded 2-core box.
    c.limits.liveness_ms = 300_000;
    c.runner.worker_socket = Some(server.status_socket().to_owned());
    c.runner.stall_ms = 300_000;
    let cities = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Weather(cities.clone()))).unwrap();
    let runner = Runner::new(Arc::new(Client::new(c)), tools, bios, 1);
    let req = RunRequest {
        system: Some("You answer every question by calling a tool.".into()),
        messages: conversation(),
        budget: Some(2),
        thinking: false,
        max_tokens: Some(48),
        sampling: Some(SAMPLING),
    };
    let id = runner
        .submit(req)
        .expect("the worker is ready and the slot free");
    let r = runner
        .wait_result(id, Duration::from_secs(1_800))
        .expect("the request ends within 30 minutes");
    let cities = cities.lock().unwrap().clone();
    (r, cities)
}

fn cache_line(label: &str, r: &RunResult) -> String {
    let per: Vec<String> = r
        .generations
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let t = g.timings.unwrap_or_default();
            format!(
                "gen {} (budget left {}): prompt {} tokens, cache_n {}, prompt_n {}, predicted_n {}",
                i + 1,
                g.budget_left,
                t.cache_n + t.prompt_n,
                t.cache_n,
                t.prompt_n,
                t.predicted_n
            )
        })
        .collect();
    format!("{label}: {}", per.join("; "))
}

/// The bookkeeping every real run must show, whatever the model said.
fn check(r: &RunResult, cities: &[String]) {
    // Budget down by exactly one per iteration: generation i starts with budget - (i - 1).
    for (i, g) in r.generations.iter().enumerate() {
        assert_eq!(g.budget_left, 2 - i as u32, "generation {}: {r:#?}", i + 1);
    }
    // Each generation after the first follows one completed iteration.
    let iterations = r.generations.len() as u32 - 1;
    assert_eq!(r.budget_left, 2 - iterations, "{r:#?}");
    assert!(cities.len() <= r.tool_calls.len());
    match &r.outcome {
        Outcome::Completed { .. } => {
            assert!(
                r.content.as_deref().is_some_and(|c| !c.trim().is_empty()),
                "an answer: {r:#?}"
            );
        }
        Outcome::Failed { reason, detail } => {
            assert!(!reason.to_string().is_empty() && !detail.is_empty());
            assert!(!r.transcript.is_empty(), "the output is kept: {r:#?}");
        }
    }
}

#[test]
fn a_two_iteration_get_weather_conversation_with_the_budget_going_down_by_one() {
    let server = LocalServer::start();
    let proxy = Proxy::start(server.addr());

    let (r, cities) = run(&server, &proxy, Arc::new(StandardBios));
    eprintln!("{}", cache_line("standard BIOS (states the budget)", &r));
    eprintln!(
        "outcome {:?}; calls {:?}; content {:?}",
        r.outcome, cities, r.content
    );
    check(&r, &cities);
    // The model copies the worked examples: it calls get_weather for Paris first.
    assert_eq!(cities.first().map(String::as_str), Some("Paris"), "{r:#?}");
    assert!(
        r.generations.len() >= 2,
        "a second generation read the result: {r:#?}"
    );

    let (fixed, fixed_cities) = run(&server, &proxy, Arc::new(FixedBios));
    eprintln!("{}", cache_line("fixed BIOS (never changes)", &fixed));
    check(&fixed, &fixed_cities);

    // What a changing BIOS costs: generation 2 re-reads everything after the budget line,
    // a fixed one lets it reuse the whole first prompt.
    let reuse = |r: &RunResult| {
        let g1 = r.generations[0].timings.unwrap_or_default();
        let g2 = r.generations[1].timings.unwrap_or_default();
        (g1.cache_n + g1.prompt_n, g2.cache_n)
    };
    if fixed.generations.len() >= 2 {
        let (first, cached) = reuse(&fixed);
        assert!(
            cached + 64 >= first,
            "a fixed BIOS keeps the first prompt cached: {first} tokens, cache_n {cached}"
        );
        let (first_std, cached_std) = reuse(&r);
        eprintln!(
            "generation 2 reuses {cached_std} of {first_std} first-prompt tokens with the \
             standard BIOS, {cached} of {first} with a fixed one"
        );
    }
}
