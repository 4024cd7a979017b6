"""Parses include/lnmlp.h into the facts the ABI and binding checkers compare (Python 3 stdlib only).

One job: turn the header's text into
  - functions: name -> (return type, [parameter types]) for every LNMLP_API prototype,
  - enums:     name -> int for every enumerator of every enum,
  - opaque:    the names of the opaque handle types (typedef struct X X;),
  - structs:   name -> [field declarations] of the structs passed by pointer (typedef struct X { .. } X;),
  - abi:       the value of #define LNMLP_ABI_VERSION.
Types are normalized ("const char *" -> "const char*") so that spacing, comments, line breaks
and parameter names never make two equal signatures look different.

It is a parser for this header's style (a C99 API header), not a general C parser: it strips
comments and preprocessor lines, then reads `LNMLP_API <type> <name>(<params>);` and
`enum [tag] { A = 1, B, ... };`. Anything it cannot read makes it raise, rather than silently
skip a declaration (a checker that misses a function would pass when it should fail).
"""

import re

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_PROTO = re.compile(r"\bLNMLP_API\s+([^;{}()]*?)\b(lnmlp_\w+)\s*\(([^()]*)\)\s*;")
_ENUM = re.compile(r"\benum\s*(\w*)\s*\{([^{}]*)\}\s*\w*\s*;")
_OPAQUE = re.compile(r"\btypedef\s+struct\s+(\w+)\s+(\w+)\s*;")
_STRUCT = re.compile(r"\btypedef\s+struct\s+(\w+)\s*\{([^{}]*)\}\s*(\w+)\s*;")
_ABI = re.compile(r"^[ \t]*#[ \t]*define[ \t]+LNMLP_ABI_VERSION[ \t]+(\d+)[ \t]*$", re.M)


class HeaderError(Exception):
    """The header has something the parser cannot read; the message says what."""


def strip_comments(text):
    # Comments become one space so that "int/*x*/y" does not glue tokens together.
    return _COMMENT.sub(" ", text)


def _drop_preprocessor(text):
    # Join continued lines first, then drop directives (#define LNMLP_API ... would otherwise
    # look like a prototype).
    text = re.sub(r"\\\n", " ", text)
    return "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("#"))


def normalize_type(t):
    """'const  char *' -> 'const char*'; 'lnmlp_desc * *' -> 'lnmlp_desc**'."""
    t = " ".join(t.split())
    t = re.sub(r"\s*\*\s*", "*", t)
    return t.strip()


def _split_param(p, fn):
    """'const float* in' -> 'const float*' (the name dropped; it is not part of the ABI)."""
    p = normalize_type(p)
    m = re.match(r"^(.*?[\s*])(\w+)$", p)
    if not m or not m.group(1).strip():
        # Prototypes in this header always name their parameters; an unnamed one would make
        # "int32_t" ambiguous between a type and a name, so refuse it.
        raise HeaderError(f"{fn}: cannot read parameter '{p}' (expected '<type> <name>')")
    return normalize_type(m.group(1))


def parse_functions(clean):
    funcs = {}
    for m in _PROTO.finditer(clean):
        ret, name, params = normalize_type(m.group(1)), m.group(2), m.group(3).strip()
        if not ret:
            raise HeaderError(f"{name}: no return type")
        if params in ("", "void"):
            ptypes = []
        else:
            ptypes = [_split_param(p, name) for p in params.split(",")]
        if name in funcs:
            raise HeaderError(f"{name} is declared twice")
        funcs[name] = (ret, ptypes)
    # Cross-check: every LNMLP_API must have produced a prototype (a missed one means the regex
    # failed on some new syntax, e.g. a function-pointer parameter).
    n_api = len(re.findall(r"\bLNMLP_API\b", clean))
    if n_api != len(funcs):
        raise HeaderError(f"found {n_api} LNMLP_API declarations but could read only {len(funcs)}")
    return funcs


def _int_literal(s, where):
    s = s.strip()
    m = re.fullmatch(r"([-+]?)\s*(0[xX][0-9a-fA-F]+|\d+)[uUlL]*", s)
    if not m:
        raise HeaderError(f"{where}: enumerator value '{s}' is not an integer literal")
    v = int(m.group(2), 0)
    return -v if m.group(1) == "-" else v


def parse_enums(clean):
    enums = {}
    for m in _ENUM.finditer(clean):
        nxt = 0  # C rule: an enumerator without a value is the previous one + 1 (first: 0)
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue  # a trailing comma
            name, _, value = item.partition("=")
            name = name.strip()
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise HeaderError(f"cannot read enumerator '{item}'")
            v = _int_literal(value, name) if value.strip() else nxt
            if name in enums:
                raise HeaderError(f"enumerator {name} is defined twice")
            enums[name] = v
            nxt = v + 1
    return enums


def parse_structs(clean):
    """{name: ['int32_t size', 'lnmlp_comm_fn all_gather', ...]} in declaration order."""
    structs = {}
    for tag, body, name in _STRUCT.findall(clean):
        if tag != name:
            raise HeaderError(f"struct {tag} is typedef'd as {name}; use one name")
        fields = [normalize_type(f) for f in body.split(";") if f.strip()]
        structs[name] = fields
    return structs


def parse_header(path):
    """Reads the header at `path`; returns dict(functions, enums, opaque, abi)."""
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    m = _ABI.search(strip_comments(raw))
    if not m:
        raise HeaderError(f"{path}: no '#define LNMLP_ABI_VERSION <n>'")
    clean = _drop_preprocessor(strip_comments(raw))
    return {
        "abi": int(m.group(1)),
        "functions": parse_functions(clean),
        "enums": parse_enums(clean),
        "opaque": sorted(a for a, b in _OPAQUE.findall(clean) if a == b),
        "structs": parse_structs(clean),
    }


# ---- the declarations with their names and documentation, for tools/gen_bindings.py ------------

_FNPTR = re.compile(r"\btypedef\s+([^;{}()]*?)\(\s*\*\s*(\w+)\s*\)\s*\(([^()]*)\)\s*;")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(LNMLP_\w+)[ \t]+\(?[ \t]*(-?\d+)[ \t]*\)?[ \t]*$", re.M)


def _mask(text):
    """text with every comment and preprocessor line blanked out, character for character, so
    that positions found in it are positions in the original."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    masked = _COMMENT.sub(blank, text)
    return re.sub(r"^[ \t]*#[^\n]*(?:\\\n[^\n]*)*", blank, masked, flags=re.M)


def _comment_text(c):
    """'/* a\n * b */' -> 'a\nb'."""
    body = c[2:-2] if c.startswith("/*") else c[2:]
    lines = [re.sub(r"^\s*\*? ?", "", l).rstrip() for l in body.split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def _doc_before(raw, pos):
    """The comment that ends right before pos (only white space between), or ''."""
    head = raw[:pos].rstrip()
    if not head.endswith("*/"):
        return ""
    start = head.rfind("/*")
    return _comment_text(head[start:]) if start >= 0 else ""


def _named_params(params, where):
    params = params.strip()
    if params in ("", "void"):
        return []
    out = []
    for p in params.split(","):
        p = normalize_type(p)
        m = re.match(r"^(.*?[\s*])(\w+)$", p)
        if not m or not m.group(1).strip():
            raise HeaderError(f"{where}: cannot read parameter '{p}' (expected '<type> <name>')")
        out.append((normalize_type(m.group(1)), m.group(2)))
    return out


# The experimental tier: everything between these two lines (include/lnmlp.h, "Two tiers").
_EXPERIMENTAL = re.compile(r"^[ \t]*#[ \t]*if[ \t]+defined\(LNMLP_EXPERIMENTAL\)[ \t]*\n(.*?)"
                           r"^[ \t]*#[ \t]*endif[ \t]*/\*[ \t]*LNMLP_EXPERIMENTAL[ \t]*\*/", re.S | re.M)
_SINCE = re.compile(r"@since[ \t]+(\d+)\.(\d+)\b")
_PARAM_TAG = re.compile(r"@param\[(in|out|in,out)\][ \t]+(\w+(?:[ \t]*,[ \t]*\w+)*)")


def _tags(doc, params, where):
    """The @since version and the per-parameter directions of a declaration's comment, checked:
    exactly one @since, every parameter tagged exactly once, and [in] for every parameter C lets
    the callee only read (a value or a pointer to const)."""
    since = _SINCE.findall(doc)
    if len(since) != 1:
        raise HeaderError(f"{where}: its comment needs exactly one '@since X.Y', found {len(since)}")
    dirs = {}
    for kind, names in _PARAM_TAG.findall(doc):
        for n in re.split(r"[ \t]*,[ \t]*", names.strip()):
            if n in dirs:
                raise HeaderError(f"{where}: parameter '{n}' is tagged twice")
            dirs[n] = kind
    names = [n for _, n in params]
    if set(dirs) != set(names):
        missing, extra = sorted(set(names) - set(dirs)), sorted(set(dirs) - set(names))
        raise HeaderError(f"{where}: @param tags do not match the parameters"
                          + (f"; untagged: {', '.join(missing)}" if missing else "")
                          + (f"; not parameters: {', '.join(extra)}" if extra else ""))
    for t, n in params:
        read_only = "*" not in t or t.startswith("const ") and t.count("*") == 1
        if read_only and dirs[n] != "in":
            raise HeaderError(f"{where}: parameter '{n}' ({t}) can only be read, so it must be @param[in]")
    return {"since": tuple(int(v) for v in since[0]), "params": dirs}


def parse_api(path):
    """The header's declarations in order, with names and documentation: dict(defines,
    enumerators [(name, value, doc)], functions {name: (ret, [(type, name)])}, opaque, fnptrs
    {name: (ret, [(type, name)])}, structs {name: [(type, name)]}, docs {name: text},
    tags {function or fnptr: {since: (major, minor), params: {name: "in"|"out"|"in,out"}}},
    experimental: the names declared in the experimental tier)."""
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    masked = _mask(raw)
    tiers = [(m.start(1), m.end(1)) for m in _EXPERIMENTAL.finditer(raw)]
    if len(tiers) != len(re.findall(r"LNMLP_EXPERIMENTAL\)", raw)):
        raise HeaderError("every '#if defined(LNMLP_EXPERIMENTAL)' needs its '#endif /* LNMLP_EXPERIMENTAL */'")

    def experimental(pos):
        return any(a <= pos < b for a, b in tiers)

    in_tier = set()
    docs = {}
    defines = [(n, int(v)) for n, v in _DEFINE.findall(raw)]
    for n, _ in defines:
        m = re.search(r"#[ \t]*define[ \t]+" + n + r"\b", raw)
        docs[n] = _doc_before(raw, m.start())

    enumerators = []
    for m in _ENUM.finditer(masked):
        nxt = 0
        body_start = m.start(2)
        items = list(re.finditer(r"([A-Za-z_]\w*)\s*(?:=\s*([^,]+?))?\s*(?:,|$)", m.group(2)))
        for i, it in enumerate(items):
            name = it.group(1)
            if experimental(m.start()):
                in_tier.add(name)
            value = _int_literal(it.group(2), name) if it.group(2) else nxt
            nxt = value + 1
            # Its comment: the first one after it and before the next enumerator.
            end = body_start + (items[i + 1].start() if i + 1 < len(items) else len(m.group(2)))
            after = it.end(2) if it.group(2) else it.end(1)
            seg = raw[body_start + after: end]
            c = re.search(r"/\*.*?\*/", seg, re.S)
            enumerators.append((name, value, _comment_text(c.group(0)) if c else ""))

    tags = {}

    def declarations(pattern):
        # name -> (return type, parameters) of the functions (or function pointer types) the
        # pattern finds, with each one's doc comment, tags and tier recorded.
        found = {}
        for m in pattern.finditer(masked):
            name = m.group(2)
            found[name] = (normalize_type(m.group(1)), _named_params(m.group(3), name))
            docs[name] = _doc_before(raw, m.start())
            tags[name] = _tags(docs[name], found[name][1], name)
            if experimental(m.start()):
                in_tier.add(name)
        return found

    functions = declarations(_PROTO)
    n_api = len(re.findall(r"\bLNMLP_API\b", masked))
    if n_api != len(functions):
        raise HeaderError(f"found {n_api} LNMLP_API declarations but could read only {len(functions)}")
    fnptrs = declarations(_FNPTR)
    structs = {}
    for m in _STRUCT.finditer(masked):
        fields = []
        for f in m.group(2).split(";"):
            if f.strip():
                t, n = _named_params(f, m.group(3))[0]
                fields.append((t, n))
        structs[m.group(3)] = fields
        docs[m.group(3)] = _doc_before(raw, m.start())
        if experimental(m.start()):
            in_tier.add(m.group(3))
    opaque = []
    for m in _OPAQUE.finditer(masked):
        if m.group(1) == m.group(2):
            opaque.append(m.group(1))
            if experimental(m.start()):
                in_tier.add(m.group(1))
    return {"defines": defines, "enumerators": enumerators, "functions": functions, "opaque": opaque,
            "fnptrs": fnptrs, "structs": structs, "docs": docs, "tags": tags, "experimental": in_tier}
