"""Speculate only when it pays: each step's draft length from recent acceptance and forward cost.

A verify forward of ``w`` tokens per request costs ``cost[w]`` one-token forwards of the same
batch; on a CPU in float32, 2-3 tokens can cost 1.6-2 one-token forwards while 4-5 cost 1.4-1.7,
in bfloat16 the cost is nearly flat at batch 1, and in a large batch every extra token per request
costs more.

Each request keeps a rolling window of its last ``window`` steps (:class:`AcceptanceEstimate`).
From it, ``alpha[i]`` estimates how often the draft at position ``i`` is accepted once position
``i`` is reached, and the expected tokens a step yields with ``L`` drafts are
``1 + sum_{j<=L} prod_{i<=j} alpha[i]``. The estimate is shrunk toward a prior: the same
estimate over the engine's last ``4 * window`` steps, pooling every request that drafted in them,
itself starting from ``PRIOR_ACCEPTANCE``. Steps without drafts age the windows, so a request
whose drafting was paused drifts back to the prior, and the prior back to optimism once the
whole batch has gone that long without drafting: then it probes again. The engine's window
counts batch steps, not request steps, so a large batch does not forget its evidence faster:
each probe makes every row of the batch pay for a wide forward.

The batch verifies every request at one width (rows are padded to the longest), so the policy
picks one length ``L`` for the batch: the longest whose expected tokens per request per unit of cost
come within ``TOLERANCE`` of the best, if that beats plain decoding (``L = 0``) by ``MIN_GAIN``. Before drafting, the cost
includes the drafter's own time per drafted token, measured as the engine runs (a draft model's
forwards are not free; an n-gram lookup nearly is; see :class:`DraftTime`) and, when drafting
resumes after a pause, the setup a resume costs spread over the runs resumes start
(:class:`ResumeCost`).

A batch that only drains (no request waits for a row) and whose requests can only end at known
lengths (``ignore_eos``, no stop tokens or strings) finishes when its last request does, and a row
freed early is not refilled: tokens that put a request further ahead of the others buy nothing.
There a step's worth is how much sooner the batch is projected to finish, each request going on
at the tokens this step is expected to give it (:func:`progress`), not the mean tokens per row.

Trees (a method whose ``max_draft_tokens`` exceeds its depth ``max_draft_len``) are sized by their
nodes. A method lists a tree's nodes parents first and best first (Medusa's static tree, EAGLE-2's
reranked nodes), so the first ``n`` nodes of a tree are a tree too, and a node's index means
much the same from step to step. Each request's estimate also counts, per node index, how often
that node lay on the accepted path when it was drafted; a tree's expected tokens with ``n`` nodes
are ``1 + sum_{i<n} p[i]`` (the accepted path holds at most one node per depth, so the sum is its
expected length). The policy then keeps the number of nodes whose expected progress per unit of
cost is best, as it does for a chain's length: on a machine where a forward four tokens wide
costs twice a one-token forward, a 63-node tree is cut to its few best nodes rather than
dropped. A node never drafted yet starts from ``PRIOR_ACCEPTANCE / (i + 1)``, optimistic for the
first nodes and sceptical about the hundredth, unless the nodes before it hold up better: then
from their trend, carried on past the nodes drafted and at least halving each node, so a tree
whose nodes keep being accepted tries the next few together.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

from specdec.kv_cache import BatchKVCache
from specdec.runner import ModelRunner

#: Optimistic start, so a request tries drafting before it has evidence either way.
PRIOR_ACCEPTANCE = 0.6
#: Weight of the prior, in observations: a single step moves the estimate, without deciding it.
PRIOR_WEIGHT = 2.0
#: A longer draft is kept unless it is expected to do this much worse than the best length:
#: timings on a busy machine spread by a few percent, and a cut must not rest on noise.
TOLERANCE = 0.05
#: Drafting must be expected to beat plain decoding by this much: a step's timing spreads by a few
#: percent and the costs are estimates, so a draft expected to gain 1-2% (a drafter right 2% of
#: the time, verified at a width that costs one token) gains nothing measurable and, on a machine
#: where that width costs a little more than measured, loses (n-gram on Spec-Bench writing in
#: float32: 0.96x at 1.06 tokens a step).
MIN_GAIN = 0.03
#: Past the tree nodes drafted in the window, each undrafted node's trend prior is at most this
#: share of the node's before it: the next few nodes are priced together, the far ones fall to the prior.
TREND_DECAY = 0.5
#: Steps a request's acceptance window holds, unless the config says otherwise.
DEFAULT_WINDOW = 16
#: Weight of the newest step in the running drafting-time estimate.
DRAFT_TIME_WEIGHT = 0.2
#: Verify steps per draft count whose time ratios :class:`StepTime` takes the median of.
STEP_TIME_WINDOW = 9
#: Steps after which plain steps' ratios, not renewed since, no longer speak for them.
STEP_TIME_STALE = 2 * STEP_TIME_WINDOW
#: Steps without any drafting step after which drafting steps' ratios are forgotten and probed again.
STEP_TIME_FORGET = 8 * STEP_TIME_STALE
#: Resumes (and the drafting runs they started) per batch size that :class:`ResumeCost` averages.
RESUME_WINDOW = 8


class DraftTime:
    """The drafter's time per drafted token at one batch size, as drafting steps measure it.

    ``seconds`` is a running average. ``floor`` is the fastest step measured after the first (the
    first call of a new shape pays one-time setup): what the drafter costs on an undisturbed
    machine. Paused steps fade the average toward the floor (:meth:`fade`), so one slow
    measurement (a busy machine, a catch-up after a long pause) does not pause drafting for good;
    but not below it: a drafter that always costs too much at this batch size would otherwise
    look free after enough paused steps and be probed again and again, each probe making every
    row of the batch pay. Until a second measurement sets the floor, the fade goes toward zero;
    from then on the average never falls below the floor.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.floor: float | None = None

    def record(self, seconds: float) -> None:
        """A drafting step after the first; the average never falls below the floor (a first
        measurement faded toward zero must not keep a costly drafter looking cheap)."""
        self.floor = seconds if self.floor is None else min(self.floor, seconds)
        self.seconds = max(self.seconds + DRAFT_TIME_WEIGHT * (seconds - self.seconds), self.floor)

    def fade(self, window: int) -> None:
        """One paused step: move ``1 / window`` of the way down to the floor."""
        self.seconds -= (self.seconds - (self.floor or 0.0)) / window


class ResumeCost:
    """The setup a drafting run pays when it starts, spread over the steps such runs last.

    A method may have to bring its state up to date before it can draft again after a pause: a
    draft model's cache catches up on the tokens emitted while drafting was paused, and prefills
    a request it never drafted for (:meth:`~specdec.resources.ResourceManager.setup_seconds`). A
    steady drafting step does not pay that, so it is not part of the per-token drafting cost; but
    every resume does. In a large batch where drafting hardly pays, the policy's optimistic probes
    paid it again and again: at batch 8 a resume cost a draft model three to four plain steps.

    So the decision to resume counts the setup expected per drafting step of the run it starts:
    the mean setup of the last ``RESUME_WINDOW`` resumes at this batch size over the mean length
    of the runs they started, the window (``horizon``) counting as one run. A drafter whose runs
    last pays its setup once over many steps and barely notices; one whose probes end after a
    step or two must expect a probe to pay for its whole setup, and stops probing unless its
    acceptance is good enough to. Until a resume at a batch size has been measured, nothing is
    charged. Within a run nothing is charged either: the setup is spent.
    """

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        #: By batch size, the setup seconds of the latest resumes.
        self.setup: dict[int, deque[float]] = {}
        #: By batch size at their start, the drafting steps of the latest runs that have ended.
        self.lengths: dict[int, deque[int]] = {}
        #: The run under way: its batch size at the start, and its drafting steps so far.
        self._run: list[int] | None = None

    def seconds_per_step(self, rows: int) -> float:
        """Setup to count per drafting step if a batch of ``rows`` drafts now (0 within a run)."""
        if self._run is not None or rows not in self.setup:
            return 0.0
        lengths = [self.horizon, *self.lengths.get(rows, ())]
        return statistics.fmean(self.setup[rows]) / statistics.fmean(lengths)

    def drafted(self, rows: int, setup_seconds: float) -> None:
        """A step drafted for a batch of ``rows``, spending ``setup_seconds`` on setup."""
        if self._run is None:
            self.setup.setdefault(rows, deque(maxlen=RESUME_WINDOW)).append(setup_seconds)
            self._run = [rows, 0]
        self._run[1] += 1

    def paused(self) -> None:
        """A step without drafts: the run under way, if any, has ended."""
        if self._run is not None:
            rows, steps = self._run
            self.lengths.setdefault(rows, deque(maxlen=RESUME_WINDOW)).append(steps)
            self._run = None


class StepTime:
    """What verify steps at one batch size really cost, against the forward costs measured at warm-up.

    The warm-up times bare target forwards on an idle cache. A real step also verifies, rolls
    back rejected entries, moves a tree's accepted path and runs the method's accept hook, all of
    which grow with the batch and the width, and the machine may be busier or quieter than during
    the warm-up: a batch of 8 measured a 3-token verify at 1.4 times one token in one engine and
    1.8 times in the next. So each step's time from its target forward to the end of its accept
    hook is divided by the warm-up's prediction for its width and context, and the median of the
    last ``STEP_TIME_WINDOW`` such ratios per draft count scales the warm-up costs the policy
    decides with (:meth:`correct`). Each draft count's first step pays one-time setup and is left
    out. A draft count starts from two observations of the ratio the other counts give it (1,
    the warm-up's, before any has run), so one disturbed step moves nothing while two agreeing
    steps do, and a few steps replace it. A draft count without ratios is interpolated between
    the nearest ones that have (plain steps, the warm-up's 1 while they have none), and takes
    the widest one's ratio beyond it: the overhead a step adds grows with its width, so once a
    wide step has proved dear the narrower ones are not each probed in turn.

    The machine's speed drifts, by up to 2x within seconds on a shared 2-core host, and every
    step's ratio with it. Ratios compare draft counts fairly only when measured at about the same
    time: a batch that drafted for many steps would otherwise weigh its drafting steps' fresh
    ratios against plain steps' ratios from a slow moment long ago, find drafting cheap, keep
    drafting and never renew them (Medusa at batch 8 went on drafting 2-node trees costing 1.3
    plain steps for 1.27 tokens). So plain steps' ratios are dropped once ``STEP_TIME_STALE``
    steps have passed without one, and plain steps cost what the warm-up measured again until
    they renew them. A drafting count's stale ratios stay, but never below plain steps' fresh
    ones: if they are dear, the policy does not draft at that count, and forgetting them would
    probe a count known to lose again and again; if they are cheap, they may be a fast moment
    long gone (Medusa on translation, drafting almost nothing right, went on verifying 10-node
    trees at 1.3 plain steps each because their ratios were measured while the machine ran fast
    and plain steps' were fresh and slow), and a verify step does all a plain step does and more.

    Dear ratios measured in a busy moment would then keep the policy from drafting for the
    engine's whole life: EAGLE-3 on code edits stopped drafting for good after two minutes in
    which another process shared the machine (0.73x, against 1.39x undisturbed). So once no step
    has drafted for ``STEP_TIME_FORGET`` steps, every drafting count's ratios are forgotten, and
    the next drafting step starts from plain steps' ratio again: a count that really is dear
    shows it within three steps (:meth:`record`), a few probe steps every ``STEP_TIME_FORGET``.
    """

    def __init__(self) -> None:
        #: By draft count, the latest ratios of measured to predicted seconds.
        self.ratios: dict[int, deque[float]] = {}
        #: Steps recorded so far, and by draft count the last one recorded.
        self._steps = 0
        self._last: dict[int, int] = {}
        #: Draft counts whose first step has run (and was not recorded).
        self._seen: set[int] = set()
        #: The last step recorded that drafted.
        self._last_drafting = 0

    def record(self, drafts: int, seconds: float, predicted: float) -> None:
        """A step verifying ``drafts`` tokens per request took ``seconds``; warm-up said ``predicted``.

        The first step of each draft count is left out: it runs the verify and accept code at
        that shape for the first time (the warm-up ran only forwards), which can cost many steps.
        """
        self._steps += 1
        if self._stale(0):
            self.ratios.pop(0, None)
        if drafts:
            self._last_drafting = self._steps
        elif self._steps - self._last_drafting > STEP_TIME_FORGET:
            self.ratios = {n: r for n, r in self.ratios.items() if n == 0}
        if drafts not in self._seen:
            self._seen.add(drafts)
        elif predicted > 0:
            if drafts not in self.ratios:
                start = self.ratio(drafts)
                self.ratios[drafts] = deque([start, start], maxlen=STEP_TIME_WINDOW)
            self.ratios[drafts].append(seconds / predicted)
            self._last[drafts] = self._steps

    def ratio(self, drafts: int) -> float:
        """Measured over predicted seconds for a step of ``drafts`` tokens per request."""
        return _interpolate(self.medians(), drafts)

    def correct(self, cost: ForwardCost) -> ForwardCost:
        """``cost`` with every width's seconds scaled by its ratio (unchanged without a time unit)."""
        if cost.base_seconds <= 0:
            return cost
        # Once per step, not per width: a tree method's forward may be hundreds of tokens wide.
        medians = self.medians()
        return ForwardCost.from_seconds([t * _interpolate(medians, n) for n, t in enumerate(cost.seconds)])

    def _stale(self, drafts: int) -> bool:
        """Whether ``drafts``' ratios were last renewed more than ``STEP_TIME_STALE`` steps ago."""
        return self._steps - self._last.get(drafts, 0) > STEP_TIME_STALE

    def medians(self) -> dict[int, float]:
        """Each count's median ratio; plain steps' (0) is the warm-up's (1) while they have none,
        and a drafting count's stale ratio is no less than it."""
        medians = {0: 1.0} | {n: statistics.median(r) for n, r in self.ratios.items()}
        return {n: max(m, medians[0]) if n and self._stale(n) else m for n, m in medians.items()}


def _interpolate(points: dict[int, float], x: int) -> float:
    """``points`` linearly interpolated at ``x``; flat beyond the largest key (keys include 0)."""
    below = max(n for n in points if n <= x)
    above = [n for n in points if n > x]
    if x == below or not above:
        return points[below]
    upper = min(above)
    return points[below] + (points[upper] - points[below]) * (x - below) / (upper - below)


class AcceptanceEstimate:
    """Per-position conditional acceptance of drafts over the last ``window`` steps.

    One per request; the engine also keeps one over its batch steps (:meth:`record_batch`),
    which is each request's prior (``prior``), so a new request starts from what the method has
    been achieving rather than from optimism, while the engine-wide estimate itself starts from
    ``PRIOR_ACCEPTANCE``.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, prior: AcceptanceEstimate | None = None) -> None:
        #: Per step, oldest first, the ``(drafted, accepted)`` of each draft verified in it
        #: (one for a request's step, one per drafting request for a batch step; none for a
        #: step without drafts).
        self.steps: deque[list[tuple[int, int]]] = deque(maxlen=window)
        self.prior = prior
        #: Per step, for each tree verified in it, ``(nodes drafted, indices of the nodes on the
        #: accepted path)``, beside :attr:`steps`.
        self.trees: deque[list[tuple[int, frozenset[int]]]] = deque(maxlen=window)
        #: ``(reached, hits)`` by position, counted once per step (the engine's window is long).
        self._counts: dict[int, tuple[int, int]] = {}
        #: By tree node index, the trees in the window that drafted it and those whose accepted
        #: path held it, kept up to date step by step (a tree may have hundreds of nodes).
        self._node_reached: list[int] = []
        self._node_hits: list[int] = []

    def update(self, num_drafted: int, num_accepted: int, tree: tuple[int, frozenset[int]] | None = None) -> None:
        """One step's outcome; ``tree``, for a tree, is its node count and accepted nodes."""
        self.record_batch([(num_drafted, num_accepted)], [tree] if tree is not None else [])

    def record_batch(self, outcomes: list[tuple[int, int]], trees: list[tuple[int, frozenset[int]]] | None = None) -> None:
        """One step of ``(drafted, accepted)`` outcomes (empty: a step without drafts), and of
        ``(nodes, accepted nodes)`` for the trees among them."""
        self.steps.append(outcomes)
        if len(self.trees) == self.trees.maxlen:
            self._count_trees(self.trees[0], -1)
        self.trees.append(trees or [])
        self._count_trees(self.trees[-1], 1)
        self._counts.clear()

    def _count_trees(self, trees: list[tuple[int, frozenset[int]]], sign: int) -> None:
        for drafted, accepted in trees:
            if drafted > len(self._node_reached):
                grow = drafted - len(self._node_reached)
                self._node_reached += [0] * grow
                self._node_hits += [0] * grow
            for node in range(drafted):
                self._node_reached[node] += sign
            for node in accepted:
                self._node_hits[node] += sign

    def skip(self) -> None:
        """A step without drafts: no evidence, but the window moves on."""
        self.record_batch([])

    def alpha(self, position: int) -> float:
        """P(draft at ``position`` accepted | drafts before it accepted), shrunk toward the prior."""
        if position not in self._counts:
            reached = hits = 0
            for step in self.steps:
                for drafted, accepted in step:
                    if drafted > position and accepted >= position:
                        reached += 1
                        hits += accepted > position
            self._counts[position] = (reached, hits)
        reached, hits = self._counts[position]
        prior = self.prior.alpha(position) if self.prior is not None else PRIOR_ACCEPTANCE
        return (hits + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)

    def expected_tokens(self, length: int) -> list[float]:
        """Expected tokens per step for every draft length ``0..length``."""
        out, reach = [1.0], 1.0
        for i in range(length):
            reach *= self.alpha(i)
            out.append(out[-1] + reach)
        return out

    def node_rates(self, nodes: int) -> list[float]:
        """For each of the first ``nodes`` tree nodes, P(it lies on the accepted path | it was
        drafted), shrunk toward its prior.

        A node's prior is the estimate under this one (``PRIOR_ACCEPTANCE / (i + 1)`` where there
        is none) or, where the two nodes before it hold up better than that, their trend carried
        one node on: ``r[i-1]**2 / r[i-2]``, never above ``r[i-1]`` where both were drafted in
        this estimate's window, and never above ``TREND_DECAY * r[i-1]`` past the nodes drafted.
        A tree whose nodes keep being accepted (a repeated request's suffix match: 0.81, 0.70,
        0.67) would otherwise never try its next node, priced at 0.15 against the 0.64 its trend
        says. And one node past those drafted seldom pays alone where the forward's cost jumps
        (on a CPU in float32 a six-token verify can cost 1.6 one-token forwards where five cost
        1.15): suffix decoding on code edits kept four nodes a step for whole turns, 4.2 tokens a
        step against 7.1 where the warm-up measured a gentler step. So the trend goes on through
        the nodes never drafted, at least halving each node: the next few are priced together,
        and a wide tree's far nodes fall to the prior within a few nodes.
        """
        under = self.prior.node_rates(nodes) if self.prior is not None else [PRIOR_ACCEPTANCE / (i + 1) for i in range(nodes)]
        reached = self._node_reached[:nodes] + [0] * (nodes - len(self._node_reached))
        hits = self._node_hits[:nodes] + [0] * (nodes - len(self._node_hits))
        rates: list[float] = []
        on_trend: list[bool] = []  # drafted in the window, or priced by the trend
        for node, prior in enumerate(under):
            raised = False
            if node >= 2 and on_trend[-1] and on_trend[-2]:
                limit = 1.0 if reached[node - 1] and reached[node - 2] else TREND_DECAY
                trend = rates[-1] * min(limit, rates[-1] / rates[-2])
                prior, raised = max(prior, trend), trend > prior
            rates.append((hits[node] + PRIOR_WEIGHT * prior) / (reached[node] + PRIOR_WEIGHT))
            on_trend.append(reached[node] > 0 or raised)
        return rates

    def expected_tree_tokens(self, nodes: int) -> list[float]:
        """Expected tokens per step for a tree of every node count ``0..nodes`` (its first nodes)."""
        return list(itertools.accumulate(self.node_rates(nodes), initial=1.0))


def progress(gains: Sequence[float], remaining: Sequence[int] | None = None) -> float:
    """A step's expected progress, in plain steps (a step without drafts makes 1).

    ``gains[b]`` is request ``b``'s expected tokens this step. Without ``remaining`` every token
    counts alike: the mean over the batch. With ``remaining[b]``, the tokens request ``b`` has left
    in a batch that only drains, the batch ends with its slowest request: the plain steps it has
    left (the longest remainder) over the steps it would take if each request went on at this
    step's expected tokens. A request ahead of the others then counts for nothing, and one behind
    them that gains nothing from this step's drafts makes the wider forward a loss.
    """
    if remaining is None:
        return statistics.fmean(gains)
    return max(remaining) / max(r / g for r, g in zip(remaining, gains, strict=True))


#: Verify widths up to this are all measured: where kernels switch their blocking, a CPU's cost
#: jumps from one width to the next (float32: 3 tokens cost 1.1 one-token forwards, 4 cost 1.8).
DENSE_WIDTHS = 8
#: Above it, each measured width is at least this factor wider than the last, the rest interpolated.
WIDTH_STEP = 1.25


def measured_widths(max_width: int) -> list[int]:
    """The widths :class:`CostMeasurement` times: every one up to :data:`DENSE_WIDTHS`, then a
    geometric sequence, then ``max_width``. A method verifying 25 tokens (suffix decoding) thus
    times 13 widths rather than 25, for each batch size measured."""
    widths = list(range(1, min(max_width, DENSE_WIDTHS) + 1))
    while widths[-1] < max_width:
        widths.append(min(max_width, max(widths[-1] + 1, math.ceil(widths[-1] * WIDTH_STEP))))
    return widths


def _interpolated(measured: dict[int, float], max_width: int) -> list[float]:
    """Seconds for every width 1 .. ``max_width``, linear between the measured ones."""
    points = sorted(measured)
    out = []
    for width in range(1, max_width + 1):
        if width in measured:
            out.append(measured[width])
            continue
        high = next(p for p in points if p > width)
        low = max(p for p in points if p < width)
        out.append(measured[low] + (measured[high] - measured[low]) * (width - low) / (high - low))
    return out


class ForwardCost:
    """Cost of a target forward by width (tokens per request), relative to one token, for one batch size.

    ``base_seconds`` is the measured time of the one-token forward, the unit of ``relative``.
    No width counts as cheaper than one token: a wider forward measured faster is noise (a tiny
    model's forwards take a millisecond), and taken at its word it made drafts that are never
    accepted look worth verifying.
    """

    def __init__(self, relative: list[float], base_seconds: float = 0.0) -> None:
        self.relative = [max(r, 1.0) for r in relative]
        self.base_seconds = base_seconds

    @classmethod
    def from_seconds(cls, seconds: Sequence[float]) -> ForwardCost:
        """The costs of forwards taking ``seconds`` by width (1 .. ``len(seconds)``)."""
        return cls([t / seconds[0] for t in seconds], seconds[0])

    def mixed(self, other: ForwardCost, weight: float) -> ForwardCost:
        """Seconds linear between these (``weight`` 0) and ``other``'s (``weight`` 1), and beyond."""
        return ForwardCost.from_seconds([a + weight * (b - a) for a, b in zip(self.seconds, other.seconds, strict=True)])

    @property
    def seconds(self) -> list[float]:
        return [r * self.base_seconds for r in self.relative]

    def best_length(
        self,
        estimates: Sequence[AcceptanceEstimate],
        offered: Sequence[int],
        draft_cost: float = 0.0,
        tree: bool = False,
        setup_cost: float = 0.0,
        remaining: Sequence[int] | None = None,
    ) -> int:
        """The longest draft length for the batch whose expected progress per unit of cost is within
        ``TOLERANCE`` of the best and ``MIN_GAIN`` above plain decoding's (0 when none is); request
        ``b`` has ``offered[b]`` drafts.

        ``draft_cost`` is what drafting one more token for the batch costs, in one-token forwards
        (0 once the drafts exist: their cost is spent). ``setup_cost`` is what drafting at all
        costs the step, whatever the length, in the same unit (a resume's setup spread over the
        run it starts: :class:`ResumeCost`).

        ``tree``: the drafts form trees, and a length is a node count (the tree's first nodes),
        whose worth comes from each node's own acceptance
        (:meth:`AcceptanceEstimate.expected_tree_tokens`).

        ``remaining[b]``, given for a batch that only drains toward known lengths, is the tokens
        request ``b`` has left: progress then counts the batch's end (see :func:`progress`).
        """
        rates = self.rates(estimates, offered, draft_cost, tree, setup_cost, remaining)
        longest, best, bar = len(rates) - 1, max(rates), rates[0] * (1 + MIN_GAIN)
        if best <= bar:
            # Drafting must be expected to win clearly, not merely to lose less than the tolerance.
            return 0
        # The tolerance keeps longer drafts near the best, never one not expected to beat plain decoding.
        return max(n for n in range(1, longest + 1) if rates[n] >= best * (1 - TOLERANCE) and rates[n] > bar)

    def rates(
        self,
        estimates: Sequence[AcceptanceEstimate],
        offered: Sequence[int],
        draft_cost: float = 0.0,
        tree: bool = False,
        setup_cost: float = 0.0,
        remaining: Sequence[int] | None = None,
    ) -> list[float]:
        """The batch's expected progress per unit of cost (plain decoding: 1) for every draft
        length 0 .. the longest offered; the arguments are :meth:`best_length`'s."""
        longest = min(max(offered, default=0), len(self.relative) - 1)
        expected = AcceptanceEstimate.expected_tree_tokens if tree else AcceptanceEstimate.expected_tokens
        gains = [expected(e, min(n, longest)) for e, n in zip(estimates, offered, strict=True)]
        return [
            progress([g[min(n, len(g) - 1)] for g in gains], remaining)
            / (self.relative[n] + draft_cost * n + (setup_cost if n else 0.0))
            for n in range(longest + 1)
        ]


class ContextCost:
    """Forward costs of one batch size at a short and a long context, interpolated in between.

    Attention grows with the context while the rest of a forward does not, so a wide verify
    forward that is nearly free next to a short context can cost several one-token forwards next
    to a long one. Each step uses the costs at the batch's longest cache.
    """

    def __init__(self, contexts: tuple[int, int], costs: tuple[ForwardCost, ForwardCost]) -> None:
        self.contexts = contexts
        self.costs = costs

    @classmethod
    def measure(
        cls,
        runner: ModelRunner,
        max_width: int,
        rows: int = 1,
        contexts: tuple[int, int] = (128, 1024),
        sync: Callable[[], None] | None = None,
    ) -> ContextCost:
        """Measure the costs of ``rows`` requests at once (see :class:`CostMeasurement`)."""
        measurement = CostMeasurement(runner, max_width, rows, contexts, sync)
        while measurement.step():
            pass
        return measurement.result()

    @classmethod
    def between(cls, low: tuple[int, ContextCost], high: tuple[int, ContextCost], rows: int) -> ContextCost:
        """The costs of a batch of ``rows``, linear between two measured batch sizes ``(rows, costs)``."""
        (r0, c0), (r1, c1) = low, high
        weight = (rows - r0) / (r1 - r0)
        short, long = (a.mixed(b, weight) for a, b in zip(c0.costs, c1.costs, strict=True))
        return cls(c0.contexts, (short, long))

    def at(self, context: int) -> ForwardCost:
        """Costs next to ``context`` cached tokens (linear between and beyond the measured two)."""
        (c0, c1), (short, long) = self.contexts, self.costs
        weight = max(context - c0, 0) / (c1 - c0) if c1 > c0 else 0.0
        return short.mixed(long, weight)


#: A width's forwards are timed at least twice, and again (up to ``MEASURE_REPEATS``) while they
#: have taken less than ``MEASURE_SECONDS``: a one-token forward of a small batch takes a few
#: milliseconds and its minimum needs several runs, a 25-token forward of 8 requests next to
#: 1,024 cached tokens takes a good part of a second and varies far less.
MEASURE_REPEATS = 5
MEASURE_SECONDS = 0.15


class CostMeasurement:
    """Measures one batch size's :class:`ContextCost` one width at a time.

    Each :meth:`step` times the forwards of one width (:func:`measured_widths`) at one of the two
    contexts, the others interpolated, so an engine measuring in idle moments makes a request that
    arrives meanwhile wait for a few forwards, not for the whole curve. Between steps the engine
    may decode: on the static path its batch reuses the one static cache, so the measurement's
    rows are filled again before its next width (:meth:`interrupted`).

    The machine's speed drifts between steps (by up to 2x within seconds on a shared 2-core
    host), so widths timed at different moments do not compare: a one-token forward timed in a
    slow moment once made every width up to 64 look as cheap as one token, and Medusa verified
    wide trees for 1.1 tokens a step. So each width's forwards alternate with one-token forwards
    at the same context, and a width costs the median of its forwards' times over the one-token
    forward's just before each, times the fastest one-token forward of all.

    :param runner: the target runner.
    :param max_width: the widest forward to cost (tokens per request).
    :param rows: requests per forward.
    :param contexts: the short and the long context, in cached tokens per request (capped by the
        runner's length).
    :param sync: waits for the device (CUDA) before a timer is read.
    """

    def __init__(
        self,
        runner: ModelRunner,
        max_width: int,
        rows: int = 1,
        contexts: tuple[int, int] = (128, 1024),
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.runner, self.max_width, self.rows, self.sync = runner, max_width, rows, sync
        # Row r holds r tokens more than the context (see _filled): the last row must still fit.
        longest = max(runner.max_length - max_width - rows, 2)
        self.contexts = (min(contexts[0], longest // 2), min(contexts[1], longest))
        self._todo = deque((context, width) for context in self.contexts for width in measured_widths(max_width))
        #: By context and width, the median of the width's forwards over the one-token forward before each.
        self._relative: dict[int, dict[int, float]] = {context: {} for context in self.contexts}
        #: By context, the fastest one-token forward timed.
        self._base: dict[int, float] = {}
        self._cache: BatchKVCache | None = None
        self._cache_context = -1

    def interrupted(self) -> None:
        """The engine has run a step since the last width: a static cache holds its batch now."""
        if self.runner.static:
            self._cache = None

    def step(self) -> bool:
        """Time the next width's forwards; ``False`` once every width has been timed."""
        if not self._todo:
            return False
        context, width = self._todo.popleft()
        cache = self._filled(context)

        def forward(width: int) -> float:
            start = time.perf_counter()
            if self.rows == 1:
                self.runner.forward(cache, [0] * width)
            else:
                self.runner.forward_rows(cache, [[0] * width] * self.rows)
            if self.sync:
                self.sync()
            seconds = time.perf_counter() - start
            self.runner.rollback(cache, width)
            return seconds

        forward(width)  # the first call of a shape pays one-time setup
        samples: list[float] = []
        ones: list[float] = []
        while len(samples) < MEASURE_REPEATS and (len(samples) < 2 or sum(samples) < MEASURE_SECONDS):
            if width > 1:
                ones.append(forward(1))
            samples.append(forward(width))
        # Each pair ran at about the same speed; the fastest one-token run is the one least
        # disturbed by the rest of the machine.
        ones = ones or samples
        self._relative[context][width] = statistics.median(w / one for w, one in zip(samples, ones))
        self._base[context] = min(self._base.get(context, math.inf), *ones)
        if not self._todo:
            self._cache = None
        return bool(self._todo)

    def result(self) -> ContextCost:
        """The measured costs (every width timed, see :meth:`step`)."""
        if self._todo:
            raise RuntimeError(f"{len(self._todo)} widths are still to be timed")
        short, long = (ForwardCost.from_seconds(_interpolated({w: r * self._base[c] for w, r in self._relative[c].items()}, self.max_width))
                       for c in self.contexts)
        return ContextCost(self.contexts, (short, long))

    def _filled(self, context: int) -> BatchKVCache:
        """The measurement's cache with ``context`` tokens in every row (more in later rows)."""
        if self._cache is None or self._cache_context != context:
            self._cache = self.runner.new_batch_cache(self.rows)
            # Rows of different lengths, as real batches have (their writes take the ragged path).
            self.runner.forward_rows(self._cache, [[0] * (context + row) for row in range(self.rows)])
            self._cache_context = context
        return self._cache
