//! An agent's connection to its profile's runtime, for `switchboard mcp` and `switchboard listen`.
//! It finds the running runtime, or starts one in this process (bridge and background loops
//! included) when none runs; opens a session with the owner token read from the profile's 0600
//! file (never from arguments); and from then on speaks only with the agent's own token. If the
//! runtime goes away (another process owned it and exited), it connects again, becoming the
//! owner if the profile is free.

// serde_json::Value indexing returns Null for missing keys; it cannot panic.
#![allow(clippy::indexing_slicing)]

use std::time::Duration;

use serde_json::Value;
use tokio::sync::Mutex;

use super::client::Conn;
use super::{Bridge, serve};
use crate::api::{ApiError, Request};
use crate::engine::Runtime;
use crate::profile::{Profile, ProfileLock};

/// A runtime this process owns on behalf of its agent.
struct Embedded {
    rt: Runtime,
    bridge: Bridge,
    _lock: ProfileLock,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Embedded {
    async fn stop(self) {
        self.rt.shutdown();
        self.bridge.abort();
        self.rt.profile().remove_bridge_files();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }
}

struct State {
    conn: Option<Conn>,
    embedded: Option<Embedded>,
}

/// An agent session on a profile's runtime.
pub struct AgentSession {
    profile: Profile,
    agent: String,
    harness: String,
    state: Mutex<State>,
}

impl std::fmt::Debug for AgentSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AgentSession({} on {})", self.agent, self.profile.dir.display())
    }
}

fn err(code: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::new(code, message.to_string())
}

/// A handle on the current connection, usable without holding the lock.
fn current(st: &State) -> Result<Conn, ApiError> {
    match &st.conn {
        Some(Conn::Remote { port, token, http }) => {
            Ok(Conn::Remote { port: *port, token: token.clone(), http: http.clone() })
        }
        _ => Err(err("internal", "agent session without a bridge connection")),
    }
}

impl AgentSession {
    /// Opens a session for `agent` on `profile`'s runtime.
    pub async fn open(profile: Profile, agent: &str, harness: &str) -> Result<AgentSession, ApiError> {
        let s = AgentSession {
            profile,
            agent: agent.to_owned(),
            harness: harness.to_owned(),
            state: Mutex::new(State { conn: None, embedded: None }),
        };
        {
            let mut st = s.state.lock().await;
            s.connect(&mut st).await?;
        }
        Ok(s)
    }

    /// The agent's name.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    async fn connect(&self, st: &mut State) -> Result<(), ApiError> {
        st.conn = None;
        let mut found = None;
        for _ in 0..100 {
            if st.embedded.is_none()
                && let Some(lock) = self.profile.try_lock().map_err(|e| err("profile", e))?
            {
                self.profile.remove_bridge_files();
                let rt = Runtime::open(&self.profile).await.map_err(|e| e.to_api())?;
                let bridge = serve(rt.clone()).await.map_err(|e| err("bridge", e))?;
                let tasks = rt.start_background();
                st.embedded = Some(Embedded { rt, bridge, _lock: lock, tasks });
            }
            if let Some(files) = self.profile.read_bridge_files() {
                found = Some(files);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (port, owner_token) = found
            .ok_or_else(|| err("runtime_busy", "another runtime owns this profile but its bridge is not answering"))?;
        let owner = Conn::remote(port, owner_token)?;
        let opened =
            owner.call(Request::SessionOpen { agent: self.agent.clone(), harness: Some(self.harness.clone()) }).await?;
        let token = opened["token"].as_str().ok_or_else(|| err("bridge_malformed", "no session token"))?.to_owned();
        st.conn = Some(Conn::remote(port, token)?);
        Ok(())
    }

    /// Performs one request as the agent, connecting again once if the runtime went away.
    pub async fn call(&self, req: Request) -> Result<Value, ApiError> {
        let conn = {
            let mut st = self.state.lock().await;
            if st.conn.is_none() {
                self.connect(&mut st).await?;
            }
            current(&st)?
        };
        match conn.call(req.clone()).await {
            Err(e) if matches!(e.code.as_str(), "bridge_unreachable" | "unauthorized") => {
                let conn = {
                    let mut st = self.state.lock().await;
                    self.connect(&mut st).await?;
                    current(&st)?
                };
                conn.call(req).await
            }
            other => other,
        }
    }

    /// Ends the session, and the runtime if this process owns it.
    pub async fn close(&self) {
        let mut st = self.state.lock().await;
        if let Some(conn) = st.conn.take() {
            let _ = conn.call(Request::SessionClose).await;
        }
        if let Some(e) = st.embedded.take() {
            e.stop().await;
        }
    }
}
