//! The chat page at `/`: a single page of wick's own (`webui/`: HTML, one
//! script, one style sheet, an icon), embedded in the binary, that chats
//! through `/v1/chat/completions` like any client. `--no-webui` leaves it
//! out, and `/` answers 404.
//!
//! Its responses carry a Content-Security-Policy that allows script, style
//! and requests from this origin only and no inline script, so that model
//! output, which the page only ever inserts as text, could not run even if
//! it were inserted as markup. The page is public, as llama.cpp's is; with
//! `--api-key` it asks for a key and sends it with every API call, which
//! the API checks as for any client.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// Everything from this origin, nothing inline, nothing from elsewhere;
/// `data:` and `blob:` images for pasted pictures; never framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX: &str = include_str!("webui/index.html");
const SCRIPT: &str = include_str!("webui/app.js");
const STYLE: &str = include_str!("webui/style.css");
const ICON: &str = include_str!("webui/icon.svg");

/// The page's routes, to merge beside the API's (outside its API-key
/// check: the page itself holds no data).
pub fn routes() -> Router {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX)))
        .route(
            "/webui/app.js",
            get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
        )
        .route(
            "/webui/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE)),
        )
        .route("/webui/icon.svg", get(|| asset("image/svg+xml", ICON)))
}

async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, content_type),
            (CONTENT_SECURITY_POLICY, CSP),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (X_FRAME_OPTIONS, "DENY"),
            (REFERRER_POLICY, "no-referrer"),
            // A new binary serves a new page: revalidate, never stale.
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
