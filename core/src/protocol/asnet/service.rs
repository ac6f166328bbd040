//! The ASNET/1 service state machine: one trusted envelope in, `processed | ignored | rejected`
//! with a reason and an outbox of replies out.
//!
//! Order of checks in [`receive`] (each stage named by its [`Reason`]):
//! 1. the envelope's shape (delivery id, bare sender and recipient), the recipient is the service
//!    mailbox; self-sent mail and automatic mail (`Auto-Submitted` other than `no`) are dropped;
//! 2. a delivery id seen in the last 24 h is dropped with no reply;
//! 3. the per-sender and global rolling-hour budgets; an admitted attempt is counted and its
//!    delivery id remembered before the body is even parsed (so malformed bodies and failed
//!    verifications are deduplicated too). Refused-by-budget mail is not remembered: that keeps
//!    both tables bounded by the budgets, and a redelivery later is one more counted attempt;
//! 4. the strict command codec;
//! 5. `LOOKUP` answers at once; protected commands are checked against current state and, if
//!    they could run, answered only with a challenge; `VERIFY` redeems a challenge from its bound
//!    mailbox, marks it consumed, then rechecks and runs the stored action.
//!
//! Rejections never produce mail. Replies carry a fresh `rsp_` id and expire after 15 minutes.

use serde_json::{Value as Json, json};

use super::command::{Action, Command, CommandError};
use super::store::{Challenge, ChallengeState, Edge, Member, Offer, Pair, Store};
use super::{
    BUDGET_WINDOW_MS, CHALLENGE_TTL_MS, ChallengeId, Code, DELIVERY_DEDUP_MS, DeliveryId, MAX_WRONG_GUESSES, Mailbox,
    MemberId, OFFER_TTL_MS, PROTOCOL, REPLY_TTL_MS, RequestId, ResponseId, Scopes,
};
use crate::util::Rng;

/// Inbound budgets per rolling hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Admitted attempts per sender mailbox (the seed: 30).
    pub per_sender: u32,
    /// Admitted attempts from everyone (the seed: 1,000).
    pub global: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self { per_sender: 30, global: 1000 }
    }
}

/// The service's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The service mailbox (the only accepted recipient; mail from it is dropped).
    pub service: Mailbox,
    /// Inbound budgets.
    pub limits: Limits,
}

impl Config {
    /// The seed's default budgets for `service`.
    pub fn new(service: Mailbox) -> Self {
        Self { service, limits: Limits::default() }
    }
}

/// What the trusted transport adapter hands the core for one inbound mail (the seed's synthetic
/// envelope, camelCase on the wire). Untrusted until checked: the sender stays untrusted until a
/// challenge is redeemed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvelopeIn {
    /// The bare ASCII sender mailbox.
    pub sender: String,
    /// The actual recipient.
    pub recipient: String,
    /// The provider-controlled unique delivery id.
    pub delivery_id: String,
    /// The `Auto-Submitted` value, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_submitted: Option<String>,
    /// The decoded body.
    pub body: String,
}

/// The result class of one `receive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The command ran (a challenge was issued, a lookup answered, or a verified action done).
    Processed,
    /// Dropped silently by design (self-sent, automatic, duplicate delivery).
    Ignored,
    /// Refused; no mail is sent.
    Rejected,
}

/// Why an envelope was ignored or rejected (for the trusted adapter and operator only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The adapter supplied a malformed delivery id, sender or recipient (the adapter's fault).
    InvalidEnvelope,
    /// The recipient is not the service mailbox.
    WrongRecipient,
    /// The sender is the service mailbox itself.
    SelfSent,
    /// `Auto-Submitted` is present and not `no`.
    AutoSubmitted,
    /// The delivery id was seen in the last 24 hours.
    DuplicateDelivery,
    /// The sender used its 30 attempts of the rolling hour.
    SenderRateLimited,
    /// The service used its 1,000 attempts of the rolling hour.
    GlobalRateLimited,
    /// The body is not a valid command.
    MalformedCommand,
    /// `protocol` names another version (fails closed).
    UnsupportedProtocol,
    /// The caller's mailbox has no member.
    NotRegistered,
    /// The target member does not exist.
    UnknownMember,
    /// A member cannot connect to or disconnect from itself.
    SelfConnection,
    /// The pair is already connected.
    AlreadyConnected,
    /// An offer between the pair, either direction, is pending.
    RequestPending,
    /// No offer has this request id (accepted, cancelled, expired and swept, or never issued).
    UnknownRequest,
    /// The offer expired.
    OfferExpired,
    /// The caller is not the invitee.
    NotInvitee,
    /// The accepted scopes are not a subset of the offer's.
    ScopesNotSubset,
    /// No challenge has this id.
    UnknownChallenge,
    /// The challenge is bound to another mailbox.
    WrongMailbox,
    /// The challenge expired.
    ChallengeExpired,
    /// The challenge was already redeemed.
    ChallengeConsumed,
    /// The challenge took five wrong guesses.
    ChallengeLocked,
    /// The code is wrong (counted).
    WrongCode,
}

impl Reason {
    /// The stable code.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidEnvelope => "INVALID_ENVELOPE",
            Reason::WrongRecipient => "WRONG_RECIPIENT",
            Reason::SelfSent => "SELF_SENT",
            Reason::AutoSubmitted => "AUTO_SUBMITTED",
            Reason::DuplicateDelivery => "DUPLICATE_DELIVERY",
            Reason::SenderRateLimited => "SENDER_RATE_LIMITED",
            Reason::GlobalRateLimited => "GLOBAL_RATE_LIMITED",
            Reason::MalformedCommand => "MALFORMED_COMMAND",
            Reason::UnsupportedProtocol => "UNSUPPORTED_PROTOCOL",
            Reason::NotRegistered => "NOT_REGISTERED",
            Reason::UnknownMember => "UNKNOWN_MEMBER",
            Reason::SelfConnection => "SELF_CONNECTION",
            Reason::AlreadyConnected => "ALREADY_CONNECTED",
            Reason::RequestPending => "REQUEST_PENDING",
            Reason::UnknownRequest => "UNKNOWN_REQUEST",
            Reason::OfferExpired => "OFFER_EXPIRED",
            Reason::NotInvitee => "NOT_INVITEE",
            Reason::ScopesNotSubset => "SCOPES_NOT_SUBSET",
            Reason::UnknownChallenge => "UNKNOWN_CHALLENGE",
            Reason::WrongMailbox => "WRONG_MAILBOX",
            Reason::ChallengeExpired => "CHALLENGE_EXPIRED",
            Reason::ChallengeConsumed => "CHALLENGE_CONSUMED",
            Reason::ChallengeLocked => "CHALLENGE_LOCKED",
            Reason::WrongCode => "WRONG_CODE",
        }
    }
}

impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A member's public metadata: its id and, when discovery is on, its marker. Never a mailbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicMember {
    /// The member id.
    pub member_id: MemberId,
    /// `agent-society:v1:<memberId>` when the member chose discovery.
    pub marker: Option<String>,
}

/// The data of one reply, by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyBody {
    /// A challenge for the exact action, to the sender's mailbox.
    Challenge {
        /// The challenge to redeem.
        challenge_id: ChallengeId,
        /// The code (this reply is its only copy; the store keeps a hash).
        code: Code,
        /// Unix ms.
        expires_at: i64,
        /// The exact command it authorizes.
        action: Action,
    },
    /// The verified mailbox's stable member id and discovery choice.
    Registered {
        /// The member id.
        member_id: MemberId,
        /// The discovery choice now in force.
        discovery: bool,
    },
    /// A public lookup: the queried id and the member, or none.
    Lookup {
        /// The id asked for.
        member_id: MemberId,
        /// Minimal public metadata, or `None` (null) when no such member exists.
        member: Option<PublicMember>,
    },
    /// To the proposer: the offer is stored.
    ConnectionRequested {
        /// The offer.
        request_id: RequestId,
        /// The invitee.
        member_id: MemberId,
        /// The proposed scopes.
        scopes: Scopes,
        /// Unix ms.
        expires_at: i64,
    },
    /// To the invitee: an offer it may accept with a subset of the scopes.
    Invitation {
        /// The offer.
        request_id: RequestId,
        /// The proposer.
        from_member_id: MemberId,
        /// The proposed scopes.
        scopes: Scopes,
        /// Unix ms.
        expires_at: i64,
    },
    /// To both members: the edge exists.
    Connected {
        /// The accepted offer.
        request_id: RequestId,
        /// The other member.
        member_id: MemberId,
        /// The approved scopes.
        scopes: Scopes,
    },
    /// The caller's neighbours and approved scopes, ordered by member id.
    Connections {
        /// `(neighbour, scopes)`.
        connections: Vec<(MemberId, Scopes)>,
    },
    /// The edge and pending offers with this member are gone.
    Disconnected {
        /// The other member.
        member_id: MemberId,
    },
}

impl ReplyBody {
    /// The reply type.
    pub fn type_name(&self) -> &'static str {
        match self {
            ReplyBody::Challenge { .. } => "CHALLENGE",
            ReplyBody::Registered { .. } => "REGISTERED",
            ReplyBody::Lookup { .. } => "LOOKUP",
            ReplyBody::ConnectionRequested { .. } => "CONNECTION_REQUESTED",
            ReplyBody::Invitation { .. } => "INVITATION",
            ReplyBody::Connected { .. } => "CONNECTED",
            ReplyBody::Connections { .. } => "CONNECTIONS",
            ReplyBody::Disconnected { .. } => "DISCONNECTED",
        }
    }
}

/// One queued reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Stable across retries (`responseId`, `X-ASNET-Response-ID`); agents deduplicate on it.
    pub response_id: ResponseId,
    /// The destination: the normalized sender or a stored member mailbox, never a caller's choice.
    pub to: Mailbox,
    /// The content.
    pub body: ReplyBody,
    /// Unix ms.
    pub created_at: i64,
    /// Discard unsent after this (Unix ms): stale codes and private results must not arrive late.
    pub expires_at: i64,
}

impl Reply {
    fn new(rng: &mut dyn Rng, to: Mailbox, body: ReplyBody, now: i64) -> Self {
        Self { response_id: ResponseId::random(rng), to, body, created_at: now, expires_at: now + REPLY_TTL_MS }
    }

    /// The reply body as a JSON object: `protocol`, `type`, `responseId` and the type's data.
    pub fn to_json(&self) -> Json {
        let mut v = match &self.body {
            ReplyBody::Challenge { challenge_id, code, expires_at, action } => json!({
                "challengeId": challenge_id.to_string(),
                "code": code.to_string(),
                "expiresAt": expires_at,
                "action": action.to_json(),
            }),
            ReplyBody::Registered { member_id, discovery } => json!({
                "memberId": member_id.to_string(),
                "discovery": discovery,
                "marker": if *discovery { Json::from(member_id.marker()) } else { Json::Null },
            }),
            ReplyBody::Lookup { member_id, member } => json!({
                "memberId": member_id.to_string(),
                "member": member.as_ref().map(|m| json!({
                    "memberId": m.member_id.to_string(),
                    "marker": m.marker,
                })),
            }),
            ReplyBody::ConnectionRequested { request_id, member_id, scopes, expires_at } => json!({
                "requestId": request_id.to_string(),
                "memberId": member_id.to_string(),
                "scopes": scopes.names(),
                "expiresAt": expires_at,
            }),
            ReplyBody::Invitation { request_id, from_member_id, scopes, expires_at } => json!({
                "requestId": request_id.to_string(),
                "fromMemberId": from_member_id.to_string(),
                "scopes": scopes.names(),
                "expiresAt": expires_at,
            }),
            ReplyBody::Connected { request_id, member_id, scopes } => json!({
                "requestId": request_id.to_string(),
                "memberId": member_id.to_string(),
                "scopes": scopes.names(),
            }),
            ReplyBody::Connections { connections } => json!({
                "connections": connections.iter().map(|(m, s)| json!({
                    "memberId": m.to_string(),
                    "scopes": s.names(),
                })).collect::<Vec<_>>(),
            }),
            ReplyBody::Disconnected { member_id } => json!({ "memberId": member_id.to_string() }),
        };
        if let Some(obj) = v.as_object_mut() {
            obj.insert("protocol".into(), PROTOCOL.into());
            obj.insert("type".into(), self.body.type_name().into());
            obj.insert("responseId".into(), self.response_id.to_string().into());
        }
        v
    }

    /// The mail body: the JSON object, one member or array item per line (keeps mail lines
    /// short whatever the size of a connection list), ASCII only.
    pub fn body_text(&self) -> String {
        let text = serde_json::to_string_pretty(&self.to_json()).unwrap_or_default();
        let mut out = String::with_capacity(text.len() + 2);
        for c in text.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                // Unreachable today (every field is ASCII); keeps the 7bit promise regardless.
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        out.push('\n');
        out
    }
}

/// The result of one `receive`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Processed, ignored or rejected.
    pub status: Status,
    /// Why, when not simply processed.
    pub reason: Option<Reason>,
    /// Replies to queue (empty unless processed).
    pub outbox: Vec<Reply>,
}

impl Outcome {
    fn processed(outbox: Vec<Reply>) -> Self {
        Self { status: Status::Processed, reason: None, outbox }
    }

    fn ignored(reason: Reason) -> Self {
        Self { status: Status::Ignored, reason: Some(reason), outbox: Vec::new() }
    }

    fn rejected(reason: Reason) -> Self {
        Self { status: Status::Rejected, reason: Some(reason), outbox: Vec::new() }
    }
}

/// Why `receive` could not decide: only storage can fail. The caller rolls back and retries the
/// delivery later (a local fault).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError<E: std::error::Error + 'static> {
    /// The store failed.
    #[error("ASNET store: {0}")]
    Store(#[source] E),
}

type Res<T, S> = Result<T, ServiceError<<S as Store>::Error>>;

/// Processes one inbound envelope. Commit every `Ok` result (state, consumed challenges, delivery
/// ids, budgets and the outbox) in one transaction.
pub fn receive<S: Store>(
    config: &Config,
    store: &mut S,
    envelope: &EnvelopeIn,
    now: i64,
    rng: &mut dyn Rng,
) -> Res<Outcome, S> {
    let (Ok(delivery), Ok(sender), Ok(recipient)) = (
        DeliveryId::parse(&envelope.delivery_id),
        Mailbox::parse(&envelope.sender),
        Mailbox::parse(&envelope.recipient),
    ) else {
        return Ok(Outcome::rejected(Reason::InvalidEnvelope));
    };
    if recipient != config.service {
        return Ok(Outcome::rejected(Reason::WrongRecipient));
    }
    if sender == config.service {
        return Ok(Outcome::ignored(Reason::SelfSent));
    }
    if envelope.auto_submitted.as_deref().is_some_and(|v| !v.trim().eq_ignore_ascii_case("no")) {
        return Ok(Outcome::ignored(Reason::AutoSubmitted));
    }
    let st = |e| ServiceError::Store(e);
    if store.delivery_seen_since(&delivery, now.saturating_sub(DELIVERY_DEDUP_MS) + 1).map_err(st)? {
        return Ok(Outcome::ignored(Reason::DuplicateDelivery));
    }
    let window = now.saturating_sub(BUDGET_WINDOW_MS) + 1;
    if store.sender_attempts_since(&sender, window).map_err(st)? >= config.limits.per_sender {
        return Ok(Outcome::rejected(Reason::SenderRateLimited));
    }
    if store.global_attempts_since(window).map_err(st)? >= config.limits.global {
        return Ok(Outcome::rejected(Reason::GlobalRateLimited));
    }
    store.record_attempt(&sender, now).map_err(st)?;
    store.record_delivery(&delivery, now).map_err(st)?;

    let command = match Command::parse(envelope.body.as_bytes()) {
        Ok(c) => c,
        Err(CommandError::UnsupportedProtocol) => return Ok(Outcome::rejected(Reason::UnsupportedProtocol)),
        Err(_) => return Ok(Outcome::rejected(Reason::MalformedCommand)),
    };
    match command {
        Command::Lookup { member_id } => {
            let member = store
                .member(&member_id)
                .map_err(st)?
                .map(|m| PublicMember { member_id: m.id, marker: m.discovery.then(|| m.id.marker()) });
            let reply = Reply::new(rng, sender, ReplyBody::Lookup { member_id, member }, now);
            Ok(Outcome::processed(vec![reply]))
        }
        Command::Protected(action) => {
            if let Err(reason) = check(store, &sender, &action, now)? {
                return Ok(Outcome::rejected(reason));
            }
            let challenge_id = ChallengeId::random(rng);
            let code = Code::random(rng);
            let expires_at = now + CHALLENGE_TTL_MS;
            store
                .put_challenge(&Challenge {
                    id: challenge_id,
                    mailbox: sender.clone(),
                    action: action.clone(),
                    code_hash: code.hash(&challenge_id),
                    expires_at,
                    wrong_guesses: 0,
                    state: ChallengeState::Open,
                })
                .map_err(st)?;
            let body = ReplyBody::Challenge { challenge_id, code, expires_at, action };
            Ok(Outcome::processed(vec![Reply::new(rng, sender, body, now)]))
        }
        Command::Verify { challenge_id, code } => verify(store, &sender, challenge_id, &code, now, rng),
    }
}

/// What a checked action needs to run.
enum Plan {
    Register { mailbox: Mailbox, existing: Option<Member>, discovery: Option<bool> },
    Connect { me: Member, target: Member, scopes: Scopes },
    Accept { me: Member, proposer: Member, offer: Offer, scopes: Scopes },
    List { me: Member },
    Disconnect { me: Member, target: Member, pair: Pair },
}

/// Checks an action against current state: when it is requested (so an impossible action gets
/// no challenge) and again after its challenge is consumed (state may have changed meanwhile).
fn check<S: Store>(store: &mut S, sender: &Mailbox, action: &Action, now: i64) -> Res<Result<Plan, Reason>, S> {
    let st = |e| ServiceError::Store(e);
    let me = store.member_by_mailbox(sender).map_err(st)?;
    if let Action::Register { discovery } = action {
        return Ok(Ok(Plan::Register { mailbox: sender.clone(), existing: me, discovery: *discovery }));
    }
    let Some(me) = me else { return Ok(Err(Reason::NotRegistered)) };
    Ok(match action {
        Action::Register { discovery } => {
            Ok(Plan::Register { mailbox: sender.clone(), existing: Some(me), discovery: *discovery })
        }
        Action::ListConnections => Ok(Plan::List { me }),
        Action::Connect { member_id, scopes } => {
            let Some(pair) = Pair::new(me.id, *member_id) else { return Ok(Err(Reason::SelfConnection)) };
            let Some(target) = store.member(member_id).map_err(st)? else { return Ok(Err(Reason::UnknownMember)) };
            if store.edge(&pair).map_err(st)?.is_some() {
                return Ok(Err(Reason::AlreadyConnected));
            }
            if store.offers_between(&pair).map_err(st)?.iter().any(|o| o.expires_at > now) {
                return Ok(Err(Reason::RequestPending));
            }
            Ok(Plan::Connect { me, target, scopes: scopes.clone() })
        }
        Action::Accept { request_id, scopes } => {
            let Some(offer) = store.offer(request_id).map_err(st)? else { return Ok(Err(Reason::UnknownRequest)) };
            if offer.to != me.id {
                return Ok(Err(Reason::NotInvitee));
            }
            if offer.expires_at <= now {
                return Ok(Err(Reason::OfferExpired));
            }
            if !scopes.is_subset_of(&offer.scopes) {
                return Ok(Err(Reason::ScopesNotSubset));
            }
            let Some(pair) = Pair::new(offer.from, me.id) else { return Ok(Err(Reason::SelfConnection)) };
            if store.edge(&pair).map_err(st)?.is_some() {
                return Ok(Err(Reason::AlreadyConnected));
            }
            let Some(proposer) = store.member(&offer.from).map_err(st)? else {
                return Ok(Err(Reason::UnknownMember));
            };
            Ok(Plan::Accept { me, proposer, offer, scopes: scopes.clone() })
        }
        Action::Disconnect { member_id } => {
            let Some(pair) = Pair::new(me.id, *member_id) else { return Ok(Err(Reason::SelfConnection)) };
            let Some(target) = store.member(member_id).map_err(st)? else { return Ok(Err(Reason::UnknownMember)) };
            Ok(Plan::Disconnect { me, target, pair })
        }
    })
}

/// Hash comparison without an early exit.
fn same_hash(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn verify<S: Store>(
    store: &mut S,
    sender: &Mailbox,
    challenge_id: ChallengeId,
    code: &Code,
    now: i64,
    rng: &mut dyn Rng,
) -> Res<Outcome, S> {
    let st = |e| ServiceError::Store(e);
    let Some(mut challenge) = store.challenge(&challenge_id).map_err(st)? else {
        return Ok(Outcome::rejected(Reason::UnknownChallenge));
    };
    if challenge.mailbox != *sender {
        return Ok(Outcome::rejected(Reason::WrongMailbox));
    }
    match challenge.state {
        ChallengeState::Open => {}
        ChallengeState::Consumed => return Ok(Outcome::rejected(Reason::ChallengeConsumed)),
        ChallengeState::Locked => return Ok(Outcome::rejected(Reason::ChallengeLocked)),
    }
    if now >= challenge.expires_at {
        return Ok(Outcome::rejected(Reason::ChallengeExpired));
    }
    if !same_hash(&code.hash(&challenge_id), &challenge.code_hash) {
        challenge.wrong_guesses = challenge.wrong_guesses.saturating_add(1);
        if challenge.wrong_guesses >= MAX_WRONG_GUESSES {
            challenge.state = ChallengeState::Locked;
        }
        store.put_challenge(&challenge).map_err(st)?;
        return Ok(Outcome::rejected(Reason::WrongCode));
    }
    // Consumption precedes execution: a failed action needs a fresh challenge.
    challenge.state = ChallengeState::Consumed;
    store.put_challenge(&challenge).map_err(st)?;
    let plan = match check(store, sender, &challenge.action, now)? {
        Ok(plan) => plan,
        Err(reason) => return Ok(Outcome::rejected(reason)),
    };
    execute(store, plan, now, rng)
}

fn execute<S: Store>(store: &mut S, plan: Plan, now: i64, rng: &mut dyn Rng) -> Res<Outcome, S> {
    let st = |e| ServiceError::Store(e);
    let outbox = match plan {
        Plan::Register { mailbox, existing, discovery } => {
            // Re-registration keeps the id; an omitted `discovery` keeps the choice.
            let member = match existing {
                Some(m) => Member { discovery: discovery.unwrap_or(m.discovery), ..m },
                None => Member {
                    id: MemberId::random(rng),
                    mailbox,
                    discovery: discovery.unwrap_or(false),
                    created_at: now,
                },
            };
            store.put_member(&member).map_err(st)?;
            let body = ReplyBody::Registered { member_id: member.id, discovery: member.discovery };
            vec![Reply::new(rng, member.mailbox, body, now)]
        }
        Plan::Connect { me, target, scopes } => {
            let offer = Offer {
                id: RequestId::random(rng),
                from: me.id,
                to: target.id,
                scopes: scopes.clone(),
                expires_at: now + OFFER_TTL_MS,
            };
            store.put_offer(&offer).map_err(st)?;
            let ack = ReplyBody::ConnectionRequested {
                request_id: offer.id,
                member_id: target.id,
                scopes: scopes.clone(),
                expires_at: offer.expires_at,
            };
            let invitation = ReplyBody::Invitation {
                request_id: offer.id,
                from_member_id: me.id,
                scopes,
                expires_at: offer.expires_at,
            };
            vec![Reply::new(rng, me.mailbox, ack, now), Reply::new(rng, target.mailbox, invitation, now)]
        }
        Plan::Accept { me, proposer, offer, scopes } => {
            store.delete_offer(&offer.id).map_err(st)?;
            let Some(pair) = Pair::new(me.id, proposer.id) else {
                return Ok(Outcome::rejected(Reason::SelfConnection));
            };
            store.put_edge(&Edge { pair, scopes: scopes.clone(), created_at: now }).map_err(st)?;
            let to_me = ReplyBody::Connected { request_id: offer.id, member_id: proposer.id, scopes: scopes.clone() };
            let to_proposer = ReplyBody::Connected { request_id: offer.id, member_id: me.id, scopes };
            vec![Reply::new(rng, me.mailbox, to_me, now), Reply::new(rng, proposer.mailbox, to_proposer, now)]
        }
        Plan::List { me } => {
            let connections =
                store.edges_of(&me.id).map_err(st)?.into_iter().map(|e| (e.pair.other(&me.id), e.scopes)).collect();
            vec![Reply::new(rng, me.mailbox, ReplyBody::Connections { connections }, now)]
        }
        Plan::Disconnect { me, target, pair } => {
            let had_edge = store.edge(&pair).map_err(st)?.is_some();
            store.delete_edge(&pair).map_err(st)?;
            for offer in store.offers_between(&pair).map_err(st)? {
                store.delete_offer(&offer.id).map_err(st)?;
            }
            let mut out = vec![Reply::new(rng, me.mailbox, ReplyBody::Disconnected { member_id: target.id }, now)];
            if had_edge {
                // The other member learns that the connection is gone (a connection notification).
                out.push(Reply::new(rng, target.mailbox, ReplyBody::Disconnected { member_id: me.id }, now));
            }
            out
        }
    };
    Ok(Outcome::processed(outbox))
}
