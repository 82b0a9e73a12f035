//! broca-mock as a library: the scripted model-provider server ([`mock`]) the tests and
//! benches run in-process, and the subc modules the binary serves (tool providers, the vault,
//! the fusiform catalog, a relay, a federation stand-in). The binary (`main.rs`) is their
//! command line.

pub mod fed;
pub mod fusiform;
pub mod mock;
pub mod relay;
pub mod tools;
pub mod vault;

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
