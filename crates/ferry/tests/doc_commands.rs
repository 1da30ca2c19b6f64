//! Every `cargo run` line in the README, `docs/` and the crates' READMEs
//! names a binary cargo can pick and flags that binary accepts.
//!
//! The README's first command once failed on every fresh clone (`cargo run`
//! could not choose between two binaries) while every test passed: the
//! tests run the built binaries directly. So this test does what a reader
//! does with each line. It resolves the binary as cargo would, from the
//! workspace's manifests (`default-members`, `-p`, `--bin`, `--example`,
//! `default-run`), and runs that binary with the line's own arguments and
//! `--help` appended: clap parses every flag and value before `--help`, so
//! a renamed flag or a bad value fails here, and `--help` stops it before it
//! does any work. `.ci/run` also runs the README's main-job command itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents whose `cargo run` lines a reader copies.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs = vec![root.join("README.md")];
    let mut add_md = |dir: PathBuf| {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .collect();
            found.sort();
            docs.extend(found);
        }
    };
    add_md(root.join("docs"));
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/ exists")
        .filter_map(|e| e.ok().map(|e| e.path().join("README.md")))
        .filter(|p| p.exists())
        .collect();
    crates.sort();
    docs.extend(crates);
    docs
}

/// One `cargo run` command found in a document.
#[derive(Debug)]
struct DocCommand {
    /// `file:line`, for the failure message.
    at: String,
    /// The command as written, continuations joined, comment dropped.
    text: String,
}

/// The `cargo run` commands in `text`: lines that start with one (in a code
/// block, `$ ` allowed), with `\` continuations joined and a trailing
/// `# comment` dropped, and inline code spans that hold one.
fn commands_in(file: &str, text: &str) -> Vec<DocCommand> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let start = i;
        let line = lines[i].trim_start();
        let line = line.strip_prefix("$ ").unwrap_or(line);
        if line.starts_with("cargo run") {
            let mut joined = String::new();
            let mut part = line;
            loop {
                match part.trim_end().strip_suffix('\\') {
                    Some(head) if i + 1 < lines.len() => {
                        joined.push_str(head);
                        joined.push(' ');
                        i += 1;
                        part = lines[i].trim_start();
                    }
                    _ => {
                        joined.push_str(part);
                        break;
                    }
                }
            }
            found.push(DocCommand {
                at: format!("{file}:{}", start + 1),
                text: without_comment(&joined),
            });
        } else {
            for span in lines[i].split('`').skip(1).step_by(2) {
                if span.trim_start().starts_with("cargo run") {
                    found.push(DocCommand {
                        at: format!("{file}:{}", start + 1),
                        text: span.trim().to_string(),
                    });
                }
            }
        }
        i += 1;
    }
    found
}

/// `line` without a shell comment (a word that starts with `#`).
fn without_comment(line: &str) -> String {
    line.split_whitespace()
        .take_while(|w| !w.starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What cargo makes of a `cargo run` line: which package, binary or example,
/// and the arguments after `--`.
#[derive(Debug, Default)]
struct CargoRun {
    package: Option<String>,
    bin: Option<String>,
    example: Option<String>,
    args: Vec<String>,
}

fn parse_cargo_run(text: &str) -> Result<CargoRun, String> {
    if text.contains(['"', '\'', '$', '`', '|', '>', '<', ';', '&']) || text.contains("...") {
        return Err(
            "quotes, variables, pipes and placeholders are beyond this test: write the \
             command as a reader would paste it"
                .into(),
        );
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.get(..2) != Some(&["cargo", "run"][..]) {
        return Err("not a `cargo run` command".into());
    }
    let mut run = CargoRun::default();
    let mut rest = words[2..].iter();
    while let Some(&word) = rest.next() {
        let mut value = |name: &str| {
            rest.next()
                .map(|v| v.to_string())
                .ok_or(format!("cargo's {name} needs a value"))
        };
        match word {
            "--release" | "-q" | "--quiet" => {}
            "-p" | "--package" => run.package = Some(value(word)?),
            "--bin" => run.bin = Some(value(word)?),
            "--example" => run.example = Some(value(word)?),
            "--" => {
                run.args = rest.map(|w| w.to_string()).collect();
                break;
            }
            other => return Err(format!("cargo flag {other:?} is unknown to this test")),
        }
    }
    Ok(run)
}

/// A workspace member's targets, from its manifest and its files.
#[derive(Debug)]
struct Package {
    name: String,
    default_run: Option<String>,
    bins: Vec<String>,
    examples: Vec<String>,
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.parse()
        .unwrap_or_else(|e| panic!("{path:?} is not TOML: {e}"))
}

/// The names in `table[key]`, an array of tables with a `name` each.
fn target_names(table: &toml::Table, key: &str) -> Vec<String> {
    table
        .get(key)
        .and_then(|v| v.as_array())
        .map(|targets| {
            targets
                .iter()
                .filter_map(|t| t.get("name")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The `.rs` files' stems in `dir`.
fn stems(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let p = e.ok()?.path();
                    (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_string))?
                })
                .collect()
        })
        .unwrap_or_default()
}

fn read_package(dir: &Path) -> Package {
    let manifest = read_toml(&dir.join("Cargo.toml"));
    let package = manifest["package"].as_table().expect("[package]");
    let name = package["name"].as_str().expect("package.name").to_string();
    // Cargo's target auto-discovery: src/main.rs is a binary named for the
    // package, src/bin/*.rs and examples/*.rs are named for their files;
    // explicit [[bin]] and [[example]] entries add to them.
    let mut bins = target_names(&manifest, "bin");
    if dir.join("src/main.rs").exists() && !bins.contains(&name) {
        bins.push(name.clone());
    }
    for stem in stems(&dir.join("src/bin")) {
        if !bins.contains(&stem) {
            bins.push(stem);
        }
    }
    let mut examples = target_names(&manifest, "example");
    for stem in stems(&dir.join("examples")) {
        if !examples.contains(&stem) {
            examples.push(stem);
        }
    }
    Package {
        default_run: package
            .get("default-run")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        name,
        bins,
        examples,
    }
}

/// What cargo runs for `run`: a binary's name, or `examples/NAME`. The
/// errors are cargo's own.
fn resolve(run: &CargoRun) -> Result<String, String> {
    let root = root();
    let workspace = read_toml(&root.join("Cargo.toml"));
    let workspace = workspace["workspace"].as_table().expect("[workspace]");
    let dirs = |key: &str| -> Option<Vec<String>> {
        workspace.get(key)?.as_array().map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
    };
    let member_dirs = dirs("members").expect("workspace.members");
    let members: Vec<(&String, Package)> = member_dirs
        .iter()
        .map(|d| (d, read_package(&root.join(d))))
        .collect();
    let selected: Vec<&Package> = match &run.package {
        Some(name) => vec![members
            .iter()
            .map(|(_, p)| p)
            .find(|p| &p.name == name)
            .ok_or(format!("package `{name}` is not a workspace member"))?],
        None => {
            let default = dirs("default-members").unwrap_or_else(|| member_dirs.clone());
            members
                .iter()
                .filter(|(d, _)| default.contains(d))
                .map(|(_, p)| p)
                .collect()
        }
    };
    if let Some(example) = &run.example {
        return if selected.iter().any(|p| p.examples.contains(example)) {
            Ok(format!("examples/{example}"))
        } else {
            Err(format!("no example target named `{example}`"))
        };
    }
    let bins: Vec<&String> = selected.iter().flat_map(|p| &p.bins).collect();
    if let Some(bin) = &run.bin {
        return if bins.contains(&bin) {
            Ok(bin.clone())
        } else {
            Err(format!("no bin target named `{bin}`"))
        };
    }
    if let [only] = selected[..] {
        if let Some(default) = &only.default_run {
            return Ok(default.clone());
        }
    }
    match bins[..] {
        [bin] => Ok(bin.clone()),
        [] => Err("a bin target must be available for `cargo run`".into()),
        _ => Err(format!(
            "`cargo run` could not determine which binary to run; available binaries: {}",
            bins.iter()
                .map(|b| b.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Runs `exe` with `args` and `--help`, killed after a minute so that a
/// binary that ignores `--help` and starts working fails here instead of
/// hanging the suite. Returns a description of what went wrong.
fn check_help(exe: &Path, args: &[String]) -> Result<(), String> {
    let mut child = Command::new(exe)
        .args(args)
        .arg("--help")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {exe:?}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("still running a minute after `--help`: it ignores the flag".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("Usage:") {
        Ok(())
    } else {
        Err(format!(
            "{} with `--help` appended; stdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_documented_cargo_run_line_names_a_binary_and_flags_that_exist() {
    // Cargo puts every binary of the workspace beside ferry's, and examples
    // in examples/ under it; `cargo test --workspace` builds them all.
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ferry"))
        .parent()
        .expect("target directory")
        .to_path_buf();
    let root = root();
    let mut checked = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("document reads");
        let name = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        for cmd in commands_in(&name, &text) {
            let result = parse_cargo_run(&cmd.text)
                .and_then(|run| Ok((resolve(&run)?, run.args)))
                .and_then(|(target, args)| {
                    let exe = bin_dir.join(&target);
                    if !exe.exists() {
                        return Err(format!(
                            "{exe:?} is not built: run the tests with `cargo test --workspace`, \
                             which builds every binary and example"
                        ));
                    }
                    check_help(&exe, &args)
                });
            checked += 1;
            if let Err(e) = result {
                failures.push(format!("{}: `{}`: {e}", cmd.at, cmd.text));
            }
        }
    }
    assert!(
        checked >= 20,
        "found only {checked} cargo run lines: the scan is broken"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} documented commands fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("{checked} documented cargo run commands checked");
}

#[test]
fn the_scan_finds_continued_commented_and_inline_commands() {
    let text = "intro `cargo run -p minivmm -- demo` inline\n\
                ```sh\n\
                $ cargo run --release -- demo --json   # a comment\n\
                cargo run --release -p ferry-engine --example foreign_guest -- --predict \\\n    \
                --data-mib 64\n\
                ```\n";
    let found: Vec<String> = commands_in("t.md", text)
        .into_iter()
        .map(|c| format!("{} {}", c.at, c.text))
        .collect();
    assert_eq!(
        found,
        [
            "t.md:1 cargo run -p minivmm -- demo",
            "t.md:3 cargo run --release -- demo --json",
            "t.md:4 cargo run --release -p ferry-engine --example foreign_guest -- --predict --data-mib 64",
        ]
    );
}

#[test]
fn cargo_runs_ferry_by_default_and_refuses_what_it_cannot_pick() {
    let resolved = |line: &str| parse_cargo_run(line).and_then(|r| resolve(&r));
    assert_eq!(
        resolved("cargo run --release -- demo").as_deref(),
        Ok("ferry")
    );
    assert_eq!(
        resolved("cargo run -p minivmm -- demo").as_deref(),
        Ok("minivmm")
    );
    assert_eq!(
        resolved("cargo run -p ferry-engine --example foreign_guest").as_deref(),
        Ok("examples/foreign_guest")
    );
    // ferry-engine has examples but no binary: cargo refuses, and so does this.
    assert!(resolved("cargo run -p ferry-engine -- x").is_err());
    assert!(resolved("cargo run -p ferry --example nope").is_err());
    assert!(resolved("cargo run -p no-such-crate").is_err());
    assert!(resolved("cargo run --frozen -- demo").is_err());
}
