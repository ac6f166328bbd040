//! The LAN key and its binding to an identity.
//!
//! - [`LanKey`]: a random Ed25519 seed and when it was made; due for rotation after
//!   [`super::LAN_KEY_LIFETIME_MS`]. The keystore keeps its secret.
//! - [`LanBinding::sign`]: the identity key signs `switchboard-lan-v1\n` ‖ PeerId ‖ expiry
//!   (big-endian u64 milliseconds; the expiry's fixed width after the PeerId keeps the string
//!   unambiguous).
//! - The wire form leaves the identity key out: the receiver tries its pinned contacts' keys, so a
//!   stranger learns nothing it could link unless it already holds one of our public keys.
//! - A received binding is untrusted until [`LanBinding::check`] (the PeerId the connection
//!   authenticated, expiry window) and [`TimelyBinding::admit`] (a pinned contact's key verifies
//!   the signature) say otherwise; [`verify_hello`] runs both over a whole hello.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use zeroize::Zeroizing;

use super::{CLOCK_SKEW_MS, LAN_KEY_LIFETIME_MS, MAX_BINDING_VALIDITY_MS, MAX_BINDINGS};
use crate::protocol::agent_identity::ed25519::{sign, verify_strict};
use crate::util::Rng;

/// The domain separation prefix of the signed string.
pub const BINDING_CONTEXT: &[u8] = b"switchboard-lan-v1\n";
/// Longest PeerId a binding may name (an Ed25519 PeerId is 38 bytes).
pub const MAX_PEER_ID: usize = 64;
/// Length of the keystore blob: seed ‖ created-at (big-endian i64 milliseconds).
pub const LAN_KEY_SECRET_LEN: usize = 40;

/// Why a binding or hello was refused. Every variant is the peer's fault (or its clock's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// The bytes are not a binding (peer).
    #[error("malformed binding: {0}")]
    Malformed(&'static str),
    /// The binding names another PeerId than the one this connection authenticated: a binding
    /// copied from someone else's connection (peer).
    #[error("binding is for another PeerId")]
    WrongPeer,
    /// The binding's expiry has passed (peer, or a clock off by more than the tolerated skew).
    #[error("binding expired")]
    Expired,
    /// The expiry is further ahead than any honest binding's (peer).
    #[error("binding expiry is too far in the future")]
    TooLong,
    /// No pinned contact's key verifies any binding: a stranger, or a forged or corrupted
    /// signature (peer).
    #[error("no binding is signed by a pinned contact")]
    Foreign,
}

/// This profile's LAN key: a random Ed25519 seed, independent of every identity key.
pub struct LanKey {
    seed: Zeroizing<[u8; 32]>,
    created_at_ms: i64,
}

impl std::fmt::Debug for LanKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanKey").field("public", &crate::util::hex(&self.public())).finish_non_exhaustive()
    }
}

impl LanKey {
    /// A fresh key made at `now_ms`.
    pub fn generate(rng: &mut dyn Rng, now_ms: i64) -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill(seed.as_mut());
        Self { seed, created_at_ms: now_ms }
    }

    /// Rebuilds a key from its keystore blob.
    pub fn from_secret(secret: &[u8]) -> Option<Self> {
        if secret.len() != LAN_KEY_SECRET_LEN {
            return None;
        }
        let seed: [u8; 32] = secret.get(..32)?.try_into().ok()?;
        let created: [u8; 8] = secret.get(32..40)?.try_into().ok()?;
        Some(Self { seed: Zeroizing::new(seed), created_at_ms: i64::from_be_bytes(created) })
    }

    /// The keystore blob.
    pub fn secret_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut v = Zeroizing::new(Vec::with_capacity(LAN_KEY_SECRET_LEN));
        v.extend_from_slice(self.seed.as_ref());
        v.extend_from_slice(&self.created_at_ms.to_be_bytes());
        v
    }

    /// The Ed25519 seed (libp2p's `Keypair::ed25519_from_bytes` takes it).
    pub fn seed(&self) -> Zeroizing<[u8; 32]> {
        self.seed.clone()
    }

    /// When the key was made.
    pub fn created_at_ms(&self) -> i64 {
        self.created_at_ms
    }

    /// The public key.
    pub fn public(&self) -> [u8; 32] {
        SigningKey::from_bytes(&self.seed).verifying_key().to_bytes()
    }

    /// The libp2p PeerId of this key in its byte form: the identity multihash of the protobuf
    /// public key (`08 01 12 20` ‖ key), as libp2p computes it for Ed25519 keys.
    pub fn peer_id_bytes(&self) -> Vec<u8> {
        let mut v = vec![0x00, 0x24, 0x08, 0x01, 0x12, 0x20];
        v.extend_from_slice(&self.public());
        v
    }

    /// Whether the key should be replaced: it is a day old, or dated in the future (the clock went
    /// back), which would otherwise stretch its life.
    pub fn is_due(&self, now_ms: i64) -> bool {
        now_ms >= self.created_at_ms.saturating_add(LAN_KEY_LIFETIME_MS)
            || self.created_at_ms > now_ms.saturating_add(CLOCK_SKEW_MS)
    }

    /// The expiry every binding of this key carries.
    pub fn binding_expiry(&self) -> i64 {
        self.created_at_ms.saturating_add(LAN_KEY_LIFETIME_MS).saturating_add(super::BINDING_GRACE_MS)
    }

    /// The key to use at `now_ms`: the stored one while it is current, else a new one (the
    /// caller saves it to the keystore before using it). The flag says whether it is new.
    pub fn current(stored: Option<LanKey>, now_ms: i64, rng: &mut dyn Rng) -> (LanKey, bool) {
        match stored {
            Some(key) if !key.is_due(now_ms) => (key, false),
            _ => (LanKey::generate(rng, now_ms), true),
        }
    }
}

/// The string an identity key signs.
fn signed_string(peer_id: &[u8], expires_at_ms: i64) -> Vec<u8> {
    let mut m = Vec::with_capacity(BINDING_CONTEXT.len() + peer_id.len() + 8);
    m.extend_from_slice(BINDING_CONTEXT);
    m.extend_from_slice(peer_id);
    m.extend_from_slice(&expires_at_ms.to_be_bytes());
    m
}

/// A binding as it travels: expiry, PeerId, signature. It does not name the identity key: the
/// receiver tries its pinned contacts' keys, so a stranger who does not already know one of our
/// keys cannot tell whose binding it is. A decoded binding is untrusted until
/// [`LanBinding::check`] and [`TimelyBinding::admit`].
///
/// Wire form: expiry (u64 BE ms) ‖ PeerId length (u8, 1..=64) ‖ PeerId ‖ signature (64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanBinding {
    expires_at_ms: i64,
    peer_id: Vec<u8>,
    signature: [u8; 64],
}

/// A binding for this connection's PeerId and within its validity window; its signature is not
/// checked yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelyBinding<'a> {
    binding: &'a LanBinding,
}

/// A binding signed by a pinned contact's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedBinding<C> {
    /// The contact whose key signed it.
    pub contact: C,
    /// That key.
    pub identity: [u8; 32],
    /// When the binding lapses.
    pub expires_at_ms: i64,
}

impl LanBinding {
    /// Signs a binding of `peer_id` to `identity` until `expires_at_ms`.
    pub fn sign(identity: &SigningKey, peer_id: &[u8], expires_at_ms: i64) -> Self {
        let signature = sign(identity, &signed_string(peer_id, expires_at_ms));
        Self { expires_at_ms, peer_id: peer_id.to_vec(), signature }
    }

    /// Appends the wire form to `out`. Our own bindings always fit: `sign` is only given our
    /// PeerId (38 bytes); a longer one is cut at [`MAX_PEER_ID`] and then fails verification.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let peer = self.peer_id.get(..self.peer_id.len().min(MAX_PEER_ID)).unwrap_or_default();
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        out.push(u8::try_from(peer.len()).unwrap_or(0));
        out.extend_from_slice(peer);
        out.extend_from_slice(&self.signature);
    }

    /// The wire form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + 1 + self.peer_id.len() + 64);
        self.encode_into(&mut v);
        v
    }

    /// Decodes one binding from the front of `input`, returning it and the rest.
    pub fn decode_prefix(input: &[u8]) -> Result<(Self, &[u8]), BindingError> {
        let short = BindingError::Malformed("truncated");
        let (expiry, rest) = input.split_first_chunk::<8>().ok_or(short.clone())?;
        let (&peer_len, rest) = rest.split_first().ok_or(short.clone())?;
        let peer_len = usize::from(peer_len);
        if peer_len == 0 || peer_len > MAX_PEER_ID {
            return Err(BindingError::Malformed("PeerId length"));
        }
        let (peer_id, rest) = rest.split_at_checked(peer_len).ok_or(short.clone())?;
        let (signature, rest) = rest.split_first_chunk::<64>().ok_or(short)?;
        let expires_at_ms =
            i64::try_from(u64::from_be_bytes(*expiry)).map_err(|_| BindingError::Malformed("expiry out of range"))?;
        Ok((Self { expires_at_ms, peer_id: peer_id.to_vec(), signature: *signature }, rest))
    }

    /// Decodes exactly one binding.
    pub fn decode(input: &[u8]) -> Result<Self, BindingError> {
        match Self::decode_prefix(input)? {
            (b, []) => Ok(b),
            _ => Err(BindingError::Malformed("trailing bytes")),
        }
    }

    /// The cheap checks for a connection whose remote authenticated as `remote_peer_id`, at
    /// `now_ms`: the PeerId (a copied binding is the likely attack), then the expiry window.
    pub fn check(&self, remote_peer_id: &[u8], now_ms: i64) -> Result<TimelyBinding<'_>, BindingError> {
        if self.peer_id != remote_peer_id {
            return Err(BindingError::WrongPeer);
        }
        if self.expires_at_ms.saturating_add(CLOCK_SKEW_MS) <= now_ms {
            return Err(BindingError::Expired);
        }
        if self.expires_at_ms > now_ms.saturating_add(MAX_BINDING_VALIDITY_MS) {
            return Err(BindingError::TooLong);
        }
        Ok(TimelyBinding { binding: self })
    }

    /// Whether `identity` signed this binding (no PeerId or expiry check: see [`Self::check`]).
    pub fn is_signed_by(&self, identity: &[u8; 32]) -> bool {
        verify_strict(identity, &signed_string(&self.peer_id, self.expires_at_ms), &self.signature).is_ok()
    }
}

/// Where pinned contacts' identity keys are found.
pub trait PinnedKeys {
    /// What a match yields (a contact id, a name).
    type Contact: Clone;
    /// Every pinned signing key with its contact (keys blocked by an unverified key change are
    /// left out by the caller).
    fn pinned(&self) -> impl Iterator<Item = (&[u8; 32], &Self::Contact)>;
}

impl<C: Clone> PinnedKeys for BTreeMap<[u8; 32], C> {
    type Contact = C;
    fn pinned(&self) -> impl Iterator<Item = (&[u8; 32], &C)> {
        self.iter()
    }
}

impl TimelyBinding<'_> {
    /// The pinned contact whose key signed this binding, or `Foreign` (a stranger's key, or a
    /// forged or corrupted signature: the two cannot be told apart without the key).
    pub fn admit<P: PinnedKeys>(&self, pinned: &P) -> Result<VerifiedBinding<P::Contact>, BindingError> {
        pinned
            .pinned()
            .find(|(key, _)| self.binding.is_signed_by(key))
            .map(|(key, contact)| VerifiedBinding {
                contact: contact.clone(),
                identity: *key,
                expires_at_ms: self.binding.expires_at_ms,
            })
            .ok_or(BindingError::Foreign)
    }
}

/// A peer whose hello verified: the contacts it is, and when its bindings lapse (the earliest
/// matched expiry; the connection must hello again after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPeer<C> {
    /// The pinned contacts whose identity keys signed a binding (one per identity), in order.
    pub contacts: Vec<VerifiedBinding<C>>,
    /// The earliest expiry among the matched bindings.
    pub expires_at_ms: i64,
}

/// Judges a whole hello: 1..=[`MAX_BINDINGS`] bindings, every one for this connection's PeerId and
/// in its validity window (one bad binding refuses the hello: an honest peer never sends one),
/// and at least one signed by a pinned contact's key. Bindings no pinned key verifies are allowed
/// beside a matching one (a profile binds all of its identities; we may know only one).
pub fn verify_hello<P: PinnedKeys>(
    bindings: &[LanBinding],
    remote_peer_id: &[u8],
    now_ms: i64,
    pinned: &P,
) -> Result<BoundPeer<P::Contact>, BindingError> {
    if bindings.is_empty() || bindings.len() > MAX_BINDINGS {
        return Err(BindingError::Malformed("binding count"));
    }
    let timely = bindings.iter().map(|b| b.check(remote_peer_id, now_ms)).collect::<Result<Vec<_>, _>>()?;
    let contacts: Vec<_> = timely.iter().filter_map(|t| t.admit(pinned).ok()).collect();
    let expires_at_ms = contacts.iter().map(|c| c.expires_at_ms).min().ok_or(BindingError::Foreign)?;
    Ok(BoundPeer { contacts, expires_at_ms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::lan::BINDING_GRACE_MS;
    use crate::util::SeededRng;

    const NOW: i64 = 1_800_000_000_000;

    struct Side {
        identity: SigningKey,
        lan: LanKey,
    }

    fn side(seed: u8) -> Side {
        let mut rng = SeededRng::new([seed; 32]);
        let mut id = [0u8; 32];
        rng.fill(&mut id);
        Side { identity: SigningKey::from_bytes(&id), lan: LanKey::generate(&mut rng, NOW) }
    }

    impl Side {
        fn binding(&self) -> LanBinding {
            LanBinding::sign(&self.identity, &self.lan.peer_id_bytes(), self.lan.binding_expiry())
        }
        fn key(&self) -> [u8; 32] {
            self.identity.verifying_key().to_bytes()
        }
        fn peer(&self) -> Vec<u8> {
            self.lan.peer_id_bytes()
        }
    }

    /// Bob's pinned contacts: alice (and a few others, so matching is not trivially the first).
    fn bobs_contacts(alice: &Side) -> BTreeMap<[u8; 32], &'static str> {
        BTreeMap::from([([0x11; 32], "carol"), (alice.key(), "alice"), (side(40).key(), "dave")])
    }

    #[test]
    fn pinned_contacts_binding_is_admitted() {
        let alice = side(1);
        let bound = verify_hello(&[alice.binding()], &alice.peer(), NOW, &bobs_contacts(&alice)).unwrap();
        assert_eq!(bound.contacts.len(), 1);
        let c = bound.contacts.first().unwrap();
        assert_eq!((c.contact, c.identity), ("alice", alice.key()));
        assert_eq!(bound.expires_at_ms, NOW + LAN_KEY_LIFETIME_MS + BINDING_GRACE_MS);
    }

    #[test]
    fn binding_round_trips_through_its_wire_form_without_naming_the_identity() {
        let alice = side(1);
        let b = alice.binding();
        let bytes = b.to_bytes();
        assert_eq!(bytes.len(), 8 + 1 + 38 + 64);
        assert!(!bytes.windows(32).any(|w| w == alice.key()), "the identity key is on the wire");
        assert_eq!(LanBinding::decode(&bytes).unwrap(), b);
        for cut in 0..bytes.len() {
            assert!(LanBinding::decode(bytes.get(..cut).unwrap()).is_err(), "truncated at {cut} decoded");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(LanBinding::decode(&longer), Err(BindingError::Malformed("trailing bytes")));
    }

    #[test]
    fn forged_binding_is_refused() {
        let alice = side(1);
        let mallory = side(2);
        // Mallory binds her own PeerId with her own key and hopes to pass as a contact.
        let own = LanBinding::sign(&mallory.identity, &mallory.peer(), mallory.lan.binding_expiry());
        assert_eq!(verify_hello(&[own], &mallory.peer(), NOW, &bobs_contacts(&alice)), Err(BindingError::Foreign));
        // She edits Alice's binding to name her PeerId: the signature no longer verifies.
        let mut bytes = alice.binding().to_bytes();
        bytes.get_mut(9..9 + 38).unwrap().copy_from_slice(&mallory.peer());
        let edited = LanBinding::decode(&bytes).unwrap();
        assert_eq!(verify_hello(&[edited], &mallory.peer(), NOW, &bobs_contacts(&alice)), Err(BindingError::Foreign));
        // Every single-bit flip of an honest binding is refused.
        let honest = alice.binding().to_bytes();
        for i in 0..honest.len() {
            let mut b = honest.clone();
            *b.get_mut(i).unwrap() ^= 1;
            let Ok(b) = LanBinding::decode(&b) else { continue };
            assert!(
                verify_hello(&[b], &alice.peer(), NOW, &bobs_contacts(&alice)).is_err(),
                "bit flip at {i} verified"
            );
        }
    }

    #[test]
    fn binding_copied_to_another_peer_id_is_refused() {
        let alice = side(1);
        let mallory = side(2);
        // Mallory replays Alice's binding on her own connection (her PeerId is what noise proved).
        assert_eq!(
            verify_hello(&[alice.binding()], &mallory.peer(), NOW, &bobs_contacts(&alice)),
            Err(BindingError::WrongPeer)
        );
    }

    #[test]
    fn expired_binding_is_refused() {
        let alice = side(1);
        let b = alice.binding();
        let expiry = alice.lan.binding_expiry();
        assert!(b.check(&alice.peer(), expiry + CLOCK_SKEW_MS - 1).is_ok(), "within the skew");
        assert_eq!(b.check(&alice.peer(), expiry + CLOCK_SKEW_MS), Err(BindingError::Expired));
        assert_eq!(
            verify_hello(&[b], &alice.peer(), expiry + CLOCK_SKEW_MS + 1, &bobs_contacts(&alice)),
            Err(BindingError::Expired)
        );
    }

    #[test]
    fn binding_valid_for_too_long_is_refused() {
        let alice = side(1);
        let far = LanBinding::sign(&alice.identity, &alice.peer(), NOW + MAX_BINDING_VALIDITY_MS + 1);
        assert_eq!(far.check(&alice.peer(), NOW), Err(BindingError::TooLong));
        let edge = LanBinding::sign(&alice.identity, &alice.peer(), NOW + MAX_BINDING_VALIDITY_MS);
        assert!(edge.check(&alice.peer(), NOW).is_ok());
    }

    #[test]
    fn foreign_binding_is_refused() {
        let alice = side(1);
        let stranger = side(3);
        // A perfectly valid binding, but from a key no contact pinned.
        assert_eq!(
            verify_hello(&[stranger.binding()], &stranger.peer(), NOW, &bobs_contacts(&alice)),
            Err(BindingError::Foreign)
        );
    }

    #[test]
    fn one_bad_binding_refuses_the_whole_hello() {
        let alice = side(1);
        let other_identity = SigningKey::from_bytes(&[9; 32]);
        let expired = LanBinding::sign(&other_identity, &alice.peer(), NOW - CLOCK_SKEW_MS - 1);
        assert_eq!(
            verify_hello(&[alice.binding(), expired], &alice.peer(), NOW, &bobs_contacts(&alice)),
            Err(BindingError::Expired)
        );
        // An unknown but valid second identity is fine.
        let unknown = LanBinding::sign(&other_identity, &alice.peer(), alice.lan.binding_expiry());
        let bound = verify_hello(&[unknown, alice.binding()], &alice.peer(), NOW, &bobs_contacts(&alice)).unwrap();
        assert_eq!(bound.contacts.iter().map(|c| c.contact).collect::<Vec<_>>(), vec!["alice"]);
        let pinned = bobs_contacts(&alice);
        assert_eq!(verify_hello(&[], &alice.peer(), NOW, &pinned), Err(BindingError::Malformed("binding count")));
        let five = vec![alice.binding(); MAX_BINDINGS + 1];
        assert_eq!(verify_hello(&five, &alice.peer(), NOW, &pinned), Err(BindingError::Malformed("binding count")));
    }

    #[test]
    fn lan_key_is_independent_of_the_identity_and_rotates_daily() {
        let alice = side(1);
        assert_ne!(alice.lan.public(), alice.key());
        let back = LanKey::from_secret(&alice.lan.secret_bytes()).unwrap();
        assert_eq!((back.public(), back.created_at_ms()), (alice.lan.public(), NOW));
        assert!(LanKey::from_secret(&[0; 39]).is_none());
        let mut rng = SeededRng::new([5; 32]);
        let (same, new) = LanKey::current(Some(back), NOW + LAN_KEY_LIFETIME_MS - 1, &mut rng);
        assert!(!new);
        assert_eq!(same.public(), alice.lan.public());
        let (next, new) = LanKey::current(Some(same), NOW + LAN_KEY_LIFETIME_MS, &mut rng);
        assert!(new, "a day-old key is replaced");
        assert_ne!(next.public(), alice.lan.public());
        assert_eq!(next.created_at_ms(), NOW + LAN_KEY_LIFETIME_MS);
        // A key dated in the future (clock set back) is replaced too.
        assert!(next.is_due(NOW));
    }
}
