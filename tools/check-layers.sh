#!/usr/bin/env bash
# Keeps the library's imports pointing down and its files short (DESIGN.md: "wire <- proto
# <- transport -> reactor; the reactor knows no protocol type (the buffers it moves live in
# a neutral module); config for a layer lives with that layer").
#
# Usage: tools/check-layers.sh      (from anywhere; checks src/ of this tree)
#
# Fails (exit 1), naming file:line, on
#   - a file under src/ longer than 1,500 lines;
#   - a reference from a layer to a module it must not know, by `use crate::X`, a path
#     `crate::X::..` in code, or `super::` climbing out of the layer (resolved against the
#     file's module and the inline modules around the line). Comments, doc comments and
#     string literals are not code. Test modules follow the same rule: a test that needs
#     an upper layer lives in tests/ or is one of the EXCEPTIONS below.
#
#   files                       must not reach
#   src/wire.rs                 buf proto reactor transport wireup config
#   src/buf.rs, src/buf/        proto reactor transport wireup config
#   src/proto/                  reactor transport wireup config
#   src/reactor/                wire proto transport wireup config
#   src/wireup/                 reactor transport config
# (config = src/config.rs, the table that gathers every layer's settings; transport.rs,
# config.rs, lib.rs and the shared helpers auth, error, param are not checked.)
set -euo pipefail
cd "$(dirname "$0")/.."

exec python3 - <<'EOF'
import bisect, pathlib, re, sys

MAX_LINES = 1500
UP = {"proto", "reactor", "transport", "wireup", "config"}
RULES = [  # (path prefix, forbidden top-level modules)
    ("src/wire.rs", UP | {"buf"}),
    ("src/buf.rs", UP),
    ("src/buf/", UP),
    ("src/proto/", UP - {"proto"}),
    ("src/reactor/", (UP - {"reactor"}) | {"wire"}),
    ("src/wireup/", {"reactor", "transport", "config"}),
]
# (file, module it may reach): keep this list minimal, each with its reason.
EXCEPTIONS = {
    # The backends' conformance suite (compiled for tests only, `#[cfg(test)] mod
    # conformance`) writes frame headers and reads what a backend received with the
    # protocol's deframer, as the transport does.
    ("src/reactor/conformance.rs", "proto"),
    ("src/reactor/conformance.rs", "wire"),
}

def code_only(text):
    """text with comments, string and char literals blanked; newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j): depth, j = depth + 1, j + 2
                elif text.startswith("*/", j): depth, j = depth - 1, j + 2
                else: j += 1
            out.append("\n" * text.count("\n", i, j)); i = j
        elif c in "br" and (m := re.match(r'b?r(#*)"', text[i:i + 8])) \
                and not re.match(r"\w", text[i - 1:i]):
            end = text.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, j)); i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j)); i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])):
            out.append("' '"); i += m.end()
        else:
            out.append(c); i += 1
    return "".join(out)

def module_of(path):
    parts = list(pathlib.PurePath(path).relative_to("src").with_suffix("").parts)
    return parts[:-1] if parts[-1] in ("mod", "lib") else parts

def group_heads(text, i):
    """The first name of each item of the use-group `{..}` opening at text[i]."""
    heads, depth, item = [], 0, ""
    for c in text[i:]:
        depth += (c == "{") - (c == "}")
        if depth == 1 and c not in "{,":
            item += c
        elif depth <= 1:  # an item ends (or the group does)
            if m := re.match(r"\s*(\w+)", item):
                heads.append(m.group(1))
            item = ""
        if depth == 0:
            break
    return heads

bad = []
for f in sorted(pathlib.Path("src").rglob("*.rs")):
    path = f.as_posix()
    text = f.read_text()
    raw = text.split("\n")
    lines = text.count("\n") + (not text.endswith("\n"))
    if lines > MAX_LINES:
        bad.append(f"{path}:{MAX_LINES + 1}: {lines} lines, over the limit of {MAX_LINES}"
                   " (split the file)")
    forbidden = next((r for p, r in RULES if path == p or p.endswith("/") and path.startswith(p)),
                     None)
    if forbidden is None:
        continue
    code = code_only(text)
    # The module path at each line: the file's, and the inline `mod x { .. }` around it.
    base, mods_at, inline, depth = module_of(path), [], [], 0
    for line in code.split("\n"):
        mods_at.append(base + [name for name, _ in inline])
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{|[{}]", line):
            if m.group(0) != "}":
                depth += 1
                if m.group(1):
                    inline.append((m.group(1), depth))
            else:
                if inline and inline[-1][1] == depth:
                    inline.pop()
                depth -= 1
    starts = [m.end() for m in re.finditer("\n", code)]
    line_of = lambda pos: bisect.bisect_right(starts, pos) + 1
    found = []  # (line, top-level module reached)
    for m in re.finditer(r"(?<![\w:])\$?crate::(\{|\w+)", code):
        no = line_of(m.start())
        tops = group_heads(code, m.start(1)) if m.group(1) == "{" else [m.group(1)]
        found += [(no, t) for t in tops]
    for m in re.finditer(r"(?<![\w:])((?:super::)+)(\w+)", code):
        no = line_of(m.start())
        mods, k = mods_at[no - 1], m.group(1).count("super::")
        if k <= len(mods):
            found.append((no, (mods[:len(mods) - k] + [m.group(2)])[0]))
    for no, top in sorted(set(found)):
        if top in forbidden and (path, top) not in EXCEPTIONS:
            bad.append(f"{path}:{no}: reaches {top}, which the {base[0]} layer must not:"
                       f" {raw[no - 1].strip()}")
for b in bad:
    print(b)
if bad:
    print(f"check-layers: {len(bad)} problem(s); see the head of tools/check-layers.sh",
          file=sys.stderr)
    sys.exit(1)
print("check-layers: imports point down, every file under src/ has at most "
      f"{MAX_LINES} lines")
EOF
