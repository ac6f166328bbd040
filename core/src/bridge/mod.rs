//! The localhost bridge: the running runtime's HTTP API for the CLI, agents and the UI. Bound to
//! 127.0.0.1 only, on a port recorded with a random owner token in the profile (0600). Requests
//! with a wrong or missing token, a `Host` that is not this loopback address and port, or any
//! browser `Origin` are refused (DNS rebinding and CSRF), except, when the bridge serves the UI,
//! requests from its own pages: same origin `http://127.0.0.1:PORT` and a session cookie (`web`).
//!
//! Two kinds of bearer token are accepted: the owner's (the person, from the 0600 file) and agent
//! session tokens, each bound to one agent name (see `engine::agents`). The caller found here is
//! what the engine applies permissions to; nothing in a request body can change it.

/// The request vocabulary, at its old path (it lives in [`crate::api`], beneath the engine).
pub use crate::api;
pub mod client;
pub mod codex;
pub mod mcp;
pub mod session;
pub mod web;

use std::net::SocketAddr;

use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use tokio::net::TcpListener;

use crate::engine::{Caller, Error, Runtime};
use crate::identity::random_token;
use api::{ApiError, Request};

#[derive(Clone)]
struct BridgeState {
    rt: Runtime,
    token: String,
    port: u16,
    ui: Option<web::WebUi>,
}

/// The authenticated caller of one request.
#[derive(Clone)]
struct Auth {
    caller: Caller,
    token: String,
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its token.
    pub token: String,
    task: tokio::task::JoinHandle<()>,
}

impl Bridge {
    /// Stops serving.
    pub fn abort(&self) {
        self.task.abort();
    }
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(ApiError::new(code, message))).into_response()
}

/// Constant-time comparison of two tokens.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bearer token of a request ("" when there is none).
fn bearer(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("")
}

/// Why a request's `Origin` or `Host` is refused, if it is.
fn check_origin_host(headers: &HeaderMap, port: u16) -> Option<Response> {
    if headers.contains_key(header::ORIGIN) {
        return Some(refuse(StatusCode::FORBIDDEN, "origin_refused", "browser origins may not call the bridge"));
    }
    check_host(headers, port)
}

/// Why a request's `Host` is refused, if it is.
fn check_host(headers: &HeaderMap, port: u16) -> Option<Response> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let allowed = [format!("127.0.0.1:{port}"), format!("localhost:{port}")];
    if !allowed.iter().any(|a| a == host) {
        return Some(refuse(
            StatusCode::FORBIDDEN,
            "host_refused",
            "Host must be the loopback address and port of this bridge",
        ));
    }
    None
}

/// Why a request's headers are refused, if they are, checking the owner token only.
#[cfg(test)]
fn check_headers(headers: &HeaderMap, port: u16, token: &str) -> Option<Response> {
    if let Some(r) = check_origin_host(headers, port) {
        return Some(r);
    }
    if !same_token(bearer(headers).as_bytes(), token.as_bytes()) {
        return Some(refuse(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bridge token"));
    }
    None
}

async fn guard(State(s): State<BridgeState>, mut req: HttpRequest, next: Next) -> Response {
    // A page this bridge served: its session cookie is the only credential it may use.
    if let Some(ui) = &s.ui
        && (req.headers().contains_key(header::ORIGIN) || bearer(req.headers()).is_empty())
        && web::session_cookie(req.headers(), s.port).is_some()
    {
        if let Some(refusal) =
            check_host(req.headers(), s.port).or_else(|| web::browser_refusal(ui, req.headers(), s.port))
        {
            return refusal;
        }
        req.extensions_mut().insert(Auth { caller: Caller::Owner, token: String::new() });
        return next.run(req).await;
    }
    if let Some(refusal) = check_origin_host(req.headers(), s.port) {
        return refusal;
    }
    let given = bearer(req.headers()).to_owned();
    let caller = if same_token(given.as_bytes(), s.token.as_bytes()) {
        Caller::Owner
    } else {
        match s.rt.agent_for_token(&given).await {
            Ok(Some(agent)) => Caller::Agent(agent),
            Ok(None) => return refuse(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bridge token"),
            Err(e) => return (status_for(&e), Json(e.to_api())).into_response(),
        }
    };
    req.extensions_mut().insert(Auth { caller, token: given });
    next.run(req).await
}

/// The HTTP status of an engine error, from its stable code (the one grouping of variants).
fn status_for(e: &Error) -> StatusCode {
    match e.code() {
        "unknown_contact" | "unknown_message" | "unknown_group" => StatusCode::NOT_FOUND,
        "invalid_input" | "not_initialized" => StatusCode::BAD_REQUEST,
        "contact_exists" | "key_changed" | "pending_contact" | "already_initialized" | "loop_guard" => {
            StatusCode::CONFLICT
        }
        "relay" => StatusCode::BAD_GATEWAY,
        "local_network" => StatusCode::FORBIDDEN,
        "forbidden" => StatusCode::FORBIDDEN,
        // store, disk_full, keystore, profile, internal, and any code added later.
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn rpc(State(s): State<BridgeState>, Extension(auth): Extension<Auth>, Json(req): Json<Request>) -> Response {
    let result = match (&auth.caller, req) {
        (Caller::Agent(_), Request::SessionClose) => s.rt.close_session(&auth.token).await,
        (caller, req) => s.rt.handle_as(caller, req, false).await,
    };
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => (status_for(&e), Json(e.to_api())).into_response(),
    }
}

/// Which attachment `GET /v1/attachment` hands out.
#[derive(Debug, serde::Deserialize)]
struct AttachmentQuery {
    id: String,
    part: i64,
}

/// `GET /v1/attachment?id=ID&part=N` (owner only; the UI's "Save…"): the bytes as a download,
/// never as a page. Whatever media type the sender claimed (`text/html` too) it is served as
/// `application/octet-stream` with `Content-Disposition: attachment`, `nosniff` and a sandbox
/// CSP; the suggested file name is the inert display name, which the browser asks about.
async fn attachment(
    State(s): State<BridgeState>,
    Extension(auth): Extension<Auth>,
    axum::extract::Query(q): axum::extract::Query<AttachmentQuery>,
) -> Response {
    if !matches!(auth.caller, Caller::Owner) {
        return refuse(StatusCode::FORBIDDEN, "forbidden", "agents read attachments with `mail_attachment`");
    }
    let v = match s.rt.handle_as(&Caller::Owner, Request::MailAttachment { id: q.id, part: q.part }, false).await {
        Ok(v) => v,
        Err(e) => return (status_for(&e), Json(e.to_api())).into_response(),
    };
    let Some(data) = v.get("data_base64url").and_then(serde_json::Value::as_str).and_then(crate::util::b64u_decode)
    else {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal", "attachment bytes missing");
    };
    let name = v.get("name").and_then(serde_json::Value::as_str).unwrap_or("attachment");
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
        (header::CONTENT_DISPOSITION, content_disposition(name)),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        (header::CONTENT_SECURITY_POLICY, "sandbox; default-src 'none'".to_owned()),
        (header::CACHE_CONTROL, "no-store".to_owned()),
    ];
    (headers, data).into_response()
}

/// `attachment; filename="…"; filename*=UTF-8''…` for an (already inert) name: the ASCII
/// fallback keeps letters, digits, `.`, `-` and `_`; the UTF-8 form is percent-encoded.
fn content_disposition(name: &str) -> String {
    let ascii: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || ".-_".contains(c) { c } else { '_' }).collect();
    let mut encoded = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b".-_~".contains(&b) {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

/// `POST /v1/ui-code` (owner's bearer token only): a single-use login URL for the UI.
async fn ui_code(State(s): State<BridgeState>, Extension(auth): Extension<Auth>) -> Response {
    match (&s.ui, &auth.caller) {
        (Some(ui), Caller::Owner) if !auth.token.is_empty() => {
            let code = ui.sessions.mint_code();
            Json(serde_json::json!({"url": web::login_url(s.port, &code), "ui": ui.dir.is_some()})).into_response()
        }
        (None, _) => refuse(StatusCode::NOT_FOUND, "no_ui", "this runtime serves no UI: start it with --ui DIR"),
        _ => refuse(StatusCode::FORBIDDEN, "forbidden", "only the owner's token may sign a browser in"),
    }
}

/// `GET /v1/events` (owner only): the runtime's events as server-sent events.
async fn events(State(s): State<BridgeState>, Extension(auth): Extension<Auth>) -> Response {
    match auth.caller {
        Caller::Owner => web::event_stream(&s.rt).into_response(),
        Caller::Agent(_) => refuse(StatusCode::FORBIDDEN, "forbidden", "agent sessions read their own queue"),
    }
}

/// Pages and sign-in: `Host` checked, no token (the pages are public; the API is not).
async fn public(State(s): State<BridgeState>, req: HttpRequest) -> Response {
    if let Some(refusal) = check_host(req.headers(), s.port) {
        return refusal;
    }
    let Some(ui) = &s.ui else {
        return refuse(StatusCode::NOT_FOUND, "not_found", "no such endpoint");
    };
    let path = req.uri().path().to_owned();
    if req.method() == axum::http::Method::POST && path == "/v1/session" {
        let headers = req.headers().clone();
        let body = axum::body::to_bytes(req.into_body(), 4096).await.unwrap_or_default();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        return web::redeem_response(ui, &headers, s.port, &body);
    }
    match (&ui.dir, req.method()) {
        (Some(dir), &axum::http::Method::GET) if !web::is_api_path(&path) => web::static_file(dir, &path).await,
        _ => refuse(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
    }
}

/// Serves the bridge for `rt` on 127.0.0.1 (an OS-chosen port) and records port and token.
pub async fn serve(rt: Runtime) -> std::io::Result<Bridge> {
    serve_with(rt, None).await
}

/// Like [`serve`], and with `ui` also serves the UI's pages, sign-in codes and browser sessions.
pub async fn serve_with(rt: Runtime, ui: Option<web::WebUi>) -> std::io::Result<Bridge> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let token = random_token();
    // Agent sessions of an earlier runtime end with it.
    rt.revoke_agent_tokens().await.map_err(|e| std::io::Error::other(e.to_string()))?;
    rt.profile().write_bridge_files(addr.port(), &token).map_err(|e| std::io::Error::other(e.to_string()))?;
    let state = BridgeState { rt, token: token.clone(), port: addr.port(), ui };
    let app = Router::new()
        .route("/v1/rpc", post(rpc))
        .route("/v1/ping", get(|| async { Json(serde_json::json!({"ok": true})) }))
        .route("/v1/ui-code", post(ui_code))
        .route("/v1/events", get(events))
        .route("/v1/attachment", get(attachment))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .fallback(public)
        .with_state(state);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("bridge stopped: {e}");
        }
    });
    Ok(Bridge { addr, token, task })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(host: Option<&str>, auth: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_download_name_is_quoted_safely() {
        assert_eq!(
            content_disposition("_._.._etc_passwd"),
            "attachment; filename=\"_._.._etc_passwd\"; filename*=UTF-8''_._.._etc_passwd"
        );
        assert_eq!(
            content_disposition("a \"b\";.txt"),
            "attachment; filename=\"a__b__.txt\"; filename*=UTF-8''a%20%22b%22%3B.txt"
        );
    }

    #[test]
    fn refusals() {
        let ok = headers(Some("127.0.0.1:5000"), Some("Bearer tok"), None);
        assert!(check_headers(&ok, 5000, "tok").is_none());
        assert!(check_headers(&headers(Some("localhost:5000"), Some("Bearer tok"), None), 5000, "tok").is_none());
        let cases = [
            headers(Some("127.0.0.1:5000"), None, None),
            headers(Some("127.0.0.1:5000"), Some("Bearer nope"), None),
            headers(Some("evil.example:5000"), Some("Bearer tok"), None),
            headers(Some("127.0.0.1:5001"), Some("Bearer tok"), None),
            headers(Some(""), Some("Bearer tok"), None),
            headers(None, Some("Bearer tok"), None),
            headers(Some("127.0.0.1:5000"), Some("Bearer tok"), Some("http://127.0.0.1:5000")),
        ];
        for (i, h) in cases.iter().enumerate() {
            assert!(check_headers(h, 5000, "tok").is_some(), "case {i} was let through");
        }
    }
}
