"""The README is the users' door (issue 40): at most 350 lines, opening with the two commands that
work on a fresh machine (`make demo`, `make test`), and every relative link in it and in the pages
it sends readers to (docs/*.md, and the other READMEs) points at a file that exists, and at a
heading that exists when it names one (#fragment, with GitHub's anchor rules). Every `make`
target they name is one of the Makefile's, and every repository path the README names exists."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import REPO

README = REPO / "README.md"
MAX_LINES = 350
PAGES = sorted({README, *(REPO / "docs").glob("*.md"), REPO / "argocd" / "README.md",
                REPO / "examples" / "README.md", REPO / "bench" / "README.md"})

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) or ![alt](target "title"); text may span lines but holds no nested brackets
LINK = re.compile(r"!?\[([^\[\]]*)\]\(\s*<?([^()\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def prose(text: str) -> str:
    """The text without fenced code blocks (their lines blanked, so line numbers stay)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (inline code kept, link targets and
    emphasis marks dropped), lower case, every character but letters, digits, `_`, `-` and space
    removed, each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = INLINE_CODE.sub(lambda m: m.group(2).strip().replace("*", "\0"), text)
    text = re.sub(r"<[^>]+>", "", text).replace("*", "").replace("\0", "*")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub makes for the page's headings (a repeated slug gets -1, -2, ...)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page.read_text()).split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The page's link targets, outside code blocks and inline code."""
    text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose(page.read_text()))
    return [m.group(2) for m in LINK.finditer(text)] + REFERENCE.findall(text)


def test_the_readme_is_at_most_350_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, (f"README.md has {len(lines)} lines, at most {MAX_LINES}: move detail to"
                                     " docs/ and link it by one line")


def test_the_readme_opens_with_the_two_commands():
    """Its first code block, before any section, is `make demo` then `make test`."""
    text = README.read_text()
    first_section = text.find("\n## ")
    block = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S)
    assert block and block.start() < first_section, "the README opens with a sh block before its first section"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"], commands


def test_the_open_commands_are_the_makefiles():
    """`make` alone is the demo; `make test` runs every test."""
    makefile = (REPO / "Makefile").read_text()
    assert ".DEFAULT_GOAL := demo" in makefile
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:.*\n\t\$\(PY\) -m pytest ", makefile, re.M)


def test_slugs_follow_githubs_rules():
    assert slug('"My replica is Pending"') == "my-replica-is-pending"
    assert slug("Quotas: who may take which GPUs") == "quotas-who-may-take-which-gpus"
    assert slug("`knative-route` (default; KinD)") == "knative-route-default-kind"
    assert slug("Gangs: all of a job's replicas, or none") == "gangs-all-of-a-jobs-replicas-or-none"
    assert slug("A — B") == "a--b"
    assert slug("What `make up` does") == "what-make-up-does"
    assert slug("gpu_scheduler **bold** [link](x.md)") == "gpu_scheduler-bold-link"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page):
        if not target or EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / unquote(path)).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif fragment and file.suffix == ".md" and unquote(fragment) not in anchors(file):
            broken.append(f"{target}: {file.relative_to(REPO)} has no heading #{fragment}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_links_every_page_of_docs():
    """Each page under docs/ is one line of the README away."""
    targets = {(REPO / t.partition("#")[0]).resolve() for t in links(README) if not EXTERNAL.match(t)}
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in targets]
    assert not missing, f"README.md links no line to docs/{', docs/'.join(missing)}"


def make_targets() -> set[str]:
    """The targets `make -pn` knows from the Makefile (and kind/kind.mk, which it includes)."""
    done = subprocess.run(["make", "-pRrqn", "-f", "Makefile"], cwd=REPO, capture_output=True, text=True, timeout=60)
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", done.stdout, re.M)}


@pytest.mark.parametrize("page", [README, REPO / "docs" / "kind.md", REPO / "docs" / "install.md",
                                  REPO / "docs" / "try-it.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_every_make_target_named_is_the_makefiles(page):
    """`make X Y VAR=value` in inline code, or as a command line of a code block."""
    text = page.read_text()
    commands = [m.group(2) for m in INLINE_CODE.finditer(prose(text))]
    code = [line for line, kept in zip(text.split("\n"), prose(text).split("\n")) if line and not kept]
    commands += [line.strip().removeprefix("$ ") for line in code]
    targets = set()
    for command in commands:
        if not command.startswith("make "):
            continue
        for word in command.split("#")[0].split()[1:]:
            if not re.fullmatch(r"[a-z][\w-]*", word):  # VAR=value, -f, ...: no more targets
                break
            targets.add(word)
    assert targets and targets <= make_targets(), sorted(targets - make_targets())


def test_every_repository_path_the_readme_names_exists():
    """`check/statefulset.yaml`, `argocd/values.yaml`, `docs/...`: names under a top-level
    directory of the repository (placeholders such as `<cluster>` left out)."""
    top = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    named = re.findall(r"`([\w.-]+(?:/[\w.+-]+)+/?)`", README.read_text())
    paths = [n for n in named if n.split("/")[0] in top]
    missing = [p for p in paths if not (REPO / p).exists()]
    assert paths and not missing, missing


def test_the_uninstall_note_names_what_bind_leaves_behind():
    """What bind writes outside the release: the quota resources in every node's status
    (gpu_scheduler/quota.py, functions/bind/advertiser.py) and its device records (Leases under
    records.RECORD_SELECTOR). The README says the uninstall hook removes both; docs/install.md's
    Uninstall has the commands for an uninstall without it (tests/test_readme_cluster.py runs
    them on an API server)."""
    from gpu_scheduler.quota import ADVERTISED, GPU_RESOURCE, PRODUCT_PREFIX
    from gpu_scheduler.records import RECORD_SELECTOR

    text = README.read_text()
    section = text[text.index("\n## Uninstall and upgrade\n"):]
    section = section[:section.index("\n## ", 1)]
    for said in (f"`{GPU_RESOURCE}`", f"`{PRODUCT_PREFIX}<type>`", f"{int(ADVERTISED)} each", "helm uninstall",
                 "pre-delete", "device records", "docs/install.md#uninstall"):
        assert said in section, said
    install = (REPO / "docs" / "install.md").read_text()
    uninstall = install[install.index("\n## Uninstall\n"):]
    uninstall = uninstall[:uninstall.index("\n## ", 1)]
    for said in (f"delete leases -l {RECORD_SELECTOR}`", "--subresource=status", "--no-hooks"):
        assert said in uninstall, said


def test_the_install_without_knative_is_within_the_first_100_lines():
    """Issue 40: a reader finds the install command for a cluster without Knative early."""
    head = "\n".join(README.read_text().splitlines()[:100])
    assert "--set runtime=deployments" in head and "helm upgrade --install gpu-scheduler chart/gpu-scheduler" in head


def test_the_readmes_index_table_is_podindexs_sources():
    """The README's table of index sources lists gpu_scheduler/podindex.py's INDEX_SOURCES: each
    one's name, in their order (first that applies wins), with its rule; docs/usage.md's "The pod
    index" numbers the same names in the same order."""
    from gpu_scheduler.podindex import INDEX_SOURCES

    text = prose(README.read_text())
    section = text[text.index("\n### The workload kinds and the pod index\n"):]
    section = section[:section.index("\n#", 1)]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| `")]
    assert [row[0] for row in rows] == [f"`{source.name}`" for source in INDEX_SOURCES]
    assert [row[1] for row in rows] == [source.rule for source in INDEX_SOURCES]
    usage = (REPO / "docs" / "usage.md").read_text()
    usage = usage[usage.index("\n## The pod index\n"):]
    usage = usage[:usage.index("\n## ", 1)]
    assert re.findall(r"^\d+\. `(\w+)`", usage, re.M) == [source.name for source in INDEX_SOURCES]
