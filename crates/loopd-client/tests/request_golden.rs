//! Golden files for `llama::request::render`: one per message kind, tools, thinking on and off,
//! and sampling. The files hold the exact bytes sent. `LOOPD_BLESS=1` rewrites them; review the
//! diff before committing.

use std::path::PathBuf;

use loopd_client::config::{ClientConfig, Sampling};

use loopd_client::llama::{
    render_request as render, AssistantMessage, ChatMessage, ChatOptions, ChatRequest, ToolCall,
    ToolSchema,
};

fn golden(name: &str, config: &ClientConfig, req: &ChatRequest) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    let body = render(config, req);
    if std::env::var_os("LOOPD_BLESS").is_some() {
        std::fs::write(&path, &body).unwrap();
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        String::from_utf8(body).unwrap(),
        String::from_utf8(want).unwrap(),
        "{name}"
    );
}

fn config() -> ClientConfig {
    ClientConfig::new("/run/boxmaker/infer.sock", "smollm2")
}

fn req(messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest::new(0, messages)
}

fn system() -> ChatMessage {
    ChatMessage::System {
        content: "You are terse.".into(),
    }
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::User {
        content: text.into(),
    }
}

fn read_file_tool() -> ToolSchema {
    ToolSchema {
        name: "read_file".into(),
        description: "Read a file from the workspace.".into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": { "path": { "type": "string", "description": "Relative path" } },
            "required": ["path"],
        }),
    }
}

#[test]
fn system_message() {
    golden("system", &config(), &req(vec![system()]));
}

#[test]
fn user_message() {
    golden(
        "user",
        &config(),
        &req(vec![user("Say \"hi\" in\nFrench: é ✓")]),
    );
}

#[test]
fn assistant_with_content_only() {
    let a = ChatMessage::Assistant(AssistantMessage {
        content: Some("Bonjour.".into()),
        reasoning_content: None,
        tool_calls: vec![],
    });
    golden(
        "assistant_content",
        &config(),
        &req(vec![system(), user("Say hi in French."), a, user("Again.")]),
    );
}

#[test]
fn assistant_with_reasoning() {
    let a = ChatMessage::Assistant(AssistantMessage {
        content: Some("4".into()),
        reasoning_content: Some("2 + 2 is 4.".into()),
        tool_calls: vec![],
    });
    golden(
        "assistant_reasoning",
        &config(),
        &req(vec![user("2+2?"), a, user("And 3+3?")]),
    );
}

#[test]
fn assistant_tool_calls_and_tool_result() {
    let a = ChatMessage::Assistant(AssistantMessage {
        content: None,
        reasoning_content: None,
        tool_calls: vec![
            ToolCall {
                id: "call_1".into(),
                name: "read_file".into(),
                arguments: r#"{"path": "a.txt"}"#.into(),
            },
            ToolCall {
                id: "call_2".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"b.txt"}"#.into(),
            },
        ],
    });
    let t1 = ChatMessage::Tool {
        tool_call_id: "call_1".into(),
        content: "alpha\n".into(),
    };
    let t2 = ChatMessage::Tool {
        tool_call_id: "call_2".into(),
        content: "beta\n".into(),
    };
    let mut r = req(vec![user("Read a.txt and b.txt."), a, t1, t2]);
    r.tools = vec![read_file_tool()];
    golden("tool_calls", &config(), &r);
}

#[test]
fn tools() {
    let mut r = req(vec![system(), user("What is in notes.md?")]);
    r.tools = vec![
        read_file_tool(),
        ToolSchema {
            name: "list_dir".into(),
            description: "List a directory.".into(),
            parameters: serde_json::json!({ "type": "object", "properties": {} }),
        },
    ];
    golden("tools", &config(), &r);
}

#[test]
fn thinking_on() {
    let mut r = req(vec![user("Why is the sky blue?")]);
    r.options.thinking = true;
    r.slot = 1;
    golden("thinking_on", &config(), &r);
}

#[test]
fn thinking_off() {
    let mut r = req(vec![user("Why is the sky blue?")]);
    r.slot = 1;
    golden("thinking_off", &config(), &r);
}

#[test]
fn sampling_and_limits() {
    let mut c = config();
    c.limits.max_tokens = 512;
    c.sampling = Sampling {
        temperature: Some(0.6),
        top_p: Some(0.95),
        top_k: Some(20),
        min_p: Some(0.0),
        presence_penalty: Some(1.5),
        repeat_penalty: Some(1.1),
        seed: Some(42),
    };
    golden("sampling", &c, &req(vec![user("hi")]));
}

/// The request's own options ([`ChatOptions`]) over the config's: its `max_tokens` below the
/// backstop and its sampling in place of `[sampling]`. A new option is a field of
/// `ChatOptions`, a line in the serializer and a line here.
#[test]
fn request_options() {
    let mut c = config();
    c.limits.max_tokens = 512;
    c.sampling.temperature = Some(0.6);
    let r = req(vec![user("hi")]).with_options(ChatOptions {
        thinking: true,
        max_tokens: Some(48),
        sampling: Some(Sampling {
            temperature: Some(0.0),
            seed: Some(7),
            ..Sampling::default()
        }),
    });
    golden("request_options", &c, &r);
}

#[test]
fn same_inputs_same_bytes() {
    let r = req(vec![system(), user("x")]);
    assert_eq!(render(&config(), &r), render(&config(), &r.clone()));
}
