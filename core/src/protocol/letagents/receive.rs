//! What a receiver does with an opened message, in the seed's order: staleness, replays, then the
//! contact rules. Pure: the engine supplies the contact, whether the id was seen, and the clock.

use super::envelope::Opened;
use super::inner::{Kind, ReceiptStatus};
use super::{MAX_FUTURE_SKEW_MS, STALE_AFTER_MS};
use crate::protocol::letagents::address::PeerKeys;

/// What the receiver knows about the sender.
#[derive(Debug, Clone)]
pub struct ContactView {
    /// The pinned keys.
    pub keys: PeerKeys,
    /// Kinds this contact may send (of `send`, `ask`, `reply`, `list`).
    pub allow: Vec<Kind>,
    /// Per-agent rules, in order.
    pub rules: Vec<AgentRule>,
    /// Whether the contact is accepted (pending requests are not).
    pub active: bool,
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    /// Let the message through.
    Allow,
    /// Refuse it.
    Deny,
}

/// A per-agent rule: `from` their agent, `to` our agent, globs `*` and `prefix*`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentRule {
    /// Glob on the sender's `from_agent`.
    pub from: String,
    /// Glob on our `to_agent`.
    pub to: String,
    /// What a match decides.
    pub action: RuleAction,
}

/// Matches `*`, `prefix*` or an exact name. A missing agent name is the empty string.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

impl AgentRule {
    fn matches(&self, from_agent: &str, to_agent: &str) -> bool {
        glob_match(&self.from, from_agent) && glob_match(&self.to, to_agent)
    }
}

/// Why a message was dropped silently (no receipt, nothing shown but the audit log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// `ts` older than 48 h.
    Stale,
    /// `ts` too far in the future.
    FromTheFuture,
    /// The id was already seen from this sender.
    Replay,
    /// Not a contact, and not a hello.
    UnknownSender,
    /// A pending (not yet accepted) contact sent something other than a hello.
    NotAccepted,
}

impl DropReason {
    /// A short machine-readable reason.
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::Stale => "stale",
            DropReason::FromTheFuture => "future_timestamp",
            DropReason::Replay => "replay",
            DropReason::UnknownSender => "unknown_sender",
            DropReason::NotAccepted => "not_accepted",
        }
    }
}

/// Why a message from a known contact was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefuseReason {
    /// The contact's pinned box key differs from the one in `inner.from`.
    KeyChanged,
    /// The kind is not on the contact's allow list.
    KindNotAllowed(Kind),
    /// An agent rule denied it.
    RuleDenied,
}

impl RefuseReason {
    /// Human-readable detail, also sent in the refusal receipt.
    pub fn detail(&self) -> String {
        match self {
            RefuseReason::KeyChanged => "sender's box key changed; not accepted until re-verified".into(),
            RefuseReason::KindNotAllowed(k) => {
                format!("kind `{}` is not allowed for this contact", k.as_str())
            }
            RefuseReason::RuleDenied => "denied by an agent rule".into(),
        }
    }
}

/// The receiver's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Store and show it. `receipt` says whether one is owed.
    Accept {
        /// Whether to send a receipt (send/ask/list).
        receipt: bool,
    },
    /// A known contact's hello: same keys; refresh the drop code.
    RefreshAddress,
    /// An unknown sender's hello: record a pending contact request.
    PendingRequest,
    /// Refused; `receipt` says whether to tell the sender.
    Refuse {
        /// Why.
        reason: RefuseReason,
        /// Whether to send a `refused` receipt.
        receipt: bool,
    },
    /// Dropped silently.
    Drop(DropReason),
}

/// Decides what to do with `msg`. `seen` is whether (sender, id) was already recorded.
pub fn decide(msg: &Opened, contact: Option<&ContactView>, seen: bool, now_ms: i64) -> Verdict {
    let ts = msg.inner.ts;
    if ts < now_ms.saturating_sub(STALE_AFTER_MS) {
        return Verdict::Drop(DropReason::Stale);
    }
    if ts > now_ms.saturating_add(MAX_FUTURE_SKEW_MS) {
        return Verdict::Drop(DropReason::FromTheFuture);
    }
    if seen {
        return Verdict::Drop(DropReason::Replay);
    }
    let Some(contact) = contact else {
        return if msg.kind == Kind::Hello {
            Verdict::PendingRequest
        } else {
            Verdict::Drop(DropReason::UnknownSender)
        };
    };
    let wants_receipt = msg.kind.wants_receipt();
    if contact.keys.boxk != msg.from.keys.boxk {
        // Shown to the user; no receipt, since we could only seal it to the key in question.
        return Verdict::Refuse { reason: RefuseReason::KeyChanged, receipt: false };
    }
    if !contact.active {
        return if msg.kind == Kind::Hello { Verdict::PendingRequest } else { Verdict::Drop(DropReason::NotAccepted) };
    }
    match msg.kind {
        Kind::Hello => return Verdict::RefreshAddress,
        Kind::Receipt | Kind::Roster => return Verdict::Accept { receipt: false },
        Kind::Send | Kind::Ask | Kind::Reply | Kind::List => {}
    }
    if !contact.allow.contains(&msg.kind) {
        return Verdict::Refuse { reason: RefuseReason::KindNotAllowed(msg.kind), receipt: wants_receipt };
    }
    let from_agent = msg.inner.from_agent.as_deref().unwrap_or("");
    let to_agent = msg.inner.to_agent.as_deref().unwrap_or("");
    let decisive = contact
        .rules
        .iter()
        .filter(|r| msg.kind != Kind::List || r.to == "*")
        .find(|r| r.matches(from_agent, to_agent));
    if decisive.is_some_and(|r| r.action == RuleAction::Deny) {
        return Verdict::Refuse { reason: RefuseReason::RuleDenied, receipt: wants_receipt };
    }
    Verdict::Accept { receipt: wants_receipt }
}

/// The receipt status for an accepted message, given whether an agent is listening now.
pub fn accepted_status(agent_live: bool) -> ReceiptStatus {
    if agent_live { ReceiptStatus::Pushed } else { ReceiptStatus::Queued }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::letagents::address::Address;
    use crate::protocol::letagents::inner::Inner;

    const NOW: i64 = 1_800_000_000_000;

    fn keys(n: u8) -> PeerKeys {
        PeerKeys { sig: [n; 32], boxk: [n + 1; 32] }
    }

    fn opened(kind: Kind, from_agent: Option<&str>, to_agent: Option<&str>) -> Opened {
        let mut inner = Inner::new(&keys(1), "me", NOW, uuid::Uuid::from_bytes([1; 16]), kind, "".into());
        inner.from_agent = from_agent.map(str::to_owned);
        inner.to_agent = to_agent.map(str::to_owned);
        let drop = (kind == Kind::Hello).then_some([0; 16]);
        Opened { inner, kind, from: Address { keys: keys(1), drop }, inner_json: String::new() }
    }

    fn contact(rules: Vec<AgentRule>) -> ContactView {
        ContactView { keys: keys(1), allow: Kind::ALLOWABLE.to_vec(), rules, active: true }
    }

    fn rule(from: &str, to: &str, action: RuleAction) -> AgentRule {
        AgentRule { from: from.into(), to: to.into(), action }
    }

    #[test]
    fn order_is_stale_then_replay_then_contact() {
        let mut m = opened(Kind::Send, None, None);
        m.inner.ts = NOW - STALE_AFTER_MS - 1;
        assert_eq!(decide(&m, None, true, NOW), Verdict::Drop(DropReason::Stale));
        m.inner.ts = NOW - STALE_AFTER_MS;
        assert_eq!(decide(&m, None, true, NOW), Verdict::Drop(DropReason::Replay));
        assert_eq!(decide(&m, None, false, NOW), Verdict::Drop(DropReason::UnknownSender));
        m.inner.ts = NOW + MAX_FUTURE_SKEW_MS + 1;
        assert_eq!(decide(&m, Some(&contact(vec![])), false, NOW), Verdict::Drop(DropReason::FromTheFuture));
    }

    #[test]
    fn hello_from_unknown_becomes_a_request() {
        assert_eq!(decide(&opened(Kind::Hello, None, None), None, false, NOW), Verdict::PendingRequest);
    }

    #[test]
    fn changed_box_key_is_refused_without_receipt() {
        let mut c = contact(vec![]);
        c.keys.boxk = [99; 32];
        assert_eq!(
            decide(&opened(Kind::Send, None, None), Some(&c), false, NOW),
            Verdict::Refuse { reason: RefuseReason::KeyChanged, receipt: false }
        );
    }

    #[test]
    fn allow_list_and_receipts() {
        let mut c = contact(vec![]);
        c.allow = vec![Kind::Send];
        assert_eq!(decide(&opened(Kind::Send, None, None), Some(&c), false, NOW), Verdict::Accept { receipt: true });
        assert_eq!(
            decide(&opened(Kind::Ask, None, None), Some(&c), false, NOW),
            Verdict::Refuse { reason: RefuseReason::KindNotAllowed(Kind::Ask), receipt: true }
        );
        assert_eq!(
            decide(&opened(Kind::Reply, None, None), Some(&c), false, NOW),
            Verdict::Refuse { reason: RefuseReason::KindNotAllowed(Kind::Reply), receipt: false }
        );
        assert_eq!(
            decide(&opened(Kind::Receipt, None, None), Some(&c), false, NOW),
            Verdict::Accept { receipt: false }
        );
    }

    #[test]
    fn first_matching_rule_decides() {
        let c = contact(vec![
            rule("ci*", "deploy", RuleAction::Deny),
            rule("*", "deploy", RuleAction::Allow),
            rule("*", "*", RuleAction::Deny),
        ]);
        let v = |f, t| decide(&opened(Kind::Send, f, t), Some(&c), false, NOW);
        assert_eq!(
            v(Some("ci-bot"), Some("deploy")),
            Verdict::Refuse { reason: RefuseReason::RuleDenied, receipt: true }
        );
        assert_eq!(v(Some("alice"), Some("deploy")), Verdict::Accept { receipt: true });
        assert_eq!(
            v(Some("alice"), Some("other")),
            Verdict::Refuse { reason: RefuseReason::RuleDenied, receipt: true }
        );
        assert_eq!(v(None, None), Verdict::Refuse { reason: RefuseReason::RuleDenied, receipt: true });
    }

    #[test]
    fn list_is_decided_only_by_rules_whose_to_is_star() {
        let c = contact(vec![rule("*", "deploy", RuleAction::Deny), rule("*", "*", RuleAction::Allow)]);
        assert_eq!(
            decide(&opened(Kind::List, None, Some("deploy")), Some(&c), false, NOW),
            Verdict::Accept { receipt: true }
        );
        let c = contact(vec![rule("*", "deploy", RuleAction::Allow), rule("*", "*", RuleAction::Deny)]);
        assert_eq!(
            decide(&opened(Kind::List, None, Some("deploy")), Some(&c), false, NOW),
            Verdict::Refuse { reason: RefuseReason::RuleDenied, receipt: true }
        );
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("dev*", "dev"));
        assert!(glob_match("dev*", "devops"));
        assert!(!glob_match("dev*", "de"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }
}
