//! Paired timing: a subject and its baseline timed in alternation, round by round, so a change in
//! the machine's load between them cannot pass for a difference between them (criterion times
//! one function after the other; on this shared 2-core machine the same ratio moved by up to
//! 0.47× between two runs minutes apart). Each round times a batch of one side then a batch of
//! the other (the order alternates every round), and the figure is the median of the per-round
//! ratios with its quartiles.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// What [`paired`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Paired {
    /// Median time per call of the subject, over the rounds.
    pub subject: Duration,
    /// Median time per call of the baseline, over the rounds.
    pub baseline: Duration,
    /// Median, first and third quartile of the per-round ratios subject / baseline.
    pub ratio: f64,
    pub ratio_p25: f64,
    pub ratio_p75: f64,
    pub rounds: usize,
}

/// Rounds per pair: `PAIRED_ROUNDS`, default 41.
pub fn rounds() -> usize {
    std::env::var("PAIRED_ROUNDS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(41)
}

fn time(calls: usize, f: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..calls {
        f();
    }
    start.elapsed()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len().saturating_sub(1)) as f64 * q).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// Times `subject` against `baseline` in alternating batches of about 10 ms each, and prints
/// one line under `label`.
pub fn paired(label: &str, mut subject: impl FnMut(), mut baseline: impl FnMut()) -> Paired {
    // Warm both up, then size a batch so the slower side takes about 10 ms.
    let one = time(3, &mut subject).max(time(3, &mut baseline)) / 3;
    let calls = (Duration::from_millis(10).as_nanos() / one.as_nanos().max(1)).clamp(1, 10_000) as usize;
    let rounds = rounds();
    let (mut ratios, mut subjects, mut baselines) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (s, b) = if round % 2 == 0 {
            let s = time(calls, &mut subject);
            (s, time(calls, &mut baseline))
        } else {
            let b = time(calls, &mut baseline);
            (time(calls, &mut subject), b)
        };
        ratios.push(s.as_secs_f64() / b.as_secs_f64());
        subjects.push(s.as_secs_f64() / calls as f64);
        baselines.push(b.as_secs_f64() / calls as f64);
    }
    for v in [&mut ratios, &mut subjects, &mut baselines] {
        v.sort_by(f64::total_cmp);
    }
    let out = Paired {
        subject: Duration::from_secs_f64(quantile(&subjects, 0.5)),
        baseline: Duration::from_secs_f64(quantile(&baselines, 0.5)),
        ratio: quantile(&ratios, 0.5),
        ratio_p25: quantile(&ratios, 0.25),
        ratio_p75: quantile(&ratios, 0.75),
        rounds,
    };
    println!(
        "paired {label}: {:.1} µs vs baseline {:.1} µs per call, ratio {:.3} (quartiles {:.3}–{:.3}, {} rounds of {calls})",
        out.subject.as_secs_f64() * 1e6,
        out.baseline.as_secs_f64() * 1e6,
        out.ratio,
        out.ratio_p25,
        out.ratio_p75,
        out.rounds,
    );
    out
}
