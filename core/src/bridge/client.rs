//! Talking to a profile's runtime: over the bridge when one is running, or by running one
//! in-process for a single command when none is.

use std::time::Duration;

use serde_json::Value;

use crate::api::{ApiError, Request};
use crate::engine::Runtime;
use crate::profile::{Profile, ProfileLock};

/// A connection to the profile's runtime.
pub enum Conn {
    /// A running runtime's bridge.
    Remote {
        /// Port.
        port: u16,
        /// Token.
        token: String,
        /// HTTP client.
        http: reqwest::Client,
    },
    /// An in-process runtime, owned for this command.
    Local {
        /// The runtime.
        rt: Runtime,
        /// The lock that makes it the owner.
        _lock: ProfileLock,
    },
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Remote { port, .. } => write!(f, "Conn::Remote({port})"),
            Conn::Local { rt, .. } => write!(f, "Conn::Local({rt:?})"),
        }
    }
}

fn api_error(code: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::new(code, message.to_string())
}

impl Conn {
    /// Connects to the runtime that owns `profile`, or starts one in-process.
    pub async fn open(profile: &Profile) -> Result<Conn, ApiError> {
        for _ in 0..50 {
            if let Some(lock) = profile.try_lock().map_err(|e| api_error("profile", e))? {
                // We own the profile now, so bridge files left by a runtime that was killed are stale.
                profile.remove_bridge_files();
                let rt = Runtime::open(profile).await.map_err(|e| e.to_api())?;
                return Ok(Conn::Local { rt, _lock: lock });
            }
            // Another runtime owns the profile; it writes its bridge files once it listens.
            if let Some((port, token)) = profile.read_bridge_files() {
                return Conn::remote(port, token);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(api_error("runtime_busy", "another runtime owns this profile but its bridge is not answering"))
    }

    /// A connection to the bridge on `port` with `token` (the owner's, or an agent session's).
    pub fn remote(port: u16, token: String) -> Result<Conn, ApiError> {
        let tls = crate::transport::tls::client_config(None).map_err(|e| api_error("internal", e))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .build()
            .map_err(|e| api_error("internal", e))?;
        Ok(Conn::Remote { port, token, http })
    }

    /// Whether this is an in-process runtime.
    pub fn is_local(&self) -> bool {
        matches!(self, Conn::Local { .. })
    }

    /// Performs one request.
    pub async fn call(&self, req: Request) -> Result<Value, ApiError> {
        match self {
            Conn::Local { rt, .. } => rt.handle(req, true).await.map_err(|e| e.to_api()),
            Conn::Remote { port, token, http } => {
                let wait = match &req {
                    Request::Inbox { wait_secs, .. } => *wait_secs,
                    Request::PairWait { timeout_secs, .. } | Request::Wait { timeout_secs, .. } => *timeout_secs,
                    _ => 0,
                };
                let resp = http
                    .post(format!("http://127.0.0.1:{port}/v1/rpc"))
                    .bearer_auth(token)
                    .timeout(Duration::from_secs(60 + wait))
                    .json(&req)
                    .send()
                    .await
                    .map_err(|e| api_error("bridge_unreachable", e))?;
                let ok = resp.status().is_success();
                let body: Value = resp.json().await.map_err(|e| api_error("bridge_malformed", e))?;
                if ok {
                    Ok(body)
                } else {
                    Err(serde_json::from_value(body).unwrap_or_else(|e| api_error("bridge_malformed", e)))
                }
            }
        }
    }
}
