//! Bodies for the answers hyper writes itself. A request hyper cannot
//! parse (a malformed request line or header, a URI or headers over its
//! limits) never reaches the router: hyper answers 400, 414 or 431 with an
//! empty body and closes the connection. This writer, between hyper and
//! the socket, gives those answers the OpenAI error object every other
//! error carries. The router's own answers always have a body, so an
//! empty-bodied 400/414/431 that closes the connection is hyper's.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::error::ApiError;

/// A connection's socket, with hyper's empty error answers given bodies.
pub struct ErrorBodies<S> {
    inner: S,
    /// An answer being written in place of hyper's: its bytes, how many
    /// are written, and the length of what hyper asked to write.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> ErrorBodies<S> {
    /// Wraps a connection's socket.
    pub fn new(inner: S) -> ErrorBodies<S> {
        ErrorBodies { inner, pending: None }
    }
}

/// What hyper writes after the status line of an answer to a request it
/// could not parse.
const EMPTY_CLOSE: &str = "\r\nconnection: close\r\ncontent-length: 0\r\n";

/// `head` with a body saying what went wrong, when it is hyper's own answer
/// to a request it could not parse.
fn with_body(head: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(head).ok()?;
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    let message = match status {
        "400" => "the request is not well-formed HTTP/1.1 (its request line or a header could not be read)",
        "414" => "the request's URI is too long",
        "431" => "the request's header fields are too many or too large",
        _ => return None,
    };
    let line_end = head.find("\r\n")?;
    if !head.ends_with("\r\n\r\n") || !head[line_end..].starts_with(EMPTY_CLOSE) {
        return None;
    }
    let body = ApiError::bad_request(message).body().to_string();
    let rest = &head[line_end + EMPTY_CLOSE.len()..];
    Some(
        format!(
            "{}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{rest}{body}",
            &head[..line_end],
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncWrite + Unpin> ErrorBodies<S> {
    /// Writes the pending answer to its end; then reports `hyper`'s bytes
    /// as written.
    fn drain_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some((bytes, written, asked)) = &mut self.pending {
            if *written == bytes.len() {
                let asked = *asked;
                self.pending = None;
                return Poll::Ready(Ok(asked));
            }
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..])) {
                Ok(0) => {
                    self.pending = None;
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Ok(n) => *written += n,
                Err(e) => {
                    self.pending = None;
                    return Poll::Ready(Err(e));
                }
            }
        }
        Poll::Ready(Ok(0))
    }

    /// Starts writing `buf`'s replacement when it is one of hyper's empty
    /// error answers.
    fn replace(&mut self, buf: &[u8]) -> bool {
        if self.pending.is_none()
            && let Some(bytes) = with_body(buf)
        {
            self.pending = Some((bytes, 0, buf.len()));
        }
        self.pending.is_some()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ErrorBodies<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ErrorBodies<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.replace(buf) {
            return self.drain_pending(cx);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper's error answer is a head alone: one buffer.
        if let [only] = bufs
            && self.replace(only)
        {
            return self.drain_pending(cx);
        }
        if self.pending.is_some() {
            return self.drain_pending(cx);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.drain_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.drain_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: \
                        0\r\ndate: Thu, 03 Dec 2026 23:07:28 GMT\r\n\r\n";

    #[test]
    fn hypers_empty_error_answers_get_an_error_object() {
        let out = String::from_utf8(with_body(HEAD.as_bytes()).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())), "{head}");
        assert!(head.contains("\r\ndate: "), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"].as_str().unwrap().contains("header fields"));
    }

    #[test]
    fn other_answers_pass_as_they_are() {
        for head in [
            // The router's own 400s carry a body.
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n",
            // A head followed by its body.
            "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\nmore",
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 4",
        ] {
            assert_eq!(with_body(head.as_bytes()), None, "{head}");
        }
    }
}
