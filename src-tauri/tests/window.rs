//! The real app under Xvfb: its window appears (found by X11 window name and checked mapped with
//! xwininfo), the UI paints (the app prints its first-paint line), a screenshot of the screen is
//! saved under the build output, and the app's start-up time and idle memory are measured against
//! a same-run baseline: a bare Tauri window on a trivial page (examples/bare_window.rs), launched
//! and measured the same way, so BENCHMARKS.md can give the app as ratios of it.
//! Needs xvfb-run, dbus-run-session, xdotool, xwininfo and ImageMagick (scripts/install-deps.sh),
//! and the example built (`cargo build --workspace --examples`; a plain `cargo test` builds it).
//! `SWITCHBOARD_APP_BENCH_ROUNDS=N` (default 1) alternates N baseline and N app launches;
//! `SWITCHBOARD_APP_BIN` and `SWITCHBOARD_BARE_WINDOW_BIN` measure other builds of the two (e.g.
//! release builds) instead of this test's debug ones.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use std::time::Duration;

use support::{Display, Figures};

const IDLE: Duration = Duration::from_secs(5);

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Medians over the runs: spawn to first paint (ms), tree RSS, own RSS, tree PSS (KiB).
fn summary(name: &str, runs: &[Figures]) -> (u128, u64, u64, u64) {
    let med = |f: &dyn Fn(&Figures) -> u128| support::median(runs.iter().map(f).collect());
    let each: Vec<String> = runs
        .iter()
        .map(|f| {
            format!(
                "{} ms / RSS {:.0} MiB / PSS {:.0} MiB ({} processes)",
                f.spawn_to_paint_ms,
                mib(f.idle_rss_kib),
                mib(f.idle_pss_kib),
                f.processes
            )
        })
        .collect();
    println!("{name}: spawn to first paint, idle memory of the process tree: {}", each.join("; "));
    (
        med(&|f| f.spawn_to_paint_ms),
        med(&|f| u128::from(f.idle_rss_kib)) as u64,
        med(&|f| u128::from(f.own_rss_kib)) as u64,
        med(&|f| u128::from(f.idle_pss_kib)) as u64,
    )
}

#[test]
fn the_app_window_appears_under_xvfb_and_is_screenshotted() {
    support::require_tools(&["xvfb-run", "dbus-run-session", "xdotool", "xwininfo", "import", "identify"]);
    let bare = std::env::var_os("SWITCHBOARD_BARE_WINDOW_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| support::example_bin("bare_window"));
    let app_bin = std::env::var_os("SWITCHBOARD_APP_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_switchboard-app").into());
    let rounds: usize = std::env::var("SWITCHBOARD_APP_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(1);
    let home = tempfile::tempdir().unwrap();
    // An initialised profile, so the window shows the app rather than the first-run screen.
    let profile = support::initialised_profile(home.path());

    let out = support::out_dir("");
    let display = Display::start();
    let app = || {
        let mut app = display.command(&app_bin);
        app.arg("--home").arg(&profile.dir).env("SWITCHBOARD_KEYSTORE", "file");
        app
    };
    let base_shot = out.join("bare-window.png");
    let app_shot = out.join("app.png");
    // One unmeasured launch of each first (the first WebKit start on a machine reads its libraries
    // from disk), then rounds in alternating order, so neither side always goes first.
    support::measure(&display, display.command(&bare), "Switchboard", &base_shot, Duration::ZERO);
    support::measure(&display, app(), "Switchboard", &app_shot, Duration::ZERO);
    let (mut base_runs, mut app_runs) = (Vec::new(), Vec::new());
    for round in 0..rounds.max(1) {
        if round % 2 == 1 {
            app_runs.push(support::measure(&display, app(), "Switchboard", &app_shot, IDLE));
        }
        base_runs.push(support::measure(&display, display.command(&bare), "Switchboard", &base_shot, IDLE));
        if round % 2 == 0 {
            app_runs.push(support::measure(&display, app(), "Switchboard", &app_shot, IDLE));
        }
    }
    drop(display);

    let last = app_runs.last().unwrap();
    let info = &last.xwininfo;
    assert!(info.contains("Map State: IsViewable"), "{info}");
    let width: u32 = info.lines().find_map(|l| l.trim().strip_prefix("Width: ")).unwrap().parse().unwrap();
    assert!(width >= 480, "{info}");
    let shot = out.join("app.png");
    let colours = support::colours(&shot);
    assert!(colours > 50, "the screenshot looks blank ({colours} colours)");
    assert!(support::colours(&out.join("bare-window.png")) > 2, "the baseline's screenshot looks blank");
    assert!(last.processes >= 2, "the app's WebKit processes were not found under it: {last:?}");

    let (base_paint, base_rss, base_own, base_pss) = summary("bare window", &base_runs);
    let (app_paint, app_rss, app_own, app_pss) = summary("app", &app_runs);
    let ratio = |a: u64, b: u64| a as f64 / b.max(1) as f64;
    let paint_ratio = ratio(app_paint as u64, base_paint as u64);
    // Each round's app launch against the baseline launch next to it: steadier than the ratio of
    // medians when other work shares the machine.
    let mut paired: Vec<f64> = app_runs
        .iter()
        .zip(&base_runs)
        .map(|(a, b)| ratio(a.spawn_to_paint_ms as u64, b.spawn_to_paint_ms as u64))
        .collect();
    paired.sort_by(f64::total_cmp);
    let paired_paint = paired.get(paired.len().saturating_sub(1) / 2).copied().unwrap_or(0.0);
    let (rss_ratio, pss_ratio) = (ratio(app_rss, base_rss), ratio(app_pss, base_pss));
    println!(
        "medians of {rounds} round(s), app vs bare window: spawn to first paint {app_paint} vs {base_paint} ms \
         ({paint_ratio:.2}x; median of per-round ratios {paired_paint:.2}x); idle RSS of the tree {:.0} vs {:.0} MiB ({rss_ratio:.2}x); idle PSS of the tree \
         {:.0} vs {:.0} MiB ({pss_ratio:.2}x); own process RSS {:.0} vs {:.0} MiB; app's own line: {}; \
         screenshots {}",
        mib(app_rss),
        mib(base_rss),
        mib(app_pss),
        mib(base_pss),
        mib(app_own),
        mib(base_own),
        last.paint_line,
        out.display()
    );
    let figures = format!(
        "{}\napp {}\nbare {}\nrounds {rounds}\napp_spawn_to_paint_ms {app_paint}\nbare_spawn_to_paint_ms {base_paint}\n\
         paint_ratio {paint_ratio:.2}\npaint_ratio_paired_median {paired_paint:.2}\napp_idle_rss_kib {app_rss}\nbare_idle_rss_kib {base_rss}\nrss_ratio {rss_ratio:.2}\n\
         app_idle_pss_kib {app_pss}\nbare_idle_pss_kib {base_pss}\npss_ratio {pss_ratio:.2}\n\
         app_own_rss_kib {app_own}\nbare_own_rss_kib {base_own}\n",
        last.paint_line,
        app_bin.display(),
        bare.display()
    );
    support::write(&out.join("app-figures.txt"), &figures);
    assert!(app_rss > 0 && base_rss > 0 && app_pss > 0 && base_pss > 0);
}
