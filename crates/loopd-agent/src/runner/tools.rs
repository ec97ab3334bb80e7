//! Tools: a trait (name, JSON schema, run) and a registry.
//!
//! An **exit tool** is a signal to whoever submitted the request (`finish`, `ask_human`, ...):
//! its calls are recorded whenever they appear and never run, never cost budget and change
//! nothing else. A normal tool runs on a thread of its own (the runner's driver starts it) so
//! that the request can stop waiting at its timeout or at a cancel; the tool is then told
//! through its [`Cancel`] token, and a tool that ignores it keeps its thread until it returns,
//! but not the request's slot.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use loopd_client::llama::{Cancel, ToolSchema};

/// One tool the model may call.
pub trait Tool: Send + Sync {
    /// The function name the model calls it by.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// The JSON Schema of its arguments object.
    fn parameters(&self) -> serde_json::Value;
    /// Whether this is an exit tool (recorded, never run).
    fn is_exit(&self) -> bool {
        false
    }
    /// Runs one call with its parsed arguments; returns the result text the model will read.
    /// Long work checks `cancel` and stops when it is set.
    fn run(&self, arguments: &serde_json::Value, cancel: &Cancel) -> Result<String, ToolError>;
}

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments are not what the schema asks for (or not JSON at all).
    BadArguments(String),
    /// The tool ran and failed.
    Failed(String),
    /// It ran past the runner's `tool_timeout_ms`.
    TimedOut {
        /// The timeout, in milliseconds.
        after_ms: u64,
    },
    /// The request was cancelled while it ran.
    Cancelled,
    /// The tool's thread panicked or could not be started.
    Crashed(String),
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::BadArguments(what) => write!(f, "bad arguments: {what}"),
            ToolError::Failed(what) => write!(f, "failed: {what}"),
            ToolError::TimedOut { after_ms } => {
                write!(f, "timed out after {after_ms} ms (runner.tool_timeout_ms)")
            }
            ToolError::Cancelled => f.write_str("cancelled"),
            ToolError::Crashed(what) => write!(f, "crashed: {what}"),
        }
    }
}

impl std::error::Error for ToolError {}

/// Why a tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// Another tool already has this name.
    Duplicate(String),
    /// The name is empty or not `[A-Za-z0-9_-]`.
    BadName(String),
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Duplicate(n) => write!(f, "a tool named `{n}` is already registered"),
            RegistryError::BadName(n) => {
                write!(f, "tool name `{n}` must be non-empty [A-Za-z0-9_-]")
            }
        }
    }
}

impl std::error::Error for RegistryError {}

/// The tools of a runner, in registration order (the order the model sees them).
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
    by_name: HashMap<String, usize>,
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.tools.iter().map(|t| t.name().to_owned()))
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// Adds `tool`; its name must be new and `[A-Za-z0-9_-]+`.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.name().to_owned();
        let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || !name.chars().all(ok) {
            return Err(RegistryError::BadName(name));
        }
        if self.by_name.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        self.by_name.insert(name, self.tools.len());
        self.tools.push(tool);
        Ok(())
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    /// Whether `name` is a registered exit tool.
    pub fn is_exit(&self, name: &str) -> bool {
        self.get(name).is_some_and(|t| t.is_exit())
    }

    /// The schemas sent with every request, exit tools included.
    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.tools
            .iter()
            .map(|t| ToolSchema {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// The tools named in `names`, in registration order; a name not registered here is
    /// skipped (the caller checked the names against [`ToolRegistry::schemas`]).
    pub fn only(&self, names: &[String]) -> ToolRegistry {
        let mut chosen = ToolRegistry::new();
        for t in self
            .tools
            .iter()
            .filter(|t| names.iter().any(|n| n == t.name()))
        {
            // The names are already unique and checked.
            let _ = chosen.register(t.clone());
        }
        chosen
    }

    /// How many tools there are.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}
