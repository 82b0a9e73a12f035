//! SIGTERM for a module process: the signal only sets a flag (async-signal-safe); a watcher
//! thread then ends the subc connection in order (GOODBYE, flush, half-close), and the serve
//! loop's end becomes the process's exit. broca and broca-mock's module modes share it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Outbound;

static SIGTERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    SIGTERM.store(true, Ordering::SeqCst);
}

/// Installs the handler and starts the watcher; `who` names the process in its log lines.
pub fn close_on_sigterm(outbound: Outbound, who: &'static str) {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t);
    }
    let watcher = std::thread::Builder::new().name("sigterm".into()).spawn(move || loop {
        if SIGTERM.load(Ordering::SeqCst) {
            log::info!("{who}: SIGTERM; closing the subc connection");
            outbound.shutdown();
            return;
        }
        if outbound.is_closed() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    if let Err(e) = watcher {
        log::warn!("{who}: no SIGTERM watcher: {e}");
    }
}
