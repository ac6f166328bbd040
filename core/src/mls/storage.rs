//! The OpenMLS storage provider and how its state reaches SQLite.
//!
//! Choice (documented in ARCHITECTURE.md): OpenMLS's storage trait is synchronous, and the
//! published `openmls_sqlx_storage` is built on sqlx 0.8, whose bundled SQLite cannot link beside
//! the sqlx 0.9 this workspace uses. So each member keeps OpenMLS's own `MemoryStorage` (the
//! provider OpenMLS tests itself against), and after every operation the engine writes a
//! [`snapshot`] of it into the member's row *in the same SQLite transaction* as the message
//! rows that operation produced; a crash before the commit loses both, never one of them.
//! Groups are small (2–5 members, 50 in the benchmark), so a snapshot is tens of kilobytes.
//!
//! Snapshot format: `u32` count, then for each entry in key order `u32 key length ‖ key ‖ u32
//! value length ‖ value` (big-endian); [`restore`] refuses anything else.

use std::collections::HashMap;

use openmls_memory_storage::MemoryStorage;

use super::MlsError;

/// Serializes the storage's entries in key order (deterministic bytes for equal state).
pub fn snapshot(storage: &MemoryStorage) -> Vec<u8> {
    let values = storage.values.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut entries: Vec<(&Vec<u8>, &Vec<u8>)> = values.iter().collect();
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

/// Rebuilds a storage from [`snapshot`] bytes.
pub fn restore(bytes: &[u8]) -> Result<MemoryStorage, MlsError> {
    let mut rest = bytes;
    let count = u32_at(&mut rest)?;
    let mut values = HashMap::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let kl = u32_at(&mut rest)?;
        let k = take(&mut rest, kl)?.to_vec();
        let vl = u32_at(&mut rest)?;
        let v = take(&mut rest, vl)?.to_vec();
        values.insert(k, v);
    }
    if !rest.is_empty() {
        return Err(MlsError::Corrupt("trailing bytes after the storage snapshot".into()));
    }
    let storage = MemoryStorage::default();
    *storage.values.write().unwrap_or_else(std::sync::PoisonError::into_inner) = values;
    Ok(storage)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_refuses_damage() {
        let storage = MemoryStorage::default();
        storage.values.write().unwrap().insert(b"k1".to_vec(), b"v1".to_vec());
        storage.values.write().unwrap().insert(b"k0".to_vec(), Vec::new());
        let bytes = snapshot(&storage);
        let back = restore(&bytes).unwrap();
        assert_eq!(*back.values.read().unwrap(), *storage.values.read().unwrap());
        assert_eq!(snapshot(&back), bytes, "deterministic");
        assert!(restore(&bytes[..bytes.len() - 1]).is_err());
        assert!(restore(&[bytes.as_slice(), b"x"].concat()).is_err());
    }
}
