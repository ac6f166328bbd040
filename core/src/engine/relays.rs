//! The profile's own relay, which the owner may move ([`Runtime::relay_move`]), and relays other
//! than its own, trusted by certificate pin (issue 17: groups on a LAN without internet).
//!
//! - A connection to a relay URL that is not the profile's own (a group's, a contact's letagents
//!   relay) uses the pin stored for that URL
//!   (`trusted_relays`), else the web PKI. Either way its verifier remembers a refused
//!   certificate, so a failure becomes [`Error::UntrustedRelay`] naming the URL and the SHA-256
//!   the relay presented: the UI asks "trust it?", the CLI prints `switchboard relay trust`.
//! - Pins come from three places only: a pinned contact's signed LAN announcement of its own
//!   relay (verified by the LAN node against the keys that contact proved; stored with the
//!   contact, and gone with it), an accepted contact's signed move notice naming its new relay
//!   (the same rules, `channels::letagents`), or the owner (`relay trust URL SHA256`, after
//!   comparing the fingerprint; a move carries the old relay's own pin here as the owner's).
//!   A contact may replace only its own vouch (a new certificate for its relay); the owner's
//!   acceptance replaces anything.
//!   The profile's own relay is never re-pinned this way: its pin is set at `init`.
//! - A profile whose own relay is pinned (the relay the desktop app hosts) announces it to bound
//!   contacts: [`Runtime::lan_relay_announcement`].
//! - A move ([`Runtime::relay_move`], `docs/relay-move.md`) tells letagents and Agent Mail
//!   contacts, leaves groups where their log lives and Stringcup contacts on the relay that
//!   assigned their ids (reached through the identity it assigned us, which is kept), and reads
//!   the old relay for 48 h ([`Runtime::drain_old_relays`], `old_relays`).

use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Error, Protocol, Result, Runtime, parse_pin};
use crate::protocol::lan::RelayAnnouncement;
use crate::protocol::letagents::STALE_AFTER_MS;
use crate::store::{RelayVouch, TrustedRelayRow};
use crate::transport::TransportError;
use crate::transport::lan::AnnouncedRelays;
use crate::transport::letagents::{RelayClient, parse_relay_url};
use crate::transport::tls::{RefusedCert, client_config_witnessed};
use crate::util::{hex, now_ms};

/// How often a relay moved away from is read while it drains.
const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// What a relay move would do ([`Runtime::relay_move_plan`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MovePlan {
    /// The current relay.
    pub from: String,
    /// letagents contacts, each told the new relay.
    pub letagents: i64,
    /// Agent Mail contacts, who find the new card on either relay.
    pub agent_mail: i64,
    /// The people those letagents and Agent Mail contacts are (a person added by contact link
    /// has a channel of each): what the summary counts.
    pub told: i64,
    /// Stringcup contacts, who stay on the current relay (a Stringcup id belongs to the relay
    /// that assigned it), reached through the identity it assigned us.
    pub stringcup: i64,
    /// Active groups whose log stays on the current relay.
    pub groups: i64,
    /// How long the current relay is still read after the move.
    pub drain_hours: i64,
}

fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl MovePlan {
    /// What the move will do, in one sentence.
    pub fn summary(&self) -> String {
        format!(
            "{} will be told; {} on the old relay{}; the old relay is read for {} h",
            plural(self.told, "contact", "contacts"),
            plural(self.groups, "group stays", "groups stay"),
            self.stringcup_stay(),
            self.drain_hours
        )
    }

    fn summary_done(&self, letagents_told: usize) -> String {
        let letagents_told = i64::try_from(letagents_told).unwrap_or(i64::MAX);
        // As planned: the people; else (a contact changed meanwhile) the channels told.
        let told =
            if letagents_told == self.letagents { self.told } else { letagents_told.saturating_add(self.agent_mail) };
        format!(
            "{} told; {} on the old relay{}; the old relay is read for {} h",
            plural(told, "contact", "contacts"),
            plural(self.groups, "group stays", "groups stay"),
            self.stringcup_stay(),
            self.drain_hours
        )
    }

    /// The Stringcup part of the summary: nothing when there are none.
    fn stringcup_stay(&self) -> String {
        if self.stringcup == 0 {
            return String::new();
        }
        let n = self.stringcup;
        let who = if n == 1 { "does 1 Stringcup contact".to_owned() } else { format!("do {n} Stringcup contacts") };
        format!(", and so {who} (a Stringcup id belongs to the relay that assigned it)")
    }
}

/// A relay URL in the form pins are stored under: parsed, no trailing slash.
pub(super) fn canonical_relay_url(url: &str) -> Result<String> {
    Ok(parse_relay_url(url)?.as_str().trim_end_matches('/').to_owned())
}

/// A client for a relay that is not the profile's own, and what its verifier refused.
pub(super) struct ForeignRelay {
    /// The client (pinned when a pin is stored for the URL, else the web PKI).
    pub client: RelayClient,
    /// The relay's URL, canonical.
    pub url: String,
    refused: RefusedCert,
}

impl ForeignRelay {
    /// A transport failure as the caller should see it: a refused certificate becomes
    /// [`Error::UntrustedRelay`].
    pub fn error(&self, e: TransportError) -> Error {
        match (&e, self.refused.get()) {
            (TransportError::Unreachable(_), Some(cert)) => {
                Error::UntrustedRelay { url: self.url.clone(), cert_sha256: hex(&cert) }
            }
            _ => e.into(),
        }
    }
}

/// What to do with a contact's verified announcement, given the pin already stored for its URL.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Take {
    /// Store it (new, or the same contact's newer word).
    Store,
    /// Already stored as it is, or vouched for by someone else with the same certificate.
    Known,
    /// Someone else (the owner, or another contact) vouched for another certificate at this URL:
    /// a contact's word does not replace theirs, or one contact could re-pin the relay another
    /// one hosts.
    Conflict,
}

pub(super) fn take_announcement(
    known: Option<&TrustedRelayRow>,
    contact: i64,
    vouch: &RelayVouch,
    cert: &[u8; 32],
) -> Take {
    match known {
        None => Take::Store,
        Some(k) if k.cert_sha256 == *cert && k.vouch == *vouch => Take::Known,
        Some(k) if matches!(k.vouch, RelayVouch::Contact { id, .. } if id == contact) => Take::Store,
        Some(k) if k.cert_sha256 == *cert => Take::Known,
        Some(_) => Take::Conflict,
    }
}

fn view(r: &TrustedRelayRow) -> Value {
    let (source, contact, expires_at) = match &r.vouch {
        RelayVouch::Contact { expires_at, .. } => ("contact", r.contact_name.clone(), Some(*expires_at)),
        RelayVouch::User => ("you", None, None),
    };
    json!({
        "url": r.url,
        "cert_sha256": hex(&r.cert_sha256),
        "source": source,
        "contact": contact,
        "announcement_expires_at": expires_at,
        "updated_at": r.updated_at,
    })
}

impl Runtime {
    /// What a move would do now ([`Runtime::relay_move`] does exactly this): whom it tells, what
    /// stays on the current relay, and how long that relay is still read. The UI and the CLI show
    /// it before the move.
    pub(super) async fn relay_move_plan(&self) -> Result<MovePlan> {
        let from = self.relay_url().trim_end_matches('/').to_owned();
        let deps = self.store().own_relay_dependents(&from).await?;
        Ok(MovePlan {
            from,
            letagents: deps.letagents,
            agent_mail: deps.agent_mail,
            told: deps.people_told,
            stringcup: deps.stringcup,
            groups: deps.groups,
            drain_hours: STALE_AFTER_MS / 3_600_000,
        })
    }

    /// Moves the profile to the relay at `url` (pinned by `cert_sha256`, else the web PKI), once
    /// that relay answers, telling the peers who reach us through the current one
    /// (`docs/relay-move.md`):
    /// - letagents contacts stay where they live (a contact "on our own relay" is pinned to the
    ///   old one) and are each sent a signed `hello` carrying `moved_to`;
    /// - Agent Mail: a card with the next nonce routing to the new relay first (the old one kept
    ///   as a second route while it is read), published on both, so a contact's next card fetch
    ///   from the route it knows finds it;
    /// - letmeknow groups stay on the relay their log lives on (the old relay's pin becomes the
    ///   owner's vouch in `trusted_relays`, so connections to it still verify);
    /// - Stringcup contacts stay too (a Stringcup id belongs to the relay that assigned it): they
    ///   are pinned to the old relay, and sent to and read through the identity it assigned us,
    ///   which is kept (`stringcup_identities`) and read for as long as they are there; new
    ///   Stringcup contacts use an identity on the new relay (the one held from an earlier stay
    ///   there, else a new registration);
    /// - the old relay is read for 48 h (letagents' retention): what was sent there before peers
    ///   learned the move still arrives.
    ///
    /// The new relay is durable first (one transaction), then swapped in; each protocol makes its
    /// first contact there and the receive loops start again there. Answers `whoami` with `move`.
    pub(super) async fn relay_move(&self, url: &str, cert_sha256: Option<&str>) -> Result<Value> {
        let _one_at_a_time = self.inner.moving.lock().await;
        let url = canonical_relay_url(url).map_err(|e| Error::Invalid(e.to_string()))?;
        let pin = parse_pin(cert_sha256)?;
        let pin_hex = pin.map(|p| hex(&p)).unwrap_or_default();
        let old = self.relay_url().trim_end_matches('/').to_owned();
        // Contacts and identities left on the old relay are keyed by its canonical URL.
        let old = canonical_relay_url(&old).unwrap_or(old);
        let old_pin_hex = self.store().meta("relay_cert_sha256").await?.unwrap_or_default();
        if url == old && pin_hex == old_pin_hex {
            return Err(Error::Invalid(format!("this profile already uses the relay at {url}")));
        }
        let plan = self.relay_move_plan().await?;
        super::check_relay(&url, cert_sha256).await?;
        let client = RelayClient::new(&url, pin)?;
        let now = now_ms();
        let drain_until = now + STALE_AFTER_MS;
        let old_pin = parse_pin(Some(&old_pin_hex))?;
        if url != old {
            self.store().move_own_relay(&old, old_pin, &url, &pin_hex, now, drain_until).await?;
        } else {
            // The same relay with another certificate: nothing to tell or drain.
            self.store().move_own_relay(&old, None, &url, &pin_hex, now, now).await?;
        }
        // Everything bound to the relay switches before anything talks to the new one.
        *self.inner.own.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            super::OwnRelay { url: url.clone(), client: client.clone() };
        self.inner.stringcup.stringcup_switch_relay(&client);
        self.inner.agent_mail.agent_mail_switch_relay(self).await?;
        self.set_health("unknown", "");
        tracing::info!("moved from the relay at {old} to {url}");
        // Queued in one transaction before any network I/O: the outbox sends each to the relay
        // where that contact lives (the old one, for those who lived with us).
        let told = if url != old { self.inner.letagents.notify_moved(self, &url, &pin_hex).await? } else { 0 };
        // Each protocol's first contact with the new relay, then the receive loops start again
        // there (after letagents' login here: two logins at once could reach the relay out of
        // order, and it refuses the older one as a replay).
        // The loops move whatever these say: the new relay is already the profile's.
        let old_client = if url != old { self.foreign_relay(&old).await.ok().map(|f| f.client) } else { None };
        let first_contact = async {
            self.channel(Protocol::Letagents).init(self).await?;
            self.inner.stringcup.stringcup_register_moved(self).await;
            self.inner.agent_mail.agent_mail_publish_moved(self, old_client.as_ref()).await
        }
        .await;
        self.inner.relay_generation.send_modify(|g| *g = g.wrapping_add(1));
        self.inner.outbox_wake.notify_one();
        first_contact?;
        let mut who = self.whoami().await?;
        if let Some(o) = who.as_object_mut() {
            let summary = plan.summary_done(told);
            o.insert(
                "move".into(),
                json!({
                    "from": old,
                    "to": url,
                    "letagents_told": told,
                    "agent_mail_contacts": plan.agent_mail,
                    "groups_on_old_relay": plan.groups,
                    "stringcup_on_old_relay": if url != old { plan.stringcup } else { 0 },
                    "drain_until": if url != old { drain_until } else { now },
                    "summary": summary,
                }),
            );
        }
        Ok(who)
    }

    /// Reads each relay moved away from that is still draining: letagents inbox and Agent Mail
    /// mailbox. Errors are logged per relay (one that is down must not stop the others).
    pub(super) async fn drain_old_relays(&self) -> usize {
        let old = match self.store().draining_relays(now_ms()).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("old relays: {e}");
                return 0;
            }
        };
        let mut n = 0;
        for (url, _until) in old {
            if self.is_own_relay(&url) {
                continue;
            }
            match self.inner.letagents.drain_old(self, &url).await {
                Ok(k) => n += k,
                Err(e) => tracing::info!("old relay {url}: letagents: {e}"),
            }
            let client = match self.foreign_relay(&url).await {
                Ok(f) => f.client,
                Err(e) => {
                    tracing::info!("old relay {url}: {e}");
                    continue;
                }
            };
            match self.inner.agent_mail.agent_mail_drain_old(self, &url, &client).await {
                Ok(k) => n += k,
                Err(e) => tracing::info!("old relay {url}: Agent Mail: {e}"),
            }
        }
        n
    }

    /// Drains the old relays every [`DRAIN_EVERY`] (and right after a move) until their grace
    /// period ends.
    pub(super) async fn old_relays_loop(self) {
        let mut stop = self.inner.shutdown.subscribe();
        let mut moved = self.inner.relay_generation.subscribe();
        loop {
            if self.drain_old_relays().await > 0 {
                self.inner.outbox_wake.notify_one();
            }
            tokio::select! {
                _ = tokio::time::sleep(DRAIN_EVERY) => {}
                r = moved.changed() => if r.is_err() { return },
                _ = stop.changed() => return,
            }
        }
    }

    fn is_own_relay(&self, canonical: &str) -> bool {
        canonical == self.relay_url().trim_end_matches('/')
    }

    /// The pin stored for the relay at `url` (not the profile's own), if any.
    pub(super) async fn trusted_relay_pin(&self, url: &str) -> Result<Option<[u8; 32]>> {
        Ok(self.store().trusted_relay(&canonical_relay_url(url)?).await?.map(|r| r.cert_sha256))
    }

    /// A client for `url`, which is not the profile's own relay.
    pub(super) async fn foreign_relay(&self, url: &str) -> Result<ForeignRelay> {
        let pin = self.trusted_relay_pin(url).await?;
        let url = canonical_relay_url(url)?;
        let (tls, refused) = client_config_witnessed(pin).map_err(|e| TransportError::Config(e.to_string()))?;
        Ok(ForeignRelay { client: RelayClient::with_tls(&url, tls)?, url, refused })
    }

    /// The profile's own relay, signed for the LAN, when it is pinned by certificate (a
    /// self-signed relay such as the one the desktop app hosts) and on a LAN address; none
    /// otherwise (a relay in the web PKI needs no announcement).
    pub(super) async fn lan_relay_announcement(&self, expires_at_ms: i64) -> Option<RelayAnnouncement> {
        let pin = self.store().meta("relay_cert_sha256").await.ok().flatten()?;
        let pin = parse_pin(Some(&pin)).ok().flatten()?;
        match RelayAnnouncement::sign(&self.inner.id.sig, &self.relay_url(), pin, expires_at_ms) {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::info!("lan: our relay is not announced: {e}");
                None
            }
        }
    }

    /// Stores every relay a bound contact announced (the node verified each against that
    /// contact's keys), until the node stops.
    pub(super) async fn lan_relays_loop(self, mut announced: watch::Receiver<AnnouncedRelays>) {
        while announced.changed().await.is_ok() {
            let all = announced.borrow_and_update().clone();
            for (contact, relay) in all {
                if self.is_own_relay(&relay.url) {
                    continue;
                }
                let known = match self.store().trusted_relay(&relay.url).await {
                    Ok(k) => k,
                    Err(e) => {
                        tracing::warn!("lan: relay {} announced by contact {contact} not stored: {e}", relay.url);
                        continue;
                    }
                };
                let vouch = RelayVouch::Contact { id: contact, expires_at: relay.expires_at_ms };
                match take_announcement(known.as_ref(), contact, &vouch, &relay.cert_sha256) {
                    Take::Store => {}
                    Take::Known => continue,
                    Take::Conflict => {
                        tracing::warn!(
                            "lan: contact {contact} announced the relay at {} with another certificate than the one \
                             already trusted for it; keeping that one",
                            relay.url
                        );
                        continue;
                    }
                }
                match self.store().trust_relay(&relay.url, &relay.cert_sha256, &vouch, now_ms()).await {
                    Ok(()) => tracing::info!(
                        "lan: trusting the relay at {} (certificate SHA-256 {}), signed by contact {contact}",
                        relay.url,
                        hex(&relay.cert_sha256)
                    ),
                    Err(e) => tracing::warn!("lan: relay {} announced by contact {contact} not stored: {e}", relay.url),
                }
            }
        }
    }

    /// `relay trust URL SHA256`: the owner accepts the relay at `url` with that certificate.
    pub(super) async fn relay_trust(&self, url: &str, cert_sha256: &str) -> Result<Value> {
        let canonical = canonical_relay_url(url)?;
        if !canonical.starts_with("https://") {
            return Err(Error::Invalid("only an https relay is trusted by certificate".into()));
        }
        if self.is_own_relay(&canonical) {
            return Err(Error::Invalid("that is this profile's own relay: its certificate pin is set at init".into()));
        }
        let pin = parse_pin(Some(cert_sha256))?
            .ok_or_else(|| Error::Invalid("give the certificate's SHA-256 (64 hex digits)".into()))?;
        self.store().trust_relay(&canonical, &pin, &RelayVouch::User, now_ms()).await?;
        self.relays_trusted().await
    }

    /// `relay untrust URL`: forgets a trusted relay's pin.
    pub(super) async fn relay_untrust(&self, url: &str) -> Result<Value> {
        let canonical = canonical_relay_url(url)?;
        if !self.store().untrust_relay(&canonical).await? {
            return Err(Error::Invalid(format!("no trusted relay at {canonical}")));
        }
        self.relays_trusted().await
    }

    /// `relay list`: the trusted relays, each with who vouched for it.
    pub(super) async fn relays_trusted(&self) -> Result<Value> {
        let rows = self.store().trusted_relays().await?;
        Ok(Value::Array(rows.iter().map(view).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cert: u8, vouch: RelayVouch) -> TrustedRelayRow {
        TrustedRelayRow {
            url: "https://198.18.0.1:8443".into(),
            cert_sha256: [cert; 32],
            vouch,
            contact_name: None,
            updated_at: 0,
        }
    }

    #[test]
    fn a_contact_replaces_only_its_own_vouch() {
        let alice = |expires_at| RelayVouch::Contact { id: 1, expires_at };
        assert_eq!(take_announcement(None, 1, &alice(5), &[7; 32]), Take::Store);
        assert_eq!(take_announcement(Some(&row(7, alice(5))), 1, &alice(5), &[7; 32]), Take::Known);
        // Her next day's announcement, or a new certificate for her relay: hers to change.
        assert_eq!(take_announcement(Some(&row(7, alice(5))), 1, &alice(6), &[7; 32]), Take::Store);
        assert_eq!(take_announcement(Some(&row(7, alice(5))), 1, &alice(6), &[8; 32]), Take::Store);
        // Dave announces alice's relay URL with his own certificate: refused.
        let dave = RelayVouch::Contact { id: 2, expires_at: 6 };
        assert_eq!(take_announcement(Some(&row(7, alice(5))), 2, &dave, &[8; 32]), Take::Conflict);
        assert_eq!(take_announcement(Some(&row(7, alice(5))), 2, &dave, &[7; 32]), Take::Known);
        // What the owner accepted stays.
        assert_eq!(take_announcement(Some(&row(7, RelayVouch::User)), 1, &alice(5), &[8; 32]), Take::Conflict);
        assert_eq!(take_announcement(Some(&row(7, RelayVouch::User)), 1, &alice(5), &[7; 32]), Take::Known);
    }
}
