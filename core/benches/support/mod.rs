//! What the receive-path benches share: a profile `bob` whose relay is never reached, with
//! `alice` (a fresh letagents identity) as an accepted contact.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use switchboard_core::bridge::api::Request;
use switchboard_core::engine::{InitOptions, Runtime};
use switchboard_core::identity::DeviceIdentity;
use switchboard_core::identity::keystore::KeystorePreference;
use switchboard_core::profile::{Profile, ProfileLock};
use switchboard_core::protocol::letagents::{self as la, Inner, Kind};
use switchboard_core::util::{OsRng, now_ms};

/// Bob's runtime and alice's identity; the profile's lock and directory live as long as it
/// (fields drop in this order: the runtime first, the directory last).
pub struct Receiver {
    pub bob: Runtime,
    pub alice: DeviceIdentity,
    _lock: ProfileLock,
    pub dir: tempfile::TempDir,
}

/// A new profile `bob` with `alice` (a new identity) added as a contact (no hello sent).
pub fn bob_with_contact_alice(rt: &tokio::runtime::Runtime) -> Receiver {
    bob_with_contact(rt, DeviceIdentity::generate(&mut OsRng))
}

/// A new profile `bob` with `alice` added as a contact (no hello sent).
pub fn bob_with_contact(rt: &tokio::runtime::Runtime, alice: DeviceIdentity) -> Receiver {
    let dir = tempfile::tempdir().unwrap();
    let profile = Profile { dir: dir.path().join("bob") };
    let lock = profile.try_lock().unwrap().unwrap();
    let bob = rt
        .block_on(Runtime::init(
            &profile,
            InitOptions {
                name: "bob".into(),
                // Nothing listens there: the receive path never touches the network.
                relay: "http://127.0.0.1:9".into(),
                relay_cert_sha256: None,
                keystore: KeystorePreference::File,
            },
        ))
        .unwrap();
    rt.block_on(bob.handle(
        Request::ContactAdd {
            address: alice.address().to_string(),
            name: Some("alice".into()),
            allow: None,
            relay: None,
            no_hello: true,
        },
        false,
    ))
    .unwrap();
    Receiver { bob, alice, _lock: lock, dir }
}

impl Receiver {
    /// A fresh envelope from alice to bob: a `send` with 200 characters of text.
    pub fn envelope_from_alice(&self) -> Vec<u8> {
        let bob = self.bob.keys();
        let inner = Inner::new(
            &self.alice.keys(),
            &bob.mailbox_id(),
            now_ms(),
            uuid::Uuid::new_v4(),
            Kind::Send,
            "x".repeat(200).into(),
        );
        la::seal(&self.alice.sig, &bob, &serde_json::to_string(&inner).unwrap(), &mut OsRng).unwrap()
    }
}
