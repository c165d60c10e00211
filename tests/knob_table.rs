//! One reader of the environment per language, and one table documenting
//! every variable they read.
//!
//! - `vendor/src/core/config.cpp` is the only file of the engine that reads
//!   the environment, and `src/connector/config.rs` the only one of the Rust
//!   packages (the `mooncake` crate asks the engine through
//!   `mc_get_env_overrides`).
//! - README's "Environment variables" table lists exactly the variables
//!   those two files read: a missing or stale row fails here, named.
//!
//! Plain `std`: a small lexer separates code, comments and string literals,
//! so a variable named in a comment or a log message does not count, and a
//! call to `getenv` quoted in a string or a comment is not a call.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    Cpp,
    Rust,
}

/// A source file split into its code (comments and literals blanked out)
/// and the contents of its string literals.
struct Lexed {
    code: String,
    strings: Vec<String>,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Where a raw string starting at `i` ends (index after it) and its
/// contents, if one starts there: C++ `R"d(...)d"`, Rust `r"..."` /
/// `r#"..."#`.
fn raw_string(b: &[u8], i: usize, lang: Lang) -> Option<(usize, String)> {
    // Rust's `br"..."` is a raw byte string.
    let prefix = if lang == Lang::Rust && i > 0 && b[i - 1] == b'b' {
        i - 1
    } else {
        i
    };
    if prefix > 0 && is_ident(b[prefix - 1]) {
        return None;
    }
    match lang {
        Lang::Cpp => {
            if b.get(i) != Some(&b'R') || b.get(i + 1) != Some(&b'"') {
                return None;
            }
            let open = i + 2 + b[i + 2..].iter().position(|&c| c == b'(')?;
            let delim = &b[i + 2..open];
            let mut close = Vec::from(&b")"[..]);
            close.extend_from_slice(delim);
            close.push(b'"');
            let end = open
                + 1
                + b[open + 1..]
                    .windows(close.len())
                    .position(|w| w == close)?;
            let body = String::from_utf8_lossy(&b[open + 1..end]).into_owned();
            Some((end + close.len(), body))
        }
        Lang::Rust => {
            if b.get(i) != Some(&b'r') {
                return None;
            }
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            let q = i + 1 + hashes;
            if b.get(q) != Some(&b'"') {
                return None;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = q + 1 + b[q + 1..].windows(close.len()).position(|w| w == close)?;
            let body = String::from_utf8_lossy(&b[q + 1..end]).into_owned();
            Some((end + close.len(), body))
        }
    }
}

/// The end of a quoted literal opened at `i` (`quote` is `"` or `'`),
/// honouring backslash escapes.
fn quoted_end(b: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != quote {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    (j + 1).min(b.len())
}

/// Whether a `'` at `i` opens a character literal (not a Rust lifetime or
/// label, not a C++ digit separator).
fn opens_char(b: &[u8], i: usize, lang: Lang) -> bool {
    match lang {
        Lang::Cpp => !(i > 0 && b[i - 1].is_ascii_alphanumeric()),
        Lang::Rust => match (b.get(i + 1), b.get(i + 2)) {
            (Some(b'\\'), _) => true,
            (Some(_), Some(b'\'')) => true,
            // A multi-byte character: its closing quote comes within 5 bytes.
            (Some(c), _) if *c >= 0x80 => b[i + 1..].iter().take(5).any(|&c| c == b'\''),
            _ => false,
        },
    }
}

fn lex(text: &str, lang: Lang) -> Lexed {
    let b = text.as_bytes();
    let mut code = Vec::with_capacity(b.len());
    let mut strings = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let next = b.get(i + 1).copied();
        if b[i] == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && next == Some(b'*') {
            let end = b[i + 2..].windows(2).position(|w| w == b"*/");
            i = end.map_or(b.len(), |e| i + 2 + e + 2);
            code.push(b' ');
        } else if let Some((end, body)) = raw_string(b, i, lang) {
            strings.push(body);
            code.extend_from_slice(b"\"\"");
            i = end;
        } else if b[i] == b'"' {
            let end = quoted_end(b, i, b'"');
            strings.push(String::from_utf8_lossy(&b[i + 1..end.saturating_sub(1)]).into_owned());
            code.extend_from_slice(b"\"\"");
            i = end;
        } else if b[i] == b'\'' && opens_char(b, i, lang) {
            i = quoted_end(b, i, b'\'');
            code.extend_from_slice(b"' '");
        } else {
            code.push(b[i]);
            i += 1;
        }
    }
    Lexed {
        code: String::from_utf8_lossy(&code).into_owned(),
        strings,
    }
}

/// Whether a whole literal is an environment variable name: upper case,
/// digits and underscores with at least one underscore. Every variable the
/// two readers take has one; the other all-caps literals of config.cpp (log
/// level names such as `WARN`) have none.
fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 2
        && b[0].is_ascii_uppercase()
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
        && s.contains('_')
        && !s.ends_with('_')
}

/// The variables a reader file names, from its non-test code.
fn env_names(rel: &str, lang: Lang) -> BTreeSet<String> {
    let text = read(rel);
    // Rust unit tests may use names of their own; only the reader counts.
    let text = match (lang, text.find("#[cfg(test)]")) {
        (Lang::Rust, Some(at)) => &text[..at],
        _ => &text[..],
    };
    lex(text, lang)
        .strings
        .into_iter()
        .filter(|s| is_env_name(s))
        .collect()
}

/// The first cell of every row of README's "Environment variables" table.
fn readme_rows() -> Vec<String> {
    let readme = read("README.md");
    let start = readme
        .lines()
        .position(|l| l.trim() == "## Environment variables")
        .expect("README.md has a \"## Environment variables\" section");
    let mut rows = Vec::new();
    for line in readme.lines().skip(start + 1) {
        if line.starts_with("## ") || line.starts_with("# ") {
            break;
        }
        let Some(cells) = line.trim().strip_prefix('|') else {
            continue;
        };
        let first = cells.split('|').next().unwrap_or("").trim();
        if let Some(name) = first.strip_prefix('`').and_then(|n| n.strip_suffix('`')) {
            rows.push(name.to_string());
        }
    }
    rows
}

#[test]
fn readme_table_lists_exactly_the_variables_read() {
    let engine = env_names("vendor/src/core/config.cpp", Lang::Cpp);
    let connector = env_names("src/connector/config.rs", Lang::Rust);
    // The extraction itself: a few names each reader is known to take.
    for n in [
        "MC_SLICE_SIZE",
        "MC_MIN_PRC_PORT",
        "NCCL_IB_GID_INDEX",
        "MC_LOG_LEVEL",
    ] {
        assert!(
            engine.contains(n),
            "{n} not found in config.cpp: {engine:?}"
        );
    }
    for n in ["VLLM_HOST_IP", "MOONCAKE_BOOTSTRAP_TOKEN", "OPENAI_API_KEY"] {
        assert!(
            connector.contains(n),
            "{n} not found in config.rs: {connector:?}"
        );
    }
    let read: BTreeSet<String> = engine.union(&connector).cloned().collect();

    let rows = readme_rows();
    let listed: BTreeSet<String> = rows.iter().cloned().collect();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for r in &rows {
        if !seen.insert(r) {
            problems.push(format!("{r}: listed twice"));
        }
    }
    for n in read.difference(&listed) {
        let by = if engine.contains(n) {
            "vendor/src/core/config.cpp"
        } else {
            "src/connector/config.rs"
        };
        problems.push(format!("{n}: read by {by} but has no row"));
    }
    for n in listed.difference(&read) {
        problems.push(format!("{n}: has a row but neither reader reads it"));
    }
    assert!(
        problems.is_empty(),
        "README.md \"Environment variables\" table is out of date:\n  {}",
        problems.join("\n  ")
    );
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Calls that read the environment at run time. (`env!` and `option_env!`
/// read the build's environment at compile time and are not listed.)
const READERS_CPP: [&str; 2] = ["getenv", "secure_getenv"];
const READERS_RUST: [&str; 2] = ["env::var", "env::vars"];

#[test]
fn only_the_two_config_files_read_the_environment() {
    // vendor/softverbs (a software verbs provider) and vendor/fuzz are test
    // tooling, not the engine: they are not under vendor/src and may read
    // the environment.
    let allowed = [
        root().join("vendor/src/core/config.cpp"),
        root().join("src/connector/config.rs"),
    ];
    let mut files = Vec::new();
    for dir in ["vendor/src", "mooncake/src", "src"] {
        walk(&root().join(dir), &mut files);
    }
    let mut offenders = Vec::new();
    let mut checked = 0;
    for f in files {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        let (lang, needles): (Lang, &[&str]) = match ext {
            "c" | "cc" | "cpp" | "h" | "hpp" => (Lang::Cpp, &READERS_CPP),
            "rs" => (Lang::Rust, &READERS_RUST),
            _ => continue,
        };
        checked += 1;
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let code = lex(&text, lang).code;
        let found: Vec<&str> = needles
            .iter()
            .copied()
            .filter(|n| contains_token(&code, n))
            .collect();
        if !found.is_empty() && !allowed.contains(&f) {
            let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
            offenders.push(format!("{rel}: {}", found.join(", ")));
        }
    }
    assert!(checked > 50, "only {checked} source files found");
    assert!(
        offenders.is_empty(),
        "only vendor/src/core/config.cpp and src/connector/config.rs may read the \
         environment; also reading it:\n  {}",
        offenders.join("\n  ")
    );
}

/// `needle` in `code`, not as the tail of a longer identifier.
fn contains_token(code: &str, needle: &str) -> bool {
    code.match_indices(needle)
        .any(|(i, _)| i == 0 || !is_ident(code.as_bytes()[i - 1]))
}

#[test]
fn the_lexer_ignores_comments_and_literals() {
    let cpp = lex(
        "// getenv(\"A_B\")\nint x = 1'000; auto s = R\"x(C_D)x\"; /* getenv */ f(\"E_F\", 'g');",
        Lang::Cpp,
    );
    assert_eq!(cpp.strings, ["C_D", "E_F"]);
    assert!(!contains_token(&cpp.code, "getenv"));
    let rs = lex(
        "fn f<'a>(x: &'a str) { let c = '\"'; g(r#\"H_I\"#, \"J_K\"); } // std::env::var",
        Lang::Rust,
    );
    assert_eq!(rs.strings, ["H_I", "J_K"]);
    assert!(!contains_token(&rs.code, "env::var"));
    assert!(contains_token("std::env::var(k)", "env::var"));
    assert!(!contains_token("my_getenv(k)", "getenv"));
    assert!(is_env_name("MC_GID_INDEX") && !is_env_name("WARN") && !is_env_name("Mc_X"));
}
