//! A slot's KV cache saved to a file and restored from it: llama-server's
//! `POST /slots/{id}?action=save|restore` with `{"filename": …}` (the sdist's
//! `tools/server/README.md`), which needs the server started with `--slot-save-path`. The file
//! holds the slot's tokens and their KV; a restore puts them back so the next request with
//! that prompt evaluates only what is new. A router takes the model from the body.

use serde::{Deserialize, Serialize};

use super::info::call_json_at;
use super::{Cancel, Client, InferError};

/// Save the slot to the file, or restore it from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotAction {
    /// `save`.
    Save,
    /// `restore`.
    Restore,
}

impl SlotAction {
    /// `save` or `restore`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotAction::Save => "save",
            SlotAction::Restore => "restore",
        }
    }
}

/// What the server did: the tokens and bytes moved and the time it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotFile {
    /// Tokens saved or restored (`n_saved` / `n_restored`).
    pub tokens: u64,
    /// Bytes written or read (`n_written` / `n_read`).
    pub bytes: u64,
    /// The server's own time for it, in microseconds (`timings.save_ms` / `restore_ms`).
    pub micros: u64,
}

#[derive(Deserialize)]
struct RawSlotFile {
    #[serde(default)]
    n_saved: Option<u64>,
    #[serde(default)]
    n_restored: Option<u64>,
    #[serde(default)]
    n_written: Option<u64>,
    #[serde(default)]
    n_read: Option<u64>,
    #[serde(default)]
    timings: RawTimings,
}

#[derive(Deserialize, Default)]
struct RawTimings {
    #[serde(default)]
    save_ms: Option<f64>,
    #[serde(default)]
    restore_ms: Option<f64>,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    filename: &'a str,
}

/// Why a name is not one the server takes (its `fs_validate_filename`), so it is refused
/// here before a request: a name that could leave the save path never reaches the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotFilenameError {
    /// Empty, or longer than 255 bytes.
    Length(usize),
    /// A control character, or one of `/ \ : * ? " < > |`.
    Character(char),
    /// `.` or `..`, a leading or trailing space, or a trailing dot.
    Form,
}

impl std::fmt::Display for SlotFilenameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotFilenameError::Length(n) => {
                write!(f, "a slot file's name is 1 to 255 bytes, not {n}")
            }
            SlotFilenameError::Character(c) => {
                write!(f, "a slot file's name may not hold {c:?}")
            }
            SlotFilenameError::Form => f.write_str(
                "a slot file's name may not be . or .., start or end with a space, or end with a dot",
            ),
        }
    }
}

impl std::error::Error for SlotFilenameError {}

/// Checks `name` as llama-server's `fs_validate_filename` does (1 to 255 bytes of UTF-8, no
/// control character, none of `/ \ : * ? " < > |`, not `.` or `..`, no space at either end,
/// no dot at the end), so nothing but a plain file name in the save path is ever asked for.
pub fn check_slot_filename(name: &str) -> Result<(), SlotFilenameError> {
    if name.is_empty() || name.len() > 255 {
        return Err(SlotFilenameError::Length(name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || "/\\:*?\"<>|".contains(*c))
    {
        return Err(SlotFilenameError::Character(c));
    }
    if name == "."
        || name == ".."
        || name.starts_with(' ')
        || name.ends_with(' ')
        || name.ends_with('.')
    {
        return Err(SlotFilenameError::Form);
    }
    Ok(())
}

impl Client {
    /// `POST /slots/{slot}?action=save|restore` with `filename`, answered within `call_ms`.
    /// A name the server would refuse is refused here (`InferError::Http` 400 is the server's
    /// own refusal: a restore of a missing, corrupt or mismatched file, which also empties
    /// the slot); 501 when the server has no `--slot-save-path`.
    pub fn slot_file(
        &self,
        slot: u32,
        action: SlotAction,
        filename: &str,
    ) -> Result<SlotFile, InferError> {
        check_slot_filename(filename).map_err(|e| InferError::Http {
            status: 400,
            body: format!("not sent: {e}"),
        })?;
        let body = serde_json::to_vec(&Body {
            model: &self.config().model,
            filename,
        })
        .expect("a slot file body is always serialisable");
        let target = format!("/slots/{slot}?action={}", action.as_str());
        let raw: RawSlotFile = call_json_at(
            self.config(),
            "POST",
            "/slots",
            &target,
            Some(&body),
            &Cancel::new(),
        )?;
        let ms = match action {
            SlotAction::Save => raw.timings.save_ms,
            SlotAction::Restore => raw.timings.restore_ms,
        };
        Ok(SlotFile {
            tokens: raw.n_saved.or(raw.n_restored).unwrap_or(0),
            bytes: raw.n_written.or(raw.n_read).unwrap_or(0),
            micros: ms.map_or(0, |m| (m * 1000.0).round().max(0.0) as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule at its edge: 255 bytes and 256, each refused character, the forms.
    #[test]
    fn names_are_checked_as_the_server_checks_them() {
        assert_eq!(check_slot_filename("loopd-ab12.kv"), Ok(()));
        assert_eq!(check_slot_filename(&"a".repeat(255)), Ok(()));
        assert_eq!(
            check_slot_filename(&"a".repeat(256)),
            Err(SlotFilenameError::Length(256))
        );
        assert_eq!(check_slot_filename(""), Err(SlotFilenameError::Length(0)));
        for c in ['/', '\\', ':', '*', '?', '"', '<', '>', '|', '\n', '\u{7f}'] {
            assert_eq!(
                check_slot_filename(&format!("a{c}b")),
                Err(SlotFilenameError::Character(c)),
                "{c:?}"
            );
        }
        for bad in [".", "..", " a", "a ", "a."] {
            assert_eq!(
                check_slot_filename(bad),
                Err(SlotFilenameError::Form),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_slot_filename("../etc/passwd"),
            Err(SlotFilenameError::Character('/'))
        );
        assert_eq!(check_slot_filename("é.kv"), Ok(()));
    }
}
