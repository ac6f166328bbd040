//! The OpenMLS storage provider and how its state reaches SQLite: [`RowStorage`] keeps each
//! member's OpenMLS entries in memory and remembers which keys an operation wrote or deleted, so
//! the engine writes only those rows (`lmk_mls_rows`, one per key) *in the same SQLite
//! transaction* as the message rows that operation produced; a crash before the commit loses
//! both, never one of them.
//!
//! Choice (documented in ARCHITECTURE.md): OpenMLS's storage trait is synchronous, and the
//! published `openmls_sqlx_storage` is built on sqlx 0.8, whose bundled SQLite cannot link beside
//! the sqlx 0.9 this workspace uses. So the entries live in memory while the member is loaded and
//! SQLite holds their durable copy; a restore reads the rows back.
//!
//! - Keys and values are laid out exactly as in `openmls_memory_storage` 0.6 (`label ‖ JSON key
//!   ‖ u16 version`, JSON values), the provider this replaced, so a profile made before migration
//!   0018 (one [`snapshot`] blob of those entries) becomes rows unchanged.
//! - [`RowStorage::changes`] lists the dirty keys with their current value (`None`: deleted);
//!   [`RowStorage::saved`] forgets them once the caller's transaction committed. A transaction
//!   that fails leaves them dirty, so the next save writes them again.
//!
//! Legacy snapshot format (read only to migrate): `u32` count, then for each entry in key order
//! `u32 key length ‖ key ‖ u32 value length ‖ value` (big-endian); [`restore`] refuses anything
//! else.

use std::collections::{BTreeSet, HashMap};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use openmls_traits::storage::{CURRENT_VERSION, Entity, StorageProvider, traits};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::MlsError;

/// One stored entry: (key, value).
pub type Row = (Vec<u8>, Vec<u8>);

/// One changed entry: its key and its value now, `None` when it was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The storage key.
    pub key: Vec<u8>,
    /// The value to write, or `None` to delete the row.
    pub value: Option<Vec<u8>>,
}

#[derive(Debug, Default)]
struct Entries {
    values: HashMap<Vec<u8>, Vec<u8>>,
    dirty: BTreeSet<Vec<u8>>,
    /// Counts every write and delete of a value (not [`RowStorage::saved`], which changes none).
    version: u64,
}

/// OpenMLS entries in memory, with the set of keys changed since the last [`saved`](Self::saved).
#[derive(Debug, Default)]
pub struct RowStorage {
    entries: RwLock<Entries>,
}

/// Why the storage provider failed (a bug or damaged local state: local fault).
#[derive(Debug, thiserror::Error)]
pub enum RowStorageError {
    /// A value could not be encoded or a stored value could not be decoded.
    #[error("MLS storage entry does not (de)serialize: {0}")]
    Serialization(String),
    /// A queued proposal named in the proposal queue is missing.
    #[error("a queued proposal is missing from the MLS storage")]
    MissingProposal,
}

impl From<serde_json::Error> for RowStorageError {
    fn from(e: serde_json::Error) -> Self {
        Self::Serialization(e.to_string())
    }
}

type Res<T> = Result<T, RowStorageError>;

fn json<T: Serialize + ?Sized>(v: &T) -> Res<Vec<u8>> {
    Ok(serde_json::to_vec(v)?)
}

/// `label ‖ key ‖ version`, as `openmls_memory_storage` builds it.
fn storage_key(label: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(label.len() + key.len() + 2);
    out.extend_from_slice(label);
    out.extend_from_slice(key);
    out.extend_from_slice(&CURRENT_VERSION.to_be_bytes());
    out
}

const KEY_PACKAGE_LABEL: &[u8] = b"KeyPackage";
const PSK_LABEL: &[u8] = b"Psk";
const ENCRYPTION_KEY_PAIR_LABEL: &[u8] = b"EncryptionKeyPair";
const SIGNATURE_KEY_PAIR_LABEL: &[u8] = b"SignatureKeyPair";
const EPOCH_KEY_PAIRS_LABEL: &[u8] = b"EpochKeyPairs";
const TREE_LABEL: &[u8] = b"Tree";
const GROUP_CONTEXT_LABEL: &[u8] = b"GroupContext";
const INTERIM_TRANSCRIPT_HASH_LABEL: &[u8] = b"InterimTranscriptHash";
const CONFIRMATION_TAG_LABEL: &[u8] = b"ConfirmationTag";
const JOIN_CONFIG_LABEL: &[u8] = b"MlsGroupJoinConfig";
const OWN_LEAF_NODES_LABEL: &[u8] = b"OwnLeafNodes";
const GROUP_STATE_LABEL: &[u8] = b"GroupState";
const QUEUED_PROPOSAL_LABEL: &[u8] = b"QueuedProposal";
const PROPOSAL_QUEUE_REFS_LABEL: &[u8] = b"ProposalQueueRefs";
const OWN_LEAF_NODE_INDEX_LABEL: &[u8] = b"OwnLeafNodeIndex";
const EPOCH_SECRETS_LABEL: &[u8] = b"EpochSecrets";
const RESUMPTION_PSK_STORE_LABEL: &[u8] = b"ResumptionPsk";
const MESSAGE_SECRETS_LABEL: &[u8] = b"MessageSecrets";

impl RowStorage {
    /// A storage holding `rows` (as loaded from SQLite), nothing dirty.
    pub fn from_rows(rows: impl IntoIterator<Item = Row>) -> Self {
        let values = rows.into_iter().collect();
        Self { entries: RwLock::new(Entries { values, dirty: BTreeSet::new(), version: 0 }) }
    }

    /// How many times a value was written or deleted since these entries were loaded: equal at
    /// two moments, nothing changed between them.
    pub fn version(&self) -> u64 {
        self.read_lock().version
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, Entries> {
        self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, Entries> {
        self.entries.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every entry, in key order.
    pub fn rows(&self) -> Vec<Row> {
        let e = self.read_lock();
        let mut rows: Vec<Row> = e.values.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        rows.sort();
        rows
    }

    /// Marks every entry dirty, so the next save writes the whole state (a legacy snapshot
    /// becoming rows).
    pub fn mark_all_dirty(&self) {
        let mut e = self.write_lock();
        let keys: Vec<Vec<u8>> = e.values.keys().cloned().collect();
        e.dirty.extend(keys);
    }

    /// The entries changed since the last [`saved`](Self::saved), in key order.
    pub fn changes(&self) -> Vec<Change> {
        let e = self.read_lock();
        e.dirty.iter().map(|k| Change { key: k.clone(), value: e.values.get(k).cloned() }).collect()
    }

    /// Whether anything changed since the last [`saved`](Self::saved).
    pub fn is_dirty(&self) -> bool {
        !self.read_lock().dirty.is_empty()
    }

    /// Forgets `changes` once they are committed; an entry changed again since they were taken
    /// stays dirty.
    pub fn saved(&self, changes: &[Change]) {
        let mut e = self.write_lock();
        for c in changes {
            if e.values.get(&c.key) == c.value.as_ref() {
                e.dirty.remove(&c.key);
            }
        }
    }

    fn put(&self, label: &[u8], key: &[u8], value: Vec<u8>) -> Res<()> {
        let k = storage_key(label, key);
        let mut e = self.write_lock();
        e.values.insert(k.clone(), value);
        e.dirty.insert(k);
        e.version += 1;
        Ok(())
    }

    fn del(&self, label: &[u8], key: &[u8]) -> Res<()> {
        let k = storage_key(label, key);
        let mut e = self.write_lock();
        if e.values.remove(&k).is_some() {
            e.dirty.insert(k);
        }
        e.version += 1;
        Ok(())
    }

    fn get<V: DeserializeOwned>(&self, label: &[u8], key: &[u8]) -> Res<Option<V>> {
        let k = storage_key(label, key);
        let e = self.read_lock();
        e.values.get(&k).map(|v| serde_json::from_slice(v)).transpose().map_err(Into::into)
    }

    fn get_list<V: Entity<CURRENT_VERSION>>(&self, label: &[u8], key: &[u8]) -> Res<Vec<V>> {
        let k = storage_key(label, key);
        let e = self.read_lock();
        let Some(list) = e.values.get(&k) else { return Ok(Vec::new()) };
        let items: Vec<Vec<u8>> = serde_json::from_slice(list)?;
        items.iter().map(|i| serde_json::from_slice(i).map_err(Into::into)).collect()
    }

    /// Rewrites the JSON list of byte strings at (`label`, `key`) with `edit`.
    fn edit_list(&self, label: &[u8], key: &[u8], edit: impl FnOnce(&mut Vec<Vec<u8>>)) -> Res<()> {
        let k = storage_key(label, key);
        let mut e = self.write_lock();
        let mut list: Vec<Vec<u8>> = match e.values.get(&k) {
            Some(bytes) => serde_json::from_slice(bytes)?,
            None => Vec::new(),
        };
        edit(&mut list);
        e.values.insert(k.clone(), json(&list)?);
        e.dirty.insert(k);
        e.version += 1;
        Ok(())
    }
}

fn epoch_key_pairs_id(
    group_id: &impl traits::GroupId<CURRENT_VERSION>,
    epoch: &impl traits::EpochKey<CURRENT_VERSION>,
    leaf_index: u32,
) -> Res<Vec<u8>> {
    let mut key = json(group_id)?;
    key.extend_from_slice(&json(epoch)?);
    key.extend_from_slice(&json(&leaf_index)?);
    Ok(key)
}

impl StorageProvider<CURRENT_VERSION> for RowStorage {
    type Error = RowStorageError;

    fn write_mls_join_config<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        MlsGroupJoinConfig: traits::MlsGroupJoinConfig<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        config: &MlsGroupJoinConfig,
    ) -> Res<()> {
        self.put(JOIN_CONFIG_LABEL, &json(group_id)?, json(config)?)
    }

    fn append_own_leaf_node<GroupId: traits::GroupId<CURRENT_VERSION>, LeafNode: traits::LeafNode<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
        leaf_node: &LeafNode,
    ) -> Res<()> {
        let value = json(leaf_node)?;
        self.edit_list(OWN_LEAF_NODES_LABEL, &json(group_id)?, |l| l.push(value))
    }

    fn queue_proposal<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ProposalRef: traits::ProposalRef<CURRENT_VERSION>,
        QueuedProposal: traits::QueuedProposal<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        proposal_ref: &ProposalRef,
        proposal: &QueuedProposal,
    ) -> Res<()> {
        self.put(QUEUED_PROPOSAL_LABEL, &json(&(group_id, proposal_ref))?, json(proposal)?)?;
        let value = json(proposal_ref)?;
        self.edit_list(PROPOSAL_QUEUE_REFS_LABEL, &json(group_id)?, |l| l.push(value))
    }

    fn write_tree<GroupId: traits::GroupId<CURRENT_VERSION>, TreeSync: traits::TreeSync<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
        tree: &TreeSync,
    ) -> Res<()> {
        self.put(TREE_LABEL, &json(group_id)?, json(tree)?)
    }

    fn write_interim_transcript_hash<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        InterimTranscriptHash: traits::InterimTranscriptHash<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        interim_transcript_hash: &InterimTranscriptHash,
    ) -> Res<()> {
        self.put(INTERIM_TRANSCRIPT_HASH_LABEL, &json(group_id)?, json(interim_transcript_hash)?)
    }

    fn write_context<GroupId: traits::GroupId<CURRENT_VERSION>, GroupContext: traits::GroupContext<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
        group_context: &GroupContext,
    ) -> Res<()> {
        self.put(GROUP_CONTEXT_LABEL, &json(group_id)?, json(group_context)?)
    }

    fn write_confirmation_tag<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ConfirmationTag: traits::ConfirmationTag<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        confirmation_tag: &ConfirmationTag,
    ) -> Res<()> {
        self.put(CONFIRMATION_TAG_LABEL, &json(group_id)?, json(confirmation_tag)?)
    }

    fn write_group_state<GroupState: traits::GroupState<CURRENT_VERSION>, GroupId: traits::GroupId<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
        group_state: &GroupState,
    ) -> Res<()> {
        self.put(GROUP_STATE_LABEL, &json(group_id)?, json(group_state)?)
    }

    fn write_message_secrets<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        MessageSecrets: traits::MessageSecrets<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        message_secrets: &MessageSecrets,
    ) -> Res<()> {
        self.put(MESSAGE_SECRETS_LABEL, &json(group_id)?, json(message_secrets)?)
    }

    fn write_resumption_psk_store<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ResumptionPskStore: traits::ResumptionPskStore<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        resumption_psk_store: &ResumptionPskStore,
    ) -> Res<()> {
        self.put(RESUMPTION_PSK_STORE_LABEL, &json(group_id)?, json(resumption_psk_store)?)
    }

    fn write_own_leaf_index<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        LeafNodeIndex: traits::LeafNodeIndex<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        own_leaf_index: &LeafNodeIndex,
    ) -> Res<()> {
        self.put(OWN_LEAF_NODE_INDEX_LABEL, &json(group_id)?, json(own_leaf_index)?)
    }

    fn write_group_epoch_secrets<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        GroupEpochSecrets: traits::GroupEpochSecrets<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        group_epoch_secrets: &GroupEpochSecrets,
    ) -> Res<()> {
        self.put(EPOCH_SECRETS_LABEL, &json(group_id)?, json(group_epoch_secrets)?)
    }

    fn write_signature_key_pair<
        SignaturePublicKey: traits::SignaturePublicKey<CURRENT_VERSION>,
        SignatureKeyPair: traits::SignatureKeyPair<CURRENT_VERSION>,
    >(
        &self,
        public_key: &SignaturePublicKey,
        signature_key_pair: &SignatureKeyPair,
    ) -> Res<()> {
        self.put(SIGNATURE_KEY_PAIR_LABEL, &json(public_key)?, json(signature_key_pair)?)
    }

    fn write_encryption_key_pair<
        EncryptionKey: traits::EncryptionKey<CURRENT_VERSION>,
        HpkeKeyPair: traits::HpkeKeyPair<CURRENT_VERSION>,
    >(
        &self,
        public_key: &EncryptionKey,
        key_pair: &HpkeKeyPair,
    ) -> Res<()> {
        self.put(ENCRYPTION_KEY_PAIR_LABEL, &json(public_key)?, json(key_pair)?)
    }

    fn write_encryption_epoch_key_pairs<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        EpochKey: traits::EpochKey<CURRENT_VERSION>,
        HpkeKeyPair: traits::HpkeKeyPair<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        epoch: &EpochKey,
        leaf_index: u32,
        key_pairs: &[HpkeKeyPair],
    ) -> Res<()> {
        self.put(EPOCH_KEY_PAIRS_LABEL, &epoch_key_pairs_id(group_id, epoch, leaf_index)?, json(key_pairs)?)
    }

    fn write_key_package<
        HashReference: traits::HashReference<CURRENT_VERSION>,
        KeyPackage: traits::KeyPackage<CURRENT_VERSION>,
    >(
        &self,
        hash_ref: &HashReference,
        key_package: &KeyPackage,
    ) -> Res<()> {
        self.put(KEY_PACKAGE_LABEL, &json(hash_ref)?, json(key_package)?)
    }

    fn write_psk<PskId: traits::PskId<CURRENT_VERSION>, PskBundle: traits::PskBundle<CURRENT_VERSION>>(
        &self,
        psk_id: &PskId,
        psk: &PskBundle,
    ) -> Res<()> {
        self.put(PSK_LABEL, &json(psk_id)?, json(psk)?)
    }

    fn mls_group_join_config<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        MlsGroupJoinConfig: traits::MlsGroupJoinConfig<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<MlsGroupJoinConfig>> {
        self.get(JOIN_CONFIG_LABEL, &json(group_id)?)
    }

    fn own_leaf_nodes<GroupId: traits::GroupId<CURRENT_VERSION>, LeafNode: traits::LeafNode<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
    ) -> Res<Vec<LeafNode>> {
        self.get_list(OWN_LEAF_NODES_LABEL, &json(group_id)?)
    }

    fn queued_proposal_refs<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ProposalRef: traits::ProposalRef<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Vec<ProposalRef>> {
        self.get_list(PROPOSAL_QUEUE_REFS_LABEL, &json(group_id)?)
    }

    fn queued_proposals<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ProposalRef: traits::ProposalRef<CURRENT_VERSION>,
        QueuedProposal: traits::QueuedProposal<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Vec<(ProposalRef, QueuedProposal)>> {
        let refs: Vec<ProposalRef> = self.get_list(PROPOSAL_QUEUE_REFS_LABEL, &json(group_id)?)?;
        refs.into_iter()
            .map(|r| {
                let p = self
                    .get(QUEUED_PROPOSAL_LABEL, &json(&(group_id, &r))?)?
                    .ok_or(RowStorageError::MissingProposal)?;
                Ok((r, p))
            })
            .collect()
    }

    fn tree<GroupId: traits::GroupId<CURRENT_VERSION>, TreeSync: traits::TreeSync<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<TreeSync>> {
        self.get(TREE_LABEL, &json(group_id)?)
    }

    fn group_context<GroupId: traits::GroupId<CURRENT_VERSION>, GroupContext: traits::GroupContext<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<GroupContext>> {
        self.get(GROUP_CONTEXT_LABEL, &json(group_id)?)
    }

    fn interim_transcript_hash<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        InterimTranscriptHash: traits::InterimTranscriptHash<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<InterimTranscriptHash>> {
        self.get(INTERIM_TRANSCRIPT_HASH_LABEL, &json(group_id)?)
    }

    fn confirmation_tag<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ConfirmationTag: traits::ConfirmationTag<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<ConfirmationTag>> {
        self.get(CONFIRMATION_TAG_LABEL, &json(group_id)?)
    }

    fn group_state<GroupState: traits::GroupState<CURRENT_VERSION>, GroupId: traits::GroupId<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<GroupState>> {
        self.get(GROUP_STATE_LABEL, &json(group_id)?)
    }

    fn message_secrets<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        MessageSecrets: traits::MessageSecrets<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<MessageSecrets>> {
        self.get(MESSAGE_SECRETS_LABEL, &json(group_id)?)
    }

    fn resumption_psk_store<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ResumptionPskStore: traits::ResumptionPskStore<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<ResumptionPskStore>> {
        self.get(RESUMPTION_PSK_STORE_LABEL, &json(group_id)?)
    }

    fn own_leaf_index<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        LeafNodeIndex: traits::LeafNodeIndex<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<LeafNodeIndex>> {
        self.get(OWN_LEAF_NODE_INDEX_LABEL, &json(group_id)?)
    }

    fn group_epoch_secrets<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        GroupEpochSecrets: traits::GroupEpochSecrets<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<Option<GroupEpochSecrets>> {
        self.get(EPOCH_SECRETS_LABEL, &json(group_id)?)
    }

    fn signature_key_pair<
        SignaturePublicKey: traits::SignaturePublicKey<CURRENT_VERSION>,
        SignatureKeyPair: traits::SignatureKeyPair<CURRENT_VERSION>,
    >(
        &self,
        public_key: &SignaturePublicKey,
    ) -> Res<Option<SignatureKeyPair>> {
        self.get(SIGNATURE_KEY_PAIR_LABEL, &json(public_key)?)
    }

    fn encryption_key_pair<
        HpkeKeyPair: traits::HpkeKeyPair<CURRENT_VERSION>,
        EncryptionKey: traits::EncryptionKey<CURRENT_VERSION>,
    >(
        &self,
        public_key: &EncryptionKey,
    ) -> Res<Option<HpkeKeyPair>> {
        self.get(ENCRYPTION_KEY_PAIR_LABEL, &json(public_key)?)
    }

    fn encryption_epoch_key_pairs<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        EpochKey: traits::EpochKey<CURRENT_VERSION>,
        HpkeKeyPair: traits::HpkeKeyPair<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        epoch: &EpochKey,
        leaf_index: u32,
    ) -> Res<Vec<HpkeKeyPair>> {
        Ok(self.get(EPOCH_KEY_PAIRS_LABEL, &epoch_key_pairs_id(group_id, epoch, leaf_index)?)?.unwrap_or_default())
    }

    fn key_package<
        KeyPackageRef: traits::HashReference<CURRENT_VERSION>,
        KeyPackage: traits::KeyPackage<CURRENT_VERSION>,
    >(
        &self,
        hash_ref: &KeyPackageRef,
    ) -> Res<Option<KeyPackage>> {
        self.get(KEY_PACKAGE_LABEL, &json(hash_ref)?)
    }

    fn psk<PskBundle: traits::PskBundle<CURRENT_VERSION>, PskId: traits::PskId<CURRENT_VERSION>>(
        &self,
        psk_id: &PskId,
    ) -> Res<Option<PskBundle>> {
        self.get(PSK_LABEL, &json(psk_id)?)
    }

    fn remove_proposal<GroupId: traits::GroupId<CURRENT_VERSION>, ProposalRef: traits::ProposalRef<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
        proposal_ref: &ProposalRef,
    ) -> Res<()> {
        let value = json(proposal_ref)?;
        self.edit_list(PROPOSAL_QUEUE_REFS_LABEL, &json(group_id)?, |l| {
            if let Some(pos) = l.iter().position(|item| *item == value) {
                l.remove(pos);
            }
        })?;
        self.del(QUEUED_PROPOSAL_LABEL, &json(&(group_id, proposal_ref))?)
    }

    fn delete_own_leaf_nodes<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(OWN_LEAF_NODES_LABEL, &json(group_id)?)
    }

    fn delete_group_config<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(JOIN_CONFIG_LABEL, &json(group_id)?)
    }

    fn delete_tree<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(TREE_LABEL, &json(group_id)?)
    }

    fn delete_confirmation_tag<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(CONFIRMATION_TAG_LABEL, &json(group_id)?)
    }

    fn delete_group_state<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(GROUP_STATE_LABEL, &json(group_id)?)
    }

    fn delete_context<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(GROUP_CONTEXT_LABEL, &json(group_id)?)
    }

    fn delete_interim_transcript_hash<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(INTERIM_TRANSCRIPT_HASH_LABEL, &json(group_id)?)
    }

    fn delete_message_secrets<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(MESSAGE_SECRETS_LABEL, &json(group_id)?)
    }

    fn delete_all_resumption_psk_secrets<GroupId: traits::GroupId<CURRENT_VERSION>>(
        &self,
        group_id: &GroupId,
    ) -> Res<()> {
        self.del(RESUMPTION_PSK_STORE_LABEL, &json(group_id)?)
    }

    fn delete_own_leaf_index<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(OWN_LEAF_NODE_INDEX_LABEL, &json(group_id)?)
    }

    fn delete_group_epoch_secrets<GroupId: traits::GroupId<CURRENT_VERSION>>(&self, group_id: &GroupId) -> Res<()> {
        self.del(EPOCH_SECRETS_LABEL, &json(group_id)?)
    }

    fn clear_proposal_queue<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        ProposalRef: traits::ProposalRef<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Res<()> {
        let refs: Vec<ProposalRef> = self.get_list(PROPOSAL_QUEUE_REFS_LABEL, &json(group_id)?)?;
        for r in refs {
            self.del(QUEUED_PROPOSAL_LABEL, &json(&(group_id, r))?)?;
        }
        self.del(PROPOSAL_QUEUE_REFS_LABEL, &json(group_id)?)
    }

    fn delete_signature_key_pair<SignaturePublicKey: traits::SignaturePublicKey<CURRENT_VERSION>>(
        &self,
        public_key: &SignaturePublicKey,
    ) -> Res<()> {
        self.del(SIGNATURE_KEY_PAIR_LABEL, &json(public_key)?)
    }

    fn delete_encryption_key_pair<EncryptionKey: traits::EncryptionKey<CURRENT_VERSION>>(
        &self,
        public_key: &EncryptionKey,
    ) -> Res<()> {
        self.del(ENCRYPTION_KEY_PAIR_LABEL, &json(public_key)?)
    }

    fn delete_encryption_epoch_key_pairs<
        GroupId: traits::GroupId<CURRENT_VERSION>,
        EpochKey: traits::EpochKey<CURRENT_VERSION>,
    >(
        &self,
        group_id: &GroupId,
        epoch: &EpochKey,
        leaf_index: u32,
    ) -> Res<()> {
        self.del(EPOCH_KEY_PAIRS_LABEL, &epoch_key_pairs_id(group_id, epoch, leaf_index)?)
    }

    fn delete_key_package<KeyPackageRef: traits::HashReference<CURRENT_VERSION>>(
        &self,
        hash_ref: &KeyPackageRef,
    ) -> Res<()> {
        self.del(KEY_PACKAGE_LABEL, &json(hash_ref)?)
    }

    fn delete_psk<PskKey: traits::PskId<CURRENT_VERSION>>(&self, psk_id: &PskKey) -> Res<()> {
        self.del(PSK_LABEL, &json(psk_id)?)
    }
}

// ---- the legacy snapshot (profiles made before migration 0018) ------------------------------

/// Serializes `rows` in the legacy snapshot format, in key order. Only to write what profiles
/// made before migration 0018 hold (their tests) and to compare states.
pub fn snapshot(rows: &[Row]) -> Vec<u8> {
    let mut entries: Vec<&Row> = rows.iter().collect();
    entries.sort();
    let total: usize = entries.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    let mut out = Vec::with_capacity(4 + total);
    out.extend_from_slice(&len32(entries.len()).to_be_bytes());
    for (k, v) in entries {
        out.extend_from_slice(&len32(k.len()).to_be_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&len32(v.len()).to_be_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], MlsError> {
    if rest.len() < n {
        return Err(MlsError::Corrupt("storage snapshot truncated".into()));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn u32_at(rest: &mut &[u8]) -> Result<usize, MlsError> {
    let b: [u8; 4] = take(rest, 4)?.try_into().map_err(|_| MlsError::Corrupt("length".into()))?;
    usize::try_from(u32::from_be_bytes(b)).map_err(|_| MlsError::Corrupt("length".into()))
}

/// The entries of a legacy [`snapshot`].
pub fn restore(bytes: &[u8]) -> Result<Vec<Row>, MlsError> {
    let mut rest = bytes;
    let count = u32_at(&mut rest)?;
    let mut rows = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let kl = u32_at(&mut rest)?;
        let k = take(&mut rest, kl)?.to_vec();
        let vl = u32_at(&mut rest)?;
        let v = take(&mut rest, vl)?.to_vec();
        rows.push((k, v));
    }
    if !rest.is_empty() {
        return Err(MlsError::Corrupt("trailing bytes after the storage snapshot".into()));
    }
    Ok(rows)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_refuses_damage() {
        let rows = vec![(b"k1".to_vec(), b"v1".to_vec()), (b"k0".to_vec(), Vec::new())];
        let bytes = snapshot(&rows);
        let mut back = restore(&bytes).unwrap();
        back.sort();
        let mut sorted = rows.clone();
        sorted.sort();
        assert_eq!(back, sorted);
        assert_eq!(snapshot(&back), bytes, "deterministic");
        assert!(restore(&bytes[..bytes.len() - 1]).is_err());
        assert!(restore(&[bytes.as_slice(), b"x"].concat()).is_err());
    }

    #[test]
    fn changes_name_written_and_deleted_keys_until_saved() {
        let s = RowStorage::from_rows([(storage_key(TREE_LABEL, b"\"g\""), b"1".to_vec())]);
        assert!(!s.is_dirty(), "loaded rows are clean");
        s.put(GROUP_STATE_LABEL, b"\"g\"", b"\"Operational\"".to_vec()).unwrap();
        s.del(TREE_LABEL, b"\"g\"").unwrap();
        s.del(PSK_LABEL, b"\"absent\"").unwrap();
        let changes = s.changes();
        assert_eq!(
            changes,
            vec![
                Change { key: storage_key(GROUP_STATE_LABEL, b"\"g\""), value: Some(b"\"Operational\"".to_vec()) },
                Change { key: storage_key(TREE_LABEL, b"\"g\""), value: None },
            ],
            "a write and a delete; deleting what was never there changes nothing"
        );
        // Written again after the changes were taken: still dirty after their save.
        s.put(GROUP_STATE_LABEL, b"\"g\"", b"\"Inactive\"".to_vec()).unwrap();
        s.saved(&changes);
        assert_eq!(s.changes().len(), 1);
        assert_eq!(s.changes()[0].value.as_deref(), Some(&b"\"Inactive\""[..]));
        let again = s.changes();
        s.saved(&again);
        assert!(!s.is_dirty());
    }
}
