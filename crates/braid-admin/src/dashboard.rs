//! The web dashboard: static pages embedded in the binary (no build step), served at `/`.
//! They read the REST API with the key the operator types in (kept in the browser's session
//! storage), so the pages themselves need no key.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

use crate::Admin;

/// Each asset: its path, content type and bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    ("/", "text/html; charset=utf-8", include_str!("../assets/index.html")),
    ("/app.js", "text/javascript; charset=utf-8", include_str!("../assets/app.js")),
    ("/style.css", "text/css; charset=utf-8", include_str!("../assets/style.css")),
];

/// True for the dashboard's own files, which any visitor may load.
pub(crate) fn is_public(path: &str) -> bool {
    ASSETS.iter().any(|(p, ..)| *p == path)
}

/// The dashboard's routes.
pub(crate) fn routes() -> Router<Arc<Admin>> {
    ASSETS.iter().fold(Router::new(), |router, (path, kind, body)| {
        router
            .route(path, get(move || async move { ([(header::CONTENT_TYPE, *kind)], *body).into_response() }))
    })
}
