"""bench/results/ holds what docs/RESULTS.md cites; the archive's index lists every archived file."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
pytestmark = pytest.mark.unit


def _docs_text():
    return "".join(p.read_text(encoding="utf-8") for p in [*ROOT.glob("docs/*.md"), ROOT / "README.md"])


def test_every_result_file_the_docs_cite_exists():
    cited = set(re.findall(r"bench/results/((?:archive/)?[A-Za-z0-9_.\-]+\.(?:json|log|txt))", _docs_text()))
    missing = sorted(c for c in cited if not (RESULTS / c).is_file())
    assert not missing, f"docs cite result files that are not there: {missing}"


def test_archive_index_lists_exactly_the_archived_files():
    archive = RESULTS / "archive"
    files = {p.name for p in archive.iterdir() if p.is_file() and p.name != "INDEX.md"}
    indexed = set(re.findall(r"^\| `([^`]+)` \|", (archive / "INDEX.md").read_text(encoding="utf-8"), re.M))
    assert files == indexed, (sorted(files - indexed), sorted(indexed - files))


def test_current_results_are_cited_by_the_docs():
    text = _docs_text()
    stale = []
    for p in RESULTS.iterdir():
        if not p.is_file() or p.suffix == ".md":
            continue
        named = f"results/{p.name}" in text
        globbed = any(re.fullmatch(pat.replace("*", ".*"), p.name)
                      for pat in re.findall(r"`(?:bench/results/)?([^`/ ]*\*[^`/ ]*)`", text))
        if not (named or globbed):
            stale.append(p.name)
    assert not stale, f"not cited by docs/RESULTS.md: move to bench/results/archive/ with an index line: {stale}"
