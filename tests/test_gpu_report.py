"""tests/gpu/report.py reads what the GPU run left behind; its parsing is checked here, on the CPU."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("gpu_report", Path(__file__).parent / "gpu" / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def test_sanitizer_summaries_are_counted(tmp_path):
    mem, race = tmp_path / "m.log", tmp_path / "r.log"
    mem.write_text("========= COMPUTE-SANITIZER\nsanitize_run: OK; output (3, 18)\n========= ERROR SUMMARY: 2 errors\n")
    race.write_text("sanitize_run: OK\n========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n")
    line = report.sanitizer_line("memcheck", "0", mem)
    assert line.startswith("- memcheck: 2 errors (exit 0; workload tokens match)"), line
    assert report.sanitizer_line("racecheck", "0", race).startswith("- racecheck: 1 errors, 2 warnings")


def test_a_sanitizer_that_never_attached_is_not_a_pass(tmp_path):
    log = tmp_path / "m.log"
    log.write_text("========= Error: No attachable process found. compute-sanitizer timed-out.\n")
    assert "no summary line" in report.sanitizer_line("memcheck", "124", log) or "TIMED OUT" in \
        report.sanitizer_line("memcheck", "124", log)
    assert "no summary line" in report.sanitizer_line("memcheck", "0", log)
    assert "NOT confirmed" in report.sanitizer_line("memcheck", "0", log)
