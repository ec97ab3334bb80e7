//! The response head: parsed by httparse into offsets, read back through [`Head`].
//!
//! Offsets (not slices) are kept so the reader owns no borrow of its own buffer.

use core::mem::MaybeUninit;

use crate::framing::{self, Framing};
use crate::HttpError;

/// The HTTP version of the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// `HTTP/1.0`
    Http10,
    /// `HTTP/1.1`
    Http11,
}

impl Version {
    /// `"HTTP/1.0"` or `"HTTP/1.1"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// A byte range of the head buffer. `u32` keeps a span at 8 bytes (the table of 64 at 1 KiB);
/// `H` is checked to fit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// The span of `part` inside `base`, or an empty span if `part` does not lie inside it
    /// (httparse returns a static `""` for a reason phrase with obs-text).
    fn of(base: &[u8], part: &[u8]) -> Span {
        let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
        match start.checked_add(part.len()) {
            Some(end) if end <= base.len() => Span {
                start: start as u32,
                len: part.len() as u32,
            },
            _ => Span::default(),
        }
    }

    /// The span of `part`, a slice httparse took from `base` (a header name or value). No range
    /// check: httparse's slices of the input always lie in it, and `get` reads a span that does
    /// not as empty.
    #[inline]
    fn within(base: &[u8], part: &[u8]) -> Span {
        Span {
            start: (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize) as u32,
            len: part.len() as u32,
        }
    }

    fn get(self, buf: &[u8]) -> &[u8] {
        let start = self.start as usize;
        buf.get(start..start + self.len as usize).unwrap_or(&[])
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HeaderSpan {
    name: Span,
    value: Span,
}

/// Everything the reader remembers about a parsed head, as offsets into the head buffer; at
/// most `F` header fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadIndex<const F: usize> {
    pub(crate) version: Version,
    pub(crate) status: u16,
    reason: Span,
    pub(crate) framing: Framing,
    pub(crate) verdict: Result<Framing, HttpError>,
    count: usize,
    spans: Spans<F>,
}

/// How many header offsets a typical head needs (llama-server sends 5 or 6 fields).
pub(crate) const FEW_HEADERS: usize = 16;

/// The header offset table, sized on first use: a reader is built per response, and filling
/// 1 KiB of offsets (64 fields) it may never use was a measurable part of reading a head. Safe
/// Rust has no uninitialised array, so the table starts as no table and the small one covers
/// common heads. With `F` at most [`FEW_HEADERS`] the full table is the small one or smaller.
#[derive(Debug, Clone, Copy)]
// The size difference is the point: building the small variant writes only its 256 bytes.
#[allow(clippy::large_enum_variant)]
enum Spans<const F: usize> {
    None,
    Few([HeaderSpan; FEW_HEADERS]),
    Many([HeaderSpan; F]),
}

impl<const F: usize> Spans<F> {
    /// A zeroed table of at least `n` offsets (`n` at most `F`).
    #[inline]
    fn with_room(&mut self, n: usize) -> &mut [HeaderSpan] {
        if n <= FEW_HEADERS && F > FEW_HEADERS {
            *self = Spans::Few([HeaderSpan::default(); FEW_HEADERS]);
        } else {
            *self = Spans::Many([HeaderSpan::default(); F]);
        }
        self.all_mut()
    }

    fn all(&self) -> &[HeaderSpan] {
        match self {
            Spans::None => &[],
            Spans::Few(t) => t,
            Spans::Many(t) => t,
        }
    }

    fn all_mut(&mut self) -> &mut [HeaderSpan] {
        match self {
            Spans::None => &mut [],
            Spans::Few(t) => t,
            Spans::Many(t) => t,
        }
    }
}

/// Parses a response head from the start of `buf` into `index`; `Some((end, folded))` once the
/// head is complete, `folded` telling whether it held obs-fold. Framing is decided later, after
/// obs-fold has been rewritten in the copy the reader keeps.
pub(crate) fn parse<const F: usize>(
    buf: &[u8],
    index: &mut HeadIndex<F>,
) -> Result<Option<(usize, bool)>, HttpError> {
    let mut config = httparse::ParserConfig::default();
    // Strict first: obs-fold is rare, and the lenient pass must look one byte past each line end.
    match parse_with(buf, &config, index) {
        Err(_) => {
            config.allow_obsolete_multiline_headers_in_responses(true);
            Ok(parse_with(buf, &config, index)?.map(|end| (end, true)))
        }
        Ok(end) => Ok(end.map(|end| (end, false))),
    }
}

// Inlined into `parse`: one call frame less on every head.
#[inline(always)]
fn parse_with<const F: usize>(
    buf: &[u8],
    config: &httparse::ParserConfig,
    index: &mut HeadIndex<F>,
) -> Result<Option<usize>, HttpError> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; F];
    let mut response = httparse::Response::new(&mut []);
    let end = match config.parse_response_with_uninit_headers(&mut response, buf, &mut slots)? {
        httparse::Status::Complete(end) => end,
        httparse::Status::Partial => return Ok(None),
    };
    index.version = match response.version {
        Some(0) => Version::Http10,
        _ => Version::Http11,
    };
    index.status = response.code.unwrap_or(0);
    index.reason = Span::of(buf, response.reason.unwrap_or("").as_bytes());
    index.framing = Framing::Close;
    index.count = response.headers.len();
    // The framing is decided in the same pass over httparse's slices that records the offsets;
    // a folded head is decided again after unfolding (the verdict is only used for a final head
    // without obs-fold).
    let mut fields = framing::Fields::default();
    let spans = index.spans.with_room(response.headers.len());
    for (slot, h) in spans.iter_mut().zip(response.headers.iter()) {
        let name = h.name.as_bytes();
        *slot = HeaderSpan {
            name: Span::within(buf, name),
            value: Span::within(buf, h.value),
        };
        fields.add(name, h.value);
    }
    let minor = u8::from(index.version == Version::Http11);
    index.verdict = fields.decide(index.status, minor);
    Ok(Some(end))
}

impl<const F: usize> HeadIndex<F> {
    /// An index with no head yet; only a few words are written (the offset table is not there
    /// yet). Not a `const`, which could be copied in whole from read-only data.
    #[inline]
    pub(crate) fn empty() -> Self {
        HeadIndex {
            version: Version::Http11,
            status: 0,
            reason: Span::default(),
            framing: Framing::None,
            verdict: Ok(Framing::None),
            count: 0,
            spans: Spans::None,
        }
    }

    /// The offsets of the header fields, in order.
    fn spans(&self) -> &[HeaderSpan] {
        self.spans.all().get(..self.count).unwrap_or(&[])
    }

    /// RFC 9112 5.2: a user agent replaces each obs-fold with SP. httparse leaves the CRLFs in
    /// the value; turning each CR and LF into SP keeps every offset valid.
    pub(crate) fn unfold(&self, buf: &mut [u8]) {
        for h in self.spans() {
            let start = h.value.start as usize;
            if let Some(value) = buf.get_mut(start..start + h.value.len as usize) {
                for b in value.iter_mut().filter(|b| **b == b'\r' || **b == b'\n') {
                    *b = b' ';
                }
            }
        }
    }

    /// Decides the framing from the (unfolded) copy in `buf`.
    pub(crate) fn decide_framing(&mut self, buf: &[u8]) -> Result<Framing, HttpError> {
        let minor = u8::from(self.version == Version::Http11);
        let headers = self
            .spans()
            .iter()
            .map(|h| (h.name.get(buf), h.value.get(buf)));
        self.framing = framing::decide(self.status, minor, headers)?;
        Ok(self.framing)
    }
}

/// A parsed response head, borrowed from the reader.
#[derive(Clone, Copy)]
pub struct Head<'a> {
    buf: &'a [u8],
    reason: Span,
    version: Version,
    status: u16,
    framing: Framing,
    spans: &'a [HeaderSpan],
}

impl<'a> Head<'a> {
    pub(crate) fn new<const F: usize>(buf: &'a [u8], index: &'a HeadIndex<F>) -> Self {
        Head {
            buf,
            reason: index.reason,
            version: index.version,
            status: index.status,
            framing: index.framing,
            spans: index.spans(),
        }
    }

    /// `HTTP/1.0` or `HTTP/1.1`.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The status code, 100 to 999.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The reason phrase; empty when absent or when it held non-ASCII bytes.
    pub fn reason(&self) -> &'a str {
        core::str::from_utf8(self.reason.get(self.buf)).unwrap_or("")
    }

    /// How the body is delimited.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The header fields in order, as (name, value). A value has no leading or trailing
    /// whitespace, and each obs-fold in it reads as spaces.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        let buf = self.buf;
        self.spans.iter().map(move |h| {
            // Names were checked by httparse to be token characters, hence ASCII.
            let name = core::str::from_utf8(h.name.get(buf)).unwrap_or("");
            (name, h.value.get(buf))
        })
    }

    /// The value of the first header field with this name, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }
}

impl core::fmt::Debug for Head<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Head")
            .field("version", &self.version())
            .field("status", &self.status())
            .field("reason", &self.reason())
            .field("framing", &self.framing())
            .finish_non_exhaustive()
    }
}
