"""The request-level engine: requests join and leave between steps; each step drafts (plugin),
runs one target forward, verifies and accepts, for the whole running batch.

Plain decoding is the same loop with empty drafts, so the baseline and every method share one
code path and their timings compare fairly. How many tokens to draft is not decided here: the
step asks :class:`~specdec.draft_budget.DraftBudget` for budgets and tells it what happened.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from specdec.config import SpeculativeConfig
from specdec.detokenize import IncrementalDetokenizer
from specdec.draft_budget import DraftBudget, StepBudget, depth
from specdec.errors import ConfigError, NonFiniteLogitsError, PluginError, QueueFullError, SpecdecError
from specdec.host_copy import HostCopy
from specdec.kv_cache import BatchKVCache
from specdec.logits_processing import LogitsProcessing, VerifyRows
from specdec.logprobs import token_logprobs
from specdec.plugins import PluginRegistry
from specdec.prefill import Prefill, PromptForward
from specdec.prefix_cache import PrefixCache
from specdec.proposal_checks import checked_proposal, described
from specdec.requests import DraftProposal, Request, RequestDelta, VerifyResult
from specdec.resources import TargetContext
from specdec.runner import ModelRunner
from specdec.sampling import PositionNoise, SamplingParams, invalid_logits, logits_to_probs
from specdec.stopping import StopChecker, eos_token_ids
from specdec.suffix import SuffixDrafts
from specdec.verify import target_picks

T = TypeVar("T")
logger = logging.getLogger("specdec.engine")


class Engine:
    """Runs requests in batches of up to ``max_batch_size``; the rest wait, at most
    ``max_queue_size`` of them (``None``: no bound).

    :meth:`add_request` queues a request at any time, :meth:`step` runs one scheduling step and
    returns what it did for each request (:class:`~specdec.requests.RequestDelta`),
    :meth:`abort` ends a request and frees its cache row and drafter state at once. Every request
    keeps its own accepted count per step (ragged acceptance), stop conditions and sampling
    parameters. A request is prefilled alone (requests with the same prompt joining together share
    one prefill forward), then its cache row joins the batch. With a ``prefix_cache``, prefill
    reuses the leading blocks of earlier prompts (:mod:`specdec.prefix_cache`).

    An exception raised by a plugin during a step ends only the requests it can be tied to
    (``finish_reason="error"``, the message in ``error``); the others go on, and the engine
    stays usable. The engine is not thread-safe: call it from one thread.
    """

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        config: SpeculativeConfig,
        registry: PluginRegistry,
        max_batch_size: int = 8,
        max_queue_size: int | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size: must be at least 1, got {max_batch_size}")
        if max_queue_size is not None and max_queue_size < 1:
            raise ConfigError(f"max_queue_size: must be at least 1, got {max_queue_size}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.method = registry.method_for_config(config)
        self.hook = registry.hook
        self.target = TargetContext(runner, tokenizer, runner.device, runner.dtype, max_batch_size)
        self.stops = StopChecker(tokenizer, eos_token_ids(runner.model, tokenizer), runner.max_length)
        self.processing = LogitsProcessing(self.target, self.stops.eos_token_ids, self.hook)
        self._sync = torch.cuda.synchronize if runner.device.type == "cuda" else None
        try:
            self.resource_manager = self.hook.specdec_resource_manager(config=config, target=self.target)
        except SpecdecError:
            raise
        except Exception as exc:
            raise PluginError(f"method {self.method.name!r} failed to set up: {type(exc).__name__}: {exc}") from exc
        runner.prepare(max_batch_size, config.max_verify_drafts + 1, show_progress=True)
        per_token = self.resource_manager is None or self.resource_manager.draft_cost_per_token
        self.policy = DraftBudget(runner, config, max_batch_size, self._sync, per_token)
        self.suffix_drafts = SuffixDrafts(config.sa_spec_threshold) if config.use_sa_spec else None
        self.prefill = Prefill(runner, prefix_cache)
        self.waiting: deque[Request] = deque()
        #: The batch, row for row with the cache; a finished request keeps its row until the
        #: next step gives it to a newcomer or drops it.
        self.running: list[Request] = []
        self._cache: BatchKVCache | None = None
        self._next_id = 0

    def close(self) -> None:
        for request in [*self.waiting, *self.running]:
            if not request.finished:
                self.abort(request.request_id)
        self._drop_finished_rows()
        if self.resource_manager is not None:
            self.resource_manager.release()
            self.resource_manager = None

    # -- the request-level API ----------------------------------------------------------------

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Raise :class:`ConfigError` naming the prompt if it cannot be decoded."""
        if not prompt_ids:
            raise ConfigError("prompt: empty (it must hold at least one token)")
        if not all(0 <= t < self.runner.vocab_size for t in prompt_ids):
            raise ConfigError(f"prompt: token ids must lie in [0, {self.runner.vocab_size})")
        if len(prompt_ids) >= self.runner.max_length:
            raise ConfigError(
                f"prompt: {len(prompt_ids)} tokens do not fit the model's context of {self.runner.max_length}"
            )

    def queue_has_room(self) -> bool:
        """Whether one more request may wait: ``max_queue_size`` counts the requests that will
        still wait once the free rows of the batch are taken."""
        free_rows = max(self.max_batch_size - self.num_running, 0)
        return self.max_queue_size is None or len(self.waiting) < self.max_queue_size + free_rows

    def new_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        """A request for ``prompt_ids``, not queued yet (:meth:`enqueue`). Raises
        :class:`ConfigError` for a prompt that cannot run."""
        if self.resource_manager is None:
            raise SpecdecError("this engine has been closed")
        self.check_prompt(prompt_ids)
        noise = None
        if not params.greedy and params.seed is not None:
            noise = PositionNoise(params.seed, self.runner.vocab_size)
        request = Request(self._next_id, [int(t) for t in prompt_ids], len(prompt_ids), params, noise)
        request.processors = self.processing.for_request(request.token_ids, params)
        request.acceptance = self.policy.new_estimate()
        request.suffix_acceptance = self.policy.new_suffix_estimate()
        request.detokenizer = IncrementalDetokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output)
        if params.logprobs is not None:
            request.logprobs = []
        self._next_id += 1
        return request

    def enqueue(self, request: Request) -> None:
        """Queue ``request``; it joins the batch at a coming step. Raises :class:`QueueFullError`
        when ``max_queue_size`` requests already wait."""
        if not self.queue_has_room():
            raise QueueFullError(f"the queue is full ({self.max_queue_size} requests wait); retry later")
        self.waiting.append(request)

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """Queue a request for ``prompt_ids``; returns its id (see :meth:`new_request`, :meth:`enqueue`)."""
        request = self.new_request(prompt_ids, params)
        self.enqueue(request)
        return request.request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or any(not r.finished for r in self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return sum(not r.finished for r in self.running)

    def abort(self, request_id: int) -> RequestDelta | None:
        """End a request now: its cache row and the method's state for it are freed at once.
        Returns its last delta (``finish_reason="abort"``), or ``None`` if it is not running or waiting."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                self._end(request, "abort")
                return self._delta(request)
        for request in self.running:
            if request.request_id == request_id and not request.finished:
                self._end(request, "abort")
                self._drop_finished_rows()
                return self._delta(request)
        return None

    @torch.inference_mode()
    def step(self, more_coming: bool = True) -> list[RequestDelta]:
        """One scheduling step: waiting requests join (prefilled) while the batch has room, then
        one draft -> verify -> accept round runs for the batch. Returns a delta for every request
        that was prefilled or ran in the round.

        ``more_coming=False`` promises that no request will be added until the current ones
        finish (offline ``generate``): a batch that only drains toward known lengths may then
        plan for its end (see :mod:`specdec.draft_policy`).
        """
        if self.resource_manager is None:
            raise SpecdecError("this engine has been closed")
        if self._cache is None or not self.running:
            self._cache = self.runner.new_batch_cache()
        prefilled: list[Request] = []
        batch: list[Request] = []
        try:
            self._refill(prefilled)
            batch = [r for r in self.running if not r.finished]
            if batch:
                self._step(draining=not more_coming and not self.waiting)
        except Exception as exc:  # a failure no plugin hook can be blamed for: the batch ends
            batch = batch or [r for r in self.running if not r.finished]
            self._fail_batch(f"the step failed: {type(exc).__name__}: {exc}")
        if not self.waiting:
            # Nobody will take the finished rows: free them now rather than at the next step.
            self._drop_finished_rows()
        touched = {r.request_id: r for r in [*prefilled, *batch]}
        return [self._delta(r) for r in touched.values()]

    def idle_work(self) -> bool:
        """Do one piece of measurement the policy still wants (one width of a batch size's forward
        costs: a few forwards); call when no request is pending. Returns ``False`` when nothing is
        left to do."""
        if self.running:  # measurements use the batch's cache: only while it is empty
            return False
        return self.policy.measure_step()

    @torch.inference_mode()
    def warmup(self, max_batch_size: int = 1) -> None:
        """Run forwards of every width a step can use for batches of 1 .. ``max_batch_size``.

        The first forward of a new shape pays one-time setup (CPU matmul primitives, CUDA
        kernels); benchmarks call this so that cost is not timed. With the adaptive draft length
        on, measuring the forward costs does that, at the batch sizes measured (powers of two
        and the largest).
        """
        rows_up_to = min(max_batch_size, self.max_batch_size)
        if self.policy.adaptive:
            self.policy.want(rows_up_to)
            while self.idle_work():
                pass
            return
        for rows in range(1, rows_up_to + 1):
            cache = self.runner.new_batch_cache(rows)
            self.runner.forward_rows(cache, [[0] * 32] * rows)
            for width in range(1, self.config.max_verify_drafts + 2):
                self.runner.forward_rows(cache, [[0] * width] * rows)
                self.runner.rollback(cache, width)

    def forget_finished(self) -> None:
        """Forget what the method and the suffix drafts keep of finished requests (see
        :meth:`~specdec.resources.ResourceManager.forget_finished`)."""
        if self.resource_manager is not None:
            self.resource_manager.forget_finished()
        if self.suffix_drafts is not None:
            self.suffix_drafts.cache.forget_finished()

    def final_text(self, request: Request) -> str:
        return self.stops.final_text(request)

    # -- scheduling ---------------------------------------------------------------------------

    def _refill(self, prefilled: list[Request]) -> None:
        """Finished requests leave the batch and waiting ones join, up to ``max_batch_size``;
        each request taken from the queue is added to ``prefilled``.

        A newcomer takes a finished request's row in place (:meth:`BatchKVCache.replace_row`);
        rows nobody takes are dropped, and newcomers beyond the free rows join at the end
        together, so the batch's whole cache is copied at most twice per call rather than once
        per request that leaves or joins.
        """
        cache, running = self._cache, self.running
        free = [row for row, request in enumerate(running) if request.finished]
        joining: list[tuple[Request, BatchKVCache]] = []
        forward: PromptForward | None = None
        try:
            while self.waiting and len(running) - len(free) + len(joining) < self.max_batch_size:
                request = self.waiting.popleft()
                prefilled.append(request)
                forward = self._prefill(request, forward)
                if request.finished:
                    continue
                row_cache = forward.cache
                if free:
                    row = free.pop(0)
                    cache.replace_row(row, row_cache)
                    left, running[row] = running[row], request
                    self._release(left)
                else:
                    joining.append((request, row_cache))
            self._drop_finished_rows()
            if joining:
                cache.append_rows(*(row_cache for _, row_cache in joining))
                running.extend(request for request, _ in joining)
        except Exception as exc:
            # Newcomers not yet in the batch end here (the caller fails the batch itself).
            for request in prefilled:
                if request not in running and not request.finished:
                    self._end(request, "error", f"joining the batch failed: {type(exc).__name__}: {exc}")
                    self._release(request)
            raise

    def _drop_finished_rows(self, reason: str | None = None) -> None:
        """Drop the rows of finished requests (only those that ended for ``reason``, if given)
        from the batch and the cache, and free what they hold."""
        leaving = [r.finished and (reason is None or r.finish_reason == reason) for r in self.running]
        if not any(leaving):
            return
        keep = [row for row, gone in enumerate(leaving) if not gone]
        left = [request for request, gone in zip(self.running, leaving) if gone]
        if self._cache is not None:
            self._cache.select_rows(keep)
        self.running[:] = [self.running[row] for row in keep]
        for request in left:
            self._release(request)

    def _prefill(self, request: Request, previous: PromptForward | None) -> PromptForward | None:
        """Forward the prompt alone, or take ``previous`` if it forwarded the same prompt (the
        ``n`` choices of one prompt, retries: the same bits, one forward); the first token is
        chosen and the method sees the request, unless it finished (or failed) by then.
        Returns the prompt's forward, ``None`` if it failed."""
        start = time.perf_counter()
        forward = previous if previous is not None and previous.prompt == request.token_ids else None
        try:
            if forward is None:
                forward = self.prefill(request.token_ids)
            request.metrics.num_cached_tokens = forward.cached_tokens
            request.target_output = forward.output
            logits = forward.output.logits
            self._append(request, [self._pick(logits[-1], request)], logits[-1:])
        except Exception as exc:
            request.target_output = None
            self._end(request, "error", str(exc) if isinstance(exc, SpecdecError) else f"prefill failed: {type(exc).__name__}: {exc}")
            return None
        request.metrics.time_prefill = time.perf_counter() - start
        try:
            self.resource_manager.add_request(request)
        except Exception as exc:
            self._end(request, "error", self._plugin_message("add_request", exc))
        if request.finished:
            self._release(request)
        return forward

    @staticmethod
    def _end(request: Request, reason: str, error: str | None = None) -> None:
        """Mark ``request`` finished; a running one keeps its row until the row is dropped."""
        request.finished, request.finish_reason, request.error = True, reason, error

    def _release(self, request: Request) -> None:
        """Drop what an added request holds: its target output and the method's state for it."""
        request.target_output = None
        if self.suffix_drafts is not None:
            self.suffix_drafts.stop(request)
        if self.resource_manager is not None:
            try:
                self.resource_manager.free_request(request)
            except Exception as exc:
                # The request has ended and been reported; its output stands.
                logger.warning("%s", self._plugin_message("free_request", exc))

    def _fail_batch(self, message: str) -> None:
        for request in self.running:
            if not request.finished:
                self._end(request, "error", message)
        self._drop_finished_rows()
        self._cache = self.runner.new_batch_cache()

    def _delta(self, request: Request) -> RequestDelta:
        new = request.output_ids[request.num_reported :]
        logprobs = request.logprobs[request.num_reported :] if request.logprobs is not None else None
        request.num_reported = request.num_output_tokens
        metrics = dataclasses.replace(
            request.metrics, num_accepted_tokens_per_pos=list(request.metrics.num_accepted_tokens_per_pos)
        )
        text = request.detokenizer.delta(request.output_ids, request.finished) if request.detokenizer else ""
        return RequestDelta(
            request.request_id, new, text, request.finished, request.finish_reason, request.error,
            request.num_prompt_tokens, metrics, logprobs,
        )

    # -- the step -----------------------------------------------------------------------------

    def _step(self, draining: bool) -> None:
        """One draft -> verify -> accept round for every request of the batch.

        ``draining``: no request waits for a row and none will be added, so the batch only
        shrinks from here on.
        """
        batch, cache, runner = list(self.running), self._cache, self.runner
        remaining = [self.stops.known_remaining(r) for r in batch] if draining else None
        plan = self.policy.plan(batch, max(cache.lengths), [self.stops.tokens_left(r) for r in batch], remaining)
        step_start = time.perf_counter()
        for request, budget in zip(batch, plan.budgets):
            request.max_draft_len = budget
        proposals = [DraftProposal() for _ in batch]
        if plan.drafts:
            suffix = self._suffix_drafts(batch, plan)
            if any(request.max_draft_len for request in batch):
                setup = self.resource_manager.setup_seconds()
                proposals = self._draft(batch)
                batch, proposals, suffix = self._survivors(batch, proposals, suffix)
                setup = self.resource_manager.setup_seconds() - setup
                proposals = self.policy.drafted(plan, batch, proposals, time.perf_counter() - step_start, setup)
            proposals = [p if s is None else s for p, s in zip(proposals, suffix)]
            batch, proposals = self._survivors(batch, self._usable_drafts(batch, proposals))
            if not batch:
                return
        drafted = time.perf_counter()
        starts = list(cache.lengths)
        proposals = [runner.fit_tree(p, start) for p, start in zip(proposals, starts)]
        rows = [[r.token_ids[-1], *p.token_ids] for r, p in zip(batch, proposals)]
        trees = [None if p.parents is None else [-1, *(q + 1 for q in p.parents)] for p in proposals]
        if any(t is not None for t in trees):
            outputs = runner.forward_rows(cache, rows, parents=trees)
        elif len(batch) == 1:
            outputs = [runner.forward(cache, rows[0])]
        else:
            outputs = runner.forward_rows(cache, rows)
        broken = HostCopy(torch.stack([invalid_logits(o.logits).any() for o in outputs]))
        if self._sync:
            self._sync()
        forwarded = time.perf_counter()
        for request, output in zip(batch, outputs):
            request.target_output = output
        results = self._verify(batch, proposals, [o.logits for o in outputs], broken.tolist())
        for row, (proposal, result) in enumerate(zip(proposals, results)):
            if result is None:
                continue
            slots = list(range(len(rows[row]))) if trees[row] is None else runner.tree_slots(trees[row], starts[row])
            path = [starts[row] + slots[1 + i] for i in result.path()]
            if path != list(range(starts[row] + 1, starts[row] + 1 + len(path))):
                cache.move_entries(row, path, starts[row] + 1)
        runner.rollback_rows(cache, [len(p) - (res.num_accepted if res else 0) for p, res in zip(proposals, results)])
        batch, proposals, results = self._survivors(batch, proposals, results)
        verified = time.perf_counter()
        for request, proposal, result in zip(batch, proposals, results):
            request.metrics.record_step(len(proposal), result.num_accepted, depth(proposal), result.num_lossy_accepted)
            rows = request.target_output.logits[result.emitted_rows()] if request.logprobs is not None else None
            self._append(request, result.emitted(proposal), rows)
        self._accept(batch, results)
        batch, proposals, results = self._survivors(batch, proposals, results)
        done = time.perf_counter()
        self.policy.observe(plan, batch, proposals, results, done - drafted)
        for request in batch:
            metrics = request.metrics
            metrics.time_draft += drafted - step_start
            metrics.time_forward += forwarded - drafted
            metrics.time_verify += verified - forwarded
            metrics.time_decode += done - step_start

    def _survivors(self, batch: list[Request], *columns: list[Any]) -> tuple[list[Any], ...]:
        """Drop the step's failed requests (their rows and state freed) and, row for row, their
        entries of ``columns``; returns the batch that goes on and the kept columns."""
        keep = [row for row, request in enumerate(batch) if request.finish_reason != "error"]
        if len(keep) < len(batch):
            self._drop_finished_rows("error")
        return ([batch[row] for row in keep], *([column[row] for row in keep] for column in columns))

    def _isolated(self, hook: str, call: Callable[[list[int]], Sequence[T]], batch: list[Request]) -> list[T | None]:
        """``call(rows)`` for every row of ``batch`` at once, one item per row. If it raises, each
        row is tried alone and the requests it still raises for end with the error (their item is
        ``None``): a plugin's failure stays with the requests it belongs to."""
        if not batch:
            return []
        try:
            return list(call(list(range(len(batch)))))
        except Exception as exc:
            if len(batch) == 1:
                self._end(batch[0], "error", self._plugin_message(hook, exc))
                return [None]
        items: list[T | None] = []
        for row, request in enumerate(batch):
            try:
                items.extend(call([row]))
            except Exception as exc:
                self._end(request, "error", self._plugin_message(hook, exc))
                items.append(None)
        return items

    def _plugin_message(self, hook: str, exc: Exception) -> str:
        if isinstance(exc, SpecdecError):
            return str(exc)
        return f"method {self.method.name!r} failed in {hook}: {type(exc).__name__}: {exc}"

    def _suffix_drafts(self, batch: list[Request], plan: StepBudget) -> list[DraftProposal | None]:
        """With ``use_sa_spec``, the suffix draft of each request whose match is long enough, as
        long as the policy finds worth verifying (up to ``sa_spec_max_draft_len``, whether or not
        its method drafts this step); its method drafts nothing for it this step."""
        if self.suffix_drafts is None:
            return [None] * len(batch)
        proposals = self.policy.suffix_drafted(plan, batch, self.suffix_drafts.propose(batch, plan.suffix_budgets))
        for request, proposal in zip(batch, proposals):
            if proposal is not None:
                request.max_draft_len = 0
                self.suffix_drafts.taken += 1
        return proposals

    def _draft(self, batch: list[Request]) -> list[DraftProposal]:
        def call(rows: list[int]) -> list[DraftProposal]:
            proposals = self.hook.specdec_prepare_draft_tokens(
                config=self.config, requests=[batch[i] for i in rows], resource_manager=self.resource_manager
            )
            if not isinstance(proposals, (list, tuple)) or len(proposals) != len(rows):
                raise PluginError(
                    f"method {self.method.name!r}: specdec_prepare_draft_tokens returned {described(proposals)}; "
                    f"expected a list of {len(rows)} DraftProposal, one per request"
                )
            return proposals

        proposals = self._isolated("specdec_prepare_draft_tokens", call, batch)
        for i, (request, proposal) in enumerate(zip(batch, proposals)):
            if request.finished:  # the hook failed for it
                proposals[i] = DraftProposal()
                continue
            try:
                proposals[i] = checked_proposal(proposal, self.method.name, self.runner.vocab_size, request.max_draft_len)
            except PluginError as exc:
                self._end(request, "error", str(exc))
                proposals[i] = DraftProposal()
        return proposals

    def _usable_drafts(self, batch: list[Request], proposals: list[DraftProposal]) -> list[DraftProposal]:
        """Each proposal cut before the first draft its request's processors forbid outright (a
        grammar, ``min_tokens``): the target forward spends no width on it."""
        usable = []
        for request, proposal in zip(batch, proposals):
            if request.processors is not None and len(proposal):
                start = time.perf_counter()
                try:
                    proposal = proposal.truncated(request.processors.usable_drafts(VerifyRows.of(request, proposal)))
                except Exception as exc:
                    self._end(request, "error", f"logits processing failed: {type(exc).__name__}: {exc}")
                request.metrics.time_logits_processing += time.perf_counter() - start
            usable.append(proposal)
        return usable

    def _processed(self, request: Request, logits: torch.Tensor, proposal: DraftProposal | None = None) -> torch.Tensor:
        """``logits`` (a verify forward's rows) processed by the request's processors, if any."""
        if request.processors is None:
            return logits
        start = time.perf_counter()
        try:
            processed = request.processors.apply(logits, VerifyRows.of(request, proposal))
        except Exception as exc:
            raise SpecdecError(f"logits processing failed: {type(exc).__name__}: {exc}") from exc
        finally:
            request.metrics.time_logits_processing += time.perf_counter() - start
        if bool((processed.max(-1).values == float("-inf")).any()):
            raise SpecdecError("logits processing failed: it left no token allowed")
        return processed

    def _verify(self, batch: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor],
                broken: list[bool]) -> list[VerifyResult | None]:
        """Each request's verify result; ``None`` for a request that ended here (its target logits
        are not finite, ``broken[row]``; its logits processing failed; or the method failed it).

        ``broken`` comes from the caller, computed right after the forward and copied to the host
        behind it (:class:`~specdec.host_copy.HostCopy`), so the check costs the step no wait of
        its own on CUDA: the step's one read of the device is the verify outcome."""
        logits = list(logits)
        for row, (request, bad) in enumerate(zip(batch, broken)):
            if bad:
                self._end(request, "error", str(NonFiniteLogitsError()))
                continue
            try:
                logits[row] = self._processed(request, logits[row], proposals[row])
            except SpecdecError as exc:
                self._end(request, "error", str(exc))
                broken[row] = True
        valid = [row for row, bad in enumerate(broken) if not bad]

        def call(rows: list[int]) -> list[VerifyResult]:
            rows = [valid[i] for i in rows]
            results = self.hook.specdec_verify(
                config=self.config, requests=[batch[i] for i in rows], proposals=[proposals[i] for i in rows],
                target_logits=[logits[i] for i in rows],
            )
            if not isinstance(results, (list, tuple)) or len(results) != len(rows) or not all(isinstance(r, VerifyResult) for r in results):
                raise PluginError(
                    f"method {self.method.name!r}: specdec_verify returned {described(results)}; "
                    f"expected a list of {len(rows)} VerifyResult, one per request"
                )
            return results

        results: list[VerifyResult | None] = [None] * len(batch)
        for row, result in zip(valid, self._isolated("specdec_verify", call, [batch[row] for row in valid])):
            results[row] = result
        for i, (request, proposal, result) in enumerate(zip(batch, proposals, results)):
            if result is not None and not _valid(result, proposal, self.runner.vocab_size):
                self._end(
                    request,
                    "error",
                    f"method {self.method.name!r}: verify kept {result.num_accepted} of {len(proposal)} drafts "
                    f"with next token {result.next_token} ({result.num_lossy_accepted!r} of them lossy-accepted)",
                )
                results[i] = None
        return results

    def _accept(self, batch: list[Request], results: list[VerifyResult]) -> None:
        def call(rows: list[int]) -> list[None]:
            self.hook.specdec_accept(
                config=self.config, requests=[batch[i] for i in rows], results=[results[i] for i in rows],
                resource_manager=self.resource_manager,
            )
            return [None] * len(rows)

        self._isolated("specdec_accept", call, batch)

    def _pick(self, logits: torch.Tensor, request: Request) -> int:
        """The first token after the prompt, as plain decoding picks it."""
        if invalid_logits(logits).item():
            raise NonFiniteLogitsError
        logits = self._processed(request, logits[None])[0]
        if request.params.greedy or request.noise is not None:
            return int(target_picks(request, logits[None])[0])
        return request.sample(logits_to_probs(logits, request.params))

    def _append(self, request: Request, tokens: list[int], logits: torch.Tensor | None) -> None:
        """Append tokens one at a time, stopping exactly at the first stop condition; with their
        log-probabilities when the request asks for them (``logits``: the target's rows they were
        chosen from, row by row)."""
        appended = 0
        for token in tokens:
            request.token_ids.append(token)
            appended += 1
            reason = self.stops.check(request)
            if reason is not None:
                request.finished = True
                request.finish_reason = reason
                break
        if request.logprobs is not None:
            request.logprobs += token_logprobs(logits, tokens[:appended], request.params.logprobs)
        if request.processors is not None:
            start = time.perf_counter()
            try:
                request.processors.accept(tokens[:appended])
            except Exception as exc:
                self._end(request, "error", f"logits processing failed: {type(exc).__name__}: {exc}")
            request.metrics.time_logits_processing += time.perf_counter() - start
        if request.noise is not None:
            request.noise.forget_before(len(request.token_ids))
        request.metrics.num_output_tokens = request.num_output_tokens


def _valid(result: VerifyResult, proposal: DraftProposal, vocab: int) -> bool:
    if not isinstance(result.num_accepted, int) or not isinstance(result.next_token, int):
        return False
    if not 0 <= result.num_accepted <= len(proposal) or not 0 <= result.next_token < vocab:
        return False
    if not isinstance(result.num_lossy_accepted, int) or not 0 <= result.num_lossy_accepted <= result.num_accepted:
        return False
    return proposal.parents is None or _is_tree_path(proposal.parents, result)


def _is_tree_path(parents: list[int], result: VerifyResult) -> bool:
    """Whether a tree's verify result names a root-down path of ``num_accepted`` nodes."""
    path = result.accepted_nodes
    if path is None or len(path) != result.num_accepted:
        return False
    return all(0 <= node < len(parents) and parents[node] == (path[k - 1] if k else -1) for k, node in enumerate(path))
