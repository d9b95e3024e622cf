"""Interpretation of engine statistics: which callpaths dominate, and where their time goes.

SYMBIOSYS (papers/ramesh-symbiosys.txt, sections IV-V) shows that per-callpath step breakdowns are what
makes a composed service tunable; this module turns them into a short diagnosis with the setting that
usually helps:

* ``queue`` dominates (requests wait before their handler runs): the server is saturated: add server
  processes (raise the service ratio), or move blocking work off the event loop;
* ``handler`` dominates: the provider's own work: optimise it, or make it async if it waits;
* ``respond`` dominates (serialising and framing results): return large data by bulk transfer;
* on the origin side, ``serialize`` dominating means large inline arguments: use bulk handles;
* bulk transfers dominating: transfer sizes and the network are the limit (see the bandwidth roofline).
"""

from __future__ import annotations

from typing import Any

ADVICE = {
    "queue": "requests wait before their handler runs: the server is saturated; add server processes "
    "(a higher service ratio) or move blocking work off the event loop",
    "handler": "time is spent in the handler itself: optimise the provider, or make it async if it waits on I/O",
    "respond": "packing and queueing results dominates: if results are large, return them through a bulk transfer",
    "overhead": "every step is short: the call costs what the runtime does per call (framing, event loop); "
    "batch work into fewer, larger calls if the rate matters",
    "serialize": "serialising arguments is expensive: send large data as a bulk handle instead of inline",
    "network": "most of the round trip is outside both ends' code: network latency or a busy server; "
    "see the target side's statistics",
}
INLINE_LARGE_BYTES = 64 * 1024
#: Below this mean time per call (µs) on the target, no single step is worth tuning.
SHORT_CALL_USEC = 20.0


def _label(row: dict[str, Any]) -> str:
    parent = f"{row['parent_rpc']}[{row['parent_provider_id']}] -> " if row.get("parent_rpc") else ""
    return f"{parent}{row['rpc']}[{row['provider_id']}]"


def diagnose(stats: dict[str, Any], top: int = 3) -> list[dict[str, Any]]:
    """Findings for the ``top`` callpaths by time, on the target side (and origin side).

    Args:
        stats: ``Engine.statistics()`` (or the admin ``statistics`` RPC's result).

    Returns:
        ``[{"side", "callpath", "peer", "calls", "share", "dominant_step", "step_shares", "advice"}, ...]``
        sorted by time, ``share`` being the callpath's fraction of all time on its side.
    """
    rpcs = stats.get("rpcs", {})
    findings: list[dict[str, Any]] = []
    target = rpcs.get("target", [])
    totals = [sum(row[f"{s}_usec"]["sum"] for s in ("queue", "handler", "respond")) for row in target]
    all_time = sum(totals) or 1.0
    for row, total in sorted(zip(target, totals, strict=True), key=lambda rt: -rt[1])[:top]:
        shares = {s: row[f"{s}_usec"]["sum"] / total if total else 0.0 for s in ("queue", "handler", "respond")}
        dominant = max(shares, key=shares.__getitem__)
        calls = row["handler_usec"]["count"] or 1
        if total / calls < SHORT_CALL_USEC:
            dominant = "overhead"
        advice = ADVICE[dominant]
        if row.get("response_bytes", {}).get("p50", 0) > INLINE_LARGE_BYTES:
            advice += "; responses are large (median over 64 KiB): use bulk transfers"
        findings.append(
            {
                "side": "target", "callpath": _label(row), "peer": row["peer"], "calls": row["handler_usec"]["count"],
                "share": total / all_time, "dominant_step": dominant, "step_shares": shares, "advice": advice,
            }
        )  # fmt: skip
    origin = rpcs.get("origin", [])
    all_origin = sum(row["total_usec"]["sum"] for row in origin) or 1.0
    for row in sorted(origin, key=lambda r: -r["total_usec"]["sum"])[:top]:
        total = row["total_usec"]["sum"]
        ser = row["serialize_usec"]["sum"] / total if total else 0.0
        dominant = "serialize" if ser > 0.3 or row["request_bytes"]["p50"] > INLINE_LARGE_BYTES else "network"
        findings.append(
            {
                "side": "origin", "callpath": _label(row), "peer": row["peer"], "calls": row["total_usec"]["count"],
                "share": total / all_origin, "dominant_step": dominant,
                "step_shares": {"serialize": ser, "network": 1.0 - ser}, "advice": ADVICE[dominant],
            }
        )  # fmt: skip
    return findings


def format_diagnosis(findings: list[dict[str, Any]]) -> str:
    """Human-readable lines, one finding each."""
    if not findings:
        return "no calls recorded"
    lines = []
    for f in findings:
        steps = ", ".join(f"{k} {v:.0%}" for k, v in f["step_shares"].items())
        lines.append(
            f"{f['side']:>6}: {f['callpath']} ({f['calls']} calls, {f['share']:.0%} of {f['side']} time; {steps}): "
            f"{f['dominant_step']} dominates: {f['advice']}"
        )
    return "\n".join(lines)
