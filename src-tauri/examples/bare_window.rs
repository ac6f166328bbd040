//! The baseline the app's start-up and memory figures are compared with (src-tauri/tests/window.rs,
//! BENCHMARKS.md): the same Tauri build (same crate features, tauri.conf.json window, CSP and
//! capability) showing a trivial page, with no runtime, bridge, tray or plugins. The page reports
//! its first paint the way the app's UI does (two animation frames, then the `app_painted`
//! command), and the process prints the same line the app prints.
//!
//! Run: `cargo build --workspace --examples`, then `<target>/debug/examples/bare_window`.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tauri::Manager;
use tauri::utils::assets::{AssetKey, AssetsIter, CspHash};

const INDEX: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Switchboard</title>\
<script type=\"module\" src=\"/paint.js\"></script></head>\
<body><main><h1>Bare window</h1><p>A trivial page: the baseline for the app's figures.</p></main></body></html>";

const PAINT: &str = "requestAnimationFrame(() => requestAnimationFrame(() => \
window.__TAURI_INTERNALS__.invoke('app_painted').catch(() => {})));";

/// Serves the trivial page instead of the app's ui/dist.
struct BarePage;

impl<R: tauri::Runtime> tauri::Assets<R> for BarePage {
    fn get(&self, key: &AssetKey) -> Option<Cow<'_, [u8]>> {
        match key.as_ref() {
            "/index.html" | "/" => Some(Cow::Borrowed(INDEX.as_bytes())),
            "/paint.js" => Some(Cow::Borrowed(PAINT.as_bytes())),
            _ => None,
        }
    }

    fn iter(&self) -> Box<AssetsIter<'_>> {
        Box::new(
            [("/index.html", INDEX), ("/paint.js", PAINT)]
                .into_iter()
                .map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v.as_bytes()))),
        )
    }

    fn csp_hashes(&self, _html_path: &AssetKey) -> Box<dyn Iterator<Item = CspHash<'_>> + '_> {
        Box::new(std::iter::empty())
    }
}

struct Started(Instant, AtomicBool);

/// Same name and output as the app's command, so the same capability grants it and the same
/// harness reads it.
#[tauri::command]
fn app_painted(state: tauri::State<'_, Started>) -> u128 {
    let ms = state.0.elapsed().as_millis();
    if !state.1.swap(true, Ordering::SeqCst) {
        println!("switchboard-app: first paint {ms} ms after start");
    }
    ms
}

fn main() -> std::process::ExitCode {
    let started = Instant::now();
    let mut context = tauri::generate_context!();
    context.set_assets(Box::new(BarePage));
    let result = tauri::Builder::default()
        .manage(Started(started, AtomicBool::new(false)))
        // tauri.conf.json creates the window hidden; the app shows it at setup, and so does this.
        .setup(|app| {
            if let Some(w) = app.get_webview_window("main") {
                w.show()?;
            }
            Ok(())
        })
        .invoke_handler(tauri::generate_handler![app_painted])
        .run(context);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bare_window: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
