//! The profile's runtime as the app holds it: embedded (the app owns the profile: runtime, bridge
//! for the CLI and agents, background loops), attached (a headless daemon already owns it: every
//! request goes over its bridge), or waiting for the first-run screen to create the identity.
//! It also holds the relay the app hosts (`hosted`), started before the runtime so the runtime
//! finds its relay up.

use std::sync::Mutex as StdMutex;
use std::time::Instant;

use serde_json::Value;
use switchboard_core::api::{ApiError, Request};
use switchboard_core::bridge::Bridge;
use switchboard_core::bridge::client::Conn;
use switchboard_core::engine::{Caller, InitOptions, Runtime};
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::{Profile, ProfileLock};
use tokio::sync::Mutex;

use crate::error::CommandError;
use crate::hosted::{DEFAULT_PORT, HostedRelay};
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
    /// The unread total the window shows (`app_unread`): the tray badge.
    pub unread: StdMutex<u32>,
    /// When the process started (for the first-paint figure).
    pub started: Instant,
    /// Whether first paint was reported.
    pub painted: StdMutex<bool>,
    /// Keystore for a profile created from the first-run screen.
    pub keystore: KeystorePreference,
    /// The relay this app hosts, when the profile uses one (`settings.hosted_relay`).
    pub hosted: Mutex<Option<HostedRelay>>,
    /// Why the hosted relay is not running, if it should be.
    pub hosted_error: StdMutex<Option<String>>,
    /// The port a relay hosted from the first-run screen tries first (tests use 0).
    pub hosted_port: u16,
    /// Conversations with a live notification (and notification ids to conversations).
    pub notifications: crate::notify::Live,
    /// Group messages already counted and notified (one per message, not per local session).
    pub group_seen: crate::notify::SeenGroupMessages,
}

fn api(code: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::new(code, message.to_string())
}

impl AppState {
    /// Takes the profile if nobody owns it (starting its runtime when it has an identity), or
    /// attaches to the runtime that does.
    pub async fn start(profile: Profile, keystore: KeystorePreference, started: Instant) -> Result<Self, ApiError> {
        profile.ensure_dir().map_err(|e| api("profile", e))?;
        let settings = Settings::load(&profile.dir);
        // The hosted relay first: the runtime connects to it as soon as it starts.
        let (hosted, hosted_error) = match &settings.hosted_relay {
            None => (None, None),
            Some(cfg) => match HostedRelay::start(&profile.dir, cfg.port, Some(&cfg.url)).await {
                Ok(r) if r.cert_sha256 != cfg.cert_sha256 => {
                    let e = format!(
                        "the hosted relay's certificate changed (was {}, now {}): peers and this profile pin the old one",
                        cfg.cert_sha256, r.cert_sha256
                    );
                    tracing::warn!("{e}");
                    (Some(r), Some(e))
                }
                Ok(r) => (Some(r), None),
                Err(e) => {
                    tracing::warn!("{e}");
                    (None, Some(e.to_string()))
                }
            },
        };
        let host = Self::take(&profile).await?;
        let state = Self {
            profile,
            host: Mutex::new(host),
            settings: StdMutex::new(settings),
            unread: StdMutex::new(0),
            started,
            painted: StdMutex::new(false),
            keystore,
            hosted: Mutex::new(hosted),
            hosted_error: StdMutex::new(hosted_error),
            hosted_port: DEFAULT_PORT,
            notifications: crate::notify::Live::default(),
            group_seen: crate::notify::SeenGroupMessages::default(),
        };
        state.sync_dnd_from_runtime().await;
        Ok(state)
    }

    /// Start-up: the runtime's do-not-disturb (shared with the CLI and agents) is the truth; the
    /// app's switch follows it. A runtime without the operation leaves the switch as it was.
    async fn sync_dnd_from_runtime(&self) {
        if !self.initialized().await {
            return;
        }
        match self.request(dnd_request(None)).await {
            Ok(v) => {
                if let Some(on) = v.get("dnd").and_then(Value::as_bool) {
                    self.remember_dnd(on);
                }
            }
            Err(e) => tracing::warn!("do-not-disturb not read from the runtime: {} ({})", e.message, e.code),
        }
    }

    /// Records do-not-disturb in the app settings (saved); returns the settings when it changed.
    pub fn remember_dnd(&self, on: bool) -> Option<Settings> {
        let mut s = self.settings.lock().ok()?;
        if s.do_not_disturb == on {
            return None;
        }
        s.do_not_disturb = on;
        if let Err(e) = s.save(&self.profile.dir) {
            tracing::warn!("settings not saved: {e}");
        }
        Some(s.clone())
    }

    /// Switches do-not-disturb in the runtime (pausing agent wakes) and in the app (pausing
    /// notifications); the runtime first, so the switch never shows a state it does not have.
    /// Before first run there is no runtime: the setting is handed to it at `init`.
    pub async fn set_dnd(&self, on: bool) -> Result<Settings, CommandError> {
        if self.initialized().await {
            self.request(dnd_request(Some(on))).await?;
        }
        self.remember_dnd(on);
        self.settings.lock().map(|s| s.clone()).map_err(|_| CommandError::new("internal", "settings lock"))
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

    /// Whether the app is shutting down (background followers stop).
    pub async fn stopped(&self) -> bool {
        matches!(&*self.host.lock().await, Host::Stopped)
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

    /// Creates the identity (first run) and starts the runtime. Returns `whoami`. Without a
    /// relay URL the app hosts one (see `hosted`) and the profile uses it, pinning its
    /// certificate.
    pub async fn init(&self, name: String, relay: Option<String>) -> Result<Value, ApiError> {
        let mut host = self.host.lock().await;
        let Host::Uninitialized(_) = &*host else {
            return Err(switchboard_core::engine::Error::AlreadyInitialized.to_api());
        };
        let mut hosted = self.hosted.lock().await;
        let (relay, pin) = match relay {
            // An identity is made only for a relay that answers (the person hears what failed).
            Some(url) => {
                switchboard_core::engine::check_relay(&url, None).await.map_err(|e| e.to_api())?;
                (url, None)
            }
            None => {
                if hosted.is_none() {
                    let r = HostedRelay::start_first(&self.profile.dir, self.hosted_port)
                        .await
                        .map_err(|e| api("relay_host", e))?;
                    *hosted = Some(r);
                }
                let r = hosted.as_ref().ok_or_else(|| api("internal", "hosted relay vanished"))?;
                (r.lan_url(), Some(r.cert_sha256.clone()))
            }
        };
        let Host::Uninitialized(lock) = std::mem::replace(&mut *host, Host::Stopped) else {
            return Err(api("internal", "host state changed"));
        };
        let opts = InitOptions { name, relay: relay.clone(), relay_cert_sha256: pin.clone(), keystore: self.keystore };
        let rt = match Runtime::init(&self.profile, opts).await {
            Ok(rt) => rt,
            Err(e) => {
                *host = Host::Uninitialized(lock);
                return Err(e.to_api());
            }
        };
        // Remember the hosted relay only once a profile uses it; a relay URL given instead
        // means no relay is hosted.
        let remembered = if pin.is_some() { hosted.as_ref().map(|r| r.config(relay)) } else { None };
        let unused = if remembered.is_none() { hosted.take() } else { None };
        drop(hosted);
        if let Some(r) = unused {
            r.stop().await;
        }
        let dnd = match self.settings.lock() {
            Ok(mut s) => {
                s.hosted_relay = remembered;
                if let Err(e) = s.save(&self.profile.dir) {
                    tracing::warn!("settings not saved: {e}");
                }
                s.do_not_disturb
            }
            Err(_) => false,
        };
        *host = Self::embed(rt.clone(), lock).await?;
        drop(host);
        // A do-not-disturb switched on before the identity existed applies to the new runtime.
        if dnd && let Err(e) = rt.handle_as(&Caller::Owner, dnd_request(Some(true)), false).await {
            tracing::warn!("do-not-disturb not handed to the runtime: {e}");
        }
        rt.handle_as(&Caller::Owner, Request::Whoami, false).await.map_err(|e| e.to_api())
    }

    /// After the profile moved to the relay at `url`: a relay this app hosted for it is no longer
    /// the profile's, so it stops and is not started again, unless `still_used` (contacts or
    /// groups reached the profile through it: groups keep their log there, Stringcup contacts
    /// live there for good, and the runtime still reads it, so it keeps running).
    pub async fn relay_moved(&self, url: &str, still_used: bool) {
        if still_used {
            tracing::info!("moved to {url}; the relay this app hosts keeps running for the contacts and groups on it");
            return;
        }
        let was_hosted = match self.settings.lock() {
            Ok(mut s) => {
                let hosted =
                    s.hosted_relay.as_ref().is_some_and(|h| h.url.trim_end_matches('/') != url.trim_end_matches('/'));
                if hosted {
                    s.hosted_relay = None;
                    if let Err(e) = s.save(&self.profile.dir) {
                        tracing::warn!("settings not saved: {e}");
                    }
                }
                hosted
            }
            Err(_) => false,
        };
        if was_hosted {
            if let Ok(mut e) = self.hosted_error.lock() {
                *e = None;
            }
            if let Some(r) = self.hosted.lock().await.take() {
                r.stop().await;
            }
        }
    }

    /// The hosted relay as settings show it: URL, pinned certificate, port, data directory and
    /// whether it accepts connections; `null` when the profile uses another relay.
    pub async fn hosted_status(&self) -> Value {
        let cfg = self.settings.lock().ok().and_then(|s| s.hosted_relay.clone());
        let Some(cfg) = cfg else { return Value::Null };
        let hosted = self.hosted.lock().await;
        let accepting = hosted.as_ref().is_some_and(HostedRelay::accepting);
        let mut error = self.hosted_error.lock().ok().and_then(|e| e.clone());
        // The URL is fixed at first run; say so when this machine's address moved away from it.
        let current = hosted.as_ref().map(HostedRelay::lan_url);
        if error.is_none()
            && let Some(now) = current.filter(|now| *now != cfg.url)
        {
            error = Some(format!(
                "this machine's network address changed: the relay is now reachable at {now}, but this \
                 profile and its peers use {}",
                cfg.url
            ));
        }
        serde_json::json!({
            "url": cfg.url,
            "cert_sha256": cfg.cert_sha256,
            "port": cfg.port,
            "data_dir": crate::hosted::data_dir(&self.profile.dir).display().to_string(),
            "running": hosted.is_some(),
            "accepting": accepting,
            "error": error,
        })
    }

    /// Stops the embedded runtime (if any) and releases the profile, then the hosted relay.
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
        if let Some(r) = self.hosted.lock().await.take() {
            r.stop().await;
        }
    }
}

/// The runtime's do-not-disturb operation (`{"op":"dnd"}`), set or read.
fn dnd_request(on: Option<bool>) -> Request {
    Request::Dnd { on }
}
