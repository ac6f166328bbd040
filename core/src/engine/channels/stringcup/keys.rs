//! The Stringcup identities' secrets over time: token rotation before the inactivity TTL (each
//! identity: the own relay's and the ones kept on relays moved away from), and key update (seed
//! 003 B.1.2, the own relay's identity) with the old keys kept to open mail sealed to them.

use serde_json::{Value, json};
use x25519_dalek::{PublicKey, StaticSecret};

use super::{KEPT_OLD_KEYS, ROTATE_BEFORE_SECS, ScIdentity, Stringcup, public_b64, relay_key};
use crate::engine::{Error, Result, Runtime};
use crate::protocol::stringcup::crypto::{fingerprint, fingerprint_short};
use crate::util::random_array;

impl Stringcup {
    /// Rotates the own identity's token when it nears expiry (or now, with `force`), durably
    /// saving the new one before treating the rotation as done.
    pub(in crate::engine) async fn stringcup_rotate_if_due(&self, rt: &Runtime, force: bool) -> Result<Value> {
        let Some(me) = self.registered(rt).await else { return Ok(Value::Null) };
        self.rotate_if_due(rt, me, force).await
    }

    /// The same for each identity kept on a relay moved away from that still has contacts there
    /// (reading its inbox keeps the token alive; this renews it before it runs out). A relay that
    /// is down is logged and skipped.
    pub(in crate::engine) async fn stringcup_rotate_kept(&self, rt: &Runtime) {
        let kept = match self.kept_in_use(rt).await {
            Ok(k) => k,
            Err(e) => return tracing::warn!("stringcup identities: {e}"),
        };
        for me in kept {
            let relay = me.relay.clone();
            if let Err(e) = self.rotate_if_due(rt, me, false).await {
                tracing::info!("stringcup token on the relay at {relay}: {e}");
            }
        }
    }

    async fn rotate_if_due(&self, rt: &Runtime, mut me: ScIdentity, force: bool) -> Result<Value> {
        let client = self.client_for(rt, &me.relay).await?;
        let info = client.token_info(&me.token).await?;
        if !force && info.expires_in_seconds > ROTATE_BEFORE_SECS {
            return Ok(json!({"rotated": false, "expires_in_seconds": info.expires_in_seconds}));
        }
        let mut guard = self.ids.lock().await;
        let rotated = client.rotate(&me.token).await?;
        me.token = rotated.api_token;
        self.save_identity(rt, &me).await?;
        guard.insert(me.relay.clone(), me);
        Ok(json!({"rotated": true}))
    }

    /// Key update (seed 003 B.1.2): a new X25519 key for the same identity and inbox. The new key
    /// is saved (as pending) before the relay is asked to take it, and becomes current only once
    /// the relay answers; the old one is kept to open mail already sealed to it. Contacts who
    /// pinned the old key see a key change and must verify the new one (B.7) before they send.
    pub(in crate::engine) async fn stringcup_key_update(&self, rt: &Runtime) -> Result<Value> {
        self.stringcup_identity(rt).await?;
        let relay = relay_key(&rt.relay_url());
        let mut guard = self.ids.lock().await;
        let Some(mut me) = guard.get(&relay).cloned() else {
            return Err(Error::Bug("stringcup identity vanished".into()));
        };
        // A pending key from an update whose answer was lost: if the relay took it, it is ours.
        if let Some(p) = me.pending.take() {
            let (relay_key, _) = self.stringcup_lookup(&me.id).await?;
            if relay_key == PublicKey::from(&p).to_bytes() {
                me.previous.insert(0, std::mem::replace(&mut me.secret, p));
            }
        }
        let before = PublicKey::from(&me.secret).to_bytes();
        let fresh = StaticSecret::from(random_array::<32>());
        me.pending = Some(fresh.clone());
        self.save_identity(rt, &me).await?;
        guard.insert(relay.clone(), me.clone());
        let updated = self.client().update_key(&me.token, &public_b64(&fresh)).await;
        me.pending = None;
        if let Err(e) = updated {
            // The relay refused or could not be reached: the pending key stays saved until the
            // next update settles whether the relay took it.
            me.pending = Some(fresh);
            guard.insert(relay, me);
            return Err(e.into());
        }
        me.previous.insert(0, std::mem::replace(&mut me.secret, fresh));
        me.previous.truncate(KEPT_OLD_KEYS);
        self.save_identity(rt, &me).await?;
        let key = PublicKey::from(&me.secret).to_bytes();
        guard.insert(relay, me);
        drop(guard);
        Ok(json!({
            "updated": true,
            "fingerprint": fingerprint(&key),
            "fingerprint_short": fingerprint_short(&key),
            "previous_fingerprint": fingerprint(&before),
        }))
    }
}
