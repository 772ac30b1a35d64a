"""The front door stays true: links resolve, the README's figures come from the measured
tables, the README stays short with the two commands up front, and no page names the machine
it was written on.

- every relative link in README.md, docs/*.md and charts/trainyard/README.md names a file
  that exists and, with a #fragment, a heading of it (GitHub's slugs);
- every figure with a unit in README.md's prose (seconds, minutes, GiB/MiB/KiB, %, ×) is in
  a table row of docs/benchmarks.md or docs/reliability.md, or its line says where it comes
  from with an HTML comment `<!-- source: ... -->`;
- README.md has at most 150 lines, and `make demo` and `make test` first appear within its
  first 40;
- no page says "this 2-core machine", "the sandbox", a kernel version string or an issue
  number.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts" / "trainyard" / "README.md"]
TABLE_SOURCES = [ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "reliability.md"]
MAX_README_LINES = 150
COMMANDS_BY_LINE = 40

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FIGURE = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:\s?(s|ms|µs|min|minutes|seconds|GiB|MiB|KiB|GB|MB|%)|(×))(?![\w])"
)
SOURCE = re.compile(r"<!--\s*source:[^>]*-->")
FORBIDDEN = {
    "names the machine": re.compile(r"\bthis \d+[- ]core machine\b", re.I),
    "names the sandbox": re.compile(r"\bthe sandbox\b", re.I),
    "a kernel version string": re.compile(r"\b[2-6]\.\d+\.\d+-[0-9A-Za-z][\w.+-]*"),
    "an issue number": re.compile(r"\bissues? #?\d+\b", re.I),
}


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def without_code_spans(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lower case, punctuation
    dropped (letters, digits, _, - and spaces kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    links = []
    for number, line in prose_lines(path):
        for target in LINK.findall(without_code_spans(line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            links.append((number, target))
    return links


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves_to_a_file_and_a_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_knows_githubs_slugs() -> None:
    assert slug("Protections by Kubernetes version, and what is tested") == (
        "protections-by-kubernetes-version-and-what-is-tested"
    )
    assert slug("Images: stand-ins and the real thing") == "images-stand-ins-and-the-real-thing"
    assert slug("`make demo`: what it shows") == "make-demo-what-it-shows"
    assert slug("In-place restarts: the supervisor") == "in-place-restarts-the-supervisor"
    assert slug("What did spot save me?") == "what-did-spot-save-me"


def measured_rows() -> list[str]:
    return [line for path in TABLE_SOURCES for line in path.read_text().splitlines() if line.startswith("|")]


def figures(line: str) -> list[tuple[str, str]]:
    """(number, unit) of every figure with a unit in a line of prose."""
    return [(whole + (frac or ""), unit or times) for whole, frac, unit, times in FIGURE.findall(line)]


def in_a_row(number: str, unit: str, rows: list[str]) -> bool:
    spellings = {number, number.replace(",", "")}
    if len(number.replace(",", "").split(".")[0]) > 3:
        whole, _, frac = number.replace(",", "").partition(".")
        spellings.add(f"{int(whole):,}" + (f".{frac}" if frac else ""))
    unit_spellings = {"minutes": ("min",), "seconds": ("s",)}.get(unit, ()) + (unit,)
    # The number, then its unit later in the same cell ("8.8, 11.0; 8.2 s" holds 11.0 s).
    units = "|".join(re.escape(u) for u in unit_spellings)
    for row in rows:
        for cell in row.split("|"):
            for s in spellings:
                if re.search(rf"(?<![\w.,]){re.escape(s)}(?![\d])(?:[^|]*?\d)?\s?(?:{units})(?![\w])", cell):
                    return True
    return False


def unsourced_figures(path: Path, rows: list[str]) -> list[str]:
    out = []
    for number, line in prose_lines(path):
        if SOURCE.search(line):
            continue
        for value, unit in figures(without_code_spans(line)):
            if not in_a_row(value, unit, rows):
                out.append(f"{path.relative_to(ROOT)}:{number}: {value} {unit}")
    return out


def test_every_figure_in_the_readme_comes_from_a_measured_table() -> None:
    assert unsourced_figures(README, measured_rows()) == []


def test_the_figure_check_finds_figures_and_their_rows() -> None:
    rows = ["| 1000 jobs | 62.5 MiB met | 2,051 s | 0.32, 0.23 |", "| x | 96.0% | 1.25× |"]
    assert figures("peak 62.5 MiB, 2,051 s, 96.0%, 1.25× faster, 3 GPUs, 1.20") == [
        ("62.5", "MiB"), ("2,051", "s"), ("96.0", "%"), ("1.25", "×")
    ]
    assert in_a_row("62.5", "MiB", rows) and in_a_row("2051", "s", rows) and in_a_row("96.0", "%", rows)
    assert not in_a_row("62.5", "s", rows) and not in_a_row("2.5", "MiB", rows) and not in_a_row("19.7", "s", rows)


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; at most {MAX_README_LINES}"
    for command in ("make demo", "make test"):
        first = next((n for n, line in enumerate(lines, start=1) if command in line), None)
        assert first is not None and first <= COMMANDS_BY_LINE, f"`{command}` first appears on line {first}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_page_names_the_machine_it_was_written_on(page: Path) -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {what}: {m.group(0)!r}"
        for n, line in enumerate(page.read_text().splitlines(), start=1)
        for what, pattern in FORBIDDEN.items()
        if (m := pattern.search(line))
    ]
    assert found == []


def test_the_machine_check_catches_what_it_is_for() -> None:
    caught = [
        "make test took 35 minutes on this 2-core machine",
        "containerd needs it: the sandbox lacks CAP_SYS_RESOURCE",
        "on Linux 6.18.44-fc-v669",
        "as issue 26 asked",
        "see issue #61",
    ]
    for line in caught:
        assert any(p.search(line) for p in FORBIDDEN.values()), line
    for line in ["driver 550.54.15", "Kubernetes 1.20.2", "the pod sandbox image", "kubernetes/kubernetes#121793"]:
        assert not any(p.search(line) for p in FORBIDDEN.values()), line
