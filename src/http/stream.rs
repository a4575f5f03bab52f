//! Streamed JSON answers: an answer that may be large (every fence, a page of events) is written
//! piece by piece as the client reads it, never built whole. A piece is made only when the
//! connection asks for the next one, so a client that reads slowly holds one piece of memory,
//! not the answer; one that stops reading is dropped by the server's write timeout.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// About how many bytes a piece holds before it is handed to the connection.
pub const PIECE_BYTES: usize = 64 * 1024;

/// A `200 application/json` answer whose body is `next(&mut state)`'s pieces, in order, until it
/// returns `None`.
pub fn json<S, F>(state: S, mut next: F) -> Response
where
    S: Send + 'static,
    F: FnMut(&mut S) -> Option<String> + Send + 'static,
{
    let pieces = futures_util::stream::unfold(state, move |mut state| {
        let piece = next(&mut state);
        async move { piece.map(|p| (Ok::<_, Infallible>(Bytes::from(p)), state)) }
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(pieces),
    )
        .into_response()
}
