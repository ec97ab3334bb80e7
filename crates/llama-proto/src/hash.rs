//! SHA-256 over `emsha`: one-shot [`sha256`] and the incremental [`Sha256`].
//!
//! `loopd` uses it to check the server's `chat_template` against its config.

use core::fmt;

use emsha::Hash as _;

/// Longest input SHA-256 defines: its length field counts bits in a `u64`.
pub const MAX_INPUT_BYTES: u64 = u64::MAX / 8;

/// A SHA-256 digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hash32(pub [u8; 32]);

impl Hash32 {
    /// The digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses 64 hex digits (either case); `None` for anything else.
    pub fn from_hex(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            *o = (hex_val(pair[0])? << 4) | hex_val(pair[1])?;
        }
        Some(Hash32(out))
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Lowercase hex, as `sha256sum` prints it.
impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Why a digest could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashError {
    /// More than [`MAX_INPUT_BYTES`] were fed.
    InputTooLong,
    /// `emsha` reported an error this wrapper does not expect (its state is unusable).
    Backend,
}

impl fmt::Display for HashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HashError::InputTooLong => {
                write!(f, "sha256 input longer than {MAX_INPUT_BYTES} bytes")
            }
            HashError::Backend => f.write_str("sha256 backend (emsha) reported an error"),
        }
    }
}

impl core::error::Error for HashError {}

/// Incremental SHA-256: [`update`](Sha256::update) any number of times, then
/// [`finish`](Sha256::finish), which consumes it so a finished state cannot be fed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sha256 {
    inner: emsha::sha256::SHA256,
    len: u64,
}

impl Sha256 {
    /// A fresh hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `data`. On error nothing was fed.
    pub fn update(&mut self, data: &[u8]) -> Result<(), HashError> {
        // Counted here because emsha adds to its bit length before checking for overflow.
        let len = u64::try_from(data.len())
            .ok()
            .and_then(|n| self.len.checked_add(n))
            .filter(|&n| n <= MAX_INPUT_BYTES)
            .ok_or(HashError::InputTooLong)?;
        self.inner.update(data).map_err(|_| HashError::Backend)?;
        self.len = len;
        Ok(())
    }

    /// The digest of everything fed.
    pub fn finish(mut self) -> Result<Hash32, HashError> {
        let mut out = [0u8; 32];
        self.inner
            .finalize(&mut out)
            .map_err(|_| HashError::Backend)?;
        Ok(Hash32(out))
    }
}

/// The SHA-256 digest of `data`.
///
/// ```
/// let d = llama_proto::hash::sha256(b"abc").unwrap();
/// assert_eq!(
///     d.to_string(),
///     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
/// );
/// ```
pub fn sha256(data: &[u8]) -> Result<Hash32, HashError> {
    let mut h = Sha256::new();
    h.update(data)?;
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;
    use std::vec::Vec;

    mod vectors {
        include!("../tests/common/sha256_vectors.rs");
    }
    use vectors::{ABC, EMPTY, MILLION_A, PATTERN};

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 7 + 3) % 256) as u8).collect()
    }

    /// One shot, and every split into two pieces.
    fn check(msg: &[u8], expected: &str) {
        assert_eq!(sha256(msg).unwrap().to_string(), expected);
        let splits: Vec<usize> = if msg.len() <= 200 {
            (0..=msg.len()).collect()
        } else {
            [0, 1, 63, 64, 65, msg.len() / 2, msg.len() - 1, msg.len()].to_vec()
        };
        for at in splits {
            let mut h = Sha256::new();
            h.update(&msg[..at]).unwrap();
            h.update(&msg[at..]).unwrap();
            assert_eq!(h.finish().unwrap().to_string(), expected, "split at {at}");
        }
    }

    #[test]
    fn empty() {
        check(b"", EMPTY);
    }

    #[test]
    fn abc() {
        check(b"abc", ABC);
    }

    #[test]
    fn million_a() {
        check(&std::vec![b'a'; 1_000_000], MILLION_A);
    }

    #[test]
    fn padding_edges() {
        for (n, expected) in PATTERN {
            check(&pattern(n), expected);
        }
    }

    #[test]
    fn hex_round_trip_and_rejects() {
        let d = Hash32::from_hex(ABC).unwrap();
        assert_eq!(d, sha256(b"abc").unwrap());
        assert_eq!(Hash32::from_hex(&ABC.to_uppercase()), Some(d));
        assert_eq!(Hash32::from_hex(&ABC[..63]), None);
        assert_eq!(Hash32::from_hex(&std::format!("{}g", &ABC[..63])), None);
    }

    #[test]
    fn input_too_long_is_refused_before_emsha_sees_it() {
        let mut h = Sha256::new();
        h.len = MAX_INPUT_BYTES - 1;
        assert_eq!(h.update(b"a"), Ok(()));
        assert_eq!(h.update(b"a"), Err(HashError::InputTooLong));
        assert_eq!(h.len, MAX_INPUT_BYTES);
    }
}
