//! Stringcup v2 JSON, in one place for both sides of the relay API:
//!
//! - [`client`]: what Switchboard's client sends and the lenient reading of the relay's answers
//!   (re-exported here, as the engine and transport use it);
//! - [`relay`]: what relay-lite reads (strict) and answers (complete);
//! - the shapes of the relay-issued strings both sides check.
//!
//! The tests below feed every relay answer to the client's reader and every client request to the
//! relay's, so the two views cannot drift apart unnoticed.

pub mod client;
pub mod relay;

pub use client::*;

/// Whether `text` is `prefix` and then exactly `len` lower-case base32 characters (`a`-`z`,
/// `2`-`7`): the shape of every string a Stringcup relay issues.
fn has_shape(text: &str, prefix: &str, len: usize) -> bool {
    text.strip_prefix(prefix).is_some_and(|rest| {
        rest.len() == len && rest.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

/// Whether `text` has the shape of an assigned identity id: `sc-` and 24 lower-case base32
/// characters (120 bits, B.1.1).
pub fn is_identity_id(text: &str) -> bool {
    has_shape(text, "sc-", 24)
}

/// Whether `text` has the shape of an issued rendezvous token: `rv-` and 32 base32 characters
/// (160 bits, B.6.1), lower case as ids are.
pub fn is_rendezvous_token(text: &str) -> bool {
    has_shape(text, "rv-", 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stringcup::crypto::Header;

    #[test]
    fn issued_strings_have_one_shape_on_both_sides() {
        assert!(is_identity_id("sc-cucxeqysmwr2a45nzo34h6lz"));
        assert!(!is_identity_id("sc-CUCXEQYSMWR2A45NZO34H6LZ"));
        assert!(!is_identity_id("sc-cucxeqysmwr2a45nzo34h6l"));
        assert!(!is_identity_id("sc-cucxeqysmwr2a45nzo34h6l1"), "1 is not base32");
        assert!(!is_identity_id("bob"));
        assert!(is_rendezvous_token(&format!("rv-{}", "a2".repeat(16))));
        assert!(!is_rendezvous_token(&format!("rv-{}", "A".repeat(32))));
        assert!(!is_rendezvous_token(&format!("rv-{}", "9".repeat(32))), "9 is not base32");
        assert!(!is_rendezvous_token("rv-short"));
    }

    fn identity(id: &str) -> relay::IdentityOut {
        relay::IdentityOut {
            id: id.into(),
            identity_public_key: "ssZ6QL5hX0NQkCEOqIHYR4wtTCYsMyEKd5XY9VTg23o=".into(),
            algo: "x25519".into(),
            display_name: Some("bob".into()),
            fingerprint: "sha256:JLv6MQ0Yw8JV_Cv64fmVTyXN8p0V5v5BF22BaLbTcLo".into(),
            fingerprint_short: "24bb-fa31-0d18-c3c2".into(),
            key_updated_at: "2026-03-24 12:00:00".into(),
            created_at: "2026-03-24 12:00:00".into(),
        }
    }

    /// The relay's answer, as JSON text, read back by the client's type.
    fn read<T: serde::de::DeserializeOwned>(answer: &impl serde::Serialize) -> T {
        let text = serde_json::to_string(answer).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("the client cannot read {text}: {e}"))
    }

    #[test]
    fn the_client_reads_every_answer_the_relay_gives() {
        let bob = "sc-cucxeqysmwr2a45nzo34h6lz";
        let r: RegisteredIn =
            read(&relay::Registered { identity: identity(bob), id_assigned: true, api_token: "sct-x".into() });
        assert_eq!((r.id.as_str(), r.api_token.as_str()), (bob, "sct-x"));
        let i: IdentityIn = read(&identity(bob));
        assert_eq!(i.identity_public_key, identity(bob).identity_public_key);
        assert_eq!(i.display_name.as_deref(), Some("bob"));

        let sent: SentIn =
            read(&relay::SentOut { sent_seq: 7, status: "stored".into(), idempotent_replay: Some(true) });
        assert_eq!((sent.sent_seq, sent.idempotent_replay), (7, true));
        let first: SentIn = read(&relay::SentOut { sent_seq: 8, status: "stored".into(), idempotent_replay: None });
        assert!(!first.idempotent_replay);

        let header = relay::HeaderOut {
            version: 2,
            algo: "x25519+ecies+aes256gcm".into(),
            ephemeral_pub: "ssZ6QL5hX0NQkCEOqIHYR4wtTCYsMyEKd5XY9VTg23o=".into(),
            iv: "AAAAAAAAAAAAAAAA".into(),
            extra: [("purpose".to_owned(), "pairing".to_owned())].into(),
        };
        let page: InboxPageIn = read(&relay::InboxOut {
            messages: vec![relay::MessageOut {
                id: 42,
                sender_id: bob.into(),
                recipient_id: "sc-ehesjoivpfaf2mv44mzbj2zc".into(),
                header: header.clone(),
                ciphertext: "Y2lwaGVy".into(),
                created_at: "2026-03-24 12:00:00".into(),
            }],
            count: 1,
            has_more: true,
            next_since_id: Some(42),
        });
        let [m] = page.messages.as_slice() else { panic!("one message") };
        assert!(page.has_more);
        assert_eq!((m.id, m.sender_id.as_str(), m.ciphertext.as_str()), (42, bob, "Y2lwaGVy"));
        assert_eq!(
            (m.header.ephemeral_pub.as_str(), m.header.iv.as_str()),
            (header.ephemeral_pub.as_str(), header.iv.as_str())
        );

        let ack: AckIn = read(&relay::AckOut {
            status: "acknowledged".into(),
            acknowledged: vec![42, 43],
            not_found: vec![44],
            count: 2,
        });
        assert_eq!((ack.acknowledged, ack.not_found), (vec![42, 43], vec![44]));

        let rv: RendezvousIn = read(&relay::RendezvousOut {
            status: "paired".into(),
            token: None,
            role: "initiator".into(),
            my_id: "sc-ehesjoivpfaf2mv44mzbj2zc".into(),
            peer_id: Some(bob.into()),
            peer_identity_public_key: Some(identity(bob).identity_public_key),
            peer_fingerprint: Some(identity(bob).fingerprint),
            peer_fingerprint_short: Some(identity(bob).fingerprint_short),
            expires_at: "2026-03-24 12:15:00".into(),
        });
        assert_eq!(
            (rv.status.as_str(), rv.role.as_deref(), rv.peer_id.as_deref()),
            ("paired", Some("initiator"), Some(bob))
        );
        assert_eq!(rv.peer_identity_public_key, Some(identity(bob).identity_public_key));

        let token: TokenInfoIn = read(&relay::TokenOut {
            identity_id: bob.into(),
            created_at: String::new(),
            last_used_at: String::new(),
            expires_at: String::new(),
            expires_in_seconds: 2_591_000,
            inactivity_ttl_days: 30,
            inactivity_ttl_seconds: 2_592_000,
        });
        assert_eq!(token.expires_in_seconds, 2_591_000);
        let rotated: RotatedIn = read(&relay::RotatedOut {
            identity_id: bob.into(),
            api_token: "sct-new".into(),
            created_at: String::new(),
            expires_at: String::new(),
            previous_token: "revoked".into(),
        });
        assert_eq!(rotated.api_token, "sct-new");

        let batch: BatchIn = read(&relay::BatchOut {
            status: "processed".into(),
            sent: vec![relay::BatchSent { index: 0, recipient_id: bob.into(), sent_seq: 42 }],
            failed: vec![relay::BatchFailed {
                index: 1,
                recipient_id: None,
                error: "Recipient identity not found".into(),
                code: "not_found".into(),
                status: 404,
            }],
            count: 1,
        });
        assert_eq!((batch.sent[0].index, batch.failed[0].index), (0, 1));
        assert_eq!(batch.failed[0].error, "Recipient identity not found");

        let topic = || relay::TopicOut {
            id: "tp-x".into(),
            owner_id: bob.into(),
            role: "owner".into(),
            is_owner: true,
            member_count: 2,
            created_at: String::new(),
        };
        let topics: TopicsIn = read(&relay::TopicsOut { topics: vec![topic()], count: 1 });
        assert_eq!((topics.topics[0].id.as_str(), topics.topics[0].member_count), ("tp-x", 2));
        let roster: RosterIn = read(&relay::RosterOut {
            id: "tp-x".into(),
            owner_id: bob.into(),
            created_at: String::new(),
            members: vec![relay::MemberOut { identity: identity(bob), role: "owner".into() }],
            count: 1,
        });
        assert_eq!(roster.members[0].id, bob);
        let added: MembersAddedIn = read(&relay::MembersOut {
            topic_id: "tp-x".into(),
            added: vec!["sc-ehesjoivpfaf2mv44mzbj2zc".into()],
            already_member: vec![bob.into()],
            unknown: vec![],
            member_count: 2,
        });
        assert_eq!((added.added.len(), added.already_member.len(), added.unknown.len()), (1, 1, 0));
    }

    #[test]
    fn the_relay_reads_every_request_the_client_sends() {
        let register = Register {
            identity_public_key: "ssZ6QL5hX0NQkCEOqIHYR4wtTCYsMyEKd5XY9VTg23o=",
            algo: "x25519",
            display_name: Some("alice"),
        };
        let r: relay::RegisterIn = read(&register);
        assert_eq!((r.algo.as_deref(), r.display_name.as_deref()), (Some("x25519"), Some("alice")));

        let out = Outgoing {
            recipient_id: "sc-cucxeqysmwr2a45nzo34h6lz".into(),
            header: Header {
                version: 2,
                algo: "x25519+ecies+aes256gcm".into(),
                ephemeral_pub: "ssZ6QL5hX0NQkCEOqIHYR4wtTCYsMyEKd5XY9VTg23o=".into(),
                iv: "AAAAAAAAAAAAAAAA".into(),
            },
            ciphertext: "Y2lwaGVy".into(),
        };
        // `deny_unknown_fields` on the relay's side: a field the client added would fail here.
        let m: relay::MessageIn = read(&out);
        assert_eq!(
            (m.recipient_id.as_str(), m.header.version, m.ciphertext.as_str()),
            (out.recipient_id.as_str(), 2, "Y2lwaGVy")
        );
        assert!(m.header.extra.is_empty() && m.sender_id.is_none());
    }
}
