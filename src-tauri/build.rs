//! Generates the Tauri context and the app's command permissions (each command must be granted
//! by a capability: least privilege).

fn main() {
    let attrs = tauri_build::Attributes::new().app_manifest(tauri_build::AppManifest::new().commands(&[
        "profile_initialized",
        "profile_init",
        "runtime_request",
        "settings_get",
        "settings_set",
        "mute_get",
        "mute_set",
        "relay_hosted",
        "app_painted",
        "app_unread",
    ]));
    if let Err(e) = tauri_build::try_build(attrs) {
        panic!("tauri build step failed: {e}");
    }
}
