"""What ``bench_runs`` prints: the medians of its rounds and ceiling samples, and every sample."""

from __future__ import annotations

import os
import statistics
import sys

from salvor.daemon.recording._store_access import GROUP_WINDOW_SECONDS

TARGET_RATIO = 0.5
# Issue 30's figures: appends sharing a transaction at this concurrency, and events/s against
# the model-call ceiling (the latter with salvor serve's default workers).
GROUP_TARGET = 15
CEILING_TARGET = 0.8


def round_summary(result: dict, runs: int) -> dict:
    """What one salvor round printed alongside the ceiling samples: its rate, group commit and
    CPU (the daemon's, a ``salvor serve`` process only: in-process it shares the load client's)."""
    transactions = max(1, result["transactions"])
    summary = {
        "events_per_s": round(result["events"] / result["wall"], 1),
        "wall_seconds": round(result["wall"], 3),
        "appends_per_transaction": round(result["appends"] / transactions, 2),
        "provider_cpu_ms_per_run": round(result["provider_cpu_seconds"] / runs * 1000, 2),
    }
    if "salvor_cpu_seconds" in result:
        summary["salvor_cpu_ms_per_run"] = round(result["salvor_cpu_seconds"] / runs * 1000, 2)
        summary["load_client_cpu_ms_per_run"] = round(result["client_cpu_seconds"] / runs * 1000, 2)
    return summary


def paired_ratios(rates: list[float], ceilings: list[float], events_per_call: float) -> list:
    """Each round's events/s against the ceiling measured just before and just after it."""
    return [
        round(rate / ((ceilings[i] + ceilings[i + 1]) / 2 * events_per_call), 3)
        for i, rate in enumerate(rates)
    ]


def report(args, rounds, ceilings, clients, baselines, loads) -> dict:
    """The one JSON object: the medians, and every sample they are the medians of."""
    summaries = [round_summary(r, args.runs) for r in rounds]
    rates = [s["events_per_s"] for s in summaries]
    ceiling_rates = [c["calls_per_s"] for c in ceilings]
    events_per_call = statistics.median(r["events"] / r["model_calls"] for r in rounds)
    events_per_s = statistics.median(rates)
    direct_rate = statistics.median(ceiling_rates)
    ceiling_ratio = events_per_s / (direct_rate * events_per_call)
    transactions = max(1, sum(r["transactions"] for r in rounds))
    appends_per_transaction = sum(r["appends"] for r in rounds) / transactions
    events_per_transaction = sum(r["events"] for r in rounds) / transactions
    raw = "raw_sqlite" if args.store is None else "raw_postgres"
    raw_256 = baselines[f"{raw}_rows_per_s_256_per_txn"]
    calls_per_run = statistics.median(r["model_calls"] for r in rounds) / args.runs

    def median_of(key: str) -> float:
        return round(statistics.median(s[key] for s in summaries), 2)

    in_process = (
        {
            "owner_releases": sum(r["owner_releases"] for r in rounds),
            "largest_group": max(r["largest_group"] for r in rounds),
            "writer_busy_fraction": round(
                sum(r["commit_seconds"] for r in rounds) / sum(r["wall"] for r in rounds), 3
            ),
        }
        if args.in_process
        else {}
    )
    cpu = (
        {}
        if args.in_process
        else {
            # Where the CPU went, milliseconds per run (medians over the rounds and samples),
            # against what the same model calls cost plain clients and the providers.
            "cpu_ms_per_run": {
                "salvor": median_of("salvor_cpu_ms_per_run"),
                "providers": median_of("provider_cpu_ms_per_run"),
                "load_client": median_of("load_client_cpu_ms_per_run"),
                "direct_client": round(
                    statistics.median(c["client_cpu_ms_per_call"] for c in ceilings)
                    * calls_per_run,
                    2,
                ),
                "direct_providers": round(
                    statistics.median(c["provider_cpu_ms_per_call"] for c in ceilings)
                    * calls_per_run,
                    2,
                ),
            }
        }
    )
    return {
        **({} if args.store is None else {"backend": "postgresql"}),
        "bench": "runs",
        "runs": args.runs,
        "steps_per_run": args.steps,
        "provider_processes": args.providers,
        "daemon": "in-process serve()" if args.in_process else "salvor serve process",
        "workers": rounds[0]["workers"],
        "tool_ledger": args.tool_ledger,
        "drive_concurrency": args.drive_concurrency,
        "model_calls_per_round": statistics.median(r["model_calls"] for r in rounds),
        "events_per_round": statistics.median(r["events"] for r in rounds),
        "rounds": summaries,
        "ceiling_samples": ceilings,
        "ceiling_clients": clients,
        "events_per_s": round(events_per_s, 1),
        "post_runs_p50_ms": round(statistics.median(r["post_p50_ms"] for r in rounds), 2),
        "post_runs_p99_ms": round(statistics.median(r["post_p99_ms"] for r in rounds), 2),
        "group_commit": {
            "transactions": transactions,
            "appends_per_transaction": round(appends_per_transaction, 2),
            "events_per_transaction": round(events_per_transaction, 2),
            **in_process,
            "commit_ms_mean": round(
                sum(r["commit_seconds"] for r in rounds) / transactions * 1000, 3
            ),
            "window_seconds": GROUP_WINDOW_SECONDS,
            "target_appends_per_transaction": GROUP_TARGET,
            "meets_group_target": appends_per_transaction >= GROUP_TARGET,
        },
        **baselines,
        "ratio_vs_raw_at_salvor_group": round(
            events_per_s / baselines[f"{raw}_rows_per_s_at_salvor_group"], 3
        ),
        "ratio_vs_raw_256": round(events_per_s / raw_256, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": events_per_s / raw_256 >= TARGET_RATIO,
        "baseline_direct_model_calls_per_s": round(direct_rate, 1),
        "events_per_model_call": round(events_per_call, 2),
        # What the model round trip alone allows, with salvor costing nothing.
        "ceiling_events_per_s_from_model_calls": round(direct_rate * events_per_call, 1),
        "ratio_vs_model_call_ceiling": round(ceiling_ratio, 3),
        "round_ratios_vs_neighbouring_ceilings": paired_ratios(
            rates, ceiling_rates, events_per_call
        ),
        "target_ratio_vs_model_call_ceiling": CEILING_TARGET,
        "meets_ceiling_target": ceiling_ratio >= CEILING_TARGET,
        "listed_completed_page": min(r["listed_completed"] for r in rounds),
        **cpu,
        **({"synchronous": "FULL"} if args.store is None else {}),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in loads[0]],
        "load_average_after": [round(x, 2) for x in loads[1]],
        "python": sys.version.split()[0],
    }


def bare_report(runs: int, bare: list[dict], salvor: dict) -> dict:
    """The bare recorder's rounds (``bare_recorder``), against the same ceiling samples as
    salvor's: the ratio no recorder of these runs passes on this machine, and salvor's rate
    against it."""
    rates = [b["events"] / b["wall"] for b in bare]
    events_per_s = statistics.median(rates)
    ceiling = salvor["ceiling_events_per_s_from_model_calls"]

    def ms_per_run(key: str) -> float:
        return round(statistics.median(b[key] for b in bare) / runs * 1000, 2)

    return {
        "rounds": [
            {
                "events_per_s": round(rate, 1),
                "appends_per_transaction": round(b["appends"] / max(1, b["transactions"]), 2),
            }
            for rate, b in zip(rates, bare, strict=True)
        ],
        "events_per_s": round(events_per_s, 1),
        "ratio_vs_model_call_ceiling": round(events_per_s / ceiling, 3),
        "cpu_ms_per_run": {
            "recorder": ms_per_run("recorder_cpu_seconds"),
            "providers": ms_per_run("provider_cpu_seconds"),
            "load_client": ms_per_run("client_cpu_seconds"),
        },
        "salvor_ratio_vs_bare": round(salvor["events_per_s"] / events_per_s, 3),
    }
