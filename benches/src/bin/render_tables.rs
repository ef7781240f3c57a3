//! Writes the READMEs' benchmark tables from `benches/results/*.json`.
//!
//! ```text
//! cargo run -p tailguard-benches --bin render_tables            # rewrite the tables
//! cargo run -p tailguard-benches --bin render_tables -- --check # exit 1 if one is stale
//! ```
//!
//! Each table goes between its `<!-- tables:NAME -->` and `<!-- /tables:NAME -->` markers in
//! `benches/README.md` or the root `README.md`; nothing outside the markers is touched. The
//! test `committed_tables_match_their_json` runs the same comparison as `--check`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use tailguard_benches::tables::{Error, between, render_all, splice};

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    match run(check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("render_tables: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Renders every table; writes the READMEs, or with `check` only compares. `Ok(false)`: a
/// table differs (check mode).
fn run(check: bool) -> Result<bool, Error> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = BTreeMap::new();
    let mut same = true;
    for table in render_all(&dir.join("results"))? {
        let path = table.doc.path(dir);
        let text = match docs.remove(&path) {
            Some(t) => t,
            None => {
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?
            }
        };
        if between(&text, table.name) != Some(table.body.as_str()) {
            same = false;
            println!(
                "{}: table {} {}",
                path.display(),
                table.name,
                if check {
                    "differs from its JSON"
                } else {
                    "rewritten"
                }
            );
        }
        let text = splice(&text, table.name, &table.body)?;
        docs.insert(path, text);
    }
    if !check {
        for (path, text) in docs {
            std::fs::write(&path, text)?;
        }
        return Ok(true);
    }
    Ok(same)
}
