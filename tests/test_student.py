"""scripts/make_student.py: student copies keep prose and exercise code, lose outputs and solutions."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("make_student", ROOT / "scripts" / "make_student.py")
make_student = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_student)

REAL_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def synthetic_notebook():
    """A chapter in miniature: prose, code with outputs, an exercise, code and markdown solutions, widget state."""
    v4 = nbformat.v4
    nb = v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "widgets": {WIDGET_STATE: {"state": {}, "version_major": 2, "version_minor": 0}},
        "execution": {"iopub.execute_input": "2026-01-01T00:00:00Z"},
    }
    run = v4.new_code_cell("tokens_per_s = 1234\nprint(tokens_per_s)", execution_count=3)
    run.outputs = [v4.new_output("stream", name="stdout", text="OUTPUT-1234\n"),
                   v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]
    run.metadata = {"tags": ["hide-input"], "execution": {"shell.execute_reply": "2026-01-01T00:00:01Z"}}
    code_solution = v4.new_code_cell("def kv_cache_bytes(n_layer):\n    return 2 * n_layer  # SECRET-CODE",
                                     execution_count=4, metadata={"tags": ["solution", "hide-input"]})
    code_solution.outputs = [v4.new_output("execute_result", data={"text/plain": "24"}, execution_count=4)]
    md_solution = v4.new_markdown_cell(":::{dropdown} Solution\nThe host waits here. SECRET-PROSE\n:::",
                                       metadata={"tags": ["solution"]})
    nb.cells = [
        v4.new_markdown_cell("# Chapter 2: KV cache\n\nThe cache keeps keys and values."),
        run,
        v4.new_markdown_cell("## Exercises\n\n1. Write `kv_cache_bytes`."),
        code_solution,
        v4.new_markdown_cell("2. Where does the host wait?"),
        md_solution,
        v4.new_code_cell("unfinished = 1", metadata={"tags": ["solution"]}),  # not folded: a warning
    ]
    nbformat.validate(nb)
    return nb


def assert_student_copy(student, source):
    """The properties every student copy has, whatever the source notebook."""
    nbformat.validate(student)
    assert WIDGET_STATE not in str(student.metadata) and "widgets" not in student.metadata
    assert len(student.cells) == len(source.cells)
    for s, c in zip(student.cells, source.cells):
        assert s.cell_type == c.cell_type
        assert "solution" not in s.metadata.get("tags", [])
        if s.cell_type == "code":
            assert s.outputs == [] and s.execution_count is None
        if "solution" in c.metadata.get("tags", []):
            assert s.source == (make_student.CODE_PLACEHOLDER if c.cell_type == "code"
                                else make_student.MARKDOWN_PLACEHOLDER)
        else:
            assert s.source == c.source  # prose and exercise code kept verbatim
        assert set(s.metadata) <= {"tags"}
        if "id" in c:
            assert s.id == c.id


def test_synthetic_notebook():
    source = synthetic_notebook()
    before = nbformat.writes(source)
    student, stats = make_student.student_notebook(source)
    assert nbformat.writes(source) == before  # the source notebook is not modified
    assert_student_copy(student, source)
    text = nbformat.writes(student)
    assert "SECRET" not in text and "OUTPUT" not in text and "iVBORw0KGgo" not in text
    assert "The cache keeps keys and values." in text and "tokens_per_s = 1234" in text
    assert student.cells[1].metadata == {"tags": ["hide-input"]}  # non-solution tags survive
    assert stats == {"cells": 7, "solutions": 3, "outputs": 3, "unfolded": [6]}
    assert set(student.metadata) == {"kernelspec", "language_info"}


def test_old_nbformat_without_cell_ids():
    nb = synthetic_notebook()
    nb.nbformat_minor = 4
    for cell in nb.cells:
        del cell["id"]
    nbformat.validate(nb)
    student, _ = make_student.student_notebook(nb)
    assert_student_copy(student, nb)
    assert all("id" not in c for c in student.cells)


def test_cli_writes_copies_and_readme(tmp_path):
    src, out = tmp_path / "notebooks", tmp_path / "student"
    src.mkdir()
    source = synthetic_notebook()
    nbformat.write(source, src / "02_kv_cache.ipynb")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_student.py"), "--src", str(src),
                        "--out", str(out)], capture_output=True, text=True, check=True)
    assert f"{out / '02_kv_cache.ipynb'}: 7 cells, 3 solution(s) removed, 3 output(s) cleared" in r.stdout
    assert "warning:" in r.stdout and "cell 6" in r.stdout
    student = nbformat.read(out / "02_kv_cache.ipynb", as_version=4)
    assert_student_copy(student, source)
    assert "02_kv_cache.ipynb" in (out / "README.md").read_text()


def test_cli_fails_without_notebooks(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_student.py"), "--src", str(tmp_path),
                        "--out", str(tmp_path / "student")], capture_output=True, text=True)
    assert r.returncode == 1 and "no notebooks" in r.stderr


@pytest.mark.skipif(not REAL_NOTEBOOKS, reason="no notebooks/*.ipynb yet")
def test_real_notebooks(tmp_path):
    out = tmp_path / "student"
    assert make_student.main(["--src", str(ROOT / "notebooks"), "--out", str(out)]) == 0
    for path in REAL_NOTEBOOKS:
        source = nbformat.read(path, as_version=4)
        student = nbformat.read(out / path.name, as_version=4)
        assert_student_copy(student, source)
    assert (out / "README.md").exists()
