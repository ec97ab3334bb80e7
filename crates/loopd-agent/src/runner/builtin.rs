//! The built-in tools of `loopd run`: the current time, arithmetic on numbers, reading a file
//! under one folder, and the exit tool `finish`.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde_json::{json, Value};

use loopd_client::clock::Clock;
use loopd_client::llama::Cancel;

use super::tools::{Tool, ToolError, ToolRegistry};

/// Bytes of a file `read_file` returns at most; a longer file is cut there and says so.
pub const READ_FILE_CAP: usize = 16 * 1024;

/// The four built-in tools, `read_file` under `root` when one is given, `current_time` telling
/// the wall time of `clock` (the client's).
pub fn builtin_tools(root: Option<&Path>, clock: Arc<dyn Clock>) -> Result<ToolRegistry, String> {
    let mut r = ToolRegistry::new();
    let err = |e: super::tools::RegistryError| e.to_string();
    r.register(Arc::new(CurrentTime::new(clock))).map_err(err)?;
    r.register(Arc::new(Arithmetic)).map_err(err)?;
    if let Some(root) = root {
        r.register(Arc::new(ReadFile::new(root)?)).map_err(err)?;
    }
    r.register(Arc::new(Finish)).map_err(err)?;
    Ok(r)
}

/// `current_time`: the UTC date and time, from a [`Clock`]'s wall time.
#[derive(Clone)]
pub struct CurrentTime {
    clock: Arc<dyn Clock>,
}

impl CurrentTime {
    /// The tool telling `clock`'s wall time.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        CurrentTime { clock }
    }
}

impl std::fmt::Debug for CurrentTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentTime").finish_non_exhaustive()
    }
}

impl Tool for CurrentTime {
    fn name(&self) -> &str {
        "current_time"
    }
    fn description(&self) -> &str {
        "The current date and time in UTC."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        let secs = self
            .clock
            .wall()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| ToolError::Failed(format!("the system clock is before 1970: {e}")))?
            .as_secs();
        Ok(utc(secs))
    }
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, proleptic Gregorian).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `arithmetic`: add, subtract, multiply or divide a list of numbers, left to right.
#[derive(Debug, Clone, Copy, Default)]
pub struct Arithmetic;

/// Numbers one `arithmetic` call may take.
const MAX_OPERANDS: usize = 64;

impl Tool for Arithmetic {
    fn name(&self) -> &str {
        "arithmetic"
    }
    fn description(&self) -> &str {
        "Adds, subtracts, multiplies or divides numbers, left to right."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
                "numbers": {"type": "array", "items": {"type": "number"}, "minItems": 2}
            },
            "required": ["operation", "numbers"]
        })
    }
    fn run(&self, args: &Value, _: &Cancel) -> Result<String, ToolError> {
        let bad = |s: &str| ToolError::BadArguments(s.to_owned());
        let op = args["operation"]
            .as_str()
            .ok_or_else(|| bad("`operation` must be a string"))?;
        let numbers = args["numbers"]
            .as_array()
            .ok_or_else(|| bad("`numbers` must be an array"))?;
        if numbers.len() < 2 || numbers.len() > MAX_OPERANDS {
            return Err(bad("`numbers` must hold 2 to 64 numbers"));
        }
        let mut values = numbers.iter().map(|n| n.as_f64());
        let first = values.next().flatten().ok_or_else(|| bad("not a number"))?;
        let mut acc = first;
        for v in values {
            let v = v.ok_or_else(|| bad("`numbers` must hold only numbers"))?;
            acc = match op {
                "add" => acc + v,
                "subtract" => acc - v,
                "multiply" => acc * v,
                "divide" if v == 0.0 => return Err(ToolError::Failed("division by zero".into())),
                "divide" => acc / v,
                other => return Err(bad(&format!("unknown operation `{other}`"))),
            };
        }
        if !acc.is_finite() {
            return Err(ToolError::Failed(
                "the result is not a finite number".into(),
            ));
        }
        // Whole numbers print without a fraction, as a person writes them.
        if acc.fract() == 0.0 && acc.abs() < 9.0e15 {
            return Ok(format!("{}", acc as i64));
        }
        Ok(acc.to_string())
    }
}

/// `read_file`: a file under one folder, at most [`READ_FILE_CAP`] bytes, never outside it.
#[derive(Debug, Clone)]
pub struct ReadFile {
    root: PathBuf,
}

impl ReadFile {
    /// Reads under `root`, which must be an existing folder.
    pub fn new(root: &Path) -> Result<ReadFile, String> {
        let root = root
            .canonicalize()
            .map_err(|e| format!("the folder {}: {e}", root.display()))?;
        if !root.is_dir() {
            return Err(format!("{} is not a folder", root.display()));
        }
        Ok(ReadFile { root })
    }

    /// The file `rel` names, if it is inside the folder (symbolic links resolved).
    fn resolve(&self, rel: &str) -> Result<PathBuf, ToolError> {
        let bad = |s: String| ToolError::BadArguments(s);
        let p = Path::new(rel);
        if rel.is_empty() || p.is_absolute() {
            return Err(bad(format!(
                "`path` must be relative to the folder, got `{rel}`"
            )));
        }
        if p.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(bad(format!("`path` may not contain `..`: `{rel}`")));
        }
        let full = self
            .root
            .join(p)
            .canonicalize()
            .map_err(|e| ToolError::Failed(format!("`{rel}`: {e}")))?;
        if !full.starts_with(&self.root) {
            return Err(bad(format!("`{rel}` leads outside the folder")));
        }
        Ok(full)
    }
}

impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> &str {
        "Reads a text file, given its path relative to the shared folder."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "relative to the folder"}},
            "required": ["path"]
        })
    }
    fn run(&self, args: &Value, _: &Cancel) -> Result<String, ToolError> {
        let rel = args["path"]
            .as_str()
            .ok_or_else(|| ToolError::BadArguments("`path` must be a string".into()))?;
        let path = self.resolve(rel)?;
        let file =
            std::fs::File::open(&path).map_err(|e| ToolError::Failed(format!("`{rel}`: {e}")))?;
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Err(ToolError::Failed(format!("`{rel}` is not a file")));
        }
        let mut bytes = Vec::new();
        file.take(READ_FILE_CAP as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ToolError::Failed(format!("`{rel}`: {e}")))?;
        let cut = bytes.len() > READ_FILE_CAP;
        bytes.truncate(READ_FILE_CAP);
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if cut {
            text.push_str(&format!("\n[cut at {READ_FILE_CAP} bytes]"));
        }
        Ok(text)
    }
}

/// `finish`: the exit tool; the model says it is done. Recorded, never run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Finish;

impl Tool for Finish {
    fn name(&self) -> &str {
        "finish"
    }
    fn description(&self) -> &str {
        "Signals that the task is done, with a one-line summary."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"]
        })
    }
    fn is_exit(&self) -> bool {
        true
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        Err(ToolError::Failed(
            "an exit tool is recorded, never run".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_at_known_instants() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn current_time_tells_the_wall_time_of_its_clock() {
        let date = UNIX_EPOCH + std::time::Duration::from_secs(1_798_761_599);
        let clock = loopd_client::clock::FakeClock::at_wall(date);
        let tool = CurrentTime::new(Arc::new(clock.clone()));
        let c = Cancel::new();
        assert_eq!(tool.run(&json!({}), &c), Ok("2026-12-31T23:59:59Z".into()));
        clock.advance(std::time::Duration::from_millis(1_000));
        assert_eq!(tool.run(&json!({}), &c), Ok("2027-01-01T00:00:00Z".into()));
    }

    #[test]
    fn arithmetic_left_to_right_with_typed_errors() {
        let c = Cancel::new();
        let run = |v: Value| Arithmetic.run(&v, &c);
        assert_eq!(
            run(json!({"operation": "add", "numbers": [2, 3.5]})),
            Ok("5.5".into())
        );
        assert_eq!(
            run(json!({"operation": "divide", "numbers": [12, 4, 3]})),
            Ok("1".into())
        );
        assert_eq!(
            run(json!({"operation": "divide", "numbers": [1, 0]})),
            Err(ToolError::Failed("division by zero".into()))
        );
        assert!(matches!(
            run(json!({"operation": "pow", "numbers": [1, 2]})),
            Err(ToolError::BadArguments(_))
        ));
        assert!(matches!(
            run(json!({"operation": "add", "numbers": [1]})),
            Err(ToolError::BadArguments(_))
        ));
        let many: Vec<u32> = (0..65).collect();
        assert!(matches!(
            run(json!({"operation": "add", "numbers": many})),
            Err(ToolError::BadArguments(_))
        ));
        let at_cap: Vec<u32> = (0..64).collect();
        assert_eq!(
            run(json!({"operation": "add", "numbers": at_cap})),
            Ok("2016".into())
        );
    }

    #[test]
    fn read_file_stays_in_its_folder_and_is_capped() {
        let dir = std::env::temp_dir().join(format!("loopd-readfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("in/sub")).unwrap();
        std::fs::write(dir.join("in/sub/a.txt"), "hello").unwrap();
        std::fs::write(dir.join("secret.txt"), "no").unwrap();
        std::fs::write(dir.join("in/at_cap.txt"), vec![b'x'; READ_FILE_CAP]).unwrap();
        std::fs::write(dir.join("in/over.txt"), vec![b'y'; READ_FILE_CAP + 1]).unwrap();
        std::os::unix::fs::symlink(dir.join("secret.txt"), dir.join("in/link")).unwrap();
        let t = ReadFile::new(&dir.join("in")).unwrap();
        let c = Cancel::new();
        let run = |p: &str| t.run(&json!({ "path": p }), &c);
        assert_eq!(run("sub/a.txt"), Ok("hello".into()));
        assert_eq!(run("at_cap.txt").unwrap().len(), READ_FILE_CAP);
        let over = run("over.txt").unwrap();
        assert!(over.ends_with(&format!("\n[cut at {READ_FILE_CAP} bytes]")));
        assert_eq!(over[..READ_FILE_CAP].matches('y').count(), READ_FILE_CAP);
        for outside in [
            "../secret.txt",
            "link",
            "/etc/passwd",
            "sub/../../secret.txt",
        ] {
            assert!(
                matches!(run(outside), Err(ToolError::BadArguments(_))),
                "{outside}: {:?}",
                run(outside)
            );
        }
        assert!(matches!(run("missing"), Err(ToolError::Failed(_))));
        assert!(matches!(run("sub"), Err(ToolError::Failed(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
