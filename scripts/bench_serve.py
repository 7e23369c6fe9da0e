"""Benchmark `specdec serve` with NVIDIA's aiperf, a client nobody here wrote.

For each server (plain decoding, n-gram, EAGLE-3 by default; suffix decoding and lookahead on
request) it starts `specdec serve` on a free port, runs `aiperf profile` against its streaming
chat endpoint at each concurrency with Spec-Bench first turns (n-gram: summarization and rag;
EAGLE-3: mt_bench's eight categories; suffix: summarization and rag, and a repeated-request set;
lookahead: summarization and rag, and mt_bench; plain: every set the others run, as the baseline
of each), then stops the server with SIGTERM. The repeated-request set sends eight prompts, one
per category, then the same eight again, as retries, n-sampling and agent loops resend a task. It does so in
`--rounds` rounds, the servers' order rotating from round to round, so that a machine that
speeds up or slows down during the run does not favour one server; each speculative server is
compared with the plain server of the same round, and the table gives the means over rounds
with every round's ratio. aiperf lives in its own virtual environment (`.venv-aiperf`, made on
first use): it pins its own transformers.

    .venv/bin/python scripts/bench_serve.py --out bench-results/serve

Writes `serve.json` (every aiperf summary and the means), a table on the terminal and
`serve.png`. With `--offline`, each speculative server is also compared in the last round with
the same method decoding in-process (as `specdec bench` times it), prompt by prompt in turn, the
server sent one streamed request at a time by a light client, so that both run on the same
machine state and without a client competing for the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from specdec.bench.dataset import REPEATED, load_questions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AIPERF_VENV = ROOT / ".venv-aiperf"
AIPERF_VERSION = "0.13.0"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
#: Spec-Bench first turns by category; `repeat` is specdec bench's `--dataset repeated`.
PROMPT_SETS = {"sum_rag": ("summarization", "rag"), "mt_bench": MT_BENCH, "repeat": None}
#: (label, `specdec serve` method arguments, prompt sets it runs); the plain server runs every
#: set the chosen speculative servers run.
SERVERS = {
    "plain": (["--method", "none"], ()),
    "ngram": (["--method", "ngram"], ("sum_rag",)),
    "eagle3": (["--method", "eagle3"], ("mt_bench",)),
    "suffix": (["--method", "suffix"], ("sum_rag", "repeat")),
    "lookahead": (["--method", "lookahead"], ("sum_rag", "mt_bench")),
}
#: aiperf's request rate cap (requests/s), far above what the server completes: see `_profile`.
POLL_RATE = 50
console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "serve")
    parser.add_argument("--servers", default="plain,ngram,eagle3", help=f"comma list of {', '.join(SERVERS)}")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=16, help="requests per run (at least 4 per client)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each running every server once, the order rotating")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests per run, not counted")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--offline", action="store_true",
                        help="also compare each speculative server with in-process decoding, interleaved")
    parser.add_argument("--aiperf", type=Path, default=None, help=f"an aiperf executable (default: {AIPERF_VENV.name}, made on first use)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    aiperf = args.aiperf or _aiperf()
    tokenizer = subprocess.check_output(
        [sys.executable, "-c", "from specdec.models import default_model_dir; print(default_model_dir())"], text=True
    ).strip()
    for name, categories in PROMPT_SETS.items():
        _write_prompts(args.out / f"{name}.jsonl", categories)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        parser.error(f"--servers: unknown {', '.join(unknown)} (choose from {', '.join(SERVERS)})")
    every_set = [p for p in PROMPT_SETS if any(p in SERVERS[s][1] for s in servers)]
    sets = {s: every_set if s == "plain" else SERVERS[s][1] for s in servers}
    runs = [(s, p, c) for s in servers for p in sets[s] for c in concurrencies]
    results: list[dict] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("starting", total=len(runs) * args.rounds)
        offline: dict[str, dict] = {}
        order = list(servers)
        for round_ in range(args.rounds):
            for server in order:
                with _Server(f"{server}-r{round_}", SERVERS[server][0], args) as port:
                    for prompts, concurrency in [(p, c) for s, p, c in runs if s == server]:
                        progress.update(task, description=f"round {round_ + 1}: {server} on {prompts}, concurrency {concurrency}")
                        out = args.out / f"r{round_}" / f"{server}-{prompts}-c{concurrency}"
                        summary = _profile(aiperf, port, tokenizer, args.out / f"{prompts}.jsonl", concurrency, out, args)
                        results.append({"round": round_, "server": server, "prompts": prompts,
                                        "concurrency": concurrency, **summary})
                        progress.advance(task)
                    if args.offline and server != "plain" and round_ == args.rounds - 1:
                        for prompts in sets[server]:
                            progress.update(task, description=f"{server} on {prompts}: served against in-process")
                            offline[f"{server}/{prompts}"] = _served_vs_offline(server, port, args.out / f"{prompts}.jsonl", args)
            order = order[1:] + order[:1]
    means = _means(results)
    payload = {"machine": _machine(), "args": {k: str(v) for k, v in vars(args).items()}, "runs": results,
               "means": means, "offline": offline}
    (args.out / "serve.json").write_text(json.dumps(payload, indent=2))
    console.print(_table(means, offline))
    _plot(means, results, args.out / "serve.png")
    console.print(f"wrote {args.out / 'serve.json'} and {args.out / 'serve.png'}")


def _aiperf() -> Path:
    exe = AIPERF_VENV / "bin" / "aiperf"
    if not exe.exists():
        with console.status(f"installing aiperf {AIPERF_VERSION} into {AIPERF_VENV}"):
            subprocess.run([sys.executable, "-m", "venv", str(AIPERF_VENV)], check=True)
            subprocess.run([str(AIPERF_VENV / "bin" / "pip"), "install", "-q", f"aiperf=={AIPERF_VERSION}"], check=True)
    return exe


def _write_prompts(path: Path, categories: tuple[str, ...] | None) -> None:
    """aiperf's single_turn format, one {"text": first turn} per line, taking the categories in
    turn (aiperf sends the file in order, so any first N prompts cover every category).
    ``None``: the repeated-request set, in its order."""
    if categories is None:
        groups = [[q.turns[0] for q in load_questions(REPEATED)]]
    else:
        by_category: dict[str, list[str]] = {c: [] for c in categories}
        for question in load_questions("spec_bench", list(categories)):
            by_category[question.category].append(question.turns[0])
        groups = list(zip(*by_category.values()))
    with path.open("w") as out:
        for group in groups:
            out.writelines(json.dumps({"text": text}) + "\n" for text in group)


class _Server:
    """`specdec serve` in a subprocess on a free port, stopped with SIGTERM (which must exit 0)."""

    def __init__(self, name: str, method_args: list[str], args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.cmd = [str(ROOT / ".venv" / "bin" / "specdec"), "serve", *method_args, "--port", str(self.port),
                    "--dtype", args.dtype, "--max-batch-size", str(args.max_batch_size),
                    "--served-model-name", "specdec"]
        self.log = args.out / f"server-{name}.log"

    def __enter__(self) -> int:
        self.proc = subprocess.Popen(self.cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} server exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self.port
            except OSError:
                time.sleep(1)
        raise SystemExit(f"{self.name} server did not become healthy; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        if code != 0:
            console.print(f"[red]{self.name} server exited with {code} on SIGTERM; see {self.log}[/]")


def _profile(aiperf: Path, port: int, tokenizer: str, prompts: Path, concurrency: int, out: Path,
             args: argparse.Namespace) -> dict:
    count = max(args.requests, 4 * concurrency)
    cmd = [str(aiperf), "profile", "--model", "specdec", "--url", f"http://127.0.0.1:{port}",
           "--endpoint-type", "chat", "--streaming", "--tokenizer", tokenizer,
           "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
           "--dataset-sampling-strategy", "sequential", "--concurrency", str(concurrency),
           "--request-count", str(count), "--warmup-request-count", str(args.warmup),
           # Without a rate, aiperf's timing manager polls for a free slot without sleeping and
           # takes a whole core from the server; a constant 50 requests/s cap makes it sleep
           # 20 ms between polls, and concurrency still bounds the requests in flight.
           "--request-rate", str(POLL_RATE), "--arrival-pattern", "constant",
           "--extra-inputs", json.dumps({"max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0}),
           "--use-server-token-count", "--no-server-metrics", "--no-gpu-telemetry",
           "--artifact-dir", str(out), "--ui", "none"]
    # aiperf 0.13 takes a local tokenizer directory for a hub id when HF_HUB_OFFLINE is set.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    (out / "aiperf.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "aiperf.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"aiperf failed ({proc.returncode}); see {out / 'aiperf.log'}")
    data = json.loads((out / "profile_export_aiperf.json").read_text())

    def avg(key: str) -> float | None:
        return (data.get(key) or {}).get("avg")

    return {
        "requests": avg("request_count"),
        "ttft_ms": avg("time_to_first_token"),
        "itl_ms": avg("inter_token_latency"),
        "request_latency_ms": avg("request_latency"),
        "output_tokens_per_second": avg("output_token_throughput"),
        "output_tokens_per_second_per_user": avg("output_token_throughput_per_user"),
        "output_sequence_length": avg("output_sequence_length"),
        "error_rate": avg("request_error_rate"),
    }


def _served_vs_offline(server: str, port: int, prompts: Path, args: argparse.Namespace) -> dict:
    """Tokens/s of the method in-process (``LLM.generate``, as ``specdec bench`` times it) and
    served (one streamed chat request at a time), prompt by prompt in turn, the order alternating."""
    import httpx

    from specdec import LLM, SamplingParams
    from specdec.cli.common import quiet_transformers

    quiet_transformers()
    texts = [json.loads(line)["text"] for line in prompts.open()][: args.warmup + args.requests]
    llm = LLM(None, {"method": SERVERS[server][0][1]}, dtype=args.dtype)
    client = httpx.Client(timeout=600)  # one connection for every request, as a serving client keeps
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    body = {"model": "specdec", "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}

    def offline(text: str) -> int:
        return len(llm.generate(text, params, chat=True)[0].token_ids)

    def served(text: str) -> int:
        request = {**body, "messages": [{"role": "user", "content": text}]}
        with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=request) as reply:
            chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
        return chunks[-1]["usage"]["completion_tokens"]

    totals = {"offline": [0, 0.0], "served": [0, 0.0]}
    runners = {"offline": offline, "served": served}
    for i, text in enumerate(texts):
        for mode in ("offline", "served") if i % 2 == 0 else ("served", "offline"):
            start = time.perf_counter()
            tokens = runners[mode](text)
            if i >= args.warmup:
                totals[mode][0] += tokens
                totals[mode][1] += time.perf_counter() - start
    llm.close()
    client.close()
    rates = {mode: tokens / seconds for mode, (tokens, seconds) in totals.items()}
    return {"offline_tokens_per_second": rates["offline"], "served_tokens_per_second": rates["served"],
            "served_over_offline": rates["served"] / rates["offline"], "prompts": len(texts) - args.warmup}


def _machine() -> dict:
    import platform

    import torch

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags,
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}


#: aiperf's figures that are averaged over rounds.
METRICS = ("requests", "ttft_ms", "itl_ms", "request_latency_ms", "output_tokens_per_second",
           "output_tokens_per_second_per_user", "output_sequence_length", "error_rate")


def _by_run(results: list[dict]) -> dict[tuple, list[dict]]:
    """Each round's result, grouped by (server, prompt set, concurrency), in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["server"], r["prompts"], r["concurrency"]), []).append(r)
    return groups


def _means(results: list[dict]) -> list[dict]:
    """Each server, prompt set and concurrency's figures averaged over the rounds, with each
    round's ratios to the plain server of the same round (``itl_gains``, ``throughput_ratios``)
    and the ratios of the means (``itl_gain``, ``throughput_ratio``)."""
    groups = _by_run(results)
    means = {}
    for (server, prompts, concurrency), rows in groups.items():
        mean = means[server, prompts, concurrency] = {
            "server": server, "prompts": prompts, "concurrency": concurrency, "rounds": len(rows)}
        for metric in METRICS:
            values = [r[metric] for r in rows if r[metric] is not None]
            mean[metric] = sum(values) / len(values) if values else None
    for (server, prompts, concurrency), mean in means.items():
        plain = {r["round"]: r for r in groups.get(("plain", prompts, concurrency), [])}
        pairs = [] if server == "plain" else [
            (r, plain[r["round"]]) for r in groups[server, prompts, concurrency] if r["round"] in plain]
        base = means.get(("plain", prompts, concurrency))
        mean["itl_gains"] = [p["itl_ms"] / r["itl_ms"] for r, p in pairs if r["itl_ms"] and p["itl_ms"]]
        mean["throughput_ratios"] = [r["output_tokens_per_second"] / p["output_tokens_per_second"]
                                     for r, p in pairs if p["output_tokens_per_second"]]
        mean["itl_gain"] = base["itl_ms"] / mean["itl_ms"] if pairs and mean["itl_ms"] else None
        mean["throughput_ratio"] = (mean["output_tokens_per_second"] / base["output_tokens_per_second"]
                                    if pairs and base["output_tokens_per_second"] else None)
    return list(means.values())


def _ratios(mean: float | None, each: list[float]) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f}x" + (f" ({', '.join(f'{x:.2f}' for x in each)})" if len(each) > 1 else "")


def _table(means: list[dict], offline: dict) -> Table:
    rounds = max((m["rounds"] for m in means), default=1)
    table = Table(title=f"specdec serve under aiperf (streaming chat, greedy, ignore_eos; means of {rounds} rounds)",
                  caption="ratios to the plain server: of the means (of each round's pair)\n"
                          "*: one request at a time from a light client, in turn with in-process decoding (--offline)")
    for col in ("server", "prompts", "conc.", "TTFT ms", "ITL ms", "ITL gain", "out tok/s", "vs plain", "errors %"):
        table.add_column(col, justify="left" if col in ("server", "prompts") else "right")
    for m in means:
        table.add_row(m["server"], m["prompts"], str(m["concurrency"]), f"{m['ttft_ms']:.0f}", f"{m['itl_ms']:.1f}",
                      _ratios(m["itl_gain"], m["itl_gains"]), f"{m['output_tokens_per_second']:.1f}",
                      _ratios(m["throughput_ratio"], m["throughput_ratios"]), f"{m['error_rate'] or 0:.0f}")
    for key, o in offline.items():
        server, prompts = key.split("/")
        table.add_row(f"{server} in-process", prompts, "1*", "-", "-", "-", f"{o['offline_tokens_per_second']:.1f}", "-", "-")
        table.add_row(f"{server} served*", prompts, "1*", "-", "-", "-", f"{o['served_tokens_per_second']:.1f}",
                      f"{o['served_over_offline']:.2f}x in-process", "-")
    return table


def _plot(means: list[dict], results: list[dict], path: Path) -> None:
    """Bars: the means over rounds; dots: each round (``means`` is in :func:`_by_run`'s order)."""
    groups = _by_run(results)
    labels = [f"{m['server']}\n{m['prompts']}\nc{m['concurrency']}" for m in means]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, len(means) * 1.1), 4.5))
    for ax, key, title in ((axes[0], "itl_ms", "inter-token latency (ms, lower is better)"),
                           (axes[1], "output_tokens_per_second", "output tokens/s (higher is better)")):
        ax.bar(range(len(means)), [m[key] or 0 for m in means],
               color=["#888" if m["server"] == "plain" else "#2a7" for m in means])
        for x, rows in enumerate(groups.values()):
            rounds = [r[key] for r in rows if r[key] is not None]
            ax.plot([x] * len(rounds), rounds, "k.", markersize=4)
        ax.set_xticks(range(len(means)), labels, fontsize=7)
        ax.set_title(title, fontsize=10)
    fig.suptitle("specdec serve, aiperf streaming chat (bars: mean over rounds; dots: each round)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
