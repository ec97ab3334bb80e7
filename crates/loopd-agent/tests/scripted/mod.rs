//! What the scripted tests of the request machine and the runner share: a tool that only names
//! itself (the script, not the tool, produces results) and the `tool_calls` delta list of one
//! assistant message.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use loopd_agent::runner::{Tool, ToolError};
use loopd_client::llama::Cancel;
use serde_json::{json, Value};

pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A tool named `.0`, an exit tool when `.1`; running it is a test bug.
pub struct Named(pub &'static str, pub bool);

impl Tool for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        "a test tool"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    fn is_exit(&self) -> bool {
        self.1
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        unreachable!("the script runs the tools; the machine never does")
    }
}

/// The `tool_calls` deltas of one assistant message calling `(id, name, arguments)` in order.
pub fn tool_call_deltas(list: &[(&str, &str, &str)]) -> Value {
    let deltas: Vec<Value> = list
        .iter()
        .enumerate()
        .map(|(i, (id, name, args))| {
            json!({"index": i, "id": id, "type": "function",
                   "function": {"name": name, "arguments": args}})
        })
        .collect();
    Value::Array(deltas)
}
