//! The narrow storage trait the ASNET/1 service runs against, its records, an in-memory
//! implementation (the simulator; tests, fuzzing, benches) and a conformance suite every backend
//! must pass ([`conformance`]).
//!
//! The service reads and writes through [`Store`] during one `receive`; the caller wraps the call
//! in one transaction and commits whatever `Ok` outcome comes back (rejections change state too:
//! consumed challenges, wrong-guess counters, delivery ids, budgets). Expiry is always checked by
//! the service against `now`; [`Store::sweep`] only reclaims space.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;

use super::{
    BUDGET_WINDOW_MS, ChallengeId, DELIVERY_DEDUP_MS, DeliveryId, Mailbox, MemberId, RequestId, Scopes, command::Action,
};

/// A registered member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Stable id (kept across re-registration).
    pub id: MemberId,
    /// The verified, normalized mailbox. Never published.
    pub mailbox: Mailbox,
    /// Whether the public discovery marker is shown.
    pub discovery: bool,
    /// When the member first registered (Unix ms).
    pub created_at: i64,
}

/// Where a challenge is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeState {
    /// Can be redeemed.
    Open,
    /// Redeemed (the record stays until expiry so a replay is named as one).
    Consumed,
    /// Five wrong guesses: never redeemable.
    Locked,
}

impl ChallengeState {
    /// The storage name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeState::Open => "open",
            ChallengeState::Consumed => "consumed",
            ChallengeState::Locked => "locked",
        }
    }

    /// Parses the storage name.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "open" => Some(ChallengeState::Open),
            "consumed" => Some(ChallengeState::Consumed),
            "locked" => Some(ChallengeState::Locked),
            _ => None,
        }
    }
}

/// A challenge: bound to one mailbox and one exact action; only the code's hash is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The id mailed with the code.
    pub id: ChallengeId,
    /// The only mailbox that may redeem it.
    pub mailbox: Mailbox,
    /// The exact action it authorizes.
    pub action: Action,
    /// `Code::hash(id)`.
    pub code_hash: [u8; 32],
    /// Redeemable while `now < expires_at` (Unix ms).
    pub expires_at: i64,
    /// Incorrect well-formed guesses so far.
    pub wrong_guesses: u32,
    /// Open, consumed or locked.
    pub state: ChallengeState,
}

/// A pending connection offer from one member to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The request id sent in the invitation.
    pub id: RequestId,
    /// The proposer.
    pub from: MemberId,
    /// The invitee, the only member who may accept.
    pub to: MemberId,
    /// The proposed scopes (an acceptance picks a subset).
    pub scopes: Scopes,
    /// Acceptable while `now < expires_at` (Unix ms).
    pub expires_at: i64,
}

/// An unordered pair of distinct members (the smaller id first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pair {
    low: MemberId,
    high: MemberId,
}

impl Pair {
    /// The pair of `a` and `b`, in either order; `None` when they are the same member.
    pub fn new(a: MemberId, b: MemberId) -> Option<Self> {
        match a.cmp(&b) {
            std::cmp::Ordering::Less => Some(Self { low: a, high: b }),
            std::cmp::Ordering::Greater => Some(Self { low: b, high: a }),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// The smaller id.
    pub fn low(&self) -> MemberId {
        self.low
    }

    /// The larger id.
    pub fn high(&self) -> MemberId {
        self.high
    }

    /// Whether `m` is one of the two.
    pub fn contains(&self, m: &MemberId) -> bool {
        self.low == *m || self.high == *m
    }

    /// The member of the pair that is not `m`.
    pub fn other(&self, m: &MemberId) -> MemberId {
        if self.low == *m { self.high } else { self.low }
    }
}

/// An undirected connection with the scopes the invitee approved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The two members.
    pub pair: Pair,
    /// The approved scopes.
    pub scopes: Scopes,
    /// When it was written (Unix ms).
    pub created_at: i64,
}

/// What the service needs from storage. Every method may fail with the backend's error, which
/// aborts `receive` (the caller rolls back). Reads take `&mut self` so a backend can run them on
/// an open transaction.
pub trait Store {
    /// The backend's error (a local fault).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether `id` was recorded at or after `since`.
    fn delivery_seen_since(&mut self, id: &DeliveryId, since: i64) -> Result<bool, Self::Error>;
    /// Records `id` as delivered at `at` (replacing an older record).
    fn record_delivery(&mut self, id: &DeliveryId, at: i64) -> Result<(), Self::Error>;
    /// Admitted attempts from `sender` at or after `since`.
    fn sender_attempts_since(&mut self, sender: &Mailbox, since: i64) -> Result<u32, Self::Error>;
    /// Admitted attempts from anyone at or after `since`.
    fn global_attempts_since(&mut self, since: i64) -> Result<u32, Self::Error>;
    /// Records one admitted attempt.
    fn record_attempt(&mut self, sender: &Mailbox, at: i64) -> Result<(), Self::Error>;

    /// The member with this id.
    fn member(&mut self, id: &MemberId) -> Result<Option<Member>, Self::Error>;
    /// The member with this mailbox.
    fn member_by_mailbox(&mut self, mailbox: &Mailbox) -> Result<Option<Member>, Self::Error>;
    /// Inserts or replaces the member with `member.id`.
    fn put_member(&mut self, member: &Member) -> Result<(), Self::Error>;

    /// The challenge with this id, whatever its state.
    fn challenge(&mut self, id: &ChallengeId) -> Result<Option<Challenge>, Self::Error>;
    /// Inserts or replaces the challenge with `challenge.id`.
    fn put_challenge(&mut self, challenge: &Challenge) -> Result<(), Self::Error>;

    /// The offer with this id.
    fn offer(&mut self, id: &RequestId) -> Result<Option<Offer>, Self::Error>;
    /// Offers between the two members, in either direction, expired or not.
    fn offers_between(&mut self, pair: &Pair) -> Result<Vec<Offer>, Self::Error>;
    /// Inserts an offer.
    fn put_offer(&mut self, offer: &Offer) -> Result<(), Self::Error>;
    /// Deletes an offer (no error if absent).
    fn delete_offer(&mut self, id: &RequestId) -> Result<(), Self::Error>;

    /// The edge of this pair.
    fn edge(&mut self, pair: &Pair) -> Result<Option<Edge>, Self::Error>;
    /// Inserts or replaces the edge of `edge.pair`.
    fn put_edge(&mut self, edge: &Edge) -> Result<(), Self::Error>;
    /// Deletes the edge of this pair (no error if absent).
    fn delete_edge(&mut self, pair: &Pair) -> Result<(), Self::Error>;
    /// Every edge that touches `member`, ordered by the other member's id.
    fn edges_of(&mut self, member: &MemberId) -> Result<Vec<Edge>, Self::Error>;

    /// Reclaims space: deliveries older than the dedup horizon, attempts older than the budget
    /// window, challenges and offers past expiry. Never needed for correctness.
    fn sweep(&mut self, now: i64) -> Result<(), Self::Error>;
}

/// The in-memory store of the local simulator.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    deliveries: BTreeMap<DeliveryId, i64>,
    sender_attempts: BTreeMap<Mailbox, VecDeque<i64>>,
    global_attempts: VecDeque<i64>,
    members: BTreeMap<MemberId, Member>,
    by_mailbox: BTreeMap<Mailbox, MemberId>,
    challenges: BTreeMap<ChallengeId, Challenge>,
    offers: BTreeMap<RequestId, Offer>,
    edges: BTreeMap<Pair, Edge>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of remembered delivery ids (for tests of the sweep).
    pub fn delivery_count(&self) -> usize {
        self.deliveries.len()
    }

    /// Number of stored challenges in any state.
    pub fn challenge_count(&self) -> usize {
        self.challenges.len()
    }
}

/// Entries of a time-ordered queue at or after `since`.
fn count_since(times: &VecDeque<i64>, since: i64) -> u32 {
    let older = times.partition_point(|t| *t < since);
    u32::try_from(times.len().saturating_sub(older)).unwrap_or(u32::MAX)
}

/// Appends keeping the queue sorted even if the clock stepped back.
fn push_sorted(times: &mut VecDeque<i64>, at: i64) {
    let pos = times.partition_point(|t| *t <= at);
    times.insert(pos, at);
}

impl Store for MemoryStore {
    type Error = Infallible;

    fn delivery_seen_since(&mut self, id: &DeliveryId, since: i64) -> Result<bool, Infallible> {
        Ok(self.deliveries.get(id).is_some_and(|at| *at >= since))
    }

    fn record_delivery(&mut self, id: &DeliveryId, at: i64) -> Result<(), Infallible> {
        self.deliveries.insert(id.clone(), at);
        Ok(())
    }

    fn sender_attempts_since(&mut self, sender: &Mailbox, since: i64) -> Result<u32, Infallible> {
        Ok(self.sender_attempts.get(sender).map_or(0, |q| count_since(q, since)))
    }

    fn global_attempts_since(&mut self, since: i64) -> Result<u32, Infallible> {
        Ok(count_since(&self.global_attempts, since))
    }

    fn record_attempt(&mut self, sender: &Mailbox, at: i64) -> Result<(), Infallible> {
        push_sorted(self.sender_attempts.entry(sender.clone()).or_default(), at);
        push_sorted(&mut self.global_attempts, at);
        Ok(())
    }

    fn member(&mut self, id: &MemberId) -> Result<Option<Member>, Infallible> {
        Ok(self.members.get(id).cloned())
    }

    fn member_by_mailbox(&mut self, mailbox: &Mailbox) -> Result<Option<Member>, Infallible> {
        Ok(self.by_mailbox.get(mailbox).and_then(|id| self.members.get(id)).cloned())
    }

    fn put_member(&mut self, member: &Member) -> Result<(), Infallible> {
        if let Some(old) = self.members.insert(member.id, member.clone())
            && old.mailbox != member.mailbox
        {
            self.by_mailbox.remove(&old.mailbox);
        }
        self.by_mailbox.insert(member.mailbox.clone(), member.id);
        Ok(())
    }

    fn challenge(&mut self, id: &ChallengeId) -> Result<Option<Challenge>, Infallible> {
        Ok(self.challenges.get(id).cloned())
    }

    fn put_challenge(&mut self, challenge: &Challenge) -> Result<(), Infallible> {
        self.challenges.insert(challenge.id, challenge.clone());
        Ok(())
    }

    fn offer(&mut self, id: &RequestId) -> Result<Option<Offer>, Infallible> {
        Ok(self.offers.get(id).cloned())
    }

    fn offers_between(&mut self, pair: &Pair) -> Result<Vec<Offer>, Infallible> {
        Ok(self.offers.values().filter(|o| Pair::new(o.from, o.to).as_ref() == Some(pair)).cloned().collect())
    }

    fn put_offer(&mut self, offer: &Offer) -> Result<(), Infallible> {
        self.offers.insert(offer.id, offer.clone());
        Ok(())
    }

    fn delete_offer(&mut self, id: &RequestId) -> Result<(), Infallible> {
        self.offers.remove(id);
        Ok(())
    }

    fn edge(&mut self, pair: &Pair) -> Result<Option<Edge>, Infallible> {
        Ok(self.edges.get(pair).cloned())
    }

    fn put_edge(&mut self, edge: &Edge) -> Result<(), Infallible> {
        self.edges.insert(edge.pair, edge.clone());
        Ok(())
    }

    fn delete_edge(&mut self, pair: &Pair) -> Result<(), Infallible> {
        self.edges.remove(pair);
        Ok(())
    }

    fn edges_of(&mut self, member: &MemberId) -> Result<Vec<Edge>, Infallible> {
        let mut out: Vec<Edge> = self.edges.values().filter(|e| e.pair.contains(member)).cloned().collect();
        out.sort_by_key(|e| e.pair.other(member));
        Ok(out)
    }

    fn sweep(&mut self, now: i64) -> Result<(), Infallible> {
        // The same boundaries as the service: a record exactly one horizon old is already gone.
        let horizon = now.saturating_sub(DELIVERY_DEDUP_MS);
        self.deliveries.retain(|_, at| *at > horizon);
        let window = now.saturating_sub(BUDGET_WINDOW_MS);
        for q in self.sender_attempts.values_mut() {
            let old = q.partition_point(|t| *t <= window);
            q.drain(..old);
        }
        self.sender_attempts.retain(|_, q| !q.is_empty());
        let old = self.global_attempts.partition_point(|t| *t <= window);
        self.global_attempts.drain(..old);
        self.challenges.retain(|_, c| c.expires_at > now);
        self.offers.retain(|_, o| o.expires_at > now);
        Ok(())
    }
}

/// A conformance suite for [`Store`] backends: each function takes a fresh, empty store and
/// panics (it is test support) when the backend disagrees with the contract above.
pub mod conformance {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;
    use crate::protocol::asnet::{Scope, command::Action};

    fn mailbox(s: &str) -> Mailbox {
        Mailbox::parse(s).expect("test mailbox")
    }

    /// Runs every check on stores made by `fresh`.
    pub fn run<S: Store>(mut fresh: impl FnMut() -> S) {
        deliveries_and_budgets(&mut fresh());
        members(&mut fresh());
        challenges(&mut fresh());
        offers_and_edges(&mut fresh());
        sweep_keeps_what_is_live(&mut fresh());
    }

    /// Delivery ids and attempt counters.
    pub fn deliveries_and_budgets<S: Store>(s: &mut S) {
        let d = DeliveryId::parse("q-1").unwrap();
        assert!(!s.delivery_seen_since(&d, 0).unwrap());
        s.record_delivery(&d, 1_000).unwrap();
        assert!(s.delivery_seen_since(&d, 1_000).unwrap());
        assert!(!s.delivery_seen_since(&d, 1_001).unwrap());
        s.record_delivery(&d, 5_000).unwrap();
        assert!(s.delivery_seen_since(&d, 4_000).unwrap(), "a newer record replaces the old");
        let (a, b) = (mailbox("a@example.test"), mailbox("b@example.test"));
        s.record_attempt(&a, 10).unwrap();
        s.record_attempt(&a, 20).unwrap();
        s.record_attempt(&b, 30).unwrap();
        assert_eq!(s.sender_attempts_since(&a, 0).unwrap(), 2);
        assert_eq!(s.sender_attempts_since(&a, 11).unwrap(), 1);
        assert_eq!(s.sender_attempts_since(&b, 0).unwrap(), 1);
        assert_eq!(s.global_attempts_since(0).unwrap(), 3);
        assert_eq!(s.global_attempts_since(21).unwrap(), 1);
    }

    /// Members by id and mailbox, replaced in place.
    pub fn members<S: Store>(s: &mut S) {
        let m = Member { id: MemberId([1; 16]), mailbox: mailbox("a@example.test"), discovery: false, created_at: 5 };
        assert_eq!(s.member(&m.id).unwrap(), None);
        s.put_member(&m).unwrap();
        assert_eq!(s.member(&m.id).unwrap().as_ref(), Some(&m));
        assert_eq!(s.member_by_mailbox(&m.mailbox).unwrap().as_ref(), Some(&m));
        assert_eq!(s.member_by_mailbox(&mailbox("A@example.test")).unwrap(), None, "local parts keep case");
        let m2 = Member { discovery: true, ..m.clone() };
        s.put_member(&m2).unwrap();
        assert_eq!(s.member(&m.id).unwrap(), Some(m2));
    }

    /// Challenges in every state, with their action and counters.
    pub fn challenges<S: Store>(s: &mut S) {
        let scopes = Scopes::new(vec![Scope::ProfileBasic, Scope::ContactEmail]).unwrap();
        let c = Challenge {
            id: ChallengeId([2; 16]),
            mailbox: mailbox("a@example.test"),
            action: Action::Connect { member_id: MemberId([3; 16]), scopes },
            code_hash: [9; 32],
            expires_at: 900,
            wrong_guesses: 0,
            state: ChallengeState::Open,
        };
        assert_eq!(s.challenge(&c.id).unwrap(), None);
        s.put_challenge(&c).unwrap();
        assert_eq!(s.challenge(&c.id).unwrap().as_ref(), Some(&c));
        let c2 = Challenge { wrong_guesses: 5, state: ChallengeState::Locked, ..c.clone() };
        s.put_challenge(&c2).unwrap();
        assert_eq!(s.challenge(&c.id).unwrap(), Some(c2));
    }

    /// Offers in both directions and undirected edges.
    pub fn offers_and_edges<S: Store>(s: &mut S) {
        let (a, b, c) = (MemberId([1; 16]), MemberId([2; 16]), MemberId([3; 16]));
        for (i, id) in [a, b, c].iter().enumerate() {
            let mb = mailbox(&format!("m{i}@example.test"));
            s.put_member(&Member { id: *id, mailbox: mb, discovery: false, created_at: 0 }).unwrap();
        }
        let scopes = Scopes::new(vec![Scope::ContactEmail]).unwrap();
        let ab = Pair::new(a, b).unwrap();
        assert_eq!(Pair::new(b, a), Some(ab));
        assert_eq!(Pair::new(a, a), None);
        let o1 = Offer { id: RequestId([7; 16]), from: b, to: a, scopes: scopes.clone(), expires_at: 50 };
        let o2 = Offer { id: RequestId([8; 16]), from: a, to: c, scopes: scopes.clone(), expires_at: 50 };
        s.put_offer(&o1).unwrap();
        s.put_offer(&o2).unwrap();
        assert_eq!(s.offer(&o1.id).unwrap().as_ref(), Some(&o1));
        assert_eq!(s.offers_between(&ab).unwrap(), vec![o1.clone()]);
        s.delete_offer(&o1.id).unwrap();
        s.delete_offer(&o1.id).unwrap();
        assert_eq!(s.offer(&o1.id).unwrap(), None);
        assert!(s.offers_between(&ab).unwrap().is_empty());

        let e1 = Edge { pair: ab, scopes: scopes.clone(), created_at: 1 };
        let e2 = Edge { pair: Pair::new(c, a).unwrap(), scopes, created_at: 2 };
        s.put_edge(&e2).unwrap();
        s.put_edge(&e1).unwrap();
        assert_eq!(s.edge(&ab).unwrap().as_ref(), Some(&e1));
        assert_eq!(s.edges_of(&a).unwrap(), vec![e1.clone(), e2.clone()], "ordered by the other member");
        assert_eq!(s.edges_of(&b).unwrap(), vec![e1]);
        s.delete_edge(&ab).unwrap();
        s.delete_edge(&ab).unwrap();
        assert_eq!(s.edge(&ab).unwrap(), None);
        assert_eq!(s.edges_of(&a).unwrap(), vec![e2]);
    }

    /// A sweep drops only what expired.
    pub fn sweep_keeps_what_is_live<S: Store>(s: &mut S) {
        let now = 10 * DELIVERY_DEDUP_MS;
        let (old, new) = (DeliveryId::parse("old").unwrap(), DeliveryId::parse("new").unwrap());
        s.record_delivery(&old, now - DELIVERY_DEDUP_MS - 1).unwrap();
        s.record_delivery(&new, now - 1).unwrap();
        let a = mailbox("a@example.test");
        s.record_attempt(&a, now - BUDGET_WINDOW_MS - 1).unwrap();
        s.record_attempt(&a, now - 1).unwrap();
        s.sweep(now).unwrap();
        assert!(s.delivery_seen_since(&new, 0).unwrap());
        assert!(!s.delivery_seen_since(&old, 0).unwrap());
        assert_eq!(s.sender_attempts_since(&a, 0).unwrap(), 1);
        assert_eq!(s.global_attempts_since(0).unwrap(), 1);
    }
}
