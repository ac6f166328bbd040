//! A scripted model server for tests that run a real agent harness (Codex, Claude Code) against
//! Switchboard: the harness's model API is served on loopback, every request is recorded, and
//! answers come from a script the test fills. Each test supplies the route handlers that speak
//! its API's wire format; this module holds what they share: the request log, the script, the
//! server, the locate-the-binary rule and the event-stream response.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::Value;
use tokio::sync::mpsc::Sender;

/// The state shared by a model's route handlers: requests seen and answers still to give.
pub struct ModelLog<R> {
    requests: Mutex<Vec<Value>>,
    script: Mutex<VecDeque<R>>,
}

impl<R> Default for ModelLog<R> {
    fn default() -> Self {
        Self { requests: Mutex::new(Vec::new()), script: Mutex::new(VecDeque::new()) }
    }
}

impl<R> ModelLog<R> {
    /// Records a request; returns how many have been seen (1 for the first).
    pub fn record(&self, body: &Value) -> usize {
        let mut r = self.requests.lock().unwrap();
        r.push(body.clone());
        r.len()
    }

    /// The next scripted answer, if any.
    pub fn next(&self) -> Option<R> {
        self.script.lock().unwrap().pop_front()
    }
}

/// A model server on a loopback port.
pub struct ModelServer<R> {
    /// Its port.
    pub port: u16,
    state: Arc<ModelLog<R>>,
}

impl<R: Send + 'static> ModelServer<R> {
    /// Serves `routes` (handlers taking `State<Arc<ModelLog<R>>>`) on a fresh loopback port.
    pub async fn start(routes: axum::Router<Arc<ModelLog<R>>>) -> Self {
        let state = Arc::new(ModelLog::default());
        let app = routes.with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { port, state }
    }

    /// Queues an answer.
    pub fn script(&self, r: R) {
        self.state.script.lock().unwrap().push_back(r);
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits until the model has seen `n` requests; returns them.
    pub async fn wait_requests(&self, n: usize, secs: u64) -> Vec<Value> {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.requests();
            if r.len() >= n {
                return r;
            }
            assert!(Instant::now() < end, "the model saw {} request(s), expected {n}", r.len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One server-sent event named after the event's `type`.
pub fn sse(event: &Value) -> Bytes {
    Bytes::from(format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap()))
}

/// A `text/event-stream` response whose events `produce` sends (it runs as its own task, so it
/// may wait before sending, e.g. to hold a turn open).
pub fn event_stream<F, Fut>(produce: F) -> Response
where
    F: FnOnce(Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(produce(tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    Response::builder().header("content-type", "text/event-stream").body(Body::from_stream(stream)).unwrap()
}

/// An external harness binary: `$env_var` if set, else `default`; `None` (the test may skip)
/// when neither is a file, unless `$require_var` is set, which makes a missing binary a failure
/// (scripts/test.sh sets it, so CI never skips silently).
pub fn external_bin(what: &str, env_var: &str, default: PathBuf, require_var: &str) -> Option<PathBuf> {
    let found =
        [std::env::var(env_var).ok().map(PathBuf::from), Some(default)].into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os(require_var).is_none(),
            "{what} is missing and {require_var} is set: run scripts/install-deps.sh (or point {env_var} at it)"
        );
        eprintln!("skipping: no {what} (run scripts/install-deps.sh)");
    }
    found
}
