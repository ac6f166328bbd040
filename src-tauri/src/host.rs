//! The profile's runtime as the app holds it: embedded (the app owns the profile: runtime, bridge
//! for the CLI and agents, background loops), attached (a headless daemon already owns it: every
//! request goes over its bridge), or waiting for the first-run screen to create the identity.

use std::sync::Mutex as StdMutex;
use std::time::Instant;

use serde_json::Value;
use switchboard_core::bridge::Bridge;
use switchboard_core::bridge::api::{ApiError, Request};
use switchboard_core::bridge::client::Conn;
use switchboard_core::engine::{Caller, InitOptions, Runtime};
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::{Profile, ProfileLock};
use tokio::sync::Mutex;

use crate::settings::Settings;

/// How the app reaches the runtime.
pub enum Host {
    /// This process owns the profile and runs its runtime.
    Embedded {
        /// The runtime.
        rt: Runtime,
        /// Its bridge (CLI, agents).
        bridge: Bridge,
        /// Background loops.
        tasks: Vec<tokio::task::JoinHandle<()>>,
        /// Ownership of the profile.
        _lock: ProfileLock,
    },
    /// Another runtime (a daemon) owns the profile.
    Attached(Conn),
    /// We own the profile but it has no identity yet.
    Uninitialized(ProfileLock),
    /// Shut down.
    Stopped,
}

/// Everything the commands share.
pub struct AppState {
    /// The profile.
    pub profile: Profile,
    /// The runtime.
    pub host: Mutex<Host>,
    /// Desktop settings.
    pub settings: StdMutex<Settings>,
    /// Incoming messages not yet seen in the window.
    pub unread: StdMutex<u32>,
    /// When the process started (for the first-paint figure).
    pub started: Instant,
    /// Whether first paint was reported.
    pub painted: StdMutex<bool>,
    /// Keystore for a profile created from the first-run screen.
    pub keystore: KeystorePreference,
}

fn api(code: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError { code: code.into(), message: message.to_string() }
}

impl AppState {
    /// Takes the profile if nobody owns it (starting its runtime when it has an identity), or
    /// attaches to the runtime that does.
    pub async fn start(profile: Profile, keystore: KeystorePreference, started: Instant) -> Result<Self, ApiError> {
        profile.ensure_dir().map_err(|e| api("profile", e))?;
        let settings = Settings::load(&profile.dir);
        let host = Self::take(&profile).await?;
        Ok(Self {
            profile,
            host: Mutex::new(host),
            settings: StdMutex::new(settings),
            unread: StdMutex::new(0),
            started,
            painted: StdMutex::new(false),
            keystore,
        })
    }

    async fn take(profile: &Profile) -> Result<Host, ApiError> {
        for _ in 0..50 {
            if let Some(lock) = profile.try_lock().map_err(|e| api("profile", e))? {
                // We own the profile: bridge files of a killed runtime are stale.
                profile.remove_bridge_files();
                if !profile.is_initialized() {
                    return Ok(Host::Uninitialized(lock));
                }
                let rt = Runtime::open(profile).await.map_err(|e| e.to_api())?;
                return Self::embed(rt, lock).await;
            }
            if let Some((port, token)) = profile.read_bridge_files() {
                return Ok(Host::Attached(Conn::remote(port, token)?));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(api("runtime_busy", "another runtime owns this profile but its bridge is not answering"))
    }

    async fn embed(rt: Runtime, lock: ProfileLock) -> Result<Host, ApiError> {
        let bridge = switchboard_core::bridge::serve(rt.clone()).await.map_err(|e| api("bridge", e))?;
        let tasks = rt.start_background();
        Ok(Host::Embedded { rt, bridge, tasks, _lock: lock })
    }

    /// The embedded runtime, if this process owns the profile (for events).
    pub async fn runtime(&self) -> Option<Runtime> {
        match &*self.host.lock().await {
            Host::Embedded { rt, .. } => Some(rt.clone()),
            _ => None,
        }
    }

    /// Whether the app runs on another process's runtime.
    pub async fn attached(&self) -> bool {
        matches!(&*self.host.lock().await, Host::Attached(_))
    }

    /// Whether the profile has an identity.
    pub async fn initialized(&self) -> bool {
        !matches!(&*self.host.lock().await, Host::Uninitialized(_))
    }

    /// One request, as the owner.
    pub async fn request(&self, req: Request) -> Result<Value, ApiError> {
        let host = self.host.lock().await;
        match &*host {
            Host::Embedded { rt, .. } => {
                let rt = rt.clone();
                drop(host);
                rt.handle_as(&Caller::Owner, req, false).await.map_err(|e| e.to_api())
            }
            Host::Attached(conn) => conn.call(req).await,
            Host::Uninitialized(_) => Err(switchboard_core::engine::Error::NotInitialized.to_api()),
            Host::Stopped => Err(api("stopped", "the app is shutting down")),
        }
    }

    /// Creates the identity (first run) and starts the runtime. Returns `whoami`.
    pub async fn init(&self, name: String, relay: Option<String>) -> Result<Value, ApiError> {
        let relay = relay.ok_or_else(|| {
            api(
                "unsupported",
                "hosting a relay from the app is not built yet: start `relay-lite --listen ADDR` and give its URL",
            )
        })?;
        let mut host = self.host.lock().await;
        let Host::Uninitialized(_) = &*host else {
            return Err(switchboard_core::engine::Error::AlreadyInitialized.to_api());
        };
        let Host::Uninitialized(lock) = std::mem::replace(&mut *host, Host::Stopped) else {
            return Err(api("internal", "host state changed"));
        };
        let opts = InitOptions { name, relay, relay_cert_sha256: None, keystore: self.keystore };
        let rt = match Runtime::init(&self.profile, opts).await {
            Ok(rt) => rt,
            Err(e) => {
                *host = Host::Uninitialized(lock);
                return Err(e.to_api());
            }
        };
        *host = Self::embed(rt.clone(), lock).await?;
        drop(host);
        rt.handle_as(&Caller::Owner, Request::Whoami, false).await.map_err(|e| e.to_api())
    }

    /// Stops the embedded runtime (if any) and releases the profile.
    pub async fn shutdown(&self) {
        let old = std::mem::replace(&mut *self.host.lock().await, Host::Stopped);
        if let Host::Embedded { rt, bridge, tasks, _lock } = old {
            rt.shutdown();
            bridge.abort();
            self.profile.remove_bridge_files();
            for t in tasks {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
            }
        }
    }
}
