//! The move ops (#44): the archive decoder and `move.export`/`adopt`/`locate`'s params.
//!
//! - `moves.archive`: a sealed archive of a real session's WAL is mutated as bytes (never
//!   adopted: the seal fails), and its body mutated then sealed again under the host's key (so
//!   the parser past the seal sees hostile headers and WALs). Nothing panics; a decoded archive
//!   names its own triple's address and holds exactly the WAL bytes its header says.
//! - `moves.params`: the ops' params mutated with the members they read, served to the
//!   key-holder on a session with history. Every refusal is typed (`invalid_params` names its
//!   member); a refused op writes nothing; no file appears outside the state root's exchange
//!   directory, and nothing in it but archives broca named.

use broca::moves::{self, archive, key::MoveKey};
use broca::ops::Route;
use broca::owner::Caller;
use serde_json::json;

use crate::fuzz;
use crate::inproc::key;
use crate::ops::{check_refusal, rig_with_history};

#[test]
fn fuzz_moves_archive() {
    let (rig, _, _) = rig_with_history();
    let shared = rig.ops.registry.shared();
    let wal = std::fs::read(shared.root.wal_path(&key())).unwrap();
    let seal = MoveKey::load_or_create(shared.root.path()).unwrap();
    let k = key();
    let header = archive::Header {
        addr: k.addr(),
        project_root: k.project_root.clone(),
        harness: k.harness.clone(),
        session: k.session.clone(),
        incarnation: "00000000-0000-4000-8000-000000000000".into(),
        epoch: 1,
        tree: "wal".into(),
        wal_bytes: wal.len() as u64,
        wal_sha256: archive::sha256_hex(&wal),
        exported_at_ms: 1,
        source_machine: None,
    };
    let sealed = archive::encode(&header, &wal, &seal);
    assert!(archive::decode(&sealed, &seal).is_ok());
    fuzz("moves.archive", 300, |g| {
        let mut bytes = sealed.clone();
        g.mutate_bytes(&mut bytes, &wal);
        let _ = archive::peek_header(&bytes);
        if bytes != sealed {
            assert!(archive::decode(&bytes, &seal).is_err(), "a mutated archive verified");
        }
        // The body mutated, then sealed again: the parser past the seal meets it.
        let body_end = sealed.len() - "\nhmac-sha256 \n".len() - 64;
        let mut body = sealed[..body_end].to_vec();
        g.mutate_bytes(&mut body, &wal);
        let mut resealed = body.clone();
        resealed.extend_from_slice(format!("\nhmac-sha256 {}\n", seal.seal(&body)).as_bytes());
        if let Ok((h, w)) = archive::decode(&resealed, &seal) {
            assert_eq!(h.key().addr(), h.addr, "a decoded header names its own triple");
            assert_eq!(w.len() as u64, h.wal_bytes);
            assert_eq!(archive::sha256_hex(&w), h.wal_sha256);
        }
    });
}

#[test]
fn fuzz_moves_params() {
    let (rig, _, _) = rig_with_history();
    let shared = rig.ops.registry.shared();
    let exchange = moves::exchange::of(&shared.root).unwrap();
    let ops = [
        (
            moves::ADOPT,
            vec![json!({"archive": "x.archive"}), json!({"archive": "a.in-1.archive"})],
            &["archive", "from", "to"][..],
        ),
        (moves::EXPORT, vec![json!({"to": "/tmp/x"}), json!({"x": 1})], &["to", "from", "archive"][..]),
        (moves::LOCATE, vec![json!({}), json!({"x": 1})], &["to", "from", "archive"][..]),
    ];
    let names = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map_or_else(|_| Vec::new(), |d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
    };
    // The path the params name, when nothing is there before: still nothing there after.
    let named_path = std::path::Path::new("/tmp/x");
    let watch_named_path = !named_path.exists();
    fuzz("moves.params", 300, |g| {
        let (method, valid, members) = g.pick(&ops);
        let mut params = g.pick(valid).clone();
        if g.chance(4) {
            g.mutate_json_typed(&mut params);
        } else {
            g.mutate_json(&mut params, members);
        }
        // A valid export would move the session away: only its refusals are fuzzed here.
        if *method == moves::EXPORT && params.as_object().is_some_and(serde_json::Map::is_empty) {
            return;
        }
        let before = rig.footprint(&key());
        let route = Route { key: key(), scoped: false, caller: Caller::direct() };
        match moves::serve(&rig.ops, &route, method, &params) {
            Err(r) => {
                check_refusal(&r);
                if let Some(diff) = before.diff(&rig.footprint(&key())) {
                    panic!("{method} {params} refused ({}) and wrote: {diff}", r.code);
                }
            }
            Ok(answer) => assert!(answer.is_object(), "{method} answered {answer}"),
        }
        for name in names(&exchange) {
            assert!(
                moves::exchange::check_name(&name).is_ok() || name.starts_with('.'),
                "{name} in the exchange directory"
            );
        }
    });
    if watch_named_path {
        assert!(!named_path.exists(), "a move op wrote the path its params named");
    }
}
