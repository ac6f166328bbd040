//! A burst of letagents envelopes received and committed: one transaction per envelope (the
//! path a lone envelope takes, `Runtime::receive_letagents`) against the burst path
//! (`Runtime::receive_letagents_burst`: opened first, then one transaction per 256), the same
//! envelopes' kind and size, same profile, same run, alternating rounds (ABBA). Prints the time
//! per envelope of each and the ratio. `BURST_N` sets the burst size (default 1000),
//! `BURST_ROUNDS` the rounds (default 2, i.e. A B B A).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let n = env_usize("BURST_N", 1000);
    let rounds = env_usize("BURST_ROUNDS", 2);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let receiver = support::bob_with_contact_alice(&rt);
    let bob = &receiver.bob;
    let burst = || -> Vec<Vec<u8>> { (0..n).map(|_| receiver.envelope_from_alice()).collect() };

    let mut one_each = Vec::new();
    let mut batched = Vec::new();
    for round in 0..rounds * 2 {
        let envelopes = burst();
        let txs = bob.letagents_receive_transactions();
        // A B B A: one transaction each first on even rounds of the pair, burst first on odd.
        let burst_now = (round % 4 == 1) || (round % 4 == 2);
        let started = Instant::now();
        if burst_now {
            let shown = rt.block_on(bob.receive_letagents_burst(&envelopes)).unwrap();
            assert!(shown.iter().all(|s| *s));
        } else {
            for env in &envelopes {
                assert!(rt.block_on(bob.receive_letagents(env)).unwrap());
            }
        }
        let per = started.elapsed() / u32::try_from(n).unwrap();
        let txs = bob.letagents_receive_transactions() - txs;
        println!(
            "round {round}: {} {per:?} per envelope, {txs} transactions",
            if burst_now { "burst" } else { "one each" }
        );
        if burst_now { batched.push(per) } else { one_each.push(per) }
    }
    let mean = |v: &[Duration]| v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap();
    let (a, b) = (mean(&one_each), mean(&batched));
    println!(
        "receive_burst n={n}: one transaction each {a:?}/envelope, burst {b:?}/envelope, ratio {:.2}x",
        b.as_secs_f64() / a.as_secs_f64()
    );
}
