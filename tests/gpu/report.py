"""Write REPORT_DIR/report.md from what `bash scripts/gpu.sh tests` left there: env.txt, junit.xml, stress/repeat/bf16/
sync .json, sanitizer_<tool>.log. Usage: python tests/gpu/report.py REPORT_DIR KEY=VALUE...  where the KEYs are
exit codes (pytest=1, memcheck=124, ...) or "skipped". Anything missing is reported as missing, never fatal."""
import json
import re
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path


def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pytest_lines(path, rc):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return [f"- pytest: {'not run' if rc == 'skipped' else f'no junit XML (exit code {rc})'}"]
    cases = list(root.iter("testcase"))
    bad = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = sum(c.find("skipped") is not None for c in cases)
    when = "an earlier run" if rc == "skipped" else f"exit code {rc}"
    lines = [f"- pytest ({when}): {len(cases) - len(bad) - skipped} passed, {len(bad)} failed/errors, "
             f"{skipped} skipped, {len(cases)} total"]
    for c in bad:
        node = c.find("failure") if c.find("failure") is not None else c.find("error")
        msg = (node.get("message") or "").splitlines()[0][:300] if node is not None else ""
        lines.append(f"  - FAILED `{c.get('name')}`: {msg}")
    return lines


def sanitizer_line(tool, rc, log):
    if rc == "skipped" and not log.exists():
        return f"- {tool}: not run"
    if rc in ("124", "137"):
        return f"- {tool}: TIMED OUT (exit {rc}); see {log.name}"
    if rc == "notfound":
        return f"- {tool}: compute-sanitizer not found"
    text = log.read_text(errors="replace") if log.exists() else ""
    # memcheck ends with "ERROR SUMMARY: N errors"; racecheck with "RACECHECK SUMMARY: H hazards displayed
    # (N errors, W warnings)"
    counts = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text)]
    counts += [int(n) for n in re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?", text)]
    warn = sum(int(n) for n in re.findall(r"RACECHECK SUMMARY: .*?(\d+) warnings?\)", text))
    ok = "sanitize_run: OK" in text
    summary = (f"{sum(counts)} errors" + (f", {warn} warnings" if warn else "")) if counts else "no summary line"
    when = "an earlier run" if rc == "skipped" else f"exit {rc}"
    return f"- {tool}: {summary} ({when}; workload tokens {'match' if ok else 'NOT confirmed'}); see {log.name}"


def section(out, title, name, render):
    """A report section from one JSON file the run left, or a line saying it is missing."""
    data = load(out / name)
    return ["", f"## {title}", ""] + (render(data) if data else [f"- no {name}"])


def bf16_lines(b):
    lines = [f"- {b['rows']} rows, {b['new_tokens']} new tokens; deferred/interleaved == compiled: "
             f"{b['equal_to_compiled']}", "",
             "| decoder | first token agrees | rows agreeing on all tokens | mean leading agreement | "
             "smallest gap where rows part |", "| --- | --- | --- | --- | --- |"]
    for d, v in b["decoders"].items():
        gaps, lead = v["gaps_where_they_part"], v["leading_agree"]
        lines.append(f"| {d} | {v['first_token_agree']:.0%} | {v['all_tokens_agree']}/{b['rows']} | "
                     f"{sum(lead) / len(lead):.1f} | {f'{min(gaps):.4f}' if gaps else '-'} |")
    return lines


def main():
    out = Path(sys.argv[1])
    rcs = dict(a.split("=", 1) for a in sys.argv[2:])
    env = (out / "env.txt").read_text(errors="replace").strip() if (out / "env.txt").exists() else "(no env.txt)"
    lines = ["# fastgen GPU reliability report", "",
             f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} by scripts/gpu.sh tests.", "",
             "## Machine and versions", "", "```", env, "```", "", "## Tests", ""]
    lines += pytest_lines(out / "junit.xml", rcs.get("pytest", "skipped"))

    lines += section(out, "Stress: interleaved vs compiled", "stress.json", lambda s: [
        f"- {s['cases']} cases, **{s['mismatches']} mismatches**, {s['wall_s']} s; {s['sampled']} sampled, "
        f"{s['staggered_stops']} with rows stopping at different steps, {s['all_stopped_early']} ending early; "
        f"{s['compiles']} compiles; reserved {s['reserved_mib'][0]} -> {s['reserved_mib'][1]} MiB"])
    lines += section(out, "50 repeated calls", "repeat.json", lambda r: [
        f"- recompiles after warm-up: {r['recompiles_after_warmup']}; memory drift after call 1: reserved "
        f"{r['reserved_drift_after_call1']} B, allocated {r['allocated_drift_after_call1']} B; buffers reused: "
        f"{r['buffers_reused']}; same GraphStep and graphs: {r.get('same_step_and_graphs', r.get('same_runner_and_graphs'))}"])
    lines += section(out, "Host syncs", "sync.json", lambda y: [
        f"- decode loop sync-free under sync debug mode 'error': {y.get('decode_loop_sync_free')}; "
        f"`compiled`'s .item() caught: {y.get('compiled_caught')}; Event.synchronize flagged by the mode: "
        f"{y.get('event_synchronize_flagged')}; exempted: {y.get('exempted')}",
        f"- host syncs per generate() call by new tokens: {y.get('syncs_per_call')}; sites: "
        f"{y.get('sync_sites')}"])
    lines += section(out, "bfloat16 vs model.generate", "bf16.json", bf16_lines)

    lines += ["", "## compute-sanitizer (tests/gpu/sanitize_run.py: tiny model, interleaved)", ""]
    for tool in ("memcheck", "racecheck"):
        lines.append(sanitizer_line(tool, rcs.get(tool, "skipped"), out / f"sanitizer_{tool}.log"))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
