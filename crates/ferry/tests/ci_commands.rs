//! CI runs what a user runs: `.ci/run` holds the README's test command
//! exactly, and installs nothing itself, so a fresh machine that follows
//! the README gets everything CI gets (the set-up is the command's own
//! first step, `scripts/setup.sh`).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The README's test command: the first line of the first code block after
/// "Run every test".
fn readme_test_command(readme: &str) -> Option<String> {
    let after = &readme[readme.find("Run every test")?..];
    let block = &after[after.find("```")?..];
    block.lines().nth(1).map(|l| l.trim().to_string())
}

/// The command `.ci/run` runs: its one line starting with the README
/// command's first word pair, less the `|| { ... }` that reports failure.
fn ci_test_command(ci: &str, first: &str) -> Option<String> {
    let line = ci
        .lines()
        .map(str::trim)
        .find(|l| !l.starts_with('#') && l.starts_with(first))?;
    Some(line.split(" || {").next()?.trim().to_string())
}

#[test]
fn ci_runs_the_readmes_test_command_exactly() {
    let readme = read("README.md");
    let cmd =
        readme_test_command(&readme).expect("README has a test command under 'Run every test'");
    assert!(
        cmd.starts_with("bash scripts/setup.sh && "),
        "the README's test command must begin with its set-up: {cmd}"
    );
    let first: String = cmd.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    let ci = read(".ci/run");
    let ran = ci_test_command(&ci, &first).expect(".ci/run runs the README's test command");
    assert_eq!(ran, cmd, ".ci/run and the README's test command differ");
}

#[test]
fn ci_installs_nothing_itself() {
    let ci = read(".ci/run");
    for installer in ["apt-get", "apt ", "pip ", "cargo install", "rustup", "dpkg"] {
        let found = ci
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .any(|l| l.contains(installer));
        assert!(
            !found,
            ".ci/run runs `{installer}`: installs belong in scripts/setup.sh, which the README's test command runs"
        );
    }
}

#[test]
fn the_check_reads_a_changed_command_as_different() {
    // The comparison itself can fail: a README whose command gained a step
    // no longer matches the same `.ci/run`.
    let readme =
        "Run every test:\n\n```sh\nbash scripts/setup.sh && cargo test --workspace && true\n```\n";
    let ci = "bash scripts/setup.sh && cargo test --workspace || { exit 1; }\n";
    let cmd = readme_test_command(readme).unwrap();
    assert_ne!(ci_test_command(ci, "bash scripts/setup.sh").unwrap(), cmd);
}
