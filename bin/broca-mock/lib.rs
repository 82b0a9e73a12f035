//! broca-mock as a library: the scripted model-provider server ([`mock`]) the tests and
//! benches run in-process, and the subc modules the binary serves (tool providers, the vault,
//! the fusiform catalog, a relay, a federation stand-in). The binary (`main.rs`) is their
//! command line.
//!
//! Each role is a package of its own under `mock/` (issue #45); this library only re-exports
//! them under the names the tests have always used, and finds the binary ([`exe`]).

/// The federation stand-in (`mock/fed`, package `broca-mock-fed`).
pub use broca_mock_fed as fed;
/// The model providers (`mock/model`, package `broca-mock-model`; its wires, scripts and
/// prompt-cache model are `mock/wire`, package `broca-mock-wire`, re-exported there).
pub use broca_mock_model as mock;
/// The vault, the catalog and the relay (`mock/modules`, package `broca-mock-modules`).
pub use broca_mock_modules::{fusiform, relay, vault};
/// The tool provider (`mock/tools`, package `broca-mock-tools`).
pub use broca_mock_tools as tools;

use std::path::PathBuf;

/// The `broca-mock` binary built beside the running test or example (`target/<profile>/`):
/// a test of another package cannot name it with `CARGO_BIN_EXE_`, and `cargo test` builds
/// only this library for them, so `make test` builds the binary first (`make mock-bin`).
/// Panics, naming the build command, when it is missing.
pub fn exe() -> PathBuf {
    let here = std::env::current_exe().expect("the running executable's path");
    let mut dir = here.parent().map(PathBuf::from).unwrap_or_default();
    // Tests run from `target/<profile>/deps`, examples from `target/<profile>/examples`.
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    let exe = dir.join("broca-mock");
    assert!(exe.is_file(), "{} is missing: build it with `cargo build -p broca-mock`", exe.display());
    exe.canonicalize().unwrap_or(exe)
}
