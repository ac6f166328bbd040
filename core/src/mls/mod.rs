//! The OpenMLS adapter: one [`Member`] per agent session, holding its signing key, its
//! credential (the display name, an unverified claim) and its OpenMLS state for every group it
//! is in. Everything is synchronous and does no I/O; the engine persists [`Member::changes`] (the
//! OpenMLS entries the operation wrote or deleted) in the same transaction as the rows an
//! operation produced (see [`storage`]).
//!
//! - ciphersuite `MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519`;
//! - every group message is a PrivateMessage (pure-ciphertext wire format policy), so the relay
//!   sees only group id, epoch and content type;
//! - Welcomes carry the ratchet tree (no out-of-band tree);
//! - a few past epochs' secrets are kept, so application messages sent just before a commit
//!   still decrypt after it.

pub mod storage;

use std::collections::HashMap;

use openmls::prelude::tls_codec::{Deserialize as _, Serialize as _};
use openmls::prelude::*;
use openmls_basic_credential::SignatureKeyPair;
use openmls_rust_crypto::RustCrypto;
use openmls_traits::OpenMlsProvider;

/// The one ciphersuite letmeknow uses.
pub const CIPHERSUITE: Ciphersuite = Ciphersuite::MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519;
/// Past epochs whose application secrets are kept.
pub const PAST_EPOCHS: usize = 8;

/// Why an MLS operation failed; the variant says whose fault it is.
#[derive(Debug, thiserror::Error)]
pub enum MlsError {
    /// Bytes from a peer or the relay are malformed or do not verify (peer's or relay's fault).
    #[error("invalid MLS input: {0}")]
    Peer(String),
    /// A message that cannot be decrypted or applied in our current state: another epoch's
    /// keys, a fork the relay showed us, or our own message echoed back.
    #[error("cannot process message: {0}")]
    Unprocessable(String),
    /// The local state is damaged (local fault).
    #[error("MLS state is damaged: {0}")]
    Corrupt(String),
    /// An operation OpenMLS refused in our own state (a bug or a misuse, local fault).
    #[error("MLS operation failed: {0}")]
    Local(String),
}

fn local(e: impl std::fmt::Display) -> MlsError {
    MlsError::Local(e.to_string())
}

fn peer(e: impl std::fmt::Display) -> MlsError {
    MlsError::Peer(e.to_string())
}

/// RustCrypto with the in-memory store whose changed rows the engine persists.
#[derive(Default)]
pub struct Provider {
    crypto: RustCrypto,
    storage: storage::RowStorage,
}

impl OpenMlsProvider for Provider {
    type CryptoProvider = RustCrypto;
    type RandProvider = RustCrypto;
    type StorageProvider = storage::RowStorage;

    fn storage(&self) -> &storage::RowStorage {
        &self.storage
    }

    fn crypto(&self) -> &RustCrypto {
        &self.crypto
    }

    fn rand(&self) -> &RustCrypto {
        &self.crypto
    }
}

/// A group member as others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    /// Display name from the credential (an unverified claim).
    pub name: String,
    /// [`crate::protocol::letmeknow::fingerprint`] of its signature key.
    pub fingerprint: String,
    /// Leaf index in the ratchet tree.
    pub leaf: u32,
}

/// What processing one group message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// An application message.
    Application {
        /// Its authenticated sender.
        sender: MemberInfo,
        /// The plaintext.
        data: Vec<u8>,
        /// The epoch it was sent in.
        epoch: u64,
    },
    /// A commit, now merged.
    Commit {
        /// Who committed.
        committer: MemberInfo,
        /// Members it added.
        added: Vec<MemberInfo>,
        /// Members it removed.
        removed: Vec<MemberInfo>,
        /// Whether it removed us: the group is over for this member.
        self_removed: bool,
    },
}

fn name_of(credential: &Credential) -> String {
    BasicCredential::try_from(credential.clone())
        .map(|c| String::from_utf8_lossy(c.identity()).into_owned())
        .unwrap_or_else(|_| "(unnamed)".into())
}

fn info(m: &openmls::group::Member) -> MemberInfo {
    MemberInfo {
        name: name_of(&m.credential),
        fingerprint: crate::protocol::letmeknow::fingerprint(&m.signature_key),
        leaf: m.index.u32(),
    }
}

fn leaf_info(leaf: &LeafNode, index: u32) -> MemberInfo {
    MemberInfo {
        name: name_of(leaf.credential()),
        fingerprint: crate::protocol::letmeknow::fingerprint(leaf.signature_key().as_slice()),
        leaf: index,
    }
}

fn create_config() -> MlsGroupCreateConfig {
    MlsGroupCreateConfig::builder()
        .ciphersuite(CIPHERSUITE)
        .use_ratchet_tree_extension(true)
        .wire_format_policy(PURE_CIPHERTEXT_WIRE_FORMAT_POLICY)
        .max_past_epochs(PAST_EPOCHS)
        .build()
}

fn join_config() -> MlsGroupJoinConfig {
    MlsGroupJoinConfig::builder()
        .use_ratchet_tree_extension(true)
        .wire_format_policy(PURE_CIPHERTEXT_WIRE_FORMAT_POLICY)
        .max_past_epochs(PAST_EPOCHS)
        .build()
}

/// The members of `group`, in leaf order.
pub fn members(group: &MlsGroup) -> Vec<MemberInfo> {
    group.members().map(|m| info(&m)).collect()
}

/// The current epoch's authenticator (RFC 9420 §8.7).
pub fn epoch_authenticator(group: &MlsGroup) -> Vec<u8> {
    group.epoch_authenticator().as_slice().to_vec()
}

/// Parked groups by MLS group id: the storage version each matches, and the group.
type Parked = HashMap<Vec<u8>, (u64, Box<MlsGroup>)>;

/// One agent session's MLS identity and state.
pub struct Member {
    provider: Provider,
    signer: SignatureKeyPair,
    credential: CredentialWithKey,
    name: String,
    /// Groups handed back by [`Self::park`], with the storage version they match.
    parked: std::sync::Mutex<Parked>,
    /// Which group object (its address) was last loaded or operated on successfully, and the
    /// storage version right after: the one [`Self::park`] may keep. Cleared by an operation
    /// that failed.
    fresh: std::sync::Mutex<Option<(usize, u64)>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("name", &self.name).field("fingerprint", &self.fingerprint()).finish()
    }
}

impl Member {
    /// A new member with a fresh Ed25519 signing key and `name` as its credential.
    pub fn generate(name: &str) -> Result<Self, MlsError> {
        let provider = Provider::default();
        let signer = SignatureKeyPair::new(CIPHERSUITE.signature_algorithm()).map_err(local)?;
        signer.store(provider.storage()).map_err(local)?;
        Ok(Self::assemble(provider, signer, name))
    }

    fn assemble(provider: Provider, signer: SignatureKeyPair, name: &str) -> Self {
        let credential = CredentialWithKey {
            credential: BasicCredential::new(name.as_bytes().to_vec()).into(),
            signature_key: signer.public().into(),
        };
        Self {
            provider,
            signer,
            credential,
            name: name.to_owned(),
            parked: std::sync::Mutex::new(HashMap::new()),
            fresh: std::sync::Mutex::new(None),
        }
    }

    /// Restores a member from its stored rows (every OpenMLS entry), its signature public key
    /// and name; nothing is dirty.
    pub fn from_rows(
        rows: impl IntoIterator<Item = storage::Row>,
        public_key: &[u8],
        name: &str,
    ) -> Result<Self, MlsError> {
        let provider = Provider { crypto: RustCrypto::default(), storage: storage::RowStorage::from_rows(rows) };
        let signer = SignatureKeyPair::read(provider.storage(), public_key, CIPHERSUITE.signature_algorithm())
            .ok_or_else(|| MlsError::Corrupt("the signing key is missing from the MLS state".into()))?;
        Ok(Self::assemble(provider, signer, name))
    }

    /// Restores a member from a legacy [`storage::snapshot`] (a profile made before migration
    /// 0018); every entry is dirty, so the next save writes them all as rows.
    pub fn restore(snapshot: &[u8], public_key: &[u8], name: &str) -> Result<Self, MlsError> {
        let member = Self::from_rows(storage::restore(snapshot)?, public_key, name)?;
        member.provider.storage.mark_all_dirty();
        Ok(member)
    }

    /// The OpenMLS entries written or deleted since the last [`saved`](Self::saved): what to
    /// persist with the rows an operation produced.
    pub fn changes(&self) -> Vec<storage::Change> {
        self.provider.storage.changes()
    }

    /// Marks `changes` persisted, once the transaction that wrote them committed.
    pub fn saved(&self, changes: &[storage::Change]) {
        self.provider.storage.saved(changes);
    }

    /// Every OpenMLS entry of this member, in key order (a new session's first rows; tests).
    pub fn rows(&self) -> Vec<storage::Row> {
        self.provider.storage.rows()
    }

    /// The signature public key.
    pub fn signature_key(&self) -> &[u8] {
        self.signer.public()
    }

    /// This member's fingerprint.
    pub fn fingerprint(&self) -> String {
        crate::protocol::letmeknow::fingerprint(self.signer.public())
    }

    /// The display name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates a group whose MLS group id is `gid`'s ASCII (the relay checks it).
    pub fn create_group(&self, gid: &str) -> Result<MlsGroup, MlsError> {
        MlsGroup::new_with_group_id(
            &self.provider,
            &self.signer,
            &create_config(),
            GroupId::from_slice(gid.as_bytes()),
            self.credential.clone(),
        )
        .map_err(local)
    }

    /// Loads a group this member is in: the one [`Self::park`] kept when nothing has written
    /// the storage since, else decoded from the storage entries (the tree, the secrets, the
    /// message secrets: most of an operation's time in a small group).
    pub fn load_group(&self, gid: &str) -> Result<Option<Loaded>, MlsError> {
        let id = GroupId::from_slice(gid.as_bytes());
        let version = self.provider.storage.version();
        let kept = lock(&self.parked).remove(id.as_slice()).filter(|(v, _)| *v == version);
        let group = match kept {
            Some((_, group)) => Some(Loaded(group)),
            None => MlsGroup::load(self.provider.storage(), &id).map_err(local)?.map(|g| Loaded(Box::new(g))),
        };
        // Just loaded, it is what the storage holds: parked as it is, it stays valid.
        *lock(&self.fresh) = group.as_ref().map(|g| (address(g), version));
        Ok(group)
    }

    /// Keeps `group` in memory for the next [`Self::load_group`] of it, if it is exactly what the
    /// storage holds: it is the group object this member last loaded or operated on
    /// successfully, and nothing has written the storage since. Otherwise it is dropped (the
    /// next load decodes the storage). OpenMLS writes every change of a group through to the
    /// storage as an operation succeeds, so a group loaded back then equals the one kept. Never
    /// kept: a group an operation failed on (it may have changed in memory and not in the
    /// storage), and an older copy of a group that another copy changed since.
    pub fn park(&self, group: Loaded) {
        let version = self.provider.storage.version();
        let mut fresh = lock(&self.fresh);
        if fresh.is_some_and(|(a, v)| a == address(&group) && v == version) {
            *fresh = None;
            lock(&self.parked).insert(group.group_id().to_vec(), (version, group.0));
        }
    }

    /// Records how an operation on `group` ended, for [`Self::park`].
    fn noted<T>(&self, group: &MlsGroup, result: Result<T, MlsError>) -> Result<T, MlsError> {
        *lock(&self.fresh) = result.is_ok().then(|| (address(group), self.provider.storage.version()));
        result
    }

    /// A fresh KeyPackage (serialized MLSMessage) for joining one group.
    pub fn key_package(&self) -> Result<Vec<u8>, MlsError> {
        let bundle = KeyPackage::builder()
            .build(CIPHERSUITE, &self.provider, &self.signer, self.credential.clone())
            .map_err(local)?;
        MlsMessageOut::from(bundle.key_package().clone()).to_bytes().map_err(local)
    }

    /// Parses and verifies a peer's KeyPackage; returns who it names.
    pub fn inspect_key_package(&self, bytes: &[u8]) -> Result<(KeyPackage, MemberInfo), MlsError> {
        let msg = MlsMessageIn::tls_deserialize_exact(bytes).map_err(peer)?;
        let MlsMessageBodyIn::KeyPackage(kp) = msg.extract() else {
            return Err(MlsError::Peer("not a KeyPackage".into()));
        };
        let kp = kp.validate(self.provider.crypto(), ProtocolVersion::Mls10).map_err(peer)?;
        if kp.ciphersuite() != CIPHERSUITE {
            return Err(MlsError::Peer("KeyPackage for another ciphersuite".into()));
        }
        let who = leaf_info(kp.leaf_node(), u32::MAX);
        Ok((kp, who))
    }

    /// Stages a commit adding the member of `key_package`: returns (commit, welcome). The
    /// commit is pending until [`merge_pending`](Self::merge_pending) (the relay took it) or
    /// [`discard_pending`](Self::discard_pending) (it lost the epoch race).
    pub fn add(&self, group: &mut MlsGroup, key_package: KeyPackage) -> Result<(Vec<u8>, Vec<u8>), MlsError> {
        let staged = group.add_members(&self.provider, &self.signer, std::slice::from_ref(&key_package)).map_err(local);
        let (commit, welcome, _) = self.noted(group, staged)?;
        Ok((commit.to_bytes().map_err(local)?, welcome.to_bytes().map_err(local)?))
    }

    /// Stages one commit that removes the stale leaf `leaf` and adds the member of
    /// `key_package` (a re-invite of a member whose state fell behind): returns (commit,
    /// welcome). Members see one leaf for it afterwards, not a duplicate.
    pub fn readd(
        &self,
        group: &mut MlsGroup,
        leaf: u32,
        key_package: KeyPackage,
    ) -> Result<(Vec<u8>, Vec<u8>), MlsError> {
        if leaf == group.own_leaf_index().u32() {
            return Err(MlsError::Local("a member cannot re-add itself".into()));
        }
        let staged = group
            .swap_members(&self.provider, &self.signer, &[LeafNodeIndex::new(leaf)], std::slice::from_ref(&key_package))
            .map_err(local);
        let out = self.noted(group, staged)?;
        Ok((out.commit.to_bytes().map_err(local)?, out.welcome.to_bytes().map_err(local)?))
    }

    /// Stages a commit removing the members with these leaf indexes.
    pub fn remove(&self, group: &mut MlsGroup, leaves: &[u32]) -> Result<Vec<u8>, MlsError> {
        let leaves: Vec<LeafNodeIndex> = leaves.iter().map(|l| LeafNodeIndex::new(*l)).collect();
        let staged = group.remove_members(&self.provider, &self.signer, &leaves).map_err(local);
        let (commit, _, _) = self.noted(group, staged)?;
        commit.to_bytes().map_err(local)
    }

    /// Applies our own pending commit once the relay accepted it.
    pub fn merge_pending(&self, group: &mut MlsGroup) -> Result<(), MlsError> {
        let merged = group.merge_pending_commit(&self.provider).map_err(local);
        self.noted(group, merged)
    }

    /// Drops our pending commit after the relay refused it (another commit won the epoch).
    pub fn discard_pending(&self, group: &mut MlsGroup) -> Result<(), MlsError> {
        let cleared = group.clear_pending_commit(self.provider.storage()).map_err(local);
        self.noted(group, cleared)
    }

    /// Joins from a Welcome (serialized MLSMessage). State this member still holds for the same
    /// group (it was removed, left, or fell behind the relay's retention and was re-invited) is
    /// replaced: the old epoch's keys and group state are deleted once the Welcome has been
    /// validated, so a Welcome that does not verify leaves the old state as it was.
    pub fn join(&self, welcome: &[u8]) -> Result<MlsGroup, MlsError> {
        let msg = MlsMessageIn::tls_deserialize_exact(welcome).map_err(peer)?;
        let MlsMessageBodyIn::Welcome(welcome) = msg.extract() else {
            return Err(MlsError::Peer("not a Welcome".into()));
        };
        let staged = StagedWelcome::build_from_welcome(&self.provider, &join_config(), welcome)
            .map_err(peer)?
            .replace_old_group()
            .build()
            .map_err(peer)?;
        let gid = staged.group_context().group_id().clone();
        if let Some(mut old) = MlsGroup::load(self.provider.storage(), &gid).map_err(local)? {
            use openmls_traits::storage::StorageProvider as _;
            self.provider
                .storage()
                .delete_encryption_epoch_key_pairs(old.group_id(), &old.epoch(), old.own_leaf_index().u32())
                .map_err(local)?;
            old.delete(self.provider.storage()).map_err(local)?;
        }
        staged.into_group(&self.provider).map_err(peer)
    }

    /// What our pending commit (staged, not yet merged) adds and removes; added members carry
    /// leaf `u32::MAX` until the merge places them.
    pub fn pending_changes(group: &MlsGroup) -> (Vec<MemberInfo>, Vec<MemberInfo>) {
        group.pending_commit().map(|staged| changes(group, staged)).unwrap_or_default()
    }

    /// Encrypts an application message (a PrivateMessage) in the current epoch.
    pub fn encrypt(&self, group: &mut MlsGroup, data: &[u8]) -> Result<Vec<u8>, MlsError> {
        let sealed = group.create_message(&self.provider, &self.signer, data).map_err(local);
        self.noted(group, sealed)?.to_bytes().map_err(local)
    }

    /// Decrypts and applies one group message from the log (merging commits at once).
    pub fn process(&self, group: &mut MlsGroup, bytes: &[u8]) -> Result<Processed, MlsError> {
        let processed = self.process_inner(group, bytes);
        self.noted(group, processed)
    }

    fn process_inner(&self, group: &mut MlsGroup, bytes: &[u8]) -> Result<Processed, MlsError> {
        let msg = MlsMessageIn::tls_deserialize_exact(bytes).map_err(peer)?;
        let protocol = msg.try_into_protocol_message().map_err(peer)?;
        let processed =
            group.process_message(&self.provider, protocol).map_err(|e| MlsError::Unprocessable(e.to_string()))?;
        let sender_leaf = match processed.sender() {
            Sender::Member(leaf) => *leaf,
            _ => return Err(MlsError::Peer("sender is not a member".into())),
        };
        let epoch = processed.epoch().as_u64();
        let sender =
            group.member_at(sender_leaf).map(|m| info(&m)).ok_or_else(|| MlsError::Peer("unknown sender".into()))?;
        match processed.into_content() {
            ProcessedMessageContent::ApplicationMessage(app) => {
                Ok(Processed::Application { sender, data: app.into_bytes(), epoch })
            }
            ProcessedMessageContent::StagedCommitMessage(staged) => {
                let (added, removed) = changes(group, &staged);
                let self_removed = staged.self_removed();
                group.merge_staged_commit(&self.provider, *staged).map_err(local)?;
                // Leaf indexes of the added members are known only after the merge.
                let now = members(group);
                let added = added
                    .into_iter()
                    .map(|a| now.iter().find(|m| m.fingerprint == a.fingerprint).cloned().unwrap_or(a))
                    .collect();
                Ok(Processed::Commit { committer: sender, added, removed, self_removed })
            }
            ProcessedMessageContent::OwnPendingCommit | ProcessedMessageContent::OwnPrivateMessage => {
                Err(MlsError::Unprocessable("our own message echoed back".into()))
            }
            ProcessedMessageContent::ProposalMessage(_) | ProcessedMessageContent::ExternalJoinProposalMessage(_) => {
                Err(MlsError::Peer("standalone proposals are not used in letmeknow".into()))
            }
        }
    }
}

/// The members a staged commit adds (leaf `u32::MAX`: placed only by the merge) and removes
/// (as they are in `group` before the merge). A re-add names the same member in both.
fn changes(group: &MlsGroup, staged: &StagedCommit) -> (Vec<MemberInfo>, Vec<MemberInfo>) {
    let added =
        staged.add_proposals().map(|p| leaf_info(p.add_proposal().key_package().leaf_node(), u32::MAX)).collect();
    let removed = staged
        .remove_proposals()
        .filter_map(|p| group.member_at(p.remove_proposal().removed()).map(|m| info(&m)))
        .collect();
    (added, removed)
}

/// Reads the epoch of a serialized PrivateMessage without decrypting it.
pub fn message_epoch(bytes: &[u8]) -> Option<u64> {
    crate::protocol::letmeknow::header::parse(bytes).ok().map(|h| h.epoch)
}

/// Serializes for tests and benches that drive bare OpenMLS.
pub fn serialize(msg: &MlsMessageOut) -> Result<Vec<u8>, MlsError> {
    let mut out = Vec::new();
    msg.tls_serialize(&mut out).map_err(local)?;
    Ok(out)
}

/// A group lent by [`Member::load_group`], to be handed back with [`Member::park`]; it stays at
/// one address while lent (boxed), which is how `park` tells it from another copy.
pub struct Loaded(Box<MlsGroup>);

impl std::ops::Deref for Loaded {
    type Target = MlsGroup;
    fn deref(&self) -> &MlsGroup {
        &self.0
    }
}

impl std::ops::DerefMut for Loaded {
    fn deref_mut(&mut self) -> &mut MlsGroup {
        &mut self.0
    }
}

/// Where a group object is: the same for a [`Loaded`] group while it is lent.
fn address(group: &MlsGroup) -> usize {
    std::ptr::from_ref(group) as usize
}

/// The lock's value, also after a panic elsewhere held it (nothing here is left half-changed).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const G: &str = "0123456789abcdef0123456789abcdef";

    /// Applies `m`'s changes to `db` as the engine applies them to its rows, then marks them
    /// saved; `db` must then hold exactly the member's whole state.
    fn persist(m: &Member, db: &mut std::collections::BTreeMap<Vec<u8>, Vec<u8>>) {
        let changes = m.changes();
        for c in &changes {
            match &c.value {
                Some(v) => db.insert(c.key.clone(), v.clone()),
                None => db.remove(&c.key),
            };
        }
        m.saved(&changes);
        assert!(m.changes().is_empty());
        let rows: Vec<_> = db.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(rows, m.rows(), "the persisted rows are the whole state");
    }

    /// Alice made group `G` and added bob; each holds the group as just made or joined.
    fn pair() -> (Member, MlsGroup, Member, MlsGroup) {
        let alice = Member::generate("alice's agent").unwrap();
        let bob = Member::generate("bob's agent").unwrap();
        let mut ga = alice.create_group(G).unwrap();
        let (kp, _) = alice.inspect_key_package(&bob.key_package().unwrap()).unwrap();
        let (_, welcome) = alice.add(&mut ga, kp).unwrap();
        alice.merge_pending(&mut ga).unwrap();
        let gb = bob.join(&welcome).unwrap();
        (alice, ga, bob, gb)
    }

    fn parked(m: &Member) -> usize {
        lock(&m.parked).len()
    }

    fn text_of(p: Processed) -> Vec<u8> {
        match p {
            Processed::Application { data, .. } => data,
            other => panic!("{other:?}"),
        }
    }

    /// Sender and receiver hand their group back after every message and take it again for the
    /// next: every message reads, and the storage kept up all along (a member restored from it
    /// sends on at the next message key: bob's OpenMLS refuses a key used twice).
    #[test]
    fn a_parked_group_is_lent_again_and_the_storage_keeps_up_with_it() {
        let (alice, _, bob, _) = pair();
        for i in 0..5 {
            let mut ga = alice.load_group(G).unwrap().unwrap();
            let m = alice.encrypt(&mut ga, format!("hello {i}").as_bytes()).unwrap();
            alice.park(ga);
            assert_eq!(parked(&alice), 1, "kept after a send");
            let mut gb = bob.load_group(G).unwrap().unwrap();
            assert_eq!(text_of(bob.process(&mut gb, &m).unwrap()), format!("hello {i}").as_bytes());
            bob.park(gb);
            assert_eq!(parked(&bob), 1, "kept after a message read");
        }
        let ga = alice.load_group(G).unwrap().unwrap();
        assert_eq!(parked(&alice), 0, "lent out, not shared");
        drop(ga);
        let restored = Member::from_rows(alice.rows(), alice.signature_key(), alice.name()).unwrap();
        let mut gr = restored.load_group(G).unwrap().unwrap();
        let m = restored.encrypt(&mut gr, b"after a restart").unwrap();
        let mut gb = bob.load_group(G).unwrap().unwrap();
        assert_eq!(text_of(bob.process(&mut gb, &m).unwrap()), b"after a restart");
    }

    /// Never kept, or never lent again: a group an operation failed on, and a group the storage
    /// moved past (another copy's operation, or any other write).
    #[test]
    fn a_group_is_not_kept_after_a_failure_a_newer_copy_or_another_write() {
        let (alice, _, bob, _) = pair();
        let mut gb = bob.load_group(G).unwrap().unwrap();
        assert!(bob.process(&mut gb, b"not an MLS message").is_err());
        bob.park(gb);
        assert_eq!(parked(&bob), 0, "an operation failed on it");
        let m = {
            let mut ga = alice.load_group(G).unwrap().unwrap();
            alice.encrypt(&mut ga, b"one").unwrap()
        };
        let mut gb = bob.load_group(G).unwrap().unwrap();
        // A message that fails to process (a second copy of one already read) after one that
        // read: not kept, though the one before succeeded.
        text_of(bob.process(&mut gb, &m).unwrap());
        assert!(bob.process(&mut gb, &m).is_err());
        bob.park(gb);
        assert_eq!(parked(&bob), 0);

        // Two copies: the older one, parked after the newer one sent, is not kept.
        let old = alice.load_group(G).unwrap().unwrap();
        let mut new = alice.load_group(G).unwrap().unwrap();
        let m = alice.encrypt(&mut new, b"two").unwrap();
        alice.park(old);
        assert_eq!(parked(&alice), 0, "an older copy");
        alice.park(new);
        assert_eq!(parked(&alice), 1, "the copy that sent last");
        let mut gb = bob.load_group(G).unwrap().unwrap();
        assert_eq!(text_of(bob.process(&mut gb, &m).unwrap()), b"two");

        // The storage moved past a parked group (a copy decoded beside it sent): the next load
        // decodes the storage again. Lent, the parked copy would send at the message key the
        // other copy used, and bob would refuse the second message.
        let mut other = MlsGroup::load(alice.provider.storage(), &GroupId::from_slice(G.as_bytes())).unwrap().unwrap();
        let m1 = alice.encrypt(&mut other, b"three").unwrap();
        let mut ga = alice.load_group(G).unwrap().unwrap();
        assert_eq!(parked(&alice), 0);
        let m2 = alice.encrypt(&mut ga, b"four").unwrap();
        assert_eq!(text_of(bob.process(&mut gb, &m1).unwrap()), b"three");
        assert_eq!(text_of(bob.process(&mut gb, &m2).unwrap()), b"four");
        let m = alice.encrypt(&mut ga, b"five").unwrap();
        // A write between the operation and the park: not kept.
        alice.key_package().unwrap();
        alice.park(ga);
        assert_eq!(parked(&alice), 0, "the storage moved after the operation");
        assert_eq!(text_of(bob.process(&mut gb, &m).unwrap()), b"five");
        let ga = alice.load_group(G).unwrap().unwrap();
        alice.park(ga);
        assert_eq!(parked(&alice), 1, "lent and handed back unchanged");
    }

    #[test]
    fn changed_rows_alone_rebuild_the_whole_state_after_every_operation() {
        let alice = Member::generate("alice's agent").unwrap();
        let bob = Member::generate("bob's agent").unwrap();
        let (mut da, mut db) = (Default::default(), Default::default());
        persist(&alice, &mut da);
        persist(&bob, &mut db);
        let mut ga = alice.create_group(G).unwrap();
        persist(&alice, &mut da);
        let kp = bob.key_package().unwrap();
        persist(&bob, &mut db);
        let (kp, _) = alice.inspect_key_package(&kp).unwrap();
        let (_, welcome) = alice.add(&mut ga, kp).unwrap();
        persist(&alice, &mut da);
        alice.merge_pending(&mut ga).unwrap();
        persist(&alice, &mut da);
        let mut gb = bob.join(&welcome).unwrap();
        persist(&bob, &mut db);
        for i in 0..3 {
            let m = alice.encrypt(&mut ga, format!("hello {i}").as_bytes()).unwrap();
            persist(&alice, &mut da);
            assert!(matches!(bob.process(&mut gb, &m).unwrap(), Processed::Application { .. }));
            persist(&bob, &mut db);
        }
        // A commit bob stages and drops (lost the epoch race), then one he makes.
        let carol = Member::generate("carol's agent").unwrap();
        let (kp, _) = bob.inspect_key_package(&carol.key_package().unwrap()).unwrap();
        bob.add(&mut gb, kp.clone()).unwrap();
        persist(&bob, &mut db);
        bob.discard_pending(&mut gb).unwrap();
        persist(&bob, &mut db);
        let (commit, _) = bob.add(&mut gb, kp).unwrap();
        bob.merge_pending(&mut gb).unwrap();
        persist(&bob, &mut db);
        alice.process(&mut ga, &commit).unwrap();
        persist(&alice, &mut da);
        // Restored from its rows, each carries on.
        let alice = Member::from_rows(da.clone(), alice.signature_key(), alice.name()).unwrap();
        let bob = Member::from_rows(db.clone(), bob.signature_key(), bob.name()).unwrap();
        let (mut ga, mut gb) = (alice.load_group(G).unwrap().unwrap(), bob.load_group(G).unwrap().unwrap());
        let m = bob.encrypt(&mut gb, b"after the restore").unwrap();
        match alice.process(&mut ga, &m).unwrap() {
            Processed::Application { data, .. } => assert_eq!(data, b"after the restore"),
            other => panic!("{other:?}"),
        }
        assert_eq!(epoch_authenticator(&ga), epoch_authenticator(&gb));
    }

    #[test]
    fn state_kept_by_openmls_memory_storage_loads_from_a_legacy_snapshot() {
        use openmls_rust_crypto::OpenMlsRustCrypto;
        // Bob as the code before migration 0018 kept him: OpenMLS's MemoryStorage, snapshotted.
        let provider = OpenMlsRustCrypto::default();
        let signer = SignatureKeyPair::new(CIPHERSUITE.signature_algorithm()).unwrap();
        signer.store(provider.storage()).unwrap();
        let credential = CredentialWithKey {
            credential: BasicCredential::new(b"bob's agent".to_vec()).into(),
            signature_key: signer.public().into(),
        };
        let kp = KeyPackage::builder().build(CIPHERSUITE, &provider, &signer, credential).unwrap();
        let kp = MlsMessageOut::from(kp.key_package().clone()).to_bytes().unwrap();
        let alice = Member::generate("alice's agent").unwrap();
        let mut ga = alice.create_group(G).unwrap();
        let (kp, _) = alice.inspect_key_package(&kp).unwrap();
        let (_, welcome) = alice.add(&mut ga, kp).unwrap();
        alice.merge_pending(&mut ga).unwrap();
        let MlsMessageBodyIn::Welcome(w) = MlsMessageIn::tls_deserialize_exact(&welcome).unwrap().extract() else {
            panic!("not a welcome")
        };
        StagedWelcome::new_from_welcome(&provider, &join_config(), w, None).unwrap().into_group(&provider).unwrap();
        let rows: Vec<_> = provider.storage().values.read().unwrap().clone().into_iter().collect();
        let legacy = storage::snapshot(&rows);

        let bob = Member::restore(&legacy, signer.public(), "bob's agent").unwrap();
        assert_eq!(bob.changes().len(), rows.len(), "every legacy entry is to be written as a row");
        let mut gb = bob.load_group(G).unwrap().unwrap();
        assert_eq!(epoch_authenticator(&gb), epoch_authenticator(&ga));
        let m = alice.encrypt(&mut ga, b"to the migrated bob").unwrap();
        assert!(matches!(bob.process(&mut gb, &m).unwrap(), Processed::Application { .. }));
        let back = bob.encrypt(&mut gb, b"from the migrated bob").unwrap();
        assert!(matches!(alice.process(&mut ga, &back).unwrap(), Processed::Application { .. }));
    }

    #[test]
    fn two_members_join_talk_and_a_removed_member_cannot_read_on() {
        let alice = Member::generate("alice's agent").unwrap();
        let bob = Member::generate("bob's agent").unwrap();
        let carol = Member::generate("carol's agent").unwrap();
        let mut ga = alice.create_group(G).unwrap();
        let (kp, who) = alice.inspect_key_package(&bob.key_package().unwrap()).unwrap();
        assert_eq!(who.name, "bob's agent");
        let (_commit, welcome) = alice.add(&mut ga, kp).unwrap();
        alice.merge_pending(&mut ga).unwrap();
        let mut gb = bob.join(&welcome).unwrap();
        let (kp, _) = alice.inspect_key_package(&carol.key_package().unwrap()).unwrap();
        let (commit, welcome) = alice.add(&mut ga, kp).unwrap();
        alice.merge_pending(&mut ga).unwrap();
        let mut gc = carol.join(&welcome).unwrap();
        match bob.process(&mut gb, &commit).unwrap() {
            Processed::Commit { committer, added, .. } => {
                assert_eq!(committer.fingerprint, alice.fingerprint());
                assert_eq!(added[0].fingerprint, carol.fingerprint());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(epoch_authenticator(&ga), epoch_authenticator(&gb));
        let hello = alice.encrypt(&mut ga, b"hello").unwrap();
        assert_eq!(crate::protocol::letmeknow::header::parse(&hello).unwrap().group_id, G.as_bytes());
        for (m, g) in [(&bob, &mut gb), (&carol, &mut gc)] {
            match m.process(g, &hello).unwrap() {
                Processed::Application { data, sender, .. } => {
                    assert_eq!(data, b"hello");
                    assert_eq!(sender.name, "alice's agent");
                }
                other => panic!("{other:?}"),
            }
        }
        // Restored from the rows his changes wrote, bob carries on.
        let bob = Member::from_rows(bob.rows(), bob.signature_key(), bob.name()).unwrap();
        let mut gb = bob.load_group(G).unwrap().unwrap();
        let carol_leaf = members(&ga).iter().find(|m| m.fingerprint == carol.fingerprint()).unwrap().leaf;
        let remove = bob.remove(&mut gb, &[carol_leaf]).unwrap();
        bob.merge_pending(&mut gb).unwrap();
        assert!(
            matches!(alice.process(&mut ga, &remove).unwrap(), Processed::Commit { removed, .. } if removed.len() == 1)
        );
        match carol.process(&mut gc, &remove).unwrap() {
            Processed::Commit { self_removed, .. } => assert!(self_removed),
            other => panic!("{other:?}"),
        }
        let secret = alice.encrypt(&mut ga, b"after carol left").unwrap();
        assert!(matches!(bob.process(&mut gb, &secret).unwrap(), Processed::Application { .. }));
        assert!(carol.process(&mut gc, &secret).is_err(), "the removed member cannot decrypt");
        assert_eq!(members(&ga).len(), 2);
    }

    #[test]
    fn a_stale_member_is_re_added_in_one_commit_and_its_new_state_replaces_the_old() {
        let (alice, mut ga, bob, mut gb_old) = pair();
        let carol = Member::generate("carol's agent").unwrap();
        let (kp, _) = alice.inspect_key_package(&carol.key_package().unwrap()).unwrap();
        let (_, welcome) = alice.add(&mut ga, kp).unwrap();
        alice.merge_pending(&mut ga).unwrap();
        let mut gc = carol.join(&welcome).unwrap();
        // Bob never sees the commit that added carol: his state is a stale epoch.
        let bob_leaf = members(&ga).iter().find(|m| m.fingerprint == bob.fingerprint()).unwrap().leaf;
        let (kp, who) = alice.inspect_key_package(&bob.key_package().unwrap()).unwrap();
        assert_eq!(who.fingerprint, bob.fingerprint(), "same session, same signature key");
        assert!(alice.add(&mut ga, kp.clone()).is_err(), "a plain Add of a key already in the tree is refused");
        alice.discard_pending(&mut ga).unwrap();
        let (commit, welcome) = alice.readd(&mut ga, bob_leaf, kp).unwrap();
        let (added, removed) = Member::pending_changes(&ga);
        assert_eq!(
            (added[0].fingerprint.as_str(), removed[0].fingerprint.as_str()),
            (who.fingerprint.as_str(), who.fingerprint.as_str())
        );
        alice.merge_pending(&mut ga).unwrap();
        match carol.process(&mut gc, &commit).unwrap() {
            Processed::Commit { added, removed, .. } => {
                assert_eq!(added.len(), 1);
                assert_eq!(removed.len(), 1);
                assert_eq!(added[0].fingerprint, bob.fingerprint());
                assert_eq!(removed[0].fingerprint, bob.fingerprint());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(members(&gc).iter().filter(|m| m.fingerprint == bob.fingerprint()).count(), 1, "one leaf");
        assert_eq!(members(&gc).len(), 3);
        // The stale state cannot read the new epoch; the Welcome replaces it.
        let hello = alice.encrypt(&mut ga, b"welcome back").unwrap();
        assert!(bob.process(&mut gb_old, &hello).is_err());
        let mut gb = bob.join(&welcome).unwrap();
        assert_eq!(gb.epoch(), ga.epoch());
        match bob.process(&mut gb, &hello).unwrap() {
            Processed::Application { data, .. } => assert_eq!(data, b"welcome back"),
            other => panic!("{other:?}"),
        }
        let back = bob.encrypt(&mut gb, b"glad to be back").unwrap();
        assert!(matches!(carol.process(&mut gc, &back).unwrap(), Processed::Application { .. }));
        // What persists is the new state only: restored, bob is at the new epoch.
        let bob = Member::from_rows(bob.rows(), bob.signature_key(), bob.name()).unwrap();
        assert_eq!(bob.load_group(G).unwrap().unwrap().epoch(), ga.epoch());
        assert!(alice.readd(&mut ga, 0, alice.inspect_key_package(&alice.key_package().unwrap()).unwrap().0).is_err());
    }
}
