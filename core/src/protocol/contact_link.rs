//! The Switchboard contact link: one signed card naming every address of a profile, so that a
//! person is added once and reached over every protocol they have, with one safety number.
//!
//! - Text form: `switchboard:sb1.<payload>.<signature>` (base64url, no padding). The payload is
//!   a few lines of UTF-8 in a fixed order (see [`ContactLink::payload`]); the signature is
//!   Ed25519 by the profile's identity key over a domain tag and the payload bytes.
//! - The identity key is the profile's letagents `sig` key, so the letagents address in the link
//!   must carry it; the person's safety number is that address's safety number (the number
//!   people already compare for letagents), repeated in the payload so a link that shows one
//!   number and carries keys for another is refused.
//! - An Agent Mail address has its own key (the Agent ID), which the identity key cannot speak
//!   for: its line carries that key's signature over the identity key and the address
//!   ([`bind_agent_mail`]), so a link cannot claim someone else's mailbox. Stringcup ids are
//!   server-assigned and have no signing key; their sender is only ever relay-asserted.
//! - Parsing is strict and bounded: size first, then version, then shape, then the signature,
//!   then every field against the identity. Every refusal names what is wrong with the link
//!   (the sharer's fault, or a forgery); nothing in it is trusted before the signature checks.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::protocol::agent_mail::address::MailAddress;
use crate::protocol::letagents::{Address, PeerKeys};
use crate::protocol::stringcup::wire::is_identity_id;
use crate::util::{b64u, b64u_decode};

/// The scheme a link is opened with.
pub const SCHEME: &str = "switchboard:";
/// The version prefix of the link body.
pub const VERSION_PREFIX: &str = "sb1.";
/// Longest link accepted, in bytes (a link with every protocol is about 700).
pub const MAX_LINK_LEN: usize = 2048;
/// Longest display name carried, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest relay URL carried, in bytes.
pub const MAX_URL_LEN: usize = 256;
/// What the signature covers before the payload, so no other signed text can pass as a link.
const DOMAIN: &[u8] = b"switchboard contact link v1\n";
/// What an Agent ID key signs to bind its mailbox address to a link's identity key.
const AGENT_MAIL_DOMAIN: &[u8] = b"switchboard contact link v1 agent mail\n";
/// The payload's first line.
const HEADER: &str = "switchboard contact v1";

/// Why a text is not an acceptable contact link. Every variant is the sharer's fault or a
/// forgery; none is ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Longer than [`MAX_LINK_LEN`]: refused before decoding.
    #[error("the contact link is too long ({0} bytes, at most {MAX_LINK_LEN})")]
    TooLong(usize),
    /// Not a contact link at all (no `sb` version prefix).
    #[error("not a Switchboard contact link (expected switchboard:sb1.…)")]
    NotALink,
    /// A contact link of a version this build does not know.
    #[error("contact link version `{0}` is not supported by this version of Switchboard (it reads sb1)")]
    UnknownVersion(String),
    /// The link's parts or encoding are malformed (truncated or mangled when copied).
    #[error("the contact link is damaged: {0}")]
    Malformed(&'static str),
    /// The signature does not verify under the identity key it names: the link was altered
    /// (for example, an address swapped for someone else's).
    #[error("the contact link's signature does not match its identity key: it was altered or forged")]
    BadSignature,
    /// The letagents address is not the identity's own: signed by another key than it claims.
    #[error("the letagents address in the link does not belong to the link's identity key")]
    AddressNotSigned,
    /// The safety number written in the link is not the one its keys give.
    #[error("the safety number in the link ({shown}) is not the one its keys give ({actual}): refused as forged")]
    SafetyNumberMismatch {
        /// What the link shows.
        shown: String,
        /// What its keys give.
        actual: String,
    },
    /// The Agent Mail address is not bound to the identity by its own key: the link claims a
    /// mailbox its signer does not hold.
    #[error("the Agent Mail address in the link is not signed by its own key: the link claims someone else's mailbox")]
    AgentMailNotBound,
    /// A field is present but invalid.
    #[error("the contact link's {0} is invalid")]
    Field(&'static str),
}

/// One relay-hosted channel of a person, as the link lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetagentsEntry {
    /// The full address (with drop code).
    pub address: Address,
    /// The relay holding the mailbox.
    pub relay: String,
}

/// A Stringcup identity and the relay it is registered at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringcupEntry {
    /// `sc-…` identity id.
    pub id: String,
    /// The relay's base URL.
    pub relay: String,
}

/// A verified contact link: every field checked against the identity key's signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContactLink {
    /// The display name the sharer gave themselves.
    pub name: String,
    /// letagents (required: its `sig` key is the identity key).
    pub letagents: LetagentsEntry,
    /// Agent Mail address, if the profile has a mailbox, with its Agent ID key's signature
    /// binding it to the identity key ([`bind_agent_mail`]).
    pub agent_mail: Option<(MailAddress, [u8; 64])>,
    /// Stringcup identity, if registered.
    pub stringcup: Option<StringcupEntry>,
}

impl ContactLink {
    /// The identity key (Ed25519 public key) that signs the link.
    pub fn identity_key(&self) -> [u8; 32] {
        self.letagents.address.keys.sig
    }

    /// The person's one safety number.
    pub fn safety_number(&self) -> String {
        self.keys().safety_number()
    }

    fn keys(&self) -> PeerKeys {
        self.letagents.address.keys
    }

    /// The exact payload bytes the signature covers.
    pub fn payload(&self) -> String {
        let mut p = format!(
            "{HEADER}\nidentity {}\nsafety {}\nname {}\nletagents {} {}\n",
            b64u(&self.identity_key()),
            self.safety_number(),
            self.name,
            self.letagents.address,
            self.letagents.relay
        );
        if let Some((am, proof)) = &self.agent_mail {
            p.push_str(&format!("agent_mail {am} {}\n", b64u(proof)));
        }
        if let Some(sc) = &self.stringcup {
            p.push_str(&format!("stringcup {} {}\n", sc.id, sc.relay));
        }
        p
    }

    /// Signs the link with `identity` (whose public key must be the letagents `sig` key) and
    /// renders it as `switchboard:sb1.…`. Fails if the fields would not parse back.
    pub fn sign(&self, identity: &SigningKey) -> Result<String, LinkError> {
        if identity.verifying_key().to_bytes() != self.identity_key() {
            return Err(LinkError::AddressNotSigned);
        }
        let payload = self.payload();
        let sig = identity.sign(&signed_bytes(payload.as_bytes()));
        let text = format!("{SCHEME}{VERSION_PREFIX}{}.{}", b64u(payload.as_bytes()), b64u(&sig.to_bytes()));
        // What we hand out must be what every parser accepts.
        let back = Self::parse(&text)?;
        if &back != self {
            return Err(LinkError::Field("round trip"));
        }
        Ok(text)
    }

    /// Parses and verifies a link (with or without `switchboard:` / `switchboard://`).
    pub fn parse(text: &str) -> Result<Self, LinkError> {
        let text = text.trim();
        if text.len() > MAX_LINK_LEN {
            return Err(LinkError::TooLong(text.len()));
        }
        let body = strip_scheme(text);
        let Some(rest) = body.strip_prefix("sb") else { return Err(LinkError::NotALink) };
        let (version, rest) = rest.split_once('.').ok_or(LinkError::NotALink)?;
        if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
            return Err(LinkError::NotALink);
        }
        if version != "1" {
            return Err(LinkError::UnknownVersion(format!("sb{}", version.chars().take(8).collect::<String>())));
        }
        let (payload_b64, sig_b64) = rest.split_once('.').ok_or(LinkError::Malformed("missing signature"))?;
        let payload = b64u_decode(payload_b64).ok_or(LinkError::Malformed("payload is not base64url"))?;
        let sig: [u8; 64] = b64u_decode(sig_b64)
            .and_then(|s| s.try_into().ok())
            .ok_or(LinkError::Malformed("signature is not 64 bytes of base64url"))?;
        let payload = String::from_utf8(payload).map_err(|_| LinkError::Malformed("payload is not UTF-8"))?;
        let fields = Fields::parse(&payload)?;
        let vk = VerifyingKey::from_bytes(&fields.identity).map_err(|_| LinkError::Field("identity key"))?;
        vk.verify_strict(&signed_bytes(payload.as_bytes()), &Signature::from_bytes(&sig))
            .map_err(|_| LinkError::BadSignature)?;
        fields.check()
    }
}

/// The Agent ID key's signature binding `address` to the link identity `identity` (the
/// letagents `sig` key): what the `agent_mail` line carries.
pub fn bind_agent_mail(agent_key: &SigningKey, identity: &[u8; 32], address: &MailAddress) -> [u8; 64] {
    agent_key.sign(&agent_mail_bytes(identity, address)).to_bytes()
}

fn agent_mail_bytes(identity: &[u8; 32], address: &MailAddress) -> Vec<u8> {
    let mut m = AGENT_MAIL_DOMAIN.to_vec();
    m.extend_from_slice(identity);
    m.extend_from_slice(address.to_string().as_bytes());
    m
}

fn signed_bytes(payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + payload.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(payload);
    m
}

/// `switchboard:` and `switchboard://` are optional (case-insensitive scheme).
fn strip_scheme(text: &str) -> &str {
    match text.get(..SCHEME.len()) {
        Some(s) if s.eq_ignore_ascii_case(SCHEME) => {
            let rest = text.get(SCHEME.len()..).unwrap_or("");
            rest.strip_prefix("//").unwrap_or(rest)
        }
        _ => text,
    }
}

/// The payload's fields, split but not yet checked against each other.
struct Fields<'a> {
    identity: [u8; 32],
    safety: &'a str,
    name: &'a str,
    letagents: (&'a str, &'a str),
    agent_mail: Option<(&'a str, &'a str)>,
    stringcup: Option<(&'a str, &'a str)>,
}

impl<'a> Fields<'a> {
    fn parse(payload: &'a str) -> Result<Self, LinkError> {
        let body = payload.strip_suffix('\n').ok_or(LinkError::Malformed("payload does not end with a newline"))?;
        let mut lines = body.split('\n');
        if lines.next() != Some(HEADER) {
            return Err(LinkError::Malformed("payload header"));
        }
        let mut field = |key: &'static str| -> Result<&'a str, LinkError> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix(' '))
                .ok_or(LinkError::Malformed("a required line is missing or out of order"))
        };
        let identity = field("identity")?;
        let safety = field("safety")?;
        let name = field("name")?;
        let letagents = two(field("letagents")?)?;
        let identity = crate::util::b64u_array::<32>(identity).ok_or(LinkError::Field("identity key"))?;
        let mut agent_mail = None;
        let mut stringcup = None;
        // The optional lines, each at most once and in this order.
        let rest: Vec<&str> = lines.collect();
        let mut it = rest.into_iter().peekable();
        if let Some(l) = it.peek().and_then(|l| l.strip_prefix("agent_mail ")) {
            agent_mail = Some(two(l)?);
            it.next();
        }
        if let Some(l) = it.peek().and_then(|l| l.strip_prefix("stringcup ")) {
            stringcup = Some(two(l)?);
            it.next();
        }
        if it.next().is_some() {
            return Err(LinkError::Malformed("unknown, repeated or out-of-order line"));
        }
        Ok(Fields { identity, safety, name, letagents, agent_mail, stringcup })
    }

    /// Checks every field against the (signature-verified) identity key.
    fn check(self) -> Result<ContactLink, LinkError> {
        let name = self.name;
        if name.is_empty()
            || name.chars().count() > MAX_NAME_CHARS
            || name.trim() != name
            || name.chars().any(char::is_control)
        {
            return Err(LinkError::Field("name"));
        }
        let address = Address::parse(self.letagents.0).map_err(|_| LinkError::Field("letagents address"))?;
        if address.drop.is_none() || address.to_string() != self.letagents.0 {
            return Err(LinkError::Field("letagents address"));
        }
        if address.keys.sig != self.identity {
            return Err(LinkError::AddressNotSigned);
        }
        let actual = address.keys.safety_number();
        if self.safety != actual {
            return Err(LinkError::SafetyNumberMismatch { shown: self.safety.chars().take(64).collect(), actual });
        }
        let agent_mail = match self.agent_mail {
            Some((text, proof)) => {
                let a = MailAddress::parse(text).map_err(|_| LinkError::Field("Agent Mail address"))?;
                if a.to_string() != text {
                    return Err(LinkError::Field("Agent Mail address"));
                }
                let proof: [u8; 64] = b64u_decode(proof)
                    .and_then(|p| p.try_into().ok())
                    .ok_or(LinkError::Field("Agent Mail signature"))?;
                let key = VerifyingKey::from_bytes(a.owner.public_key()).map_err(|_| LinkError::AgentMailNotBound)?;
                key.verify_strict(&agent_mail_bytes(&self.identity, &a), &Signature::from_bytes(&proof))
                    .map_err(|_| LinkError::AgentMailNotBound)?;
                Some((a, proof))
            }
            None => None,
        };
        let stringcup = match self.stringcup {
            Some((id, relay)) if is_identity_id(id) => Some(StringcupEntry { id: id.into(), relay: url(relay)? }),
            Some(_) => return Err(LinkError::Field("Stringcup id")),
            None => None,
        };
        Ok(ContactLink {
            name: name.into(),
            letagents: LetagentsEntry { address, relay: url(self.letagents.1)? },
            agent_mail,
            stringcup,
        })
    }
}

/// `a b`: exactly two space-separated words.
fn two(line: &str) -> Result<(&str, &str), LinkError> {
    let (a, b) = line.split_once(' ').ok_or(LinkError::Malformed("a line lacks its relay"))?;
    if a.is_empty() || b.is_empty() || b.contains(' ') {
        return Err(LinkError::Malformed("a line has extra words"));
    }
    Ok((a, b))
}

/// A relay base URL: `https://` (or `http://`, which the engine allows for loopback only),
/// bounded, printable, no trailing slash.
fn url(text: &str) -> Result<String, LinkError> {
    let ok = text.len() <= MAX_URL_LEN
        && (text.starts_with("https://") || text.starts_with("http://"))
        && !text.ends_with('/')
        && text.bytes().all(|b| b.is_ascii_graphic());
    if ok { Ok(text.into()) } else { Err(LinkError::Field("relay URL")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::DeviceIdentity;
    use crate::util::SeededRng;

    fn bob() -> DeviceIdentity {
        DeviceIdentity::generate(&mut SeededRng::new([7; 32]))
    }

    fn mallory() -> DeviceIdentity {
        DeviceIdentity::generate(&mut SeededRng::new([9; 32]))
    }

    fn link_of(id: &DeviceIdentity) -> ContactLink {
        ContactLink {
            name: "Bob".into(),
            letagents: LetagentsEntry { address: id.address(), relay: "https://relay.example".into() },
            agent_mail: None,
            stringcup: Some(StringcupEntry {
                id: "sc-abcdefghijklmnopqrstuvwx".into(),
                relay: "https://relay.example".into(),
            }),
        }
    }

    /// Re-signs an arbitrary payload with `key`, as a forger holding their own key can.
    fn forge(payload: &str, key: &SigningKey) -> String {
        let sig = key.sign(&signed_bytes(payload.as_bytes()));
        format!("switchboard:sb1.{}.{}", b64u(payload.as_bytes()), b64u(&sig.to_bytes()))
    }

    #[test]
    fn signed_link_parses_back_with_one_safety_number() {
        let bob = bob();
        let link = link_of(&bob);
        let text = link.sign(&bob.sig).unwrap();
        assert!(text.starts_with("switchboard:sb1."));
        let back = ContactLink::parse(&text).unwrap();
        assert_eq!(back, link);
        assert_eq!(back.safety_number(), bob.keys().safety_number());
        // Without the scheme, with `//`, and with surrounding blanks.
        let body = text.strip_prefix("switchboard:").unwrap();
        assert_eq!(ContactLink::parse(body).unwrap(), link);
        assert_eq!(ContactLink::parse(&format!(" switchboard://{body}\n")).unwrap(), link);
    }

    fn mail_key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn mail_address(key: &SigningKey) -> MailAddress {
        use crate::protocol::agent_identity::AgentId;
        MailAddress { owner: AgentId::of(key), mailbox_id: crate::protocol::agent_mail::Id16([5; 16]), routes: vec![] }
    }

    #[test]
    fn an_agent_mail_address_bound_by_its_own_key_parses_back() {
        let bob = bob();
        let key = mail_key(1);
        let address = mail_address(&key);
        let mut link = link_of(&bob);
        link.agent_mail = Some((address.clone(), bind_agent_mail(&key, &bob.keys().sig, &address)));
        let back = ContactLink::parse(&link.sign(&bob.sig).unwrap()).unwrap();
        assert_eq!(back.agent_mail.map(|(a, _)| a), Some(address));
    }

    #[test]
    fn someone_elses_agent_mail_address_in_my_link_is_refused() {
        let (bob, mallory) = (bob(), mallory());
        let (bob_mail, mallory_mail) = (mail_key(1), mail_key(2));
        let bobs_address = mail_address(&bob_mail);
        // Mallory lists Bob's mailbox and binds it with her own Agent ID key: refused.
        let mut link = link_of(&mallory);
        link.agent_mail =
            Some((bobs_address.clone(), bind_agent_mail(&mallory_mail, &mallory.keys().sig, &bobs_address)));
        let forged = forge(&link.payload(), &mallory.sig);
        assert_eq!(ContactLink::parse(&forged), Err(LinkError::AgentMailNotBound));
        // Nor can she reuse the binding Bob made for his own link: it names Bob's identity.
        link.agent_mail = Some((bobs_address.clone(), bind_agent_mail(&bob_mail, &bob.keys().sig, &bobs_address)));
        let replayed = forge(&link.payload(), &mallory.sig);
        assert_eq!(ContactLink::parse(&replayed), Err(LinkError::AgentMailNotBound));
        assert_eq!(link.sign(&mallory.sig), Err(LinkError::AgentMailNotBound));
        // An `agent_mail` line without its binding is damaged, not accepted.
        let bare = link.payload().replace(&format!(" {}", b64u(&link.agent_mail.as_ref().unwrap().1)), "");
        assert!(matches!(ContactLink::parse(&forge(&bare, &mallory.sig)), Err(LinkError::Malformed(_))));
    }

    #[test]
    fn an_address_swapped_into_the_link_breaks_the_signature() {
        let bob = bob();
        let text = link_of(&bob).sign(&bob.sig).unwrap();
        let payload = String::from_utf8(
            b64u_decode(text.strip_prefix("switchboard:sb1.").unwrap().split('.').next().unwrap()).unwrap(),
        )
        .unwrap();
        let swapped = payload.replace("sc-abcdefghijklmnopqrstuvwx", "sc-mmmmmmmmmmmmmmmmmmmmmmmm");
        let sig = text.rsplit('.').next().unwrap();
        let tampered = format!("switchboard:sb1.{}.{sig}", b64u(swapped.as_bytes()));
        assert_eq!(ContactLink::parse(&tampered), Err(LinkError::BadSignature));
    }

    #[test]
    fn someone_elses_letagents_address_under_my_identity_is_refused() {
        let (bob, mallory) = (bob(), mallory());
        // Mallory signs with her key a link that routes to Bob's letagents mailbox.
        let mut link = link_of(&bob);
        link.letagents.address = bob.address();
        let payload = link.payload().replace(
            &format!("identity {}", b64u(&bob.keys().sig)),
            &format!("identity {}", b64u(&mallory.keys().sig)),
        );
        // The identity line now names Mallory; the letagents address still Bob's.
        let forged = forge(&payload, &mallory.sig);
        assert_eq!(ContactLink::parse(&forged), Err(LinkError::AddressNotSigned));
        // And `sign` refuses to make such a link in the first place.
        assert_eq!(link.sign(&mallory.sig), Err(LinkError::AddressNotSigned));
    }

    #[test]
    fn a_swapped_safety_number_is_refused() {
        let (bob, mallory) = (bob(), mallory());
        // Mallory's own link, showing Bob's safety number for people to compare.
        let payload = link_of(&mallory).payload().replace(&mallory.keys().safety_number(), &bob.keys().safety_number());
        let err = ContactLink::parse(&forge(&payload, &mallory.sig)).unwrap_err();
        assert!(matches!(err, LinkError::SafetyNumberMismatch { .. }), "{err:?}");
        assert!(err.to_string().contains("forged"));
    }

    #[test]
    fn unknown_versions_oversize_and_damage_are_told_apart() {
        let bob = bob();
        let text = link_of(&bob).sign(&bob.sig).unwrap();
        let v2 = text.replace("sb1.", "sb2.");
        assert_eq!(ContactLink::parse(&v2), Err(LinkError::UnknownVersion("sb2".into())));
        let long = format!("{text}{}", "A".repeat(MAX_LINK_LEN));
        assert!(matches!(ContactLink::parse(&long), Err(LinkError::TooLong(_))));
        assert_eq!(ContactLink::parse("la1.abc.def"), Err(LinkError::NotALink));
        assert_eq!(
            ContactLink::parse(&text[..text.len() - 3]),
            Err(LinkError::Malformed("signature is not 64 bytes of base64url"))
        );
        let no_sig = text.rsplit_once('.').unwrap().0;
        assert_eq!(ContactLink::parse(no_sig), Err(LinkError::Malformed("missing signature")));
    }

    #[test]
    fn extra_or_reordered_lines_are_refused_even_when_signed() {
        let bob = bob();
        let link = link_of(&bob);
        let extra = format!("{}evil 1\n", link.payload());
        assert!(matches!(ContactLink::parse(&forge(&extra, &bob.sig)), Err(LinkError::Malformed(_))));
        let dup = format!("{}stringcup sc-abcdefghijklmnopqrstuvwx https://relay.example\n", link.payload());
        assert!(matches!(ContactLink::parse(&forge(&dup, &bob.sig)), Err(LinkError::Malformed(_))));
        let bad_url = link.payload().replace("https://relay.example\nstringcup", "ftp://relay.example\nstringcup");
        assert_eq!(ContactLink::parse(&forge(&bad_url, &bob.sig)), Err(LinkError::Field("relay URL")));
        let control = link.payload().replace("name Bob", "name Bo\u{7}b");
        assert_eq!(ContactLink::parse(&forge(&control, &bob.sig)), Err(LinkError::Field("name")));
    }
}
