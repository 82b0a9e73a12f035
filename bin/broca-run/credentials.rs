//! Where a `broca-run` turn's provider credential comes from (spec §1b, `catalog-and-vault.md`
//! Part E.2), in order:
//!
//! 1. `--auth-bearer` wins;
//! 2. `--base-url` (or `BROCA_PROVIDER_BASE_URL`) without a bearer stays credential-free (mocks);
//! 3. with a subc connection (`--subc`, else `BROCA_LIVE_SUBC`, else `SUBC_SOCKET`): the model's
//!    provider from the catalog, its credential id's dev-tools handle from the handles file
//!    (`BROCA_DEVTOOLS_HANDLES` or `~/.config/cortexkit/broca/dev-tools-handles.json`), read with
//!    `credential.get {handle}` through the daemon;
//! 4. otherwise none (admission refuses a catalog route that needs one).
//!
//! The secret lives in memory only: it becomes the loop's bearer and is never printed.

use std::path::PathBuf;

use broca::catalog::route::credential_id_for;
use broca::catalog::SharedCatalog;
use broca::subc::consumer::Consumer;
use broca::vault::handles::{self, devtools_handles_path};
use broca::vault::{HandleSource, SubcVault};

use crate::cli::Args;

/// Variables that name a subc connection file when `--subc` does not (in this order).
const SUBC_FILE_VARS: [&str; 2] = ["BROCA_LIVE_SUBC", "SUBC_SOCKET"];

/// The subc connection file this turn uses: `--subc`, else the first variable set.
pub fn subc_file(args: &Args) -> Option<PathBuf> {
    args.subc.clone().or_else(|| {
        SUBC_FILE_VARS.iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()).map(PathBuf::from))
    })
}

/// Whether the provider is mocked: a base URL override without a bearer needs no credential.
pub fn credential_free(args: &Args) -> bool {
    args.auth_bearer.is_none()
        && (args.base_url.is_some() || std::env::var("BROCA_PROVIDER_BASE_URL").is_ok_and(|v| !v.is_empty()))
}

/// Whether this turn's catalog route is given a bearer (the flag's, or a handle read's).
pub fn has_bearer_source(args: &Args, consumer: Option<&Consumer>) -> bool {
    args.auth_bearer.is_some() || (consumer.is_some() && !credential_free(args))
}

/// The bearer for `model` (`provider/model`): the flag's, else a dev-tools handle read through
/// `consumer`; `Ok(None)` when the turn runs credential-free. `Err` says why no credential
/// could be had, naming the file and the credential id (never a secret).
pub fn bearer(
    args: &Args,
    consumer: Option<&Consumer>,
    catalog: &SharedCatalog,
    model: &str,
) -> Result<Option<String>, String> {
    if let Some(bearer) = &args.auth_bearer {
        return Ok(Some(bearer.clone()));
    }
    let Some(consumer) = consumer.filter(|_| !credential_free(args)) else { return Ok(None) };
    let provider = match catalog.read().as_ref() {
        Ok(c) => c.row(model).map(|row| row.provider.clone()),
        Err(_) => None,
    }
    .or_else(|| model.split_once('/').map(|(p, _)| p.to_owned()))
    .ok_or_else(|| format!("cannot tell the provider of model {model:?}"))?;
    let id = credential_id_for(&provider, args.auth_method.unwrap_or_default());
    let Some(path) = devtools_handles_path(|k| std::env::var(k).ok()) else {
        return Err(format!(
            "no dev-tools handle for {id}: set {} or HOME (or pass --auth-bearer)",
            handles::DEVTOOLS_HANDLES_ENV
        ));
    };
    let loaded = handles::load(&path);
    if let Some(warning) = &loaded.warning {
        log::warn!("{warning}");
    }
    let Some(handle) = loaded.handles.get(&id) else {
        return Err(format!("no dev-tools handle for {id} in {} (or pass --auth-bearer)", path.display()));
    };
    let credential = SubcVault::new(consumer.clone())
        .get_handle(handle)
        .map_err(|e| format!("the vault refused the dev-tools handle for {id} ({}): {e}", e.code()))?;
    log::info!(
        "credential {id} read from the vault by its dev-tools handle (record_version {})",
        credential.record_version
    );
    Ok(Some(credential.secret.expose().to_owned()))
}
