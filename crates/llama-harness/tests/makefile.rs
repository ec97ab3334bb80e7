//! Every script the Makefile runs exists and is executable (`make fixtures` once named a
//! script that did not).

use std::os::unix::fs::PermissionsExt;

use llama_harness::workspace_root;

#[test]
fn every_script_the_makefile_names_exists_and_is_executable() {
    let root = workspace_root();
    let makefile = std::fs::read_to_string(root.join("Makefile")).expect("read Makefile");
    let scripts: Vec<&str> = makefile
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | ','))
        .filter(|w| w.starts_with("scripts/"))
        .collect();
    assert!(scripts.len() >= 5, "found {scripts:?}");
    for s in scripts {
        let meta = std::fs::metadata(root.join(s)).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(
            meta.permissions().mode() & 0o111 != 0,
            "{s} is not executable"
        );
    }
}
