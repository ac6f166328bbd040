//! letmeknow: MLS group chat between agent sessions, relayed through a per-group ciphertext log
//! (`specs/letmeknow-relay.md`). Sans-io pieces shared by relay-lite and the runtime:
//!
//! - [`header`]: the plaintext header of a PrivateMessage, the only part the relay reads (group
//!   id, epoch, content type) for its epoch compare-and-set;
//! - [`invite`]: invite links (`https://host/i/<id>#<secret>`) and the invite crypto
//!   (HKDF-SHA256 key from the secret, ChaCha20-Poly1305 with a role-bound AAD);
//! - [`wire`]: the JSON bodies of the group log and invite API, named by direction;
//! - ids: group and invite ids are 32 lower-case hex characters, owner tokens 64.

pub mod header;
pub mod invite;
pub mod wire;

/// Largest MLSMessage the relay stores (bigger bodies get `413`).
pub const MAX_MESSAGE: usize = 256 * 1024;
/// Longest long-poll hold in seconds.
pub const MAX_WAIT_SECS: u64 = 30;
/// Longest invite lifetime in seconds.
pub const MAX_INVITE_TTL: u64 = 86_400;
/// The lifetime the client gives its invites, in seconds.
pub const INVITE_TTL: u64 = 600;
/// Most log entries one read returns.
pub const PAGE: usize = 500;
/// The group log's TTL (seed 001: default 7 days). The decrypted local log is deleted after it:
/// it is outside the forward secrecy MLS gives.
pub const LOG_TTL_SECS: u64 = 7 * 86_400;

fn is_lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `text` is a group or invite id: 32 lower-case hex characters.
pub fn is_id(text: &str) -> bool {
    is_lower_hex(text, 32)
}

/// Whether `text` is an invite owner token: 64 lower-case hex characters.
pub fn is_owner_token(text: &str) -> bool {
    is_lower_hex(text, 64)
}

/// A fresh random id (16 bytes as lower-case hex), for a group or an invite.
pub fn new_id(rng: &mut impl crate::util::Rng) -> String {
    let mut bytes = [0u8; 16];
    rng.fill(&mut bytes);
    crate::util::hex(&bytes)
}

/// Message id: b64u of SHA-256 over the MLSMessage bytes as posted.
pub fn message_id(mls_message: &[u8]) -> String {
    crate::util::b64u(&crate::util::sha256(mls_message))
}

/// Fingerprint of a member: the first 16 bytes of SHA-256 over its signature public key, lower
/// hex in groups of 4.
pub fn fingerprint(signature_key: &[u8]) -> String {
    let digest = crate::util::sha256(signature_key);
    let hex = crate::util::hex(digest.get(..16).unwrap_or(&digest));
    hex.as_bytes().chunks(4).filter_map(|c| std::str::from_utf8(c).ok()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_lower_hex_of_the_exact_length() {
        assert!(is_id("0123456789abcdef0123456789abcdef"));
        assert!(!is_id("0123456789ABCDEF0123456789abcdef"));
        assert!(!is_id("0123456789abcdef0123456789abcde"));
        assert!(!is_id("0123456789abcdef0123456789abcdeg"));
        assert!(is_owner_token(&"ab".repeat(32)));
        assert!(!is_owner_token(&"ab".repeat(16)));
        let id = new_id(&mut crate::util::OsRng);
        assert!(is_id(&id));
    }

    #[test]
    fn fingerprint_is_sixteen_bytes_in_groups_of_four() {
        let fp = fingerprint(b"key");
        assert_eq!(fp.len(), 32 + 7);
        assert_eq!(fp.split(' ').count(), 8);
    }
}
