"""Exhaustive breadth-first search over the bounded world, with state
hashing, safety checks on every state and transition, and a liveness check
over the whole graph: from every reachable state, a final state (every
request answered, every page free) must still be reachable.

Breadth-first order makes every reported trace a shortest one.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from bulkhead.verify.actors.config import ProtocolConfig
from bulkhead.verify.model import WorldState, initial_state, successors
from bulkhead.verify.properties import check_state, check_transition, is_final
from bulkhead.verify.world import World

# goal(kind, detail, labels) -> True for the violation a search looks for
Goal = Callable[[str, str, list], bool]


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str
    labels: tuple[str, ...]     # the environment's actions, from the initial state


@dataclass
class Result:
    world: World
    config: ProtocolConfig
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    complete: bool = True                   # False if stopped at a goal
    violations: dict = field(default_factory=dict)   # kind -> first Violation
    stuck_states: int = 0                   # states from which no final state is reachable
    stuck_example: Violation | None = None
    liveness_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations and self.stuck_states == 0

    def found(self, goal: Goal | None = None) -> Violation | None:
        for violation in self.violations.values():
            if goal is None or goal(violation.kind, violation.detail, list(violation.labels)):
                return violation
        return None


def explore(world: World, config: ProtocolConfig, *, goal: Goal | None = None,
            stop_at_goal: bool = False, liveness: bool = True) -> Result:
    """Explore every state reachable in `world` under `config`.

    goal + stop_at_goal: return as soon as a violation matching goal is found
    (the shortest such, by breadth-first order). Otherwise record the first
    (shortest) violation of each kind and keep going.
    """
    started = time.perf_counter()
    result = Result(world, config)
    init = initial_state(world, config)
    index: dict[WorldState, int] = {init: 0}
    states, parents, labels = [init], [-1], [""]
    edges: list[list[int]] = [[]] if liveness else []
    queue = deque([0])
    if _record(result, check_state(world, init), lambda: [], goal) and stop_at_goal:
        return _done(result, started, states, complete=False)
    while queue:
        here = queue.popleft()
        state = states[here]
        for move in successors(world, config, state):
            result.transitions += 1
            found = check_transition(world, state, move.state, move.notes, move.sent)
            there = index.get(move.state)
            if there is None:
                there = len(states)
                index[move.state] = there
                states.append(move.state)
                parents.append(here)
                labels.append(move.label)
                queue.append(there)
                if liveness:
                    edges.append([])
                found += check_state(world, move.state)
            if liveness:
                edges[here].append(there)
            if found:
                path = lambda: _path(parents, labels, here) + [move.label]  # noqa: E731
                if _record(result, found, path, goal) and stop_at_goal:
                    return _done(result, started, states, complete=False)
    if liveness:
        _check_liveness(world, result, states, edges, parents, labels)
    return _done(result, started, states, complete=True)


def _record(result: Result, found, path, goal) -> bool:
    """Keep the first violation of each kind; True if one matched goal."""
    hit = False
    for kind, detail in found:
        if goal is not None:
            trace = path()
            if goal(kind, detail, trace):
                result.violations.setdefault(kind, Violation(kind, detail, tuple(trace)))
                hit = True
        elif kind not in result.violations:
            result.violations[kind] = Violation(kind, detail, tuple(path()))
    return hit


def _path(parents: list, labels: list, index: int) -> list:
    out = []
    while index > 0:
        out.append(labels[index])
        index = parents[index]
    return out[::-1]


def _done(result: Result, started: float, states: list, complete: bool) -> Result:
    result.states = len(states)
    result.seconds = time.perf_counter() - started
    result.complete = complete
    return result


def _check_liveness(world, result, states, edges, parents, labels) -> None:
    """Backward reachability from final states over the explored graph."""
    predecessors: list[list[int]] = [[] for _ in states]
    for source, targets in enumerate(edges):
        for target in targets:
            predecessors[target].append(source)
    good = [is_final(world, s) for s in states]
    queue = deque(i for i, ok in enumerate(good) if ok)
    while queue:
        node = queue.popleft()
        for source in predecessors[node]:
            if not good[source]:
                good[source] = True
                queue.append(source)
    stuck = [i for i, ok in enumerate(good) if not ok]
    result.liveness_checked = True
    result.stuck_states = len(stuck)
    if stuck:
        first = stuck[0]  # smallest index = shallowest in breadth-first order
        result.stuck_example = Violation("liveness", "no final state is reachable from here",
                                         tuple(_path(parents, labels, first)))
