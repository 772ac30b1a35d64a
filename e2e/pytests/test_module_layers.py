"""Arrows between a crate's modules point one way: no import circle among its layers.

A module is a top-level file or folder under src/ (for a folder named in `split`, each of its
submodules too). An edge is a `crate::`, `super::`, `self::` or child-module path in code,
`use` lines included; comments, strings and test code (`#[cfg(test)]` items, `tests.rs`,
`tests/` folders) are left out, since tests may import upward.
"""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# (src folder, folders whose submodules are modules of their own).
CRATES = [
    ("device-plugin/src", ("plugin", "rm", "metrics")),
    ("api/src", ()),
    ("operator/src", ("plan", "runtime", "model", "state", "writes", "observe", "progress", "build")),
]

CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
VISIBILITY_IN = re.compile(r"pub\s*\(\s*in\s+[\w:]+\s*\)")
USE = re.compile(r"\buse\s+([^;]+);")
MOD_DECL = re.compile(r"\bmod\s+(\w+)\s*;")
PATH = re.compile(r"(?<![\w:])((?:crate|super|self|[a-z_]\w*)(?:\s*::\s*\w+)+)")
REEXPORT = re.compile(r"\bpub(?:\s*\([^)]*\))?\s+use\s+([^;]+);")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"b?'(\\.[^']*|[^\\'])'")


def prev_is_word(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def blank_comments_and_strings(text):
    """The text with comments, strings and char literals as spaces; newlines are kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c not in "/\"'rb":
            out.append(c)
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                depth += text.startswith("/*", j) - text.startswith("*/", j)
                j += 2 if text.startswith(("/*", "*/"), j) else 1
        elif (raw := RAW_STRING.match(text, i)) and not prev_is_word(text, i):
            end = '"' + raw.group(1)
            j = text.find(end, raw.end())
            j = n if j < 0 else j + len(end)
        elif c == '"' or (text.startswith('b"', i) and not prev_is_word(text, i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif (char := CHAR.match(text, i)) and not prev_is_word(text, i):
            j = char.end()
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def item_end(code, start):
    """Where the item starting at `start` ends: after its `;`, `,` or closing brace."""
    depth = 0
    for i in range(start, len(code)):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return i
            if depth == 0 and c == "}":
                return i + 1
        elif c in ";," and depth == 0:
            return i + 1
    return len(code)


def strip_test_items(code):
    """The code without `#[cfg(test)]` items, and the names of the modules they declare."""
    test_mods = set()
    while m := CFG_TEST.search(code):
        end = item_end(code, m.end())
        if decl := MOD_DECL.search(code[m.end():end]):
            test_mods.add(decl.group(1))
        code = code[:m.start()] + re.sub(r"[^\n]", " ", code[m.start():end]) + code[end:]
    return code, test_mods


def expand_use(tree):
    """`a::{b, c::{d, e}}` as the paths it names: `a::b`, `a::c::d`, `a::c::e`."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [re.sub(r"\bas\w+$", "", tree)]
    head, rest = tree.split("{", 1)
    inner, depth, parts, cur = rest[:rest.rfind("}")], 0, [], ""
    for c in inner:
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [head + p for part in parts if part for p in expand_use(part)]


class Crate:
    def __init__(self, src, split=()):
        self.src = pathlib.Path(src)
        self.split = set(split)
        self.files = {}  # module path (tuple) -> cleaned code
        self.reexports = {}  # module path -> {name: full path}
        test_mods = set()
        for file in sorted(self.src.rglob("*.rs")):
            rel = file.relative_to(self.src).with_suffix("").parts
            if rel[0] in ("bin", "main") or "tests" in rel:
                continue
            path = rel[:-1] if rel[-1] in ("mod", "lib") else rel
            code, tests = strip_test_items(blank_comments_and_strings(file.read_text()))
            code = VISIBILITY_IN.sub(lambda m: " " * len(m.group()), code)
            self.files[path] = code
            test_mods |= {path + (name,) for name in tests}
            self.reexports[path] = {
                p.split("::")[-1]: p for m in REEXPORT.finditer(code)
                for p in expand_use(m.group(1))
            }
        self.files = {
            p: c for p, c in self.files.items()
            if not any(p[:k] in test_mods for k in range(1, len(p) + 1))
        }

    def is_module(self, path):
        return tuple(path) in self.files

    def node(self, path):
        """The layer a module path belongs to."""
        if not path:
            return None
        if path[0] in self.split and len(path) > 1:
            return "::".join(path[:2])
        return path[0]

    def resolve(self, here, segments, seen=0):
        """The module a path used in module `here` names, or None (outside the crate)."""
        first, rest = segments[0], segments[1:]
        if first == "crate":
            base = ()
        elif first == "self":
            base = here
        elif first == "super":
            base = here[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        elif self.is_module(here + (first,)):
            base, rest = here + (first,), rest
        else:
            return None
        module = base
        for seg in rest:
            if self.is_module(module + (seg,)):
                module += (seg,)
                continue
            target = self.reexports.get(module, {}).get(seg)
            if target and seen < 8 and target.split("::")[0] != "std":
                found = self.resolve(module, target.split("::"), seen + 1)
                return found if found is not None else module
            break
        return module

    def edges(self):
        """{(from layer, to layer): "file:line path"} for each arrow between two layers."""
        found = {}
        for here, code in self.files.items():
            src = self.node(here)
            paths = [(m.start(), p) for m in USE.finditer(code) for p in expand_use(m.group(1))]
            # Paths in code, the `use` items aside (their trees are expanded above: a bare
            # `super::super` before `::{a, b}` names no module of its own).
            body = USE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), code)
            paths += [(m.start(), re.sub(r"\s", "", m.group(1))) for m in PATH.finditer(body)]
            for at, path in paths:
                target = self.resolve(here, path.split("::"))
                dst = self.node(target) if target is not None else None
                if src and dst and src != dst and (src, dst) not in found:
                    line = code.count("\n", 0, at) + 1
                    name = "/".join(here) or "lib"
                    found[(src, dst)] = f"{name}:{line} {path}"
        return found


def cycles(edges):
    """Each group of layers that reach each other, with its shortest circle."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [(shortest_circle(graph, group), group) for group in groups]


def shortest_circle(graph, group):
    """The shortest circle through the group's first layer, staying inside the group."""
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & group):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return sorted(group)


def check_crate(src, split=()):
    """The crate's import circles, each written as `a -> b -> a` with the line of each arrow."""
    edges = Crate(ROOT / src, split).edges()
    found = []
    for circle, group in cycles(edges):
        others = sorted(group - set(circle))
        found.append(
            " -> ".join(circle)
            + (f" (and {', '.join(others)} in the same circle)" if others else "")
            + "".join(f"\n    {a} -> {b}: {edges[(a, b)]}" for a, b in zip(circle, circle[1:]))
        )
    return found


@pytest.mark.parametrize("src,split", CRATES, ids=[src for src, _ in CRATES])
def test_no_import_circle_among_a_crates_modules(src, split):
    found = check_crate(src, split)
    assert not found, f"{src} has import circles:\n" + "\n".join(found)


def write_tree(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checker_names_a_circle_and_ignores_tests_comments_and_strings(tmp_path):
    write_tree(tmp_path, {
        "lib.rs": "mod a;\nmod b;\nmod c;\npub use a::A;\n",
        "a.rs": "use crate::b::B;\n// crate::c::C\nconst S: &str = \"crate::c\";\n",
        "b/mod.rs": "mod inner;\npub struct B;\n",
        "b/inner.rs": "use super::super::c::{self, C};\n",
        "b/tests.rs": "use crate::a::A;\n",
        "c.rs": "pub struct C;\nfn f() { crate::A::new(); }\n"
                "#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
    })
    found = check_crate(tmp_path)
    assert len(found) == 1
    assert found[0].startswith("a -> b -> c -> a\n"), found[0]
    assert "c -> a: c:2 crate::A::new" in found[0]
    (tmp_path / "c.rs").write_text("pub struct C;\n")
    assert check_crate(tmp_path) == []


def test_the_submodules_of_a_split_folder_are_layers_of_their_own(tmp_path):
    write_tree(tmp_path, {
        "plan/mod.rs": "mod round;\nmod view;\npub use view::View;\n",
        "plan/round.rs": "use super::View;\n",
        "plan/view.rs": "fn f() { super::round::go(); }\n",
    })
    assert check_crate(tmp_path) == []
    assert check_crate(tmp_path, split=("plan",)) == [
        "plan::round -> plan::view -> plan::round"
        "\n    plan::round -> plan::view: plan/round:1 super::View"
        "\n    plan::view -> plan::round: plan/view:1 super::round::go"
    ]
