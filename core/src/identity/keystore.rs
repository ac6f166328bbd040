//! Where secret keys live: the OS keyring (Secret Service, Keychain, Windows Credential Manager)
//! through `keyring-core` with real platform stores, or, only where no keyring can be reached, a
//! 0600 file in the profile. The choice is recorded at `init` and never changes silently: a
//! profile created on the keyring fails loudly if the keyring later disappears.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zeroize::Zeroizing;

const SERVICE: &str = "switchboard";

/// Which store holds the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeystoreKind {
    /// The operating system's keyring.
    OsKeyring,
    /// A 0600 file in the profile directory.
    File,
}

impl KeystoreKind {
    /// The name recorded in the profile.
    pub fn as_str(self) -> &'static str {
        match self {
            KeystoreKind::OsKeyring => "os-keyring",
            KeystoreKind::File => "file",
        }
    }

    /// Parses a recorded name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "os-keyring" => Some(Self::OsKeyring),
            "file" => Some(Self::File),
            _ => None,
        }
    }
}

/// Which store a new profile should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeystorePreference {
    /// The OS keyring if reachable, else the file store (and say so).
    #[default]
    Auto,
    /// The OS keyring or fail.
    Keyring,
    /// The file store.
    File,
}

impl std::str::FromStr for KeystorePreference {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "os-keyring" | "keyring" => Ok(Self::Keyring),
            "file" => Ok(Self::File),
            other => Err(format!("unknown keystore `{other}` (auto, os-keyring, file)")),
        }
    }
}

/// Keystore failures. All are local.
#[derive(Debug, thiserror::Error)]
pub enum KeystoreError {
    /// The OS keyring could not be reached or refused the operation.
    #[error("OS keyring unavailable: {0}")]
    Keyring(String),
    /// Reading or writing the key file failed.
    #[error("key file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The stored secret is not what we wrote.
    #[error("stored secret is corrupt")]
    Corrupt,
}

/// A handle on the secret store for one profile.
pub struct Keystore {
    kind: KeystoreKind,
    entry: Option<keyring_core::Entry>,
    file: PathBuf,
    dir: PathBuf,
    account: String,
    /// Why the file store is in use, when it is.
    pub fallback_reason: Option<String>,
}

impl std::fmt::Debug for Keystore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keystore").field("kind", &self.kind).field("file", &self.file).finish()
    }
}

#[cfg(target_os = "linux")]
fn platform_store() -> keyring_core::Result<Arc<keyring_core::CredentialStore>> {
    let store: Arc<keyring_core::CredentialStore> = zbus_secret_service_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(target_os = "macos")]
fn platform_store() -> keyring_core::Result<Arc<keyring_core::CredentialStore>> {
    let store: Arc<keyring_core::CredentialStore> = apple_native_keyring_store::keychain::Store::new()?;
    Ok(store)
}

#[cfg(target_os = "windows")]
fn platform_store() -> keyring_core::Result<Arc<keyring_core::CredentialStore>> {
    let store: Arc<keyring_core::CredentialStore> = windows_native_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "windows")))]
fn platform_store() -> keyring_core::Result<Arc<keyring_core::CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore("no OS keyring on this platform".into()))
}

/// Opens the OS keyring entry for `account` and checks it can be reached.
fn open_keyring(account: &str) -> Result<keyring_core::Entry, KeystoreError> {
    let store = platform_store().map_err(|e| KeystoreError::Keyring(e.to_string()))?;
    let entry = keyring_core::Entry::new_in_store(&store, SERVICE, account)
        .map_err(|e| KeystoreError::Keyring(e.to_string()))?;
    match entry.get_secret() {
        Ok(_) | Err(keyring_core::Error::NoEntry) => Ok(entry),
        Err(e) => Err(KeystoreError::Keyring(e.to_string())),
    }
}

impl Keystore {
    /// Opens the store of kind `kind` (as recorded at init) for `account`.
    pub fn open(kind: KeystoreKind, profile_dir: &Path, account: &str) -> Result<Self, KeystoreError> {
        let file = profile_dir.join("keys.secret");
        let entry = match kind {
            KeystoreKind::OsKeyring => Some(open_keyring(account)?),
            KeystoreKind::File => None,
        };
        Ok(Self { kind, entry, file, dir: profile_dir.to_owned(), account: account.to_owned(), fallback_reason: None })
    }

    /// Another secret of the same profile in the same store (`<slot>.secret`, or keyring user
    /// `<account>/<slot>`), e.g. a second protocol's identity.
    pub fn slot(&self, slot: &str) -> Result<Self, KeystoreError> {
        let user = format!("{}/{slot}", self.account);
        let entry = match self.kind {
            KeystoreKind::OsKeyring => Some(open_keyring(&user)?),
            KeystoreKind::File => None,
        };
        Ok(Self {
            kind: self.kind,
            entry,
            file: self.dir.join(format!("{slot}.secret")),
            dir: self.dir.clone(),
            account: self.account.clone(),
            fallback_reason: self.fallback_reason.clone(),
        })
    }

    /// Chooses a store for a new profile. `Auto` takes the OS keyring when reachable and
    /// otherwise the file store, recording why; `Keyring` fails if the keyring is unreachable.
    pub fn choose(pref: KeystorePreference, profile_dir: &Path, account: &str) -> Result<Self, KeystoreError> {
        match pref {
            KeystorePreference::File => {
                let mut ks = Self::open(KeystoreKind::File, profile_dir, account)?;
                ks.fallback_reason = Some("file store chosen explicitly".into());
                Ok(ks)
            }
            KeystorePreference::Keyring => Self::open(KeystoreKind::OsKeyring, profile_dir, account),
            KeystorePreference::Auto => match Self::open(KeystoreKind::OsKeyring, profile_dir, account) {
                Ok(ks) => Ok(ks),
                Err(e) => {
                    let mut ks = Self::open(KeystoreKind::File, profile_dir, account)?;
                    ks.fallback_reason = Some(format!("no OS keyring reachable: {e}"));
                    Ok(ks)
                }
            },
        }
    }

    /// Which store this is.
    pub fn kind(&self) -> KeystoreKind {
        self.kind
    }

    /// A one-line description for `whoami` and `status`.
    pub fn describe(&self) -> String {
        match (self.kind, &self.fallback_reason) {
            (KeystoreKind::OsKeyring, _) => "os-keyring".into(),
            (KeystoreKind::File, Some(why)) => {
                format!("file {} (0600; {why})", self.file.display())
            }
            (KeystoreKind::File, None) => format!("file {} (0600)", self.file.display()),
        }
    }

    /// Reads the secret, if one was saved.
    pub fn load(&self) -> Result<Option<Zeroizing<Vec<u8>>>, KeystoreError> {
        if let Some(entry) = &self.entry {
            return match entry.get_secret() {
                Ok(s) => Ok(Some(Zeroizing::new(s))),
                Err(keyring_core::Error::NoEntry) => Ok(None),
                Err(e) => Err(KeystoreError::Keyring(e.to_string())),
            };
        }
        match std::fs::read(&self.file) {
            Ok(text) => {
                let text = Zeroizing::new(text);
                let decoded =
                    crate::util::b64u_decode(std::str::from_utf8(&text).map_err(|_| KeystoreError::Corrupt)?.trim())
                        .ok_or(KeystoreError::Corrupt)?;
                Ok(Some(Zeroizing::new(decoded)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(KeystoreError::File { path: self.file.clone(), source }),
        }
    }

    /// Saves the secret.
    pub fn save(&self, secret: &[u8]) -> Result<(), KeystoreError> {
        if let Some(entry) = &self.entry {
            return entry.set_secret(secret).map_err(|e| KeystoreError::Keyring(e.to_string()));
        }
        let text = Zeroizing::new(crate::util::b64u(secret));
        crate::profile::write_private(&self.file, text.as_bytes())
            .map_err(|source| KeystoreError::File { path: self.file.clone(), source })
    }

    /// Deletes the secret (used when `init` fails half-way).
    pub fn delete(&self) -> Result<(), KeystoreError> {
        if let Some(entry) = &self.entry {
            return match entry.delete_credential() {
                Ok(()) | Err(keyring_core::Error::NoEntry) => Ok(()),
                Err(e) => Err(KeystoreError::Keyring(e.to_string())),
            };
        }
        match std::fs::remove_file(&self.file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(KeystoreError::File { path: self.file.clone(), source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_store_round_trips_with_0600() {
        let dir = tempfile::tempdir().unwrap();
        let ks = Keystore::open(KeystoreKind::File, dir.path(), "t").unwrap();
        assert!(ks.load().unwrap().is_none());
        ks.save(&[1, 2, 3]).unwrap();
        assert_eq!(ks.load().unwrap().unwrap().as_slice(), &[1, 2, 3]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("keys.secret")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
