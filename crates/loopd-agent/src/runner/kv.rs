//! Each session's KV in a file on its host (`[runner.kv]`, `[[host]] kv_dir`): when a slot
//! changes hands, the coming session's conversation is restored from its file instead of
//! evaluated again, and a session whose server restarted resumes from its file.
//!
//! - A request with a `session` whose host has a KV directory (the server's
//!   `--slot-save-path`, as this process sees it) ends each completed run by saving its slot
//!   (`POST /slots/N?action=save`), unless the slot holds fewer than `min_tokens` tokens: so
//!   the file always holds the session's last completed turn, and a server killed between
//!   turns loses nothing the file had.
//! - Before its first generation it restores its file into its slot, unless placement says
//!   the slot's last request was the same session's ([`KvOutcome::Resident`]).
//! - A file is named by the session and by what its KV was made with: `loopd-` + 32 hex
//!   digits of the session key + `-` + 16 of SHA-256 over the model, the chat template's
//!   SHA-256 and `n_ctx` (`[expect]`) + `.kv`. No session string reaches the name, so no
//!   name can leave the directory, and another model's or template's file is never found.
//!   Its sidecar (`.meta`, JSON) says the same three, the tokens and bytes the server wrote,
//!   and the file's XXH3-64: a restore reads the file whole and checks its size and hash
//!   first, since llama.cpp restores a corrupt file's KV without noticing (a wrong answer
//!   until the server restarts).
//! - Whatever fails is a cold prefill and an outcome that names it, never a failed turn: no
//!   file ([`KvOutcome::Missing`]), a sidecar or file that does not check
//!   ([`KvOutcome::Corrupt`], both deleted), a sidecar of another model, template or context
//!   ([`KvOutcome::Mismatch`]), a restore the server refuses ([`KvOutcome::Refused`]: it
//!   empties the slot, which then evaluates the whole prompt), a save that fails (server
//!   refusal, a full disk: [`KvOutcome::Failed`], the partial file and its sidecar deleted).
//!   A restored file whose tokens differ from the new prompt's is not a wrong answer either:
//!   the server reuses only the common token prefix (the turn's `cache_n` says how much).
//! - The directory holds at most `max_bytes` of `.kv` files: after each save the least
//!   recently used files (by their sidecar's modification time: a save writes it, a restore
//!   touches it) are deleted until the rest fit; a file alone larger than the cap is deleted
//!   at once ([`KvOutcome::TooBig`]). A deleted session's files go with it
//!   ([`KvStore::forget`]).
//! - File work on one runner is one at a time (a lock), so a save's eviction never deletes
//!   a file another request is reading.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::fleet::SessionKey;
use llama_proto::hash::Sha256;
use loopd_client::llama::{Client, InferError, SlotAction};

/// `[runner.kv]`: saving and restoring each session's KV.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvSettings {
    /// The server's `--slot-save-path`, as loopd sees it, for the one server of a config
    /// without `[[host]]` (each `[[host]]` names its own, `kv_dir`). Without it, nothing is
    /// saved or restored.
    pub dir: Option<PathBuf>,
    /// The most bytes of KV files kept in one directory (4 GiB).
    pub max_bytes: u64,
    /// A slot holding fewer tokens is not saved: evaluating them again is cheap (256).
    pub min_tokens: u64,
}

impl Default for KvSettings {
    fn default() -> Self {
        KvSettings {
            dir: None,
            max_bytes: 4 << 30,
            min_tokens: 256,
        }
    }
}

/// A save or a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvAction {
    /// After a completed run.
    Save,
    /// Before the first generation.
    Restore,
}

impl KvAction {
    /// `save` or `restore`.
    pub fn as_str(self) -> &'static str {
        match self {
            KvAction::Save => "save",
            KvAction::Restore => "restore",
        }
    }
}

/// How a save or a restore went (the module docs say when each happens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOutcome {
    /// Saved; the file and its sidecar are written.
    Saved,
    /// Not saved: the slot held fewer than `min_tokens` tokens.
    Small,
    /// Not saved: the server refused or failed, the slot was empty, or the file could not
    /// be read or its sidecar written.
    Failed,
    /// Saved, then deleted: larger than `max_bytes` alone.
    TooBig,
    /// Restored.
    Restored,
    /// Nothing to do: the slot's last request was this session's.
    Resident,
    /// No file (or no sidecar) for this session.
    Missing,
    /// The sidecar unreadable, or the file's size or hash not the sidecar's: both deleted.
    Corrupt,
    /// The sidecar is another model's, template's or context's.
    Mismatch,
    /// The server refused the restore (or restored nothing); the slot is empty.
    Refused,
}

impl KvOutcome {
    /// The outcome's name on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            KvOutcome::Saved => "saved",
            KvOutcome::Small => "small",
            KvOutcome::Failed => "failed",
            KvOutcome::TooBig => "too_big",
            KvOutcome::Restored => "restored",
            KvOutcome::Resident => "resident",
            KvOutcome::Missing => "missing",
            KvOutcome::Corrupt => "corrupt",
            KvOutcome::Mismatch => "mismatch",
            KvOutcome::Refused => "refused",
        }
    }
}

/// One save or restore, as [`RequestEvent::Kv`](super::RequestEvent::Kv) tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvReport {
    /// Which.
    pub action: KvAction,
    /// How it went.
    pub outcome: KvOutcome,
    /// Tokens the server saved or restored (0 when it did neither).
    pub tokens: u64,
    /// Bytes it wrote or read.
    pub bytes: u64,
    /// Files deleted to keep the directory under `max_bytes` (saves only).
    pub evicted: u32,
    /// How long it took, the file's hashing and the server's call together (the request's
    /// driver times it: its clock).
    pub micros: u64,
    /// What went wrong, in words, when something did.
    pub detail: Option<String>,
}

impl KvReport {
    fn new(action: KvAction, outcome: KvOutcome) -> KvReport {
        KvReport {
            action,
            outcome,
            tokens: 0,
            bytes: 0,
            evicted: 0,
            micros: 0,
            detail: None,
        }
    }

    fn because(action: KvAction, outcome: KvOutcome, detail: impl Into<String>) -> KvReport {
        KvReport {
            detail: Some(detail.into()),
            ..KvReport::new(action, outcome)
        }
    }

    /// The restore a resident session does not need.
    pub fn resident() -> KvReport {
        KvReport::new(KvAction::Restore, KvOutcome::Resident)
    }
}

/// The sidecar: what the file was made with and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    v: u32,
    model: String,
    chat_template_sha256: String,
    n_ctx: u64,
    tokens: u64,
    bytes: u64,
    xxh3: String,
}

const META_VERSION: u32 = 1;

/// What a host's KV files are made with: part of each name and each sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ident {
    model: String,
    chat_template_sha256: String,
    n_ctx: u64,
    hex: String,
}

impl Ident {
    fn new(model: &str, template: &str, n_ctx: u64) -> Ident {
        // A digest is a digest in either case.
        let template = template.to_ascii_lowercase();
        let mut h = Sha256::new();
        let parts: [&[u8]; 4] = [
            b"loopd-kv-v1",
            model.as_bytes(),
            template.as_bytes(),
            &n_ctx.to_le_bytes(),
        ];
        for p in parts {
            // Length-prefixed, so no two inputs share their bytes.
            let _ = h.update(&(p.len() as u64).to_le_bytes());
            let _ = h.update(p);
        }
        let digest = h.finish().map(|d| d.0).unwrap_or([0; 32]);
        Ident {
            model: model.to_owned(),
            chat_template_sha256: template,
            n_ctx,
            hex: hex(&digest[..8]),
        }
    }

    fn meta(&self, tokens: u64, bytes: u64, xxh3: u64) -> Meta {
        Meta {
            v: META_VERSION,
            model: self.model.clone(),
            chat_template_sha256: self.chat_template_sha256.clone(),
            n_ctx: self.n_ctx,
            tokens,
            bytes,
            xxh3: format!("{xxh3:016x}"),
        }
    }

    fn matches(&self, m: &Meta) -> bool {
        m.v == META_VERSION
            && m.model == self.model
            && m.chat_template_sha256 == self.chat_template_sha256
            && m.n_ctx == self.n_ctx
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The file name prefix of `session`'s files: `loopd-` and 32 hex digits of its key.
fn session_prefix(session: &str) -> String {
    let key = SessionKey::explicit(session)
        .map(|k| *k.as_bytes())
        .unwrap_or([0; 32]);
    format!("loopd-{}-", hex(&key[..16]))
}

/// The KV file's name of `session` on a host of `ident`, and its sidecar's.
fn names(session: &str, ident: &Ident) -> (String, String) {
    let stem = format!("{}{}", session_prefix(session), ident.hex);
    (format!("{stem}.kv"), format!("{stem}.meta"))
}

/// One KV file of a directory, as eviction weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvFile {
    /// Its name (`*.kv`).
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// Its last use (its sidecar's modification time); `None`: no sidecar, unusable.
    pub used: Option<SystemTime>,
}

/// The files to delete so that the rest fit in `max_bytes`: those without a sidecar first,
/// then the least recently used; `keep` (the file just saved) last of all, and only when it
/// alone is larger than `max_bytes`. At `max_bytes` exactly nothing is deleted.
pub fn evictions(files: &[KvFile], max_bytes: u64, keep: &str) -> Vec<String> {
    let mut total: u64 = files.iter().map(|f| f.bytes).sum();
    let mut order: Vec<&KvFile> = files.iter().collect();
    // None sorts before Some: the unusable go first; `keep` is the last to go.
    order.sort_by_key(|f| (f.name == keep, f.used, f.name.clone()));
    let mut out = Vec::new();
    for f in order {
        if total <= max_bytes {
            break;
        }
        total -= f.bytes;
        out.push(f.name.clone());
    }
    out
}

/// One host's KV directory and what its files are made with.
#[derive(Debug, Clone)]
pub(super) struct KvStore {
    dir: PathBuf,
    max_bytes: u64,
    min_tokens: u64,
    ident: Ident,
}

impl KvStore {
    /// The store of a host whose server saves into `dir`, for `client`'s model and
    /// `[expect]` (without one, the template and context are unknown: empty and 0).
    pub fn new(dir: PathBuf, settings: &KvSettings, client: &Client) -> KvStore {
        let c = client.config();
        let (template, n_ctx) = c
            .expect
            .as_ref()
            .map_or(("", 0), |e| (e.chat_template_sha256.as_str(), e.n_ctx));
        KvStore {
            dir,
            max_bytes: settings.max_bytes,
            min_tokens: settings.min_tokens,
            ident: Ident::new(&c.model, template, n_ctx),
        }
    }

    /// Restores `session`'s file into `slot`, when it has one that checks.
    pub fn restore(&self, client: &Client, slot: u32, session: &str) -> KvReport {
        let r = KvAction::Restore;
        let (kv, meta) = names(session, &self.ident);
        let (kv_path, meta_path) = (self.dir.join(&kv), self.dir.join(&meta));
        let text = match fs::read(&meta_path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return KvReport::new(r, KvOutcome::Missing)
            }
            Err(e) => return KvReport::because(r, KvOutcome::Missing, e.to_string()),
        };
        let corrupt = |why: String| {
            let _ = fs::remove_file(&meta_path);
            let _ = fs::remove_file(&kv_path);
            KvReport::because(r, KvOutcome::Corrupt, why)
        };
        let m: Meta = match serde_json::from_slice(&text) {
            Ok(m) => m,
            Err(e) => return corrupt(format!("{meta}: {e}")),
        };
        if !self.ident.matches(&m) {
            return KvReport::because(
                r,
                KvOutcome::Mismatch,
                format!(
                    "{meta} is of model {:?}, template {}, n_ctx {}",
                    m.model, m.chat_template_sha256, m.n_ctx
                ),
            );
        }
        match file_hash(&kv_path) {
            Ok((bytes, _)) if bytes != m.bytes => {
                return corrupt(format!(
                    "{kv} is {bytes} bytes, its sidecar says {}",
                    m.bytes
                ))
            }
            Ok((_, h)) if format!("{h:016x}") != m.xxh3 => {
                return corrupt(format!(
                    "{kv} hashes to {h:016x}, its sidecar says {}",
                    m.xxh3
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let _ = fs::remove_file(&meta_path);
                return KvReport::new(r, KvOutcome::Missing);
            }
            Err(e) => return corrupt(format!("{kv}: {e}")),
        }
        match with_room(|| client.slot_file(slot, SlotAction::Restore, &kv)) {
            Ok(f) if f.tokens == 0 => KvReport::because(
                r,
                KvOutcome::Refused,
                "the server restored no tokens".to_owned(),
            ),
            Ok(f) => {
                // Its use, for eviction: the sidecar's modification time, which writing it
                // again sets (the file system's clock, not one read here).
                let _ = write_atomic(&meta_path, &text);
                KvReport {
                    tokens: f.tokens,
                    bytes: f.bytes,
                    ..KvReport::new(r, KvOutcome::Restored)
                }
            }
            Err(e) => KvReport::because(r, KvOutcome::Refused, e.to_string()),
        }
    }

    /// Saves `slot`, which holds `tokens` tokens of `session`'s, then keeps the directory
    /// under its cap.
    pub fn save(&self, client: &Client, slot: u32, session: &str, tokens: u64) -> KvReport {
        let s = KvAction::Save;
        if tokens < self.min_tokens {
            return KvReport::new(s, KvOutcome::Small);
        }
        let (kv, meta) = names(session, &self.ident);
        let (kv_path, meta_path) = (self.dir.join(&kv), self.dir.join(&meta));
        // No sidecar while the file is rewritten: a save that dies half way is missing,
        // not a file that seems whole.
        let _ = fs::remove_file(&meta_path);
        let failed = |why: String| {
            let _ = fs::remove_file(&kv_path);
            KvReport::because(s, KvOutcome::Failed, why)
        };
        let saved = match with_room(|| client.slot_file(slot, SlotAction::Save, &kv)) {
            Ok(f) if f.tokens == 0 => return failed("the slot was empty".to_owned()),
            Ok(f) => f,
            Err(e) => return failed(e.to_string()),
        };
        let (bytes, h) = match file_hash(&kv_path) {
            Ok(x) => x,
            Err(e) => return failed(format!("{kv}: {e}")),
        };
        if saved.bytes != 0 && bytes != saved.bytes {
            return failed(format!(
                "{kv} is {bytes} bytes, the server said it wrote {}",
                saved.bytes
            ));
        }
        let m = self.ident.meta(saved.tokens, bytes, h);
        if let Err(e) = write_atomic(&meta_path, &serde_json::to_vec(&m).unwrap_or_default()) {
            return failed(format!("{meta}: {e}"));
        }
        let mut report = KvReport {
            tokens: saved.tokens,
            bytes,
            ..KvReport::new(s, KvOutcome::Saved)
        };
        let gone = evictions(&self.files(), self.max_bytes, &kv);
        for name in &gone {
            self.delete(name);
            if *name == kv {
                report.outcome = KvOutcome::TooBig;
                report.detail = Some(format!(
                    "{bytes} bytes, more than max_bytes {}",
                    self.max_bytes
                ));
            } else {
                report.evicted += 1;
            }
        }
        report
    }

    /// Deletes every file of `session` here (of any model).
    pub fn forget(&self, session: &str) {
        let prefix = session_prefix(session);
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&prefix) && (name.ends_with(".kv") || name.ends_with(".meta")) {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// The directory's KV files.
    fn files(&self) -> Vec<KvFile> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if !(name.starts_with("loopd-") && name.ends_with(".kv")) {
                    return None;
                }
                let bytes = e.metadata().ok()?.len();
                let meta = self.dir.join(format!("{}.meta", &name[..name.len() - 3]));
                let used = fs::metadata(meta).and_then(|m| m.modified()).ok();
                Some(KvFile { name, bytes, used })
            })
            .collect()
    }

    /// Deletes the KV file `name` and its sidecar (the sidecar first: a file half deleted
    /// is missing, never restored).
    fn delete(&self, name: &str) {
        let stem = name.strip_suffix(".kv").unwrap_or(name);
        let _ = fs::remove_file(self.dir.join(format!("{stem}.meta")));
        let _ = fs::remove_file(self.dir.join(name));
    }
}

/// How often, and how far apart, a call whose connection was refused or closed before its
/// answer is made again: inferproxy refuses connections past its accept rate (a burst of 10,
/// then 2 a second), and a turn's KV calls come right before and after its chat request.
const ROOM_TRIES: u32 = 4;
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// `call`, made again up to [`ROOM_TRIES`] times in all while its connection is refused or
/// closed before an answer (save and restore are idempotent: a second one does what the
/// first did).
pub(super) fn with_room<T>(
    mut call: impl FnMut() -> Result<T, InferError>,
) -> Result<T, InferError> {
    let mut tries = 1;
    loop {
        match call() {
            Err(InferError::StreamClosedEarly | InferError::Connect { .. })
                if tries < ROOM_TRIES =>
            {
                tries += 1;
                std::thread::sleep(ROOM_WAIT);
            }
            r => return r,
        }
    }
}

/// A file's size and XXH3-64, read whole.
fn file_hash(path: &Path) -> io::Result<(u64, u64)> {
    let mut f = fs::File::open(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n: u64 = 0;
    loop {
        let got = f.read(&mut buf)?;
        if got == 0 {
            return Ok((n, h.digest()));
        }
        h.update(&buf[..got]);
        n += got as u64;
    }
}

/// Writes `path` whole or not at all (a temporary file renamed over it).
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("meta.tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(s: u64) -> Option<SystemTime> {
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s))
    }

    fn file(name: &str, bytes: u64, used: Option<SystemTime>) -> KvFile {
        KvFile {
            name: name.into(),
            bytes,
            used,
        }
    }

    #[test]
    fn eviction_keeps_the_cap_at_the_limit_and_one_past() {
        let files = [
            file("a.kv", 40, at(3)),
            file("b.kv", 30, at(1)),
            file("c.kv", 30, at(2)),
        ];
        // 100 bytes: at the cap nothing goes.
        assert!(evictions(&files, 100, "a.kv").is_empty());
        // One byte under: the least recently used goes, and only it.
        assert_eq!(evictions(&files, 99, "a.kv"), ["b.kv"]);
        assert_eq!(evictions(&files, 70, "a.kv"), ["b.kv"]);
        assert_eq!(evictions(&files, 69, "a.kv"), ["b.kv", "c.kv"]);
        // The file just saved goes last, even when it is the oldest.
        assert_eq!(evictions(&files, 69, "b.kv"), ["c.kv", "a.kv"]);
        // Alone over the cap: it goes too.
        assert_eq!(evictions(&files, 39, "a.kv"), ["b.kv", "c.kv", "a.kv"]);
    }

    #[test]
    fn a_file_without_a_sidecar_goes_first() {
        let files = [file("a.kv", 10, at(1)), file("orphan.kv", 10, None)];
        assert_eq!(evictions(&files, 10, "a.kv"), ["orphan.kv"]);
    }

    #[test]
    fn names_stay_in_the_directory_and_tell_sessions_and_models_apart() {
        let ident = Ident::new("smollm2", "ab", 4096);
        let (kv, meta) = names("../../etc/passwd", &ident);
        assert!(kv.starts_with("loopd-") && kv.ends_with(".kv"), "{kv}");
        assert_eq!(kv.len(), "loopd-".len() + 32 + 1 + 16 + ".kv".len());
        assert_eq!(meta, format!("{}.meta", &kv[..kv.len() - 3]));
        assert!(loopd_client::llama::check_slot_filename(&kv).is_ok());
        assert!(kv[6..kv.len() - 3]
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == '-'));
        // Another session, model, template or context: another name.
        let others = [
            names("../../etc/passwd2", &ident).0,
            names("../../etc/passwd", &Ident::new("other", "ab", 4096)).0,
            names("../../etc/passwd", &Ident::new("smollm2", "ac", 4096)).0,
            names("../../etc/passwd", &Ident::new("smollm2", "ab", 2048)).0,
        ];
        for o in &others {
            assert_ne!(*o, kv);
        }
        // A session's files share their prefix whatever the model (forget finds them all).
        assert!(others[1].starts_with(&session_prefix("../../etc/passwd")));
    }

    #[test]
    fn a_sidecar_matches_only_its_own_model_template_and_context() {
        let ident = Ident::new("m", "AB", 8);
        let m = ident.meta(5, 10, 0xabc);
        assert_eq!(m.xxh3, "0000000000000abc");
        assert!(ident.matches(&m));
        assert_eq!(m.chat_template_sha256, "ab");
        assert!(!Ident::new("m2", "ab", 8).matches(&m));
        assert!(!Ident::new("m", "ac", 8).matches(&m));
        assert!(!Ident::new("m", "ab", 9).matches(&m));
        assert!(!ident.matches(&Meta { v: 2, ..m }));
    }
}
