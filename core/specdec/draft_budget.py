"""The draft-length policy as one object: the engine's step asks it for budgets and tells it outcomes.

The step itself stays the algorithm (draft, verify, accept). Everything that decides how many
tokens to draft lives here: the config's fixed limits (``max_concurrency``,
``draft_len_schedule``), the adaptive length (:mod:`specdec.draft_policy`: acceptance estimates,
forward costs, drafting and resume costs) and what each step's timings teach it.

Forward costs are measured outside requests: :meth:`DraftBudget.measure` runs when the policy
is built, with the engine (batch size 1), and the other batch sizes
(powers of two and the largest, as :func:`~specdec.static_forward.batch_buckets` gives) are measured
when the engine is warmed up or, a width at a time, when it is idle (:meth:`measure_step`). A
batch size between two measured ones takes costs interpolated between theirs; one whose larger
neighbour is not measured yet borrows the nearest smaller batch's. Either is scaled by what that
batch size's own steps measure (:class:`~specdec.draft_policy.StepTime`), so no request waits
for a measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.config import SpeculativeConfig
from specdec.draft_policy import (
    AcceptanceEstimate, ContextCost, CostMeasurement, DraftTime, ForwardCost, ResumeCost, StepTime,
)
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.runner import ModelRunner
from specdec.static_forward import batch_buckets


@dataclass
class StepBudget:
    """This step's plan: each request's draft budget and what the policy needs to learn from it."""

    budgets: list[int]
    #: The batch size planned for (requests that fail during the step leave the batch, not the plan).
    rows: int
    #: Forward costs at this step's context, corrected by measured steps (``None``: not adaptive).
    cost: ForwardCost | None = None
    #: The uncorrected costs the step's timing is compared against.
    predicted: ForwardCost | None = None
    #: Tokens each request has left (by request id), for a batch that only drains toward known lengths.
    remaining: dict[int, int] | None = None
    #: Each request's budget for a suffix draft in place of its method's (``use_sa_spec``; empty: none).
    suffix_budgets: list[int] = field(default_factory=list)
    #: The requests (by id) whose suffix draft this step verifies instead of their method's.
    suffix_rows: set[int] = field(default_factory=set)
    #: Each request's expected progress per unit of cost (plain decoding: 1) with its method's
    #: draft at its budget, by request id: what a suffix draft must beat to replace it (a chain
    #: method's; over a tree method, and where absent, a suffix draft must beat plain decoding).
    method_rates: dict[int, float] = field(default_factory=dict)

    def remaining_of(self, batch: Sequence[Request]) -> list[int] | None:
        return [self.remaining[r.request_id] for r in batch] if self.remaining is not None else None

    @property
    def drafts(self) -> bool:
        return any(self.budgets) or any(self.suffix_budgets)


class DraftBudget:
    """Decides each step's draft budgets and learns from each step's outcome.

    :param runner: the target runner whose forwards :meth:`measure` times.
    :param config: the method's config (limits, ``adaptive_draft_len``, ``adaptive_window``).
    :param max_rows: the largest batch the engine runs.
    :param sync: waits for the device before a timer is read (CUDA), or ``None``.
    """

    def __init__(self, runner: ModelRunner, config: SpeculativeConfig, max_rows: int = 1,
                 sync: Callable[[], None] | None = None, draft_cost_per_token: bool = True) -> None:
        self.runner = runner
        self.config = config
        #: The batch sizes whose costs are measured, those the static path records (powers of
        #: two and the largest); a batch between two of them takes costs interpolated between
        #: theirs, or on the static path, which pads it, the larger one's.
        self.batch_sizes = batch_buckets(max_rows)
        self.sync = sync
        #: Whether drafting costs per drafted token, or per step whatever the length
        #: (:attr:`~specdec.resources.ResourceManager.draft_cost_per_token`).
        self.draft_cost_per_token = draft_cost_per_token
        self.adaptive = config.adaptive_draft_len and config.max_draft_tokens > 0
        #: Measured forward cost by batch size (adaptive draft length only).
        self.forward_costs: dict[int, ContextCost] = {}
        #: What verify steps really cost against the measured forward costs, by batch size.
        self.step_times: dict[int, StepTime] = {}
        #: Drafting time per drafted token (per round: the longest proposal), or per step for a
        #: drafter whose cost does not grow with the length, by batch size.
        self.draft_time: dict[int, DraftTime] = {}
        #: The setup a drafting run pays when drafting resumes after a pause.
        self.resume_cost = ResumeCost(config.adaptive_window)
        #: Acceptance over the engine's recent batch steps: the prior of each request's own estimate.
        self.acceptance = AcceptanceEstimate(4 * config.adaptive_window)
        #: The same for suffix drafts taken instead of the method's (``use_sa_spec``): a copy's
        #: acceptance has nothing to do with the method's.
        self.suffix_acceptance = AcceptanceEstimate(4 * config.adaptive_window)
        #: Batch sizes whose costs are still to be measured (in idle time or a warm-up).
        self._wanted: set[int] = set()
        #: The batch size being measured a width at a time in idle moments, if any.
        self._measuring: CostMeasurement | None = None
        # The costs of a single request's forwards, before any request can wait for them.
        self.measure(1)

    def state(self, rows: int) -> dict[str, Any]:
        """What the policy has learnt for batches of ``rows``, for people asking why it drafted as
        it did: the drafter's seconds per drafted token (running average and fastest step), the
        measured over predicted step time by draft count, the setup of the latest resumes, and
        the engine-wide acceptance by position."""
        draft_time = self.draft_time.get(rows)
        step_time = self.step_times.get(rows)
        return {
            "batch_size": rows,
            "draft_seconds_per_token": None if draft_time is None else {"average": draft_time.seconds, "fastest": draft_time.floor},
            "step_time_ratio_by_drafts": {} if step_time is None else step_time.medians(),
            "resume_setup_seconds": list(self.resume_cost.setup.get(rows, ())),
            "acceptance_by_position": [self.acceptance.alpha(i) for i in range(self.config.max_draft_len)],
        }

    # -- measurement, outside requests --------------------------------------------------------

    @torch.inference_mode()
    def measure(self, rows: int) -> None:
        """Time the target's forwards of every verify width for a batch of ``rows`` (adaptive only)."""
        while self.adaptive and rows not in self.forward_costs:
            self.measure_step(rows)
        self._wanted.discard(rows)

    @torch.inference_mode()
    def measure_step(self, rows: int | None = None) -> bool:
        """Time one width for batch size ``rows``, else for the smallest one still wanted;
        ``False`` when there was nothing left to measure."""
        if rows is None:
            self._wanted.difference_update(self.forward_costs)
            if not self._wanted:
                return False
            rows = min(self._wanted)
        if not self.adaptive or rows in self.forward_costs:
            return False
        if self._measuring is None or self._measuring.rows != rows:
            self._measuring = CostMeasurement(self.runner, self.config.max_verify_drafts + 1, rows, sync=self.sync)
        if not self._measuring.step():
            self.forward_costs[rows] = self._measuring.result()
            self._measuring = None
            self._wanted.discard(rows)
            # Ratios learned against borrowed or interpolated costs do not apply to the new ones.
            for other in [r for r in self.step_times if r not in self.forward_costs or r == rows]:
                del self.step_times[other]
        return True

    def want(self, max_rows: int) -> None:
        """Ask for the costs batches of up to ``max_rows`` need (measured by :meth:`measure_step`)."""
        if self.adaptive:
            wanted = {r for r in self.batch_sizes if r <= max_rows} | set(self._bracket(max_rows))
            self._wanted.update(r for r in wanted if r not in self.forward_costs)

    def pending_measurements(self) -> list[int]:
        """Batch sizes a step needed (or :meth:`want` asked for) whose costs are not measured yet."""
        return sorted(self._wanted)

    # -- per request --------------------------------------------------------------------------

    def new_estimate(self) -> AcceptanceEstimate:
        """A new request's acceptance estimate, starting from what the method has been achieving."""
        return AcceptanceEstimate(self.config.adaptive_window, prior=self.acceptance)

    def new_suffix_estimate(self) -> AcceptanceEstimate:
        """A new request's estimate for its suffix drafts, starting from what they have been achieving."""
        return AcceptanceEstimate(self.config.adaptive_window, prior=self.suffix_acceptance)

    # -- per step -----------------------------------------------------------------------------

    def plan(self, batch: Sequence[Request], longest_context: int, tokens_left: Sequence[int],
             remaining: Sequence[int | None] | None = None) -> StepBudget:
        """Each request's draft budget for a step, before drafting.

        ``tokens_left[b]``: tokens request ``b`` may still emit (a step emits one more than it
        drafts). ``remaining``: for a batch that only drains, each request's known remaining
        tokens (``None`` where only EOS or a stop can end it).
        """
        config, rows = self.config, len(batch)
        if self._measuring is not None:
            self._measuring.interrupted()
        limit = config.draft_len_for_batch(rows)
        budgets = [max(min(limit, left - 1), 0) for left in tokens_left]
        plan = StepBudget(budgets, rows)
        if config.use_sa_spec and limit:
            # A schedule that narrows this batch's verify narrows its suffix drafts too.
            longest = config.sa_spec_max_draft_len
            if limit < config.max_draft_tokens:
                longest = min(limit, longest)
            plan.suffix_budgets = [max(min(longest, left - 1), 0) for left in tokens_left]
        if not self.adaptive or limit == 0:
            return plan
        plan.predicted = self._costs(rows).at(longest_context)
        plan.cost = self.step_times.setdefault(rows, StepTime()).correct(plan.predicted)
        if remaining is not None and None not in remaining:
            plan.remaining = {r.request_id: left for r, left in zip(batch, remaining)}
        measured = self.draft_time.get(rows)
        unit = plan.cost.base_seconds
        draft_cost = measured.seconds / unit if measured is not None and unit else 0.0
        setup_cost = self.resume_cost.seconds_per_step(rows) / unit if unit else 0.0
        if not self.draft_cost_per_token:  # a step's drafting costs the same at any length
            draft_cost, setup_cost = 0.0, setup_cost + draft_cost
        # A batch whose recent acceptance does not pay for the drafting and the wider forward
        # skips the drafter; a tree keeps the nodes that pay.
        tree = config.drafts_trees
        keep = plan.cost.best_length(
            [r.acceptance for r in batch], budgets, draft_cost, tree, setup_cost, plan.remaining_of(batch),
        )
        if keep == 0 and measured is not None:
            measured.fade(config.adaptive_window)
        plan.budgets = [min(b, keep) for b in budgets]
        if plan.suffix_budgets and not tree:
            # A tree's verify is not priced on the chain forwards the costs were measured on (its
            # mask and path moves cost more), so a tree method's rate is not set against a chain's.
            plan.method_rates = {
                r.request_id: plan.cost.rates([r.acceptance], [b], draft_cost, setup_cost=setup_cost)[-1]
                for r, b in zip(batch, plan.budgets)
            }
        return plan

    def drafted(self, plan: StepBudget, batch: Sequence[Request], proposals: list[DraftProposal], seconds: float,
                setup_seconds: float) -> list[DraftProposal]:
        """The drafter took ``seconds`` (``setup_seconds`` of it catching up after a pause) to
        offer ``proposals``; returns them cut to the length worth verifying."""
        rows, longest = plan.rows, max((len(p) for p in proposals), default=0)
        if not longest:
            return proposals
        self.resume_cost.drafted(rows, setup_seconds)
        per_token = (seconds - setup_seconds) / (longest if self.draft_cost_per_token else 1)
        if rows in self.draft_time:
            self.draft_time[rows].record(per_token)
        else:
            self.draft_time[rows] = DraftTime(per_token)
        kinds = {p.parents is not None for p in proposals if len(p)}
        if plan.cost is None or len(kinds) > 1:
            # A batch of trees and chains (EAGLE-3's sampled rows draft chains) keeps what it was
            # budgeted: neither estimate prices both.
            return proposals
        # The offered lengths are known now: an n-gram, a suffix tree or a lookahead pool often
        # offers fewer drafts than its budget, or none, and a row offering none gains nothing from
        # the wider forward it pays for. Trees are cut by their nodes' acceptance, to leading nodes.
        keep = plan.cost.best_length(
            [r.acceptance for r in batch], [_offered(r, p) for r, p in zip(batch, proposals)],
            tree=kinds == {True}, remaining=plan.remaining_of(batch),
        )
        return [p.truncated(keep) for p in proposals]

    def suffix_drafted(self, plan: StepBudget, batch: Sequence[Request],
                       proposals: list[DraftProposal | None]) -> list[DraftProposal | None]:
        """``proposals`` (a suffix draft or ``None`` per request) cut to the length worth verifying
        by the acceptance suffix drafts have had, as :meth:`drafted` cuts a method's. A draft cut
        to nothing, or expected to gain less than its request's method would with its own draft
        (over a tree method, than plain decoding: see :attr:`StepBudget.method_rates`), becomes
        ``None`` (the method drafts for its request). Records which requests take theirs."""
        taken = [(r, p) for r, p in zip(batch, proposals) if p is not None]
        if taken and plan.cost is not None:
            keep = plan.cost.best_length([r.suffix_acceptance for r, _ in taken], [len(p) for _, p in taken],
                                         remaining=plan.remaining_of([r for r, _ in taken]))
            proposals = [p.truncated(keep) if p is not None and keep else None for p in proposals]
            proposals = [
                p if p is None or self._beats_method(plan, r, len(p)) else None for r, p in zip(batch, proposals)
            ]
        plan.suffix_rows = {r.request_id for r, p in zip(batch, proposals) if p is not None}
        return proposals

    @staticmethod
    def _beats_method(plan: StepBudget, request: Request, length: int) -> bool:
        """Whether ``request``'s suffix draft of ``length`` tokens is expected to progress faster
        per unit of cost than its method's chain at its budget, or than plain decoding where the
        plan holds no rate for it (a tree method's, or no draft); no cost to draft: it exists."""
        rate = plan.cost.rates([request.suffix_acceptance], [length])[-1]
        return rate > plan.method_rates.get(request.request_id, 1.0)

    def observe(self, plan: StepBudget, batch: Sequence[Request], proposals: Sequence[DraftProposal],
                results: Sequence[VerifyResult], seconds: float) -> None:
        """What the step did: each request's drafts and acceptance, and ``seconds`` from the start
        of its target forward to the end of its accept hook. A suffix draft taken instead of the
        method's teaches the suffix drafts' estimate, not the method's."""
        outcomes, trees, suffix_outcomes = [], [], []
        for request, proposal, result in zip(batch, proposals, results):
            if request.request_id in plan.suffix_rows:
                suffix_outcomes.append((len(proposal), result.num_accepted))
                request.suffix_acceptance.update(*suffix_outcomes[-1])
            elif len(proposal):
                outcomes.append((depth(proposal), result.num_accepted))
                tree = None
                if proposal.parents is not None:
                    tree = (len(proposal), frozenset(result.accepted_nodes or ()))
                    trees.append(tree)
                request.acceptance.update(*outcomes[-1], tree)
            else:
                request.acceptance.skip()
        self.acceptance.record_batch(outcomes, trees)
        if suffix_outcomes:
            self.suffix_acceptance.record_batch(suffix_outcomes)
        if not outcomes:
            self.resume_cost.paused()
        if plan.predicted is not None:
            drafts = max((len(p) for p in proposals), default=0)
            self.step_times[plan.rows].record(drafts, seconds, plan.predicted.seconds[drafts])

    def _costs(self, rows: int) -> ContextCost:
        """Costs for ``rows``: measured, interpolated between the nearest measured batch sizes
        around it, or (while the larger is still to be measured) the nearest smaller one's."""
        costs = self.forward_costs
        if rows in costs:
            return costs[rows]
        self._wanted.update(r for r in self._bracket(rows) if r not in costs)
        smaller = max(r for r in costs if r < rows)  # batch size 1 is measured when the policy is built
        larger = min((r for r in costs if r > rows), default=None)
        if self.runner.static:  # the static path pads the batch to the next size it recorded
            padded = self._bracket(rows)[-1]
            return costs[padded] if padded in costs else costs[smaller]
        if larger is None:
            return costs[smaller]
        return ContextCost.between((smaller, costs[smaller]), (larger, costs[larger]), rows)

    def _bracket(self, rows: int) -> list[int]:
        """The measured batch sizes nearest ``rows`` below and above it (``rows`` itself if it is one)."""
        below = max(r for r in self.batch_sizes if r <= rows)
        above = min((r for r in self.batch_sizes if r >= rows), default=rows)
        return sorted({below, above})


def depth(proposal: DraftProposal) -> int:
    """How far down a proposal reaches: its length for a chain, its deepest path for a tree."""
    if proposal.parents is None:
        return len(proposal)
    depths: list[int] = []
    for parent in proposal.parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 1)
    return max(depths, default=0)


def _offered(request: Request, proposal: DraftProposal) -> int:
    """The length the policy may cut ``proposal`` by.

    A sampled draft's length can depend on what was sampled (a draft model stops after a token
    it was unsure of): cutting by that length would keep a draft depending on its own value,
    and rejection sampling, which assumes a draft is simply drawn from ``q``, would no longer
    be lossless. Such a proposal counts as its budget, fixed before drafting; a cut below its
    length then depends on nothing it sampled.
    """
    if not request.params.greedy and proposal.probs is not None:
        return request.max_draft_len
    return len(proposal)
