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
    ended += [f"PID {e['pid']}" for e in r["ended"]]
    removed = len((r["shm"] or {}).get("removed", [])) + len((r["pycache"] or {}).get("removed", []))
    parts = [f"handoff {r['label']}: {'GPUs free' if r['ok'] else 'BLOCKED'} in {r['seconds']:.2f} s"]
    parts.append(f"ended {', '.join(ended)}" if ended else "nothing left to end")
    if removed:
        parts.append(f"{removed} stale file(s) removed (/dev/shm, __pycache__)")
    if not r["ok"]:
        parts.append("; ".join(r["problems"]))
    return "; ".join(parts) + f" (report {r['path']})"


def renderable(report) -> Group:
    r = _d(report)
    parts = []
    head = Table(title=f"GPU handoff {r['label']}: {r['verdict']}", show_header=False, title_justify="left")
    head.add_row("run dir", r["run_dir"])
    head.add_row("GPU check", r["gpu_check"])
    head.add_row("took", f"{r['seconds']:.3f} s")
    head.add_row("report", r["path"])
    parts.append(head)

    if r["gpus"]:
        t = Table(title="GPUs (NVML v2)", title_justify="left")
        for col in ("GPU", "UUID", "used MiB", "reserved MiB", "free MiB", "util %", "processes"):
            t.add_column(col)
        for g in gpu_rows(r):
            t.add_row(str(g["gpu"]), g["uuid"], f"{g['used_mib']:.0f}", f"{g['reserved_mib']:.0f}",
                      f"{g['free_mib']:.0f}", "-" if g["util_%"] is None else str(g["util_%"]), str(g["processes"]))
        parts.append(t)

    ended = [("service " + s["name"], m["pid"], m.get("comm", ""), s["signal"],
              "survived" if m["pid"] in s["survivors"] else "gone", s["seconds"])
             for s in r["services"] for m in s["members"]]
    ended += [(e["reason"], e["pid"], e["cmd"], e["signal"], e["outcome"], e["seconds"]) for e in r["ended"]]
    skipped = [s for s in r["services"] if s["signal"] == "skipped"]
    if ended or skipped:
        t = Table(title="Processes ended", title_justify="left")
        for col in ("why", "PID", "command", "signal", "outcome", "s"):
            t.add_column(col, overflow="fold")
        for why, pid, cmd, sig, outcome, secs in ended:
            t.add_row(why, str(pid), cmd, sig, outcome, f"{secs:.3f}")
        for s in skipped:
            t.add_row("service " + s["name"], "-", "", "skipped", s["note"], "0")
        parts.append(t)

    left = [h for h in r["holders"] if h["class"] != "protected"] + [p for p in r["ports"] if p["class"] != "protected"]
    if left:
        t = Table(title="Still holding", title_justify="left")
        for col in ("what", "PID", "class", "command", "why"):
            t.add_column(col, overflow="fold")
        for h in r["holders"]:
            if h["class"] != "protected":
                t.add_row(f"GPU {h['gpus']}", str(h["pid"]), h["class"], h["cmd"], h["why"])
        for p in r["ports"]:
            if p["class"] != "protected":
                t.add_row(f"port {p['port']}", str(p["pid"]), p["class"], p["cmd"], p["why"])
        parts.append(t)

    if r.get("stuck"):
        t = Table(title="Survived SIGKILL (the next phase must not start)", title_justify="left")
        for col in ("PID", "of", "kernel state", "GPUs", "command"):
            t.add_column(col, overflow="fold")
        for row in r["stuck"]:
            t.add_row(str(row["pid"]), row["owner"], row["state"], _gpus(row["gpus"]), row["cmd"])
        parts.append(t)

    if r.get("observers"):
        t = Table(title="Observers (device file open, no GPU context: not blocking)", title_justify="left")
        for col in ("GPU", "PID", "command", "seen via"):
            t.add_column(col, overflow="fold")
        for h in r["observers"]:
            t.add_row(_gpus(h["gpus"]), str(h["pid"]), h["cmd"], ", ".join(h["via"]))
        parts.append(t)

    removed = r["shm"].get("removed", []) + r["pycache"].get("removed", [])
    if removed or r["shm"].get("kept"):
        t = Table(title="Files", title_justify="left")
        t.add_column("file", overflow="fold")
        t.add_column("action", overflow="fold")
        for name in r["shm"].get("removed", []):
            t.add_row(f"/dev/shm: {name}", "removed")
        for k in r["shm"].get("kept", []):
            t.add_row(f"/dev/shm: {k['name']}", f"kept: {k['reason']}")
        for path in r["pycache"].get("removed", []):
            t.add_row(path, "removed")
        parts.append(t)

    t = Table(title="Steps", title_justify="left")
    for col in ("step", "s", "detail"):
        t.add_column(col, overflow="fold")
    for s in r["steps"]:
        t.add_row(s["name"], f"{s['seconds']:.3f}", s["detail"])
    parts.append(t)
    if r["problems"]:
        t = Table(title="Problems", title_justify="left", show_header=False)
        t.add_column("problem", overflow="fold")
        for p in r["problems"]:
            t.add_row(p)
        parts.append(t)
    return Group(*parts)


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
    ended = [(m["pid"], m.get("comm", ""), s["signal"]) for s in r["services"] for m in s["members"]]
    ended += [(e["pid"], e["cmd"], f"{e['signal']} -> {e['outcome']}") for e in r["ended"]]
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
