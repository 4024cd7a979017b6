//! Compares the hand-written declarations of `src/lib.rs` with `include/lnmlp.h`, mechanically:
//! every function of the header is declared with the same parameter and return types (mapped
//! to Rust), every enum value and numeric `#define` is a constant with the same value, every
//! typedef has a Rust type, and nothing is declared here that the header does not have.
//!
//! Skipped (with a note) where the header is not at `../../../include/lnmlp.h` (a packaged crate).
use std::collections::BTreeMap;
use std::path::Path;

/// The text without `/* */` and `//` comments.
fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"/*") {
            let end = s[i + 2..].find("*/").expect("unterminated comment") + i + 4;
            out.push(' ');
            i = end;
        } else if b[i..].starts_with(b"//") {
            i += s[i..].find('\n').unwrap_or(s.len() - i);
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A C type (`const void*`, `lnmlp_plan**`, `int32_t`) as the Rust type it must be declared as.
fn c_type_to_rust(c: &str) -> String {
    let c = squash(&c.replace('*', " * "));
    let mut toks: Vec<&str> = c.split(' ').collect();
    let stars = toks.iter().filter(|t| **t == "*").count();
    toks.retain(|t| *t != "*");
    let is_const = toks.first() == Some(&"const");
    toks.retain(|t| *t != "const");
    assert_eq!(toks.len(), 1, "unexpected C type {c:?}");
    let base = match toks[0] {
        "int32_t" => "i32",
        "int64_t" => "i64",
        "uint8_t" => "u8",
        "float" => "f32",
        "char" => "c_char",
        "void" => "c_void",
        other => other,
    };
    let mut t = base.to_string();
    for k in 0..stars {
        // the innermost pointer carries the leading const; the outer ones are mutable
        t = format!("{} {t}", if k == 0 && is_const { "*const" } else { "*mut" });
    }
    t
}

/// Splits a parameter list at top-level commas.
fn split_params(p: &str) -> Vec<String> {
    let (mut out, mut depth, mut cur) = (Vec::new(), 0i32, String::new());
    for ch in p.chars() {
        match ch {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(squash(&cur));
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !squash(&cur).is_empty() {
        out.push(squash(&cur));
    }
    out
}

/// (parameter types, return type) of every function.
type Sigs = BTreeMap<String, (Vec<String>, String)>;

fn header_functions(h: &str) -> Sigs {
    let mut out = Sigs::new();
    // without the preprocessor lines (LNMLP_API's own definitions)
    let h: String = h.lines().filter(|l| !l.trim_start().starts_with('#')).map(|l| format!("{l}\n")).collect();
    for decl in h.split("LNMLP_API").skip(1) {
        let decl = &decl[..decl.find(';').expect("a declaration ends with ;")];
        let open = decl.find('(').unwrap();
        let head = squash(&decl[..open]);
        let name = head.rsplit([' ', '*']).next().unwrap();
        let ret = squash(&head[..head.len() - name.len()]);
        assert!(!ret.is_empty(), "{head}");
        let params = &decl[open + 1..decl.rfind(')').unwrap()];
        let types: Vec<String> =
            split_params(params).into_iter().filter(|p| p != "void").map(|p| c_decl_type(&p)).collect();
        out.insert(name.to_string(), (types, c_type_to_rust(&ret)));
    }
    out
}

fn rust_functions(r: &str) -> Sigs {
    let mut out = Sigs::new();
    let block = &r[r.find("extern \"C\" {").expect("an extern block")..];
    for part in block.split("pub fn ").skip(1) {
        let decl = squash(&part[..part.find(';').unwrap()]);
        let open = decl.find('(').unwrap();
        let name = decl[..open].trim().to_string();
        let mut depth = 0;
        let mut close = 0;
        for (i, ch) in decl.char_indices().skip(open) {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let types = split_params(&decl[open + 1..close])
            .into_iter()
            .map(|p| squash(p.split_once(':').unwrap_or_else(|| panic!("{name}: {p:?}")).1))
            .collect();
        let ret = decl[close + 1..].trim().strip_prefix("->").map(squash).unwrap_or_else(|| "()".into());
        out.insert(name, (types, ret));
    }
    out
}

fn parse_int(v: &str) -> i64 {
    let v = v.trim().trim_start_matches('(').trim_end_matches(')').trim();
    v.parse().unwrap_or_else(|_| panic!("not an integer: {v:?}"))
}

/// Every enum value and numeric `#define` of the header.
fn header_constants(h: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in h.lines() {
        let l = squash(line);
        if let Some(rest) = l.strip_prefix("#define ") {
            if let Some((name, value)) = rest.split_once(' ') {
                if name.starts_with("LNMLP_")
                    && value.trim_start_matches(['(', '-']).starts_with(|c: char| c.is_ascii_digit())
                {
                    out.insert(name.to_string(), parse_int(value));
                }
            }
        }
    }
    for body in h.split("enum").skip(1) {
        let body = body.trim_start();
        if !body.starts_with('{') {
            continue;
        }
        let body = &body[1..body.find('}').unwrap()];
        let mut next = 0i64;
        for item in split_params(body) {
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n.trim().to_string(), parse_int(v)),
                None => (item.trim().to_string(), next),
            };
            next = value + 1;
            assert!(out.insert(name.clone(), value).is_none(), "{name} defined twice");
        }
    }
    out
}

fn rust_constants(r: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in r.lines() {
        if let Some(rest) = squash(line).strip_prefix("pub const ") {
            let (name, rest) = rest.split_once(':').unwrap();
            let value = rest.split_once('=').unwrap().1.trim_end_matches(';');
            out.insert(name.trim().to_string(), parse_int(value));
        }
    }
    out
}

/// A C declaration `type name` (a parameter or a field) as its Rust type.
fn c_decl_type(d: &str) -> String {
    let d = squash(&d.replace('*', " * "));
    let (ty, _name) = d.rsplit_once(' ').unwrap_or_else(|| panic!("declaration {d:?}"));
    c_type_to_rust(ty)
}

/// The typedefs: opaque structs (`None`), a struct with fields (their Rust types, in order) and
/// function pointers (their Rust type, `Option<unsafe extern "C" fn(..) -> ..>`).
enum Typedef {
    Opaque,
    Fields(Vec<String>),
    FnPtr(String),
}

fn header_typedefs(h: &str) -> BTreeMap<String, Typedef> {
    let mut out = BTreeMap::new();
    for part in h.split("typedef").skip(1) {
        let part = squash(part);
        let decl = &part[..part.find(';').unwrap()];
        let has_body = part.find('{').is_some_and(|b| b < part.find(';').unwrap());
        if has_body {
            // typedef struct tag { fields } name;
            let (open, close) = (part.find('{').unwrap(), part.find('}').unwrap());
            let fields = part[open + 1..close].split(';').filter(|f| !f.trim().is_empty()).map(c_decl_type).collect();
            let name = part[close + 1..part[close..].find(';').unwrap() + close].trim().to_string();
            out.insert(name, Typedef::Fields(fields));
        } else if let Some(p) = decl.find("(*") {
            // typedef R (*name)(params);
            let close = decl[p..].find(')').unwrap() + p;
            let name = decl[p + 2..close].trim().to_string();
            let ret = c_type_to_rust(&decl[..p]);
            let params = &decl[decl[close..].find('(').unwrap() + close + 1..decl.rfind(')').unwrap()];
            let types: Vec<String> = split_params(params).iter().map(|p| c_decl_type(p)).collect();
            out.insert(name, Typedef::FnPtr(format!("Option<unsafe extern \"C\" fn({}) -> {ret}>", types.join(", "))));
        } else {
            // typedef struct tag name;
            out.insert(decl.rsplit(' ').next().unwrap().to_string(), Typedef::Opaque);
        }
    }
    out
}

/// The Rust declaration of a type: `pub struct name { .. }` or `pub type name = ..;`, squashed.
fn rust_type_decl(r: &str, name: &str) -> Option<String> {
    let r = squash(r);
    if let Some(p) = r.find(&format!("pub struct {name} {{")) {
        let body = &r[p..];
        return Some(body[..body.find('}').unwrap() + 1].to_string());
    }
    let p = r.find(&format!("pub type {name} ="))?;
    let body = &r[p..];
    Some(body[..body.find(';').unwrap()].to_string())
}

fn check_typedef(r: &str, name: &str, t: &Typedef) -> Option<String> {
    let Some(decl) = rust_type_decl(r, name) else {
        return Some(format!("type {name} is not declared"));
    };
    match t {
        Typedef::Opaque => (!decl.starts_with("pub struct")).then(|| format!("{name} must be an opaque struct")),
        Typedef::Fields(want) => {
            let body = &decl[decl.find('{').unwrap() + 1..decl.len() - 1];
            let got: Vec<String> = split_params(body).iter().map(|f| squash(f.split_once(':').unwrap().1)).collect();
            (&got != want).then(|| format!("struct {name}: header fields {want:?}, lib.rs {got:?}"))
        }
        Typedef::FnPtr(want) => {
            let got = squash(decl.split_once('=').unwrap().1);
            (got.replace(' ', "") != want.replace(' ', "")).then(|| format!("type {name}: header {want}, lib.rs {got}"))
        }
    }
}

#[test]
fn declarations_match_the_header() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = root.join("../../../include/lnmlp.h");
    let Ok(h) = std::fs::read_to_string(&header) else {
        eprintln!("skipped: {} not found", header.display());
        return;
    };
    let h = strip_comments(&h);
    let r = strip_comments(&std::fs::read_to_string(root.join("src/lib.rs")).unwrap());

    let (hf, rf) = (header_functions(&h), rust_functions(&r));
    assert!(hf.len() > 40, "parsed only {} functions of the header", hf.len());
    let mut problems = Vec::new();
    for (name, sig) in &hf {
        match rf.get(name) {
            None => problems.push(format!("function {name} is not declared")),
            Some(r) if r != sig => problems.push(format!("function {name}: header {sig:?}, lib.rs {r:?}")),
            Some(_) => {}
        }
    }
    problems.extend(rf.keys().filter(|n| !hf.contains_key(*n)).map(|n| format!("function {n} is not in the header")));

    let (hc, rc) = (header_constants(&h), rust_constants(&r));
    assert!(hc.len() > 90, "parsed only {} constants of the header", hc.len());
    for (name, v) in &hc {
        match rc.get(name) {
            None => problems.push(format!("constant {name} = {v} is not declared")),
            Some(r) if r != v => problems.push(format!("constant {name}: header {v}, lib.rs {r}")),
            Some(_) => {}
        }
    }
    problems.extend(rc.keys().filter(|n| !hc.contains_key(*n)).map(|n| format!("constant {n} is not in the header")));

    let types = header_typedefs(&h);
    assert!(types.len() >= 5, "parsed only {} typedefs of the header", types.len());
    problems.extend(types.iter().filter_map(|(name, t)| check_typedef(&r, name, t)));
    assert!(problems.is_empty(), "lnmlp-sys differs from include/lnmlp.h:\n  {}", problems.join("\n  "));
    eprintln!(
        "checked {} functions, {} constants and {} types against {}",
        hf.len(),
        hc.len(),
        types.len(),
        header.display()
    );
}
