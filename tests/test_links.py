"""Links that work wherever the book is published: _config.yml's repository.url is the one place
that names the repository (the install cells carry a copy that scripts/set_repo.py keeps equal),
links to files are relative, and the chapters find their saved results in a clone or say how to
get them."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fastgen_lib.book import results_path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def install_cell(path):
    return "".join(next(c for c in json.loads(path.read_text())["cells"]
                        if c["cell_type"] == "code")["source"])


def test_the_repository_is_named_in_one_setting():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    named = {}
    for name in files:
        path = ROOT / name
        if path.is_file() and name != "tests/test_links.py":
            text = path.read_text(errors="ignore")
            count = max(text.count(URL), text.count("github.com/fastgen/fastgen"))
            if count:
                named[name] = count
    copies = {p.relative_to(ROOT).as_posix(): 1 for p in NOTEBOOKS}
    assert named == {"_config.yml": 1, **copies}, named
    for path in NOTEBOOKS:  # the copy in each chapter is its install cell's REPO, nothing else
        assert f'REPO = "{URL}"' in install_cell(path), path.name


def test_every_chapter_opens_with_the_same_install_cell():
    cells = {install_cell(p) for p in NOTEBOOKS}
    assert len(cells) == 1 and all(len(line) <= 79 for line in cells.pop().splitlines())


# The install cell, run in a fresh IPython with `pip` recorded, not run: first where fastgen_lib is
# not importable (it clones a local repository holding results/ and moves into it), then again in
# that clone, where the library is importable (it does nothing).
RUN_CELL = r"""
import importlib.util, json, os, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
pips = []
shell.register_magic_function(lambda line: pips.append(line), "line", "pip")
cell = open(sys.argv[1]).read().replace(sys.argv[2], sys.argv[3])
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "fastgen_lib" else real(name, *a)
shell.run_cell(cell).raise_error()
first = os.getcwd()
importlib.util.find_spec = lambda name, *a: object()
shell.run_cell(cell).raise_error()
print(json.dumps({"first": first, "then": os.getcwd(), "pips": pips}))
"""


def test_the_install_cell_clones_with_results_only_where_the_library_is_missing(tmp_path):
    source = tmp_path / "source"
    (source / "results" / "h200").mkdir(parents=True)
    (source / "results" / "h200" / "ladder.csv").write_text("method\nnaive\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "results"]):
        subprocess.run(git + args, check=True, capture_output=True)
    cell = tmp_path / "cell.py"
    cell.write_text(install_cell(NOTEBOOKS[0]))
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([sys.executable, "-c", RUN_CELL, str(cell), URL, source.as_uri()], cwd=work,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["first"] == out["then"] == str(work / "fastgen"), out
    assert (work / "fastgen" / "results" / "h200" / "ladder.csv").is_file()
    assert out["pips"] == ['install -q -e ".[book]"'], out


def test_results_path_finds_a_clones_results_from_the_package_and_the_working_directory(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing here: found beside the package
    assert results_path("h200/fused/run/ladder.csv") == ROOT / "results/h200/fused/run/ladder.csv"
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "y.csv").write_text("a\n1\n")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")  # a chapter runs in notebooks/ of the clone
    assert results_path("x/y.csv") == tmp_path / "results" / "x" / "y.csv"


def test_results_path_says_what_is_missing_and_how_to_get_it():
    with pytest.raises(FileNotFoundError, match=r"results/h200/nothing\.csv is not here.*Clone"):
        results_path("h200/nothing.csv")


LINK = re.compile(r"\]\(([^)\s]+)\)")


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


def has_commit(commit):
    return git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def test_links_to_the_repositorys_files_resolve():
    pages = [(p, p.read_text()) for p in sorted((ROOT / "book").glob("*.md"))]
    pages += [(p, "".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"]
                          if c["cell_type"] == "markdown")) for p in NOTEBOOKS]
    checked = 0
    for page, text in pages:
        for target in LINK.findall(text):
            if re.match(r"(https?|mailto):|#", target):
                continue
            path = target.split("#")[0]
            if path.startswith("repo:"):
                found = (ROOT / path[5:]).exists()
            elif path.startswith("commit://"):  # code deleted since: in that commit's tree
                commit, _, file = path[9:].partition("/")
                if not has_commit(commit):  # a shallow clone
                    continue
                found = git("cat-file", "-e", f"{commit}:{file}").returncode == 0
            else:
                found = (page.parent / path.removeprefix("path:")).exists()
            assert found, f"{page.name}: {target}"
            checked += 1
    assert checked > 40


def test_set_repo_points_config_and_install_cells_at_another_repository(tmp_path):
    shutil.copy(ROOT / "_config.yml", tmp_path)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    fork = "https://github.com/someone/fastgen-fork"
    script = [sys.executable, str(ROOT / "scripts" / "set_repo.py")]
    r = subprocess.run(script + [fork + "/", "--root", str(tmp_path)], capture_output=True,
                       text=True, check=True)
    assert f"in {1 + len(NOTEBOOKS)} files" in r.stdout, r.stdout
    assert yaml.safe_load((tmp_path / "_config.yml").read_text())["repository"]["url"] == fork
    for path in [Path("_config.yml"), *(p.relative_to(ROOT) for p in NOTEBOOKS)]:
        before, after = (ROOT / path).read_text(), (tmp_path / path).read_text()
        changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
        assert len(changed) == 1 and changed[0][0].replace(URL, fork) == changed[0][1], path
        assert len(before.splitlines()) == len(after.splitlines())
    assert f'REPO = "{fork}"' in install_cell(tmp_path / "notebooks" / NOTEBOOKS[0].name)
    again = subprocess.run(script + [fork, "--root", str(tmp_path)], capture_output=True,
                           text=True, check=True)
    assert "in 0 files" in again.stdout
    assert "usage:" in subprocess.run(script + ["--help"], capture_output=True, text=True,
                                      check=True).stdout


def test_the_pages_workflow_points_the_book_at_the_repository_that_builds_it():
    workflow = yaml.safe_load((ROOT / ".github/workflows/pages.yml").read_text())
    runs = [s.get("run", "") for s in workflow["jobs"]["build"]["steps"]]
    setting = next(i for i, r in enumerate(runs) if "scripts/set_repo.py" in r)
    build = next(i for i, r in enumerate(runs) if "jupyter-book build" in r)
    assert setting < build
    assert '"${{ github.server_url }}/${{ github.repository }}"' in runs[setting]
