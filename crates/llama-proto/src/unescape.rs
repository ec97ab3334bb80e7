//! JSON string unescaping into a caller-owned buffer, surrogate pairs included.
//!
//! The walk in `scan` hands strings over raw, so the decoder unescapes the ones it returns
//! here exactly as RFC 8259 says (surrogate pairs such as `\uD83D\uDE00` included): a control
//! character must be escaped, a lone surrogate is an error.

/// Why a JSON string could not be unescaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnescapeError {
    /// A bad escape, a lone surrogate, or an unescaped control character.
    Invalid,
    /// The output buffer is too small.
    Full,
}

/// True when `raw` can be used as is: no escapes and no control characters.
#[inline]
#[cfg(target_pointer_width = "64")]
pub(crate) fn is_plain(raw: &str) -> bool {
    // Eight bytes at a time, the rest one by one (zero padding would read as a control byte).
    let mut words = raw.as_bytes().chunks_exact(8);
    for word in words.by_ref() {
        let Ok(bytes) = <[u8; 8]>::try_from(word) else {
            return false;
        };
        if crate::scan::escape_or_control(u64::from_le_bytes(bytes)) != 0 {
            return false;
        }
    }
    !words.remainder().iter().any(|&b| b == b'\\' || b < 0x20)
}

/// True when `raw` can be used as is, a byte at a time (smaller on a 32-bit device).
#[cfg(not(target_pointer_width = "64"))]
#[inline]
pub(crate) fn is_plain(raw: &str) -> bool {
    !raw.bytes().any(|b| b == b'\\' || b < 0x20)
}

/// Unescapes `raw` (the text between the quotes) into `out`; returns the bytes written.
///
/// The output is never longer than the input, so `out.len() >= raw.len()` never fails with
/// [`UnescapeError::Full`].
pub(crate) fn unescape(raw: &str, out: &mut [u8]) -> Result<usize, UnescapeError> {
    let bytes = raw.as_bytes();
    let mut i = 0;
    let mut w = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x20 {
            return Err(UnescapeError::Invalid);
        }
        if b != b'\\' {
            // Copy the run up to the next backslash or control byte in one go.
            let run_end = bytes[i..]
                .iter()
                .position(|&c| c == b'\\' || c < 0x20)
                .map_or(bytes.len(), |p| i + p);
            put(out, &mut w, &bytes[i..run_end])?;
            i = run_end;
            continue;
        }
        let esc = *bytes.get(i + 1).ok_or(UnescapeError::Invalid)?;
        i += 2;
        let simple = match esc {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let hi = hex4(bytes, i)?;
                i += 4;
                let code = match hi {
                    0xD800..=0xDBFF => {
                        // A high surrogate must be followed by `\u` and a low surrogate.
                        if bytes.get(i) != Some(&b'\\') || bytes.get(i + 1) != Some(&b'u') {
                            return Err(UnescapeError::Invalid);
                        }
                        let lo = hex4(bytes, i + 2)?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return Err(UnescapeError::Invalid);
                        }
                        i += 6;
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(UnescapeError::Invalid),
                    c => c,
                };
                let c = char::from_u32(code).ok_or(UnescapeError::Invalid)?;
                let mut enc = [0u8; 4];
                put(out, &mut w, c.encode_utf8(&mut enc).as_bytes())?;
                continue;
            }
            _ => return Err(UnescapeError::Invalid),
        };
        put(out, &mut w, &[simple])?;
    }
    Ok(w)
}

fn put(out: &mut [u8], w: &mut usize, src: &[u8]) -> Result<(), UnescapeError> {
    let end = *w + src.len();
    out.get_mut(*w..end)
        .ok_or(UnescapeError::Full)?
        .copy_from_slice(src);
    *w = end;
    Ok(())
}

fn hex4(bytes: &[u8], at: usize) -> Result<u32, UnescapeError> {
    let digits = bytes.get(at..at + 4).ok_or(UnescapeError::Invalid)?;
    let mut v = 0u32;
    for &d in digits {
        let n = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return Err(UnescapeError::Invalid),
        };
        v = (v << 4) | u32::from(n);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn un(raw: &str) -> Result<std::string::String, UnescapeError> {
        let mut buf = [0u8; 64];
        let n = unescape(raw, &mut buf)?;
        Ok(std::string::String::from_utf8(buf[..n].to_vec()).unwrap())
    }

    #[test]
    fn simple_escapes() {
        assert_eq!(
            un(r#"a\"b\\c\/d\b\f\n\r\t"#).unwrap(),
            "a\"b\\c/d\u{8}\u{c}\n\r\t"
        );
    }

    #[test]
    fn unicode_escapes_and_surrogate_pairs() {
        assert_eq!(un(r"\u00e9\u4e2D").unwrap(), "é中");
        assert_eq!(un(r"x\ud83d\ude00y").unwrap(), "x😀y");
        assert_eq!(un(r"\u0000").unwrap(), "\0");
    }

    #[test]
    fn lone_or_bad_surrogates_are_invalid() {
        assert_eq!(un(r"\ud83d"), Err(UnescapeError::Invalid));
        assert_eq!(un(r"\ud83dx"), Err(UnescapeError::Invalid));
        assert_eq!(un(r"\ud83d\u0041"), Err(UnescapeError::Invalid));
        assert_eq!(un(r"\ude00"), Err(UnescapeError::Invalid));
    }

    #[test]
    fn bad_escapes_are_invalid() {
        assert_eq!(un(r"\x"), Err(UnescapeError::Invalid));
        assert_eq!(un(r"\u12"), Err(UnescapeError::Invalid));
        assert_eq!(un(r"\u12g4"), Err(UnescapeError::Invalid));
        assert_eq!(un("\\"), Err(UnescapeError::Invalid));
        assert_eq!(un("a\nb"), Err(UnescapeError::Invalid));
    }

    #[test]
    fn output_buffer_at_limit_and_one_past() {
        let mut buf = [0u8; 3];
        assert_eq!(unescape(r"a\nb", &mut buf), Ok(3));
        assert_eq!(&buf, b"a\nb");
        assert_eq!(unescape(r"a\nbc", &mut buf), Err(UnescapeError::Full));
    }

    #[test]
    fn plain_detection() {
        assert!(is_plain("héllo"));
        assert!(!is_plain(r"a\n"));
        assert!(!is_plain("a\tb"));
    }
}
