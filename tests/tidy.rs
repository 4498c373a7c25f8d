//! Tidy: the project's own rules over the source tree, in one place (STYLE.md habit 10).
//!
//! | rule | where it may happen |
//! | --- | --- |
//! | SQL: `rusqlite` in code, or a string literal that reads as a SQL statement | `src/store/` only |
//! | spawning a process: `Command::new`, `process::Command`, `fork`, `exec*` | `src/sandbox/` only |
//! | comparing secret-derived bytes | `src/sources/verify.rs`, through its one `ct_eq` |
//! | a structured log field | only the names of `observe::logging::LOG_FIELDS` (spec 11.3) |
//! | saying a test was skipped | `tests/support/skip.rs` only (`skip_or_fail`) |
//! | a config key the validator accepts (`src/config/raw.rs`) | a row of `docs/configuration.md`, which is what `hookspool generate reference` prints |
//! | a `crate::<module>` path in a module's non-test code | only a module on a lower floor of [`FLOORS`] |
//!
//! Every rule is a detector over one file's text plus a test that plants a violation and
//! sees it caught, so a detector that silently stops matching fails here. The detectors read
//! code with comments and string contents blanked (a small lexer below), and string literals
//! separately, so prose never trips a code rule and code never trips a text rule.
//!
//! Must not: link the crate (it reads files as text; the one rule that needs the crate's
//! output, the generated reference, runs the built binary), or exempt a file except a
//! rule's own home; this file is not scanned, because it holds the planted violations.

use std::path::{Path, PathBuf};

/// The crate root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file below `dir`, as (path relative to the crate root, text), sorted.
fn rust_files(dir: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root().join(dir)];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root())
                    .expect("below the root")
                    .to_string_lossy()
                    .into_owned();
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((rel, text));
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------- the lexer

/// A file split for the detectors: `code` is the text with comments and the contents of
/// string and char literals replaced by spaces (newlines kept, so offsets and line numbers
/// hold; the quotes stay, so a literal is still visible as `"  "`), and `strings` holds each
/// string literal's content with its line.
struct Lexed {
    code: String,
    strings: Vec<(usize, String)>,
}

fn blank(out: &mut String, s: &str) {
    out.extend(s.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn lex(text: &str) -> Lexed {
    let chars: Vec<char> = text.chars().collect();
    let mut code = String::with_capacity(text.len());
    let mut strings = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let count_lines = |s: &[char]| s.iter().filter(|c| **c == '\n').count();
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_ident = i > 0 && is_ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            let end = chars[i..]
                .iter()
                .position(|c| *c == '\n')
                .map_or(chars.len(), |p| i + p);
            blank(&mut code, &chars[i..end].iter().collect::<String>());
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (0usize, i);
            while j < chars.len() {
                if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            let s: String = chars[i..j].iter().collect();
            line += count_lines(&chars[i..j]);
            blank(&mut code, &s);
            i = j;
        } else if c == 'r' && !prev_ident && matches!(next, Some('"') | Some('#')) {
            // A raw string r"..." / r#"..."#, if the hashes lead to a quote.
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                code.push(c);
                i += 1;
                continue;
            }
            let start = i + 2 + hashes;
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let mut j = start;
            while j < chars.len() && chars[j..].iter().take(closing.len()).ne(closing.iter()) {
                j += 1;
            }
            let content: String = chars[start..j.min(chars.len())].iter().collect();
            strings.push((line, content.clone()));
            line += count_lines(&chars[i..j.min(chars.len())]);
            code.push('r');
            code.extend(std::iter::repeat_n('#', hashes));
            code.push('"');
            blank(&mut code, &content);
            code.push('"');
            code.extend(std::iter::repeat_n('#', hashes));
            i = j + closing.len();
        } else if c == '"' {
            let mut j = i + 1;
            let mut content = String::new();
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\\' && j + 1 < chars.len() {
                    content.push(chars[j]);
                    j += 1;
                }
                content.push(chars[j]);
                j += 1;
            }
            strings.push((line, content.clone()));
            line += content.matches('\n').count();
            code.push('"');
            blank(&mut code, &content);
            code.push('"');
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '"', '\u{1F600}') or a lifetime ('a).
            let end = if next == Some('\\') {
                chars[i + 2..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map(|p| i + 2 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    code.push('\'');
                    blank(&mut code, &chars[i + 1..end].iter().collect::<String>());
                    code.push('\'');
                    i = end + 1;
                }
                None => {
                    code.push(c);
                    i += 1;
                }
            }
        } else {
            if c == '\n' {
                line += 1;
            }
            code.push(c);
            i += 1;
        }
    }
    Lexed { code, strings }
}

/// 1-based line of a byte offset in `code`.
fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

/// Offsets where `word` stands as a whole identifier path piece in `code`.
fn find_word(code: &str, word: &str) -> Vec<usize> {
    code.match_indices(word)
        .filter(|(at, _)| {
            let before = code[..*at].chars().next_back();
            let after = code[at + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .map(|(at, _)| at)
        .collect()
}

// ---------------------------------------------------------------- rule: SQL only in store

const STORE_DIR: &str = "src/store/";

/// Uppercase SQL keywords that open a statement, each with the keywords one of which must
/// follow it (empty: the keyword alone is a statement).
const SQL_SHAPES: &[(&str, &[&str])] = &[
    ("SELECT", &["FROM"]),
    ("INSERT", &["INTO", "OR"]),
    ("REPLACE", &["INTO"]),
    ("UPDATE", &["SET"]),
    ("DELETE", &["FROM"]),
    (
        "CREATE",
        &["TABLE", "INDEX", "TRIGGER", "VIEW", "UNIQUE", "TEMP"],
    ),
    ("DROP", &["TABLE", "INDEX", "TRIGGER", "VIEW"]),
    ("ALTER", &["TABLE"]),
    (
        "BEGIN",
        &["IMMEDIATE", "EXCLUSIVE", "DEFERRED", "TRANSACTION"],
    ),
    ("ROLLBACK", &["TO", "TRANSACTION"]),
    ("RELEASE", &["SAVEPOINT"]),
    ("VACUUM", &["INTO"]),
];
/// Keywords whose statement is the keyword and one name (`PRAGMA user_version`,
/// `SAVEPOINT req_1`), optionally followed by `=`, `(` or `;`.
const SQL_NAMED: &[&str] = &["PRAGMA", "SAVEPOINT"];
/// Literals that are a statement by themselves.
const SQL_ALONE: &[&str] = &["COMMIT", "ROLLBACK", "BEGIN", "END", "VACUUM"];

/// True when a string literal reads as SQL: an opening keyword (in capitals, as the crate
/// writes SQL) followed, within the literal, by one of its companions. Prose in capitals
/// rarely has both; prose in lower case never matches.
fn reads_as_sql(literal: &str) -> bool {
    let words: Vec<&str> = literal
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect();
    // A lone keyword is SQL only when it is the whole literal ("COMMIT", "BEGIN;"), not a
    // fragment of other text such as a PEM armour line ("-----BEGIN").
    if words.len() == 1
        && SQL_ALONE.contains(&words[0])
        && literal.trim().trim_end_matches(';').trim_end() == words[0]
    {
        return true;
    }
    let named = SQL_NAMED.iter().any(|kw| {
        literal.match_indices(kw).any(|(at, _)| {
            let rest = literal[at + kw.len()..].trim_start();
            let name_len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
            let after = rest[name_len..].trim_start();
            name_len > 0
                && rest[..name_len].chars().all(|c| !c.is_ascii_uppercase())
                && (after.is_empty() || after.starts_with(['=', '(', ';']))
        })
    });
    named
        || words.iter().enumerate().any(|(n, w)| {
            SQL_SHAPES.iter().any(|(open, follow)| {
                *w == *open && words[n + 1..].iter().any(|later| follow.contains(later))
            })
        })
}

fn sql_problems(file: &str, text: &str) -> Vec<String> {
    if file.starts_with(STORE_DIR) {
        return Vec::new();
    }
    let l = lex(text);
    let mut out: Vec<String> = find_word(&l.code, "rusqlite")
        .into_iter()
        .chain(find_word(&l.code, "libsqlite3_sys"))
        .map(|at| {
            format!(
                "{file}:{}: rusqlite outside src/store",
                line_of(&l.code, at)
            )
        })
        .collect();
    for (line, s) in &l.strings {
        if reads_as_sql(s) {
            out.push(format!("{file}:{line}: SQL outside src/store: {s:?}"));
        }
    }
    out
}

#[test]
fn tidy_sql_only_in_store() {
    let files = rust_files("src");
    assert!(
        files.iter().any(|(f, _)| f.starts_with(STORE_DIR)),
        "the store is where the scan expects it"
    );
    // The store itself does speak SQL: the detector sees it there (the scan works).
    let in_store: usize = files
        .iter()
        .filter(|(f, _)| f.starts_with(STORE_DIR))
        .map(|(_, t)| {
            lex(t)
                .strings
                .iter()
                .filter(|(_, s)| reads_as_sql(s))
                .count()
        })
        .sum();
    assert!(
        in_store >= 20,
        "only {in_store} SQL literals found in the store"
    );
    let problems: Vec<String> = files.iter().flat_map(|(f, t)| sql_problems(f, t)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tidy_sql_detector_catches_planted_sql() {
    let planted = [
        "fn f(c: &rusqlite::Connection) {}",
        "use rusqlite::params;",
        r#"const Q: &str = "SELECT id, state FROM batches WHERE id = ?1";"#,
        "const Q: &str = \"UPDATE batches\n    SET state = 'dead'\";",
        r##"let q = r#"INSERT INTO events (batch_id) VALUES (?1)"#;"##,
        r#"conn.execute_batch("BEGIN IMMEDIATE")?;"#,
        r#"conn.execute_batch("COMMIT")?;"#,
        r#"conn.execute_batch("BEGIN;")?;"#,
        r#"let v = conn.pragma("PRAGMA user_version");"#,
        r#"c.execute("PRAGMA journal_mode = WAL")?; c.execute("SAVEPOINT req_7;")?;"#,
        r#"c.execute("VACUUM")?;"#,
        r#"db.run("delete FROM spool"); db.run("CREATE INDEX i ON t(x)");"#,
    ];
    for p in planted {
        assert!(!sql_problems("src/cli/x.rs", p).is_empty(), "missed: {p}");
        assert!(
            sql_problems("src/store/x.rs", p).is_empty(),
            "the store may: {p}"
        );
    }
    for fine in [
        r#"println!("select a route from the list");"#,
        r#"let m = "DELETE the batch with hookspool drop";"#,
        "// rusqlite is only used by the store",
        r#"let s = "the store uses rusqlite";"#,
        r#"let msg = "BEGIN again";"#,
        r#"let m = format!("VACUUM needs about {} bytes free", n);"#,
        r#"let m = "a PRAGMA quick_check failure: restore from backup";"#,
        r#"let w = "UPDATE"; let s = "SET";"#,
        r#"if line.contains("-----BEGIN") && line.contains("PRIVATE KEY") {}"#,
    ] {
        assert!(
            sql_problems("src/cli/x.rs", fine).is_empty(),
            "false alarm: {fine}"
        );
    }
}

// ---------------------------------------------------------------- rule: spawning in sandbox

const SANDBOX_DIR: &str = "src/sandbox/";

fn spawn_problems(file: &str, text: &str) -> Vec<String> {
    if file.starts_with(SANDBOX_DIR) {
        return Vec::new();
    }
    let l = lex(text);
    let squeezed: String = l.code.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = Vec::new();
    // Whitespace-free, so `Command :: new` and a `process::{Command, Stdio}` group match too.
    let group_has_command = squeezed.match_indices("process::{").any(|(at, m)| {
        let rest = &squeezed[at + m.len()..];
        let group = &rest[..rest.find('}').unwrap_or(rest.len())];
        group
            .split(',')
            .any(|item| item == "Command" || item.starts_with("Commandas"))
    });
    for (needle, what) in [
        ("Command::new(", "Command::new"),
        ("process::Command", "std/tokio process::Command"),
        ("unistd::fork(", "fork"),
        ("libc::fork(", "fork"),
        ("unistd::execv", "exec"),
        ("libc::exec", "exec"),
        ("posix_spawn", "posix_spawn"),
    ] {
        if squeezed.contains(needle) {
            out.push(format!("{file}: {what} outside src/sandbox"));
        }
    }
    if group_has_command {
        out.push(format!("{file}: process::{{Command}} outside src/sandbox"));
    }
    out
}

#[test]
fn tidy_processes_spawn_only_in_sandbox() {
    let files = rust_files("src");
    let in_sandbox = files
        .iter()
        .filter(|(f, _)| f.starts_with(SANDBOX_DIR))
        .filter(|(f, t)| !spawn_problems(&f.replace(SANDBOX_DIR, "src/x/"), t).is_empty())
        .count();
    assert!(
        in_sandbox >= 1,
        "the sandbox spawns: the detector must see it there"
    );
    let problems: Vec<String> = files
        .iter()
        .flat_map(|(f, t)| spawn_problems(f, t))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tidy_spawn_detector_catches_planted_spawns() {
    for p in [
        r#"let c = std::process::Command::new("sh");"#,
        "use std::process::Command;",
        "use std::process::{Stdio, Command};",
        "use tokio::process::{Command as Cmd};",
        r#"let c = Command :: new ("sh");"#,
        "unsafe { nix::unistd::fork() }",
        "nix::unistd::execve(&p, &a, &e)",
    ] {
        assert!(!spawn_problems("src/cli/x.rs", p).is_empty(), "missed: {p}");
        assert!(
            spawn_problems("src/sandbox/x.rs", p).is_empty(),
            "the sandbox may: {p}"
        );
    }
    for fine in [
        "match cli.command { Command::Run => run() }",
        "// Command::new lives in the sandbox",
        r#"let s = "std::process::Command";"#,
    ] {
        assert!(
            spawn_problems("src/cli/x.rs", fine).is_empty(),
            "false alarm: {fine}"
        );
    }
}

// ---------------------------------------------------------------- rule: ct_eq in verify

const VERIFY_FILE: &str = "src/sources/verify.rs";
const SOURCES_DIR: &str = "src/sources/";
/// Words that mark a line as handling secret-derived bytes.
const SECRET_WORDS: &[&str] = &[
    "signature",
    "sig",
    "token",
    "mac",
    "digest",
    "secret",
    "tag",
];
/// Comparisons that must not appear on such a line (ct_eq is the only one allowed).
const COMPARISONS: &[&str] = &["==", "!=", ".eq(", ".ne(", "cmp("];
/// Constant-time helpers other than `verify::ct_eq`.
const SECOND_HELPERS: &[&str] = &[
    "ConstantTimeEq",
    "constant_time_eq",
    "subtle::",
    "verify_slice",
    "verify_truncated_left",
    "constant_time::",
];

fn ct_eq_problems(file: &str, text: &str) -> Vec<String> {
    let l = lex(text);
    let mut out = Vec::new();
    for (n, line) in l.code.lines().enumerate() {
        let at = format!("{file}:{}", n + 1);
        if file != VERIFY_FILE && line.contains("fn ct_eq") {
            out.push(format!("{at}: ct_eq defined outside {VERIFY_FILE}"));
        }
        if file != VERIFY_FILE && SECOND_HELPERS.iter().any(|h| line.contains(h)) {
            out.push(format!(
                "{at}: a second constant-time helper: {}",
                line.trim()
            ));
        }
        let lower = line.to_ascii_lowercase();
        if file.starts_with(SOURCES_DIR)
            && file != VERIFY_FILE
            && SECRET_WORDS.iter().any(|w| lower.contains(w))
            && COMPARISONS.iter().any(|o| line.contains(o))
        {
            out.push(format!(
                "{at}: plain comparison of secret bytes: {}",
                line.trim()
            ));
        }
    }
    out
}

#[test]
fn tidy_secret_comparisons_go_through_ct_eq() {
    let files = rust_files("src");
    let defs: Vec<&String> = files
        .iter()
        .filter(|(_, t)| lex(t).code.contains("fn ct_eq("))
        .map(|(f, _)| f)
        .collect();
    assert_eq!(defs, [VERIFY_FILE], "exactly one ct_eq, in verify.rs");
    assert!(
        files
            .iter()
            .filter(|(f, _)| f.starts_with(SOURCES_DIR))
            .count()
            >= 10,
        "the sources are where the scan expects them"
    );
    let problems: Vec<String> = files
        .iter()
        .flat_map(|(f, t)| ct_eq_problems(f, t))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tidy_ct_eq_detector_catches_planted_comparisons() {
    for p in [
        "    if computed_sig == presented {",
        "    let ok = token.as_bytes() != expected;",
        "    if hmac_out.eq(&header_bytes) {",
        "fn ct_eq(a: &[u8], b: &[u8]) -> bool {",
        "use subtle::ConstantTimeEq;",
        "    mac.verify_slice(&tag)?;",
    ] {
        assert_eq!(ct_eq_problems("src/sources/github.rs", p).len(), 1, "{p}");
    }
    // A second helper is refused anywhere in src, not only in sources.
    assert!(!ct_eq_problems("src/destinations/sign.rs", "use subtle::ConstantTimeEq;").is_empty());
    for fine in [
        "    // if sig == x: comments are fine",
        "    if event == \"ping\" {",
        "    let m = \"signature == expected\";",
    ] {
        assert!(
            ct_eq_problems("src/sources/github.rs", fine).is_empty(),
            "{fine}"
        );
    }
    assert!(ct_eq_problems(VERIFY_FILE, "pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {").is_empty());
}

// ---------------------------------------------------------------- rule: log field names

const LOGGING_FILE: &str = "src/observe/logging.rs";
const LOG_MACROS: &[&str] = &["trace!", "debug!", "info!", "warn!", "error!", "event!"];

/// The names of `LOG_FIELDS` as `src/observe/logging.rs` declares them (one list: the
/// tidy reads the code's, it does not keep a copy).
fn declared_log_fields() -> Vec<String> {
    let text = std::fs::read_to_string(root().join(LOGGING_FILE)).expect("logging.rs");
    let l = lex(&text);
    let at = l
        .code
        .find("pub const LOG_FIELDS")
        .expect("LOG_FIELDS in logging.rs");
    let (start, end) = (
        line_of(&l.code, at),
        line_of(
            &l.code,
            at + l.code[at..].find("];").expect("end of LOG_FIELDS"),
        ),
    );
    l.strings
        .iter()
        .filter(|(line, _)| (start..=end).contains(line))
        .map(|(_, s)| s.clone())
        .collect()
}

/// The arguments of the macro call whose `(` is at `open` in `code`, split at top-level
/// commas.
fn macro_args(code: &str, open: usize) -> Vec<&str> {
    let mut depth = 0;
    let mut args = Vec::new();
    let mut from = open + 1;
    for (i, c) in code[open..].char_indices().map(|(i, c)| (open + i, c)) {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    args.push(&code[from..i]);
                    break;
                }
            }
            ',' if depth == 1 => {
                args.push(&code[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    args
}

/// The structured fields a log call names before its message: `name = v`, `name = %v`,
/// `%name`, `?name`, `name` (tracing's shorthands); `target:`, `parent:` and a level are
/// not fields.
fn log_fields(file: &str, text: &str) -> Vec<(String, usize, String)> {
    let l = lex(text);
    let mut out = Vec::new();
    for mac in LOG_MACROS {
        for at in find_word(&l.code, &mac[..mac.len() - 1]) {
            let after = &l.code[at + mac.len() - 1..];
            let Some(rest) = after.strip_prefix('!') else {
                continue;
            };
            let Some(paren) = rest.find(|c: char| !c.is_whitespace()) else {
                continue;
            };
            if !rest[paren..].starts_with('(') {
                continue;
            }
            let open = at + mac.len() + paren;
            for arg in macro_args(&l.code, open) {
                let arg = arg.trim();
                if arg.starts_with('"') || arg.is_empty() {
                    break; // the message and its format arguments
                }
                // `target: "x"`, `parent: s`, `name: "n"` are options, `Level::INFO` is
                // event!'s level: neither is a field.
                let option = arg.split_once(':').is_some_and(|(k, rest)| {
                    !rest.starts_with(':') && k.trim().chars().all(is_ident)
                });
                if option || arg.contains("Level::") {
                    continue;
                }
                let key = arg.split('=').next().unwrap_or(arg).trim();
                let name = key.trim_start_matches(['%', '?']).trim();
                out.push((name.to_string(), line_of(&l.code, at), file.to_string()));
            }
        }
    }
    out
}

/// Off-spec fields that were already in the tree when this rule was written, as (file,
/// field). Each is its owner's to rename to a LOG_FIELDS name (`batch_id` -> `batch`, so
/// `journalctl BATCH=<id>` finds the attempt lines; `elapsed_ms` -> `duration_ms`) or to
/// fold into the message. The list only shrinks: a listed pair that is gone fails the test
/// until it is removed here, and anything not listed fails at once.
const KNOWN_OFF_SPEC_FIELDS: &[(&str, &str)] = &[
    ("src/destinations/hermes.rs", "batch_id"),
    ("src/destinations/hermes.rs", "elapsed_ms"),
    ("src/destinations/hermes.rs", "hermes_route"),
    ("src/destinations/http.rs", "batch_id"),
    ("src/destinations/http.rs", "elapsed_ms"),
    ("src/dispatch/engine/record.rs", "klass"),
    ("src/dispatch/engine/record.rs", "outcome"),
    ("src/dispatch/mod.rs", "count"),
    ("src/dispatch/mod.rs", "inflight"),
    ("src/dispatch/mod.rs", "redue"),
    ("src/intake/entry.rs", "location"),
    ("src/intake/entry.rs", "thread"),
    ("src/intake/handler.rs", "remote"),
    ("src/sandbox/plan.rs", "error"),
    ("src/sandbox/plan.rs", "path"),
];

fn log_field_problems(file: &str, text: &str, allowed: &[String]) -> Vec<String> {
    log_fields(file, text)
        .into_iter()
        .filter(|(name, _, _)| !allowed.iter().any(|a| a == name))
        .filter(|(name, _, file)| !KNOWN_OFF_SPEC_FIELDS.contains(&(file.as_str(), name.as_str())))
        .map(|(name, line, file)| {
            format!(
                "{file}:{line}: log field {name:?} is not one of LOG_FIELDS ({}); use one of them or add it there with the spec",
                allowed.join(", ")
            )
        })
        .collect()
}

#[test]
fn tidy_log_fields_are_the_spec_set() {
    let allowed = declared_log_fields();
    assert!(
        ["source", "route", "batch", "destination", "reason"]
            .iter()
            .all(|f| allowed.iter().any(|a| a == f)),
        "LOG_FIELDS read from {LOGGING_FILE}: {allowed:?}"
    );
    let files = rust_files("src");
    let seen: usize = files.iter().map(|(f, t)| log_fields(f, t).len()).sum();
    assert!(
        seen >= 20,
        "only {seen} log fields found: the scan is not seeing log calls"
    );
    let problems: Vec<String> = files
        .iter()
        .flat_map(|(f, t)| log_field_problems(f, t, &allowed))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let used: Vec<(String, String)> = files
        .iter()
        .flat_map(|(f, t)| log_fields(f, t))
        .map(|(name, _, file)| (file, name))
        .collect();
    let gone: Vec<&(&str, &str)> = KNOWN_OFF_SPEC_FIELDS
        .iter()
        .filter(|(f, n)| !used.iter().any(|(uf, un)| uf == f && un == n))
        .collect();
    assert!(
        gone.is_empty(),
        "fixed, so remove from KNOWN_OFF_SPEC_FIELDS: {gone:?}"
    );
}

#[test]
fn tidy_log_field_detector_catches_planted_fields() {
    let allowed: Vec<String> = ["batch", "destination", "reason"].map(String::from).into();
    for p in [
        r#"tracing::info!(batch = id, body = %text, "delivered");"#,
        r#"warn!(%secret, "x");"#,
        r#"error!(target: "hookspool", ?headers, "y {}", z);"#,
        "debug!(\n    batch,\n    query_string = q,\n    \"z\"\n);",
        r#"tracing::event!(tracing::Level::INFO, payload = ?p, "e");"#,
    ] {
        let problems = log_field_problems("src/x.rs", p, &allowed);
        assert_eq!(problems.len(), 1, "{p}: {problems:?}");
    }
    for fine in [
        r#"info!(batch = id, destination = %d, reason = "ok", "delivered {} of {}", a, b);"#,
        r#"warn!("no fields, {}", x.len());"#,
        r#"error!(target: "hookspool", batch, "m");"#,
        r#"// info!(body = x, "in a comment")"#,
        r#"let s = "info!(body = x)";"#,
    ] {
        let problems = log_field_problems("src/x.rs", fine, &allowed);
        assert!(problems.is_empty(), "{fine}: {problems:?}");
    }
}

// ---------------------------------------------------------------- rule: one way to skip

const SKIP_HELPER: &str = "tests/support/skip.rs";
const TIDY_FILE: &str = "tests/tidy.rs";

/// A string literal that announces a skip (`SKIP...`, `skipped: ...`) outside the helper:
/// a test that says it skipped without `skip_or_fail` cannot be turned into a failure.
fn skip_problems(file: &str, text: &str) -> Vec<String> {
    if file == SKIP_HELPER || file == TIDY_FILE {
        return Vec::new();
    }
    lex(text)
        .strings
        .into_iter()
        .filter(|(_, s)| {
            let t = s.trim_start();
            t.starts_with("SKIP") || t.to_ascii_lowercase().starts_with("skipped:")
        })
        .map(|(line, s)| format!("{file}:{line}: a skip without skip_or_fail: {s:?}"))
        .collect()
}

#[test]
fn tidy_skips_go_through_skip_or_fail() {
    assert!(root().join(SKIP_HELPER).is_file());
    let problems: Vec<String> = rust_files("src")
        .into_iter()
        .chain(rust_files("tests"))
        .flat_map(|(f, t)| skip_problems(&f, &t))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tidy_skip_detector_catches_planted_skips() {
    for p in [
        r#"eprintln!("SKIP promtool check: absent"); return;"#,
        r#"eprintln!("skipped: /usr/bin/python3 absent");"#,
        r#"println!("SKIPPED: no root");"#,
    ] {
        assert_eq!(skip_problems("tests/it/x.rs", p).len(), 1, "{p}");
    }
    assert!(skip_problems("src/observe/status.rs", r#"json!({"skipped": n})"#).is_empty());
    assert!(skip_problems(SKIP_HELPER, r#"eprintln!("SKIPPED: {why}")"#).is_empty());
}

// ---------------------------------------------------------------- floors

/// The house's floors (issue 30), bottom first: a module's non-test code may name
/// `crate::<other>` only for a module on a lower floor, so a new import that runs back up a
/// floor fails the build's tests, and no circle can cross two top-level modules. The kit,
/// which runs the intake's sources, the processor runtime and the poll pieces against a
/// bobbin, sits beside the CLI on the top floors; what config needs of the bobbins sits
/// below config.
const FLOORS: &[(&str, u32)] = &[
    ("vocab", 0),
    ("clock", 0),
    ("failpoint", 0),
    ("limits", 0),
    ("secret", 0),
    ("sys", 0),
    ("sandbox", 0),
    ("wake", 0),
    ("egress", 0),
    ("telemetry", 0),
    ("sources", 0),
    ("store", 1),
    ("bobbins", 1),
    ("destinations", 2),
    ("processor", 3),
    ("config", 3),
    ("observe", 4),
    ("intake", 5),
    ("dispatch", 5),
    ("ops", 5),
    ("admin", 6),
    ("kit", 6),
    ("cli", 7),
];

/// The top-level module a `src/` file belongs to (`src/config/mod.rs` -> `config`), or
/// `None` for the crate roots.
fn module_of(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("src/")?;
    let first = rest.split('/').next()?;
    match first.strip_suffix(".rs").unwrap_or(first) {
        "lib" | "main" => None,
        m => Some(m),
    }
}

/// The code of a file without its test modules: from a `#[cfg(test)]` on, code is test code
/// (every file keeps its tests last), and `*_tests.rs` files and `tests/` directories are
/// all test code.
fn non_test_code(file: &str, text: &str) -> String {
    if file.ends_with("_tests.rs") || file.ends_with("/tests.rs") || file.contains("/tests/") {
        return String::new();
    }
    let code = lex(text).code;
    match code.find("#[cfg(test)]") {
        Some(i) => code[..i].to_string(),
        None => code,
    }
}

/// Each `crate::<module>` a file's non-test code names that is not on a floor below its own.
fn floor_problems(file: &str, text: &str) -> Vec<String> {
    let floor = |m: &str| FLOORS.iter().find(|(n, _)| *n == m).map(|(_, f)| *f);
    let Some(me) = module_of(file) else {
        return Vec::new();
    };
    let Some(mine) = floor(me) else {
        return vec![format!(
            "{file}: the module {me} has no floor; add it to FLOORS in tests/tidy.rs"
        )];
    };
    let code = non_test_code(file, text);
    let mut named: Vec<(usize, String)> = Vec::new();
    for at in find_word(&code, "crate") {
        let rest = &code[at + "crate".len()..];
        let Some(rest) = rest.strip_prefix("::") else {
            continue;
        };
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c}`: each name at the group's top level.
            let inner = group.split('}').next().unwrap_or("");
            for part in inner.split(',') {
                let name: String = part.trim().chars().take_while(|c| is_ident(*c)).collect();
                if !name.is_empty() {
                    named.push((at, name));
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            named.push((at, name));
        }
    }
    let mut out = Vec::new();
    for (at, other) in named {
        if other == me {
            continue;
        }
        match floor(&other) {
            Some(f) if f < mine => {}
            Some(f) => out.push(format!(
                "{file}:{}: {me} (floor {mine}) names crate::{other} (floor {f}): an import may only go down a floor; move what it needs below {me}",
                line_of(&code, at)
            )),
            // Not a module (a macro or item at the crate root): no floor to break.
            None => {}
        }
    }
    out
}

#[test]
fn tidy_imports_go_down_the_floors() {
    let problems: Vec<String> = rust_files("src")
        .into_iter()
        .flat_map(|(f, t)| floor_problems(&f, &t))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tidy_floor_detector_catches_planted_upward_imports() {
    for (file, text) in [
        ("src/bobbins/expand.rs", "use crate::config::SecretRefs;\n"),
        (
            "src/store/x.rs",
            "fn f() { crate::observe::issues::resolve(); }\n",
        ),
        ("src/store/y.rs", "use crate::{clock, kit::signer::Kit};\n"),
        ("src/config/mod.rs", "use crate::processor::hooks;\n"),
        ("src/newmodule.rs", "use crate::vocab::BatchState;\n"),
    ] {
        assert_eq!(floor_problems(file, text).len(), 1, "{file}: {text}");
    }
    // Down a floor, inside the module, in a comment or a test module: fine.
    assert!(floor_problems("src/config/mod.rs", "use crate::bobbins::Catalog;\n").is_empty());
    assert!(floor_problems("src/config/route.rs", "use crate::config::Config;\n").is_empty());
    assert!(floor_problems("src/store/x.rs", "// crate::cli::run\n").is_empty());
    assert!(
        floor_problems(
            "src/store/x.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests { use crate::kit::signer::Kit; }\n"
        )
        .is_empty()
    );
    assert!(
        floor_problems("src/sources/kat_tests.rs", "use crate::kit::signer::Kit;\n").is_empty()
    );
}

// ---------------------------------------------------------------- the lexer itself

#[test]
fn the_lexer_blanks_comments_and_strings_and_keeps_lines() {
    let text = "let a = \"x // y\"; // Command::new\n/* SELECT * FROM t\n */ let b = r#\"q \"quoted\" \"#;\nlet c = '\"'; let d: &'static str = \"e\\\"f\";\n";
    let l = lex(text);
    assert_eq!(l.code.lines().count(), text.lines().count());
    assert!(!l.code.contains("Command") && !l.code.contains("SELECT"));
    assert!(l.code.contains("let d: &'static str"));
    let strings: Vec<&str> = l.strings.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(strings, ["x // y", "q \"quoted\" ", "e\\\"f"]);
    assert_eq!(l.strings[1].0, 3, "line numbers survive a block comment");
}

/// Paths are relative to the crate root, never a machine's.
#[test]
fn tidy_reads_the_tree_it_is_built_from() {
    let files = rust_files("src");
    assert!(
        files
            .iter()
            .any(|(f, _)| Path::new(f) == Path::new(VERIFY_FILE))
    );
}

// ---------------------------------------------------------------- the config reference

/// The configuration reference (issue 29), written by the generator.
const REFERENCE_FILE: &str = "docs/configuration.md";
const RAW_FILE: &str = "src/config/raw.rs";

/// Every key the raw config types accept, as the reference spells it: a table's fields under
/// its path, `<name>` for a map's key, `[]` for an array of tables (`routes[].name`), a
/// field's serde rename, and a `Raw*` field type read as a table of its own. A flattened
/// field (a type's own keys) is left out: the tables that accept those are checked by
/// `config::reference`'s tests.
fn raw_config_keys(text: &str) -> Vec<String> {
    let code = lex(text).code;
    // struct name -> [(key, field type)]
    let mut structs: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let code_lines: Vec<&str> = code.lines().collect();
    let mut current: Option<usize> = None;
    let (mut rename, mut flatten) = (None::<String>, false);
    for (i, line) in code_lines.iter().enumerate() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("pub struct ") {
            let name = rest.split([' ', '{', '(']).next().unwrap_or("").to_string();
            structs.push((name, Vec::new()));
            current = t.ends_with('{').then_some(structs.len() - 1);
            continue;
        }
        let Some(at) = current else { continue };
        if t == "}" {
            current = None;
            continue;
        }
        // The attribute's string is blanked in `code`; read it from the text.
        let raw_line = lines[i].trim();
        if raw_line.starts_with("#[serde(") {
            if let Some(r) = raw_line.split("rename = \"").nth(1) {
                rename = r.split('"').next().map(str::to_string);
            }
            flatten |= raw_line.contains("flatten");
            continue;
        }
        if let Some(field) = t.strip_prefix("pub ")
            && let Some((name, ty)) = field.split_once(':')
        {
            let key = rename.take().unwrap_or_else(|| name.trim().to_string());
            if !std::mem::take(&mut flatten) {
                let ty = ty.trim().trim_end_matches(',').to_string();
                structs[at].1.push((key, ty));
            }
        }
    }
    fn walk(
        structs: &[(String, Vec<(String, String)>)],
        name: &str,
        prefix: &str,
        out: &mut Vec<String>,
    ) {
        let Some((_, fields)) = structs.iter().find(|(n, _)| n == name) else {
            panic!("{RAW_FILE}: no struct {name}");
        };
        for (key, ty) in fields {
            // A map or an array of a `Raw*` table is a table of tables; of anything else, a
            // value of its own (`secrets`, `match`).
            let mut path = format!("{prefix}{key}");
            let mut ty = ty.as_str();
            let mut nested = "";
            loop {
                if let Some(inner) = ty.strip_prefix("Option<") {
                    ty = inner.strip_suffix('>').unwrap_or(inner);
                } else if let Some(inner) = ty.strip_prefix("BTreeMap<String, ") {
                    ty = inner.strip_suffix('>').unwrap_or(inner);
                    nested = ".<name>";
                } else if let Some(inner) = ty.strip_prefix("Vec<") {
                    ty = inner.strip_suffix('>').unwrap_or(inner);
                    nested = "[]";
                } else {
                    break;
                }
            }
            if ty.starts_with("Raw") {
                path.push_str(nested);
                walk(structs, ty, &format!("{path}."), out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&structs, "RawConfig", "", &mut out);
    out
}

/// The keys of `raw_keys` the reference has no row for: a row is "| `key` |", and a key
/// whose value is a table of its own keys (`bobbins.<name>`) is covered by rows under it.
fn reference_gaps(raw_keys: &[String], reference: &str) -> Vec<String> {
    raw_keys
        .iter()
        .filter(|k| {
            !reference.contains(&format!("| `{k}` |")) && !reference.contains(&format!("| `{k}."))
        })
        .cloned()
        .collect()
}

#[test]
fn tidy_every_config_key_is_in_the_reference() {
    let raw = std::fs::read_to_string(root().join(RAW_FILE)).expect("raw.rs");
    let keys = raw_config_keys(&raw);
    // The reader found the tables it must: a nested one, a map, an array, a rename.
    for k in [
        "dispatch.breaker.trip_after",
        "spans.<name>.quiet_s",
        "routes[].match",
        "sources.<name>.type",
    ] {
        assert!(
            keys.iter().any(|x| x == k),
            "{k} not read from {RAW_FILE}: {keys:?}"
        );
    }
    let reference = std::fs::read_to_string(root().join(REFERENCE_FILE)).expect("reference");
    let gaps = reference_gaps(&keys, &reference);
    assert!(
        gaps.is_empty(),
        "{REFERENCE_FILE} has no row for {gaps:?}: add each to config::reference::SECTIONS and run `hookspool generate reference docs`"
    );
}

#[test]
fn tidy_reference_gap_detector_catches_a_planted_key() {
    let planted = "pub struct RawConfig {\n    #[serde(default)]\n    pub spool: RawSpool,\n}\npub struct RawSpool {\n    pub home: Option<String>,\n    pub planted_s: Option<f64>,\n}\n";
    let keys = raw_config_keys(planted);
    assert_eq!(keys, ["spool.home", "spool.planted_s"]);
    let reference = "| `spool.home` | path |\n";
    assert_eq!(reference_gaps(&keys, reference), ["spool.planted_s"]);
}

/// docs/configuration.md is what the generator prints: a reference edited by hand, or a
/// key added to `config::reference` without regenerating, fails here. (The one rule that
/// runs the built binary: the text comes from it.)
#[test]
fn tidy_the_reference_is_what_the_generator_prints() {
    let dir = std::env::temp_dir().join(format!("hookspool-tidy-ref-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookspool"))
        .args(["generate", "reference"])
        .arg(&dir)
        .output()
        .expect("run hookspool generate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = std::fs::read_to_string(dir.join("configuration.md")).expect("generated");
    let _ = std::fs::remove_dir_all(&dir);
    let committed = std::fs::read_to_string(root().join(REFERENCE_FILE)).expect("committed");
    assert!(
        generated == committed,
        "{REFERENCE_FILE} differs from `hookspool generate reference docs`; run it and commit the result"
    );
}
