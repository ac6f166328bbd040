//! The UI over the bridge: a built `ui/dist` served as static files, single-use login codes traded
//! for an HttpOnly SameSite=Strict session cookie, the same-origin rule for browser requests,
//! runtime events as server-sent events, and the first-run host that serves the UI before the
//! profile has an identity.
//!
//! - `switchboard ui` (or the owner's bearer token at `POST /v1/ui-code`) mints a code valid once
//!   for [`CODE_TTL`]; the URL carries it in the fragment, which browsers never send to servers.
//! - The page posts the code to `POST /v1/session` and gets the cookie; the fragment is erased.
//! - Browser requests are accepted only with that cookie and an `Origin` (or, for a plain GET, a
//!   `Sec-Fetch-Site: same-origin`) that is exactly this bridge's own `http://127.0.0.1:PORT`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};

use super::client::Conn;
use crate::api::{ApiError, Request};
use crate::engine::{Caller, Event, InitOptions, Runtime};
use crate::identity::keystore::KeystorePreference;
use crate::identity::random_token;
use crate::profile::{Profile, ProfileLock};
use crate::util::sha256;

/// How long a login code may wait to be redeemed.
pub const CODE_TTL: Duration = Duration::from_secs(60);
/// Most unredeemed codes kept (older ones are dropped first).
const MAX_CODES: usize = 64;
/// Most live browser sessions kept (older ones are dropped first).
const MAX_SESSIONS: usize = 64;

/// The Content-Security-Policy of every page the bridge serves (the Tauri app uses the same).
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

#[derive(Default)]
struct SessionsInner {
    /// sha256(code) -> when it stops being valid.
    codes: BTreeMap<[u8; 32], Instant>,
    /// sha256(session token) -> when it was made (for eviction order).
    sessions: BTreeMap<[u8; 32], Instant>,
}

/// Login codes and browser sessions of one bridge. Only hashes are kept.
#[derive(Clone, Default)]
pub struct Sessions {
    inner: Arc<Mutex<SessionsInner>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sessions(..)")
    }
}

fn oldest<K: Copy + Ord>(m: &BTreeMap<K, Instant>) -> Option<K> {
    m.iter().min_by_key(|(_, t)| **t).map(|(k, _)| *k)
}

impl Sessions {
    /// Mints a single-use login code valid for [`CODE_TTL`].
    pub fn mint_code(&self) -> String {
        let code = random_token();
        if let Ok(mut s) = self.inner.lock() {
            let now = Instant::now();
            s.codes.retain(|_, until| *until > now);
            while s.codes.len() >= MAX_CODES {
                match oldest(&s.codes) {
                    Some(k) => s.codes.remove(&k),
                    None => break,
                };
            }
            s.codes.insert(sha256(code.as_bytes()), now + CODE_TTL);
        }
        code
    }

    /// Redeems a code (once, before it expires) for a new session token.
    pub fn redeem(&self, code: &str) -> Option<String> {
        let mut s = self.inner.lock().ok()?;
        let until = s.codes.remove(&sha256(code.as_bytes()))?;
        if until <= Instant::now() {
            return None;
        }
        while s.sessions.len() >= MAX_SESSIONS {
            match oldest(&s.sessions) {
                Some(k) => s.sessions.remove(&k),
                None => break,
            };
        }
        let token = random_token();
        s.sessions.insert(sha256(token.as_bytes()), Instant::now());
        Some(token)
    }

    /// Whether `token` is a live session.
    pub fn is_session(&self, token: &str) -> bool {
        !token.is_empty()
            && self.inner.lock().map(|s| s.sessions.contains_key(&sha256(token.as_bytes()))).unwrap_or(false)
    }
}

/// What a bridge needs to serve the UI.
#[derive(Debug, Clone, Default)]
pub struct WebUi {
    /// The built UI (`ui/dist`); `None` serves no pages but still accepts sessions.
    pub dir: Option<PathBuf>,
    /// Codes and sessions.
    pub sessions: Sessions,
}

/// This bridge's own origin, the only one browser requests may come from.
pub fn own_origin(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The session cookie's name (per port: cookies do not separate ports).
pub fn cookie_name(port: u16) -> String {
    format!("sb_session_{port}")
}

/// The `Set-Cookie` value for a new session.
pub fn set_cookie(port: u16, token: &str) -> String {
    format!("{}={token}; HttpOnly; SameSite=Strict; Path=/", cookie_name(port))
}

/// Whether the request's `Origin` is exactly this bridge's own.
pub fn has_own_origin(headers: &HeaderMap, port: u16) -> bool {
    headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) == Some(own_origin(port).as_str())
}

/// Whether a request comes from a page of this bridge: its own `Origin`, or no `Origin` on a
/// request the browser itself marks same-origin (a GET such as `EventSource`).
pub fn is_same_origin(headers: &HeaderMap, port: u16) -> bool {
    if headers.contains_key(header::ORIGIN) {
        return has_own_origin(headers, port);
    }
    headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) == Some("same-origin")
}

/// The session cookie's value, if the request carries one for this port.
pub fn session_cookie(headers: &HeaderMap, port: u16) -> Option<String> {
    let name = cookie_name(port);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// A refusal as JSON `{code, message}`.
pub fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(ApiError::new(code, message))).into_response()
}

fn security_headers(h: &mut HeaderMap) {
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" | "map" => "application/json",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The file under `dir` a URL path names: only plain components, never `..`, hidden files or
/// anything outside `dir`. Paths without a file extension are the app's own routes: index.html.
pub fn resolve_static(dir: &Path, url_path: &str) -> Option<PathBuf> {
    let rel = url_path.trim_start_matches('/');
    let mut out = dir.to_path_buf();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(s) if !s.to_string_lossy().starts_with('.') => out.push(s),
            _ => return None,
        }
    }
    if rel.is_empty() || !out.is_file() && out.extension().is_none() {
        out = dir.join("index.html");
    }
    out.is_file().then_some(out)
}

/// Serves one static file of the UI with the security headers.
pub async fn static_file(dir: &Path, url_path: &str) -> Response {
    let Some(path) = resolve_static(dir, url_path) else {
        return refuse(StatusCode::NOT_FOUND, "not_found", "no such file");
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) => {
            let mut r = bytes.into_response();
            let h = r.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(&path)));
            security_headers(h);
            r
        }
        Err(_) => refuse(StatusCode::NOT_FOUND, "not_found", "no such file"),
    }
}

/// Trades a login code for a session cookie (the caller checked `Host`).
pub fn redeem_response(ui: &WebUi, headers: &HeaderMap, port: u16, body: &Value) -> Response {
    if !has_own_origin(headers, port) {
        return refuse(StatusCode::FORBIDDEN, "origin_refused", "only this bridge's own pages may sign in");
    }
    let code = body.get("code").and_then(Value::as_str).unwrap_or("");
    match ui.sessions.redeem(code) {
        Some(token) => {
            let mut r = Json(json!({"ok": true})).into_response();
            if let Ok(v) = HeaderValue::from_str(&set_cookie(port, &token)) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        None => refuse(StatusCode::UNAUTHORIZED, "bad_code", "the sign-in code is wrong, used or expired"),
    }
}

/// A runtime event as the UI sees it. The one place core events become UI events (the bridge's
/// event stream and the desktop shell both use it).
pub fn ui_event(e: &Event) -> Value {
    match e {
        Event::Message { id } => json!({"type": "message", "id": id}),
        Event::Request { name } => json!({"type": "request", "name": name}),
        Event::Delivery { id, state } => json!({"type": "delivery", "id": id, "state": state}),
        Event::KeyChanged { name } => json!({"type": "key_changed", "name": name}),
        Event::Resumed { .. } => json!({"type": "changed"}),
        Event::Dnd { on } => json!({"type": "dnd", "on": on}),
        Event::GroupResumed { .. } | Event::GroupChanged { .. } => json!({"type": "changed"}),
        Event::GroupMessage { handle, group, id, from, own } => {
            json!({"type": "group_message", "handle": handle, "group": group, "id": id, "from": from, "own": own})
        }
    }
}

/// The runtime's events as server-sent events, until the client goes away.
pub fn event_stream(rt: &Runtime) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>> + use<>> {
    let rx = rt.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let data = match rx.recv().await {
            Ok(e) => ui_event(&e),
            // Missed some: the UI refreshes everything.
            Err(broadcast::error::RecvError::Lagged(_)) => json!({"type": "changed"}),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(SseEvent::default().data(data.to_string())), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// The URL that signs a browser in with `code`.
pub fn login_url(port: u16, code: &str) -> String {
    format!("{}/#code={code}", own_origin(port))
}

/// Checks accepted for a browser request (cookie and origin); `None` means let it through.
pub fn browser_refusal(ui: &WebUi, headers: &HeaderMap, port: u16) -> Option<Response> {
    if !is_same_origin(headers, port) {
        return Some(refuse(StatusCode::FORBIDDEN, "origin_refused", "only this bridge's own pages may call it"));
    }
    match session_cookie(headers, port) {
        Some(t) if ui.sessions.is_session(&t) => None,
        _ => Some(refuse(StatusCode::UNAUTHORIZED, "unauthorized", "sign in with `switchboard ui`")),
    }
}

/// Live sessions and codes, for tests.
pub fn counts(s: &Sessions) -> (usize, usize) {
    s.inner.lock().map(|i| (i.codes.len(), i.sessions.len())).unwrap_or((0, 0))
}

/// Paths the first-run host and the bridge keep for themselves.
pub fn is_api_path(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

/// Whether `Host` is this server's loopback address and port (DNS rebinding).
pub fn host_ok(headers: &HeaderMap, port: u16) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    host == format!("127.0.0.1:{port}") || host == format!("localhost:{port}")
}

/// The UI build next to the sources this binary was built from (a development checkout), if any.
pub fn default_ui_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../ui/dist"));
    dir.join("index.html").is_file().then_some(dir)
}

/// Options of `switchboard ui`.
#[derive(Debug, Clone)]
pub struct UiOptions {
    /// The built UI (default: `$SWITCHBOARD_UI_DIR`, else the checkout's `ui/dist`).
    pub dir: Option<PathBuf>,
    /// Keystore for a profile created from the first-run screen.
    pub keystore: KeystorePreference,
    /// Print JSON.
    pub json: bool,
}

fn api_error(code: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::new(code, message.to_string())
}

fn announce(json_out: bool, url: &str, note: &str) {
    use std::io::Write;
    if json_out {
        println!("{}", json!({"url": url}));
    } else {
        println!("{url}");
    }
    let _ = std::io::stdout().flush();
    eprintln!("switchboard ui: {note}; the link signs one browser in once, within {} s", CODE_TTL.as_secs());
}

/// SIGTERM or Ctrl-C, listened for from the moment this is called.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        let term = async {
            #[cfg(unix)]
            if let Some(t) = term.as_mut() {
                t.recv().await;
                return;
            }
            std::future::pending::<()>().await;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
    }
}

/// `switchboard ui`: prints a single-use sign-in URL for the profile's runtime. If a runtime
/// already owns the profile, its bridge mints the code (it must serve a UI: `daemon --ui DIR`);
/// otherwise this process becomes the runtime, serving the UI, and first the first-run screen
/// when the profile has no identity yet.
pub async fn run_ui(profile: Profile, opts: UiOptions) -> Result<(), ApiError> {
    let dir = opts.dir.clone().or_else(default_ui_dir);
    let stop = stop_signal();
    let lock = loop_lock(&profile).await?;
    let Some(lock) = lock else {
        return remote_code(&profile, opts.json).await;
    };
    profile.remove_bridge_files();
    let ui = WebUi { dir: dir.clone(), sessions: Sessions::default() };
    let (rt, bridge) = if profile.is_initialized() {
        let rt = Runtime::open(&profile).await.map_err(|e| e.to_api())?;
        let bridge = super::serve_with(rt.clone(), Some(ui.clone())).await.map_err(|e| api_error("bridge", e))?;
        announce(opts.json, &login_url(bridge.addr.port(), &ui.sessions.mint_code()), "open this link");
        (rt, bridge)
    } else {
        let (done_tx, mut done_rx) = mpsc::channel(1);
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| api_error("bridge", e))?;
        let port = listener.local_addr().map_err(|e| api_error("bridge", e))?.port();
        let state = SetupState {
            profile: profile.clone(),
            ui: ui.clone(),
            port,
            keystore: opts.keystore,
            done: done_tx,
            busy: Arc::new(tokio::sync::Mutex::new(())),
        };
        let app = axum::Router::new().fallback(setup_handler).with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        announce(opts.json, &login_url(port, &ui.sessions.mint_code()), "open this link to set up this profile");
        tokio::pin!(stop);
        let done = tokio::select! {
            d = done_rx.recv() => d,
            _ = &mut stop => None,
        };
        let Some(done) = done else {
            task.abort();
            return Ok(());
        };
        // Let the answer that carries the new URL go out before the first-run host stops.
        tokio::time::sleep(Duration::from_millis(500)).await;
        task.abort();
        let tasks = done.0.start_background();
        stop.await;
        return shut_down(&profile, done.0, done.1, tasks, lock).await;
    };
    let tasks = rt.start_background();
    stop.await;
    shut_down(&profile, rt, bridge, tasks, lock).await
}

async fn shut_down(
    profile: &Profile,
    rt: Runtime,
    bridge: super::Bridge,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _lock: ProfileLock,
) -> Result<(), ApiError> {
    rt.shutdown();
    bridge.abort();
    profile.remove_bridge_files();
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    Ok(())
}

/// The profile lock if nobody holds it, or `None` once the owner's bridge files exist.
async fn loop_lock(profile: &Profile) -> Result<Option<ProfileLock>, ApiError> {
    profile.ensure_dir().map_err(|e| api_error("profile", e))?;
    for _ in 0..50 {
        if let Some(lock) = profile.try_lock().map_err(|e| api_error("profile", e))? {
            return Ok(Some(lock));
        }
        if profile.read_bridge_files().is_some() {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(api_error("runtime_busy", "another runtime owns this profile but its bridge is not answering"))
}

async fn remote_code(profile: &Profile, json_out: bool) -> Result<(), ApiError> {
    let (port, token) = profile
        .read_bridge_files()
        .ok_or_else(|| api_error("runtime_busy", "the runtime's bridge is not answering"))?;
    let Conn::Remote { http, .. } = Conn::remote(port, token.clone())? else {
        return Err(api_error("internal", "not a remote connection"));
    };
    let resp = http
        .post(format!("http://127.0.0.1:{port}/v1/ui-code"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| api_error("bridge_unreachable", e))?;
    let ok = resp.status().is_success();
    let body: Value = resp.json().await.map_err(|e| api_error("bridge_malformed", e))?;
    if !ok {
        return Err(serde_json::from_value(body).unwrap_or_else(|e| api_error("bridge_malformed", e)));
    }
    let url = body.get("url").and_then(Value::as_str).unwrap_or_default();
    announce(json_out, url, "open this link (the running runtime serves it)");
    Ok(())
}

#[derive(Clone)]
struct SetupState {
    profile: Profile,
    ui: WebUi,
    port: u16,
    keystore: KeystorePreference,
    done: mpsc::Sender<(Runtime, super::Bridge)>,
    busy: Arc<tokio::sync::Mutex<()>>,
}

/// The first-run host: the UI's pages, sign-in, and `POST /v1/setup`; every runtime request is
/// answered `not_initialized` so the UI shows the first-run screen.
async fn setup_handler(State(s): State<SetupState>, req: HttpRequest) -> Response {
    if !host_ok(req.headers(), s.port) {
        return refuse(
            StatusCode::FORBIDDEN,
            "host_refused",
            "Host must be the loopback address and port of this host",
        );
    }
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let headers = req.headers().clone();
    if method == Method::GET && !is_api_path(&path) {
        return match &s.ui.dir {
            Some(dir) => static_file(dir, &path).await,
            None => refuse(StatusCode::NOT_FOUND, "no_ui", "no UI build: pass --ui DIR (npm run build in ui/)"),
        };
    }
    if method != Method::POST {
        return refuse(StatusCode::NOT_FOUND, "not_found", "no such endpoint");
    }
    let body = axum::body::to_bytes(req.into_body(), 16 * 1024).await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    if path == "/v1/session" {
        return redeem_response(&s.ui, &headers, s.port, &body);
    }
    if let Some(refusal) = browser_refusal(&s.ui, &headers, s.port) {
        return refusal;
    }
    match path.as_str() {
        "/v1/rpc" => {
            let e = crate::engine::Error::NotInitialized;
            (StatusCode::BAD_REQUEST, Json(e.to_api())).into_response()
        }
        "/v1/setup" => match setup(&s, &body).await {
            Ok(v) => Json(v).into_response(),
            Err((status, e)) => (status, Json(e)).into_response(),
        },
        _ => refuse(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
    }
}

async fn setup(s: &SetupState, body: &Value) -> Result<Value, (StatusCode, ApiError)> {
    let bad = |e: crate::engine::Error| {
        let status = match e {
            crate::engine::Error::Invalid(_) | crate::engine::Error::Transport(_) => StatusCode::BAD_REQUEST,
            crate::engine::Error::AlreadyInitialized => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, e.to_api())
    };
    let _one_at_a_time = s.busy.lock().await;
    let name = body.get("name").and_then(Value::as_str).unwrap_or("").to_owned();
    let Some(relay) = body.get("relay").and_then(Value::as_str).map(str::to_owned) else {
        return Err((
            StatusCode::BAD_REQUEST,
            api_error(
                "invalid",
                "give a relay URL: the browser UI cannot host a relay (the desktop app can; or run \
                 `relay-lite --listen ADDR --data DIR --tls-self-signed` and give its URL)",
            ),
        ));
    };
    // An identity is made only for a relay that answers (the person hears what failed).
    crate::engine::check_relay(&relay, None).await.map_err(bad)?;
    let opts = InitOptions { name, relay, relay_cert_sha256: None, keystore: s.keystore };
    let rt = Runtime::init(&s.profile, opts).await.map_err(bad)?;
    let who = rt.handle_as(&Caller::Owner, Request::Whoami, false).await.map_err(bad)?;
    let ui = WebUi { dir: s.ui.dir.clone(), sessions: Sessions::default() };
    let bridge = super::serve_with(rt.clone(), Some(ui.clone()))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, api_error("bridge", e)))?;
    let url = format!("{}&welcome=1", login_url(bridge.addr.port(), &ui.sessions.mint_code()));
    s.done
        .send((rt, bridge))
        .await
        .map_err(|_| (StatusCode::INTERNAL_SERVER_ERROR, api_error("internal", "the host is stopping")))?;
    Ok(json!({"url": url, "whoami": who}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_works_once() {
        let s = Sessions::default();
        let code = s.mint_code();
        let token = s.redeem(&code).unwrap();
        assert!(s.is_session(&token));
        assert!(s.redeem(&code).is_none());
        assert!(!s.is_session("nope"));
        assert!(!s.is_session(""));
    }

    #[test]
    fn an_expired_code_is_refused() {
        let s = Sessions::default();
        let code = s.mint_code();
        if let Ok(mut i) = s.inner.lock() {
            for v in i.codes.values_mut() {
                *v = Instant::now() - Duration::from_secs(1);
            }
        }
        assert!(s.redeem(&code).is_none());
    }

    #[test]
    fn static_paths_stay_inside_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "i").unwrap();
        std::fs::create_dir(dir.path().join("assets")).unwrap();
        std::fs::write(dir.path().join("assets/a.js"), "a").unwrap();
        std::fs::write(dir.path().join(".secret"), "s").unwrap();
        let r = |p: &str| resolve_static(dir.path(), p).map(|p| p.strip_prefix(dir.path()).unwrap().to_owned());
        assert_eq!(r("/"), Some("index.html".into()));
        assert_eq!(r("/assets/a.js"), Some("assets/a.js".into()));
        assert_eq!(r("/contacts"), Some("index.html".into()));
        assert_eq!(r("/../etc/passwd"), None);
        assert_eq!(r("/assets/../../x"), None);
        assert_eq!(r("/.secret"), None);
        assert_eq!(r("/missing.js"), None);
    }

    #[test]
    fn origins_and_cookies() {
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:5000"));
        assert!(has_own_origin(&h, 5000));
        assert!(!has_own_origin(&h, 5001));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://localhost:5000"));
        assert!(!is_same_origin(&h, 5000));
        let mut g = HeaderMap::new();
        g.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(is_same_origin(&g, 5000));
        g.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(!is_same_origin(&g, 5000));
        g.insert(header::COOKIE, HeaderValue::from_static("a=b; sb_session_5000=tok; sb_session_5001=other"));
        assert_eq!(session_cookie(&g, 5000).as_deref(), Some("tok"));
        assert_eq!(session_cookie(&g, 5002), None);
    }
}
