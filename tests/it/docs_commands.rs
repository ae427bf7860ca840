//! The commands the manual shows (README.md and docs/, fenced `sh` blocks)
//! are the commands the binary has: every `outbox-cdc SUBCOMMAND` exists and
//! takes every `--flag` written beside it, every script named exists and is
//! executable, and the read-only ones (`check`, `status`, `parked`) run
//! against the test servers with the fixture's configuration in place of
//! the documented one.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::relay::Fixture;

/// One command line of a fenced `sh` block, with where it was found.
struct Shown {
    place: String,
    words: Vec<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manual_pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The lines of every ```sh block, continuations joined, comments dropped.
fn shown_commands() -> Vec<Shown> {
    let mut shown = Vec::new();
    for page in manual_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let mut in_sh = false;
        let mut pending = String::new();
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if let Some(lang) = trimmed.strip_prefix("```") {
                in_sh = !in_sh && matches!(lang, "sh" | "bash" | "shell");
                continue;
            }
            if !in_sh {
                continue;
            }
            let code = trimmed.split(" #").next().unwrap_or("").trim();
            if code.starts_with('#') || code.is_empty() {
                continue;
            }
            if let Some(head) = code.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(code);
            let words = pending.split_whitespace().map(str::to_owned).collect();
            shown.push(Shown {
                place: format!("{name}:{}", n + 1),
                words,
            });
            pending.clear();
        }
    }
    shown
}

/// The words after `outbox-cdc` (or `target/release/outbox-cdc`), when the
/// line runs it.
fn connector_args(words: &[String]) -> Option<&[String]> {
    let at = words
        .iter()
        .position(|w| w == "outbox-cdc" || w.ends_with("/outbox-cdc"))?;
    Some(&words[at + 1..])
}

fn help_of(subcommand: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args([subcommand, "--help"])
        .output()
        .expect("run outbox-cdc --help");
    assert!(
        out.status.success(),
        "`outbox-cdc {subcommand} --help` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_documented_command_and_flag_exists() {
    let shown = shown_commands();
    let mut checked = 0;
    for cmd in &shown {
        if let Some(args) = connector_args(&cmd.words) {
            let subcommand = args
                .first()
                .unwrap_or_else(|| panic!("{}: no subcommand", cmd.place));
            let help = help_of(subcommand);
            for word in args.iter().skip(1) {
                let flag = word.trim_start_matches('[').trim_end_matches(']');
                let Some(flag) = flag.strip_prefix("--") else {
                    continue;
                };
                let flag = flag.split('=').next().unwrap();
                assert!(
                    help.contains(&format!("--{flag}")),
                    "{}: `outbox-cdc {subcommand}` has no --{flag}:\n{help}",
                    cmd.place
                );
            }
            checked += 1;
        }
        for word in &cmd.words {
            if (word.starts_with("scripts/") || word.starts_with("bench/")) && word.ends_with(".sh")
            {
                let path = root().join(word);
                let mode = std::fs::metadata(&path)
                    .unwrap_or_else(|e| panic!("{}: {word}: {e}", cmd.place))
                    .permissions();
                assert!(
                    std::os::unix::fs::PermissionsExt::mode(&mode) & 0o111 != 0,
                    "{}: {word} is not executable",
                    cmd.place
                );
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} outbox-cdc commands found in the manual"
    );
}

/// `check`, `status` and `parked` as the README shows them, with the
/// fixture's configuration: they run to an answer (not a usage error, not a
/// crash), and `check` reaches both servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_commands_run_against_the_test_servers() {
    let fx = Fixture::new("docs_cmds").await;
    let config = fx.write_config_file();
    let mut ran: Vec<String> = Vec::new();
    for cmd in shown_commands() {
        let Some(args) = connector_args(&cmd.words) else {
            continue;
        };
        let Some(subcommand) = args.first().map(String::as_str) else {
            continue;
        };
        if !matches!(subcommand, "check" | "status" | "parked")
            || ran.iter().any(|r| r == subcommand)
        {
            continue;
        }
        let mut argv: Vec<String> = Vec::new();
        let mut words = args.iter().skip(1);
        while let Some(word) = words.next() {
            if word == "--config" {
                words.next();
                argv.push("--config".into());
                argv.push(config.display().to_string());
            } else if !word.starts_with('[') {
                argv.push(word.clone());
            }
        }
        let out = run(subcommand, &argv, &config);
        let code = out.status.code();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            matches!(code, Some(0) | Some(1)) && !text.trim().is_empty(),
            "{}: `outbox-cdc {subcommand} {}` ended with {code:?}:\n{text}",
            cmd.place,
            argv.join(" ")
        );
        if subcommand == "check" {
            let lower = text.to_lowercase();
            assert!(
                lower.contains("postgres connection") && lower.contains("kafka "),
                "{}: check reported on neither server:\n{text}",
                cmd.place
            );
        }
        ran.push(subcommand.to_owned());
    }
    ran.sort();
    assert_eq!(ran, ["check", "parked", "status"], "the README shows these");
    fx.cleanup().await;
}

fn run(subcommand: &str, args: &[String], config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .arg(subcommand)
        .args(args)
        .current_dir(config.parent().unwrap())
        .output()
        .expect("run outbox-cdc")
}
