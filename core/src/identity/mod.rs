//! This device's identities: key generation, the letagents device identity, and where secret keys
//! are kept ([`keystore`]).

#[cfg(feature = "runtime")]
pub mod keystore;

use ed25519_dalek::SigningKey;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use crate::protocol::letagents::{Address, PeerKeys};
use crate::util::{Rng, random_array};

/// A letagents device identity: `sig` (Ed25519), `box` (X25519) and the `drop` slot code.
pub struct DeviceIdentity {
    /// Signs every message and mailbox login.
    pub sig: SigningKey,
    /// Receives encrypted messages.
    pub boxs: StaticSecret,
    /// Slot code: only holders of the full address can drop mail.
    pub drop: [u8; 16],
}

impl std::fmt::Debug for DeviceIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceIdentity({})", self.keys().mailbox_id())
    }
}

/// Length of the secret blob kept in the keystore: sig seed ‖ box secret.
pub const SECRET_LEN: usize = 64;

impl DeviceIdentity {
    /// A fresh identity from `rng`.
    pub fn generate(rng: &mut dyn Rng) -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill(seed.as_mut());
        let mut boxs = Zeroizing::new([0u8; 32]);
        rng.fill(boxs.as_mut());
        let mut drop = [0u8; 16];
        rng.fill(&mut drop);
        Self { sig: SigningKey::from_bytes(&seed), boxs: StaticSecret::from(*boxs), drop }
    }

    /// Rebuilds an identity from the keystore's secret blob and the (public) drop code.
    pub fn from_secret(secret: &[u8], drop: [u8; 16]) -> Option<Self> {
        let seed: [u8; 32] = secret.get(..32)?.try_into().ok()?;
        let boxs: [u8; 32] = secret.get(32..64)?.try_into().ok()?;
        if secret.len() != SECRET_LEN {
            return None;
        }
        Some(Self { sig: SigningKey::from_bytes(&seed), boxs: StaticSecret::from(boxs), drop })
    }

    /// The secret blob for the keystore.
    pub fn secret_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut v = Zeroizing::new(Vec::with_capacity(SECRET_LEN));
        v.extend_from_slice(&self.sig.to_bytes());
        v.extend_from_slice(self.boxs.as_bytes());
        v
    }

    /// The public keys.
    pub fn keys(&self) -> PeerKeys {
        PeerKeys { sig: self.sig.verifying_key().to_bytes(), boxk: PublicKey::from(&self.boxs).to_bytes() }
    }

    /// The full address (with drop), to share out of band.
    pub fn address(&self) -> Address {
        Address { keys: self.keys(), drop: Some(self.drop) }
    }
}

/// A random 32-byte token rendered as hex.
pub fn random_token() -> String {
    crate::util::hex(&random_array::<32>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SeededRng;

    #[test]
    fn secret_blob_round_trips() {
        let id = DeviceIdentity::generate(&mut SeededRng::new([3; 32]));
        let back = DeviceIdentity::from_secret(&id.secret_bytes(), id.drop).unwrap();
        assert_eq!(back.keys(), id.keys());
        assert!(DeviceIdentity::from_secret(&[0; 63], id.drop).is_none());
    }
}
