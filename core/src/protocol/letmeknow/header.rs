//! The plaintext header of an MLS PrivateMessage (RFC 9420 §6, §6.3), the only part of a group
//! message the relay reads:
//!
//! ```text
//! MLSMessage    = u16 version (1 = mls10) ‖ u16 wire_format (2 = mls_private_message) ‖ PrivateMessage
//! PrivateMessage = group_id<V> ‖ u64 epoch ‖ u8 content_type ‖ authenticated_data<V>
//!                  ‖ encrypted_sender_data<V> ‖ ciphertext<V>
//! ```
//!
//! `<V>` is the MLS variable-length vector: a QUIC-style varint length (2-bit prefix for 1, 2 or
//! 4 bytes, minimal encoding) and that many bytes. The whole message must parse with nothing
//! left over; anything else is refused.

/// MLS 1.0.
const VERSION_MLS10: u16 = 1;
/// `mls_private_message`.
const WIRE_FORMAT_PRIVATE: u16 = 2;

/// The content types the relay accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    /// An application message: accepted at the current epoch only.
    Application,
    /// A commit: must target the current epoch, then advances it (compare-and-set).
    Commit,
}

/// The relay-visible header of a PrivateMessage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateHeader {
    /// The MLS group id (for letmeknow, the group id's 32 hex characters as ASCII).
    pub group_id: Vec<u8>,
    /// The epoch the message was sent in.
    pub epoch: u64,
    /// Application or commit.
    pub content_type: ContentType,
}

/// Why bytes are not an acceptable PrivateMessage (the sender's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The message ends early.
    #[error("message truncated")]
    Truncated,
    /// The version is not MLS 1.0.
    #[error("not an MLS 1.0 message")]
    Version,
    /// The wire format is not `mls_private_message`.
    #[error("not a PrivateMessage")]
    WireFormat,
    /// The content type is neither application (1) nor commit (3).
    #[error("content type must be application or commit")]
    ContentType,
    /// A length prefix is malformed (reserved prefix or not minimal).
    #[error("malformed vector length")]
    Length,
    /// Bytes follow the ciphertext.
    #[error("trailing bytes after the message")]
    Trailing,
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HeaderError> {
        if self.rest.len() < n {
            return Err(HeaderError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, HeaderError> {
        self.take(1)?.first().copied().ok_or(HeaderError::Truncated)
    }

    fn u16(&mut self) -> Result<u16, HeaderError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes(b.try_into().map_err(|_| HeaderError::Truncated)?))
    }

    fn u64(&mut self) -> Result<u64, HeaderError> {
        let b = self.take(8)?;
        Ok(u64::from_be_bytes(b.try_into().map_err(|_| HeaderError::Truncated)?))
    }

    /// RFC 9420 §2.1.2 variable-length integer, minimal encoding required.
    fn varint(&mut self) -> Result<usize, HeaderError> {
        let first = self.u8()?;
        let (len, mut value) = match first >> 6 {
            0 => (1, u64::from(first & 0x3f)),
            1 => (2, u64::from(first & 0x3f)),
            2 => (4, u64::from(first & 0x3f)),
            _ => return Err(HeaderError::Length),
        };
        for b in self.take(len - 1)? {
            value = (value << 8) | u64::from(*b);
        }
        let minimal = match len {
            1 => true,
            2 => value >= 64,
            _ => value >= 16_384,
        };
        if !minimal {
            return Err(HeaderError::Length);
        }
        usize::try_from(value).map_err(|_| HeaderError::Length)
    }

    fn vector(&mut self) -> Result<&'a [u8], HeaderError> {
        let len = self.varint()?;
        self.take(len)
    }
}

/// Parses the header of a TLS-serialized MLSMessage that must be a PrivateMessage carrying an
/// application message or a commit, checking that the rest of the structure is well formed.
pub fn parse(message: &[u8]) -> Result<PrivateHeader, HeaderError> {
    let mut r = Reader { rest: message };
    if r.u16()? != VERSION_MLS10 {
        return Err(HeaderError::Version);
    }
    if r.u16()? != WIRE_FORMAT_PRIVATE {
        return Err(HeaderError::WireFormat);
    }
    let group_id = r.vector()?.to_vec();
    let epoch = r.u64()?;
    let content_type = match r.u8()? {
        1 => ContentType::Application,
        3 => ContentType::Commit,
        _ => return Err(HeaderError::ContentType),
    };
    r.vector()?; // authenticated_data
    r.vector()?; // encrypted_sender_data
    r.vector()?; // ciphertext
    if !r.rest.is_empty() {
        return Err(HeaderError::Trailing);
    }
    Ok(PrivateHeader { group_id, epoch, content_type })
}

/// Encodes a vector length as an MLS varint (for tests and test relays that build messages).
pub fn encode_varint(len: usize, out: &mut Vec<u8>) {
    // Lengths above 2^30 cannot occur under the relay's size limit.
    let n = u32::try_from(len).unwrap_or(u32::MAX) & 0x3fff_ffff;
    if n < 64 {
        out.push(n as u8);
    } else if n < 16_384 {
        out.extend_from_slice(&(0x4000 | n as u16).to_be_bytes());
    } else {
        out.extend_from_slice(&(0x8000_0000 | n).to_be_bytes());
    }
}

/// Builds a syntactically valid PrivateMessage with the given header and opaque contents: what a
/// black-box test of the relay posts (the relay never decrypts anything).
pub fn build(group_id: &[u8], epoch: u64, content_type: ContentType, ciphertext: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + group_id.len() + ciphertext.len());
    out.extend_from_slice(&VERSION_MLS10.to_be_bytes());
    out.extend_from_slice(&WIRE_FORMAT_PRIVATE.to_be_bytes());
    encode_varint(group_id.len(), &mut out);
    out.extend_from_slice(group_id);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.push(match content_type {
        ContentType::Application => 1,
        ContentType::Commit => 3,
    });
    encode_varint(0, &mut out);
    encode_varint(4, &mut out);
    out.extend_from_slice(b"sndr");
    encode_varint(ciphertext.len(), &mut out);
    out.extend_from_slice(ciphertext);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn built_messages_parse_back() {
        for len in [0, 63, 64, 16_383, 16_384, 100_000] {
            let body = vec![7u8; len];
            let m = build(b"0123456789abcdef0123456789abcdef", 9, ContentType::Commit, &body);
            let h = parse(&m).unwrap();
            assert_eq!(h.epoch, 9);
            assert_eq!(h.content_type, ContentType::Commit);
            assert_eq!(h.group_id, b"0123456789abcdef0123456789abcdef");
        }
    }

    #[test]
    fn other_messages_are_refused() {
        let m = build(b"g", 0, ContentType::Application, b"x");
        let mut public = m.clone();
        public[3] = 1;
        assert_eq!(parse(&public), Err(HeaderError::WireFormat));
        let mut v2 = m.clone();
        v2[1] = 2;
        assert_eq!(parse(&v2), Err(HeaderError::Version));
        let mut proposal = m.clone();
        proposal[6 + 8] = 2;
        assert_eq!(parse(&proposal), Err(HeaderError::ContentType));
        let mut trailing = m.clone();
        trailing.push(0);
        assert_eq!(parse(&trailing), Err(HeaderError::Trailing));
        assert_eq!(parse(&m[..m.len() - 1]), Err(HeaderError::Truncated));
        // A length of 5 written in two bytes is not minimal.
        let mut long = vec![0, 1, 0, 2, 0x40, 5];
        long.extend_from_slice(b"group");
        assert_eq!(parse(&long), Err(HeaderError::Length));
        assert!(parse(&[]).is_err());
    }
}
