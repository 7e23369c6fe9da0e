"""Prometheus metrics with vLLM's names, in a registry of the server's own.

prometheus_client appends ``_total`` to counters, so ``vllm:spec_decode_num_drafts`` is exposed
as ``vllm:spec_decode_num_drafts_total``, exactly as vLLM exposes it. vLLM has no counter for
drafts kept by an acceptance rule that is not lossless, so that one has specdec's own prefix:
``specdec:spec_decode_num_lossy_accepted_tokens`` (0 for a lossless method). Every series
carries a ``model_name`` label. Counters move with every engine step, from the difference between a
request's cumulative metrics in successive deltas; the engine thread records, the ``/metrics``
route renders (prometheus_client is thread-safe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from specdec.requests import RequestDelta

# vLLM's buckets.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)


@dataclass
class RequestTracker:
    """A request's timestamps and the counts already added to the counters."""

    arrival: float
    last_token: float | None = None
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_lossy_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        # No `*_created` series beside each metric (a process-wide switch; vLLM turns it off too).
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.model_name = model_name
        name = ["model_name"]

        def counter(metric: str, doc: str) -> Counter:
            return Counter(metric, doc, name, registry=self.registry).labels(model_name)

        def histogram(metric: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(metric, doc, name, buckets=buckets, registry=self.registry).labels(model_name)

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, name, registry=self.registry).labels(model_name)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Draft steps (steps that proposed at least one token).")
        self.num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.num_lossy_accepted_tokens = counter(
            "specdec:spec_decode_num_lossy_accepted_tokens",
            "Draft tokens accepted by a rule that is not lossless (counted in the accepted tokens too).",
        )
        self._accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by position in the draft.",
            ["model_name", "position"], registry=self.registry,
        )
        self._request_success = Counter(
            "vllm:request_success", "Finished requests, by finish reason (stop, length, abort, error).",
            ["model_name", "finished_reason"], registry=self.registry,
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting for a place in the batch.")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first token.", _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Time between successive engine steps that gave a request tokens.", _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the end of the request.",
                             _E2E_BUCKETS)

    def observe(self, tracker: RequestTracker, delta: RequestDelta, now: float) -> None:
        """Count what ``delta`` adds to its request (``now``: when the engine produced it)."""
        if delta.new_token_ids:
            if tracker.last_token is None:
                self.ttft.observe(now - tracker.arrival)
                self.prompt_tokens.inc(delta.num_prompt_tokens)
                self.prefix_cache_queries.inc(delta.num_prompt_tokens)
                self.prefix_cache_hits.inc(delta.metrics.num_cached_tokens)
            else:
                self.itl.observe(now - tracker.last_token)
            tracker.last_token = now
            self.generation_tokens.inc(len(delta.new_token_ids))
        m = delta.metrics
        self.num_drafts.inc(m.num_drafts - tracker.num_drafts)
        self.num_draft_tokens.inc(m.num_draft_tokens - tracker.num_draft_tokens)
        self.num_accepted_tokens.inc(m.num_accepted_tokens - tracker.num_accepted_tokens)
        self.num_lossy_accepted_tokens.inc(m.num_lossy_accepted_tokens - tracker.num_lossy_accepted_tokens)
        tracker.num_drafts, tracker.num_draft_tokens, tracker.num_accepted_tokens, tracker.num_lossy_accepted_tokens = (
            m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, m.num_lossy_accepted_tokens
        )
        for position, accepted in enumerate(m.num_accepted_tokens_per_pos):
            seen = tracker.accepted_per_pos[position] if position < len(tracker.accepted_per_pos) else 0
            if accepted > seen:
                self._accepted_per_pos.labels(self.model_name, str(position)).inc(accepted - seen)
        tracker.accepted_per_pos = list(m.num_accepted_tokens_per_pos)
        if delta.finished:
            self._request_success.labels(self.model_name, str(delta.finish_reason)).inc()
            self.e2e.observe(now - tracker.arrival)

    def observe_failure(self, tracker: RequestTracker, now: float) -> None:
        """Count a request the engine could not finish (its thread or a step failed) as ended
        with an error."""
        self._request_success.labels(self.model_name, "error").inc()
        self.e2e.observe(now - tracker.arrival)

    def set_load(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)
