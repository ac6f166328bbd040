//! The profile directory: where it is, the files in it, and the lock that makes one runtime its
//! only owner.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A profile directory and the paths of the files in it.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The directory.
    pub dir: PathBuf,
}

/// Profile-level failures.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No home was given and the OS has no data directory.
    #[error("no profile directory: pass --home DIR or set SWITCHBOARD_HOME")]
    NoHome,
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ProfileError + '_ {
    move |source| ProfileError::Io { path: path.to_owned(), source }
}

/// Held while a runtime owns the profile; released on drop.
#[derive(Debug)]
pub struct ProfileLock {
    _file: File,
}

impl Profile {
    /// `--home`, else `SWITCHBOARD_HOME`, else `<OS data dir>/switchboard/profiles/default`.
    pub fn resolve(home: Option<PathBuf>) -> Result<Self, ProfileError> {
        let dir = match home.or_else(|| std::env::var_os("SWITCHBOARD_HOME").map(PathBuf::from)) {
            Some(d) => d,
            None => dirs::data_dir().ok_or(ProfileError::NoHome)?.join("switchboard/profiles/default"),
        };
        Ok(Self { dir })
    }

    /// Creates the directory (0700) if needed.
    pub fn ensure_dir(&self) -> Result<(), ProfileError> {
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&self.dir))?;
        }
        Ok(())
    }

    /// The SQLite database.
    pub fn db_path(&self) -> PathBuf {
        self.dir.join("switchboard.db")
    }

    /// The runtime lock file.
    pub fn lock_path(&self) -> PathBuf {
        self.dir.join("runtime.lock")
    }

    /// The bridge port file.
    pub fn port_path(&self) -> PathBuf {
        self.dir.join("bridge.port")
    }

    /// The bridge token file.
    pub fn token_path(&self) -> PathBuf {
        self.dir.join("bridge.token")
    }

    /// Whether `init` has run here.
    pub fn is_initialized(&self) -> bool {
        self.db_path().exists()
    }

    /// Takes the runtime lock without waiting. `Ok(None)`: another runtime owns the profile.
    pub fn try_lock(&self) -> Result<Option<ProfileLock>, ProfileError> {
        self.ensure_dir()?;
        let path = self.lock_path();
        let mut opts = OpenOptions::new();
        opts.create(true).truncate(false).write(true);
        // Private like every other file of the profile (it names the owning process).
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let file = opts.open(&path).map_err(io(&path))?;
        // Also a lock file an earlier version made with the umask's mode.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(io(&path))?;
        }
        match file.try_lock() {
            Ok(()) => {
                let mut f = &file;
                let _ = f.write_all(format!("{}\n", std::process::id()).as_bytes());
                Ok(Some(ProfileLock { _file: file }))
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(ProfileError::Io { path, source: e }),
        }
    }

    /// The process id the lock's holder wrote into the lock file (for messages; `None` when
    /// unreadable).
    pub fn lock_holder(&self) -> Option<u32> {
        std::fs::read_to_string(self.lock_path()).ok()?.lines().next()?.trim().parse().ok()
    }

    /// Records the bridge's port and token (0600) for other processes.
    pub fn write_bridge_files(&self, port: u16, token: &str) -> Result<(), ProfileError> {
        // The port first: a client that sees the token can read the port (a test that waited
        // for the token alone once read a port file that did not exist yet).
        write_private(&self.port_path(), port.to_string().as_bytes()).map_err(io(&self.port_path()))?;
        write_private(&self.token_path(), token.as_bytes()).map_err(io(&self.token_path()))
    }

    /// Removes the bridge files when the runtime stops.
    pub fn remove_bridge_files(&self) {
        let _ = std::fs::remove_file(self.port_path());
        let _ = std::fs::remove_file(self.token_path());
    }

    /// Reads the running runtime's bridge port and token.
    pub fn read_bridge_files(&self) -> Option<(u16, String)> {
        let port = std::fs::read_to_string(self.port_path()).ok()?.trim().parse().ok()?;
        let token = std::fs::read_to_string(self.token_path()).ok()?.trim().to_owned();
        Some((port, token))
    }
}

/// Writes `data` to `path` atomically with mode 0600 (temp file, fsync, rename).
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut opts = OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    {
        let mut f = opts.open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(unix)]
    fn the_lock_file_is_private_even_when_an_older_version_made_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let profile = Profile { dir: dir.path().join("p") };
        profile.ensure_dir().unwrap();
        std::fs::write(profile.lock_path(), b"").unwrap();
        std::fs::set_permissions(profile.lock_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let _lock = profile.try_lock().unwrap().unwrap();
        let mode = std::fs::metadata(profile.lock_path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn only_one_lock_holder() {
        let dir = tempfile::tempdir().unwrap();
        let p = Profile { dir: dir.path().join("p") };
        let first = p.try_lock().unwrap();
        assert!(first.is_some());
        assert!(p.try_lock().unwrap().is_none());
        drop(first);
        assert!(p.try_lock().unwrap().is_some());
    }
}
