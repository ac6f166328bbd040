//! A PostgreSQL restart under two relay-lite stores (two instances, in this process): every
//! parked waiter is woken to re-read once the listener is back, the writer replaces its dead
//! connection without failing the next write, and wake-ups cross instances again.
//!
//! Its own test binary: it restarts the process's cluster, which no other test may share.
//! Needs PostgreSQL (see `pg_common`): skipped with a reason without it, failed under
//! `SWITCHBOARD_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod pg_common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use relay_lite::hub::Hub;
use relay_lite::store::{DepositOutcome, LoginOutcome, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_postgres_restart_waiters_re_read_and_both_instances_carry_on() {
    let Some(cluster) = pg_common::cluster() else { return };
    let url = cluster.fresh_database().await;
    let hub_c = Arc::new(Hub::default());
    let a = Store::open_postgres(&url, Arc::new(Hub::default())).await.unwrap();
    let c = Store::open_postgres(&url, hub_c.clone()).await.unwrap();
    assert_eq!(a.login("alice", "drop", 1, 1).await.unwrap(), LoginOutcome::Created);
    let mut parked = hub_c.subscribe("alice");

    cluster.stop();
    cluster.restart();

    // Whatever was committed while C's listener was away, C's waiters re-read.
    tokio::time::timeout(Duration::from_secs(20), parked.changed())
        .await
        .expect("no re-read after the restart")
        .unwrap();
    parked.borrow_and_update();

    // The first write after the restart succeeds (the writer opens a new connection), and C
    // hears about it again.
    let stored = a.deposit("alice", "drop", Bytes::from_static(b"LA1 after"), 10, 2).await.unwrap();
    assert_eq!(stored, DepositOutcome::Stored { seq: 1 });
    tokio::time::timeout(Duration::from_secs(10), parked.changed())
        .await
        .expect("no wake-up after the restart")
        .unwrap();
    assert_eq!(*parked.borrow_and_update(), 1);
    assert_eq!(c.waiting("alice", 0, 10).await.unwrap().len(), 1);
    a.close().await;
    c.close().await;
}
