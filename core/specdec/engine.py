"""The speculative decoding loop: draft (plugin) -> one target forward -> verify -> accept.

Plain decoding is the same loop with empty drafts, so the baseline and every method share one
code path and their timings compare fairly.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from specdec.config import SpeculativeConfig
from specdec.draft_policy import AcceptanceEstimate, ContextCost, DraftTime, ResumeCost, StepTime
from specdec.errors import ConfigError, PluginError, SpecdecError
from specdec.kv_cache import BatchKVCache
from specdec.plugins import PluginRegistry
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.resources import TargetContext
from specdec.runner import ModelRunner
from specdec.sampling import SamplingParams, greedy_tokens, logits_to_probs, sample
from specdec.stopping import StopChecker, eos_token_ids


class Engine:
    """Runs requests in batches of up to ``max_batch_size``; requests join as others finish.

    Every request keeps its own accepted count per step (ragged acceptance), stop conditions and
    sampling parameters. A request is prefilled alone, then its cache row joins the batch; each
    step drafts for the whole batch (one hook call), verifies every row in one target forward,
    and finished requests leave the batch at once.
    """

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        config: SpeculativeConfig,
        registry: PluginRegistry,
        max_batch_size: int = 8,
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size: must be at least 1, got {max_batch_size}")
        self.runner = runner
        self.config = config
        self.max_batch_size = max_batch_size
        self.method = registry.method_for_config(config)
        self.hook = registry.hook
        self.target = TargetContext(runner, tokenizer, runner.device, runner.dtype)
        self.stops = StopChecker(tokenizer, eos_token_ids(runner.model, tokenizer), runner.max_length)
        self._sync = torch.cuda.synchronize if runner.device.type == "cuda" else None
        try:
            self.resource_manager = self.hook.specdec_resource_manager(config=config, target=self.target)
        except SpecdecError:
            raise
        except Exception as exc:
            raise PluginError(f"method {self.method.name!r} failed to set up: {type(exc).__name__}: {exc}") from exc
        self._next_id = 0
        self._adaptive = config.adaptive_draft_len and config.max_draft_tokens > 0
        #: Measured forward cost by batch size (adaptive draft length only).
        self.forward_costs: dict[int, ContextCost] = {}
        #: What verify steps really cost against the warm-up's forward costs, by batch size.
        self.step_times: dict[int, StepTime] = {}
        #: Drafting time per drafted token (per round: the longest proposal), by batch size.
        self.draft_time: dict[int, DraftTime] = {}
        #: The setup a drafting run pays when drafting resumes after a pause.
        self.resume_cost = ResumeCost(config.adaptive_window)
        #: Acceptance over the engine's recent batch steps: the prior of each request's own estimate.
        self.acceptance = AcceptanceEstimate(4 * config.adaptive_window)

    def close(self) -> None:
        if self.resource_manager is not None:
            self.resource_manager.release()
            self.resource_manager = None

    @torch.inference_mode()
    def warmup(self, max_batch_size: int = 1) -> None:
        """Run forwards of every width a step can use for batches of 1 .. ``max_batch_size``.

        The first forward of a new shape pays one-time setup (CPU matmul primitives, CUDA
        kernels); benchmarks call this so that cost is not timed. With the adaptive draft length
        on, measuring the forward cost of each batch size does exactly that.
        """
        for rows in range(1, min(max_batch_size, self.max_batch_size) + 1):
            if self._adaptive:
                self._cost(rows)
                continue
            cache = self.runner.new_cache(rows)
            self.runner.forward_rows(cache, [[0] * 32] * rows)
            for width in range(1, self.config.max_draft_tokens + 2):
                self.runner.forward_rows(cache, [[0] * width] * rows)
                self.runner.rollback(cache, width)

    def _cost(self, rows: int) -> ContextCost:
        if rows not in self.forward_costs:
            self.forward_costs[rows] = ContextCost.measure(
                self.runner, self.config.max_draft_tokens + 1, rows=rows, sync=self._sync
            )
        return self.forward_costs[rows]

    def new_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        generator = None
        if not params.greedy and params.seed is not None:
            generator = torch.Generator(device="cpu").manual_seed(params.seed)
        request = Request(self._next_id, list(prompt_ids), len(prompt_ids), params, generator)
        request.acceptance = AcceptanceEstimate(self.config.adaptive_window, prior=self.acceptance)
        self._next_id += 1
        return request

    @torch.inference_mode()
    def generate(self, requests: list[Request]) -> list[Request]:
        """Run ``requests`` to completion, at most ``max_batch_size`` at a time, in arrival order.

        Every prompt is checked before any work starts, so one bad prompt loses nothing.
        """
        if self.resource_manager is None:
            raise SpecdecError("this LLM has been closed")
        for request in requests:
            self._check_prompt(request)
        waiting = deque(requests)
        running: list[Request] = []
        cache = self.runner.new_cache(rows=0)
        try:
            while waiting or running:
                self._refill(waiting, running, cache)
                if running:
                    self._step(running, cache, draining=not waiting)
        finally:
            for request in running:
                self._finish(request)
        return requests

    def _refill(self, waiting: deque[Request], running: list[Request], cache: BatchKVCache) -> None:
        """Finished requests leave ``running`` and waiting ones join, up to ``max_batch_size``.

        A newcomer takes a finished request's row in place (:meth:`BatchKVCache.replace_row`);
        rows nobody takes are dropped, and newcomers beyond the free rows join at the end
        together, so the batch's whole cache is copied at most twice per call rather than once
        per request that leaves or joins. A request is in ``running`` until it is freed, so that
        ``generate`` frees whatever an error interrupts.
        """
        free = [row for row, request in enumerate(running) if request.finished]
        joining: list[tuple[Request, BatchKVCache]] = []
        try:
            while waiting and len(running) - len(free) + len(joining) < self.max_batch_size:
                request = waiting.popleft()
                row_cache = self._prefill(request)
                if request.finished:
                    self._finish(request)
                elif free:
                    row = free.pop(0)
                    cache.replace_row(row, row_cache)
                    left, running[row] = running[row], request
                    self._finish(left)
                else:
                    joining.append((request, row_cache))
        except BaseException:
            for request, _ in joining:
                self._finish(request)
            raise
        if free:
            left = [running[row] for row in free]
            dropped = set(free)
            keep = [row for row in range(len(running)) if row not in dropped]
            running[:] = [running[row] for row in keep]
            cache.select_rows(keep)
            for request in left:
                self._finish(request)
        if joining:
            cache.append_rows(*(row_cache for _, row_cache in joining))
            running.extend(request for request, _ in joining)

    def _check_prompt(self, request: Request) -> None:
        if not request.token_ids:
            raise ConfigError("prompt: empty (it must hold at least one token)")
        if not all(0 <= t < self.runner.vocab_size for t in request.token_ids):
            raise ConfigError(f"prompt: token ids must lie in [0, {self.runner.vocab_size})")
        if len(request.token_ids) >= self.runner.max_length:
            raise ConfigError(
                f"prompt: {len(request.token_ids)} tokens do not fit the model's context of {self.runner.max_length}"
            )

    def _prefill(self, request: Request) -> BatchKVCache:
        """Forward the prompt alone; its first token is chosen and the method sees the request."""
        start = time.perf_counter()
        cache = self.runner.new_cache()
        prefill = self.runner.forward(cache, request.token_ids, last_only=True)
        request.target_output = prefill
        self._append(request, [self._pick(prefill.logits[-1], request)])
        request.metrics.time_prefill = time.perf_counter() - start
        self.resource_manager.add_request(request)
        return cache

    def _finish(self, request: Request) -> None:
        request.target_output = None
        self.resource_manager.free_request(request)

    def _step(self, batch: list[Request], cache: BatchKVCache, draining: bool = False) -> None:
        """One draft -> verify -> accept round for every request of the batch.

        ``draining``: no request waits for a row, so the batch only shrinks from here on.
        """
        runner, config = self.runner, self.config
        limit = config.draft_len_for_batch(len(batch))
        # Measured once per batch size (at warmup, or here the first time), before the clock starts,
        # then corrected by what this engine's steps at that batch size have really taken.
        warmup_cost = self._cost(len(batch)).at(max(cache.lengths)) if self._adaptive and limit > 0 else None
        step_time = self.step_times.setdefault(len(batch), StepTime()) if warmup_cost is not None else None
        cost = step_time.correct(warmup_cost) if step_time is not None else None
        step_start = time.perf_counter()
        for request in batch:
            # The step emits one token more than it drafts.
            request.max_draft_len = max(min(limit, self.stops.tokens_left(request) - 1), 0)
        if cost is not None:
            # A draining batch whose lengths are known ends with its slowest request (draft_policy).
            remaining = [self.stops.known_remaining(r) for r in batch] if draining else [None]
            remaining = None if None in remaining else remaining
            # Before drafting: a batch whose recent acceptance does not pay for the drafting and
            # the wider forward skips the drafter.
            measured = self.draft_time.get(len(batch))
            unit = cost.base_seconds
            draft_cost = measured.seconds / unit if measured is not None and unit else 0.0
            setup_cost = self.resume_cost.seconds_per_step(len(batch)) / unit if unit else 0.0
            tree_depth = config.max_draft_len if config.max_draft_tokens > config.max_draft_len else None
            keep = cost.best_length(
                [r.acceptance for r in batch], [r.max_draft_len for r in batch], draft_cost, tree_depth, setup_cost, remaining
            )
            if keep == 0 and measured is not None:
                measured.fade(config.adaptive_window)
            for request in batch:
                request.max_draft_len = min(request.max_draft_len, keep)
        if any(r.max_draft_len for r in batch):
            setup, draft_start = self.resource_manager.setup_seconds(), time.perf_counter()
            proposals = self._draft(batch)
            longest = max(len(p) for p in proposals)
            if longest:
                setup = self.resource_manager.setup_seconds() - setup
                self.resume_cost.drafted(len(batch), setup)
                elapsed = time.perf_counter() - draft_start - setup
                if len(batch) in self.draft_time:
                    self.draft_time[len(batch)].record(elapsed / longest)
                else:
                    self.draft_time[len(batch)] = DraftTime(elapsed / longest)
        else:
            proposals = [DraftProposal() for _ in batch]
        if cost is not None and any(len(p) for p in proposals) and all(p.parents is None for p in proposals):
            # After drafting: the offered lengths are known (an n-gram often offers fewer). A tree
            # was sized by its method to the budget; cutting it by chain estimates would lose
            # the branches that make it worth drafting.
            keep = cost.best_length([r.acceptance for r in batch], [len(p) for p in proposals], remaining=remaining)
            proposals = [_truncate(p, keep) if len(p) > keep else p for p in proposals]
        if not any(len(p) for p in proposals):
            self.resume_cost.paused()
        drafted = time.perf_counter()
        rows = [[r.token_ids[-1], *p.token_ids] for r, p in zip(batch, proposals)]
        trees = [None if p.parents is None else [-1, *(q + 1 for q in p.parents)] for p in proposals]
        starts = list(cache.lengths)
        if any(t is not None for t in trees):
            outputs = runner.forward_rows(cache, rows, parents=trees)
        elif len(batch) == 1:
            outputs = [runner.forward(cache, rows[0])]
        else:
            outputs = runner.forward_rows(cache, rows)
        if self._sync:
            self._sync()
        forwarded = time.perf_counter()
        for request, output in zip(batch, outputs):
            request.target_output = output
        results = self._verify(batch, proposals, [o.logits for o in outputs])
        for row, (proposal, result) in enumerate(zip(proposals, results)):
            path = [starts[row] + 1 + i for i in result.path()]
            if path != list(range(starts[row] + 1, starts[row] + 1 + len(path))):
                cache.move_entries(row, path, starts[row] + 1)
        runner.rollback_rows(cache, [len(p) - res.num_accepted for p, res in zip(proposals, results)])
        verified = time.perf_counter()
        outcomes = []
        for request, proposal, result in zip(batch, proposals, results):
            depth = _depth(proposal)
            request.metrics.record_step(len(proposal), result.num_accepted, depth)
            if len(proposal):
                outcomes.append((depth, result.num_accepted))
                request.acceptance.update(*outcomes[-1])
            else:
                request.acceptance.skip()
            self._append(request, result.emitted(proposal))
        self.acceptance.record_batch(outcomes)
        self.hook.specdec_accept(config=config, requests=batch, results=results, resource_manager=self.resource_manager)
        done = time.perf_counter()
        if step_time is not None:
            drafts = max(len(p) for p in proposals)
            step_time.record(drafts, done - drafted, warmup_cost.seconds[drafts])
        for request in batch:
            metrics = request.metrics
            metrics.time_draft += drafted - step_start
            metrics.time_forward += forwarded - drafted
            metrics.time_verify += verified - forwarded
            metrics.time_decode += done - step_start

    def _draft(self, requests: list[Request]) -> list[DraftProposal]:
        proposals = self.hook.specdec_prepare_draft_tokens(
            config=self.config, requests=requests, resource_manager=self.resource_manager
        )
        if proposals is None or len(proposals) != len(requests):
            raise PluginError(f"method {self.method.name!r} returned no draft proposal for this step")
        vocab = self.runner.vocab_size
        for i, (request, proposal) in enumerate(zip(requests, proposals)):
            proposal.token_ids = [int(t) for t in proposal.token_ids]
            if not all(0 <= t < vocab for t in proposal.token_ids):
                raise PluginError(f"method {self.method.name!r} drafted a token id outside [0, {vocab})")
            if proposal.parents is not None and (
                len(proposal.parents) != len(proposal)
                or not all(-1 <= int(p) < i for i, p in enumerate(proposal.parents))
            ):
                raise PluginError(
                    f"method {self.method.name!r} proposed a tree whose parents do not come before their children"
                )
            if len(proposal) > request.max_draft_len:
                proposals[i] = _truncate(proposal, request.max_draft_len)
        return proposals

    def _verify(self, requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> list[VerifyResult]:
        results = self.hook.specdec_verify(config=self.config, requests=requests, proposals=proposals, target_logits=logits)
        if results is None or len(results) != len(requests):
            raise PluginError(f"method {self.method.name!r}: verify returned no result for this step")
        for result, proposal in zip(results, proposals):
            if not 0 <= result.num_accepted <= len(proposal) or not 0 <= result.next_token < self.runner.vocab_size or (
                proposal.parents is not None and not _is_tree_path(proposal.parents, result)
            ):
                raise PluginError(
                    f"method {self.method.name!r}: verify kept {result.num_accepted} of {len(proposal)} drafts "
                    f"with next token {result.next_token}"
                )
        return results

    def _pick(self, logits: torch.Tensor, request: Request) -> int:
        if request.params.greedy:
            return int(greedy_tokens(logits).item())
        return sample(logits_to_probs(logits, request.params), request.generator)

    def _append(self, request: Request, tokens: list[int]) -> None:
        """Append tokens one at a time, stopping exactly at the first stop condition."""
        for token in tokens:
            request.token_ids.append(token)
            reason = self.stops.check(request)
            if reason is not None:
                request.finished = True
                request.finish_reason = reason
                break
        request.metrics.num_output_tokens = request.num_output_tokens

    def final_text(self, request: Request) -> str:
        return self.stops.final_text(request)


def _truncate(proposal: DraftProposal, length: int) -> DraftProposal:
    """The first ``length`` drafts (for a tree: its first nodes, still a tree, as parents come first)."""
    probs = proposal.probs[:length] if proposal.probs is not None else None
    parents = proposal.parents[:length] if proposal.parents is not None else None
    return DraftProposal(proposal.token_ids[:length], probs, parents)


def _depth(proposal: DraftProposal) -> int:
    """How far down a proposal reaches: its length for a chain, its deepest path for a tree."""
    if proposal.parents is None:
        return len(proposal)
    depth: list[int] = []
    for parent in proposal.parents:
        depth.append(depth[parent] + 1 if parent >= 0 else 1)
    return max(depth, default=0)


def _is_tree_path(parents: list[int], result: VerifyResult) -> bool:
    """Whether a tree's verify result names a root-down path of ``num_accepted`` nodes."""
    path = result.accepted_nodes
    if path is None or len(path) != result.num_accepted:
        return False
    return all(0 <= node < len(parents) and parents[node] == (path[k - 1] if k else -1) for k, node in enumerate(path))
