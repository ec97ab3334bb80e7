//! The router's per-model status (`GET /models`), read for readiness.
//!
//! A router answers `/health` and `/v1/models` with 200 whether or not its model can load, so
//! readiness alone would call a server `ready` while its model instance dies on every load.
//! With `models` set in the config, the worker also reads `GET /models` and requires each named
//! model to be `loaded` (or `sleeping`); a model the router marks `failed` (its instance exited
//! with a non-zero status) is a crash-loop event ([`crate::policy::Policy::handle_model_exit`]).
//!
//! The shape read is the one llama.cpp's server README documents for router mode:
//! `{"data":[{"id":…, "status":{"value":"loaded"|"loading"|"unloaded"|…, "failed":true,
//! "exit_code":N}}]}`. Fields not named here are ignored.

use core::fmt;

use serde::Deserialize;

/// Where the router lists its models and their status.
pub const MODELS_PATH: &str = "/models";

/// Largest `/models` body read (one entry is about 1 KiB with its preset text).
pub const MAX_MODELS_BODY: usize = 1 << 20;

/// What the router says of one required model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelState {
    /// Loaded (or sleeping, which wakes on the next request): ready.
    Loaded,
    /// Not loaded yet, with the router's word for it (`loading`, `unloaded`, `downloading`, …).
    NotLoaded(String),
    /// Its instance exited with this status (the router's `failed: true`).
    Failed {
        /// The instance's exit status as the router reports it.
        exit_code: i64,
    },
    /// The router does not list it (a wrong id in the config, or a preset without it).
    Missing,
}

impl ModelState {
    /// The word for it in status JSON: `loaded`, the router's own word, `failed` or `missing`.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Loaded => "loaded",
            Self::NotLoaded(word) => word,
            Self::Failed { .. } => "failed",
            Self::Missing => "missing",
        }
    }
}

/// The verdict over every required model: the first one that is not loaded, failures first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelsVerdict {
    /// Every required model is loaded.
    Loaded,
    /// This model is not (yet) loaded; `state` is never [`ModelState::Loaded`].
    NotReady {
        /// The model's id.
        model: String,
        /// What the router says of it.
        state: ModelState,
    },
}

/// Why a `/models` body could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelsError {
    /// Not JSON of the documented shape; the parser's message.
    Malformed(String),
}

impl fmt::Display for ModelsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(m) => write!(f, "GET {MODELS_PATH}: not the router's model list: {m}"),
        }
    }
}

impl core::error::Error for ModelsError {}

#[derive(Deserialize)]
struct List {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
    status: Option<EntryStatus>,
}

#[derive(Deserialize)]
struct EntryStatus {
    value: String,
    #[serde(default)]
    failed: bool,
    exit_code: Option<i64>,
}

/// The state of each of `required`, in order, from a `/models` body.
pub fn model_states(body: &[u8], required: &[String]) -> Result<Vec<ModelState>, ModelsError> {
    let list: List =
        serde_json::from_slice(body).map_err(|e| ModelsError::Malformed(e.to_string()))?;
    Ok(required
        .iter()
        .map(|id| match list.data.iter().find(|e| &e.id == id) {
            None => ModelState::Missing,
            Some(Entry { status: None, .. }) => ModelState::NotLoaded("unknown".into()),
            Some(Entry {
                status: Some(st), ..
            }) => {
                if st.failed {
                    ModelState::Failed {
                        exit_code: st.exit_code.unwrap_or(0),
                    }
                } else if st.value == "loaded" || st.value == "sleeping" {
                    ModelState::Loaded
                } else {
                    ModelState::NotLoaded(st.value.clone())
                }
            }
        })
        .collect())
}

/// The verdict over `required`: a failed model first (it is a crash-loop event), then the first
/// that is not loaded, else [`ModelsVerdict::Loaded`].
pub fn verdict(body: &[u8], required: &[String]) -> Result<ModelsVerdict, ModelsError> {
    let states = model_states(body, required)?;
    let pick = |want_failed: bool| {
        required.iter().zip(&states).find(|(_, st)| {
            if want_failed {
                matches!(st, ModelState::Failed { .. })
            } else {
                **st != ModelState::Loaded
            }
        })
    };
    Ok(match pick(true).or_else(|| pick(false)) {
        Some((model, state)) => ModelsVerdict::NotReady {
            model: model.clone(),
            state: state.clone(),
        },
        None => ModelsVerdict::Loaded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// An entry as the router writes it, trimmed of the fields this module ignores.
    fn body(entries: &[(&str, &str)]) -> Vec<u8> {
        let data: Vec<String> = entries
            .iter()
            .map(|(id, status)| {
                format!("{{\"id\":\"{id}\",\"object\":\"model\",\"status\":{status}}}")
            })
            .collect();
        format!("{{\"data\":[{}],\"object\":\"list\"}}", data.join(",")).into_bytes()
    }

    #[test]
    fn each_documented_status_reads_as_its_state() {
        let b = body(&[
            ("a", r#"{"value":"loaded","args":["llama-server"]}"#),
            ("b", r#"{"value":"loading","args":["llama-server"]}"#),
            ("c", r#"{"value":"unloaded"}"#),
            (
                "d",
                r#"{"value":"unloaded","args":[],"failed":true,"exit_code":1}"#,
            ),
            ("e", r#"{"value":"sleeping","args":[]}"#),
            ("f", r#"{"value":"unloaded","failed":true,"exit_code":-11}"#),
        ]);
        assert_eq!(
            model_states(&b, &ids(&["a", "b", "c", "d", "e", "f", "g"])).unwrap(),
            [
                ModelState::Loaded,
                ModelState::NotLoaded("loading".into()),
                ModelState::NotLoaded("unloaded".into()),
                ModelState::Failed { exit_code: 1 },
                ModelState::Loaded,
                ModelState::Failed { exit_code: -11 },
                ModelState::Missing,
            ]
        );
    }

    #[test]
    fn a_failed_model_wins_over_one_still_loading() {
        let b = body(&[
            ("a", r#"{"value":"loading"}"#),
            ("b", r#"{"value":"unloaded","failed":true,"exit_code":139}"#),
        ]);
        assert_eq!(
            verdict(&b, &ids(&["a", "b"])).unwrap(),
            ModelsVerdict::NotReady {
                model: "b".into(),
                state: ModelState::Failed { exit_code: 139 }
            }
        );
        assert_eq!(
            verdict(&b, &ids(&["a"])).unwrap(),
            ModelsVerdict::NotReady {
                model: "a".into(),
                state: ModelState::NotLoaded("loading".into())
            }
        );
        let ok = body(&[("a", r#"{"value":"loaded"}"#)]);
        assert_eq!(verdict(&ok, &ids(&["a"])).unwrap(), ModelsVerdict::Loaded);
        assert_eq!(verdict(&ok, &[]).unwrap(), ModelsVerdict::Loaded);
    }

    /// The router's own answers, recorded by `make fixtures` (fixtures/README.md).
    #[test]
    fn the_recorded_model_lists_read_as_loaded_and_failed() {
        let loaded = include_bytes!("../../../fixtures/router/models-loaded.json");
        assert_eq!(
            verdict(loaded, &ids(&["smollm2"])).unwrap(),
            ModelsVerdict::Loaded
        );
        let failed = include_bytes!("../../../fixtures/router/models-failed.json");
        assert_eq!(
            verdict(failed, &ids(&["smollm2"])).unwrap(),
            ModelsVerdict::NotReady {
                model: "smollm2".into(),
                state: ModelState::Failed { exit_code: 1 }
            }
        );
        assert_eq!(
            model_states(failed, &ids(&["other"])).unwrap(),
            [ModelState::Missing]
        );
    }

    #[test]
    fn bodies_of_another_shape_are_a_typed_error() {
        for bad in [
            &b""[..],
            b"{}",
            b"{\"data\":{}}",
            b"[1,2]",
            b"\xff",
            b"{\"data\":[{\"id\":1}]}",
        ] {
            assert!(
                matches!(verdict(bad, &ids(&["a"])), Err(ModelsError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let e = verdict(b"{}", &ids(&["a"])).unwrap_err().to_string();
        assert!(
            e.starts_with("GET /models: not the router's model list: missing field `data`"),
            "{e}"
        );
    }
}
