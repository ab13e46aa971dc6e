//! Replays every kept fuzz input (`fuzz/corpus/TARGET/*`) through its
//! target: the corpus is a regression suite that runs on stable in
//! `cargo test --workspace`.

use std::path::Path;

#[test]
fn every_kept_input_runs_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut ran = 0;
    for (name, target) in vigil_fuzz::TARGETS {
        let dir = root.join(name);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("corpus for {name} at {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("corpus entry").path();
            let data = std::fs::read(&path).expect("read corpus file");
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name}: {} panicked", path.display());
            ran += 1;
        }
    }
    // One input per target at least: an empty corpus proves nothing.
    assert!(
        ran >= vigil_fuzz::TARGETS.len(),
        "only {ran} corpus inputs ran"
    );
}
