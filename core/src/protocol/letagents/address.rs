//! letagents identities as peers see them: addresses, mailbox ids and safety numbers.

use std::fmt;

use crate::util::{b64u, b64u_array, base32, sha256};

/// The public half of a device identity: what an address carries.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerKeys {
    /// Ed25519 public key (`sig`).
    pub sig: [u8; 32],
    /// X25519 public key (`box`).
    pub boxk: [u8; 32],
}

impl fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerKeys({})", self.mailbox_id())
    }
}

impl PeerKeys {
    /// Mailbox id: base64url of the `sig` public key, 43 characters.
    pub fn mailbox_id(&self) -> String {
        b64u(&self.sig)
    }

    /// `la1.<sig>.<box>`: the address without the drop code, as `inner.from` carries it.
    pub fn address_without_drop(&self) -> String {
        format!("la1.{}.{}", b64u(&self.sig), b64u(&self.boxk))
    }

    /// The safety number: base32 of the first 20 bytes of SHA-256(sig ‖ box), 8 groups of 4.
    pub fn safety_number(&self) -> String {
        let mut both = [0u8; 64];
        both[..32].copy_from_slice(&self.sig);
        both[32..].copy_from_slice(&self.boxk);
        let digest = sha256(&both);
        let text = base32(&digest[..20]);
        let groups: Vec<&str> = text.as_bytes().chunks(4).filter_map(|c| std::str::from_utf8(c).ok()).collect();
        groups.join(" ")
    }
}

/// A letagents address, with or without its drop code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// The device's public keys.
    pub keys: PeerKeys,
    /// The 16-byte slot code, present in a full address.
    pub drop: Option<[u8; 16]>,
}

/// Why an address string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// It does not start with `la1.` or has the wrong number of parts.
    #[error("not a letagents address (expected la1.<sig>.<box>[.<drop>])")]
    Shape,
    /// A part is not strict base64url of the right length.
    #[error("letagents address part `{0}` is not valid base64url of the right length")]
    Part(&'static str),
}

impl Address {
    /// Parses `la1.<sig>.<box>` or `la1.<sig>.<box>.<drop>`.
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        let mut parts = text.trim().split('.');
        if parts.next() != Some("la1") {
            return Err(AddressError::Shape);
        }
        let sig = parts.next().ok_or(AddressError::Shape)?;
        let boxk = parts.next().ok_or(AddressError::Shape)?;
        let drop = parts.next();
        if parts.next().is_some() {
            return Err(AddressError::Shape);
        }
        let sig = b64u_array::<32>(sig).ok_or(AddressError::Part("sig"))?;
        let boxk = b64u_array::<32>(boxk).ok_or(AddressError::Part("box"))?;
        let drop = match drop {
            Some(d) => Some(b64u_array::<16>(d).ok_or(AddressError::Part("drop"))?),
            None => None,
        };
        Ok(Self { keys: PeerKeys { sig, boxk }, drop })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.keys.address_without_drop())?;
        if let Some(drop) = &self.drop {
            write!(f, ".{}", b64u(drop))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> PeerKeys {
        PeerKeys { sig: [1u8; 32], boxk: [2u8; 32] }
    }

    #[test]
    fn address_round_trips_with_and_without_drop() {
        let full = Address { keys: keys(), drop: Some([3u8; 16]) };
        let text = full.to_string();
        assert_eq!(text.split('.').count(), 4);
        assert_eq!(Address::parse(&text), Ok(full));
        let bare = Address { keys: keys(), drop: None };
        assert_eq!(Address::parse(&bare.to_string()), Ok(bare));
        assert_eq!(keys().mailbox_id().len(), 43);
    }

    #[test]
    fn malformed_addresses_are_refused() {
        let good = Address { keys: keys(), drop: Some([3u8; 16]) }.to_string();
        assert_eq!(Address::parse(&good.replacen("la1", "la2", 1)), Err(AddressError::Shape));
        assert_eq!(Address::parse(&format!("{good}.x")), Err(AddressError::Shape));
        assert_eq!(Address::parse("la1.abc"), Err(AddressError::Shape));
        let short_sig = format!("la1.{}.{}", b64u(&[1u8; 31]), b64u(&[2u8; 32]));
        assert_eq!(Address::parse(&short_sig), Err(AddressError::Part("sig")));
    }

    #[test]
    fn safety_number_is_eight_groups_of_four_base32() {
        let sn = keys().safety_number();
        assert_eq!(sn.len(), 32 + 7);
        assert!(sn.split(' ').all(|g| g.len() == 4));
        assert!(sn.chars().all(|c| c == ' ' || c.is_ascii_uppercase() || ('2'..='7').contains(&c)));
        // Independent computation: base32(SHA-256(sig ‖ box)[..20]).
        let mut both = vec![1u8; 32];
        both.extend([2u8; 32]);
        assert_eq!(sn.replace(' ', ""), base32(&sha256(&both)[..20]));
    }
}
