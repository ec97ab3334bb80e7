//! The one error type of the response reader: what was wrong with the bytes.

use core::fmt;

/// Why a response could not be read. Once returned, the reader keeps returning it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HttpError {
    /// The status line and headers did not end within the head buffer (`H` bytes).
    HeadersTooLarge,
    /// More header fields than the reader's cap `F` ([`MAX_HEADERS`](crate::MAX_HEADERS) by default).
    TooManyHeaders,
    /// The status line does not start with `HTTP/1.0` or `HTTP/1.1`.
    InvalidVersion,
    /// The status code or reason phrase is malformed.
    InvalidStatusLine,
    /// A header name holds a byte that is not a token character.
    InvalidHeaderName,
    /// A header value holds a control byte.
    InvalidHeaderValue,
    /// A CR in the head is not followed by LF.
    InvalidLineEnding,
    /// The head holds a malformed token.
    InvalidToken,
    /// More interim (1xx) responses than [`MAX_INTERIM_RESPONSES`](crate::MAX_INTERIM_RESPONSES).
    TooManyInterimResponses,
    /// A `101 Switching Protocols`, which this client never asks for.
    SwitchingProtocols,
    /// Both `Transfer-Encoding` and `Content-Length` (RFC 9112 6.3 rule 3: a smuggling sign).
    TransferEncodingWithContentLength,
    /// `Transfer-Encoding` in an HTTP/1.0 response (RFC 9112 6.1: faulty framing).
    TransferEncodingInHttp10,
    /// `Transfer-Encoding` is empty, not a token list, or applies `chunked` twice.
    InvalidTransferEncoding,
    /// A `Content-Length` value is not a decimal number that fits in 64 bits.
    InvalidContentLength,
    /// Several `Content-Length` values that differ.
    ConflictingContentLength,
    /// A chunk-size line does not start with a hex digit or is otherwise malformed.
    InvalidChunkSize,
    /// A chunk size has more than [`MAX_CHUNK_SIZE_DIGITS`](crate::MAX_CHUNK_SIZE_DIGITS) hex digits.
    ChunkSizeTooLong,
    /// A chunk-size line (with its extensions) is longer than [`CHUNK_LINE_CAP`](crate::CHUNK_LINE_CAP).
    ChunkLineTooLong,
    /// Chunk data is not followed by CRLF.
    MissingChunkCrlf,
    /// A trailer field line is malformed.
    InvalidTrailer,
    /// The trailer section is longer than the head buffer (`H` bytes).
    TrailersTooLarge,
    /// The body does not fit the body buffer (`N` bytes).
    BodyTooLarge,
    /// The input ended before the head was complete.
    IncompleteHead,
    /// The input ended before the body announced by `Content-Length` or chunking was complete.
    Truncated,
}

impl HttpError {
    /// The variant name, for machine-readable output (`{"error":"Truncated"}`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::HeadersTooLarge => "HeadersTooLarge",
            Self::TooManyHeaders => "TooManyHeaders",
            Self::InvalidVersion => "InvalidVersion",
            Self::InvalidStatusLine => "InvalidStatusLine",
            Self::InvalidHeaderName => "InvalidHeaderName",
            Self::InvalidHeaderValue => "InvalidHeaderValue",
            Self::InvalidLineEnding => "InvalidLineEnding",
            Self::InvalidToken => "InvalidToken",
            Self::TooManyInterimResponses => "TooManyInterimResponses",
            Self::SwitchingProtocols => "SwitchingProtocols",
            Self::TransferEncodingWithContentLength => "TransferEncodingWithContentLength",
            Self::TransferEncodingInHttp10 => "TransferEncodingInHttp10",
            Self::InvalidTransferEncoding => "InvalidTransferEncoding",
            Self::InvalidContentLength => "InvalidContentLength",
            Self::ConflictingContentLength => "ConflictingContentLength",
            Self::InvalidChunkSize => "InvalidChunkSize",
            Self::ChunkSizeTooLong => "ChunkSizeTooLong",
            Self::ChunkLineTooLong => "ChunkLineTooLong",
            Self::MissingChunkCrlf => "MissingChunkCrlf",
            Self::InvalidTrailer => "InvalidTrailer",
            Self::TrailersTooLarge => "TrailersTooLarge",
            Self::BodyTooLarge => "BodyTooLarge",
            Self::IncompleteHead => "IncompleteHead",
            Self::Truncated => "Truncated",
        }
    }
}

impl From<httparse::Error> for HttpError {
    fn from(e: httparse::Error) -> Self {
        match e {
            httparse::Error::HeaderName => Self::InvalidHeaderName,
            httparse::Error::HeaderValue => Self::InvalidHeaderValue,
            httparse::Error::NewLine => Self::InvalidLineEnding,
            httparse::Error::Status => Self::InvalidStatusLine,
            httparse::Error::Token => Self::InvalidToken,
            httparse::Error::TooManyHeaders => Self::TooManyHeaders,
            httparse::Error::Version => Self::InvalidVersion,
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::HeadersTooLarge => "response head larger than the head buffer",
            Self::TooManyHeaders => "too many header fields in the response head",
            Self::InvalidVersion => "status line does not start with HTTP/1.0 or HTTP/1.1",
            Self::InvalidStatusLine => "malformed status code or reason phrase",
            Self::InvalidHeaderName => "invalid byte in a header name",
            Self::InvalidHeaderValue => "invalid byte in a header value",
            Self::InvalidLineEnding => "CR without LF in the response head",
            Self::InvalidToken => "malformed token in the response head",
            Self::TooManyInterimResponses => "too many interim (1xx) responses",
            Self::SwitchingProtocols => "unrequested 101 Switching Protocols",
            Self::TransferEncodingWithContentLength => {
                "both Transfer-Encoding and Content-Length present"
            }
            Self::TransferEncodingInHttp10 => "Transfer-Encoding in an HTTP/1.0 response",
            Self::InvalidTransferEncoding => "malformed Transfer-Encoding",
            Self::InvalidContentLength => "Content-Length is not a 64-bit decimal number",
            Self::ConflictingContentLength => "several differing Content-Length values",
            Self::InvalidChunkSize => "malformed chunk-size line",
            Self::ChunkSizeTooLong => "chunk size has too many hex digits",
            Self::ChunkLineTooLong => "chunk-size line (with extensions) too long",
            Self::MissingChunkCrlf => "chunk data not followed by CRLF",
            Self::InvalidTrailer => "malformed trailer field line",
            Self::TrailersTooLarge => "trailer section larger than the head buffer",
            Self::BodyTooLarge => "body larger than the body buffer",
            Self::IncompleteHead => "input ended inside the response head",
            Self::Truncated => "input ended before the announced end of the body",
        };
        f.write_str(text)
    }
}

impl core::error::Error for HttpError {}
