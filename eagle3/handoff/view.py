"""Readable forms of a handoff report: rich tables for the terminal and logs, rows and markdown
for run artifacts. Works on the report's dict form, so a report read back from JSON renders too."""

from __future__ import annotations

import html
import io

from rich.console import Console, Group
from rich.table import Table


def _d(report) -> dict:
    return report if isinstance(report, dict) else report.to_dict()


def gpu_rows(report) -> list[dict]:
    r = _d(report)
    return [{"gpu": g["index"], "uuid": g["uuid"], "used_mib": g["used_mib"], "reserved_mib": g["reserved_mib"],
             "free_mib": g["free_mib"], "total_mib": g["total_mib"], "util_%": g["util_gpu"],
             "processes": len(g["processes"])} for g in r["gpus"]]


def summary_line(report) -> str:
    """One line for a terminal or log: the verdict, what was ended, and where the report is."""
    r = _d(report)
    ended = [f"{s['name']} (group {s['pgid']}, {s['signal']})" for s in r["services"] if s.get("members")]
    ended += [f"PID {e['pid']}" for e in r["ended"] if not e.get("service")]  # a service's members: named above
    removed = len((r["shm"] or {}).get("removed", [])) + len((r["pycache"] or {}).get("removed", []))
    parts = [f"handoff {r['label']}: {'GPUs free' if r['ok'] else 'BLOCKED'} in {r['seconds']:.2f} s"]
    parts.append(f"ended {', '.join(ended)}" if ended else "nothing left to end")
    if removed:
        parts.append(f"{removed} stale file(s) removed (/dev/shm, __pycache__)")
    if not r["ok"]:
        parts.append("; ".join(r["problems"]))
    return "; ".join(parts) + f" (report {r['path']})"


def _table(title: str, columns: tuple[str, ...], rows: list[tuple], **kw) -> Table:
    t = Table(title=title, title_justify="left", **kw)
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*map(str, row))
    return t


def renderable(report) -> Group:
    r = _d(report)
    parts = [_table(f"GPU handoff {r['label']}: {r['verdict']}", ("", ""), [
        ("run dir", r["run_dir"]), ("GPU check", r["gpu_check"]), ("took", f"{r['seconds']:.3f} s"),
        ("report", r["path"])], show_header=False)]
    if r["gpus"]:
        parts.append(_table("GPUs (NVML v2)", ("GPU", "UUID", "used MiB", "reserved MiB", "free MiB", "util %",
                                               "processes"), [
            (g["gpu"], g["uuid"], f"{g['used_mib']:.0f}", f"{g['reserved_mib']:.0f}", f"{g['free_mib']:.0f}",
             "-" if g["util_%"] is None else g["util_%"], g["processes"]) for g in gpu_rows(r)]))
    if rows := _ended_rows(r):
        parts.append(_table("Processes ended", ("why", "PID", "command", "signal", "outcome", "s"), rows))
    left = [(f"GPU {h['gpus']}", h["pid"], h["class"], h["cmd"], h["why"]) for h in r["holders"]
            if h["class"] != "protected"]
    left += [(f"port {p['port']}", p["pid"], p["class"], p["cmd"], p["why"]) for p in r["ports"]
             if p["class"] != "protected"]
    if left:
        parts.append(_table("Still holding", ("what", "PID", "class", "command", "why"), left))
    if r.get("stuck"):
        parts.append(_table("Survived SIGKILL (the next phase must not start)",
                            ("PID", "of", "kernel state", "GPUs", "command"),
                            [(t["pid"], t["owner"], t["state"], _gpus(t["gpus"]), t["cmd"]) for t in r["stuck"]]))
    if r.get("observers"):
        parts.append(_table("Observers (device file open, no GPU context: not blocking)",
                            ("GPU", "PID", "command", "seen via"),
                            [(_gpus(h["gpus"]), h["pid"], h["cmd"], ", ".join(h["via"])) for h in r["observers"]]))
    if rows := _file_rows(r):
        parts.append(_table("Files", ("file", "action"), rows))
    parts.append(_table("Steps", ("step", "s", "detail"), [(s["name"], f"{s['seconds']:.3f}", s["detail"])
                                                          for s in r["steps"]]))
    if r["problems"]:
        parts.append(_table("Problems", ("problem",), [(p,) for p in r["problems"]], show_header=False))
    return Group(*parts)


def _ended_rows(r: dict) -> list[tuple]:
    rows = [(e["reason"], e["pid"], e["cmd"], e["signal"], e["outcome"], f"{e['seconds']:.3f}") for e in r["ended"]]
    rows += [("service " + s["name"], "-", "", "skipped", s["note"], "0") for s in r["services"]
             if s["signal"] == "skipped"]
    return rows


def _file_rows(r: dict) -> list[tuple]:
    rows = [(f"/dev/shm: {name}", "removed") for name in r["shm"].get("removed", [])]
    rows += [(f"/dev/shm: {k['name']}", f"kept: {k['reason']}") for k in r["shm"].get("kept", [])]
    rows += [(path, "removed") for path in r["pycache"].get("removed", [])]
    rows += [(path, f"purged ({n} bytes)") for path, n in (r.get("scratch_bytes_removed") or {}).items() if n]
    return rows


def _gpus(gpus: list[int]) -> str:
    return ", ".join(map(str, gpus)) or "-"


def to_text(report, width: int = 140) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, color_system=None).print(renderable(report))
    return buf.getvalue()


def to_markdown(report) -> str:
    """Compact for the run's artifacts: the verdict and what changed up front, problems next, the
    step timings folded away."""
    r = _d(report)
    lines = [f"**GPU handoff {r['label']} ({r['seconds']:.3f} s): {r['verdict']}** · GPU check: {r['gpu_check']}", ""]
    if r["problems"]:
        lines += ["**Problems**", ""] + [f"- {p}" for p in r["problems"]] + [""]
    if r["gpus"]:
        lines += ["| GPU | UUID | used MiB | reserved MiB | free MiB | util % |", "|---|---|---|---|---|---|"]
        lines += [f"| {g['gpu']} | {g['uuid']} | {g['used_mib']:.0f} | {g['reserved_mib']:.0f} | {g['free_mib']:.0f} "
                  f"| {g['util_%']} |" for g in gpu_rows(r)]
        lines.append("")
    ended = [(e["pid"], e["cmd"], f"{e['signal']} -> {e['outcome']}") for e in r["ended"]]
    if ended:
        lines += ["| PID | command | signal |", "|---|---|---|"]
        lines += [f"| {pid} | `{cmd}` | {sig} |" for pid, cmd, sig in ended]
        lines.append("")
    if r.get("stuck"):
        lines += ["Survived SIGKILL:", "", "| PID | of | kernel state | GPUs | command |", "|---|---|---|---|---|"]
        lines += [f"| {t['pid']} | {t['owner']} | {t['state']} | {_gpus(t['gpus'])} | `{t['cmd']}` |" for t in r["stuck"]]
        lines.append("")
    if r.get("observers"):
        lines += ["Observers (device file open, no GPU context: not blocking):", "", "| GPU | PID | command |",
                  "|---|---|---|"]
        lines += [f"| {_gpus(h['gpus'])} | {h['pid']} | `{h['cmd']}` |" for h in r["observers"]]
        lines.append("")
    if r["shm"].get("removed"):
        lines.append("Removed from /dev/shm: " + ", ".join(f"`{n}`" for n in r["shm"]["removed"]))
        lines.append("")
    # GitHub-style folding (the UI's markdown renderer passes <details>); the blank lines let the table render.
    folded = f"{len(r['steps'])} steps · report <code>{html.escape(r['path'])}</code>"
    lines += [f"<details><summary>{folded}</summary>", "",
              "| step | s | detail |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['seconds']:.3f} | {s['detail']} |" for s in r["steps"]]
    lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
