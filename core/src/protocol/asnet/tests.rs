//! The seed's rules (`../shared/seeds/004_*.txt`), one named test each, with an injected clock.
//!
//! | seed rule | test |
//! |---|---|
//! | one UTF-8 JSON object, at most 4,096 bytes | `body_over_4096_bytes_is_rejected_without_reply`, `body_of_exactly_4096_bytes_is_accepted`, `non_object_body_is_rejected`, `quoted_thread_after_the_command_is_rejected` |
//! | no extra fields; exact field sets | `extra_field_is_rejected`, `missing_field_is_rejected` |
//! | field names, commands, versions case-sensitive | `field_names_commands_and_versions_are_case_sensitive` |
//! | unknown versions fail closed | `unknown_protocol_version_fails_closed` |
//! | duplicate keys rejected, escaped equivalents too | `duplicate_keys_are_rejected`, `escaped_duplicate_keys_are_rejected` |
//! | domain case normalized; local-part case, dots, plus tags kept | `domain_case_is_normalized_local_part_is_preserved` |
//! | no Unicode addresses (future policy) | `unicode_sender_is_rejected` |
//! | receiver drops self-sent mail | `self_sent_mail_is_ignored` |
//! | receiver drops automatic mail; `Auto-Submitted: no` allowed | `auto_submitted_mail_is_ignored`, `auto_submitted_no_is_processed` |
//! | actual recipient must be the service mailbox | `mail_to_another_recipient_is_rejected` |
//! | `mem_`/`chl_`/`req_` + 32 lowercase hex; codes 32 lowercase hex, 128 random bits | `identifiers_and_codes_have_the_seed_formats`, `malformed_identifiers_are_rejected` |
//! | scopes: only the two; duplicates, empty, unknown rejected | `empty_duplicate_and_unknown_scopes_are_rejected` |
//! | REGISTER: CHALLENGE to the sender with id, code, expiresAt, exact action | `register_issues_a_challenge_with_the_exact_action_to_the_sender` |
//! | new members default to discovery false | `new_member_defaults_to_no_discovery` |
//! | discovery marker `agent-society:v1:<memberId>` | `registered_with_discovery_returns_the_marker` |
//! | challenges expire after 15 minutes | `challenge_expires_after_fifteen_minutes` |
//! | at most five incorrect well-formed guesses | `a_sixth_wrong_code_is_refused_as_locked`, `right_code_after_five_wrong_guesses_is_refused`, `right_code_after_four_wrong_guesses_runs`, `malformed_code_is_not_counted_as_a_guess` |
//! | challenges stored as hashes | `challenge_store_holds_only_a_hash_of_the_code` |
//! | VERIFY redeems once, from its bound mailbox | `verify_from_another_mailbox_is_rejected`, `replayed_verify_under_a_new_delivery_id_is_refused` |
//! | VERIFY cannot replace scopes or action | `verify_with_replacement_scopes_is_rejected` |
//! | consumption precedes action; a failed action needs a fresh challenge | `failed_action_still_consumes_the_challenge` |
//! | re-registration keeps the member id | `re_registration_keeps_the_member_id` |
//! | omitted discovery retains, explicit false withdraws | `omitted_discovery_retains_and_false_withdraws` |
//! | separate unexpired challenges coexist, run in verification order | `separate_challenges_coexist_and_run_in_verification_order` |
//! | LOOKUP public, minimal metadata or null, never mailbox or graph | `lookup_returns_minimal_metadata_never_a_mailbox`, `lookup_of_unknown_member_returns_null`, `lookup_needs_no_registration` |
//! | LOOKUP never accepts an email address or marker | `lookup_by_email_address_or_marker_is_rejected` |
//! | CONNECT only from a registered proposer | `connect_from_unregistered_mailbox_is_rejected` |
//! | no edge before verification; 24-hour offer; INVITATION to the invitee | `connect_creates_no_edge_before_verification`, `verified_connect_stores_an_offer_and_invites_the_invitee` |
//! | invitations go to the stored member mailbox | `invitation_goes_to_the_stored_mailbox_of_the_invitee` |
//! | offers expire after 24 hours | `offer_expires_after_24_hours` |
//! | only the invitee may accept | `only_the_invitee_may_accept` |
//! | accepted scopes a subset of the offer | `accept_with_a_subset_of_scopes_connects_with_that_subset`, `accept_with_scopes_outside_the_offer_is_rejected` |
//! | acceptance rechecks recipient, expiry, scopes at verification | `accept_verified_after_offer_expiry_is_rejected` |
//! | undirected edge, CONNECTED to both | `edge_is_undirected_and_both_are_told` |
//! | crossed or repeated offers are REQUEST_PENDING, never acceptance | `repeated_offer_is_request_pending`, `crossed_offer_is_request_pending_and_not_acceptance` |
//! | self-connections, missing targets, connected pairs rejected | `self_connection_is_rejected`, `connect_to_missing_member_is_rejected`, `connect_to_already_connected_member_is_rejected` |
//! | either member disconnects; edge and offers disappear | `either_member_may_disconnect`, `disconnect_cancels_pending_offers` |
//! | old acceptance challenges cannot resurrect revoked offers | `old_accept_challenge_after_disconnect_cannot_resurrect_the_offer` |
//! | new consent to reconnect | `reconnect_needs_a_new_offer_and_acceptance` |
//! | DISCONNECT idempotent for a known member | `disconnect_without_edge_succeeds_idempotently`, `disconnect_from_unknown_member_is_rejected` |
//! | LIST CONNECTIONS: fresh challenge each time; ids and scopes only | `list_connections_needs_a_fresh_challenge_each_time`, `list_connections_returns_only_neighbour_ids_and_scopes` |
//! | replies: protocol, type, data, responseId | `reply_bodies_carry_protocol_type_and_response_id` |
//! | rejections produce no email | `rejections_never_produce_mail` |
//! | delivery ids deduplicated 24 h, malformed and failed too | `duplicate_delivery_produces_no_reply`, `malformed_body_delivery_id_is_deduplicated`, `failed_verification_delivery_id_is_deduplicated`, `delivery_id_is_forgotten_after_24_hours` |
//! | after the horizon a resent command can only issue a new challenge | `resent_command_after_horizon_only_issues_a_new_challenge` |
//! | 30 attempts per sender per rolling hour | `thirty_first_attempt_in_an_hour_is_rate_limited`, `sender_budget_rolls_over_after_an_hour` |
//! | 1,000 attempts globally per rolling hour | `thousand_and_first_attempt_globally_is_rate_limited` |
//! | retry with backoff at most five times | `outbox_retries_at_most_five_times_with_backoff`, `permanent_failure_is_not_retried` |
//! | every send paced by at least one second | `outbox_paces_sends_one_second_apart` |
//! | outbox replies expire within 15 minutes | `outbox_reply_expires_after_fifteen_minutes` |
//! | sensitive payloads removed when sent/discarded/dead | `sent_dead_and_expired_entries_lose_their_body` |
//! | replies carry `Auto-Submitted: auto-generated` and a stable `X-ASNET-Response-ID` | `rendered_reply_is_auto_generated_with_a_stable_response_id` |
//! | a reply fed back to the service is dropped | `rendered_reply_fed_back_is_refused_as_automatic` |
//! | storage backends agree | `memory_store_passes_the_conformance_suite` |
//!
//! The MIME adapter's refusals have their own table in `mime_tests` below.

use super::command::{Action, Command};
use super::outbox::{self, Attempt, Entry, EntryState, Next, Pacer};
use super::service::{Config, EnvelopeIn, Limits, Outcome, Reason, Reply, ReplyBody, Status, receive};
use super::store::{MemoryStore, Store, conformance};
use super::{
    CHALLENGE_TTL_MS, ChallengeId, Code, DAY_MS, HOUR_MS, Mailbox, MemberId, OFFER_TTL_MS, RequestId, Scope, Scopes,
};
use crate::util::SeededRng;

const T0: i64 = 1_790_726_400_000;
const SERVICE: &str = "network@example.test";
const ALICE: &str = "alice@example.test";
const BOB: &str = "bob@example.test";
const CAROL: &str = "carol@example.test";
const EMAIL: &[&str] = &["contact:email"];
const BOTH: &[&str] = &["contact:email", "profile:basic"];

/// A synthetic service with synthetic inboxes (the outbox), an injected clock and a seeded RNG.
struct Sim {
    config: Config,
    store: MemoryStore,
    rng: SeededRng,
    now: i64,
    deliveries: u64,
}

impl Sim {
    fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Self {
        let config = Config { service: Mailbox::parse(SERVICE).unwrap(), limits };
        Self { config, store: MemoryStore::new(), rng: SeededRng::new([5; 32]), now: T0, deliveries: 0 }
    }

    fn envelope(&mut self, from: &str, body: &str) -> EnvelopeIn {
        self.deliveries += 1;
        EnvelopeIn {
            sender: from.into(),
            recipient: SERVICE.into(),
            delivery_id: format!("q{}", self.deliveries),
            auto_submitted: None,
            body: body.into(),
        }
    }

    fn deliver(&mut self, envelope: &EnvelopeIn) -> Outcome {
        receive(&self.config, &mut self.store, envelope, self.now, &mut self.rng).unwrap()
    }

    /// One mail with a fresh delivery id.
    fn send(&mut self, from: &str, body: &str) -> Outcome {
        let env = self.envelope(from, body);
        self.deliver(&env)
    }

    fn advance(&mut self, ms: i64) {
        self.now += ms;
    }

    /// Requests a protected command and returns the challenge mailed back.
    fn request(&mut self, from: &str, body: &str) -> (ChallengeId, Code, Action) {
        let out = self.send(from, body);
        assert_eq!(out.status, Status::Processed, "{body}: {out:?}");
        challenge(&out, from)
    }

    fn verify(&mut self, from: &str, id: ChallengeId, code: &Code) -> Outcome {
        self.send(from, &Command::Verify { challenge_id: id, code: code.clone() }.to_body())
    }

    /// Request and verify; the verification's outcome.
    fn run(&mut self, from: &str, body: &str) -> Outcome {
        let (id, code, _) = self.request(from, body);
        self.verify(from, id, &code)
    }

    fn register(&mut self, from: &str) -> MemberId {
        let out = self.run(from, &register(None));
        match only(&out).body {
            ReplyBody::Registered { member_id, .. } => member_id,
            ref other => panic!("not REGISTERED: {other:?}"),
        }
    }

    /// A verified CONNECT; the offer's request id (from the invitation).
    fn offer(&mut self, from: &str, to: MemberId, scopes: &[&str]) -> RequestId {
        let out = self.run(from, &connect(to, scopes));
        assert_eq!(out.status, Status::Processed, "{out:?}");
        match &out.outbox.get(1).expect("invitation").body {
            ReplyBody::Invitation { request_id, .. } => *request_id,
            other => panic!("not INVITATION: {other:?}"),
        }
    }

    fn connections(&mut self, from: &str) -> Vec<(MemberId, Scopes)> {
        let out = self.run(from, &list());
        match &only(&out).body {
            ReplyBody::Connections { connections } => connections.clone(),
            other => panic!("not CONNECTIONS: {other:?}"),
        }
    }

    /// A full connection: offer and acceptance.
    fn befriend(&mut self, a: &str, b: &str) -> (MemberId, MemberId) {
        let (ida, idb) = (self.member_of(a), self.member_of(b));
        let req = self.offer(a, idb, BOTH);
        let out = self.run(b, &accept(req, BOTH));
        assert_eq!(out.status, Status::Processed, "{out:?}");
        (ida, idb)
    }

    fn member_of(&mut self, mailbox: &str) -> MemberId {
        self.store.member_by_mailbox(&Mailbox::parse(mailbox).unwrap()).unwrap().expect("registered").id
    }
}

fn challenge(out: &Outcome, to: &str) -> (ChallengeId, Code, Action) {
    let reply = only(out);
    assert_eq!(reply.to.as_str(), Mailbox::parse(to).unwrap().as_str(), "challenges go to the sender");
    match &reply.body {
        ReplyBody::Challenge { challenge_id, code, action, .. } => (*challenge_id, code.clone(), action.clone()),
        other => panic!("not CHALLENGE: {other:?}"),
    }
}

fn only(out: &Outcome) -> &Reply {
    assert_eq!(out.outbox.len(), 1, "{out:?}");
    &out.outbox[0]
}

fn rejected(out: &Outcome, reason: Reason) {
    assert_eq!((out.status, out.reason), (Status::Rejected, Some(reason)), "{out:?}");
    assert!(out.outbox.is_empty(), "a rejection never mails");
}

fn ignored(out: &Outcome, reason: Reason) {
    assert_eq!((out.status, out.reason), (Status::Ignored, Some(reason)), "{out:?}");
    assert!(out.outbox.is_empty());
}

fn scopes(names: &[&str]) -> Scopes {
    Scopes::new(names.iter().map(|n| Scope::parse(n).unwrap()).collect()).unwrap()
}

fn register(discovery: Option<bool>) -> String {
    Command::Protected(Action::Register { discovery }).to_body()
}

fn connect(to: MemberId, s: &[&str]) -> String {
    Command::Protected(Action::Connect { member_id: to, scopes: scopes(s) }).to_body()
}

fn accept(req: RequestId, s: &[&str]) -> String {
    Command::Protected(Action::Accept { request_id: req, scopes: scopes(s) }).to_body()
}

fn list() -> String {
    Command::Protected(Action::ListConnections).to_body()
}

fn disconnect(from: MemberId) -> String {
    Command::Protected(Action::Disconnect { member_id: from }).to_body()
}

fn lookup(id: MemberId) -> String {
    Command::Lookup { member_id: id }.to_body()
}

// ---- codec ----

#[test]
fn body_over_4096_bytes_is_rejected_without_reply() {
    let mut sim = Sim::new();
    let body = format!("{}{}", register(None), " ".repeat(4097 - register(None).len()));
    assert_eq!(body.len(), 4097);
    rejected(&sim.send(ALICE, &body), Reason::MalformedCommand);
}

#[test]
fn body_of_exactly_4096_bytes_is_accepted() {
    let mut sim = Sim::new();
    let body = format!("{}{}", register(None), " ".repeat(4096 - register(None).len()));
    assert_eq!(body.len(), 4096);
    assert_eq!(sim.send(ALICE, &body).status, Status::Processed);
}

#[test]
fn non_object_body_is_rejected() {
    let mut sim = Sim::new();
    for body in ["[]", "\"REGISTER\"", "null", "", "REGISTER"] {
        rejected(&sim.send(ALICE, body), Reason::MalformedCommand);
    }
}

#[test]
fn quoted_thread_after_the_command_is_rejected() {
    let mut sim = Sim::new();
    let body = format!("{}\r\n\r\nOn Monday, Bob wrote:\r\n> {{}}\r\n", register(None));
    rejected(&sim.send(ALICE, &body), Reason::MalformedCommand);
}

#[test]
fn extra_field_is_rejected() {
    let mut sim = Sim::new();
    rejected(
        &sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"REGISTER","discovery":true,"profile":"hi"}"#),
        Reason::MalformedCommand,
    );
    rejected(
        &sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"LIST CONNECTIONS","memberId":"x"}"#),
        Reason::MalformedCommand,
    );
}

#[test]
fn missing_field_is_rejected() {
    let mut sim = Sim::new();
    rejected(&sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"LOOKUP"}"#), Reason::MalformedCommand);
    rejected(&sim.send(ALICE, r#"{"command":"REGISTER"}"#), Reason::MalformedCommand);
    let connect_no_scopes =
        format!(r#"{{"protocol":"ASNET/1","command":"CONNECT","memberId":"mem_{}"}}"#, "0".repeat(32));
    rejected(&sim.send(ALICE, &connect_no_scopes), Reason::MalformedCommand);
}

#[test]
fn field_names_commands_and_versions_are_case_sensitive() {
    let mut sim = Sim::new();
    rejected(&sim.send(ALICE, r#"{"Protocol":"ASNET/1","command":"REGISTER"}"#), Reason::MalformedCommand);
    rejected(&sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"register"}"#), Reason::MalformedCommand);
    rejected(&sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"List Connections"}"#), Reason::MalformedCommand);
    rejected(&sim.send(ALICE, r#"{"protocol":"asnet/1","command":"REGISTER"}"#), Reason::UnsupportedProtocol);
    rejected(
        &sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"REGISTER","Discovery":true}"#),
        Reason::MalformedCommand,
    );
}

#[test]
fn unknown_protocol_version_fails_closed() {
    let mut sim = Sim::new();
    rejected(&sim.send(ALICE, r#"{"protocol":"ASNET/2","command":"REGISTER"}"#), Reason::UnsupportedProtocol);
    rejected(&sim.send(ALICE, r#"{"protocol":1,"command":"REGISTER"}"#), Reason::MalformedCommand);
}

#[test]
fn duplicate_keys_are_rejected() {
    let mut sim = Sim::new();
    rejected(
        &sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"REGISTER","discovery":true,"discovery":false}"#),
        Reason::MalformedCommand,
    );
}

#[test]
fn escaped_duplicate_keys_are_rejected() {
    let mut sim = Sim::new();
    rejected(
        &sim.send(ALICE, r#"{"protocol":"ASNET/1","command":"REGISTER","discovery":true,"\u0064iscovery":false}"#),
        Reason::MalformedCommand,
    );
    rejected(
        &sim.send(ALICE, r#"{"protocol":"ASNET/1","\u0063ommand":"LOOKUP","command":"REGISTER"}"#),
        Reason::MalformedCommand,
    );
}

#[test]
fn identifiers_and_codes_have_the_seed_formats() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let hex32 = |s: &str| s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let chl_text = chl.to_string();
    assert!(chl_text.strip_prefix("chl_").is_some_and(hex32), "{chl_text}");
    assert!(hex32(&code.to_string()));
    let mem = sim.register(BOB).to_string();
    assert!(mem.strip_prefix("mem_").is_some_and(hex32), "{mem}");
    sim.register(CAROL);
    let carol = sim.member_of(CAROL);
    let req = sim.offer(BOB, carol, EMAIL).to_string();
    assert!(req.strip_prefix("req_").is_some_and(hex32), "{req}");
    // 128 bits each: ids and codes differ between challenges.
    let (chl2, code2, _) = sim.request(ALICE, &register(None));
    assert_ne!(chl, chl2);
    assert_ne!(code, code2);
}

#[test]
fn malformed_identifiers_are_rejected() {
    let mut sim = Sim::new();
    for id in [
        "mem_0123456789ABCDEF0123456789abcdef",
        "mem_0123",
        "MEM_0123456789abcdef0123456789abcdef",
        "chl_0123456789abcdef0123456789abcdef",
    ] {
        let body = format!(r#"{{"protocol":"ASNET/1","command":"LOOKUP","memberId":"{id}"}}"#);
        rejected(&sim.send(ALICE, &body), Reason::MalformedCommand);
    }
}

#[test]
fn empty_duplicate_and_unknown_scopes_are_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    for scopes in [
        r#"[]"#,
        r#"["contact:email","contact:email"]"#,
        r#"["contact:phone"]"#,
        r#"["Contact:Email"]"#,
        r#""contact:email""#,
    ] {
        let body = format!(r#"{{"protocol":"ASNET/1","command":"CONNECT","memberId":"{bob}","scopes":{scopes}}}"#);
        rejected(&sim.send(ALICE, &body), Reason::MalformedCommand);
    }
}

// ---- envelope ----

#[test]
fn domain_case_is_normalized_local_part_is_preserved() {
    let mut sim = Sim::new();
    let id = sim.register("Alice.Smith+asnet@Example.TEST");
    let out = sim.send("Alice.Smith+asnet@example.test", &list());
    let (chl, code, _) = challenge(&out, "Alice.Smith+asnet@example.test");
    assert_eq!(out.outbox[0].to.as_str(), "Alice.Smith+asnet@example.test");
    assert_eq!(sim.verify("Alice.Smith+asnet@EXAMPLE.test", chl, &code).status, Status::Processed);
    // Another local-part case is another mailbox: not registered, and not the challenge's.
    rejected(&sim.send("alice.smith+asnet@example.test", &list()), Reason::NotRegistered);
    let (chl, code, _) = sim.request("Alice.Smith+asnet@example.test", &list());
    rejected(&sim.verify("alicesmith+asnet@example.test", chl, &code), Reason::WrongMailbox);
    assert_eq!(sim.member_of("Alice.Smith+asnet@example.test"), id);
}

#[test]
fn unicode_sender_is_rejected() {
    let mut sim = Sim::new();
    rejected(&sim.send("álice@example.test", &register(None)), Reason::InvalidEnvelope);
    rejected(&sim.send("alice@exämple.test", &register(None)), Reason::InvalidEnvelope);
    rejected(&sim.send("Alice <alice@example.test>", &register(None)), Reason::InvalidEnvelope);
}

#[test]
fn self_sent_mail_is_ignored() {
    let mut sim = Sim::new();
    ignored(&sim.send("network@EXAMPLE.test", &register(None)), Reason::SelfSent);
}

#[test]
fn auto_submitted_mail_is_ignored() {
    let mut sim = Sim::new();
    for value in ["auto-generated", "auto-replied", "auto-notified", ""] {
        let mut env = sim.envelope(ALICE, &register(None));
        env.auto_submitted = Some(value.into());
        ignored(&sim.deliver(&env), Reason::AutoSubmitted);
    }
}

#[test]
fn auto_submitted_no_is_processed() {
    let mut sim = Sim::new();
    let mut env = sim.envelope(ALICE, &register(None));
    env.auto_submitted = Some("no".into());
    assert_eq!(sim.deliver(&env).status, Status::Processed);
}

#[test]
fn mail_to_another_recipient_is_rejected() {
    let mut sim = Sim::new();
    let mut env = sim.envelope(ALICE, &register(None));
    env.recipient = "other@example.test".into();
    rejected(&sim.deliver(&env), Reason::WrongRecipient);
}

// ---- registration and challenges ----

#[test]
fn register_issues_a_challenge_with_the_exact_action_to_the_sender() {
    let mut sim = Sim::new();
    let out = sim.send(ALICE, &register(Some(true)));
    assert_eq!(out.status, Status::Processed);
    let reply = only(&out);
    assert_eq!(reply.to.as_str(), ALICE);
    let json = reply.to_json();
    assert_eq!(json["type"], "CHALLENGE");
    assert_eq!(json["expiresAt"], T0 + CHALLENGE_TTL_MS);
    assert_eq!(json["action"], serde_json::json!({"protocol":"ASNET/1","command":"REGISTER","discovery":true}));
    assert!(json["challengeId"].as_str().unwrap().starts_with("chl_"));
    assert_eq!(json["code"].as_str().unwrap().len(), 32);
    // Nothing is registered before verification.
    assert!(sim.store.member_by_mailbox(&Mailbox::parse(ALICE).unwrap()).unwrap().is_none());
}

#[test]
fn new_member_defaults_to_no_discovery() {
    let mut sim = Sim::new();
    let out = sim.run(ALICE, &register(None));
    assert!(matches!(only(&out).body, ReplyBody::Registered { discovery: false, .. }));
    assert_eq!(only(&out).to_json()["marker"], serde_json::Value::Null);
}

#[test]
fn registered_with_discovery_returns_the_marker() {
    let mut sim = Sim::new();
    let out = sim.run(ALICE, &register(Some(true)));
    let json = only(&out).to_json();
    assert_eq!(json["type"], "REGISTERED");
    let id = json["memberId"].as_str().unwrap().to_owned();
    assert_eq!(json["marker"], format!("agent-society:v1:{id}"));
}

#[test]
fn challenge_expires_after_fifteen_minutes() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    sim.advance(CHALLENGE_TTL_MS);
    rejected(&sim.verify(ALICE, chl, &code), Reason::ChallengeExpired);

    let (chl, code, _) = sim.request(ALICE, &register(None));
    sim.advance(CHALLENGE_TTL_MS - 1);
    assert_eq!(sim.verify(ALICE, chl, &code).status, Status::Processed);
}

#[test]
fn a_sixth_wrong_code_is_refused_as_locked() {
    let mut sim = Sim::new();
    let (chl, _code, _) = sim.request(ALICE, &register(None));
    let wrong = Code::parse(&"0".repeat(32)).unwrap();
    for _ in 0..5 {
        rejected(&sim.verify(ALICE, chl, &wrong), Reason::WrongCode);
    }
    rejected(&sim.verify(ALICE, chl, &wrong), Reason::ChallengeLocked);
}

#[test]
fn right_code_after_five_wrong_guesses_is_refused() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let wrong = Code::parse(&"f".repeat(32)).unwrap();
    for _ in 0..5 {
        rejected(&sim.verify(ALICE, chl, &wrong), Reason::WrongCode);
    }
    rejected(&sim.verify(ALICE, chl, &code), Reason::ChallengeLocked);
    assert!(sim.store.member_by_mailbox(&Mailbox::parse(ALICE).unwrap()).unwrap().is_none());
}

#[test]
fn right_code_after_four_wrong_guesses_runs() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let wrong = Code::parse(&"f".repeat(32)).unwrap();
    for _ in 0..4 {
        rejected(&sim.verify(ALICE, chl, &wrong), Reason::WrongCode);
    }
    assert_eq!(sim.verify(ALICE, chl, &code).status, Status::Processed);
}

#[test]
fn malformed_code_is_not_counted_as_a_guess() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    for _ in 0..10 {
        let body = format!(r#"{{"protocol":"ASNET/1","command":"VERIFY","challengeId":"{chl}","code":"nothex"}}"#);
        rejected(&sim.send(ALICE, &body), Reason::MalformedCommand);
    }
    assert_eq!(sim.verify(ALICE, chl, &code).status, Status::Processed);
}

#[test]
fn challenge_store_holds_only_a_hash_of_the_code() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let stored = sim.store.challenge(&chl).unwrap().unwrap();
    assert_eq!(stored.code_hash, code.hash(&chl));
    let dump = format!("{:?}", sim.store);
    assert!(!dump.contains(&code.to_string()), "the code itself is not stored");
    assert!(!format!("{code:?}").contains(&code.to_string()), "Debug never prints a code");
}

#[test]
fn verify_from_another_mailbox_is_rejected() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    rejected(&sim.verify(BOB, chl, &code), Reason::WrongMailbox);
    assert_eq!(sim.verify(ALICE, chl, &code).status, Status::Processed, "still redeemable by its mailbox");
}

#[test]
fn replayed_verify_under_a_new_delivery_id_is_refused() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let verify_body = Command::Verify { challenge_id: chl, code: code.clone() }.to_body();
    assert_eq!(sim.send(ALICE, &verify_body).status, Status::Processed);
    rejected(&sim.send(ALICE, &verify_body), Reason::ChallengeConsumed);
}

#[test]
fn verify_with_replacement_scopes_is_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let (chl, code, _) = sim.request(ALICE, &connect(bob, EMAIL));
    let body = format!(
        r#"{{"protocol":"ASNET/1","command":"VERIFY","challengeId":"{chl}","code":"{code}","scopes":["profile:basic"]}}"#
    );
    rejected(&sim.send(ALICE, &body), Reason::MalformedCommand);
    let out = sim.verify(ALICE, chl, &code);
    assert!(
        matches!(&out.outbox[0].body, ReplyBody::ConnectionRequested { scopes, .. } if *scopes == self::scopes(EMAIL))
    );
}

#[test]
fn failed_action_still_consumes_the_challenge() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let (chl, code, _) = sim.request(ALICE, &connect(bob, EMAIL));
    // Bob proposes first, so Alice's action fails at verification…
    let alice = sim.member_of(ALICE);
    sim.offer(BOB, alice, EMAIL);
    rejected(&sim.verify(ALICE, chl, &code), Reason::RequestPending);
    // …and the challenge is spent: another attempt needs a fresh one.
    rejected(&sim.verify(ALICE, chl, &code), Reason::ChallengeConsumed);
}

#[test]
fn re_registration_keeps_the_member_id() {
    let mut sim = Sim::new();
    let first = sim.register(ALICE);
    sim.advance(DAY_MS * 3);
    assert_eq!(sim.register(ALICE), first);
}

#[test]
fn omitted_discovery_retains_and_false_withdraws() {
    let mut sim = Sim::new();
    sim.run(ALICE, &register(Some(true)));
    let out = sim.run(ALICE, &register(None));
    assert!(matches!(only(&out).body, ReplyBody::Registered { discovery: true, .. }));
    let out = sim.run(ALICE, &register(Some(false)));
    assert!(matches!(only(&out).body, ReplyBody::Registered { discovery: false, .. }));
    let id = sim.member_of(ALICE);
    let out = sim.send(BOB, &lookup(id));
    assert_eq!(only(&out).to_json()["member"]["marker"], serde_json::Value::Null, "the marker is withdrawn");
}

#[test]
fn separate_challenges_coexist_and_run_in_verification_order() {
    let mut sim = Sim::new();
    let (c1, k1, _) = sim.request(ALICE, &register(Some(true)));
    let (c2, k2, _) = sim.request(ALICE, &register(Some(false)));
    // Verified in reverse order of request: the last verified wins.
    assert_eq!(sim.verify(ALICE, c2, &k2).status, Status::Processed);
    let out = sim.verify(ALICE, c1, &k1);
    assert!(matches!(only(&out).body, ReplyBody::Registered { discovery: true, .. }));
    assert!(sim.store.member_by_mailbox(&Mailbox::parse(ALICE).unwrap()).unwrap().unwrap().discovery);
}

// ---- lookup ----

#[test]
fn lookup_returns_minimal_metadata_never_a_mailbox() {
    let mut sim = Sim::new();
    sim.run(ALICE, &register(Some(true)));
    let bob = sim.register(BOB);
    let alice = sim.member_of(ALICE);
    sim.befriend(ALICE, BOB);
    let out = sim.send(CAROL, &lookup(alice));
    let reply = only(&out);
    assert_eq!(reply.to.as_str(), CAROL);
    let json = reply.to_json();
    assert_eq!(json["member"], serde_json::json!({"memberId": alice.to_string(), "marker": alice.marker()}));
    let text = reply.body_text();
    assert!(!text.contains("example.test"), "no mailbox in a lookup: {text}");
    assert!(!text.contains(&bob.to_string()), "no graph in a lookup: {text}");
}

#[test]
fn lookup_of_unknown_member_returns_null() {
    let mut sim = Sim::new();
    let out = sim.send(ALICE, &lookup(MemberId([9; 16])));
    assert_eq!(only(&out).to_json()["member"], serde_json::Value::Null);
    assert_eq!(only(&out).to_json()["type"], "LOOKUP");
}

#[test]
fn lookup_needs_no_registration() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let out = sim.send(CAROL, &lookup(alice));
    assert_eq!(out.status, Status::Processed);
    assert_eq!(only(&out).to_json()["member"]["memberId"], alice.to_string());
}

#[test]
fn lookup_by_email_address_or_marker_is_rejected() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    for subject in [ALICE.to_owned(), alice.marker()] {
        let body = format!(r#"{{"protocol":"ASNET/1","command":"LOOKUP","memberId":"{subject}"}}"#);
        rejected(&sim.send(BOB, &body), Reason::MalformedCommand);
    }
    let body = format!(r#"{{"protocol":"ASNET/1","command":"LOOKUP","email":"{ALICE}"}}"#);
    rejected(&sim.send(BOB, &body), Reason::MalformedCommand);
}

// ---- connections ----

#[test]
fn connect_from_unregistered_mailbox_is_rejected() {
    let mut sim = Sim::new();
    let bob = sim.register(BOB);
    rejected(&sim.send(ALICE, &connect(bob, EMAIL)), Reason::NotRegistered);
}

#[test]
fn connect_creates_no_edge_before_verification() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    sim.request(ALICE, &connect(bob, EMAIL));
    assert!(sim.connections(ALICE).is_empty());
    // No offer either: Bob can propose without REQUEST_PENDING.
    let alice = sim.member_of(ALICE);
    sim.request(BOB, &connect(alice, EMAIL));
}

#[test]
fn verified_connect_stores_an_offer_and_invites_the_invitee() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let bob = sim.register(BOB);
    let out = sim.run(ALICE, &connect(bob, BOTH));
    assert_eq!(out.outbox.len(), 2);
    let ack = out.outbox[0].to_json();
    assert_eq!((out.outbox[0].to.as_str(), ack["type"].as_str()), (ALICE, Some("CONNECTION_REQUESTED")));
    let inv = out.outbox[1].to_json();
    assert_eq!((out.outbox[1].to.as_str(), inv["type"].as_str()), (BOB, Some("INVITATION")));
    assert_eq!(inv["fromMemberId"], alice.to_string());
    assert_eq!(inv["scopes"], serde_json::json!(BOTH));
    assert_eq!(inv["expiresAt"], T0 + OFFER_TTL_MS);
    assert_eq!(inv["requestId"], ack["requestId"]);
    assert!(sim.connections(ALICE).is_empty(), "an offer is not an edge");
}

#[test]
fn invitation_goes_to_the_stored_mailbox_of_the_invitee() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register("Bob@EXAMPLE.test");
    let out = sim.run(ALICE, &connect(bob, EMAIL));
    assert_eq!(out.outbox[1].to.as_str(), "Bob@example.test");
}

#[test]
fn offer_expires_after_24_hours() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(ALICE, bob, EMAIL);
    sim.advance(OFFER_TTL_MS);
    rejected(&sim.send(BOB, &accept(req, EMAIL)), Reason::OfferExpired);
    // An expired offer no longer blocks a new one.
    sim.offer(ALICE, bob, EMAIL);
}

#[test]
fn only_the_invitee_may_accept() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    sim.register(CAROL);
    let req = sim.offer(ALICE, bob, EMAIL);
    rejected(&sim.send(CAROL, &accept(req, EMAIL)), Reason::NotInvitee);
    rejected(&sim.send(ALICE, &accept(req, EMAIL)), Reason::NotInvitee);
}

#[test]
fn accept_with_a_subset_of_scopes_connects_with_that_subset() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(ALICE, bob, BOTH);
    let out = sim.run(BOB, &accept(req, &["profile:basic"]));
    assert_eq!(out.status, Status::Processed);
    assert_eq!(sim.connections(ALICE), vec![(bob, scopes(&["profile:basic"]))]);
    assert_eq!(sim.connections(BOB), vec![(alice, scopes(&["profile:basic"]))]);
}

#[test]
fn accept_with_scopes_outside_the_offer_is_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(ALICE, bob, EMAIL);
    rejected(&sim.send(BOB, &accept(req, BOTH)), Reason::ScopesNotSubset);
    rejected(&sim.send(BOB, &accept(req, &["profile:basic"])), Reason::ScopesNotSubset);
}

#[test]
fn accept_verified_after_offer_expiry_is_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(ALICE, bob, EMAIL);
    sim.advance(OFFER_TTL_MS - 60_000);
    let (chl, code, _) = sim.request(BOB, &accept(req, EMAIL));
    sim.advance(60_000);
    rejected(&sim.verify(BOB, chl, &code), Reason::OfferExpired);
    assert!(sim.connections(BOB).is_empty());
}

#[test]
fn edge_is_undirected_and_both_are_told() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(BOB, alice, BOTH);
    let out = sim.run(ALICE, &accept(req, EMAIL));
    let told: Vec<(&str, String)> =
        out.outbox.iter().map(|r| (r.to.as_str(), r.to_json()["memberId"].as_str().unwrap().to_owned())).collect();
    assert_eq!(told, vec![(ALICE, bob.to_string()), (BOB, alice.to_string())]);
    assert!(out.outbox.iter().all(|r| r.body.type_name() == "CONNECTED"));
    assert_eq!(sim.connections(ALICE), vec![(bob, scopes(EMAIL))]);
    assert_eq!(sim.connections(BOB), vec![(alice, scopes(EMAIL))]);
}

#[test]
fn repeated_offer_is_request_pending() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    sim.offer(ALICE, bob, EMAIL);
    rejected(&sim.send(ALICE, &connect(bob, BOTH)), Reason::RequestPending);
}

#[test]
fn crossed_offer_is_request_pending_and_not_acceptance() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let bob = sim.register(BOB);
    sim.offer(ALICE, bob, EMAIL);
    rejected(&sim.send(BOB, &connect(alice, EMAIL)), Reason::RequestPending);
    assert!(sim.connections(ALICE).is_empty());
    assert!(sim.connections(BOB).is_empty());
}

#[test]
fn self_connection_is_rejected() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    rejected(&sim.send(ALICE, &connect(alice, EMAIL)), Reason::SelfConnection);
    rejected(&sim.send(ALICE, &disconnect(alice)), Reason::SelfConnection);
}

#[test]
fn connect_to_missing_member_is_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    rejected(&sim.send(ALICE, &connect(MemberId([3; 16]), EMAIL)), Reason::UnknownMember);
}

#[test]
fn connect_to_already_connected_member_is_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    sim.register(BOB);
    let (alice, bob) = sim.befriend(ALICE, BOB);
    rejected(&sim.send(ALICE, &connect(bob, EMAIL)), Reason::AlreadyConnected);
    rejected(&sim.send(BOB, &connect(alice, EMAIL)), Reason::AlreadyConnected);
}

#[test]
fn either_member_may_disconnect() {
    for by_invitee in [false, true] {
        let mut sim = Sim::new();
        sim.register(ALICE);
        sim.register(BOB);
        let (alice, bob) = sim.befriend(ALICE, BOB);
        let (who, other, other_mailbox) = if by_invitee { (BOB, alice, ALICE) } else { (ALICE, bob, BOB) };
        let out = sim.run(who, &disconnect(other));
        assert_eq!(out.status, Status::Processed);
        assert_eq!(out.outbox[0].to.as_str(), who);
        assert_eq!(out.outbox[0].body.type_name(), "DISCONNECTED");
        assert_eq!(out.outbox[1].to.as_str(), other_mailbox, "the other member is told");
        assert!(sim.connections(ALICE).is_empty());
        assert!(sim.connections(BOB).is_empty());
    }
}

#[test]
fn disconnect_cancels_pending_offers() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(ALICE, bob, EMAIL);
    assert_eq!(sim.run(ALICE, &disconnect(bob)).status, Status::Processed);
    rejected(&sim.send(BOB, &accept(req, EMAIL)), Reason::UnknownRequest);
}

#[test]
fn old_accept_challenge_after_disconnect_cannot_resurrect_the_offer() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let bob = sim.register(BOB);
    let req = sim.offer(ALICE, bob, EMAIL);
    let (chl, code, _) = sim.request(BOB, &accept(req, EMAIL));
    // Bob revokes the pending offer, then redeems his old acceptance challenge.
    assert_eq!(sim.run(BOB, &disconnect(alice)).status, Status::Processed);
    rejected(&sim.verify(BOB, chl, &code), Reason::UnknownRequest);
    assert!(sim.connections(ALICE).is_empty());
    // Even after a new offer for the same pair, the old challenge names the old request.
    let new_req = sim.offer(ALICE, bob, EMAIL);
    assert_ne!(new_req, req);
    rejected(&sim.verify(BOB, chl, &code), Reason::ChallengeConsumed);
    assert!(sim.connections(BOB).is_empty());
}

#[test]
fn reconnect_needs_a_new_offer_and_acceptance() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    sim.register(BOB);
    let (_, bob) = sim.befriend(ALICE, BOB);
    let alice = sim.member_of(ALICE);
    sim.run(BOB, &disconnect(alice));
    let req = sim.offer(ALICE, bob, EMAIL);
    assert!(sim.connections(ALICE).is_empty());
    sim.run(BOB, &accept(req, EMAIL));
    assert_eq!(sim.connections(ALICE), vec![(bob, scopes(EMAIL))]);
}

#[test]
fn disconnect_without_edge_succeeds_idempotently() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    for _ in 0..2 {
        let out = sim.run(ALICE, &disconnect(bob));
        assert_eq!(out.status, Status::Processed);
        assert_eq!(out.outbox.len(), 1, "no edge, so only the caller is told");
        assert_eq!(out.outbox[0].body.type_name(), "DISCONNECTED");
    }
}

#[test]
fn disconnect_from_unknown_member_is_rejected() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    rejected(&sim.send(ALICE, &disconnect(MemberId([4; 16]))), Reason::UnknownMember);
}

#[test]
fn list_connections_needs_a_fresh_challenge_each_time() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let (chl, code, action) = sim.request(ALICE, &list());
    assert_eq!(action, Action::ListConnections);
    assert_eq!(sim.verify(ALICE, chl, &code).status, Status::Processed);
    rejected(&sim.verify(ALICE, chl, &code), Reason::ChallengeConsumed);
    let out = sim.send(ALICE, &list());
    assert_eq!(only(&out).body.type_name(), "CHALLENGE", "a repeat listing is challenged again");
}

#[test]
fn list_connections_returns_only_neighbour_ids_and_scopes() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    sim.register(BOB);
    sim.register(CAROL);
    let (_, bob) = sim.befriend(ALICE, BOB);
    let (_, carol) = sim.befriend(BOB, CAROL);
    let _ = carol;
    let out = sim.run(ALICE, &list());
    let json = only(&out).to_json();
    assert_eq!(json["connections"], serde_json::json!([{"memberId": bob.to_string(), "scopes": BOTH}]));
    assert!(!only(&out).body_text().contains("example.test"));
}

// ---- replies, dedup, budgets ----

#[test]
fn reply_bodies_carry_protocol_type_and_response_id() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let out = sim.send(BOB, &lookup(alice));
    let json = only(&out).to_json();
    assert_eq!(json["protocol"], "ASNET/1");
    assert_eq!(json["type"], "LOOKUP");
    assert_eq!(json["responseId"], only(&out).response_id.to_string());
    assert!(json["responseId"].as_str().unwrap().starts_with("rsp_"));
    let text = only(&out).body_text();
    assert!(text.is_ascii() && text.lines().all(|l| l.len() < 998));
}

#[test]
fn rejections_never_produce_mail() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let wrong = Code::parse(&"0".repeat(32)).unwrap();
    let outcomes = vec![
        sim.send(ALICE, "not json"),
        sim.send(BOB, &list()),
        sim.verify(ALICE, ChallengeId([1; 16]), &wrong),
        sim.send(ALICE, &connect(MemberId([7; 16]), EMAIL)),
    ];
    for out in outcomes {
        assert_eq!(out.status, Status::Rejected);
        assert!(out.outbox.is_empty());
    }
}

#[test]
fn duplicate_delivery_produces_no_reply() {
    let mut sim = Sim::new();
    let env = sim.envelope(ALICE, &register(None));
    assert_eq!(sim.deliver(&env).status, Status::Processed);
    sim.advance(DAY_MS - 1);
    ignored(&sim.deliver(&env), Reason::DuplicateDelivery);
}

#[test]
fn malformed_body_delivery_id_is_deduplicated() {
    let mut sim = Sim::new();
    let mut env = sim.envelope(ALICE, "{oops");
    rejected(&sim.deliver(&env), Reason::MalformedCommand);
    env.body = register(None);
    ignored(&sim.deliver(&env), Reason::DuplicateDelivery);
}

#[test]
fn failed_verification_delivery_id_is_deduplicated() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let mut env = sim
        .envelope(ALICE, &Command::Verify { challenge_id: chl, code: Code::parse(&"1".repeat(32)).unwrap() }.to_body());
    rejected(&sim.deliver(&env), Reason::WrongCode);
    env.body = Command::Verify { challenge_id: chl, code }.to_body();
    ignored(&sim.deliver(&env), Reason::DuplicateDelivery);
}

#[test]
fn delivery_id_is_forgotten_after_24_hours() {
    let mut sim = Sim::new();
    let alice = sim.register(ALICE);
    let env = sim.envelope(BOB, &lookup(alice));
    sim.deliver(&env);
    sim.advance(DAY_MS);
    assert_eq!(sim.deliver(&env).status, Status::Processed);
}

#[test]
fn resent_command_after_horizon_only_issues_a_new_challenge() {
    let mut sim = Sim::new();
    sim.register(ALICE);
    let bob = sim.register(BOB);
    let env = sim.envelope(ALICE, &connect(bob, EMAIL));
    let (chl, code, _) = challenge(&sim.deliver(&env), ALICE);
    let verify_env = sim.envelope(ALICE, &Command::Verify { challenge_id: chl, code }.to_body());
    assert_eq!(sim.deliver(&verify_env).status, Status::Processed);
    sim.advance(DAY_MS + 1);
    // The old VERIFY mail resent: refused, nothing mutates.
    rejected(&sim.deliver(&verify_env), Reason::ChallengeConsumed);
    // The old CONNECT mail resent: at most a new challenge (the old offer expired).
    let out = sim.deliver(&env);
    let (chl2, _, _) = challenge(&out, ALICE);
    assert_ne!(chl2, chl);
}

#[test]
fn thirty_first_attempt_in_an_hour_is_rate_limited() {
    let mut sim = Sim::new();
    for _ in 0..30 {
        sim.send(ALICE, "x");
        sim.advance(1000);
    }
    rejected(&sim.send(ALICE, &register(None)), Reason::SenderRateLimited);
    assert_eq!(sim.send(BOB, &register(None)).status, Status::Processed, "other senders are unaffected");
}

#[test]
fn sender_budget_rolls_over_after_an_hour() {
    let mut sim = Sim::new();
    for _ in 0..30 {
        sim.send(ALICE, "x");
    }
    rejected(&sim.send(ALICE, &register(None)), Reason::SenderRateLimited);
    sim.advance(HOUR_MS - 1);
    rejected(&sim.send(ALICE, &register(None)), Reason::SenderRateLimited);
    sim.advance(1);
    assert_eq!(sim.send(ALICE, &register(None)).status, Status::Processed);
}

#[test]
fn thousand_and_first_attempt_globally_is_rate_limited() {
    let mut sim = Sim::new();
    for i in 0..1000 {
        let out = sim.send(&format!("user{i}@example.test"), "x");
        rejected(&out, Reason::MalformedCommand);
    }
    rejected(&sim.send(ALICE, &register(None)), Reason::GlobalRateLimited);
    sim.advance(HOUR_MS);
    assert_eq!(sim.send(ALICE, &register(None)).status, Status::Processed);
}

#[test]
fn memory_store_passes_the_conformance_suite() {
    conformance::run(MemoryStore::new);
}

#[test]
fn store_sweep_never_changes_a_decision() {
    let mut sim = Sim::new();
    let (chl, code, _) = sim.request(ALICE, &register(None));
    let env = sim.envelope(ALICE, &Command::Verify { challenge_id: chl, code }.to_body());
    assert_eq!(sim.deliver(&env).status, Status::Processed);
    sim.store.sweep(sim.now).unwrap();
    ignored(&sim.deliver(&env), Reason::DuplicateDelivery);
    sim.advance(DAY_MS);
    sim.store.sweep(sim.now).unwrap();
    assert_eq!(sim.store.delivery_count(), 0);
    assert_eq!(sim.store.challenge_count(), 0);
    rejected(&sim.deliver(&env), Reason::UnknownChallenge);
}

// ---- outbox ----

fn queued(sim: &mut Sim) -> Entry {
    let out = sim.send(ALICE, &register(None));
    Entry::from_reply(only(&out))
}

#[test]
fn outbox_retries_at_most_five_times_with_backoff() {
    let mut sim = Sim::new();
    let mut e = queued(&mut sim);
    let mut now = sim.now;
    let mut waits = Vec::new();
    for _ in 0..5 {
        assert!(e.is_due(now));
        e.record(Attempt::Temporary, now);
        assert_eq!(e.state, EntryState::Queued);
        waits.push(e.next_attempt_at - now);
        assert!(!e.is_due(now));
        now = e.next_attempt_at;
    }
    assert_eq!(waits, vec![2000, 4000, 8000, 16_000, 32_000]);
    e.record(Attempt::Temporary, now);
    assert_eq!(e.state, EntryState::Dead, "the sixth failed attempt (fifth retry) is the last");
}

#[test]
fn permanent_failure_is_not_retried() {
    let mut sim = Sim::new();
    let mut e = queued(&mut sim);
    e.record(Attempt::Permanent, sim.now);
    assert_eq!(e.state, EntryState::Dead);
    assert!(!e.is_due(sim.now + HOUR_MS));
}

#[test]
fn outbox_paces_sends_one_second_apart() {
    let mut sim = Sim::new();
    let entries = vec![queued(&mut sim), queued(&mut sim), queued(&mut sim)];
    let mut entries = entries;
    let mut pacer = Pacer::default();
    let mut now = sim.now;
    let mut sent_at = Vec::new();
    loop {
        match outbox::next(&entries, &pacer, now) {
            Next::Send(i) => {
                pacer.record_send(now);
                entries[i].record(Attempt::Sent, now);
                sent_at.push(now);
            }
            Next::WaitUntil(t) => {
                assert!(t > now);
                now = t;
            }
            Next::Idle => break,
        }
    }
    assert_eq!(sent_at, vec![sim.now, sim.now + 1000, sim.now + 2000]);
}

#[test]
fn outbox_reply_expires_after_fifteen_minutes() {
    let mut sim = Sim::new();
    let mut e = queued(&mut sim);
    assert!(e.is_due(sim.now + 15 * 60_000 - 1));
    assert!(!e.is_due(sim.now + 15 * 60_000));
    assert_eq!(outbox::next(std::slice::from_ref(&e), &Pacer::default(), sim.now + 15 * 60_000), Next::Idle);
    assert!(e.expire(sim.now + 15 * 60_000));
    assert_eq!(e.state, EntryState::Expired);
}

#[test]
fn sent_dead_and_expired_entries_lose_their_body() {
    let mut sim = Sim::new();
    let (mut a, mut b, mut c) = (queued(&mut sim), queued(&mut sim), queued(&mut sim));
    assert!(a.body.contains("\"code\""));
    a.record(Attempt::Sent, sim.now);
    b.record(Attempt::Permanent, sim.now);
    c.expire(sim.now + HOUR_MS);
    for e in [a, b, c] {
        assert!(e.body.is_empty(), "{:?}", e.state);
    }
}

#[test]
fn rendered_reply_is_auto_generated_with_a_stable_response_id() {
    let mut sim = Sim::new();
    let e = queued(&mut sim);
    let service = Mailbox::parse(SERVICE).unwrap();
    let first = String::from_utf8(super::mime::render_reply(&e, &service, sim.now)).unwrap();
    let retry = String::from_utf8(super::mime::render_reply(&e, &service, sim.now + 4000)).unwrap();
    let rid = e.response_id.to_string();
    for mail in [&first, &retry] {
        assert!(mail.contains("\r\nAuto-Submitted: auto-generated\r\n"));
        assert!(mail.contains(&format!("\r\nX-ASNET-Response-ID: {rid}\r\n")));
        assert!(mail.contains(&format!("\r\nMessage-ID: <{rid}@example.test>\r\n")));
        assert!(
            mail.starts_with("From: network@example.test\r\nTo: alice@example.test\r\nSubject: ASNET/1 CHALLENGE\r\n")
        );
        assert!(mail.is_ascii() && mail.split("\r\n").all(|l| l.len() <= 998));
    }
    assert!(first.contains("\r\nDate: Wed, 30 Sep 2026 00:00:00 +0000\r\n"));
    let (_, body) = first.split_once("\r\n\r\n").unwrap();
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["responseId"], rid);
}

#[test]
fn rendered_reply_fed_back_is_refused_as_automatic() {
    let mut sim = Sim::new();
    let e = queued(&mut sim);
    let service = Mailbox::parse(SERVICE).unwrap();
    let mail = super::mime::render_reply(&e, &service, sim.now);
    let mut env = sim.envelope(SERVICE, "");
    env.body = String::from_utf8(mail.clone()).unwrap();
    env.auto_submitted = Some("auto-generated".into());
    ignored(&sim.deliver(&env), Reason::SelfSent);
    env.sender = ALICE.into();
    ignored(&sim.deliver(&env), Reason::AutoSubmitted);
}

#[test]
fn rfc5322_dates_are_correct() {
    assert_eq!(super::mime::rfc5322_date(0), "Thu, 01 Jan 1970 00:00:00 +0000");
    assert_eq!(super::mime::rfc5322_date(T0), "Wed, 30 Sep 2026 00:00:00 +0000");
    assert_eq!(super::mime::rfc5322_date(951_827_696_000), "Tue, 29 Feb 2000 12:34:56 +0000");
}

mod mime_tests {
    //! | refusal (issue 18's MIME rules) | test |
    //! |---|---|
    //! | accepted: display names ignored, QP and base64 decoded | `plain_mail_becomes_the_trusted_envelope`, `display_names_are_ignored`, `quoted_printable_and_base64_bodies_are_decoded`, `mail_runs_through_the_core_end_to_end` |
    //! | 32 KB raw, 8 KB headers | `mail_over_32_kib_is_refused`, `headers_over_8_kib_are_refused` |
    //! | RCPT TO is the service address, exactly one | `rcpt_to_another_address_is_refused`, `several_rcpt_to_are_refused` |
    //! | MAIL FROM equals From | `mail_from_differing_from_from_is_refused`, `unusable_mail_from_is_refused` |
    //! | exactly one From and To | `missing_from_is_refused`, `missing_to_is_refused`, `two_from_addresses_are_refused`, `group_address_is_refused`, `duplicate_from_field_is_refused`, `to_another_mailbox_is_refused` |
    //! | ambiguous senders | `sender_field_naming_someone_else_is_refused` |
    //! | lists | `list_id_is_refused`, `precedence_bulk_is_refused` |
    //! | Reply-To, Cc/Bcc | `reply_to_is_refused`, `cc_is_refused`, `bcc_is_refused` |
    //! | duplicates | `duplicate_subject_is_refused` |
    //! | forwarded (Resent-*) | `resent_mail_is_refused` |
    //! | attachments, multipart, HTML, other types | `multipart_mail_is_refused`, `attachment_disposition_is_refused`, `html_mail_is_refused`, `other_content_types_are_refused`, `format_flowed_is_refused` |
    //! | UTF-8/ASCII only | `other_charsets_are_refused`, `invalid_utf8_body_is_refused`, `non_ascii_in_ascii_body_is_refused`, `non_ascii_header_is_refused`, `unknown_transfer_encoding_is_refused`, `broken_quoted_printable_is_refused` |
    //! | bounces and DSNs | `null_reverse_path_is_refused_as_bounce`, `delivery_status_report_is_refused`, `failed_recipients_header_is_refused` |
    //! | Auto-Submitted other than no | `auto_submitted_other_than_no_is_refused`, `auto_submitted_no_is_accepted` |
    //! | SPF, DKIM, DMARC pass from our authserv-id | `missing_authentication_results_is_refused`, `foreign_authserv_id_is_not_trusted`, `two_results_from_our_authserv_id_are_refused`, `spf_fail_is_refused`, `dkim_fail_is_refused`, `dmarc_fail_is_refused`, `dmarc_for_another_domain_is_refused`, `malformed_authentication_results_is_refused`, `authentication_results_with_comments_and_spaces_parses` |
    //! | delivery id = topmost Received queue id | `delivery_id_is_the_topmost_received_queue_id`, `missing_received_is_refused`, `received_without_queue_id_is_refused` |
    //! | line syntax | `bare_line_feed_is_refused`, `nul_byte_is_refused`, `malformed_header_line_is_refused`, `mail_without_body_separator_is_refused` |

    use super::*;
    use crate::protocol::asnet::mime::{MAX_HEADER_BYTES, MAX_RAW_BYTES, Policy, Refusal, SmtpEnvelope, adapt};

    const AR: &str = "Authentication-Results: mx.example.test; spf=pass smtp.mailfrom=alice@example.test; dkim=pass header.d=example.test header.s=sel header.b=Ab/c+D=; dmarc=pass (p=reject) header.from=example.test";
    const RECEIVED: &str = "Received: from mail.example.test (mail.example.test [198.18.0.2])\r\n\t(using TLSv1.3 with cipher TLS_AES_256_GCM_SHA384 (256/256 bits))\r\n\tby mx.example.test (Postfix) with ESMTPS id 4Q7xYz1AbCdEf\r\n\tfor <network@example.test>; Thu, 01 Oct 2026 00:00:00 +0000 (UTC)";

    fn policy() -> Policy {
        Policy { service: Mailbox::parse(SERVICE).unwrap(), authserv_id: "mx.example.test".into() }
    }

    fn headers() -> Vec<String> {
        vec![
            RECEIVED.into(),
            AR.into(),
            "From: Alice <alice@example.test>".into(),
            "To: network@example.test".into(),
            "Subject: asnet".into(),
            "Date: Thu, 01 Oct 2026 00:00:00 +0000".into(),
            "Message-ID: <1@example.test>".into(),
            "MIME-Version: 1.0".into(),
            "Content-Type: text/plain; charset=utf-8".into(),
        ]
    }

    fn build(headers: &[String], body: &str) -> Vec<u8> {
        let mut s = String::new();
        for h in headers {
            s.push_str(h);
            s.push_str("\r\n");
        }
        s.push_str("\r\n");
        s.push_str(body);
        s.into_bytes()
    }

    fn body() -> String {
        format!("{}\r\n", register(Some(true)))
    }

    fn adapt_with(raw: &[u8], mail_from: &str, rcpt: &[&str]) -> Result<EnvelopeIn, Refusal> {
        let rcpt: Vec<String> = rcpt.iter().map(|s| (*s).to_owned()).collect();
        adapt(raw, SmtpEnvelope { mail_from, rcpt_to: &rcpt }, &policy())
    }

    fn run(headers: &[String], body: &str) -> Result<EnvelopeIn, Refusal> {
        adapt_with(&build(headers, body), ALICE, &[SERVICE])
    }

    /// The good headers with `name` replaced by `line` (or removed when `line` is empty).
    fn with(name: &str, line: &str) -> Vec<String> {
        let mut h: Vec<String> = headers()
            .into_iter()
            .filter(|l| !l.to_ascii_lowercase().starts_with(&format!("{}:", name.to_ascii_lowercase())))
            .collect();
        if !line.is_empty() {
            h.push(line.into());
        }
        h
    }

    fn plus(line: &str) -> Vec<String> {
        let mut h = headers();
        h.push(line.into());
        h
    }

    #[test]
    fn plain_mail_becomes_the_trusted_envelope() {
        let env = run(&headers(), &body()).unwrap();
        assert_eq!(env.sender, ALICE);
        assert_eq!(env.recipient, SERVICE);
        assert_eq!(env.delivery_id, "4Q7xYz1AbCdEf");
        assert_eq!(env.auto_submitted, None);
        assert_eq!(env.body, body());
    }

    #[test]
    fn display_names_are_ignored() {
        for from in [
            "From: alice@example.test",
            "From: \"Bob <bob@evil.test>, x\" <alice@example.test>",
            "From: =?utf-8?q?Al=C3=ADce?= <alice@EXAMPLE.test>",
        ] {
            let env = run(&with("from", from), &body()).unwrap();
            assert_eq!(env.sender, ALICE, "{from}");
        }
    }

    #[test]
    fn quoted_printable_and_base64_bodies_are_decoded() {
        let cmd = register(Some(true));
        let (a, b) = cmd.split_at(20);
        let qp = format!("{}=\r\n{}\r\n", a.replace('=', "=3D"), b.replace('=', "=3D"));
        let mut h = headers();
        h.push("Content-Transfer-Encoding: quoted-printable".into());
        assert_eq!(run(&h, &qp).unwrap().body, format!("{cmd}\r\n"));
        let b64 = data_encoding::BASE64.encode(cmd.as_bytes());
        let (x, y) = b64.split_at(16);
        let mut h = headers();
        h.push("Content-Transfer-Encoding: base64".into());
        assert_eq!(run(&h, &format!("{x}\r\n{y}\r\n")).unwrap().body, cmd);
    }

    #[test]
    fn mail_runs_through_the_core_end_to_end() {
        let mut sim = Sim::new();
        let env = run(&headers(), &body()).unwrap();
        let out = sim.deliver(&env);
        let (chl, code, _) = challenge(&out, ALICE);
        let mut h = with("received", &RECEIVED.replace("4Q7xYz1AbCdEf", "4Q7xYz1AbCdEg"));
        h.retain(|l| !l.starts_with("Message-ID"));
        let env = run(&h, &Command::Verify { challenge_id: chl, code }.to_body()).unwrap();
        let out = sim.deliver(&env);
        assert_eq!(only(&out).body.type_name(), "REGISTERED");
        // The same mail delivered again by the MTA (same queue id) is a duplicate.
        ignored(&sim.deliver(&env), Reason::DuplicateDelivery);
    }

    #[test]
    fn mail_over_32_kib_is_refused() {
        let raw = build(&headers(), &" ".repeat(MAX_RAW_BYTES));
        assert_eq!(adapt_with(&raw, ALICE, &[SERVICE]), Err(Refusal::TooLarge));
    }

    #[test]
    fn headers_over_8_kib_are_refused() {
        let h = plus(&format!("X-Pad: {}", "a".repeat(MAX_HEADER_BYTES)));
        assert_eq!(run(&h, &body()), Err(Refusal::HeadersTooLarge));
    }

    #[test]
    fn rcpt_to_another_address_is_refused() {
        assert_eq!(
            adapt_with(&build(&headers(), &body()), ALICE, &["other@example.test"]),
            Err(Refusal::WrongRecipient)
        );
    }

    #[test]
    fn several_rcpt_to_are_refused() {
        assert_eq!(adapt_with(&build(&headers(), &body()), ALICE, &[SERVICE, BOB]), Err(Refusal::RecipientCount));
        assert_eq!(adapt_with(&build(&headers(), &body()), ALICE, &[]), Err(Refusal::RecipientCount));
    }

    #[test]
    fn mail_from_differing_from_from_is_refused() {
        assert_eq!(adapt_with(&build(&headers(), &body()), BOB, &[SERVICE]), Err(Refusal::SenderMismatch));
    }

    #[test]
    fn unusable_mail_from_is_refused() {
        assert_eq!(adapt_with(&build(&headers(), &body()), "alice", &[SERVICE]), Err(Refusal::MailFrom));
    }

    #[test]
    fn missing_from_is_refused() {
        assert_eq!(run(&with("from", ""), &body()), Err(Refusal::MissingFrom));
    }

    #[test]
    fn missing_to_is_refused() {
        assert_eq!(run(&with("to", ""), &body()), Err(Refusal::MissingTo));
    }

    #[test]
    fn two_from_addresses_are_refused() {
        assert_eq!(
            run(&with("from", "From: alice@example.test, bob@example.test"), &body()),
            Err(Refusal::MalformedAddress)
        );
        assert_eq!(
            run(&with("from", "From: Alice <alice@example.test>, Bob <bob@example.test>"), &body()),
            Err(Refusal::MalformedAddress)
        );
        assert_eq!(
            run(&with("to", "To: network@example.test, bob@example.test"), &body()),
            Err(Refusal::MalformedAddress)
        );
    }

    #[test]
    fn group_address_is_refused() {
        assert_eq!(run(&with("from", "From: friends: alice@example.test;"), &body()), Err(Refusal::MalformedAddress));
        assert_eq!(run(&with("from", "From: alice@example.test (Alice)"), &body()), Err(Refusal::MalformedAddress));
    }

    #[test]
    fn duplicate_from_field_is_refused() {
        assert_eq!(run(&plus("From: alice@example.test"), &body()), Err(Refusal::DuplicateHeader));
    }

    #[test]
    fn to_another_mailbox_is_refused() {
        assert_eq!(run(&with("to", "To: someone@example.test"), &body()), Err(Refusal::ToNotService));
    }

    #[test]
    fn sender_field_naming_someone_else_is_refused() {
        assert_eq!(run(&plus("Sender: bob@example.test"), &body()), Err(Refusal::AmbiguousSender));
        assert!(run(&plus("Sender: Alice <alice@example.test>"), &body()).is_ok());
    }

    #[test]
    fn list_id_is_refused() {
        assert_eq!(run(&plus("List-Id: <agents.example.test>"), &body()), Err(Refusal::List));
        assert_eq!(run(&plus("List-Unsubscribe: <mailto:x@example.test>"), &body()), Err(Refusal::List));
    }

    #[test]
    fn precedence_bulk_is_refused() {
        assert_eq!(run(&plus("Precedence: bulk"), &body()), Err(Refusal::List));
    }

    #[test]
    fn reply_to_is_refused() {
        assert_eq!(run(&plus("Reply-To: mallory@example.test"), &body()), Err(Refusal::ReplyTo));
    }

    #[test]
    fn cc_is_refused() {
        assert_eq!(run(&plus("Cc: bob@example.test"), &body()), Err(Refusal::CcBcc));
    }

    #[test]
    fn bcc_is_refused() {
        assert_eq!(run(&plus("bcc: bob@example.test"), &body()), Err(Refusal::CcBcc));
    }

    #[test]
    fn duplicate_subject_is_refused() {
        assert_eq!(run(&plus("SUBJECT: again"), &body()), Err(Refusal::DuplicateHeader));
    }

    #[test]
    fn resent_mail_is_refused() {
        assert_eq!(run(&plus("Resent-From: bob@example.test"), &body()), Err(Refusal::Resent));
    }

    #[test]
    fn multipart_mail_is_refused() {
        let h = with("content-type", "Content-Type: multipart/mixed; boundary=\"b\"");
        assert_eq!(run(&h, "--b\r\n\r\nx\r\n--b--\r\n"), Err(Refusal::Multipart));
        let h = with("content-type", "Content-Type: multipart/alternative; boundary=b");
        assert_eq!(run(&h, &body()), Err(Refusal::Multipart));
    }

    #[test]
    fn attachment_disposition_is_refused() {
        assert_eq!(run(&plus("Content-Disposition: attachment; filename=cmd.json"), &body()), Err(Refusal::Attachment));
        assert!(run(&plus("Content-Disposition: inline"), &body()).is_ok());
    }

    #[test]
    fn html_mail_is_refused() {
        assert_eq!(run(&with("content-type", "Content-Type: text/html; charset=utf-8"), &body()), Err(Refusal::Html));
    }

    #[test]
    fn other_content_types_are_refused() {
        assert_eq!(run(&with("content-type", "Content-Type: application/json"), &body()), Err(Refusal::NotPlainText));
        assert_eq!(
            run(&with("content-type", "Content-Type: text/plain; name=x.json"), &body()),
            Err(Refusal::NotPlainText)
        );
    }

    #[test]
    fn format_flowed_is_refused() {
        let h = with("content-type", "Content-Type: text/plain; charset=utf-8; format=flowed");
        assert_eq!(run(&h, &body()), Err(Refusal::NotPlainText));
    }

    #[test]
    fn other_charsets_are_refused() {
        let h = with("content-type", "Content-Type: text/plain; charset=iso-8859-1");
        assert_eq!(run(&h, &body()), Err(Refusal::Charset));
        let h = with("content-type", "Content-Type: text/plain; charset=\"UTF-8\"");
        assert!(run(&h, &body()).is_ok(), "charset names are case-insensitive and may be quoted");
    }

    #[test]
    fn invalid_utf8_body_is_refused() {
        let mut raw = build(&headers(), "");
        raw.extend_from_slice(b"{\"protocol\":\"ASNET/1\",\"command\":\"REGISTER\xff\"}");
        assert_eq!(adapt_with(&raw, ALICE, &[SERVICE]), Err(Refusal::BodyNotText));
    }

    #[test]
    fn non_ascii_in_ascii_body_is_refused() {
        let h = with("content-type", "");
        assert_eq!(run(&h, "{\"x\":\"é\"}"), Err(Refusal::BodyNotText));
        assert!(run(&h, &body()).is_ok(), "no Content-Type is US-ASCII text");
    }

    #[test]
    fn non_ascii_header_is_refused() {
        assert_eq!(run(&with("subject", "Subject: héllo"), &body()), Err(Refusal::NonAsciiHeader));
    }

    #[test]
    fn unknown_transfer_encoding_is_refused() {
        assert_eq!(run(&plus("Content-Transfer-Encoding: binary"), &body()), Err(Refusal::TransferEncoding));
        assert_eq!(run(&plus("Content-Transfer-Encoding: x-uuencode"), &body()), Err(Refusal::TransferEncoding));
    }

    #[test]
    fn broken_quoted_printable_is_refused() {
        let h = plus("Content-Transfer-Encoding: quoted-printable");
        assert_eq!(run(&h, "{=ZZ}\r\n"), Err(Refusal::BodyEncoding));
        let h = plus("Content-Transfer-Encoding: base64");
        assert_eq!(run(&h, "not base64!\r\n"), Err(Refusal::BodyEncoding));
    }

    #[test]
    fn null_reverse_path_is_refused_as_bounce() {
        assert_eq!(adapt_with(&build(&headers(), &body()), "", &[SERVICE]), Err(Refusal::Bounce));
    }

    #[test]
    fn delivery_status_report_is_refused() {
        let h = with("content-type", "Content-Type: multipart/report; report-type=delivery-status; boundary=b");
        assert_eq!(run(&h, &body()), Err(Refusal::Dsn));
        let h = with("content-type", "Content-Type: message/delivery-status");
        assert_eq!(run(&h, &body()), Err(Refusal::Dsn));
    }

    #[test]
    fn failed_recipients_header_is_refused() {
        assert_eq!(run(&plus("X-Failed-Recipients: bob@example.test"), &body()), Err(Refusal::Dsn));
    }

    #[test]
    fn auto_submitted_other_than_no_is_refused() {
        for v in ["auto-replied", "auto-generated", "auto-notified; owner-email=x@example.test"] {
            assert_eq!(run(&plus(&format!("Auto-Submitted: {v}")), &body()), Err(Refusal::AutoSubmitted), "{v}");
        }
    }

    #[test]
    fn auto_submitted_no_is_accepted() {
        let env = run(&plus("Auto-Submitted: no (sent deliberately)"), &body()).unwrap();
        assert_eq!(env.auto_submitted.as_deref(), Some("no"));
    }

    #[test]
    fn missing_authentication_results_is_refused() {
        assert_eq!(run(&with("authentication-results", ""), &body()), Err(Refusal::MissingAuthResults));
    }

    #[test]
    fn foreign_authserv_id_is_not_trusted() {
        let h = with("authentication-results", &AR.replace("mx.example.test", "mx.evil.test"));
        assert_eq!(run(&h, &body()), Err(Refusal::MissingAuthResults));
    }

    #[test]
    fn two_results_from_our_authserv_id_are_refused() {
        assert_eq!(run(&plus(AR), &body()), Err(Refusal::AmbiguousAuthResults));
    }

    #[test]
    fn spf_fail_is_refused() {
        let h = with("authentication-results", &AR.replace("spf=pass", "spf=softfail"));
        assert_eq!(run(&h, &body()), Err(Refusal::SpfFailed));
        let h = with("authentication-results", &AR.replace("spf=pass smtp.mailfrom=alice@example.test; ", ""));
        assert_eq!(run(&h, &body()), Err(Refusal::SpfFailed));
    }

    #[test]
    fn dkim_fail_is_refused() {
        let h = with("authentication-results", &AR.replace("dkim=pass", "dkim=fail"));
        assert_eq!(run(&h, &body()), Err(Refusal::DkimFailed));
    }

    #[test]
    fn dmarc_fail_is_refused() {
        let h = with("authentication-results", &AR.replace("dmarc=pass", "dmarc=fail"));
        assert_eq!(run(&h, &body()), Err(Refusal::DmarcFailed));
        let h = with("authentication-results", &format!("{AR}; dmarc=pass header.from=example.test"));
        assert_eq!(run(&h, &body()), Err(Refusal::DmarcFailed), "two DMARC results are ambiguous");
    }

    #[test]
    fn dmarc_for_another_domain_is_refused() {
        let h = with("authentication-results", &AR.replace("header.from=example.test", "header.from=evil.test"));
        assert_eq!(run(&h, &body()), Err(Refusal::DmarcFailed));
    }

    #[test]
    fn malformed_authentication_results_is_refused() {
        let h = with("authentication-results", "Authentication-Results: mx.example.test; spf pass");
        assert_eq!(run(&h, &body()), Err(Refusal::MalformedAuthResults));
        let h = with("authentication-results", "Authentication-Results: mx.example.test x y; spf=pass");
        assert_eq!(run(&h, &body()), Err(Refusal::MalformedAuthResults));
    }

    #[test]
    fn authentication_results_with_comments_and_spaces_parses() {
        let ar = "Authentication-Results: mx.example.test 1; (checked)\r\n spf = pass (sender OK) smtp.mailfrom=alice@example.test;\r\n dkim=pass reason=\"good; signature\" header.d=example.test;\r\n dkim=fail header.d=other.test; dmarc=pass header.from=\"example.test\"";
        assert!(run(&with("authentication-results", ar), &body()).is_ok());
        let mut h = with("authentication-results", ar);
        h.push("Authentication-Results: other.example; spf=fail".into());
        assert!(run(&h, &body()).is_ok(), "other authserv-ids are ignored");
    }

    #[test]
    fn delivery_id_is_the_topmost_received_queue_id() {
        let mut h = headers();
        h.push("Received: from evil by evil.test with SMTP id FORGED; Thu, 01 Oct 2026 00:00:00 +0000".into());
        assert_eq!(run(&h, &body()).unwrap().delivery_id, "4Q7xYz1AbCdEf");
    }

    #[test]
    fn missing_received_is_refused() {
        assert_eq!(run(&with("received", ""), &body()), Err(Refusal::MissingReceived));
    }

    #[test]
    fn received_without_queue_id_is_refused() {
        let h = with("received", "Received: from a by mx.example.test; Thu, 01 Oct 2026 00:00:00 +0000");
        assert_eq!(run(&h, &body()), Err(Refusal::MalformedReceived));
        let h = with("received", "Received: from a with SMTP id ABC; Thu, 01 Oct 2026 00:00:00 +0000");
        assert_eq!(run(&h, &body()), Err(Refusal::MalformedReceived), "no by clause");
    }

    #[test]
    fn bare_line_feed_is_refused() {
        let mut raw = build(&headers(), &body());
        raw.extend_from_slice(b"\nsmuggled\r\n");
        assert_eq!(adapt_with(&raw, ALICE, &[SERVICE]), Err(Refusal::BareLineBreak));
        let raw = build(&headers(), "{}\rX");
        assert_eq!(adapt_with(&raw, ALICE, &[SERVICE]), Err(Refusal::BareLineBreak));
    }

    #[test]
    fn nul_byte_is_refused() {
        assert_eq!(run(&headers(), "{\0}"), Err(Refusal::NulByte));
    }

    #[test]
    fn malformed_header_line_is_refused() {
        assert_eq!(run(&plus("No colon here"), &body()), Err(Refusal::MalformedHeader));
        assert_eq!(run(&plus("Bad Name: x"), &body()), Err(Refusal::MalformedHeader));
        let mut h = vec![" folded first".to_owned()];
        h.extend(headers());
        assert_eq!(run(&h, &body()), Err(Refusal::MalformedHeader));
    }

    #[test]
    fn mail_without_body_separator_is_refused() {
        let mut raw = Vec::new();
        for line in headers() {
            raw.extend_from_slice(line.as_bytes());
            raw.extend_from_slice(b"\r\n");
        }
        assert_eq!(adapt_with(&raw, ALICE, &[SERVICE]), Err(Refusal::NoBody));
    }
}
