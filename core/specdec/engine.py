"""The speculative decoding loop: draft (plugin) -> one target forward -> verify -> accept.

Plain decoding is the same loop with empty drafts, so the baseline and every method share one
code path and their timings compare fairly.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from specdec.config import SpeculativeConfig
from specdec.draft_policy import ForwardCost
from specdec.errors import ConfigError, PluginError, SpecdecError
from specdec.plugins import PluginRegistry
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.resources import TargetContext
from specdec.runner import ModelRunner
from specdec.sampling import SamplingParams, logits_to_probs, sample
from specdec.stopping import StopChecker, eos_token_ids


class Engine:
    def __init__(self, runner: ModelRunner, tokenizer: Any, config: SpeculativeConfig, registry: PluginRegistry) -> None:
        self.runner = runner
        self.config = config
        self.method = registry.method_for_config(config)
        self.hook = registry.hook
        self.target = TargetContext(runner, tokenizer, runner.device, runner.dtype)
        self.stops = StopChecker(tokenizer, eos_token_ids(runner.model, tokenizer), runner.max_length)
        self._sync = torch.cuda.synchronize if runner.device.type == "cuda" else None
        try:
            self.resource_manager = self.hook.specdec_resource_manager(config=config, target=self.target)
        except Exception as exc:
            raise PluginError(f"method {self.method.name!r} failed to set up: {type(exc).__name__}: {exc}") from exc
        self._next_id = 0
        self._adaptive = config.adaptive_draft_len and config.max_draft_len > 0
        self.forward_cost: ForwardCost | None = None

    def close(self) -> None:
        if self.resource_manager is not None:
            self.resource_manager.release()
            self.resource_manager = None

    @torch.inference_mode()
    def warmup(self) -> None:
        """Run a forward of every width a step can use (1 .. max_draft_len + 1 tokens) once.

        The first forward of a new shape pays one-time setup (CPU matmul primitives, CUDA
        kernels); benchmarks call this so that cost is not timed. With the adaptive draft length
        on, measuring the forward cost does exactly that.
        """
        if self._adaptive:
            self._measure_cost()
            return
        cache = self.runner.new_cache()
        self.runner.forward(cache, [0] * 32, last_only=True)
        for width in range(1, self.config.max_draft_len + 2):
            self.runner.forward(cache, [0] * width)
            self.runner.rollback(cache, width)

    def _measure_cost(self) -> None:
        if self._adaptive and self.forward_cost is None:
            self.forward_cost = ForwardCost.measure(self.runner, self.config.max_draft_len + 1, sync=self._sync)

    def new_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        generator = None
        if not params.greedy and params.seed is not None:
            generator = torch.Generator(device="cpu").manual_seed(params.seed)
        request = Request(self._next_id, list(prompt_ids), len(prompt_ids), params, generator)
        self._next_id += 1
        return request

    @torch.inference_mode()
    def run(self, request: Request) -> Request:
        """Generate until ``request`` finishes; returns it with tokens, finish reason and metrics."""
        if self.resource_manager is None:
            raise SpecdecError("this LLM has been closed")
        if not request.token_ids:
            raise ConfigError("prompt: empty (it must hold at least one token)")
        if not all(0 <= t < self.runner.vocab_size for t in request.token_ids):
            raise ConfigError(f"prompt: token ids must lie in [0, {self.runner.vocab_size})")
        if len(request.token_ids) >= self.runner.max_length:
            raise ConfigError(
                f"prompt: {len(request.token_ids)} tokens do not fit the model's context of {self.runner.max_length}"
            )
        self._measure_cost()
        metrics = request.metrics
        runner, config, hook = self.runner, self.config, self.hook
        start = time.perf_counter()
        cache = runner.new_cache()
        prefill = runner.forward(cache, request.token_ids, last_only=True)
        request.target_output = prefill
        self._append(request, [self._pick(prefill.logits[-1], request)])
        metrics.time_prefill = time.perf_counter() - start
        self.resource_manager.add_request(request)
        requests = [request]
        try:
            while not request.finished:
                step_start = time.perf_counter()
                budget = min(
                    config.max_draft_len,
                    request.params.max_tokens - request.num_output_tokens - 1,
                    runner.max_length - len(request.token_ids) - 1,
                )
                request.max_draft_len = max(budget, 0)
                proposals = self._draft(requests)
                proposal = proposals[0]
                if self.forward_cost is not None and len(proposal):
                    proposal = proposals[0] = self._pay_off(request, proposal)
                drafted = time.perf_counter()
                output = runner.forward(cache, [request.token_ids[-1], *proposal.token_ids])
                if self._sync:
                    self._sync()
                forwarded = time.perf_counter()
                request.target_output = output
                result = self._verify(requests, proposals, [output.logits])
                runner.rollback(cache, len(proposal) - result.num_accepted)
                verified = time.perf_counter()
                metrics.record_step(len(proposal), result.num_accepted)
                request.acceptance.update(len(proposal), result.num_accepted)
                self._append(request, result.emitted(proposal))
                hook.specdec_accept(config=config, requests=requests, results=[result], resource_manager=self.resource_manager)
                metrics.time_draft += drafted - step_start
                metrics.time_forward += forwarded - drafted
                metrics.time_verify += verified - forwarded
                metrics.time_decode += time.perf_counter() - step_start
        finally:
            request.target_output = None
            self.resource_manager.free_request(request)
        return request

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
            if len(proposal) > request.max_draft_len:
                proposals[i] = _truncate(proposal, request.max_draft_len)
        return proposals

    def _verify(self, requests: list[Request], proposals: list[DraftProposal], logits: list[torch.Tensor]) -> VerifyResult:
        results = self.hook.specdec_verify(config=self.config, requests=requests, proposals=proposals, target_logits=logits)
        if results is None or len(results) != len(requests):
            raise PluginError(f"method {self.method.name!r}: verify returned no result for this step")
        result, proposal = results[0], proposals[0]
        if not 0 <= result.num_accepted <= len(proposal) or not 0 <= result.next_token < self.runner.vocab_size:
            raise PluginError(
                f"method {self.method.name!r}: verify kept {result.num_accepted} of {len(proposal)} drafts "
                f"with next token {result.next_token}"
            )
        return result

    def _pay_off(self, request: Request, proposal: DraftProposal) -> DraftProposal:
        """Keep only as many drafts as pay for their verification cost."""
        keep = self.forward_cost.best_length(request.acceptance, len(proposal))
        if keep == len(proposal):
            return proposal
        if keep == 0:
            request.acceptance.relax()
        return _truncate(proposal, keep)

    def _pick(self, logits: torch.Tensor, request: Request) -> int:
        if request.params.greedy:
            return int(logits.argmax().item())
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
    probs = proposal.probs[:length] if proposal.probs is not None else None
    return DraftProposal(proposal.token_ids[:length], probs)
