//! The ASNET/1 client side, sans-io: a mail in the user's own mailbox becomes a checked service
//! reply, and a challenge is judged against what this profile asked for.
//!
//! - [`read_reply`]: the mail must come from the service mailbox (the one `From:`), be plain text
//!   and carry an `X-ASNET-Response-ID` equal to the body's `responseId`; the body is one strict
//!   JSON object (duplicate keys refused, as for commands) of a known `type` with exactly its
//!   fields, parsed into the service's own [`ReplyBody`];
//! - [`judge_challenge`]: the owner in the loop. A `VERIFY` may only ever answer a challenge
//!   whose `action` is exactly a command this profile sent and has not yet had verified; anything
//!   else (an unsolicited challenge, a changed action, a second challenge for the same request)
//!   is a warning and is never answered. Approval by the owner comes on top of this rule, it
//!   never replaces it.
//!
//! Deduplication by response id, storage and I/O belong to the engine.

use serde_json::Value as Json;

use super::command::{Action, Command};
use super::mime::{Refusal, reply_parts};
use super::service::{PublicMember, ReplyBody};
use super::{ChallengeId, Code, FormatError, Mailbox, MemberId, PROTOCOL, RequestId, ResponseId, Scope, Scopes};
use crate::protocol::agent_identity::json;

/// Largest reply body parsed (a connection list of a few hundred members).
pub const MAX_REPLY_BODY_BYTES: usize = 128 * 1024;

/// Why a mail is not a service reply this client accepts. The sender's fault (or a forger's);
/// the engine records it and never answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The mail itself is malformed or not plain text.
    #[error("not a well-formed plain-text mail: {0}")]
    Mail(#[from] Refusal),
    /// `From:` is not the service mailbox.
    #[error("not from the service address (from {0})")]
    NotFromService(String),
    /// `X-ASNET-Response-ID` is missing or not `rsp_` + 32 hex.
    #[error("no valid X-ASNET-Response-ID header")]
    MissingResponseId,
    /// The header and the body's `responseId` differ.
    #[error("X-ASNET-Response-ID does not match the body's responseId")]
    ResponseIdMismatch,
    /// The body exceeds [`MAX_REPLY_BODY_BYTES`].
    #[error("reply body too large")]
    TooLarge,
    /// Not strict JSON (includes duplicate keys).
    #[error("reply body is not strict JSON: {0}")]
    Json(#[from] json::JsonError),
    /// `protocol` is not `ASNET/1`.
    #[error("unsupported protocol version")]
    UnsupportedProtocol,
    /// `type` is not one of the eight reply types.
    #[error("unknown reply type")]
    UnknownType,
    /// A field is missing, of the wrong type, or not allowed for the type.
    #[error("reply field {0} is missing, malformed or not allowed")]
    Field(&'static str),
    /// An identifier, code or scope has the wrong format.
    #[error("{0}")]
    Format(#[from] FormatError),
}

/// A checked service reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyIn {
    /// Its stable id (deduplicate on it).
    pub response_id: ResponseId,
    /// Its content.
    pub body: ReplyBody,
}

/// Reads one raw mail from the user's mailbox as a reply of `service`.
pub fn read_reply(raw: &[u8], service: &Mailbox) -> Result<ReplyIn, ReplyError> {
    let parts = reply_parts(raw)?;
    if parts.from != *service {
        return Err(ReplyError::NotFromService(parts.from.to_string()));
    }
    let header_id =
        parts.response_id.as_deref().and_then(|id| ResponseId::parse(id).ok()).ok_or(ReplyError::MissingResponseId)?;
    let reply = parse_reply_body(parts.body.as_bytes())?;
    if reply.response_id != header_id {
        return Err(ReplyError::ResponseIdMismatch);
    }
    Ok(reply)
}

/// Parses a reply body (the JSON object the service renders with `Reply::to_json`).
pub fn parse_reply_body(body: &[u8]) -> Result<ReplyIn, ReplyError> {
    if body.len() > MAX_REPLY_BODY_BYTES {
        return Err(ReplyError::TooLarge);
    }
    // Strict first: duplicate keys (escaped or not) and trailing data are refused.
    json::parse(body)?;
    let v: Json = serde_json::from_slice(body).map_err(|_| ReplyError::Field("body"))?;
    let obj = v.as_object().ok_or(ReplyError::Field("body"))?;
    match obj.get("protocol").and_then(Json::as_str) {
        Some(PROTOCOL) => {}
        Some(_) => return Err(ReplyError::UnsupportedProtocol),
        None => return Err(ReplyError::Field("protocol")),
    }
    let kind = obj.get("type").and_then(Json::as_str).ok_or(ReplyError::Field("type"))?;
    let response_id = ResponseId::parse(str_field(obj, "responseId")?)?;
    let only = |allowed: &[&str]| -> Result<(), ReplyError> {
        if obj.keys().all(|k| matches!(k.as_str(), "protocol" | "type" | "responseId") || allowed.contains(&k.as_str()))
        {
            Ok(())
        } else {
            Err(ReplyError::Field("unexpected field"))
        }
    };
    let body = match kind {
        "CHALLENGE" => {
            only(&["challengeId", "code", "expiresAt", "action"])?;
            let action_json = obj.get("action").ok_or(ReplyError::Field("action"))?;
            let action = match Command::parse(action_json.to_string().as_bytes()) {
                Ok(Command::Protected(a)) => a,
                _ => return Err(ReplyError::Field("action")),
            };
            ReplyBody::Challenge {
                challenge_id: ChallengeId::parse(str_field(obj, "challengeId")?)?,
                code: Code::parse(str_field(obj, "code")?)?,
                expires_at: int_field(obj, "expiresAt")?,
                action,
            }
        }
        "REGISTERED" => {
            only(&["memberId", "discovery", "marker"])?;
            let member_id = MemberId::parse(str_field(obj, "memberId")?)?;
            let discovery = obj.get("discovery").and_then(Json::as_bool).ok_or(ReplyError::Field("discovery"))?;
            let marker = obj.get("marker").ok_or(ReplyError::Field("marker"))?;
            let expected = if discovery { Json::from(member_id.marker()) } else { Json::Null };
            if *marker != expected {
                return Err(ReplyError::Field("marker"));
            }
            ReplyBody::Registered { member_id, discovery }
        }
        "LOOKUP" => {
            only(&["memberId", "member"])?;
            let member_id = MemberId::parse(str_field(obj, "memberId")?)?;
            let member = match obj.get("member") {
                Some(Json::Null) => None,
                Some(Json::Object(m)) => {
                    if !m.keys().all(|k| k == "memberId" || k == "marker") {
                        return Err(ReplyError::Field("member"));
                    }
                    let id = MemberId::parse(str_field(m, "memberId")?)?;
                    let marker = match m.get("marker") {
                        Some(Json::Null) => None,
                        Some(Json::String(s)) if *s == id.marker() => Some(s.clone()),
                        _ => return Err(ReplyError::Field("marker")),
                    };
                    Some(PublicMember { member_id: id, marker })
                }
                _ => return Err(ReplyError::Field("member")),
            };
            ReplyBody::Lookup { member_id, member }
        }
        "CONNECTION_REQUESTED" => {
            only(&["requestId", "memberId", "scopes", "expiresAt"])?;
            ReplyBody::ConnectionRequested {
                request_id: RequestId::parse(str_field(obj, "requestId")?)?,
                member_id: MemberId::parse(str_field(obj, "memberId")?)?,
                scopes: scopes_field(obj.get("scopes"))?,
                expires_at: int_field(obj, "expiresAt")?,
            }
        }
        "INVITATION" => {
            only(&["requestId", "fromMemberId", "scopes", "expiresAt"])?;
            ReplyBody::Invitation {
                request_id: RequestId::parse(str_field(obj, "requestId")?)?,
                from_member_id: MemberId::parse(str_field(obj, "fromMemberId")?)?,
                scopes: scopes_field(obj.get("scopes"))?,
                expires_at: int_field(obj, "expiresAt")?,
            }
        }
        "CONNECTED" => {
            only(&["requestId", "memberId", "scopes"])?;
            ReplyBody::Connected {
                request_id: RequestId::parse(str_field(obj, "requestId")?)?,
                member_id: MemberId::parse(str_field(obj, "memberId")?)?,
                scopes: scopes_field(obj.get("scopes"))?,
            }
        }
        "CONNECTIONS" => {
            only(&["connections"])?;
            let items = obj.get("connections").and_then(Json::as_array).ok_or(ReplyError::Field("connections"))?;
            let mut connections = Vec::with_capacity(items.len());
            for item in items {
                let m = item.as_object().ok_or(ReplyError::Field("connections"))?;
                if !m.keys().all(|k| k == "memberId" || k == "scopes") {
                    return Err(ReplyError::Field("connections"));
                }
                connections.push((MemberId::parse(str_field(m, "memberId")?)?, scopes_field(m.get("scopes"))?));
            }
            ReplyBody::Connections { connections }
        }
        "DISCONNECTED" => {
            only(&["memberId"])?;
            ReplyBody::Disconnected { member_id: MemberId::parse(str_field(obj, "memberId")?)? }
        }
        _ => return Err(ReplyError::UnknownType),
    };
    Ok(ReplyIn { response_id, body })
}

fn str_field<'a>(obj: &'a serde_json::Map<String, Json>, key: &'static str) -> Result<&'a str, ReplyError> {
    obj.get(key).and_then(Json::as_str).ok_or(ReplyError::Field(key))
}

fn int_field(obj: &serde_json::Map<String, Json>, key: &'static str) -> Result<i64, ReplyError> {
    obj.get(key).and_then(Json::as_i64).ok_or(ReplyError::Field(key))
}

fn scopes_field(v: Option<&Json>) -> Result<Scopes, ReplyError> {
    let items = v.and_then(Json::as_array).ok_or(ReplyError::Field("scopes"))?;
    if items.len() > Scope::ALL.len() {
        return Err(ReplyError::Field("scopes"));
    }
    let scopes = items
        .iter()
        .map(|s| s.as_str().ok_or(ReplyError::Field("scopes")).and_then(|s| Ok(Scope::parse(s)?)))
        .collect::<Result<Vec<_>, _>>()?;
    Scopes::new(scopes).ok_or(ReplyError::Field("scopes"))
}

/// A command this profile sent and still expects a challenge for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskedFor<K> {
    /// The caller's handle for it (a row id).
    pub key: K,
    /// The exact action sent.
    pub action: Action,
}

/// What to do with a challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChallengeVerdict<K> {
    /// The action is exactly the one this profile asked for under `key`: show it to the owner,
    /// who may approve the `VERIFY`.
    AskOwner {
        /// The matching request.
        key: K,
    },
    /// Nothing this profile asked for has this action: record a warning, never answer.
    Unsolicited,
}

/// Judges a challenge's `action` against the commands this profile sent that still wait for a
/// challenge. Only an exact match (same command, same ids, same scopes in the same order) is
/// answerable; the first such request (oldest first, as the caller orders them) is used.
pub fn judge_challenge<K: Clone>(asked: &[AskedFor<K>], action: &Action) -> ChallengeVerdict<K> {
    match asked.iter().find(|a| a.action == *action) {
        Some(a) => ChallengeVerdict::AskOwner { key: a.key.clone() },
        None => ChallengeVerdict::Unsolicited,
    }
}

/// The plain-text command mail a client sends: `From` is the user's mailbox, `To` the service,
/// no `Auto-Submitted` (a deliberate command), the body one JSON object.
pub fn render_command(command: &Command, from: &Mailbox, service: &Mailbox, now_ms: i64, message_id: &str) -> Vec<u8> {
    let date = super::mime::rfc5322_date(now_ms);
    let mut out = String::with_capacity(512);
    for (name, value) in [
        ("From", from.as_str()),
        ("To", service.as_str()),
        ("Subject", "ASNET/1 command"),
        ("Date", date.as_str()),
        ("Message-ID", &format!("<{message_id}@{}>", from.domain())),
        ("MIME-Version", "1.0"),
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Transfer-Encoding", "7bit"),
    ] {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&command.to_body());
    out.push_str("\r\n");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::protocol::asnet::mime::render_reply;
    use crate::protocol::asnet::outbox::Entry;
    use crate::protocol::asnet::service::Reply;

    const SERVICE: &str = "network@example.test";
    const MEM: &str = "mem_0123456789abcdef0123456789abcdef";
    const MEM2: &str = "mem_fedcba9876543210fedcba9876543210";

    fn service() -> Mailbox {
        Mailbox::parse(SERVICE).unwrap()
    }

    fn connect(member: &str, scopes: &[Scope]) -> Action {
        Action::Connect { member_id: MemberId::parse(member).unwrap(), scopes: Scopes::new(scopes.to_vec()).unwrap() }
    }

    fn challenge_mail(action: Action) -> (Vec<u8>, Reply) {
        let reply = Reply {
            response_id: ResponseId([7; 16]),
            to: Mailbox::parse("alice@example.net").unwrap(),
            body: ReplyBody::Challenge {
                challenge_id: ChallengeId([1; 16]),
                code: Code::parse("0123456789abcdef0123456789abcdef").unwrap(),
                expires_at: 1_000,
                action,
            },
            created_at: 0,
            expires_at: 1,
        };
        let entry = Entry::from_reply(&reply);
        (render_reply(&entry, &service(), 0), reply)
    }

    #[test]
    fn a_rendered_service_reply_reads_back_as_the_same_reply() {
        let (raw, reply) = challenge_mail(connect(MEM, &[Scope::ProfileBasic, Scope::ContactEmail]));
        let got = read_reply(&raw, &service()).unwrap();
        assert_eq!(got.response_id, reply.response_id);
        assert_eq!(got.body, reply.body);
    }

    #[test]
    fn a_reply_not_from_the_service_address_is_refused() {
        let (raw, _) = challenge_mail(Action::ListConnections);
        let forged = String::from_utf8(raw).unwrap().replace("From: network@", "From: mallory@");
        assert!(matches!(read_reply(forged.as_bytes(), &service()), Err(ReplyError::NotFromService(_))));
    }

    #[test]
    fn a_reply_whose_header_and_body_response_ids_differ_is_refused() {
        let (raw, _) = challenge_mail(Action::ListConnections);
        let rid = ResponseId([7; 16]).to_string();
        let other = ResponseId([8; 16]).to_string();
        let text = String::from_utf8(raw).unwrap().replacen(
            &format!("X-ASNET-Response-ID: {rid}"),
            &format!("X-ASNET-Response-ID: {other}"),
            1,
        );
        assert_eq!(read_reply(text.as_bytes(), &service()), Err(ReplyError::ResponseIdMismatch));
        let without = String::from_utf8(challenge_mail(Action::ListConnections).0).unwrap().replacen(
            &format!("X-ASNET-Response-ID: {rid}\r\n"),
            "",
            1,
        );
        assert_eq!(read_reply(without.as_bytes(), &service()), Err(ReplyError::MissingResponseId));
    }

    #[test]
    fn malformed_reply_bodies_are_refused() {
        let rid = ResponseId([7; 16]).to_string();
        let cases = [
            format!(
                r#"{{"protocol":"ASNET/1","type":"DISCONNECTED","responseId":"{rid}","memberId":"{MEM}","memberId":"{MEM2}"}}"#
            ),
            format!(r#"{{"protocol":"ASNET/2","type":"DISCONNECTED","responseId":"{rid}","memberId":"{MEM}"}}"#),
            format!(r#"{{"protocol":"ASNET/1","type":"PWNED","responseId":"{rid}"}}"#),
            format!(
                r#"{{"protocol":"ASNET/1","type":"DISCONNECTED","responseId":"{rid}","memberId":"{MEM}","note":"x"}}"#
            ),
            format!(
                r#"{{"protocol":"ASNET/1","type":"CONNECTED","responseId":"{rid}","requestId":"req_00","memberId":"{MEM}","scopes":["contact:email"]}}"#
            ),
            format!(
                r#"{{"protocol":"ASNET/1","type":"CHALLENGE","responseId":"{rid}","challengeId":"chl_0123456789abcdef0123456789abcdef","code":"0123456789abcdef0123456789abcdef","expiresAt":1,"action":{{"protocol":"ASNET/1","command":"VERIFY","challengeId":"chl_0123456789abcdef0123456789abcdef","code":"0123456789abcdef0123456789abcdef"}}}}"#
            ),
            "not json".to_owned(),
        ];
        for body in cases {
            assert!(parse_reply_body(body.as_bytes()).is_err(), "{body}");
        }
    }

    #[test]
    fn only_a_challenge_for_an_action_this_profile_asked_for_is_put_to_the_owner() {
        let asked = vec![
            AskedFor { key: 1, action: Action::Register { discovery: Some(true) } },
            AskedFor { key: 2, action: connect(MEM, &[Scope::ContactEmail, Scope::ProfileBasic]) },
        ];
        assert_eq!(
            judge_challenge(&asked, &Action::Register { discovery: Some(true) }),
            ChallengeVerdict::AskOwner { key: 1 }
        );
        assert_eq!(
            judge_challenge(&asked, &connect(MEM, &[Scope::ContactEmail, Scope::ProfileBasic])),
            ChallengeVerdict::AskOwner { key: 2 }
        );
    }

    #[test]
    fn a_challenge_whose_action_differs_from_the_request_is_unsolicited() {
        let asked = vec![AskedFor { key: 1, action: connect(MEM, &[Scope::ContactEmail]) }];
        // Another member, more scopes, another discovery choice, another command: never answered.
        for action in [
            connect(MEM2, &[Scope::ContactEmail]),
            connect(MEM, &[Scope::ContactEmail, Scope::ProfileBasic]),
            Action::Register { discovery: Some(true) },
            Action::Register { discovery: None },
            Action::Disconnect { member_id: MemberId::parse(MEM).unwrap() },
            Action::ListConnections,
        ] {
            assert_eq!(judge_challenge(&asked, &action), ChallengeVerdict::Unsolicited, "{action:?}");
        }
    }

    #[test]
    fn a_challenge_with_nothing_asked_for_is_unsolicited() {
        assert_eq!(judge_challenge::<i64>(&[], &Action::ListConnections), ChallengeVerdict::Unsolicited);
    }

    #[test]
    fn a_command_mail_passes_the_services_own_mime_adapter() {
        use crate::protocol::asnet::mime::{Policy, SmtpEnvelope, adapt};
        let from = Mailbox::parse("alice@example.net").unwrap();
        let cmd = Command::Protected(Action::Register { discovery: Some(false) });
        let mail = render_command(&cmd, &from, &service(), 0, "abc");
        // What the trusted MTA adds in front.
        let mut raw = b"Received: from x by mx.example.test (Postfix) with ESMTP id 4ABCDEF\r\n\
            Authentication-Results: mx.example.test; spf=pass smtp.mailfrom=alice@example.net;\r\n dkim=pass header.d=example.net; dmarc=pass header.from=example.net\r\n"
            .to_vec();
        raw.extend_from_slice(&mail);
        let policy = Policy { service: service(), authserv_id: "mx.example.test".into() };
        let rcpt = [SERVICE.to_owned()];
        let env = adapt(&raw, SmtpEnvelope { mail_from: "alice@example.net", rcpt_to: &rcpt }, &policy).unwrap();
        assert_eq!(Command::parse(env.body.as_bytes()).unwrap(), cmd);
    }
}
