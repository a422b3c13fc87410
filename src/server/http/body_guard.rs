//! A response body that carries a guard until it is dropped, and tells the
//! guard whether the body was sent to its end or cut off (the client went
//! away). The access log and the connection tracker both hang off it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use http_body::{Body as _, Frame, SizeHint};

pub trait BodyEnd: Send + Unpin + 'static {
    /// The body is gone; `complete` if it was sent to its end.
    fn body_dropped(&mut self, complete: bool);
}

pub fn guard_body<G: BodyEnd>(inner: Body, guard: G) -> Body {
    Body::new(GuardedBody {
        inner,
        guard,
        complete: false,
    })
}

struct GuardedBody<G: BodyEnd> {
    inner: Body,
    guard: G,
    complete: bool,
}

impl<G: BodyEnd> Drop for GuardedBody<G> {
    fn drop(&mut self) {
        // hyper stops polling a body that says it has ended.
        let complete = self.complete || self.inner.is_end_stream();
        self.guard.body_dropped(complete);
    }
}

impl<G: BodyEnd> http_body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.complete = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
