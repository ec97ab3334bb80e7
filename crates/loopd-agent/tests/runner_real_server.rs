//! The request runner against the real local llama-server (under the real llama-worker,
//! whose status socket the runner reads), through a real inferproxy.
//!
//! Greedy sampling with a seed and a small `max_tokens` keep the answers the same from run to
//! run. The model is tiny, so the test checks the runner's bookkeeping, not the wording: the
//! budget goes down by exactly one per iteration, and the request ends with an answer or a
//! typed failure with its output kept. The BIOS is fixed and the budget travels in the tool
//! results, so every generation after the first must keep the prompt cache (`cache_outcome`
//! a hit); it prints `cache_n` per generation (docs/runner.md).

mod sections;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use llama_harness::{LocalServer, Proxy};
use loopd_agent::runner::{
    BiosProvider, Outcome, RequestEvent, RequestResult, Runner, StandardBios, Submission, Tool,
    ToolError, ToolRegistry,
};
use loopd_client::llama::{
    AssistantMessage, CacheOutcome, Cancel, ChatEvent, ChatMessage, ChatOptions, Client, ToolCall,
};
use loopd_client::selftest::SAMPLING;
use sections::Config;
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

/// The self-test's worked examples (a question answered by a call, twice), then the question:
/// the tiny model copies the pattern and calls the tool.
fn conversation() -> Vec<ChatMessage> {
    let mut m = Vec::new();
    for (n, city) in [(1, "Rome"), (2, "Oslo")] {
        m.push(ChatMessage::User {
            content: format!("What is the weather in {city}?"),
        });
        m.push(ChatMessage::Assistant(AssistantMessage {
            content: Some(String::new()),
            reasoning_content: None,
            tool_calls: vec![ToolCall {
                id: format!("call_{n}"),
                name: "get_weather".into(),
                arguments: format!("{{\"city\": \"{city}\"}}"),
            }],
        }));
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
) -> (RequestResult, Vec<String>) {
    let mut c = Config::new(proxy.socket(), server.model());
    c.limits.poll_ms = 500;
    // A long prompt takes minutes on a loaded 2-core box.
    c.limits.liveness_ms = 300_000;
    c.runner.worker_socket = Some(server.status_socket().to_owned());
    c.runner.stall_ms = 300_000;
    let cities = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Weather(cities.clone()))).unwrap();
    let runner = Runner::new(
        Arc::new(Client::new(c.client())),
        c.runner.clone(),
        tools,
        bios,
        1,
    );
    let req = Submission {
        system: Some("You answer every question by calling a tool.".into()),
        messages: conversation(),
        budget: Some(2),
        tools: None,
        session: None,
        summarize: None,
        options: ChatOptions {
            thinking: false,
            max_tokens: Some(48),
            sampling: Some(SAMPLING),
        },
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

fn cache_line(label: &str, r: &RequestResult) -> String {
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
fn check(r: &RequestResult, cities: &[String]) {
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
    eprintln!(
        "{}",
        cache_line("standard BIOS (fixed; the budget in a note)", &r)
    );
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

    // The BIOS stays fixed and the budget travels in the tool results: every generation
    // after the first re-evaluates only its new messages, at most 64 tokens short of what
    // the generation before it left in the slot.
    for (i, g) in r.generations.iter().enumerate().skip(1) {
        assert_eq!(
            g.cache,
            Some(CacheOutcome::Hit),
            "generation {} kept the prompt cache: {}",
            i + 1,
            cache_line("standard BIOS", &r)
        );
    }
}

/// The model instance is SIGKILLed from the request's own thread right after its n-th
/// content token: the request ends with the worker's reason (`server_died`, or
/// `worker_restarted` when the restart is seen first) and its output holds every token that
/// was streamed, in order; the worker heals and the next round runs on the new instance.
#[test]
fn a_model_instance_killed_right_after_the_nth_token_keeps_every_token_streamed() {
    let server = LocalServer::start();
    let proxy = Proxy::start(server.addr());
    let mut c = Config::new(proxy.socket(), server.model());
    c.limits.poll_ms = 500;
    c.limits.liveness_ms = 300_000;
    c.runner.worker_socket = Some(server.status_socket().to_owned());
    c.runner.stall_ms = 300_000;
    let runner = Runner::new(
        Arc::new(Client::new(c.client())),
        c.runner.clone(),
        ToolRegistry::new(),
        Arc::new(StandardBios),
        1,
    );
    for n in [1usize, 8, 24] {
        server.wait_worker("the worker ready", Duration::from_secs(120), |s| {
            s["state"] == "ready"
        });
        let streamed = Arc::new(Mutex::new((0usize, String::new())));
        let seen = streamed.clone();
        let router = server.server_pid().expect("the router's pid");
        let observer = Box::new(move |e: &RequestEvent| {
            // A retry starts over: its output is the request's.
            if let RequestEvent::Chat(ChatEvent::Retrying { .. }) = e {
                seen.lock().unwrap().1.clear();
            }
            if let RequestEvent::Chat(ChatEvent::Content(t)) = e {
                let mut s = seen.lock().unwrap();
                s.0 += 1;
                s.1.push_str(t);
                if s.0 == n {
                    if let Some(instance) = llama_harness::children_of(router).first() {
                        let _ = std::process::Command::new("kill")
                            .args(["-KILL", &instance.to_string()])
                            .status();
                    }
                }
            }
        });
        let req = Submission {
            messages: vec![ChatMessage::User {
                content: "Count from 1 to 100, one number per line.".into(),
            }],
            budget: Some(0),
            options: ChatOptions {
                thinking: false,
                max_tokens: Some(200),
                sampling: Some(SAMPLING),
            },
            ..Submission::default()
        };
        let id = runner
            .submit_observed(req, Some(observer))
            .expect("the worker is ready and the slot free");
        let r = runner
            .wait_result(id, Duration::from_secs(300))
            .expect("the request ends");
        let (count, text) = streamed.lock().unwrap().clone();
        eprintln!("n = {n}: {count} tokens streamed, ended {:?}", r.outcome);
        assert!(count >= n, "n = {n}: only {count} tokens came");
        match &r.outcome {
            Outcome::Failed { reason, .. } => assert!(
                matches!(reason.as_str(), "server_died" | "worker_restarted"),
                "n = {n}: {r:?}"
            ),
            // The router may start a new instance before the worker sees the death (the
            // race docs/chaos.md names): the cut stream is retried and completes.
            Outcome::Completed { .. } => assert!(!r.retries.is_empty(), "n = {n}: {r:?}"),
        }
        assert_eq!(
            r.content.as_deref(),
            Some(text.as_str()),
            "n = {n}: the output is every token streamed"
        );
    }
}
